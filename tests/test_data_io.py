"""Dataset validation and the on-disk format: round trips, atomic writes, corruption detection."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import imaginejax.data.io as data_io
from imaginejax.core import files
from imaginejax.data import (SCHEMA_VERSION, DatasetError, TrajectoryDataset, load_dataset, read_manifest, save_dataset,
                             validate_dataset)


def make_dataset(discrete: bool = True, *, n: int = 5, t: int = 6, seed: int = 0) -> TrajectoryDataset:
    """A small valid dataset with ragged lengths, both kinds of episode end and garbage in the padding.

    Trajectory i has length ``t - (i % 3)``; even rows terminate, odd rows are truncated.
    """
    rng = np.random.default_rng(seed)
    s, a, g, m, e = 4, 3, 2, 3, 5
    lengths = np.array([t - (i % 3) for i in range(n)])
    mask = np.arange(t)[None, :] < lengths[:, None]
    last = np.zeros((n, t), dtype=bool)
    last[np.arange(n), lengths - 1] = True
    ends_in_success = (np.arange(n) % 2 == 0)[:, None]
    if discrete:
        actions = rng.integers(0, 7, size=(n, t)).astype(np.int32)
    else:
        actions = rng.uniform(-1, 1, size=(n, t, a)).astype(np.float32)
    return TrajectoryDataset(
        states=rng.normal(size=(n, t + 1, s)).astype(np.float32),  # padding holds garbage: never read
        actions=actions,
        rewards=rng.normal(size=(n, t)).astype(np.float32),
        mask=mask,
        terminals=last & ends_in_success,
        truncations=last & ~ends_in_success,
        instruction_ids=rng.integers(0, m, size=n).astype(np.int32),
        goals=(rng.integers(0, 5, size=(n, g)).astype(np.int32) if discrete
               else rng.normal(size=(n, g)).astype(np.float32)),
        instructions=("push the red ball left", "move the blue ball behind the green ball", "ünïcode ✓"),
        instruction_embeddings=rng.normal(size=(m, e)).astype(np.float32),
        env="clevr" if discrete else "halfcheetah",
        level="rephrase",
        source="imaginary",
        discrete=discrete,
        provenance={"collector": "test", "seed": seed, "nested": {"values": [1, 2.5, None, True]}},
    )


def assert_bit_exact(a: TrajectoryDataset, b: TrajectoryDataset) -> None:
    for field in dataclasses.fields(TrajectoryDataset):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert y.dtype == x.dtype and y.shape == x.shape, field.name
            assert y.tobytes() == x.tobytes(), field.name
        else:
            assert y == x, field.name
    assert isinstance(b.instructions, tuple)


def directory_snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes), hidden ones included."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("array_format", ["npz", "safetensors"])
@pytest.mark.parametrize("discrete", [True, False])
def test_round_trip_is_bit_exact(tmp_path: Path, discrete: bool, array_format: str) -> None:
    ds = make_dataset(discrete)
    ds.states[2, -1, 0] = np.float32(-0.0)  # padding bits survive too
    path = save_dataset(ds, tmp_path / "data" / "ds", array_format=array_format)
    assert path == (tmp_path / "data" / "ds").resolve()
    assert_bit_exact(ds, load_dataset(path))

    manifest = read_manifest(path)
    assert manifest["schema_version"] == SCHEMA_VERSION
    assert manifest["array_format"] == array_format
    assert manifest["num_trajectories"] == ds.num_trajectories
    assert manifest["num_transitions"] == ds.num_transitions
    assert manifest["instructions"] == list(ds.instructions)
    assert (manifest["env"], manifest["level"], manifest["source"], manifest["discrete"]) == (
        ds.env, ds.level, ds.source, discrete)
    assert {"created_at", "imaginejax_version", "provenance", "dims"} <= set(manifest)
    for name, entry in manifest["arrays"].items():
        file = path / entry["file"]
        assert entry["file"] == f"{name}.{array_format}"
        assert entry["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        assert entry["shape"] == list(getattr(ds, name).shape)
    assert sorted(p.name for p in tmp_path.joinpath("data").iterdir()) == ["ds"]  # no temp siblings


def test_save_refuses_existing_target_without_overwrite(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    before = directory_snapshot(path)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_dataset(make_dataset(seed=1), path)
    assert directory_snapshot(path) == before


def test_overwrite_replaces_dataset(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    new = make_dataset(False, seed=3)
    save_dataset(new, path, overwrite=True, array_format="safetensors")
    assert_bit_exact(new, load_dataset(path))
    assert not list(path.glob("*.npz"))
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_overwrite_without_renameat2_uses_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    monkeypatch.setattr(files, "_renameat2", lambda src, dst, flags: False)
    new = make_dataset(seed=4)
    save_dataset(new, path, overwrite=True)
    assert_bit_exact(new, load_dataset(path))
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_overwrite_refuses_a_directory_that_is_not_a_dataset(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an ImagineJAX dataset"):
        save_dataset(make_dataset(), target, overwrite=True)
    assert (target / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        save_dataset(make_dataset(), tmp_path / "file", overwrite=True)


def test_invalid_dataset_writes_nothing(tmp_path: Path) -> None:
    bad = dataclasses.replace(make_dataset(), level="real")
    with pytest.raises(DatasetError, match="'level'"):
        save_dataset(bad, tmp_path / "ds")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ atomicity


def _fail_on_third_array(monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = data_io._write_array
    calls = []

    def flaky_write(directory, name, value, array_format):
        calls.append(name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device (simulated)")
        return real_write(directory, name, value, array_format)

    monkeypatch.setattr(data_io, "_write_array", flaky_write)


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fail_on_third_array(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        save_dataset(make_dataset(), tmp_path / "ds")
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_leaves_existing_dataset_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = make_dataset()
    path = save_dataset(original, tmp_path / "ds")
    before = directory_snapshot(tmp_path)
    _fail_on_third_array(monkeypatch)
    with pytest.raises(OSError, match="simulated"):
        save_dataset(make_dataset(seed=9), path, overwrite=True)
    assert directory_snapshot(tmp_path) == before
    assert_bit_exact(original, load_dataset(path))


def test_failed_swap_restores_existing_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fallback path: the old dataset was moved aside, then moving the new one in fails."""
    original = make_dataset()
    path = save_dataset(original, tmp_path / "ds")
    before = directory_snapshot(tmp_path)
    monkeypatch.setattr(files, "_renameat2", lambda src, dst, flags: False)
    real_rename = os.rename
    calls = []

    def flaky_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # 1: target -> .old, 2: staged -> target
            raise OSError(5, "I/O error (simulated)")
        return real_rename(src, dst)

    monkeypatch.setattr(data_io.os, "rename", flaky_rename)
    with pytest.raises(OSError, match="simulated"):
        save_dataset(make_dataset(seed=9), path, overwrite=True)
    monkeypatch.undo()
    assert directory_snapshot(tmp_path) == before
    assert_bit_exact(original, load_dataset(path))


