"""imaginejax.core.checkpoint on orbax-checkpoint: the format is orbax's (orbax reads a checkpoint back on its
own), every dtype round-trips bit for bit, the last N are kept, a process SIGKILLed mid-save never leaves a
checkpoint that loads, and damaged / missing / foreign checkpoints raise CheckpointError naming the file
and the way out."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

from imaginejax.core.checkpoint import (CheckpointError, checkpoint_path, flatten_named, is_checkpoint,
                                        list_checkpoints, load_checkpoint, save_checkpoint, unflatten_named)

REPO = Path(__file__).resolve().parents[1]


def _arrays() -> dict[str, np.ndarray]:
    """One array of every dtype the project checkpoints, with the awkward values of each."""
    nan_payload = np.array([0x7FC00001, 0xFFC12345], np.uint32).view(np.float32)  # NaNs with payloads
    return {
        "state.params['actor']['kernel']": np.concatenate(
            [np.array([-0.0, np.inf, -np.inf, 1e-45, 3.4028235e38], np.float32), nan_payload]),
        "history/seconds": np.array([0.1, -0.0, np.pi, 1e-310], np.float64),
        "state.step": np.array(7, np.int32),  # 0-d
        "history/steps": np.array([-(2 ** 62), 2 ** 40, -1], np.int64),
        "state.key": np.asarray(jax.random.split(jax.random.PRNGKey(3), 4)),  # raw uint32 PRNG keys
        "state.high_bits": np.array([[0xFFFFFFFF, 0x80000000]], np.uint32),
        "state.finite": np.array([True, False, True]),
        "history/frozen_at": np.zeros((0, 3), np.int64),  # zero-size (orbax refuses to store these)
        "state.params['llama']['w']": np.array([1.5, -2.0, 3.0e38], ml_dtypes.bfloat16),
    }


def _assert_bitwise_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert got[name].tobytes() == value.tobytes(), name  # bitwise: NaN payloads and -0.0 included


def test_every_dtype_round_trips_bit_for_bit_in_orbax_format(tmp_path):
    arrays = _arrays()
    path = save_checkpoint(tmp_path, 3, arrays, {"fingerprint": "abc", "levels": ["train"]})
    assert path == tmp_path / "step-00000003" == checkpoint_path(tmp_path, 3)
    assert is_checkpoint(path) and not is_checkpoint(tmp_path)
    manifest, loaded = load_checkpoint(path)
    _assert_bitwise_equal(loaded, arrays)
    assert manifest["interval"] == 3 and manifest["meta"] == {"fingerprint": "abc", "levels": ["train"]}

    # The format is orbax's: orbax's own step listing finds it, and orbax's PyTree checkpointer reads the
    # arrays back without this module (every non-empty array, same bytes).
    assert ocp.utils.is_checkpoint_finalized(path)
    stored = {k: v for k, v in arrays.items() if v.size > 0}
    by_orbax = ocp.PyTreeCheckpointer().restore(path / "arrays" / "tree")
    _assert_bitwise_equal({k: np.asarray(v) for k, v in by_orbax.items()}, stored)

    # The manifest's checksums are those of the files on disk (hashlib, independently of the module).
    files = manifest["files"]
    on_disk = sorted(p.relative_to(path / "arrays" / "tree").as_posix()
                     for p in (path / "arrays" / "tree").rglob("*") if p.is_file())
    assert sorted(files) == on_disk and any(name.startswith(("d/", "ocdbt")) for name in files)
    for name, entry in files.items():
        data = (path / "arrays" / "tree" / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_flatten_unflatten_restores_a_pytree_exactly(tmp_path):
    tree = {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3)},
            "key": jax.random.PRNGKey(0), "step": jnp.int32(5), "mask": jnp.array([True, False])}
    path = save_checkpoint(tmp_path, 1, flatten_named(jax.device_get(tree), "state"), {})
    _, arrays = load_checkpoint(path)
    back = unflatten_named(arrays, tree, "state", path)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    with pytest.raises(CheckpointError, match=r"has no array .*'other'"):
        unflatten_named(arrays, dict(tree, other=jnp.zeros(1)), "state", path)
    with pytest.raises(CheckpointError, match=r"is float32\[3\] but this sweep needs float32\[4\]"):
        unflatten_named(arrays, dict(tree, params={"w": tree["params"]["w"], "b": jnp.zeros(4)}), "state", path)


def test_keeps_the_last_n_and_replaces_a_resaved_interval(tmp_path):
    for interval in range(1, 5):
        save_checkpoint(tmp_path, interval, {"x": np.full(3, interval, np.int32)}, {"i": interval}, keep=2)
    assert [i for i, _ in list_checkpoints(tmp_path)] == [3, 4]
    path = save_checkpoint(tmp_path, 4, {"x": np.full(3, 40, np.int32)}, {"i": 40}, keep=2)
    manifest, arrays = load_checkpoint(path)
    assert manifest["meta"] == {"i": 40} and arrays["x"].tolist() == [40, 40, 40]
    assert [i for i, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert list_checkpoints(tmp_path / "missing") == []


def test_a_preserved_interval_survives_rotation_until_it_is_no_longer_preserved(tmp_path):
    save_checkpoint(tmp_path, 1, {"x": np.full(3, 1, np.int32)}, {}, keep=2)
    for interval in range(2, 6):  # interval 2 is preserved (a run's best) while 3, 4, 5 rotate
        save_checkpoint(tmp_path, interval, {"x": np.full(3, interval, np.int32)}, {}, keep=2, preserve=(2,))
    assert [i for i, _ in list_checkpoints(tmp_path)] == [2, 4, 5]
    assert load_checkpoint(checkpoint_path(tmp_path, 2))[1]["x"].tolist() == [2, 2, 2]
    save_checkpoint(tmp_path, 6, {"x": np.full(3, 6, np.int32)}, {}, keep=2, preserve=(6,))  # the best moves
    assert [i for i, _ in list_checkpoints(tmp_path)] == [5, 6]


def test_bad_input_is_refused_with_the_field_named(tmp_path):
    with pytest.raises(ValueError, match="keep must be >= 1"):
        save_checkpoint(tmp_path, 1, {"x": np.zeros(1)}, {}, keep=0)
    with pytest.raises(ValueError, match="interval must be >= 0"):
        save_checkpoint(tmp_path, -1, {"x": np.zeros(1)}, {})
    with pytest.raises(ValueError, match="'x' has dtype object"):
        save_checkpoint(tmp_path, 1, {"x": np.array([{}], object)}, {})
    with pytest.raises(TypeError, match="not JSON serializable"):
        save_checkpoint(tmp_path, 1, {"x": np.zeros(1)}, {"bad": object()})
    assert list_checkpoints(tmp_path) == []


KILLER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import imaginejax.core.checkpoint as C

    directory, where = sys.argv[2], sys.argv[3]
    arrays = {"w": np.arange(200_000, dtype=np.float32), "key": np.arange(8, dtype=np.uint32).reshape(4, 2)}
    C.save_checkpoint(directory, 1, arrays, {"n": 1})

    def die(original):
        def wrapped(*args, **kwargs):
            original(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        return wrapped

    if where == "after-arrays":  # every array written, no manifest yet, not renamed
        C.ArraysHandler.save = die(C.ArraysHandler.save)
    elif where == "after-manifest":  # manifest written, orbax has not renamed the step into place
        C.ArraysHandler.finalize = die(C.ArraysHandler.finalize)
    elif where == "mid-deletion":  # save 3 drops checkpoint 1 (keep=2): killed half-way through removing it
        rmtree = C.shutil.rmtree

        def half_rmtree(path, *args, **kwargs):
            files = [p for p in C.Path(path).rglob("*") if p.is_file()] if C.Path(path).is_dir() else []
            if C.Path(path).name == ".deleted" and files:
                for f in files[: len(files) // 2 + 1]:
                    f.unlink()
                os.kill(os.getpid(), signal.SIGKILL)
            rmtree(path, *args, **kwargs)

        C.shutil.rmtree = half_rmtree
    print("saving", flush=True)
    for interval in range(2, 10_000):  # "timed": the parent kills us at some point of some save
        C.save_checkpoint(directory, interval, {"w": arrays["w"] + interval, "key": arrays["key"]},
                          {"n": interval})
""")


