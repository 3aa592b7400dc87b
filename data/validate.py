"""Validation of a host-side :class:`~imaginejax.data.types.TrajectoryDataset`.

:func:`validate_dataset` checks every field and raises a :class:`~imaginejax.data.errors.DatasetError`
naming the first offending field, the first offending location and the fix. It runs on every save and
load and before flattening, so whatever reaches the training engine has passed it. The rules:

* metadata: ``env`` a non-empty string, ``level`` in :data:`LEVELS`, ``source`` in :data:`SOURCES`,
  ``discrete`` a bool, ``instructions`` a sequence of strings, ``provenance`` a JSON-serialisable dict;
* every array a NumPy array (never ``object`` dtype) of the documented dtype and rank, with consistent
  dimensions ``N`` (>= 1), ``T`` (>= 1), ``S`` (>= 1), ``A`` (>= 1, continuous only), ``G``, ``M``, ``E``;
* ``mask`` a prefix of each row, with at least one valid step per row;
* episode ends: a row's last valid step is exactly one of terminal / truncated, earlier valid steps are
  neither, and padding carries neither flag;
* ``instruction_ids`` in ``[0, M)``; ``instruction_embeddings`` has one row per instruction;
* finiteness of states (``s_0 .. s_L`` of a row with ``L`` valid steps), rewards and continuous actions
  on valid steps, of float goals and of the embedding table (an imaginer can emit NaN / inf);
* discrete actions are ``int32`` and ``>= 0`` on valid steps (``< num_actions`` when that is given).

Values on padding (other than the flags) are not checked: nothing reads them.

:func:`validate_for_env` adds what only the environment knows (:class:`EnvFacts`, passed in by the caller:
this layer does not import the environments): the environment's name, state width, action count or
action width and box, goal width, the encoder's embedding width, and — on real data — the plausibility
of the states (a bound on their magnitude; the environment's ``legal`` predicate on each row's first
state). Every loader that knows its environment runs it, and so should anything that trains on a dataset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from imaginejax.data.errors import DatasetError
from imaginejax.data.types import LEVELS, SOURCES, TrajectoryDataset

__all__ = ["DatasetDims", "EnvFacts", "validate_dataset", "validate_for_env"]

ARRAY_FIELDS: tuple[str, ...] = (
    "states",
    "actions",
    "rewards",
    "mask",
    "terminals",
    "truncations",
    "instruction_ids",
    "goals",
    "instruction_embeddings",
)
"""The array attributes of a :class:`TrajectoryDataset`, in a fixed order."""


class DatasetDims(NamedTuple):
    """The dimensions of a valid dataset (see the conventions in :mod:`imaginejax.data.types`).

    Attributes:
      N: trajectories. T: padded steps. S: state width. A: continuous action width, ``None`` for
      discrete actions. G: goal width. M: instructions in the table. E: embedding width.
      K: valid transitions (``mask.sum()``).
    """

    N: int
    T: int
    S: int
    A: int | None
    G: int
    M: int
    E: int
    K: int


def _first(bad: np.ndarray) -> tuple[int, ...]:
    """Index of the first True entry (row-major) of a boolean array that has one."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))


