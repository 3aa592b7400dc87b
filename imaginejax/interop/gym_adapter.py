"""Gymnasium adapter: any registered environment as a ``gymnasium.Env`` and a ``gymnasium.vector.VectorEnv``.

For users coming from the reference API (``env = make(...)``, ``obs, info = env.reset()``,
``env.step(action)``, ``real, imaginary = env.get_dataset(level)``)::

    from imaginejax.interop import gym_adapter
    env = gym_adapter.make("clevr", "hard")                 # or gymnasium.make("imaginejax/clevr-hard-v0")
    obs, info = env.reset(seed=0)                           # obs: {"state", "instruction", "embedding"}
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    vec = gym_adapter.make_vec("clevr", "hard", num_envs=64)  # one jitted batched step for all 64
    real, imaginary = env.get_dataset("hard")               # reference-layout dicts (see below)

It is generic over the environment contract (ARCHITECTURE.md): it needs ``envs.make(name, level)``, the
batched kernels ``reset_batch`` / ``reset_to_task_batch`` / ``step_batch`` (``info["success"]``,
``info["truncated"]``), ``state_vector``, ``goal_of``, ``instructions(level)``, ``state_dim``,
``discrete`` and ``num_actions`` (discrete) or ``action_dim`` (continuous; bounds from optional
``action_low`` / ``action_high``, default ±1 as in every continuous environment of BENCHMARK.md).

Spaces. Observation: ``Dict(state=Box(S), instruction=Discrete(M) | Text, embedding=Box(E))`` — the
instruction as an id into the level's instruction table (``instruction="id"``, default) or as its text
(``instruction="text"``); ``embedding`` only when the environment is made with ``embed=True`` (E > 0).
Action: ``Discrete(num_actions)`` or ``Box(low, high, (A,))``.

Episodes. ``terminated`` is the task's success (a true terminal), ``truncated`` the step cap; the
single environment does not auto-reset (stepping a finished episode keeps it frozen with reward 0, as
the JAX environment does). The vector environment auto-resets in gymnasium's default ``NEXT_STEP`` mode:
the step after an episode ended resets that sub-environment (its action is ignored, reward 0,
``terminated = truncated = False``). All sub-environments step in **one jitted call** of the batched
kernel, with the reset of the finishing ones computed in the same call.

Randomness. Gymnasium seeding maps to JAX keys: ``reset(seed=s)`` starts the key chain at
``jax.random.PRNGKey(s)`` (the vector environment's row i at ``PRNGKey(s + i)``), ``reset()`` without a
seed draws one from ``self.np_random``; every reset and step splits the chain. Sub-environment i of a
vector environment reset with seed s therefore behaves exactly like a single environment reset with
seed s + i (until its first auto-reset).

Reset options: ``{"task": k}`` (a row of the level's task table) and optionally ``{"phrasing": p}``;
the vector environment takes an int or an (num_envs,) array for each.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from imaginejax import envs as registry
from imaginejax.lang import encode_instructions

__all__ = ["ImagineEnv", "ImagineVectorEnv", "env_id", "get_dataset", "make", "make_vec", "register_envs"]

InstructionMode = Literal["id", "text"]
_ENTRY_POINT = "imaginejax.interop.gym_adapter:ImagineEnv"
_VECTOR_ENTRY_POINT = "imaginejax.interop.gym_adapter:ImagineVectorEnv"


# ------------------------------------------------------------------------------------------ the kernels


class _Kernels:
    """Jitted batched reset / step of one environment class (cached per class: environments are stateless).

    Every function takes per-row PRNG keys (B, 2) and returns the advanced keys, so each row owns a key
    chain: ``keys, sub = split(keys)`` before every reset and step.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.reset = jax.jit(self._reset)
        self.step = jax.jit(self._step)

    @staticmethod
    def _split(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
        both = jax.vmap(jax.random.split)(keys)  # (B, 2, 2)
        return both[:, 0], both[:, 1]

    def _reset(self, keys: jax.Array, params: Any, task: jax.Array | None, phrasing: jax.Array | None
               ) -> tuple[jax.Array, Any, jax.Array, jax.Array]:
        """keys (B, 2) → (keys, state, state vectors (B, S), instruction ids (B,))."""
        keys, sub = self._split(keys)
        if task is None:
            _, state = self.env.reset_batch(sub, params)
        else:
            _, state = self.env.reset_to_task_batch(sub, params, task, phrasing)
        return keys, state, self.env.state_vector(state), state.instruction

    def _step(self, keys: jax.Array, state: Any, action: jax.Array, params: Any, autoreset: jax.Array
              ) -> tuple[jax.Array, Any, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
        """One batched step; rows with ``autoreset`` (B,) True are reset instead (NEXT_STEP mode).

        Returns (keys, state, state vectors (B, S), instruction ids (B,), reward (B,) float32,
        terminated (B,) bool, truncated (B,) bool).
        """
        keys, sub = self._split(keys)
        _, stepped, reward, _, info = self.env.step_batch(sub, state, action, params)
        _, fresh = self.env.reset_batch(sub, params)

        def pick(new: jax.Array, old: jax.Array) -> jax.Array:
            return jnp.where(autoreset.reshape(autoreset.shape + (1,) * (new.ndim - 1)), new, old)

        state = jax.tree.map(pick, fresh, stepped)
        reward = jnp.where(autoreset, 0.0, reward).astype(jnp.float32)
        terminated = info["success"] & ~autoreset
        truncated = info["truncated"] & ~autoreset
        return keys, state, self.env.state_vector(state), state.instruction, reward, terminated, truncated


_KERNELS: dict[tuple[Any, ...], _Kernels] = {}


def _kernels(env: Any) -> _Kernels:
    """The kernels of ``env``, shared by environments of the same class and configuration (its instance
    attributes, e.g. a physics backend; the contract's environments hold nothing else)."""
    key = (type(env), tuple(sorted((k, repr(v)) for k, v in vars(env).items())))
    if key not in _KERNELS:
        _KERNELS[key] = _Kernels(env)
    return _KERNELS[key]


# ------------------------------------------------------------------------------------------------ spaces


def _action_space(env: Any) -> spaces.Space:
    if env.discrete:
        return spaces.Discrete(int(env.num_actions))
    dim = int(env.action_dim)
    low = np.broadcast_to(np.asarray(getattr(env, "action_low", -1.0), np.float32), (dim,))
    high = np.broadcast_to(np.asarray(getattr(env, "action_high", 1.0), np.float32), (dim,))
    return spaces.Box(low=low.copy(), high=high.copy(), shape=(dim,), dtype=np.float32)


_FLOAT_MAX = float(np.finfo(np.float32).max)


def _observation_space(env: Any, table: Sequence[str], embeddings: np.ndarray, instruction: InstructionMode
                       ) -> spaces.Dict:
    """``state`` bounds: the environment's optional ``state_low`` / ``state_high``, else the finite float32
    range (every finite state fits); ``embedding`` bounds: the embedding table's own range."""
    dim = int(env.state_dim)
    low = np.broadcast_to(np.asarray(getattr(env, "state_low", -_FLOAT_MAX), np.float32), (dim,)).copy()
    high = np.broadcast_to(np.asarray(getattr(env, "state_high", _FLOAT_MAX), np.float32), (dim,)).copy()
    parts: dict[str, spaces.Space] = {"state": spaces.Box(low, high, shape=(dim,), dtype=np.float32)}
    if instruction == "id":
        parts["instruction"] = spaces.Discrete(len(table))
    else:
        charset = "".join(sorted(set("".join(table)))) or " "
        parts["instruction"] = spaces.Text(max_length=max(len(s) for s in table),
                                           min_length=min(len(s) for s in table), charset=charset)
    if embeddings.shape[1] > 0:
        parts["embedding"] = spaces.Box(float(embeddings.min()), float(embeddings.max()),
                                        shape=(embeddings.shape[1],), dtype=np.float32)
    return spaces.Dict(parts)


def _check_mode(instruction: str) -> None:
    if instruction not in ("id", "text"):
        raise ValueError(f"instruction must be 'id' or 'text', got {instruction!r}")


# ------------------------------------------------------------------------------------- the environments


class _Adapter:
    """What the single and the vector environment share: the JAX environment, its params and views."""

    def _setup(self, name: str, level: str, embed: bool, instruction: InstructionMode) -> None:
        _check_mode(instruction)
        self.name, self.level, self.embed, self.instruction_mode = name, level, bool(embed), instruction
        self.jax_env, self.params = registry.make(name, level, embed=encode_instructions if embed else None)
        self.instruction_table: tuple[str, ...] = tuple(self.jax_env.instructions(level))
        self._embeddings = np.asarray(self.params.instruction_embeddings, np.float32)
        self._goals = np.asarray(self.params.goals)
        self._kernels = _kernels(self.jax_env)

    def _obs(self, state_vec: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
        """Host observation dict for rows ``(B, S)``, ids ``(B,)``."""
        out: dict[str, Any] = {"state": np.asarray(state_vec, np.float32)}
        if self.instruction_mode == "id":
            out["instruction"] = np.asarray(ids, np.int64)
        else:
            out["instruction"] = tuple(self.instruction_table[int(i)] for i in ids)
        if self._embeddings.shape[1] > 0:
            out["embedding"] = self._embeddings[np.asarray(ids)]
        return out

    def get_dataset(self, level: str | None = None, **kwargs: Any) -> tuple[Any, Any]:
        """The reference API's ``get_dataset``: see :func:`get_dataset` (``name`` and ``embed`` are this
        environment's; ``level`` defaults to its level)."""
        return get_dataset(self.name, self.level if level is None else level, embed=self.embed, **kwargs)


class ImagineEnv(_Adapter, gymnasium.Env):
    """One environment of the registry behind the ``gymnasium.Env`` API (module docstring).

    Args:
      name: registry name (``"clevr"``, ``"babyai"``, ...).
      level: ``"train"``, ``"rephrase"``, ``"easy"`` or ``"hard"``.
      embed: embed the instruction table (adds the ``embedding`` observation; loads the sentence encoder).
      instruction: ``"id"`` (Discrete) or ``"text"`` (Text) for the ``instruction`` observation.
      render_mode: only ``None`` (no rendering).
    """

    metadata = {"render_modes": []}

    def __init__(self, name: str = "clevr", level: str = "train", *, embed: bool = True,
                 instruction: InstructionMode = "id", render_mode: str | None = None) -> None:
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use None")
        self.render_mode = None
        self._setup(name, level, embed, instruction)
        self.action_space = _action_space(self.jax_env)
        self.observation_space = _observation_space(self.jax_env, self.instruction_table,
                                                    self._embeddings, instruction)
        self._keys: jax.Array | None = None
        self._state: Any = None

    def _single(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {k: (v[0] if isinstance(v, tuple) else np.asarray(v)[0]) for k, v in obs.items()}

    def _info(self, state: Any) -> dict[str, Any]:
        task = int(np.asarray(state.task)[0])
        instruction = int(np.asarray(state.instruction)[0])
        return {"task": task, "instruction_text": self.instruction_table[instruction],
                "goal": self._goals[task].copy()}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Starts an episode; ``options`` may hold ``task`` and ``phrasing``. -> (observation, info)."""
        super().reset(seed=seed)
        start = seed if seed is not None else int(self.np_random.integers(0, 2**31 - 1))
        keys = jax.random.PRNGKey(start)[None]
        task, phrasing = _task_options(options, 1, self.params)
        self._keys, self._state, vec, ids = self._kernels.reset(keys, self.params, task, phrasing)
        return self._single(self._obs(np.asarray(vec), np.asarray(ids))), self._info(self._state)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """-> (observation, reward, terminated (success), truncated (step cap), info)."""
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        if not self.action_space.contains(np.asarray(action, self.action_space.dtype)):
            raise ValueError(f"action {action!r} is not in the action space {self.action_space}")
        batch_action = jnp.asarray(np.asarray(action, self.action_space.dtype))[None]
        self._keys, self._state, vec, ids, reward, terminated, truncated = self._kernels.step(
            self._keys, self._state, batch_action, self.params, jnp.zeros((1,), bool))
        info = self._info(self._state)
        info["success"] = bool(np.asarray(terminated)[0])
        return (self._single(self._obs(np.asarray(vec), np.asarray(ids))), float(np.asarray(reward)[0]),
                bool(np.asarray(terminated)[0]), bool(np.asarray(truncated)[0]), info)

    def render(self) -> None:
        return None

    def close(self) -> None:
        self._state = None


class ImagineVectorEnv(_Adapter, VectorEnv):
    """``num_envs`` copies of a registered environment, stepped by one jitted batched call.

    Args: as :class:`ImagineEnv`, plus ``num_envs`` >= 1. Auto-reset mode ``NEXT_STEP``.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, name: str = "clevr", level: str = "train", num_envs: int = 1, *, embed: bool = True,
                 instruction: InstructionMode = "id", render_mode: str | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if render_mode is not None:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use None")
        self.render_mode = None
        self._setup(name, level, embed, instruction)
        self.num_envs = int(num_envs)
        self.single_action_space = _action_space(self.jax_env)
        self.single_observation_space = _observation_space(self.jax_env, self.instruction_table,
                                                           self._embeddings, instruction)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self._keys: jax.Array | None = None
        self._state: Any = None
        self._autoreset = np.zeros(self.num_envs, bool)

    def _infos(self, state: Any) -> dict[str, Any]:
        task = np.asarray(state.task)
        return {"task": task, "goal": self._goals[task]}

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Resets every sub-environment: ``seed`` an int (row i gets seed + i), a list, or None."""
        if seed is None:
            seeds = self.np_random.integers(0, 2**31 - 1, size=self.num_envs)
        elif isinstance(seed, (int, np.integer)):
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(int(seed))
            seeds = int(seed) + np.arange(self.num_envs)
        else:
            seeds = np.asarray(list(seed))
            if seeds.shape != (self.num_envs,):
                raise ValueError(f"seed must be an int or {self.num_envs} ints, got {len(seeds)}")
        keys = jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.uint32))
        task, phrasing = _task_options(options, self.num_envs, self.params)
        self._keys, self._state, vec, ids = self._kernels.reset(keys, self.params, task, phrasing)
        self._autoreset = np.zeros(self.num_envs, bool)
        return self._obs(np.asarray(vec), np.asarray(ids)), self._infos(self._state)

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One jitted step of every sub-environment (auto-reset of the ones that ended last step)."""
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        actions = np.asarray(actions, self.single_action_space.dtype)
        if not self.action_space.contains(actions):
            raise ValueError(f"actions of shape {actions.shape} are not in the action space {self.action_space}")
        self._keys, self._state, vec, ids, reward, terminated, truncated = self._kernels.step(
            self._keys, self._state, jnp.asarray(actions), self.params, jnp.asarray(self._autoreset))
        terminated, truncated = np.asarray(terminated), np.asarray(truncated)
        infos = self._infos(self._state)
        infos["success"] = terminated.copy()
        self._autoreset = terminated | truncated
        return (self._obs(np.asarray(vec), np.asarray(ids)), np.asarray(reward, np.float32), terminated,
                truncated, infos)

    def close_extras(self, **kwargs: Any) -> None:
        self._state = None


def _task_options(options: dict[str, Any] | None, rows: int, params: Any
                  ) -> tuple[jax.Array | None, jax.Array | None]:
    """``options`` → (task (B,) int32 | None, phrasing (B,) int32 | None), range-checked."""
    options = dict(options or {})
    unknown = sorted(set(options) - {"task", "phrasing"})
    if unknown:
        raise ValueError(f"unknown reset options {unknown}; supported: 'task', 'phrasing'")
    if options.get("task") is None:
        if options.get("phrasing") is not None:
            raise ValueError("the 'phrasing' option needs a 'task'")
        return None, None
    task = np.broadcast_to(np.asarray(options["task"]), (rows,)).astype(np.int64)
    if ((task < 0) | (task >= params.num_tasks)).any():
        raise ValueError(f"option 'task' must be in [0, {params.num_tasks}), got {options['task']!r}")
    phrasing = options.get("phrasing")
    if phrasing is not None:
        phrasing = jnp.asarray(np.broadcast_to(np.asarray(phrasing), (rows,)), jnp.int32)
    return jnp.asarray(task, jnp.int32), phrasing


# ---------------------------------------------------------------------------------- the reference API


def env_id(name: str, level: str) -> str:
    """The gymnasium id of a registered environment and level: ``imaginejax/<name>-<level>-v0``."""
    return f"imaginejax/{name}-{level}-v0"


def register_envs() -> tuple[str, ...]:
    """Registers every (environment, level) of :mod:`imaginejax.envs` with gymnasium (idempotent), so
    ``gymnasium.make("imaginejax/clevr-hard-v0")`` and ``gymnasium.make_vec(...)`` work.
    -> the ids."""
    ids = []
    for name in registry.registered():
        for level in registry.ENV_LEVELS[name]:
            gid = env_id(name, level)
            if gid not in gymnasium.registry:
                gymnasium.register(id=gid, entry_point=_ENTRY_POINT, vector_entry_point=_VECTOR_ENTRY_POINT,
                                   kwargs={"name": name, "level": level}, disable_env_checker=False)
            ids.append(gid)
    return tuple(ids)


def make(name: str, level: str = "train", **kwargs: Any) -> ImagineEnv:
    """The reference-style constructor: ``make("clevr", "hard")`` → :class:`ImagineEnv` (kwargs go to it)."""
    return ImagineEnv(name, level, **kwargs)


def make_vec(name: str, level: str = "train", num_envs: int = 1, **kwargs: Any) -> ImagineVectorEnv:
    """``num_envs`` sub-environments in one jitted batched step → :class:`ImagineVectorEnv`."""
    return ImagineVectorEnv(name, level, num_envs, **kwargs)


def _collection_expert(name: str) -> Any:
    """The environment's expert with the collection noise of :func:`get_dataset` (0.1)."""
    from imaginejax.envs import expert_policy

    try:
        return expert_policy(name, 0.1)
    except ValueError as err:
        raise FileNotFoundError(f"no real dataset for {name!r} and {err}; save one with "
                                "imaginejax.data.save_dataset where get_dataset looks (data_dir)") from err


def get_dataset(name: str, level: str, *, embed: bool = True, data_dir: str | os.PathLike[str] | None = None,
                layout: Literal["reference", "imaginejax"] = "reference", collect_missing: bool = True,
                num_real: int = 1000, seed: int = 0) -> tuple[Any, Any]:
    """The reference API's ``get_dataset(level)``: the (real, imaginary) pair of a level.

    The real data are expert rollouts of the training tasks, read from ``<data_dir>/<name>-train-real``
    (collected once with the environment's scripted expert — ``num_real`` trajectories, epsilon 0.1 —
    and saved there when missing and ``collect_missing``). The imaginary data of a novel level are read
    from ``<data_dir>/<name>-<level>-imaginary`` — where
    :func:`imaginejax.imaginer.imagine.write_imaginary_datasets` writes them; the ``train`` level has none.

    Args:
      name, level: the environment and the level (``"real"`` is accepted for ``"train"``).
      embed: the instruction embeddings of collected data (must match the policy's input).
      data_dir: default ``<cache root>/datasets``.
      layout: ``"reference"`` → dicts of arrays as the reference returns them
        (:func:`imaginejax.interop.reference.reference_arrays`: observations = state ⊕ embedding, masks,
        terminals for true terminations only, plus timeouts); ``"imaginejax"`` → :class:`TrajectoryDataset`.
      collect_missing: collect the real data when absent (else FileNotFoundError).
      num_real, seed: size and PRNG seed of a collection.

    Returns:
      ``(real, imaginary)``; ``imaginary`` is None for the ``train`` level.

    Raises:
      FileNotFoundError: a needed dataset is missing (the message says how to make it).
    """
    from imaginejax.core.paths import cache_root
    from imaginejax.data import load_dataset, save_dataset
    from imaginejax.interop.reference import reference_arrays

    level = {"real": "train"}.get(level, level)
    if layout not in ("reference", "imaginejax"):
        raise ValueError(f"layout must be 'reference' or 'imaginejax', got {layout!r}")
    root = Path(data_dir).expanduser() if data_dir is not None else cache_root() / "datasets"
    real_dir = root / f"{name}-train-real"
    if (real_dir / "manifest.json").is_file():
        real = load_dataset(real_dir)
    elif collect_missing:
        from imaginejax.data.collect import collect

        env, params = registry.make(name, "train", embed=encode_instructions if embed else None)
        real = collect(env, params, _collection_expert(name), jax.random.PRNGKey(seed), num_real,
                       source="real", policy_name=f"{name}-expert", progress=False)
        save_dataset(real, real_dir)
    else:
        raise FileNotFoundError(f"no real dataset at {real_dir}; pass collect_missing=True or save one there")
    imaginary = None
    if level != "train":
        imag_dir = root / f"{name}-{level}-imaginary"
        if not (imag_dir / "manifest.json").is_file():
            raise FileNotFoundError(
                f"no imaginary dataset at {imag_dir}; generate one with a fine-tuned imaginer: "
                f"imaginejax.imaginer.imagine.write_imaginary_datasets(imaginer, {name!r}, {str(root)!r}, "
                f"num_rollouts, key, levels=[{level!r}])")
        imaginary = load_dataset(imag_dir)
    if layout == "imaginejax":
        return real, imaginary
    return reference_arrays(real), None if imaginary is None else reference_arrays(imaginary)


register_envs()