@pytest.mark.parametrize("where", ["after-arrays", "after-manifest", "mid-deletion", "timed"])
def test_sigkill_mid_save_never_leaves_a_checkpoint_that_loads(tmp_path, where):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.Popen([sys.executable, str(script), str(REPO), str(tmp_path / "ckpt"), where], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if where == "timed":
        assert proc.stdout.readline().strip() == "saving"
        try:
            proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]

    found = list_checkpoints(tmp_path / "ckpt")
    if where in ("after-arrays", "after-manifest"):
        assert [i for i, _ in found] == [1]
        assert any(".orbax-checkpoint-tmp" in p.name for p in (tmp_path / "ckpt").iterdir())  # the unfinished one
    elif where == "mid-deletion":
        assert [i for i, _ in found] == [2, 3] and (tmp_path / "ckpt" / ".deleted").is_dir()
    for interval, path in found:  # everything listed is complete and verified
        manifest, arrays = load_checkpoint(path)
        assert manifest["meta"] == {"n": interval}
        want = np.arange(200_000, dtype=np.float32) + (interval if interval > 1 else 0)
        np.testing.assert_array_equal(arrays["w"], want)
    # The next save clears the unfinished directory and succeeds.
    nxt = (found[-1][0] if found else 0) + 1
    save_checkpoint(tmp_path / "ckpt", nxt, {"w": np.zeros(2, np.float32)}, {"n": nxt})
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir()
                 if ".orbax-checkpoint-tmp" in p.name or p.name == ".deleted"]
    assert leftovers == []
    assert list_checkpoints(tmp_path / "ckpt")[-1][0] == nxt