def _check_metadata(ds: TrajectoryDataset) -> None:
    """Checks env, level, source, discrete, instructions and provenance."""
    if not isinstance(ds.env, str) or not ds.env:
        raise DatasetError("env", f"expected a non-empty string, got {ds.env!r}",
                           "set env to the environment's registry name, e.g. 'clevr'")
    if ds.level not in LEVELS:
        raise DatasetError("level", f"unknown level {ds.level!r}",
                           f"use one of {', '.join(LEVELS)} (the reference's 'real' level is 'train')")
    if ds.source not in SOURCES:
        raise DatasetError("source", f"unknown source {ds.source!r}", f"use one of {', '.join(SOURCES)}")
    if not isinstance(ds.discrete, (bool, np.bool_)):
        raise DatasetError("discrete", f"expected a bool, got {type(ds.discrete).__name__}",
                           "set discrete=True for integer action indices, False for continuous actions")
    if isinstance(ds.instructions, str) or not isinstance(ds.instructions, Sequence):
        raise DatasetError("instructions", f"expected a tuple of strings, got {type(ds.instructions).__name__}",
                           "pass tuple(list_of_instruction_strings)")
    for m, text in enumerate(ds.instructions):
        if not isinstance(text, str):
            raise DatasetError("instructions", f"entry {m} is a {type(text).__name__}, not a string",
                               "the instruction table holds the instruction texts")
    if not isinstance(ds.provenance, dict):
        raise DatasetError("provenance", f"expected a dict, got {type(ds.provenance).__name__}",
                           "pass a dict of JSON-serialisable metadata")
    try:
        json.dumps(ds.provenance, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise DatasetError("provenance", f"not JSON-serialisable ({err})",
                           "keep only str keys and str / int / float (finite) / bool / None / list / dict "
                           "values; convert NumPy scalars with .item() and arrays with .tolist()") from err


def _array(ds: TrajectoryDataset, name: str, dtypes: tuple[type, ...], ndim: int) -> np.ndarray:
    """Returns field ``name`` after checking it is an array of one of ``dtypes`` and rank ``ndim``."""
    value = getattr(ds, name)
    if not isinstance(value, np.ndarray):
        raise DatasetError(name, f"expected a numpy.ndarray, got {type(value).__module__}.{type(value).__name__}",
                           "convert on the host with np.asarray(...) before building the dataset")
    if value.dtype == object:
        raise DatasetError(name, "object arrays are refused (they hold arbitrary Python objects and only "
                           "load through pickle)", f"store {name} with a numeric dtype")
    if value.dtype not in tuple(np.dtype(d) for d in dtypes):
        wanted = " or ".join(np.dtype(d).name for d in dtypes)
        raise DatasetError(name, f"dtype {value.dtype} but expected {wanted}",
                           f"cast with np.asarray(x, np.{np.dtype(dtypes[0]).name})")
    if value.ndim != ndim:
        raise DatasetError(name, f"rank {value.ndim} (shape {value.shape}) but expected rank {ndim}",
                           "see the shapes documented on TrajectoryDataset")
    return value


def _expect_shape(name: str, value: np.ndarray, expected: tuple[int, ...], meaning: str) -> None:
    if value.shape != expected:
        raise DatasetError(name, f"shape {value.shape} but expected {meaning} = {expected}",
                           "make every array agree with mask's (N, T) and the instruction table's M")


def _check_shapes(ds: TrajectoryDataset) -> DatasetDims:
    """Checks dtypes, ranks and dimension consistency; returns the dimensions."""
    mask = _array(ds, "mask", (np.bool_,), 2)
    n, t = mask.shape
    if n < 1:
        raise DatasetError("mask", "the dataset has no trajectories (N = 0)",
                           "a level without data of a source has no dataset; the engine takes "
                           "imaginejax.data.placeholder_like(real) in place of a missing imaginary buffer")
    if t < 1:
        raise DatasetError("mask", "the dataset has no steps (T = 0)", "store at least one step per trajectory")
    states = _array(ds, "states", (np.float32,), 3)
    if states.shape[:2] != (n, t + 1) or states.shape[2] < 1:
        raise DatasetError("states", f"shape {states.shape} but expected (N, T+1, S) = ({n}, {t + 1}, S>=1)",
                           "states[i, t+1] is the state after step t, so states have one more step than mask")
    s = states.shape[2]
    if ds.discrete:
        actions = ds.actions
        if isinstance(actions, np.ndarray) and actions.ndim == 3:
            raise DatasetError("actions", f"discrete=True but actions have shape {actions.shape}",
                               "discrete actions are (N, T) int32 indices; set discrete=False for continuous ones")
        actions = _array(ds, "actions", (np.int32,), 2)
        _expect_shape("actions", actions, (n, t), "(N, T)")
        a = None
    else:
        actions = ds.actions
        if isinstance(actions, np.ndarray) and actions.ndim == 2:
            raise DatasetError("actions", f"discrete=False but actions have shape {actions.shape}",
                               "continuous actions are (N, T, A) float32; set discrete=True for indices")
        actions = _array(ds, "actions", (np.float32,), 3)
        if actions.shape[:2] != (n, t) or actions.shape[2] < 1:
            raise DatasetError("actions", f"shape {actions.shape} but expected (N, T, A) = ({n}, {t}, A>=1)",
                               "make every array agree with mask's (N, T)")
        a = actions.shape[2]
    for name, dtype in (("rewards", np.float32), ("terminals", np.bool_), ("truncations", np.bool_)):
        _expect_shape(name, _array(ds, name, (dtype,), 2), (n, t), "(N, T)")
    _expect_shape("instruction_ids", _array(ds, "instruction_ids", (np.int32,), 1), (n,), "(N,)")
    goals = _array(ds, "goals", (np.int32, np.float32), 2)
    if goals.shape[0] != n:
        raise DatasetError("goals", f"shape {goals.shape} but expected (N, G) with N = {n}",
                           "one goal vector per trajectory")
    m = len(ds.instructions)
    embeddings = _array(ds, "instruction_embeddings", (np.float32,), 2)
    if embeddings.shape[0] != m:
        raise DatasetError("instruction_embeddings",
                           f"{embeddings.shape[0]} rows (shape {embeddings.shape}) but the instruction table "
                           f"has M = {m} entries",
                           "embed every instruction once, in table order (row m embeds instructions[m])")
    return DatasetDims(N=n, T=t, S=s, A=a, G=goals.shape[1], M=m, E=embeddings.shape[1], K=int(mask.sum()))


def _check_mask(mask: np.ndarray) -> np.ndarray:
    """Checks the mask is a non-empty prefix of every row; returns the lengths L, (N,) int."""
    gap = mask[:, 1:] & ~mask[:, :-1]
    if gap.any():
        i, t = _first(gap)
        raise DatasetError("mask", f"not a prefix of valid steps: trajectory {i} has a valid step {t + 1} "
                           f"after an invalid step {t}",
                           "left-align every trajectory (valid steps first) and pad at the end")
    if not mask[:, 0].all():
        (i,) = _first(~mask[:, 0])
        raise DatasetError("mask", f"trajectory {i} has no valid step", "drop empty trajectories")
    return mask.sum(axis=1)


def _check_episode_ends(ds: TrajectoryDataset, lengths: np.ndarray) -> None:
    """Checks each row ends with exactly one of terminal / truncated on its last valid step only."""
    mask, terminals, truncations = ds.mask, ds.terminals, ds.truncations
    for name, flags in (("terminals", terminals), ("truncations", truncations)):
        on_padding = flags & ~mask
        if on_padding.any():
            i, t = _first(on_padding)
            raise DatasetError(name, f"{int(on_padding.sum())} flags set on padding, first at trajectory {i} "
                               f"step {t} (its last valid step is {int(lengths[i]) - 1})",
                               "set the flag on the last valid step, not after it (the reference's "
                               "misaligned-done defect), and clear flags on padding")
    both = terminals & truncations
    if both.any():
        i, t = _first(both)
        raise DatasetError("truncations", f"trajectory {i} step {t} is both terminal and truncated",
                           "a step that truly terminates is not a truncation: clear truncations there")
    last = np.zeros_like(mask)
    last[np.arange(mask.shape[0]), lengths - 1] = True
    for name, flags in (("terminals", terminals), ("truncations", truncations)):
        early = flags & ~last
        if early.any():
            i, t = _first(early)
            raise DatasetError(name, f"set before the last valid step: trajectory {i} step {t} (its last valid "
                               f"step is {int(lengths[i]) - 1})",
                               "an episode ends at its first termination or truncation: mask the steps "
                               "after it, or clear the flag")
    unended = last & ~(terminals | truncations)
    if unended.any():
        i, t = _first(unended)
        raise DatasetError("truncations", f"the last valid step of trajectory {i} (step {t}) is neither "
                           "terminal nor truncated",
                           "set truncations there for a time limit or the end of a generated rollout, "
                           "terminals for a true termination")


def _check_finite(name: str, values: np.ndarray, valid: np.ndarray | None, where: str) -> None:
    """Raises when ``values`` has non-finite entries at positions where ``valid`` holds.

    Args:
      values: (P..., F...) floats; ``valid`` covers the leading axes P (None: every position).
      where: how to name the leading axes, e.g. ``"trajectory {0} step {1}"``.
    """
    bad = ~np.isfinite(values)
    if valid is not None:
        bad &= valid.reshape(valid.shape + (1,) * (values.ndim - valid.ndim))
    if bad.any():
        first = _first(bad)
        raise DatasetError(name, f"{int(bad.sum())} non-finite values, first at {where.format(*first)}",
                           "drop the offending trajectories or cut each at its first non-finite step and "
                           "mark the step before as truncated (imaginary rollouts can diverge to NaN / inf)")


def validate_dataset(ds: TrajectoryDataset, *, num_actions: int | None = None) -> DatasetDims:
    """Checks every field of ``ds`` (see the module docstring for the rules).

    Args:
      ds: the dataset to check; it is not modified.
      num_actions: for discrete datasets, the size of the action space; when given, valid actions must
        also be ``< num_actions``.

    Returns:
      The dataset's dimensions.

    Raises:
      DatasetError: naming the first offending field, where it is wrong and the fix.
    """
    _check_metadata(ds)
    dims = _check_shapes(ds)
    lengths = _check_mask(ds.mask)
    _check_episode_ends(ds, lengths)

    ids = ds.instruction_ids
    out_of_range = (ids < 0) | (ids >= dims.M)
    if out_of_range.any():
        (i,) = _first(out_of_range)
        raise DatasetError("instruction_ids", f"{int(out_of_range.sum())} ids outside [0, M) = [0, {dims.M}), "
                           f"first at trajectory {i} (id {int(ids[i])})",
                           "ids index the instruction table: add the missing instructions or fix the ids")

    mask = ds.mask
    state_valid = np.zeros(ds.states.shape[:2], dtype=bool)  # s_0 .. s_L of each row
    state_valid[:, :-1] = mask
    state_valid[:, 1:] |= mask
    _check_finite("states", ds.states, state_valid, "trajectory {0} step {1}")
    _check_finite("rewards", ds.rewards, mask, "trajectory {0} step {1}")
    if dims.A is not None:
        _check_finite("actions", ds.actions, mask, "trajectory {0} step {1}")
    if ds.goals.dtype == np.float32:
        _check_finite("goals", ds.goals, None, "trajectory {0} entry {1}")
    _check_finite("instruction_embeddings", ds.instruction_embeddings, None, "row {0} entry {1}")

    if dims.A is None:
        bad = ds.actions < 0
        if num_actions is not None:
            bad |= ds.actions >= num_actions
        bad &= mask
        if bad.any():
            i, t = _first(bad)
            bounds = "negative" if num_actions is None else f"outside [0, {num_actions})"
            raise DatasetError("actions", f"{int(bad.sum())} {bounds} action indices on valid steps, first at "
                               f"trajectory {i} step {t} (value {int(ds.actions[i, t])})",
                               "discrete actions are 0-based indices into the action space" +
                               ("" if num_actions is None else f" of {num_actions} actions") +
                               ": check the env name and the action encoding, and fix or drop the offending rows")
    return dims


# ------------------------------------------------------------------------------------ against an environment

STATE_BOUND = 1e6
"""No environment's state has an entry beyond this magnitude: real states there are garbage or another unit."""
MAX_ILLEGAL_FRACTION = 0.5
"""Real data with more first states failing the environment's ``legal`` predicate than this is refused: an
environment's reset states are legal (later ones need not be: pushed objects leave the workbench), another
environment's states of the same width are not."""
_LEGAL_CHUNK = 4096


class EnvFacts(NamedTuple):
    """What a dataset must agree with to be used with one environment.

    Attributes:
      name: registry name; the dataset's ``env`` must be it.
      state_dim: S.
      discrete: integer action indices (True) or action vectors (False).
      num_actions: discrete only: valid actions are in ``[0, num_actions)``.
      action_dim: continuous only: A.
      action_low, action_high: continuous only: the action box (every entry of every valid action).
      goal_dim: G of the environment's goal encoding (datasets may also have G = 0); None: unchecked.
      legal: optional predicate on states, (K, S) float32 -> (K,) bool (the environment's ``legal``).
    """

    name: str
    state_dim: int
    discrete: bool
    num_actions: int | None = None
    action_dim: int | None = None
    action_low: float = -1.0
    action_high: float = 1.0
    goal_dim: int | None = None
    legal: Callable[[np.ndarray], np.ndarray] | None = None

    @classmethod
    def of(cls, env: Any, *, legality: bool = True) -> EnvFacts:
        """The facts of an environment object of the registry (``envs.make(name, level)[0]``), read from
        its attributes ``name``, ``state_dim``, ``discrete``, ``num_actions`` / ``action_dim``,
        ``action_low`` / ``action_high``, ``goal_dim`` and (with ``legality``) its ``legal`` predicate."""
        discrete = bool(env.discrete)
        legal = getattr(env, "legal", None) if legality else None
        action_dim = getattr(env, "action_dim", None)
        return cls(name=str(env.name), state_dim=int(env.state_dim), discrete=discrete,
                   num_actions=int(env.num_actions) if discrete else None,
                   action_dim=None if discrete or action_dim is None else int(action_dim),
                   action_low=float(getattr(env, "action_low", -1.0)),
                   action_high=float(getattr(env, "action_high", 1.0)),
                   goal_dim=None if getattr(env, "goal_dim", None) is None else int(env.goal_dim),
                   legal=None if legal is None else _host_predicate(legal))


def _host_predicate(fn: Callable[[Any], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """A JAX predicate on (..., S) states as a host function (K, S) -> (K,) bool, compiled once (fixed
    chunks, the last one padded by repeating its first row)."""
    import jax

    jitted = jax.jit(fn)

    def run(states: np.ndarray) -> np.ndarray:
        out = np.empty(len(states), bool)
        for start in range(0, len(states), _LEGAL_CHUNK):
            chunk = states[start:start + _LEGAL_CHUNK]
            rows = len(chunk)
            if rows < _LEGAL_CHUNK:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], _LEGAL_CHUNK - rows, axis=0)])
            out[start:start + rows] = np.asarray(jitted(chunk), bool).reshape(-1)[:rows]
        return out

    return run


