"""The accelerator run (experiments/accelerator/): its dry run on the CPU, its tables, its offline inputs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
ACCEL = REPO_ROOT / "experiments" / "accelerator"
sys.path.insert(0, str(ACCEL))

import driver  # noqa: E402
import parts  # noqa: E402
from budget import Budget  # noqa: E402


def run_driver(tmp_path: Path, *stages: str, budget: float = 900.0) -> dict:
    """The driver's dry run of ``stages`` in a subprocess; returns its accelerator.json."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(ACCEL / "driver.py"), "--dry-run", "--no-d3rlpy", "--out",
                             str(tmp_path), "--budget", str(budget), "--stages", *stages],
                            capture_output=True, text=True, env=env, timeout=3000, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((tmp_path / "accelerator.json").read_text(encoding="utf-8"))


def test_budget_reserves() -> None:
    budget = Budget(10.0)
    assert 9.0 < budget.left() <= 10.0 and budget.spent() >= 0.0
    assert not budget.expired(reserve=5.0) and budget.expired(reserve=11.0)


def test_dry_run_writes_the_tables(tmp_path: Path) -> None:
    results = run_driver(tmp_path, "info", "matmul", budget=120)
    assert [results["stages"][s]["status"] for s in ("info", "matmul")] == ["ok", "ok"]
    info, matmul = results["stages"]["info"]["result"], results["stages"]["matmul"]["result"]
    assert info["platform"] == "cpu" and matmul["float32"] > 0 and matmul["bfloat16"] > 0
    table = (tmp_path / "accelerator.md").read_text(encoding="utf-8")
    assert "(dry run)" in table and "Matmul peak" in table and "stage `matmul`: ok" in table


def test_markdown_shows_failures_and_skips() -> None:
    results = {"budget": 100.0, "dry_run": False, "stages": {
        "info": {"status": "ok", "seconds": 1.0, "result": {"device": "H100", "platform": "gpu"}},
        "train": {"status": "ok", "seconds": 5.0, "result": {
            "rows": [{"algorithm": "bc", "action_space": "discrete", "runs": 8, "seed_updates_per_s": 12345.6,
                      "percent_of_peak": 1.234, "compile_seconds": 2.0}],
            "skipped": [{"algorithm": "combo", "runs": 512, "reason": "state 900 GiB"}], "failures": [],
            "d3rlpy": {"rows": [{"algorithm": "bc", "action_space": "discrete", "processes": 8, "jax_r1": 2000.0,
                                 "d3rlpy_one_process": 500.0, "ratio_one": 4.0, "jax_r_procs": 16000.0,
                                 "d3rlpy_processes_total": 1000.0, "ratio_procs": 16.0}]}}},
        "envs": {"status": "failed", "seconds": 0.5, "error": "Traceback ...\nRuntimeError: out of memory"}}}
    table = driver.markdown(results)
    assert "| bc | discrete | 8 | 12,346 | 1.23 | 2.0 |" in table
    assert "| bc | discrete | 2,000 | 500 | 4.0× | 16,000 | 1,000 | 16.0× |" in table
    # bc discrete only: CLEVR and BabyAI at 12,346 seed-updates/s (R=8 < 60: the largest measured), 60 runs ×
    # 500k updates each; d3rlpy 500 / 1000 updates/s; no continuous rate, so the row is partial.
    hours = 2 * 60 * 500_000 / 12345.6 / 3600
    assert f"| bc (partial) | {hours:,.1f} | {2 * 60 * 500_000 / 500 / 3600:,.1f} | " \
           f"{2 * 60 * 500_000 / 1000 / 3600:,.1f} |" in table
    assert "state 900 GiB" in table and "stage `envs`: failed in 0 s — RuntimeError: out of memory" in table