def _largest_file(path: Path) -> Path:
    return max((p for p in (path / "arrays" / "tree").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "missing file"])
def test_damaged_array_files_are_refused_naming_the_file(tmp_path, damage):
    save_checkpoint(tmp_path, 1, {"w": np.zeros(8, np.float32)}, {})
    path = save_checkpoint(tmp_path, 2, {"w": np.arange(50_000, dtype=np.float32)}, {})
    target = _largest_file(path)
    data = target.read_bytes()
    if damage == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flipped byte":
        target.write_bytes(data[:-9] + bytes([data[-9] ^ 0x01]) + data[-8:])
    else:
        target.unlink()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    message = str(error.value)
    assert str(target) in message and f"delete {path}" in message and str(tmp_path) in message
    assert ("is missing" if damage == "missing file" else "is truncated or corrupted") in message
    # Deleting it, as the message says, falls back to the previous checkpoint.
    import shutil
    shutil.rmtree(path)
    assert [i for i, _ in list_checkpoints(tmp_path)] == [1] and load_checkpoint(tmp_path / "step-00000001")


def test_missing_corrupted_or_foreign_checkpoints_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"step-00000009 does not exist"):
        load_checkpoint(tmp_path / "step-00000009")
    path = save_checkpoint(tmp_path, 1, {"w": np.ones(3, np.float32)}, {})
    manifest_file = path / "arrays" / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    _reseal(path, dict(manifest, format_version=99))
    with pytest.raises(CheckpointError, match=r"manifest\.json is format 'imaginejax-checkpoint' version 99"):
        load_checkpoint(path)
    (path / "arrays" / "manifest.sha256").unlink()  # format 2, written before seals: read, fully checked
    _reseal(path, dict(manifest, format_version=2), seal=False)
    assert load_checkpoint(path)[1]["w"].tolist() == [1, 1, 1]
    _reseal(path, dict(manifest, format_version=2, interval=2), seal=False)
    with pytest.raises(CheckpointError, match=r"interval 2 is not the checkpoint's \(step-00000001\)"):
        load_checkpoint(path)
    _reseal(path, dict(manifest, format_version=3), seal=False)  # format 3 without its seal
    with pytest.raises(CheckpointError, match="has no seal"):
        load_checkpoint(path)
    manifest_file.write_text("{not json")
    with pytest.raises(CheckpointError, match=rf"manifest {manifest_file} is missing or corrupted.*delete {path}"):
        load_checkpoint(path)
    manifest_file.unlink()
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing or corrupted"):
        load_checkpoint(path)
    old = tmp_path / "old" / "step-00000001"  # the NumPy layout of earlier versions
    old.mkdir(parents=True)
    np.savez(old / "arrays.npz", w=np.ones(3))
    (old / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"NumPy format of an older ImagineJAX"):
        load_checkpoint(old)


# ------------------------------------------------------------------------------- the manifest is sealed


def _reseal(path: Path, manifest: dict, seal: bool = True) -> None:
    """Rewrites a checkpoint's manifest (and, with ``seal``, its seal to match): a deliberate forgery."""
    text = json.dumps(manifest, indent=1).encode()
    (path / "arrays" / "manifest.json").write_bytes(text)
    if seal:
        (path / "arrays" / "manifest.sha256").write_text(f"{hashlib.sha256(text).hexdigest()}  manifest.json\n")


def test_the_seal_is_the_sha256_of_the_manifest_written_last(tmp_path):
    path = save_checkpoint(tmp_path, 2, {"w": np.arange(4, dtype=np.float32)}, {"k": 1})
    item = path / "arrays"
    digest, name = (item / "manifest.sha256").read_text().split()
    assert name == "manifest.json" and digest == hashlib.sha256((item / "manifest.json").read_bytes()).hexdigest()
    assert (item / "manifest.sha256").stat().st_mtime_ns >= (item / "manifest.json").stat().st_mtime_ns