def validate_for_env(ds: TrajectoryDataset, env: EnvFacts, *, embed_dim: int | None = None) -> DatasetDims:
    """:func:`validate_dataset`, then the dataset against environment ``env`` and the encoder's width.

    Checks: ``env`` name; state width S; discrete: ``int32`` actions in ``[0, num_actions)`` on valid steps;
    continuous: A = ``action_dim`` and every entry in ``[action_low, action_high]`` on valid steps; G = 0
    or ``goal_dim``; E = ``embed_dim`` (when given); on real data, states ``s_0 .. s_L`` of every row
    within ``±STATE_BOUND``, and at most :data:`MAX_ILLEGAL_FRACTION` of the rows' first states ``s_0``
    failing ``env.legal``.

    Returns:
      The dataset's dimensions.

    Raises:
      DatasetError: naming the field, the first offending trajectory / step and the fix.
    """
    dims = validate_dataset(ds, num_actions=env.num_actions if env.discrete else None)
    if ds.env != env.name:
        raise DatasetError("env", f"the dataset is of {ds.env!r}, this environment is {env.name!r}",
                           f"use {env.name} data here, or run with env {ds.env!r}")
    if bool(ds.discrete) != env.discrete:
        kind = "discrete" if env.discrete else "continuous"
        raise DatasetError("discrete", f"the dataset has {'discrete' if ds.discrete else 'continuous'} actions, "
                           f"{env.name} has {kind} ones", f"use {env.name} data here")
    if dims.S != env.state_dim:
        raise DatasetError("states", f"width S = {dims.S} but {env.name} states are {env.state_dim}-d",
                           f"use data of {env.name} (its state vectors), not of another environment or encoding")
    mask = ds.mask
    if not env.discrete:
        if env.action_dim is not None and dims.A != env.action_dim:
            raise DatasetError("actions", f"width A = {dims.A} but {env.name} actions are {env.action_dim}-d",
                               f"use data of {env.name}")
        bad = ((ds.actions < env.action_low) | (ds.actions > env.action_high)).any(axis=2) & mask
        if bad.any():
            i, t = _first(bad)
            worst = ds.actions[i, t][np.argmax(np.abs(ds.actions[i, t]))]
            raise DatasetError("actions", f"{int(bad.sum())} valid steps with an action outside {env.name}'s box "
                               f"[{env.action_low:g}, {env.action_high:g}], first at trajectory {i} step {t} "
                               f"(entry {float(worst):g})",
                               "rescale the actions into the box (e.g. divide by the source's action bound) or "
                               "clip them; check the env name")
    if env.goal_dim is not None and dims.G not in (0, env.goal_dim):
        raise DatasetError("goals", f"width G = {dims.G} but {env.name} goals are {env.goal_dim}-d",
                           f"store goals in {env.name}'s encoding, or none (G = 0)")
    if embed_dim is not None and dims.E != embed_dim:
        raise DatasetError("instruction_embeddings", f"width E = {dims.E} but the encoder gives {embed_dim}-d "
                           "embeddings", "embed the instructions with the same encoder (and data.embed setting) "
                           "as training and evaluation, or re-collect the data")
    if ds.source == "real":
        _check_real_states(ds, env)
    return dims


