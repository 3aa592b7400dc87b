"""Minari interop: our datasets as Minari datasets and back, terminations and truncations kept apart.

Export (:func:`to_minari`) writes a standard Minari dataset directory ``<root>/<dataset_id>/data`` (Minari's
``metadata.json`` plus its HDF5 / arrow / parquet storage) that ``minari.load_dataset(dataset_id)`` opens
when ``root`` is Minari's datasets root (``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``):

* one Minari episode per trajectory, with its L valid steps: observations (L+1 entries) are
  ``{"state": (L+1, S) float32, "instruction": (L+1,) int}`` — the space of the Gymnasium adapter made
  with ``embed=False`` (:mod:`imaginejax.interop.gym_adapter`), which is recorded as the dataset's
  environment spec so ``MinariDataset.recover_environment()`` builds it; actions (L,) / (L, A);
  rewards (L,); **terminations** (L,) = our ``terminals``, **truncations** (L,) = our ``truncations``;
* per episode, the metadata ``goal`` (G,) and ``instruction_id``;
* the dataset metadata key ``imaginejax``: env, level, source, discrete, horizon T, goal dtype and width,
  the instruction table (strings), the provenance, and the name and SHA-256 of the instruction-embedding
  table, stored next to Minari's files as ``imaginejax_instruction_embeddings.npy`` (no pickle).

The directory is built in a hidden temporary sibling and renamed into place (nothing half-written is
ever visible; see :mod:`imaginejax.data.io`).

Import (:func:`from_minari`) reads a dataset exported here bit-exactly (padding is zeros, as everywhere
in ImagineJAX). It also reads other Minari datasets whose observations are a ``Box`` (the state) or a
``Dict`` with a ``"state"`` Box (optionally ``"instruction"`` ids or text and an ``"embedding"`` Box):
``env``, ``level`` and ``source`` are then given by the caller, goals are empty (G = 0), an episode that
ends with neither flag is marked truncated (collection stopped), and the horizon is the longest episode.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from imaginejax.core.files import file_sha256, staged_dir
from imaginejax.data.budget import DecodeBudget
from imaginejax.data.errors import DatasetError
from imaginejax.data.types import TrajectoryDataset
from imaginejax.data.validate import EnvFacts, validate_dataset, validate_for_env
from imaginejax.interop.reference import check_hdf5_file, load_npy

__all__ = ["EMBEDDINGS_FILE", "METADATA_KEY", "from_minari", "minari_root", "to_minari"]

METADATA_KEY = "imaginejax"
EMBEDDINGS_FILE = "imaginejax_instruction_embeddings.npy"
FORMAT_VERSION = 1


def minari_root() -> Path:
    """Minari's local datasets root (``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets``)."""
    from minari.storage.datasets_root_dir import get_dataset_path

    return Path(get_dataset_path())


def _spaces(ds: TrajectoryDataset, state_dim: int) -> tuple[Any, Any]:
    """(observation space, action space) of ``ds``; the adapter's spaces when ``ds.env`` is registered."""
    from gymnasium import spaces

    from imaginejax import envs as registry

    env = None
    if ds.env in registry.registered():
        env, _ = registry.make(ds.env, ds.level, embed=False)
    big = float(np.finfo(np.float32).max)
    obs = spaces.Dict({"state": spaces.Box(-big, big, shape=(state_dim,), dtype=np.float32),
                       "instruction": spaces.Discrete(len(ds.instructions))})
    if ds.discrete:
        used = int(ds.actions[ds.mask].max()) + 1 if ds.mask.any() else 1
        action: Any = spaces.Discrete(max(int(getattr(env, "num_actions", used)), used))
    else:
        dim = ds.actions.shape[2]
        low = np.broadcast_to(np.asarray(getattr(env, "action_low", -1.0), np.float32), (dim,)).copy()
        high = np.broadcast_to(np.asarray(getattr(env, "action_high", 1.0), np.float32), (dim,)).copy()
        valid = ds.actions[ds.mask]
        if valid.size and ((valid < low).any() or (valid > high).any()):  # data outside the nominal bounds
            low, high = np.full(dim, -big, np.float32), np.full(dim, big, np.float32)
        action = spaces.Box(low, high, shape=(dim,), dtype=np.float32)
    return obs, action