@pytest.mark.parametrize("interval", [1, 3])
def test_an_edited_interval_is_refused_naming_the_previous_checkpoint(tmp_path, interval):
    """``"interval": 2`` edited to 1 resumed silently from the wrong point, and to 3 raised an IndexError
    in the engine; now both are a CheckpointError, before anything is restored."""
    first = save_checkpoint(tmp_path, 1, {"w": np.zeros(3, np.float32)}, {})
    path = save_checkpoint(tmp_path, 2, {"w": np.ones(3, np.float32)}, {})
    manifest_file = path / "arrays" / "manifest.json"
    manifest_file.write_text(manifest_file.read_text().replace('"interval": 2', f'"interval": {interval}'))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    message = str(error.value)
    assert "does not match its seal" in message and str(path) in message
    assert f"resume from the previous checkpoint {first}" in message
    # Even with the seal forged to match, the interval must be the checkpoint's own.
    _reseal(path, dict(json.loads(manifest_file.read_text())))
    with pytest.raises(CheckpointError, match=rf"interval {interval} is not the checkpoint's \(step-00000002\)"):
        load_checkpoint(path)


@pytest.mark.parametrize("forgery", ["no seal", "empty seal", "array list", "file list", "object dtype", "meta",
                                     "extra file"])
def test_every_manifest_inconsistency_is_a_checkpoint_error(tmp_path, forgery):
    path = save_checkpoint(tmp_path, 1, {"w": np.ones(3, np.float32), "e": np.zeros((0, 2), np.int32)}, {"a": 1})
    manifest = json.loads((path / "arrays" / "manifest.json").read_text())
    if forgery == "no seal":
        (path / "arrays" / "manifest.sha256").unlink()
    elif forgery == "empty seal":
        (path / "arrays" / "manifest.sha256").write_text("")
    elif forgery == "array list":
        _reseal(path, dict(manifest, arrays={"w": {"shape": "3", "dtype": "float32", "stored": True}}))
    elif forgery == "file list":
        _reseal(path, dict(manifest, files=[]))
    elif forgery == "object dtype":
        _reseal(path, dict(manifest, arrays=dict(manifest["arrays"], e={"shape": [0], "dtype": "O", "stored": False})))
    elif forgery == "meta":
        _reseal(path, dict(manifest, meta=[1]))
    else:
        (path / "arrays" / "tree" / "smuggled").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=rf"{path}.*start again without resume"):
        load_checkpoint(path)


# ------------------------------------------------------------- relative paths, and intact but unreadable


def test_relative_paths_save_list_and_load_from_another_directory(tmp_path, monkeypatch):
    """orbax refuses relative paths: every public function takes them, from any working directory."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    written = save_checkpoint("../ws/ckpt", 3, _arrays(), {"k": 1})
    assert written.is_absolute() and written == tmp_path / "ws" / "ckpt" / "step-00000003"
    [(interval, path)] = list_checkpoints("../ws/ckpt")
    manifest, arrays = load_checkpoint(os.path.relpath(path))
    assert interval == 3 and manifest["meta"] == {"k": 1}
    _assert_bitwise_equal(arrays, _arrays())
    assert manifest["written_by"] == {"orbax-checkpoint": ocp.__version__, "jax": jax.__version__}


def test_an_intact_checkpoint_this_installation_cannot_read_is_never_to_be_deleted(tmp_path, monkeypatch):
    """Deleting is advised only for a checkpoint proven damaged (seal, size or SHA-256): one whose files all
    match but which orbax (or this format version) cannot read must be kept."""
    save_checkpoint(tmp_path, 1, {"w": np.zeros(3, np.float32)}, {})
    path = save_checkpoint(tmp_path, 2, {"w": np.ones(3, np.float32)}, {})

    def refuse(self, directory, *args, **kwargs):
        raise ValueError("this orbax cannot decode it")

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "restore", refuse)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert "cannot decode it" in message and "every file matches the SHA-256" in message
    assert f"{path} is not damaged, so keep it" in message and "do not delete it" in message
    assert f"delete {path} " not in message
    monkeypatch.undo()
    _reseal(path, dict(json.loads((path / "arrays" / "manifest.json").read_text()), format_version=99))
    with pytest.raises(CheckpointError, match=r"version 99.*is not damaged, so keep it") as caught:
        load_checkpoint(path)
    assert f"delete {path} " not in str(caught.value)
