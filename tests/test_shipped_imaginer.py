"""The packaged imaginers: CLEVR's loads on a fresh machine (SmolLM2 backbone + shipped LoRA adapters),
BabyAI's (``tiny`` trained whole, corpus vocabulary) too, and both generate legal rollouts; damaged, missing
or foreign files are refused with the command that re-makes them."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from imaginejax import envs
from imaginejax.imaginer.imagine import imagine
from imaginejax.imaginer.shipped import ASSETS, SHIPPED, ShippedImaginerError, load_shipped, shipped_for


@pytest.fixture(scope="module")
def imaginer():
    return load_shipped("clevr")


def test_shipped_imaginer_generates_rollouts_scored_against_the_simulator(imaginer):
    assert imaginer.step == 1000 and imaginer.config.llama.num_hidden_layers == 30  # SmolLM2-135M
    env, params = envs.make("clevr", "easy", embed=False)
    result = imagine(imaginer, env, params, jax.random.PRNGKey(0), 8, progress=False)
    ds = result.dataset
    assert ds.num_trajectories == 8 and ds.level == "easy" and ds.source == "imaginary"
    quality = ds.provenance["quality"]
    assert quality["legal_rollout_rate"] == 1.0  # projected onto legal states
    assert 0.0 <= quality["goal_consistency"] <= 1.0 and np.isfinite(ds.states).all()


def test_shipped_babyai_imaginer_generates_legal_rollouts():
    from imaginejax.core.files import file_sha256
    from imaginejax.imaginer.shipped import shipped_digest

    item = shipped_for("babyai")
    weights, record = ASSETS / f"{item.name}.safetensors", ASSETS / f"{item.name}.json"
    assert shipped_digest(weights, record) == item.sha256 and weights.stat().st_size < 8 * 2**20
    imaginer = load_shipped("babyai")
    assert imaginer.config.llama.num_hidden_layers == 4 and imaginer.tokenizer.get_vocab_size() < 1_000
    assert file_sha256(weights) == imaginer_weights_sha256(record)
    env, params = envs.make("babyai", "rephrase", embed=False)  # words the training corpus never held
    ds = imagine(imaginer, env, params, jax.random.PRNGKey(0), 8, progress=False).dataset
    assert ds.num_trajectories == 8 and ds.env == "babyai" and np.isfinite(ds.states).all()
    assert ds.provenance["quality"]["legal_rollout_rate"] == 1.0  # projected onto legal states


def imaginer_weights_sha256(record_path):
    import json

    return json.loads(record_path.read_text())["weights_sha256"]


def test_damaged_missing_or_foreign_files_are_refused(tmp_path):
    item = SHIPPED["clevr-smollm2-lora-all"]
    for suffix in (".safetensors", ".json"):
        shutil.copy(ASSETS / f"{item.name}{suffix}", tmp_path / f"{item.name}{suffix}")
    weights = tmp_path / f"{item.name}.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedImaginerError, match="damaged or replaced.*imaginer.shipped export"):
        load_shipped("clevr", assets=tmp_path)
    weights.unlink()
    with pytest.raises(ShippedImaginerError, match="missing"):
        load_shipped("clevr", assets=tmp_path)
    with pytest.raises(ShippedImaginerError, match="no trained imaginer ships for 'cheetah'.*clevr-smollm2-lora-all"):
        shipped_for("cheetah")
    # The clevr files asked for as another environment's imaginer: refused, naming both.
    shutil.copy(ASSETS / f"{item.name}.safetensors", weights)
    foreign = type(item)(item.name, "babyai", item.sha256, item.command)
    with pytest.raises(ShippedImaginerError, match="'clevr'.*'babyai'"):
        load_shipped("babyai", assets=tmp_path, expected=foreign)


def test_study_scores_the_shipped_imaginer(tmp_path, monkeypatch, capsys):
    import json

    from imaginejax.imaginer import study

    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path))
    study.main(["evaluate", "shipped:clevr", "--num", "2", "--levels", "easy", "--project"])
    written = tmp_path / "imaginer-study" / "shipped-clevr" / "quality-projected-n2"
    assert f"written: {written}.json, {written}.md" in capsys.readouterr().out  # says where its report went
    record = json.loads((tmp_path / "imaginer-study" / "shipped-clevr" / "quality-projected-n2.json").read_text())
    assert record["env"] == "clevr" and record["step"] == 1000 and record["project"]
    assert record["levels"]["easy"]["legal_rollout_rate"] == 1.0
    with pytest.raises(SystemExit, match="--step picks a checkpoint of a study run"):
        study.main(["evaluate", "shipped:clevr", "--step", "500"])


def _assets_copy(tmp_path, **preset_changes):
    """The shipped files in tmp_path, the record's preset changed, and an entry pinning the copy."""
    import json

    from imaginejax.imaginer.shipped import shipped_digest

    item = SHIPPED["clevr-smollm2-lora-all"]
    shutil.copy(ASSETS / f"{item.name}.safetensors", tmp_path / f"{item.name}.safetensors")
    record = json.loads((ASSETS / f"{item.name}.json").read_text())
    record["preset"].update(preset_changes)
    (tmp_path / f"{item.name}.json").write_text(json.dumps(record))
    digest = shipped_digest(tmp_path / f"{item.name}.safetensors", tmp_path / f"{item.name}.json")
    return record, type(item)(item.name, item.env, digest, item.command)