def _env_spec(ds: TrajectoryDataset) -> Any:
    """The gymnasium EnvSpec of the adapter that produces this dataset's spaces (None if unregistered)."""
    from imaginejax import envs as registry

    if ds.env not in registry.registered():
        return None
    from gymnasium.envs.registration import EnvSpec

    from imaginejax.interop import gym_adapter

    return EnvSpec(id=gym_adapter.env_id(ds.env, ds.level), entry_point="imaginejax.interop.gym_adapter:ImagineEnv",
                   kwargs={"name": ds.env, "level": ds.level, "embed": False})


def to_minari(ds: TrajectoryDataset, dataset_id: str | None = None, *,
              root: str | os.PathLike[str] | None = None,
              data_format: Literal["hdf5", "arrow", "parquet"] = "hdf5", overwrite: bool = False,
              description: str | None = None, algorithm_name: str | None = None) -> Path:
    """Writes ``ds`` as the Minari dataset ``dataset_id`` under ``root`` (module docstring).

    Args:
      ds: a valid dataset (checked first; nothing is written if it is invalid).
      dataset_id: Minari id ``(namespace/)name-v<version>``; default ``imaginejax/<env>-<level>-<source>-v0``.
      root: the datasets root; default :func:`minari_root`.
      data_format: Minari storage (``"hdf5"`` needs h5py, ``"arrow"`` / ``"parquet"`` pyarrow).
      overwrite: replace an existing dataset of that id.
      description, algorithm_name: Minari metadata (defaults from the provenance).

    Returns:
      The dataset's directory ``<root>/<dataset_id>`` (Minari's files are in its ``data`` folder).

    Raises:
      DatasetError: ``ds`` is invalid. FileExistsError: the dataset exists and ``overwrite`` is False.
      ValueError: a malformed ``dataset_id``.
    """
    import minari
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.dataset.minari_storage import MinariStorage

    dims = validate_dataset(ds)
    dataset_id = dataset_id or f"imaginejax/{ds.env}-{ds.level}-{ds.source}-v0"
    parse_dataset_id(dataset_id)  # raises ValueError for malformed ids
    base = Path(root).expanduser().resolve() if root is not None else minari_root()
    target = base / dataset_id
    if os.path.lexists(target) and not overwrite:
        raise FileExistsError(f"{target} already exists; pass overwrite=True to replace the dataset there")
    if os.path.lexists(target) and not (target / "data" / "metadata.json").is_file():
        raise FileExistsError(f"{target} is not a Minari dataset; refusing to replace it")
    with staged_dir(target, overwrite=overwrite) as staged:
        obs_space, action_space = _spaces(ds, dims.S)
        storage = MinariStorage.new(staged / "data", observation_space=obs_space, action_space=action_space,
                                    env_spec=_env_spec(ds), data_format=data_format, jpeg_encoding=False)
        lengths = ds.mask.sum(axis=1)
        buffers = []
        for i, length in enumerate(lengths):
            length = int(length)
            buffers.append(EpisodeBuffer(
                id=i,
                observations={"state": ds.states[i, : length + 1],
                              "instruction": np.full(length + 1, ds.instruction_ids[i], np.int64)},
                actions=(ds.actions[i, :length].astype(np.int64) if ds.discrete else ds.actions[i, :length]),
                rewards=ds.rewards[i, :length],
                terminations=ds.terminals[i, :length],
                truncations=ds.truncations[i, :length],
            ))
        storage.update_episodes(buffers)
        storage.update_episode_metadata(
            [{"goal": ds.goals[i], "instruction_id": int(ds.instruction_ids[i])} for i in range(dims.N)],
            episode_indices=range(dims.N))
        embeddings_file = staged / "data" / EMBEDDINGS_FILE
        with open(embeddings_file, "xb") as f:
            np.save(f, np.ascontiguousarray(ds.instruction_embeddings), allow_pickle=False)
        record = {
            "format_version": FORMAT_VERSION, "env": ds.env, "level": ds.level, "source": ds.source,
            "discrete": bool(ds.discrete), "horizon": dims.T, "goal_dtype": ds.goals.dtype.name,
            "goal_dim": dims.G, "instructions": list(ds.instructions), "provenance": ds.provenance,
            "embeddings_file": EMBEDDINGS_FILE, "embeddings_sha256": file_sha256(embeddings_file),
        }
        storage.update_metadata({
            "dataset_id": dataset_id,
            "minari_version": minari.__version__,
            "algorithm_name": algorithm_name or str(ds.provenance.get("policy", ds.provenance.get("generator",
                                                                                                  "unknown"))),
            "description": description or f"ImagineJAX {ds.source} rollouts of {ds.env}, level {ds.level}",
            "requirements": ["imaginejax"],
            METADATA_KEY: json.loads(json.dumps(record, allow_nan=False)),
        })
        for path in (staged / "data").rglob("*"):
            if path.is_file():
                with open(path, "rb+") as f:
                    os.fsync(f.fileno())
    return target


