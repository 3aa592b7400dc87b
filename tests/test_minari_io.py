"""Minari interop (imaginejax.interop.minari_io): ours → Minari → ours bit-exact, terminations and
truncations kept apart as Minari's own API reads them, the environment recoverable, foreign Minari
datasets importable, corruption and invalid input refused with nothing written."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import minari
import numpy as np
import pytest
from gymnasium import spaces
from minari.data_collector import EpisodeBuffer
from minari.dataset.minari_storage import MinariStorage

from imaginejax.data import DatasetError, TrajectoryDataset
from imaginejax.interop.minari_io import EMBEDDINGS_FILE, from_minari, to_minari

import dataset_helpers
from dataset_helpers import random_babyai_dataset



@pytest.fixture(scope="module")
def dataset() -> TrajectoryDataset:
    """12 random-policy BabyAI trajectories (successes and time limits) with a 6-d embedding table."""
    ds = random_babyai_dataset(12, key_seed=5, embed_dim=6, table_seed=1)
    assert ds.terminals.any() and ds.truncations.any()
    return ds


def assert_bit_exact(a: TrajectoryDataset, b: TrajectoryDataset) -> None:
    dataset_helpers.assert_bit_exact(a, b, ("instructions", "env", "level", "source", "discrete", "provenance"))


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_round_trip_is_bit_exact(tmp_path: Path, dataset: TrajectoryDataset, data_format: str) -> None:
    target = to_minari(dataset, "test/babyai-real-v0", root=tmp_path, data_format=data_format)
    assert target == tmp_path / "test" / "babyai-real-v0"
    assert_bit_exact(dataset, from_minari(target))
    assert_bit_exact(dataset, from_minari("test/babyai-real-v0", root=tmp_path))
    assert [p.name for p in (tmp_path / "test").iterdir()] == ["babyai-real-v0"]  # no temporary left


def test_minari_reads_terminations_and_truncations_apart(tmp_path: Path, dataset: TrajectoryDataset,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    to_minari(dataset, "test/babyai-flags-v0")  # default root: Minari's
    loaded = minari.load_dataset("test/babyai-flags-v0")
    lengths = dataset.mask.sum(1)
    assert loaded.total_episodes == len(lengths) and loaded.total_steps == int(lengths.sum())
    for i, episode in enumerate(loaded.iterate_episodes()):
        n = int(lengths[i])
        np.testing.assert_array_equal(episode.terminations, dataset.terminals[i, :n])
        np.testing.assert_array_equal(episode.truncations, dataset.truncations[i, :n])
        np.testing.assert_array_equal(episode.observations["state"], dataset.states[i, : n + 1])
        np.testing.assert_array_equal(episode.actions, dataset.actions[i, :n])
    # a time-limited episode is a truncation in Minari too, never a termination
    cut = int(np.argmax(dataset.truncations.any(1)))
    assert loaded[cut].truncations[-1] and not loaded[cut].terminations.any()


def test_environment_is_recoverable(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    loaded = minari.MinariDataset(to_minari(dataset, "test/babyai-env-v0", root=tmp_path) / "data")
    env = loaded.recover_environment()
    obs, _ = env.reset(seed=0)
    assert obs in loaded.observation_space and env.action_space == loaded.action_space
    first = loaded[0].observations
    assert {"state": first["state"][0], "instruction": first["instruction"][0]} in loaded.observation_space


def test_tampered_embedding_table_is_refused(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    target = to_minari(dataset, "test/babyai-tamper-v0", root=tmp_path)
    file = target / "data" / EMBEDDINGS_FILE
    table = np.load(file)
    table[0, 0] += 1.0
    np.save(file, table)
    with pytest.raises(DatasetError) as err:
        from_minari(target)
    assert err.value.field == "instruction_embeddings" and "checksum" in str(err.value)


def test_invalid_dataset_writes_nothing(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    bad = dataclasses.replace(dataset, rewards=np.where(dataset.mask, np.nan, 0).astype(np.float32))
    with pytest.raises(DatasetError) as err:
        to_minari(bad, "test/bad-v0", root=tmp_path)
    assert err.value.field == "rewards"
    assert list(tmp_path.iterdir()) == []


def test_existing_dataset_is_not_replaced_without_overwrite(tmp_path: Path, dataset: TrajectoryDataset) -> None:
    to_minari(dataset, "keep-v0", root=tmp_path)
    with pytest.raises(FileExistsError):
        to_minari(dataset, "keep-v0", root=tmp_path)
    short = dataclasses.replace(dataset, provenance={"note": "second"})
    to_minari(short, "keep-v0", root=tmp_path, overwrite=True)
    assert from_minari(tmp_path / "keep-v0").provenance == {"note": "second"}


def test_foreign_minari_dataset_is_imported(tmp_path: Path) -> None:
    """A Minari dataset from elsewhere: Box observations, one episode cut without a flag."""
    storage = MinariStorage.new(tmp_path / "data", observation_space=spaces.Box(-1, 1, (3,), np.float32),
                                action_space=spaces.Discrete(4), data_format="hdf5")
    rng = np.random.default_rng(0)
    lengths, ends = (4, 2, 3), ("terminated", "truncated", "neither")
    buffers = []
    for i, (n, end) in enumerate(zip(lengths, ends)):
        buffers.append(EpisodeBuffer(
            id=i, observations=rng.uniform(-1, 1, (n + 1, 3)).astype(np.float32),
            actions=rng.integers(0, 4, n), rewards=rng.normal(size=n).astype(np.float32),
            terminations=np.arange(n) == (n - 1 if end == "terminated" else -1),
            truncations=np.arange(n) == (n - 1 if end == "truncated" else -1)))
    storage.update_episodes(buffers)
    storage.update_metadata({"dataset_id": "other/thing-v0", "minari_version": minari.__version__})
    with pytest.raises(DatasetError) as err:
        from_minari(tmp_path)
    assert err.value.field == "env"
    ds = from_minari(tmp_path, env="thing", level="train", source="real")
    assert ds.mask.shape == (3, 4) and ds.states.shape == (3, 5, 3)
    np.testing.assert_array_equal(ds.mask.sum(1), lengths)
    np.testing.assert_array_equal(ds.terminals.any(1), [True, False, False])
    np.testing.assert_array_equal(ds.truncations.any(1), [False, True, True])  # cut without a flag: truncated
    np.testing.assert_array_equal(ds.states[0, :5], buffers[0].observations)
    assert ds.goals.shape == (3, 0) and ds.provenance["minari_dataset_id"] == "other/thing-v0"
