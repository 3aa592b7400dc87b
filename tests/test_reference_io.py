"""Reference-layout files (imaginejax.interop.reference): ours → HDF5 / .npy dict / parquet → ours bit-exact,
the reference's conventions read correctly (embedding split, masks, terminal defects), and malformed or
malicious files refused with the field named and nothing written — a pickle that would run code never runs."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from imaginejax.data import DatasetError, TrajectoryDataset, load_dataset
from imaginejax.interop.reference import (
    export_reference,
    import_reference,
    load_npy,
    read_reference_file,
    reference_arrays,
)

import dataset_helpers
from dataset_helpers import random_babyai_dataset

S = 17  # BabyAI state width
CAP = 128  # BabyAI step cap


@pytest.fixture(scope="module")
def dataset() -> TrajectoryDataset:
    """16 random-policy BabyAI trajectories (both successes and time limits) with an 8-d embedding table."""
    ds = random_babyai_dataset(16, key_seed=3, embed_dim=8, table_seed=0)
    assert ds.terminals.any() and ds.truncations.any()
    return ds


def assert_bit_exact(a: TrajectoryDataset, b: TrajectoryDataset) -> None:
    dataset_helpers.assert_bit_exact(a, b, ("instructions", "env", "level", "source", "discrete"))


def write_npy_dict(path: Path, arrays: dict) -> Path:
    np.save(path, arrays, allow_pickle=True)
    return path


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("suffix", ["h5", "npy", "parquet"])
def test_round_trip_is_bit_exact_and_keeps_provenance(tmp_path: Path, dataset: TrajectoryDataset,
                                                      suffix: str) -> None:
    file = export_reference(dataset, tmp_path / f"babyai_real.{suffix}")
    back = import_reference(file)
    assert_bit_exact(dataset, back)
    prov = back.provenance
    assert prov["source_sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    assert prov["source_file"] == str(file) and prov["source_format"] == {"h5": "hdf5"}.get(suffix, suffix)
    assert prov["terminals"] == "file" and prov["original_provenance"] == dataset.provenance
    saved = import_reference(file, out=tmp_path / "saved")  # and through our own format
    assert_bit_exact(dataset, load_dataset(tmp_path / "saved"))
    assert load_dataset(tmp_path / "saved").provenance["source_sha256"] == saved.provenance["source_sha256"]


def test_npy_export_is_what_the_reference_scripts_load(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    file = export_reference(dataset, tmp_path / "x.npy")
    data = np.load(file, allow_pickle=True).item()  # the reference's own loading line
    n, t = dataset.mask.shape
    lengths = dataset.mask.sum(1)
    for i in range(n):
        emb = dataset.instruction_embeddings[dataset.instruction_ids[i]]
        for s in range(t):
            expected = np.concatenate([dataset.states[i, s], emb]) if s < lengths[i] else np.zeros(S + 8)
            np.testing.assert_array_equal(data["observations"][i, s], expected)
        np.testing.assert_array_equal(data["next_observations"][i, lengths[i] - 1],
                                      np.concatenate([dataset.states[i, lengths[i]], emb]))
    assert data["rewards"].shape == data["masks"].shape == data["terminals"].shape == (n, t, 1)
    np.testing.assert_array_equal(data["masks"][..., 0], dataset.mask.astype(np.float32))
    # terminals are true terminations only: time-limited rows carry a timeout instead
    np.testing.assert_array_equal(data["terminals"][..., 0] + data["timeouts"][..., 0],
                                  (dataset.terminals | dataset.truncations).astype(np.float32))
    assert data["terminals"][lengths == CAP].sum() == 0


# --------------------------------------------------------------------------- the reference's conventions


def reference_dict(ds: TrajectoryDataset, *, every_end_terminal: bool, keep: tuple[str, ...]) -> dict:
    """A file as the reference writes it: only the ``keep`` fields, optionally with its terminal defect."""
    full = reference_arrays(ds)
    out = {k: full[k] for k in keep}
    if every_end_terminal:
        out["terminals"] = (full["terminals"] + full["timeouts"]).astype(np.float32)
    return out


def test_every_end_terminal_defect_is_undone_with_the_success_predicate(tmp_path: Path,
                                                                         dataset: TrajectoryDataset) -> None:
    raw = reference_dict(dataset, every_end_terminal=True,
                         keep=("observations", "next_observations", "actions", "rewards", "masks", "goals"))
    back = import_reference(write_npy_dict(tmp_path / "r.npy", raw), "babyai", "real", "real")
    assert back.level == "train"
    assert back.provenance["terminals"] == "success predicate"
    assert "file_terminals_ignored" in back.provenance
    # the environment flagged these while collecting: an independent record of true terminations
    np.testing.assert_array_equal(back.terminals, dataset.terminals)
    np.testing.assert_array_equal(back.truncations, dataset.truncations)
    assert back.provenance["terminals_disagreeing_with_file"] == int(dataset.truncations.any(1).sum())


def test_without_goals_terminals_follow_the_step_cap(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    raw = reference_dict(dataset, every_end_terminal=True,
                         keep=("observations", "next_observations", "actions", "rewards", "masks"))
    back = import_reference(write_npy_dict(tmp_path / "r.npy", raw), "babyai", "train", "real")
    lengths = dataset.mask.sum(1)
    np.testing.assert_array_equal(back.terminals.any(1), lengths < CAP)
    assert back.goals.shape == (len(lengths), 0)
    assert back.provenance["terminals"].startswith("step cap")


def test_misaligned_done_on_padding_is_moved_to_the_last_valid_step(tmp_path: Path,
                                                                     dataset: TrajectoryDataset) -> None:
    raw = reference_dict(dataset, every_end_terminal=False,
                         keep=("observations", "next_observations", "actions", "rewards", "masks", "goals",
                               "timeouts"))
    lengths = dataset.mask.sum(1)
    shifted = np.zeros_like(raw["masks"])
    rows = np.flatnonzero(dataset.terminals.any(1) & (lengths < CAP))
    assert len(rows) > 0
    shifted[rows, lengths[rows]] = 1.0  # the reference's done one step late, on padding
    raw["terminals"] = shifted
    back = import_reference(write_npy_dict(tmp_path / "r.npy", raw), "babyai", "train", "real",
                            terminals="file")
    assert back.provenance["terminals_realigned"] == len(rows)
    np.testing.assert_array_equal(back.terminals[rows], dataset.terminals[rows])


def test_missing_next_observations_drops_the_unknowable_last_step(tmp_path: Path,
                                                                   dataset: TrajectoryDataset) -> None:
    raw = reference_dict(dataset, every_end_terminal=True, keep=("observations", "actions", "rewards", "masks"))
    back = import_reference(write_npy_dict(tmp_path / "r.npy", raw), "babyai", "train", "real")
    lengths = dataset.mask.sum(1)
    kept = lengths >= 2
    np.testing.assert_array_equal(back.mask.sum(1), lengths[kept] - 1)
    assert not back.terminals.any() and back.truncations.sum() == kept.sum()
    for j, i in enumerate(np.flatnonzero(kept)):
        np.testing.assert_array_equal(back.states[j, : lengths[i]], dataset.states[i, : lengths[i]])
    assert back.provenance["dropped_single_step_rows"] == int((~kept).sum())


def test_side_file_supplies_instructions_and_bare_states_get_no_embedding(tmp_path: Path,
                                                                          dataset: TrajectoryDataset) -> None:
    import h5py

    full = reference_arrays(dataset)
    with h5py.File(tmp_path / "ball.h5", "w") as f:  # bare 17-d states, no instructions: the side file has them
        for key in ("actions", "rewards", "masks", "terminals", "timeouts"):
            f.create_dataset(key, data=full[key])
        f.create_dataset("observations", data=full["observations"][..., :S])
        f.create_dataset("next_observations", data=full["next_observations"][..., :S])
    side = write_npy_dict(tmp_path / "ball.npy", {"instructions": full["instructions"][:, None].astype(object)})
    back = import_reference(tmp_path / "ball.h5", "babyai", "train", "real", side_file=side)
    texts = [dataset.instructions[i] for i in dataset.instruction_ids]
    assert [back.instructions[i] for i in back.instruction_ids] == texts
    assert back.instruction_embeddings.shape == (len(set(texts)), 0)
    # the texts are our own phrasings, so the goals come from the level's task table
    assert back.provenance["goals"] == "instructions"
    np.testing.assert_array_equal(back.goals, dataset.goals)
    assert back.provenance["side_file_sha256"] == hashlib.sha256(side.read_bytes()).hexdigest()


def test_discrete_actions_stored_as_float_columns_are_read(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    raw = reference_arrays(dataset)
    raw["actions"] = raw["actions"][..., None].astype(np.float32)  # (N, T, 1) floats, as d3rlpy stores them
    back = import_reference(write_npy_dict(tmp_path / "r.npy", raw))
    np.testing.assert_array_equal(back.actions, dataset.actions)


# ------------------------------------------------------------------------------------- malicious pickles


class RunsCode:
    """Unpickling this calls os.system (what a malicious dataset would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("container", ["npy", "raw pickle"])
def test_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path: Path, dataset: TrajectoryDataset,
                                                              container: str) -> None:
    marker = tmp_path / "pwned"
    payload = {**reference_arrays(dataset), "extra": RunsCode(marker)}
    file = tmp_path / "evil.npy"
    if container == "npy":
        np.save(file, payload, allow_pickle=True)
    else:
        file.write_bytes(pickle.dumps(payload, protocol=4))
    out = tmp_path / "out"
    with pytest.raises(DatasetError) as err:
        import_reference(file, out=out)
    message = str(err.value)
    assert err.value.field == "extra" and err.value.path == str(file)  # the key under which it sits
    assert f"{os.system.__module__}.system" in message and "trust_pickle=True" in message
    assert not marker.exists() and not out.exists()