def _open(dataset: Any, root: str | os.PathLike[str] | None, max_decoded_bytes: int | None) -> Any:
    """A MinariDataset from an instance, a dataset directory (with or without ``/data``) or an id."""
    import minari

    if isinstance(dataset, minari.MinariDataset):
        return dataset
    path = Path(dataset).expanduser()
    candidates = [path, path / "data"]
    if not path.is_absolute() and not path.exists():
        base = Path(root).expanduser() if root is not None else minari_root()
        candidates = [base / str(dataset) / "data"]
    for candidate in candidates:
        if (candidate / "metadata.json").is_file():
            for file in sorted(candidate.glob("*.hdf5")):  # refuse links / storage outside the file first
                check_hdf5_file(file, max_decoded_bytes=max_decoded_bytes)
            try:
                return minari.MinariDataset(candidate)
            except Exception as err:
                raise DatasetError("metadata.json", f"Minari cannot open the dataset ({type(err).__name__}: "
                                   f"{err})", "re-export or re-download it", candidate) from err
    raise FileNotFoundError(f"no Minari dataset at {', '.join(str(c) for c in candidates)}")


def _episode_arrays(episode: Any, state_key: str | None, path: Path) -> tuple[np.ndarray, ...]:
    obs = episode.observations
    states = np.asarray(obs if state_key is None else obs[state_key])
    length = len(episode.rewards)
    if states.ndim != 2 or states.shape[0] != length + 1:
        raise DatasetError("observations", f"episode {episode.id}: {list(states.shape)} states for {length} steps "
                           "(expected L + 1 rows of (S,))", "re-export the dataset", path)
    return (states, np.asarray(episode.actions), np.asarray(episode.rewards),
            np.asarray(episode.terminations, bool), np.asarray(episode.truncations, bool))


