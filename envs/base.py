"""What every instruction-following environment shares: the episode fields, a level's task table
(:class:`EnvParams`), instruction tables, and :class:`TaskEnv`, whose single-environment ``reset`` /
``step`` are views of the batched kernels a subclass implements (docs/envs.md).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence, TypeVar

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class EpisodeState:
    """The episode fields of every environment's state (each () here, (B,) in the batched kernels):
    t int32 steps taken, task int32 row of ``params.goals``, instruction int32 id into the level's
    instruction table, done bool (ended), success bool (ended in success; sticky)."""

    t: jax.Array
    task: jax.Array
    instruction: jax.Array
    done: jax.Array
    success: jax.Array


@struct.dataclass
class EnvParams:
    """A level's task table (a pytree; the int/str fields are static).

    Attributes:
      goals: (K, G) int32 goal vectors in the environment's encoding.
      phrasing_ids: (K, P) int32 ids into the level's instruction table; row k's first
        ``phrasing_counts[k]`` entries are valid, the rest are -1.
      phrasing_counts: (K,) int32.
      instruction_embeddings: (M, E) float32, row m embeds instruction m (E may be 0).
      max_steps: episode cap (static).
      level: level name (static).
      reset_tries: candidate initial states drawn at reset (static; see the environment).
    """

    goals: jax.Array
    phrasing_ids: jax.Array
    phrasing_counts: jax.Array
    instruction_embeddings: jax.Array
    max_steps: int = struct.field(pytree_node=False, default=50)
    level: str = struct.field(pytree_node=False, default="train")
    reset_tries: int = struct.field(pytree_node=False, default=16)

    @property
    def num_tasks(self) -> int:
        return int(self.goals.shape[0])

    @property
    def embed_dim(self) -> int:
        return int(self.instruction_embeddings.shape[1])


# (strings (M,), phrasing ids (K, P) int32 padded with -1, phrasing counts (K,) int32): see instruction_table.
InstructionTable = tuple[tuple[str, ...], np.ndarray, np.ndarray]
# strings (M,) -> (M, E) float32 sentence embeddings, e.g. imaginejax.lang.encode_instructions.
Encoder = Callable[[list[str]], Any]
_Task = TypeVar("_Task")


def instruction_table(per_task: Sequence[Sequence[str]]) -> InstructionTable:
    """Deduplicates the tasks' phrasings into one table.

    Args:
      per_task: K lists of phrasings, one per task, in task order.

    Returns:
      table: M unique strings, task-major then phrasing order.
      phrasing_ids: (K, P) int32 read-only, row k holds task k's ids into ``table``, padded with -1.
      phrasing_counts: (K,) int32 read-only, number of valid ids per row.
    """
    table: list[str] = []
    index: dict[str, int] = {}
    for phrasings in per_task:
        for text in phrasings:
            if text not in index:
                index[text] = len(table)
                table.append(text)
    width = max(len(p) for p in per_task)
    ids = np.full((len(per_task), width), -1, np.int32)
    counts = np.zeros(len(per_task), np.int32)
    for k, phrasings in enumerate(per_task):
        ids[k, : len(phrasings)] = [index[t] for t in phrasings]
        counts[k] = len(phrasings)
    ids.setflags(write=False)
    counts.setflags(write=False)
    return tuple(table), ids, counts


def check_level(env: str, level: str, levels: Sequence[str]) -> None:
    """Raises ValueError naming the valid ``levels`` when ``level`` is not one of them.

    Args:
      env: the environment's name in the message, e.g. "CLEVR-Robot".
      level: the level asked for.
      levels: the environment's levels (its ``tasks.LEVELS``).
    """
    if level not in levels:
        raise ValueError(f"unknown {env} level {level!r}; valid levels: {', '.join(levels)}")


def cached_level_goals(env: str, builders: Mapping[str, Callable[[], np.ndarray]]) -> Callable[[str], np.ndarray]:
    """A tasks module's ``level_goals(level) -> (K, G) int32`` (read-only), each level's table built once
    by ``builders[level]()``; an unknown level raises ValueError naming the valid ones (``env`` names the
    environment in the message).
    """

    @functools.lru_cache(maxsize=None)
    def build(level: str) -> np.ndarray:
        goals = builders[level]()
        goals.setflags(write=False)
        return goals

    def level_goals(level: str) -> np.ndarray:
        """The goal table of a level, (K, G) int32 (read-only; built once per level)."""
        check_level(env, level, tuple(builders))
        return build(level)

    return level_goals


def level_instruction_functions(phrasings: Callable[[_Task, str], Sequence[str]],
                                tasks_of: Callable[[str], Iterable[_Task]]
                                ) -> tuple[Callable[[str], InstructionTable], Callable[[str], tuple[str, ...]]]:
    """An instructions module's two per-level lookups, from ``phrasings(task, level) -> strings`` (template
    order; ValueError for a task or level it does not know) and ``tasks_of(level)`` (the rows of
    ``params.goals``)::

        level_instruction_table, level_instructions = level_instruction_functions(goal_instructions,
                                                                                  tasks.level_goals)

    ``level_instruction_table(level)`` -> :func:`instruction_table` of the level's tasks (cached);
    ``level_instructions(level)`` -> its M strings, which ``state.instruction`` indexes.
    """

    @functools.lru_cache(maxsize=None)
    def level_instruction_table(level: str) -> InstructionTable:
        """The instruction table of a level: M unique strings (task-major, then template order), phrasing
        ids (K, P) int32 into them padded with -1, and the counts (K,) int32 of valid ids per task."""
        return instruction_table([phrasings(task, level) for task in tasks_of(level)])

    def level_instructions(level: str) -> tuple[str, ...]:
        """The instruction table (M strings) of a level."""
        return level_instruction_table(level)[0]

    return level_instruction_table, level_instructions


def embed_instructions(strings: Sequence[str], embed: Encoder | None) -> np.ndarray:
    """The (M, E) float32 embeddings of M instruction strings: ``embed(strings)``, or (M, 0) for None
    (environments load no encoder: the caller passes one, e.g. :func:`imaginejax.lang.encode_instructions`)."""
    if embed is True:
        raise TypeError("embed=True: environments do not load the sentence encoder; pass "
                        "embed=imaginejax.lang.encode_instructions (E = 384), or embed=None for bare states (E = 0)")
    if embed is None or embed is False:
        return np.zeros((len(strings), 0), np.float32)
    embeddings = np.asarray(embed(list(strings)), np.float32)
    chex.assert_shape(embeddings, (len(strings), None))
    return embeddings


def make_level_params(level: str, goals: np.ndarray, table: InstructionTable, max_steps: int, *,
                      embed: Encoder | None, reset_tries: int) -> EnvParams:
    """Builds :class:`EnvParams` from a level's goals (K, G) and its :func:`instruction_table`, the strings
    embedded by :func:`embed_instructions` (``embed=None``: E = 0, observations are the bare state)."""
    strings, phrasing_ids, counts = table
    return EnvParams(
        goals=jnp.asarray(goals, jnp.int32),
        phrasing_ids=jnp.asarray(phrasing_ids, jnp.int32),
        phrasing_counts=jnp.asarray(counts, jnp.int32),
        instruction_embeddings=jnp.asarray(embed_instructions(strings, embed), jnp.float32),
        max_steps=max_steps,
        level=level,
        reset_tries=reset_tries,
    )


def _take_first(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[0], tree)


def _add_batch(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.asarray(x)[None], tree)


class TaskEnv:
    """Base of the instruction-following environments (stateless; the level lives in the params).

    ``class X(TaskEnv, tasks=tasks, instructions=instr.__name__, make_params=make_params)``: the class gets
    ``state_dim``, ``goal_dim``, ``levels`` and ``success`` / ``reward`` / ``legal`` from the tasks module
    (unless its body sets them); ``instructions(level)`` from the instructions module (imported on first
    use) and ``default_params(level)`` from ``make_params``. The subclass sets ``name``, ``discrete`` and
    ``num_actions`` or ``action_dim``, implements ``reset_to_task_batch`` and ``step_batch`` (and
    ``state_vector`` unless its state has a field ``vec``); its state is an :class:`EpisodeState` subclass.
    """

    name: str
    state_dim: int
    goal_dim: int
    levels: tuple[str, ...]
    discrete: bool
    # The action box of a continuous environment (unused by discrete ones).
    action_low: float = -1.0
    action_high: float = 1.0
    # Folded into each reset key to draw the task in :meth:`reset_batch` (each environment keeps its stream).
    task_salt: int = 0x7A5C
    # Set from the class keywords (see the class docstring).
    _instructions_module: ClassVar[str | None] = None
    _make_params: ClassVar[Callable[..., EnvParams] | None] = None

    def __init_subclass__(cls, *, tasks: ModuleType | None = None, instructions: str | None = None,
                          make_params: Callable[..., EnvParams] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if tasks is not None:
            derived = {"state_dim": "STATE_DIM", "goal_dim": "GOAL_DIM", "levels": "LEVELS",
                       "success": "success", "reward": "reward", "legal": "legal"}
            for attr, source in derived.items():
                if attr in cls.__dict__:
                    continue  # the class body's own value wins
                if not hasattr(tasks, source):
                    raise TypeError(f"{cls.__name__}(TaskEnv, tasks={tasks.__name__}): the tasks module has no "
                                    f"{source!r}; define it there or set {attr!r} in the class body")
                value = getattr(tasks, source)
                setattr(cls, attr, staticmethod(value) if callable(value) else value)
        if instructions is not None:
            if not isinstance(instructions, str):
                raise TypeError(f"{cls.__name__}(TaskEnv, instructions=...): pass the dotted module name (a "
                                f"str, e.g. instr.__name__), got {type(instructions).__name__}")
            cls._instructions_module = instructions
        if make_params is not None:
            cls._make_params = staticmethod(make_params)

    # ------------------------------------------------------------------ metadata
    @classmethod
    def instructions(cls, level: str) -> tuple[str, ...]:
        """The instruction table (M strings) of a level; ``state.instruction`` indexes it."""
        if cls._instructions_module is None:
            raise NotImplementedError(f"{cls.__name__} names no instructions module: pass "
                                      "instructions='package.module' in its class statement")
        return importlib.import_module(cls._instructions_module).level_instructions(level)

    @classmethod
    def default_params(cls, level: str = "train", *, embed: Encoder | None = None) -> EnvParams:
        """The :class:`EnvParams` of a level, from the environment's ``make_params`` (with its defaults)."""
        if cls._make_params is None:
            raise NotImplementedError(f"{cls.__name__} names no params factory: pass make_params=... in its "
                                      "class statement")
        return cls._make_params(level, embed=embed)

    @staticmethod
    def state_vector(state: Any) -> jax.Array:
        """(...) states -> (..., S) state vectors; this default reads the state's ``vec`` field (an
        environment whose state keeps no such field overrides it)."""
        return state.vec

    # ------------------------------------------------------------------ batched kernels
    def reset_to_task_batch(self, keys: jax.Array, params: EnvParams, task: jax.Array,
                            phrasing: jax.Array | None = None) -> tuple[jax.Array, Any]:
        """Resets B environments to given tasks (the subclass's kernel).

        Args:
          keys: (B,) PRNG keys (raw (B, 2) uint32 or typed).
          params: the level's :class:`EnvParams`.
          task: (B,) int32 task rows (a scalar is broadcast).
          phrasing: optional (B,) int32 position within each task's phrasing list (taken modulo its
            count); sampled uniformly when None (:meth:`task_instruction`).
        Returns: observations (B, S+E) float32 and the batched state.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no reset_to_task_batch")

    def step_batch(self, keys: jax.Array, state: Any, action: jax.Array, params: EnvParams
                   ) -> tuple[jax.Array, Any, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Steps B environments (the subclass's kernel; no auto-reset, see :meth:`episode_flags`).

        Args:
          keys: (B,) PRNG keys.
          state: the batched state (leading B).
          action: (B,) int32 (discrete) or (B, A) float (continuous) actions.
          params: the level's :class:`EnvParams`.
        Returns:
          obs (B, S+E) float32, next state, reward (B,) float32, done (B,) bool,
          info {"success": (B,) bool, "truncated": (B,) bool}.
        """
        raise NotImplementedError(f"{type(self).__name__} implements no step_batch")

    @staticmethod
    def task_instruction(keys: jax.Array, params: EnvParams, task: jax.Array | int,
                         phrasing: jax.Array | int | None = None,
                         draw: Callable[[jax.Array, jax.Array], jax.Array] | None = None
                         ) -> tuple[jax.Array, jax.Array]:
        """The tasks and instruction ids of a batched reset.

        Args:
          keys: (B,) PRNG keys of the phrasing draw (used only when ``phrasing`` is None).
          params: the level's :class:`EnvParams`.
          task: (B,) int32 task rows, or a scalar broadcast to (B,).
          phrasing: optional (B,) int32 (or scalar) position within each task's phrasing list, modulo its count;
            None: ``draw(keys, counts) -> (B,)``, by default uniform in [0, count).
        Returns: task (B,) int32 and instruction (B,) int32 (ids into the level's instruction table).
        """
        batch = keys.shape[0]
        task = jnp.broadcast_to(jnp.asarray(task, jnp.int32), (batch,))
        counts = params.phrasing_counts[task]
        if phrasing is None:
            if draw is None:
                phrasing = jax.vmap(lambda k, c: jax.random.randint(k, (), 0, c))(keys, counts)
            else:
                phrasing = draw(keys, counts)
        phrasing = jnp.broadcast_to(jnp.asarray(phrasing, jnp.int32), (batch,)) % counts
        return task, params.phrasing_ids[task, phrasing].astype(jnp.int32)

    @staticmethod
    def episode_start(task: jax.Array, instruction: jax.Array) -> dict[str, jax.Array]:
        """The episode fields of B fresh episodes: task (B,), instruction (B,) int32 -> {t: 0, task,
        instruction, done: False, success: False}, for ``EnvState(<world>, **episode_start(...))``."""
        batch = task.shape[0]
        return {"t": jnp.zeros((batch,), jnp.int32), "task": task, "instruction": instruction,
                "done": jnp.zeros((batch,), bool), "success": jnp.zeros((batch,), bool)}

    def reset_batch(self, keys: jax.Array, params: EnvParams) -> tuple[jax.Array, Any]:
        """Resets B environments with uniformly drawn tasks: keys (B,) → obs (B, S + E), state."""
        key_task = jax.vmap(lambda k: jax.random.fold_in(k, self.task_salt))(keys)
        task = jax.vmap(lambda k: jax.random.randint(k, (), 0, params.num_tasks))(key_task)
        return self.reset_to_task_batch(keys, params, task)

    @classmethod
    def obs_dim(cls, params: EnvParams) -> int:
        """Observation width S + E."""
        return cls.state_dim + params.embed_dim

    @staticmethod
    def goal_of(state: Any, params: EnvParams) -> jax.Array:
        """Goal vector(s) of the state's task: (..., G) int32."""
        return params.goals[state.task]

    def observation_batch(self, state: Any, params: EnvParams) -> jax.Array:
        """(B,) states → (B, S + E) float32 observations (state ⊕ instruction embedding)."""
        emb = params.instruction_embeddings[state.instruction]
        return jnp.concatenate([self.state_vector(state), emb], axis=-1).astype(jnp.float32)

    @staticmethod
    def episode_flags(state: Any, succeeded: jax.Array, t: jax.Array, params: EnvParams
                      ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """Episode bookkeeping of one batched step (no auto-reset): the state before the step (``done``
        (B,)), ``succeeded`` (B,) bool (already masked by ``~done``), ``t`` (B,) int32 steps after it ->
        done (B,) bool and success (B,) bool (both sticky) and the step's info {"success", "truncated" (time
        limit without success)}, each True only on the step that ended the episode.
        """
        truncated = ~state.done & ~succeeded & (t >= params.max_steps)
        done = state.done | succeeded | truncated
        return done, state.success | succeeded, {"success": succeeded, "truncated": truncated}

    # ------------------------------------------------------------------ single-environment views
    def reset(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, Any]:
        """One environment: key → obs (S+E,), state. Equals ``reset_batch(key[None])[i=0]``."""
        return _take_first(self.reset_batch(jnp.asarray(key)[None], params))

    def reset_to_task(self, key: jax.Array, params: EnvParams, task: jax.Array | int,
                      phrasing: jax.Array | int | None = None) -> tuple[jax.Array, Any]:
        """One environment reset to a given task (and optionally phrasing position)."""
        phr = None if phrasing is None else jnp.asarray(phrasing, jnp.int32)[None]
        return _take_first(
            self.reset_to_task_batch(jnp.asarray(key)[None], params, jnp.asarray(task, jnp.int32)[None], phr)
        )

    def step(self, key: jax.Array, state: Any, action: jax.Array | int, params: EnvParams
             ) -> tuple[jax.Array, Any, jax.Array, jax.Array, dict[str, jax.Array]]:
        """One environment step: obs (S+E,), state, reward (), done (), info. No auto-reset."""
        out = self.step_batch(jnp.asarray(key)[None], _add_batch(state),
                              jnp.asarray(action)[None], params)
        return _take_first(out)