def test_exported_tokenizer_and_architecture_match_the_gguf(tmp_path: Path) -> None:
    from imaginejax.imaginer import finetune
    from imaginejax.imaginer.loading import load_gguf_config, load_gguf_tokenizer, smollm2_gguf_path
    import imaginer_stage
    import imaginer_finetune  # on sys.path once imaginer_stage is imported

    path = tmp_path / "tokenizer.json"
    path.write_text(load_gguf_tokenizer(smollm2_gguf_path()).to_str(), encoding="utf-8")
    texts = ["Move the red ball behind the blue ball.", "naïve 12345 <|im_start|>", " spaced  out "]
    expected = [load_gguf_tokenizer(smollm2_gguf_path()).encode(t).ids for t in texts]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(finetune.SMOLLM2_TOKENIZER_ENV, str(path))
        finetune._smollm2_tokenizer.cache_clear()
        try:
            assert [finetune._smollm2_tokenizer().encode(t).ids for t in texts] == expected
            patch.setenv(finetune.SMOLLM2_TOKENIZER_ENV, str(tmp_path / "absent.json"))
            finetune._smollm2_tokenizer.cache_clear()
            with pytest.raises(FileNotFoundError, match="IMAGINEJAX_SMOLLM2_TOKENIZER"):
                finetune._smollm2_tokenizer()
        finally:
            finetune._smollm2_tokenizer.cache_clear()

        config = tmp_path / "architecture.json"
        imaginer_finetune.export_smollm2_config(config)
        patch.setenv(imaginer_finetune.SMOLLM2_ARCHITECTURE_ENV, str(config))
        assert imaginer_stage.full_config("smollm2-135m") == load_gguf_config(smollm2_gguf_path())


def test_dry_run_of_every_stage(tmp_path: Path) -> None:
    stages = ["info", "matmul", "train", "engine", "envs", "bench"]
    if importlib.util.find_spec("torch") is not None:
        stages.insert(5, "imaginer")
    results = run_driver(tmp_path, *stages, budget=2400)
    for stage in stages:
        assert results["stages"][stage]["status"] == "ok", results["stages"][stage].get("error")
    train = results["stages"]["train"]["result"]
    assert {(r["algorithm"], r["action_space"], r["runs"]) for r in train["rows"]} == {
        (a, s, r) for a in ("bc", "td3bc") for s in ("continuous", "discrete") for r in (1, 2)}
    assert all(r["seed_updates_per_s"] > 0 for r in train["rows"])
    engine = results["stages"]["engine"]["result"]["rows"]
    assert [r["contender"] for r in engine] == ["bare", "interval", "interval + eval", "trainer"]
    assert all(r["seed_updates_per_s"] > 0 for r in engine) and engine[0]["share_of_bare"] == 1.0
    envs = results["stages"]["envs"]["result"]["rows"]
    assert {r["env"] for r in envs} == {"clevr", "babyai", "cheetah"} and all("error" not in r for r in envs)
    assert next(r for r in envs if r["env"] == "cheetah")["mujoco_c_steps_per_s"] > 0
    assert results["stages"]["bench"]["result"]["status"] == "finished"