@pytest.mark.parametrize("renameat2", [True, False])
def test_target_appearing_during_the_write_is_not_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renameat2: bool) -> None:
    target = tmp_path / "ds"
    real_write = data_io._write_array
    if not renameat2:
        monkeypatch.setattr(files, "_renameat2", lambda src, dst, flags: False)

    def racing_write(directory, name, value, array_format):
        if name == "mask":  # another writer creates the target meanwhile
            target.mkdir()
            (target / "theirs.txt").write_text("theirs")
        return real_write(directory, name, value, array_format)

    monkeypatch.setattr(data_io, "_write_array", racing_write)
    with pytest.raises(FileExistsError):
        save_dataset(make_dataset(), target)
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]
    assert [p.name for p in target.iterdir()] == ["theirs.txt"]


# ------------------------------------------------------------------------------- corruption on disk


def _rewrite_manifest(path: Path, edit: Callable[[dict], None]) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _set_checksum(path: Path, name: str, file: str) -> None:
    digest = hashlib.sha256((path / file).read_bytes()).hexdigest()
    _rewrite_manifest(path, lambda m: m["arrays"][name].update(sha256=digest))


def test_checksum_mismatch_names_the_field(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    raw = bytearray((path / "rewards.npz").read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit inside the array data
    (path / "rewards.npz").write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="checksum mismatch") as info:
        load_dataset(path)
    assert info.value.field == "rewards"
    assert str(info.value).startswith("field 'rewards': ")


@pytest.mark.parametrize("array_format", ["npz", "safetensors"])
def test_truncated_array_file_names_the_field(tmp_path: Path, array_format: str) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds", array_format=array_format)
    file = f"actions.{array_format}"
    raw = (path / file).read_bytes()
    (path / file).write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetError, match="checksum mismatch") as info:
        load_dataset(path)
    assert info.value.field == "actions"
    # Even with a matching checksum (a truncated file written as such), parsing names the field.
    _set_checksum(path, "actions", file)
    with pytest.raises(DatasetError, match="unreadable") as info:
        load_dataset(path)
    assert info.value.field == "actions"