def test_the_pin_covers_weights_and_record(tmp_path):
    from imaginejax.core.files import file_sha256
    from imaginejax.imaginer.shipped import shipped_digest

    item = SHIPPED["clevr-smollm2-lora-all"]
    weights, record = ASSETS / f"{item.name}.safetensors", ASSETS / f"{item.name}.json"
    assert shipped_digest(weights, record) == item.sha256
    assert file_sha256(weights) == "e0082341c0a7ec0da9a051e9709effb91a587e2c1cdb21d7092e98213097a8ac"
    # An edited record (the LoRA scale, the normaliser) is refused as a replaced weights file is.
    _assets_copy(tmp_path, lora_alpha=64.0)
    with pytest.raises(ShippedImaginerError, match="json is damaged or replaced.*imaginer.shipped export"):
        load_shipped("clevr", assets=tmp_path)


def test_a_record_naming_a_model_path_is_refused_before_it_is_opened(tmp_path):
    import json
    import sys

    from imaginejax.imaginer.finetune import load_imaginer
    from imaginejax.imaginer.records import RunRecordError

    backbone = tmp_path / "backbone.gguf"
    backbone.write_bytes(b"GGUF")
    opened = []
    sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open" and str(args[0]) == str(backbone)
                     else None)
    record, item = _assets_copy(tmp_path, model_path=str(backbone))
    with pytest.raises(ShippedImaginerError, match=r"field preset.model_path is '.*backbone.gguf': a record never names"):
        load_shipped("clevr", assets=tmp_path, expected=item)
    # A run directory of one's own: refused before run.json's tokenizer or checkpoints are looked at.
    run = tmp_path / "run"
    run.mkdir()
    for field in ("env", "step", "checkpoint_hash", "weights_sha256", "command", "frozen_backbone_hash_on_the_gpu"):
        record.pop(field)
    (run / "run.json").write_text(json.dumps(record))
    with pytest.raises(RunRecordError, match=r"run.json: field preset.model_path is .*load_imaginer\(run_dir, model_path="):
        load_imaginer(run)
    assert opened == []


@pytest.mark.parametrize("field, value, message", [
    ("preset.lora_alpha", "32", r"preset.lora_alpha is '32': not a finite number"),
    ("preset.source", "../../etc", r"preset.source is '../../etc': not one of random, gguf, hf"),
    ("kalm_config.llama.num_hidden_layers", 10**6, r"num_hidden_layers is 1000000: not an integer in \[1, 128\]"),
    ("kalm_config.llama.hidden_size", "576", r"hidden_size is '576': not an integer"),
    ("normalizer.std", [1.0] * 9, r"normalizer.std is \[1.0, .*: not 10 numbers"),
    ("normalizer.mean", [float("nan")] * 10, r"normalizer.mean\[0\] is nan: not a finite number"),
    ("text_format.start_id", 10**9, r"text_format.start_id is 1000000000: not an integer in \[0, 49153\]"),
    ("backbone_path", "/etc/passwd", r"field backbone_path is '/etc/passwd': not a field of a run record"),
])
def test_run_records_are_checked_field_by_field(tmp_path, field, value, message):
    import json

    from imaginejax.imaginer.finetune import load_imaginer
    from imaginejax.imaginer.records import RunRecordError

    record = json.loads((ASSETS / "clevr-smollm2-lora-all.json").read_text())
    for key in ("env", "step", "checkpoint_hash", "weights_sha256", "command", "frozen_backbone_hash_on_the_gpu"):
        record.pop(key)
    *parents, last = field.split(".")
    node = record
    for key in parents:
        node = node[key]
    node[last] = value
    (tmp_path / "run.json").write_text(json.dumps(record))
    with pytest.raises(RunRecordError, match=message):
        load_imaginer(tmp_path)