def test_a_file_split_into_parts_is_joined_back_and_a_missing_or_damaged_part_is_refused(tmp_path: Path) -> None:
    original = tmp_path / "weights.whl"
    original.write_bytes(os.urandom(5 * 2**20 + 123))
    manifest = parts.split(original, tmp_path / "parts", 2 * 2**20, rebuild="prepare.py --smollm2")
    record = json.loads(manifest.read_text(encoding="utf-8"))
    assert [p["bytes"] for p in record["parts"]] == [2 * 2**20, 2 * 2**20, 2**20 + 123]
    assert parts.join(manifest, tmp_path / "out").read_bytes() == original.read_bytes()

    third = tmp_path / "parts" / "weights.whl.part-3"
    kept = third.read_bytes()
    third.unlink()  # not carried yet
    assert parts.missing_parts(manifest) == ["weights.whl.part-3"]
    with pytest.raises(parts.PartError, match=r"part 3 of 3 of weights.whl .* is missing: carry it"):
        parts.join(manifest, tmp_path / "out2")
    third.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))  # one bit flipped
    with pytest.raises(parts.PartError, match=r"part 3 of 3 .* is damaged .*rebuild the parts with `prepare.py "
                                              r"--smollm2`"):
        parts.join(manifest, tmp_path / "out2")
    third.write_bytes(kept)
    # Parts intact but not the file the manifest names: the joined file is checked before it is renamed.
    manifest.write_text(json.dumps({**record, "sha256": "0" * 64}), encoding="utf-8")
    with pytest.raises(parts.PartError, match="joined to a file whose SHA-256 is not the manifest's"):
        parts.join(manifest, tmp_path / "out2")
    assert list((tmp_path / "out2").iterdir()) == []  # nothing half-written
    third.write_bytes(kept[:-1] + bytes([kept[-1] ^ 1]))
    # From the command line, as run.sh calls it: the error without a traceback, exit status 1.
    result = subprocess.run([sys.executable, str(ACCEL / "parts.py"), "join", str(manifest), "--out",
                             str(tmp_path / "out3")], capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "is damaged" in result.stderr and "Traceback" not in result.stderr


def test_the_mfu_probe_counts_a_training_steps_flops_as_the_6n_rule_bounds_them() -> None:
    sys.path.insert(0, str(REPO_ROOT / "experiments" / "benchmarks"))
    import imaginer_mfu
    from imaginejax.imaginer.finetune import TINY_ARCHITECTURE

    row = imaginer_mfu.measure("tiny", "full", "float32", rows=2, length=64, steps=1, peak=100.0)
    d, f, layers = TINY_ARCHITECTURE["hidden_size"], TINY_ARCHITECTURE["intermediate_size"], 4
    kv = d // TINY_ARCHITECTURE["num_attention_heads"] * TINY_ARCHITECTURE["num_key_value_heads"]
    matmul_params = layers * (2 * d * d + 2 * d * kv + 3 * d * f)
    per_token = row["gflop_per_step"] * 1e9 / row["tokens_per_step"]
    # Full fine-tuning: 2N forward + 4N backward per token for the layers' matmuls, at least; at most that plus
    # the tied LM head (V x d) at every position and the attention products.
    vocabulary = 49152 + 2  # SmolLM2's tokenizer and the two placeholder tokens
    assert 6 * matmul_params <= per_token <= 6 * (matmul_params + vocabulary * d) + 12 * layers * 64 * d
    assert row["mfu_median"] == pytest.approx(row["tflops_median"] / 100.0)
    assert imaginer_mfu.device_peak("NVIDIA H200") == imaginer_mfu.device_peak("NVIDIA H100 80GB HBM3") == 989.4
    assert imaginer_mfu.device_peak("cpu") is None


def test_a_device_call_keeps_what_it_carried_for_the_last_call(tmp_path: Path) -> None:
    (tmp_path / ".accel" / "parts").mkdir(parents=True)
    (tmp_path / ".accel" / "parts" / "w.whl.part-2").write_bytes(b"\x00part two")
    keep = tmp_path / "keep"
    result = subprocess.run(["bash", str(ACCEL / "imaginer_device.sh"), "--keep", ".accel/parts/w.whl.part-2"],
                            cwd=tmp_path, env=dict(os.environ, KEEP=str(keep)), capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert (keep / ".accel" / "parts" / "w.whl.part-2").read_bytes() == b"\x00part two"


def test_packed_real_data_is_found_in_the_cache_where_it_is_unpacked(tmp_path: Path, monkeypatch) -> None:
    import tarfile

    import prepare
    from imaginejax.imaginer import study

    prepare.pack_real(tmp_path / "real", 6)
    packed = tmp_path / "real" / "clevr-train-real-6.tar.xz"
    assert [p.name for p in (tmp_path / "real").iterdir()] == [packed.name]  # no partial file left
    home = tmp_path / "home"
    with tarfile.open(packed) as tar:
        tar.extractall(home, filter="data")
    monkeypatch.setenv("IMAGINEJAX_HOME", str(home))
    logged: list[str] = []
    monkeypatch.setattr(study, "_log", logged.append)
    data = study.real_data(6)
    assert data.num_trajectories == 6 and "reading 6 expert trajectories" in " ".join(logged)