def from_minari(dataset: Any, *, root: str | os.PathLike[str] | None = None, env: str | None = None,
                level: str | None = None, source: Literal["real", "imaginary"] | None = None,
                max_decoded_bytes: int | None = None) -> TrajectoryDataset:
    """Reads a Minari dataset into a validated :class:`TrajectoryDataset` (module docstring).

    Args:
      dataset: a ``minari.MinariDataset``, a dataset directory, or a dataset id under ``root``.
      root: the datasets root for ids; default :func:`minari_root`.
      env, level, source: required for datasets not exported by :func:`to_minari`; override otherwise.
      max_decoded_bytes: the most bytes each HDF5 file, and the padded arrays, may decode to (default:
        :mod:`imaginejax.data.budget`); the padded size (N × horizon) is checked before it is allocated.

    Returns:
      The dataset; its provenance is the exported one (datasets of ours) or names the Minari source.

    Raises:
      DatasetError: naming the field, for a tampered embedding table, inconsistent episodes, an HDF5 file
        that links or stores data outside itself, or any rule of :func:`validate_dataset` — and, for a
        registered environment, of :func:`validate_for_env` (action range, state width and plausibility).
        FileNotFoundError: no dataset there.
    """
    from gymnasium import spaces

    from imaginejax import envs as registry

    mds = _open(dataset, root, max_decoded_bytes)
    storage = mds.storage
    path = Path(storage.data_path)
    metadata = storage.metadata
    record = metadata.get(METADATA_KEY)
    obs_space, action_space = mds.observation_space, mds.action_space
    if isinstance(obs_space, spaces.Dict):
        if "state" not in obs_space.spaces:
            raise DatasetError("observations", f"a Dict observation space without 'state' ({list(obs_space.spaces)})",
                               "export observations as {'state': Box, ...} or a Box", path)
        state_key: str | None = "state"
    elif isinstance(obs_space, spaces.Box) and len(obs_space.shape) == 1:
        state_key = None
    else:
        raise DatasetError("observations", f"unsupported observation space {obs_space}",
                           "only Box or Dict(state=Box, ...) observations hold state vectors", path)
    discrete = isinstance(action_space, spaces.Discrete)
    if not discrete and not (isinstance(action_space, spaces.Box) and len(action_space.shape) == 1):
        raise DatasetError("actions", f"unsupported action space {action_space}",
                           "only Discrete or 1-d Box actions are supported", path)
    episodes = list(mds.iterate_episodes())
    if not episodes:
        raise DatasetError("episodes", "the dataset holds no episode", "export a non-empty dataset", path)
    episode_meta = list(storage.get_episode_metadata(mds.episode_indices))
    parts = [_episode_arrays(ep, state_key, path) for ep in episodes]
    n = len(parts)
    if record:
        _check_record(record, path)
    horizon = int(record["horizon"]) if record else max(len(p[2]) for p in parts)
    s_dim = parts[0][0].shape[1]
    a_shape = () if discrete else (int(action_space.shape[0]),)
    step_bytes = 4 * int(np.prod(a_shape)) + 4 + 3  # actions, rewards, mask / terminals / truncations
    nbytes = n * ((horizon + 1) * s_dim * 4 + horizon * step_bytes)
    DecodeBudget(path / "metadata.json", max_decoded_bytes).charge(
        nbytes, f"{METADATA_KEY}.horizon" if record else "episodes",
        f"{n} episodes padded to a horizon of {horizon} steps (the longest holds {max(len(p[2]) for p in parts)}) "
        f"would take {nbytes} bytes")
    states = np.zeros((n, horizon + 1, s_dim), np.float32)
    actions = np.zeros((n, horizon) + a_shape, np.int32 if discrete else np.float32)
    rewards = np.zeros((n, horizon), np.float32)
    mask = np.zeros((n, horizon), bool)
    terminals = np.zeros((n, horizon), bool)
    truncations = np.zeros((n, horizon), bool)
    for i, (st, ac, rw, te, tr) in enumerate(parts):
        length = len(rw)
        if discrete and ac.size and (ac.dtype.kind not in "biu" or ac.min() < 0 or ac.max() > _INT32_MAX):
            raise DatasetError("actions", f"episode {episodes[i].id}: {ac.dtype} actions in [{ac.min()}, {ac.max()}] "
                               "are not int32 indices into the action space (casting would wrap them)",
                               "store Discrete actions as non-negative integer indices", path)
        if length > horizon or st.shape[1] != s_dim:
            raise DatasetError("observations", f"episode {episodes[i].id} has {length} steps of width "
                               f"{st.shape[1]} (horizon {horizon}, width {s_dim})", "re-export the dataset", path)
        states[i, : length + 1] = st
        actions[i, :length] = ac.reshape((length,) + a_shape)
        rewards[i, :length] = rw
        mask[i, :length] = True
        terminals[i, :length] = te
        truncations[i, :length] = tr
        if not record and length and not (te[-1] or tr[-1]):
            truncations[i, length - 1] = True  # collection stopped mid-episode: a cut, not a terminal
    if record:
        instructions = tuple(record["instructions"])
        emb_file = path / record["embeddings_file"]
        if not emb_file.is_file():
            raise DatasetError("instruction_embeddings", f"{emb_file.name} is missing", "re-export the dataset", path)
        if file_sha256(emb_file) != record["embeddings_sha256"]:
            raise DatasetError("instruction_embeddings", f"checksum mismatch for {emb_file.name}",
                               "the file is corrupted; re-export the dataset", path)
        embeddings = load_npy(emb_file)
        if not isinstance(embeddings, np.ndarray) or embeddings.ndim != 2 or embeddings.dtype.kind != "f":
            raise DatasetError("instruction_embeddings", f"{emb_file.name} does not hold an (M, E) float array",
                               "re-export the dataset", path)
        ids = np.asarray([int(m["instruction_id"]) for m in episode_meta], np.int32)
        goal_rows = [np.asarray(m.get("goal", []), dtype=record["goal_dtype"]).reshape(int(record["goal_dim"]))
                     for m in episode_meta]
        goals = np.stack(goal_rows).astype(record["goal_dtype"])
        for i, ep in enumerate(episodes):
            if state_key is not None and "instruction" in ep.observations:
                seen = np.asarray(ep.observations["instruction"])
                if (seen != ids[i]).any():
                    raise DatasetError("instruction_ids", f"episode {ep.id}: observation ids {np.unique(seen)} "
                                       f"differ from its metadata id {ids[i]}", "re-export the dataset", path)
        env = env or record["env"]
        level = level or record["level"]
        source = source or record["source"]
        provenance = record["provenance"]
    else:
        if env is None or level is None or source is None:
            raise DatasetError("env", "this Minari dataset was not exported by ImagineJAX, so its env, level and "
                               "source are unknown", "pass env=, level= and source=", path)
        ids, instructions, embeddings = _foreign_instructions(episodes, obs_space, path)
        goals = np.zeros((n, 0), np.int32)
        provenance = {"importer": "imaginejax.interop.minari_io", "minari_dataset_id": metadata.get("dataset_id"),
                      "minari_version": metadata.get("minari_version"), "source_path": str(path)}
    ds = TrajectoryDataset(states=states, actions=actions, rewards=rewards, mask=mask, terminals=terminals,
                           truncations=truncations, instruction_ids=ids, goals=goals, instructions=instructions,
                           instruction_embeddings=np.asarray(embeddings, np.float32), env=env, level=level,
                           source=source, discrete=discrete, provenance=provenance)
    try:
        validate_dataset(ds, num_actions=int(action_space.n) if discrete else None)
        if env in registry.registered():
            validate_for_env(ds, EnvFacts.of(registry.make(env, "train", embed=False)[0]))
    except DatasetError as err:
        names = {"terminals": "terminations", "truncations": "truncations"}
        raise DatasetError(names.get(err.field, err.field), err.problem, err.fix, path) from err
    return ds