def test_missing_array_file_names_the_field(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    (path / "goals.npz").unlink()
    with pytest.raises(DatasetError, match="missing") as info:
        load_dataset(path)
    assert info.value.field == "goals"


def test_pickled_object_array_is_refused(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    sentinel = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (Path.touch, (sentinel,))

    with open(path / "rewards.npz", "wb") as f:
        np.savez(f, rewards=np.array([Exploit()], dtype=object), allow_pickle=True)
    _set_checksum(path, "rewards", "rewards.npz")
    with pytest.raises(DatasetError, match="pickle") as info:
        load_dataset(path)
    assert info.value.field == "rewards"
    assert not sentinel.exists()


def test_array_stored_with_another_shape_or_dtype_is_refused(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    with open(path / "rewards.npz", "wb") as f:
        np.savez(f, rewards=np.zeros((5, 6), np.float64))
    _set_checksum(path, "rewards", "rewards.npz")
    with pytest.raises(DatasetError, match="manifest says") as info:
        load_dataset(path)
    assert info.value.field == "rewards"


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    _rewrite_manifest(path, lambda m: m.update(schema_version=SCHEMA_VERSION + 1))
    with pytest.raises(DatasetError, match="upgrade imaginejax") as info:
        load_dataset(path)
    assert info.value.field == "schema_version"


def test_manifest_problems_are_named(tmp_path: Path) -> None:
    path = save_dataset(make_dataset(), tmp_path / "ds")
    _rewrite_manifest(path, lambda m: m["arrays"]["mask"].update(file="../../etc/passwd"))
    with pytest.raises(DatasetError, match="malformed manifest entry") as info:
        load_dataset(path)
    assert info.value.field == "mask"
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON") as info:
        load_dataset(path)
    assert info.value.field == "manifest.json"
    (path / "manifest.json").unlink()
    with pytest.raises(DatasetError, match="missing") as info:
        load_dataset(path)
    assert info.value.field == "manifest.json"
    with pytest.raises(FileNotFoundError):
        load_dataset(tmp_path / "nowhere")


def test_invalid_content_on_disk_is_caught_by_validation(tmp_path: Path) -> None:
    """A file with a matching checksum still goes through every validation rule."""
    path = save_dataset(make_dataset(), tmp_path / "ds")
    rewards = make_dataset().rewards.copy()
    rewards[1, 2] = np.nan
    with open(path / "rewards.npz", "wb") as f:
        np.savez(f, rewards=rewards)
    _set_checksum(path, "rewards", "rewards.npz")
    with pytest.raises(DatasetError, match="non-finite") as info:
        load_dataset(path)
    assert info.value.field == "rewards" and info.value.path == str(path)


# ------------------------------------------------------------------------------------------ validation


def _set(field: str, index: tuple, value) -> Callable[[TrajectoryDataset], TrajectoryDataset]:
    """A mutation writing ``value`` at ``index`` of a copy of array ``field``."""

    def mutate(ds: TrajectoryDataset) -> TrajectoryDataset:
        array = getattr(ds, field).copy()
        array[index] = value
        return dataclasses.replace(ds, **{field: array})

    return mutate


def _replace(**changes) -> Callable[[TrajectoryDataset], TrajectoryDataset]:
    return lambda ds: dataclasses.replace(
        ds, **{k: (v(ds) if callable(v) else v) for k, v in changes.items()})


# In make_dataset(n=5, t=6): lengths 6, 5, 4, 6, 5; rows 0, 2, 4 terminate, rows 1, 3 are truncated.
RULES = {
    "wrong shape": (_replace(rewards=lambda ds: ds.rewards[:, :-1]), "rewards", "expected (N, T)"),
    "states not T+1": (_replace(states=lambda ds: ds.states[:, :-1]), "states", "T+1"),
    "wrong dtype": (_replace(rewards=lambda ds: ds.rewards.astype(np.float64)), "rewards", "dtype float64"),
    "jax array": (_replace(rewards=lambda ds: jnp.asarray(ds.rewards)), "rewards", "numpy.ndarray"),
    "object array": (_replace(goals=lambda ds: ds.goals.astype(object)), "goals", "object arrays"),
    "discrete flag vs actions": (_replace(discrete=False), "actions", "discrete=False"),
    "NaN reward": (_set("rewards", (2, 3), np.nan), "rewards",
                   "1 non-finite values, first at trajectory 2 step 3"),
    "inf in last next state": (_set("states", (2, 4, 1), np.inf), "states", "first at trajectory 2 step 4"),
    "NaN embedding": (_set("instruction_embeddings", (1, 0), np.nan), "instruction_embeddings", "row 1"),
    "mask not prefix": (_set("mask", (1, 2), False), "mask", "not a prefix"),
    "empty trajectory": (_set("mask", (4, slice(None)), False), "mask", "trajectory 4 has no valid step"),
    "truncation on padding": (_set("truncations", (1, 5), True), "truncations",
                              "flags set on padding, first at trajectory 1 step 5"),
    "terminal on padding": (_set("terminals", (2, 4), True), "terminals", "padding"),
    "terminal and truncated": (_set("truncations", (0, 5), True), "truncations", "both terminal and truncated"),
    "flag before the end": (_set("terminals", (3, 1), True), "terminals", "before the last valid step"),
    "unflagged end": (_set("truncations", (1, 4), False), "truncations", "neither terminal nor truncated"),
    "instruction id out of range": (_set("instruction_ids", (3,), 3), "instruction_ids",
                                    "first at trajectory 3 (id 3)"),
    "negative instruction id": (_set("instruction_ids", (0,), -1), "instruction_ids", "outside [0, M)"),
    "embedding table size": (_replace(instructions=lambda ds: ds.instructions[:2]), "instruction_embeddings",
                             "M = 2"),
    "non-string instruction": (_replace(instructions=("a", 2, "c")), "instructions", "entry 1"),
    "unknown level": (_replace(level="real"), "level", "unknown level 'real'"),
    "unknown source": (_replace(source="generated"), "source", "unknown source"),
    "negative discrete action": (_set("actions", (4, 0), -2), "actions", "negative"),
    "provenance not JSON": (_replace(provenance={"key": np.arange(3)}), "provenance", "not JSON-serialisable"),
    "no trajectories": (_replace(**{f: (lambda ds, f=f: getattr(ds, f)[:0]) for f in (
        "states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids", "goals")}),
        "mask", "placeholder_like"),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_validation_rule_names_the_field(rule: str) -> None:
    mutate, field, fragment = RULES[rule]
    with pytest.raises(DatasetError) as info:
        validate_dataset(mutate(make_dataset()))
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(f"field {field!r}: ") and "; fix: " in message
    assert fragment in message


@pytest.mark.parametrize("rule", ["inf continuous action", "NaN float goal"])
def test_validation_rules_for_continuous_datasets(rule: str) -> None:
    mutate, field = {"inf continuous action": (_set("actions", (1, 0, 2), -np.inf), "actions"),
                     "NaN float goal": (_set("goals", (0, 1), np.nan), "goals")}[rule]
    with pytest.raises(DatasetError, match="non-finite") as info:
        validate_dataset(mutate(make_dataset(False)))
    assert info.value.field == field


def test_validation_ignores_values_on_padding_and_bounds_discrete_actions() -> None:
    ds = make_dataset()
    ds = _set("rewards", (1, 5), np.nan)(ds)           # padding of row 1 (length 5)
    ds = _set("states", (2, 6, 0), np.nan)(ds)         # state after the end of row 2 (length 4)
    ds = _set("actions", (2, 5), -7)(ds)
    dims = validate_dataset(ds)
    assert dims == (5, 6, 4, None, 2, 3, 5, 26)
    assert validate_dataset(make_dataset(False)).A == 3
    with pytest.raises(DatasetError, match=r"outside \[0, 4\)") as info:
        validate_dataset(_set("actions", (0, 0), 4)(make_dataset()), num_actions=4)
    assert info.value.field == "actions"


def test_dataset_error_is_a_picklable_value_error() -> None:
    err = DatasetError("rewards", "3 non-finite values", "drop them", "/x")
    assert isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.field, again.problem, again.fix, again.path, str(again)) == (
        "rewards", "3 non-finite values", "drop them", "/x", str(err))
    assert str(err) == "field 'rewards': 3 non-finite values; fix: drop them (dataset at /x)"


def test_repr_summarises_the_dataset_instead_of_printing_its_arrays() -> None:
    discrete, continuous = make_dataset(n=200, t=50), make_dataset(False, n=200, t=50)
    assert repr(discrete) == ("TrajectoryDataset(env='clevr', level='rephrase', source='imaginary', 200 trajectories "
                              f"× 50 steps ({discrete.num_transitions:,} valid), state 4 float32, action int32 "
                              "(discrete), goal 2 int32, 3 instructions, embedding 5 float32)")
    assert len(repr(continuous)) < 500 and "env='halfcheetah'" in repr(continuous)
    assert "action 3 float32, goal 2 float32" in repr(continuous)
    assert discrete == discrete and dataclasses.replace(discrete, level="easy") != discrete  # equality unchanged