def _check_real_states(ds: TrajectoryDataset, env: EnvFacts) -> None:
    """Real data: the bound on every valid state ``s_0 .. s_L``, legality of the first states."""
    valid = np.zeros(ds.states.shape[:2], dtype=bool)
    valid[:, :-1] = ds.mask
    valid[:, 1:] |= ds.mask
    huge = (np.abs(ds.states) > STATE_BOUND).any(axis=2) & valid
    if huge.any():
        i, t = _first(huge)
        raise DatasetError("states", f"{int(huge.sum())} states with an entry beyond ±{STATE_BOUND:g}, first at "
                           f"trajectory {i} step {t}", f"these are not {env.name} states: check the env name, "
                           "the state encoding and the units")
    if env.legal is None:
        return
    legal = np.asarray(env.legal(ds.states[:, 0]), bool).reshape(-1)
    illegal = int((~legal).sum())
    if illegal > MAX_ILLEGAL_FRACTION * len(legal):
        (i,) = _first(~legal)
        raise DatasetError("states", f"{illegal} of {len(legal)} trajectories start in a state that fails "
                           f"{env.name}'s legality predicate, first trajectory {i} (step 0)",
                           f"these do not look like {env.name} states: check the env name and the state "
                           "encoding (generated data belongs under source='imaginary')")