def test_trust_pickle_opt_in_reads_other_globals(tmp_path: Path) -> None:
    import datetime

    file = tmp_path / "dated.npy"
    np.save(file, {"when": datetime.date(2025, 5, 1)}, allow_pickle=True)
    with pytest.raises(DatasetError, match="datetime.date"):
        load_npy(file)
    assert load_npy(file, trust_pickle=True) == {"when": datetime.date(2025, 5, 1)}


def test_numpy1_pickles_are_read(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    """Files written by NumPy 1.x name ``numpy.core.multiarray``, and protocol-2 pickles spell bytes as
    ``_codecs.encode``; the restricted unpickler reads both."""
    holder = np.empty((), dtype=object)
    holder[()] = reference_arrays(dataset)
    stream = pickle.dumps(holder, protocol=2)  # GLOBAL opcodes: newline-terminated text, safe to rename
    stream = stream.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in stream and b"_codecs" in stream
    with open(tmp_path / "old.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": ()})
        f.write(stream)
    assert_bit_exact(dataset, import_reference(tmp_path / "old.npy"))


# -------------------------------------------------------------------------------------- malformed files


def test_truncated_hdf5_is_refused_and_nothing_written(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    file = export_reference(dataset, tmp_path / "cut.h5")
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(DatasetError) as err:
        import_reference(file, out=tmp_path / "out")
    assert err.value.field == "cut.h5" and "truncated" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_truncated_npy_payload_is_refused(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    file = export_reference(dataset, tmp_path / "cut.npy")
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(DatasetError, match="cut.npy"):
        read_reference_file(file)


def _mutated(dataset: TrajectoryDataset, key: str, change) -> dict:
    raw = reference_arrays(dataset)
    raw[key] = change(raw[key].copy())
    return raw


def _nan_on_valid(x: np.ndarray) -> np.ndarray:
    x[1, 0, 2] = np.nan
    return x


MALFORMED = {
    "observations narrower than the state": ("observations", lambda x: x[..., :10]),
    "observations of rank 2": ("observations", lambda x: x[:, :, 0]),
    "NaN observation on a valid step": ("observations", _nan_on_valid),
    "inf reward on a valid step": ("rewards", lambda x: np.where(np.arange(x.shape[1])[None, :, None] == 0,
                                                                 np.inf, x)),
    "actions of another length": ("actions", lambda x: x[:, :-1]),
    "action index out of range": ("actions", lambda x: np.full_like(x, 7)),
    "mask with a hole": ("masks", lambda x: np.concatenate([x[:, :1], np.zeros_like(x[:, :1]), x[:, 2:]], 1)),
    "mask values other than 0/1": ("masks", lambda x: x * 2),
    "embedding changing within a trajectory": ("observations", lambda x: x + (np.arange(x.shape[1])[None, :, None]
                                                                             * (np.arange(x.shape[2]) >= S))),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_fields_are_named_and_nothing_written(tmp_path: Path, dataset: TrajectoryDataset,
                                                       case: str) -> None:
    key, change = MALFORMED[case]
    file = write_npy_dict(tmp_path / "bad.npy", _mutated(dataset, key, change))
    with pytest.raises(DatasetError) as err:
        import_reference(file, out=tmp_path / "out")
    assert err.value.field == key, str(err.value)
    assert not (tmp_path / "out").exists()


def test_nan_on_padding_is_ignored(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    raw = reference_arrays(dataset)
    row = int(np.argmin(dataset.mask.sum(1)))
    raw["observations"][row, -1] = np.nan  # padding: never read
    back = import_reference(write_npy_dict(tmp_path / "pad.npy", raw))
    assert_bit_exact(dataset, back)


def test_missing_field_and_unknown_env_are_named(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    raw = reference_arrays(dataset)
    del raw["masks"]
    with pytest.raises(DatasetError) as err:
        import_reference(write_npy_dict(tmp_path / "a.npy", raw))
    assert err.value.field == "masks"
    raw = reference_arrays(dataset)
    del raw["imaginejax"]
    with pytest.raises(DatasetError) as err:
        import_reference(write_npy_dict(tmp_path / "b.npy", raw))
    assert err.value.field == "env" and "pass env=" in str(err.value)


def test_export_is_atomic_and_refuses_to_overwrite(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    file = export_reference(dataset, tmp_path / "d.h5")
    before = file.read_bytes()
    with pytest.raises(FileExistsError):
        export_reference(dataset, file)
    assert file.read_bytes() == before
    bad = dataclasses.replace(dataset, rewards=dataset.rewards[:, :-1])
    with pytest.raises(DatasetError):
        export_reference(bad, tmp_path / "e.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.h5"]


def test_ragged_parquet_column_is_named(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    file = export_reference(dataset, tmp_path / "ok.parquet")
    table = pq.read_table(file)
    rewards = table.column("rewards").to_pylist()
    rewards[2] = rewards[2][:-1]  # one trajectory a step short
    ragged = table.set_column(table.column_names.index("rewards"), "rewards", pa.array(rewards))
    pq.write_table(ragged.replace_schema_metadata(table.schema.metadata), tmp_path / "ragged.parquet")
    with pytest.raises(DatasetError) as err:
        import_reference(tmp_path / "ragged.parquet")
    assert err.value.field == "rewards" and "ragged" in str(err.value)