_INT32_MAX = int(np.iinfo(np.int32).max)
_RECORD = {"horizon": int, "instructions": list, "embeddings_file": str, "embeddings_sha256": str, "goal_dtype": str,
           "goal_dim": int, "env": str, "level": str, "source": str, "provenance": dict}


def _check_record(record: Any, path: Path) -> None:
    """The ``imaginejax`` metadata record of an exported dataset: keys, types, and a plain file name."""
    fix = "the dataset's metadata.json is corrupted or hand-edited; re-export the dataset"
    if not isinstance(record, dict):
        raise DatasetError(METADATA_KEY, f"a {type(record).__name__}, not a JSON object", fix, path)
    for key, kind in _RECORD.items():
        if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
            raise DatasetError(f"{METADATA_KEY}.{key}", f"{record.get(key)!r} is not a {kind.__name__}", fix, path)
    name = record["embeddings_file"]
    if Path(name).name != name or name in ("", ".", ".."):
        raise DatasetError(f"{METADATA_KEY}.embeddings_file", f"{name!r} is not a file name inside the dataset "
                           "(reading it would read outside the dataset)", fix, path)
    if record["goal_dtype"] not in ("int32", "float32") or record["goal_dim"] < 0:
        raise DatasetError(f"{METADATA_KEY}.goal_dtype", f"goals of {record['goal_dtype']!r}[{record['goal_dim']}]",
                           fix, path)
    if not 1 <= record["horizon"] <= 1_000_000:
        raise DatasetError(f"{METADATA_KEY}.horizon", f"{record['horizon']} steps", fix, path)


def _foreign_instructions(episodes: list[Any], obs_space: Any, path: Path
                          ) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """Instruction ids, table and embeddings of a foreign dataset (one instruction per episode)."""
    from gymnasium import spaces

    parts = obs_space.spaces if isinstance(obs_space, spaces.Dict) else {}
    instr_space = parts.get("instruction")
    has_emb = isinstance(parts.get("embedding"), spaces.Box)
    width = int(parts["embedding"].shape[0]) if has_emb else 0
    table: list[str] = []
    vectors: list[np.ndarray] = []
    index: dict[tuple[str, bytes], int] = {}
    ids = np.zeros(len(episodes), np.int32)
    for i, ep in enumerate(episodes):
        obs = ep.observations
        text = ""
        if instr_space is not None:
            values = obs["instruction"]
            first = values[0]
            if any(v != first for v in (values if isinstance(values, list) else np.asarray(values).tolist())):
                raise DatasetError("instruction", f"episode {ep.id} changes instruction mid-episode",
                                   "one instruction per episode", path)
            text = str(first) if isinstance(instr_space, spaces.Text) else f"<instruction {int(first)}>"
        vec = np.asarray(obs["embedding"], np.float32)[0] if has_emb else np.zeros(0, np.float32)
        if has_emb and (np.asarray(obs["embedding"], np.float32) != vec).any():
            raise DatasetError("embedding", f"episode {ep.id} changes its embedding mid-episode",
                               "one instruction embedding per episode", path)
        key = (text, vec.tobytes())
        if key not in index:
            index[key] = len(table)
            table.append(text or "<no instruction>")
            vectors.append(vec)
        ids[i] = index[key]
    return ids, tuple(table), np.stack(vectors).reshape(len(table), width)
