"""Automatic quality report of imaginary rollouts, scored against the simulator (BENCHMARK.md §5).

KALM judged its generated rollouts by hand ("out of workbench", "exceeds dynamics"); our environments
are pure functions of a state vector, so every generated transition ``(s, a, s')`` can be scored
automatically. For a rollout dataset (one level) the report measures:

(a) **goal consistency** — the fraction of rollouts whose final transition satisfies the
    instruction's success predicate ``env.success(s_{L-1}, a_{L-1}, s_L, goal)`` (the predicate
    takes the transition because CLEVR's easy goals are about the push itself). Environments whose
    success depends on running quantities of the episode (HalfCheetah: Σ dx, the legs' step counts
    and sums) give :class:`EpisodeRules` instead; the report then scans them over each generated
    trajectory from ``s_0`` (HalfCheetah: :func:`~imaginejax.envs.cheetah.tasks.update_progress` on
    every generated state, whose slot 0 is the step's dx), exactly as the environment does while
    stepping;
(b) **transition error against the simulator** — for each generated transition, the environment is
    *set to* ``s`` and stepped with ``a`` (CLEVR: :func:`~imaginejax.envs.clevr.physics.push` from
    the ball positions; BabyAI: :func:`~imaginejax.envs.babyai.grid.step_vector` from the 17-d
    vector; HalfCheetah: MuJoCo C (or MJX) set to the qpos / qvel the 18-d state determines, see
    :func:`cheetah_simulate`), giving the simulator's ``s'_sim``. Errors are normalised per
    dimension by the adapter's unit (:attr:`QualityAdapter.error_scale`, one number or one per
    dimension): ``per_dimension_error = |s' - s'_sim| / scale``, averaged over transitions; the
    *transition error* is the largest entity error ``max_e ||(s'_e - s'_sim,e) / scale_e||`` (an
    entity is a ball's (x, y) in CLEVR, one field in BabyAI and HalfCheetah). A transition
    **exceeds dynamics** when its error is larger than ``threshold`` (default per environment:
    CLEVR 1.0 = one ball radius, 0.13; BabyAI 0.5 = some field differs after rounding;
    HalfCheetah 1.0, see :data:`CHEETAH_ERROR_SCALE`). This is stricter than the paper's hand label
    (a move that *no* push could make): it also counts a plausible move that is not the one the
    simulator makes. Meta-World has no such check: its 91-d state does not determine the
    simulator's state (:data:`METAWORLD_NO_SIMULATOR`), nor does LIBERO's 44-d state
    (:data:`LIBERO_NO_SIMULATOR`: no velocities, no servo targets), so (b) is reported as unavailable;
(c) **illegal states** — ``env.legal`` on every generated state ``s_1 .. s_L``, with the reasons
    split into categories where the adapter knows them (CLEVR: ``out of workbench``,
    ``overlapping balls``, ``non-finite``; HalfCheetah: :func:`cheetah_violations`; Meta-World:
    :func:`metaworld_violations`, ``out of workspace``, ``gripper opening``, ``implausible pose``;
    LIBERO: :func:`libero_violations`, adding ``joint limits`` and ``end-effector off the arm``;
    the paper's categories were out of workbench / exceeds dynamics (CLEVR) and floating objects,
    out of workbench, implausible pose, exceeds dynamics (Meta-World)).

Rates are reported per generated state / transition and per rollout (a rollout is *legal* when all
its states are, *realistic* when it is legal and no transition exceeds dynamics), together with the
joint rates the downstream use cares about: consistent ∧ legal, consistent ∧ realistic.

All scoring runs in one jitted function over the flattened valid transitions (batched physics and
predicates broadcast over the leading axis; the flat batch is padded to a power of two, so a few
compilations serve any dataset size). :func:`quality_report` gives a :class:`QualityReport` (per
level: :class:`RolloutScores` per step, a JSON-able summary, a markdown table);
:func:`filter_dataset` keeps the rollouts that pass chosen criteria and records what it did in the
dataset's provenance.

**Adding an environment** is one registry entry: a factory returning a :class:`QualityAdapter`
(its ``success`` / ``legal`` predicates — or :class:`EpisodeRules` when success or reward need
running quantities — a ``simulate(states, actions) -> next_states`` that sets the simulator to each
state and steps it — or ``None`` with a reason when it cannot — the error unit and threshold,
optionally the illegal-state categories and a projection onto the legal set used by generation).
Generation (:func:`~imaginejax.imaginer.imagine.imagine`) reads the same entry: it stops a row and
computes its rewards with the adapter's :class:`EpisodeRules` (default: the environment's transition
predicates ``success`` / ``reward``). See :func:`register_quality_adapter`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.data.types import TrajectoryDataset
from imaginejax.data.validate import validate_dataset

__all__ = [
    "QualityAdapter", "RolloutScores", "QualityReport", "QualityError", "register_quality_adapter",
    "quality_adapter", "registered_quality_adapters", "score_dataset", "summarize", "quality_report",
    "summary_markdown", "filter_dataset", "dataset_fingerprint", "project_clevr", "project_babyai",
    "clevr_violations", "EpisodeRules", "transition_rules", "cheetah_simulate", "cheetah_violations",
    "cheetah_rules", "metaworld_violations", "metaworld_rules", "CHEETAH_ERROR_SCALE",
    "METAWORLD_NO_SIMULATOR", "trajectory_success", "project_metaworld", "libero_violations",
    "project_libero", "libero_rules", "LIBERO_NO_SIMULATOR",
]

StatesFn = Callable[[jax.Array], jax.Array]
SimulateFn = Callable[[jax.Array, jax.Array], jax.Array]
ViolationsFn = Callable[[jax.Array], dict[str, jax.Array]]
PredicateFn = Callable[..., jax.Array]

ILLEGAL: Final[str] = "illegal"
"""The category name used when an adapter has no finer categories of illegal states."""


class QualityError(ValueError):
    """A quality report cannot be computed or applied (names the argument and the fix)."""


# ---------------------------------------------------------------------------------------------------
# Adapters (one per environment) and their registry


class EpisodeRules(NamedTuple):
    """How an environment scores an episode step by step: its success predicate and reward as
    functions of a per-row *carry* (running quantities) — what generation stops on and what the
    report's goal consistency scans.

    Attributes:
      init: ``(s0 (B, S), goal (B, G)) -> carry`` (a pytree with leading B; ``()`` when none).
      step: ``(carry, prev (B, S), action (B,) or (B, A), next (B, S), goal (B, G), t (B,) int32)
        -> (carry, success (B,) bool, reward (B,) float32)``, ``t`` = steps taken including this one.
    The functions must be pure and jittable; return the *same* objects for the same arguments
    (they are static arguments of the jitted generation, see :func:`transition_rules`).
    """

    init: Callable[[jax.Array, jax.Array], Any]
    step: Callable[..., tuple[Any, jax.Array, jax.Array]]


def _no_carry(s0: jax.Array, goal: jax.Array) -> tuple[()]:
    del s0, goal
    return ()


@functools.lru_cache(maxsize=64)
def transition_rules(success: PredicateFn, reward: Callable[..., jax.Array] | None = None, *,
                     reward_uses_step: bool = False) -> EpisodeRules:
    """The :class:`EpisodeRules` of an environment whose predicates are functions of one
    transition: ``success(prev, action, next, goal)`` and ``reward(prev, action, next, goal)`` (with
    ``reward_uses_step``: ``reward(prev, action, next, goal, t)``; None: reward 0). No carry.
    Cached: the same arguments give the same object (so jitted generation is compiled once)."""

    def step(carry: tuple[()], prev: jax.Array, action: jax.Array, following: jax.Array,
             goal: jax.Array, t: jax.Array) -> tuple[tuple[()], jax.Array, jax.Array]:
        succeeded = success(prev, action, following, goal)
        if reward is None:
            value = jnp.zeros(following.shape[:-1], jnp.float32)
        elif reward_uses_step:
            value = reward(prev, action, following, goal, t)
        else:
            value = reward(prev, action, following, goal)
        return carry, succeeded, value

    return EpisodeRules(_no_carry, step)


@dataclasses.dataclass(frozen=True, eq=False)
class QualityAdapter:
    """What the quality report needs from one environment.

    Attributes:
      name: the environment's registry name (``TrajectoryDataset.env``).
      state_dim: S.
      success: the env's pure ``success(prev (..., S), action (...), next (..., S), goal (..., G))
        -> (...) bool``; None when success needs running quantities (then ``episode`` is required).
      legal: the env's pure ``legal(states (..., S)) -> (...) bool``.
      simulate: ``(states (K, S), actions (K,) or (K, A)) -> (K, S)``: the simulator set to each
        state and stepped once with the action; None when the environment cannot be set from a
        state vector (then ``no_simulator_reason`` says why and (b) is reported as unavailable).
      entity_size: consecutive state dimensions forming one entity (CLEVR: 2, a ball's x, y).
      error_scale: the unit of the normalised error (state units per 1.0 of error): one number,
        or a tuple of S numbers (one per dimension, for states mixing units).
      error_unit: a human description of that unit (for tables).
      threshold: default "exceeds dynamics" threshold, in units of ``error_scale``.
      violations: optional ``states (..., S) -> {category: (...) bool}``; every illegal state must
        fall in at least one category and a legal one in none (tested). None: one category
        :data:`ILLEGAL`.
      project: optional ``states (..., S) -> (..., S)`` projection onto (or towards) the legal set,
        used by generation when asked (:func:`~imaginejax.imaginer.imagine.imagine`).
      project_name: a short description of ``project`` (recorded in provenance).
      no_simulator_reason: why ``simulate`` is None.
      episode: optional ``max_steps -> EpisodeRules``: success and reward with running quantities
        (HalfCheetah's progress, Meta-World's episode start). Used by generation (stop and rewards)
        and by the report's goal consistency (scanned over each trajectory). None: the transition
        predicates (``success`` here, the environment's ``reward`` in generation).
    """

    name: str
    state_dim: int
    success: PredicateFn | None
    legal: StatesFn
    simulate: SimulateFn | None
    entity_size: int
    error_scale: float | tuple[float, ...]
    error_unit: str
    threshold: float
    violations: ViolationsFn | None = None
    project: StatesFn | None = None
    project_name: str | None = None
    no_simulator_reason: str | None = None
    episode: Callable[[int], EpisodeRules] | None = None

    def __post_init__(self) -> None:
        if self.state_dim % self.entity_size:
            raise ValueError(f"QualityAdapter {self.name!r}: state_dim {self.state_dim} is not a "
                             f"multiple of entity_size {self.entity_size}")
        scale = np.asarray(self.error_scale, np.float64)
        if scale.ndim > 1 or (scale.ndim == 1 and scale.shape != (self.state_dim,)):
            raise ValueError(f"QualityAdapter {self.name!r}: error_scale must be a number or "
                             f"{self.state_dim} numbers (one per state dimension), got shape "
                             f"{scale.shape}")
        if not np.all(scale > 0) or not self.threshold > 0:
            raise ValueError(f"QualityAdapter {self.name!r}: error_scale and threshold must be > 0")
        if self.success is None and self.episode is None:
            raise ValueError(f"QualityAdapter {self.name!r}: give a transition `success` predicate "
                             "or `episode` rules (success with running quantities)")
        if self.simulate is None and not self.no_simulator_reason:
            raise ValueError(f"QualityAdapter {self.name!r}: without simulate, give "
                             "no_simulator_reason (it is printed in the report)")

    def categories(self, states: jax.Array) -> dict[str, jax.Array]:
        """Illegal-state categories of ``states`` (..., S) -> {name: (...) bool}."""
        if self.violations is None:
            return {ILLEGAL: ~self.legal(states)}
        return self.violations(states)


# ----------------------------------------------------------------------------------------- CLEVR


def clevr_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why CLEVR states are illegal: (..., 10) -> {``"non-finite"``, ``"out of workbench"``,
    ``"overlapping balls"``: (...) bool}.

    The same rules and constants as :func:`imaginejax.envs.clevr.tasks.legal` (a ball outside
    ``[WORKBENCH_LOW, WORKBENCH_HIGH]``; two centres closer than ``2R - PENETRATION_TOLERANCE``),
    split by cause; a non-finite state is only counted as non-finite.
    """
    from imaginejax.envs.clevr import tasks

    finite = jnp.all(jnp.isfinite(states), axis=-1)
    balls = tasks.balls_of(jnp.where(jnp.isfinite(states), states, 0.0))
    low, high = jnp.asarray(tasks.WORKBENCH_LOW), jnp.asarray(tasks.WORKBENCH_HIGH)
    inside = jnp.all((balls >= low) & (balls <= high), axis=(-2, -1))
    gaps = jnp.linalg.norm(balls[..., :, None, :] - balls[..., None, :, :], axis=-1)
    gaps = gaps + jnp.eye(tasks.N_BALLS) * 1e3
    overlapping = jnp.any(gaps < 2 * tasks.BALL_RADIUS - tasks.PENETRATION_TOLERANCE, axis=(-2, -1))
    return {"non-finite": ~finite, "out of workbench": finite & ~inside,
            "overlapping balls": finite & overlapping}


def project_clevr(states: jax.Array, iterations: int = 32) -> jax.Array:
    """Moves CLEVR states onto the legal set: (..., 10) -> (..., 10).

    Balls are clipped into the workbench, then ``iterations`` Jacobi sweeps push every pair that
    overlaps illegally (centre distance below ``2R - PENETRATION_TOLERANCE``) apart along the line of
    centres, each ball by half of what separates the pair to ``2R - PENETRATION_TOLERANCE / 2`` (inside
    the legal set with a margin), clipping again after each sweep. Two coincident balls separate
    along a fixed pair-specific direction. Legal states are returned unchanged; non-finite entries
    stay non-finite. The result is legal whenever the sweeps resolve every overlap: with 32
    sweeps, 4,000 uniform random layouts in [-1.1, 1.1]^10 all became legal (16 sweeps left 2 chains
    of balls along a wall overlapping); the quality report measures it on generated data anyway.
    """
    from imaginejax.envs.clevr import tasks

    n = tasks.N_BALLS
    low, high = jnp.asarray(tasks.WORKBENCH_LOW), jnp.asarray(tasks.WORKBENCH_HIGH)
    balls = jnp.clip(tasks.balls_of(states), low, high)
    index = np.arange(n)
    angle = 2.0 * np.pi * (index[:, None] * n + index[None, :]) / (n * n)
    fallback = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # (5, 5, 2) pair i<j direction
    fallback = np.where((index[:, None] < index[None, :])[..., None], fallback, -fallback.swapaxes(0, 1))
    off_diagonal = jnp.asarray(~np.eye(n, dtype=bool))
    limit = 2.0 * tasks.BALL_RADIUS - tasks.PENETRATION_TOLERANCE
    target = 2.0 * tasks.BALL_RADIUS - 0.5 * tasks.PENETRATION_TOLERANCE

    def sweep(_: int, balls: jax.Array) -> jax.Array:
        diff = balls[..., :, None, :] - balls[..., None, :, :]  # (..., i, j, 2): i - j
        dist = jnp.linalg.norm(diff, axis=-1)
        unit = jnp.where((dist > 1e-9)[..., None], diff / jnp.maximum(dist, 1e-9)[..., None],
                         jnp.asarray(fallback, balls.dtype))
        overlap = jnp.where(off_diagonal & (dist < limit), target - dist, 0.0)
        moved = balls + 0.5 * jnp.sum(overlap[..., None] * unit, axis=-2)
        return jnp.clip(moved, low, high)

    balls = jax.lax.fori_loop(0, iterations, sweep, balls)
    return balls.reshape(states.shape).astype(states.dtype)


def _clevr_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    from imaginejax.envs.clevr import physics, tasks

    ball, direction = physics.decode_action(actions.astype(jnp.int32))
    pushed = physics.push(tasks.balls_of(states), ball, direction)
    return pushed.reshape(states.shape)


def _clevr_adapter() -> QualityAdapter:
    from imaginejax.envs.clevr import tasks
    from imaginejax.envs.clevr.env import CLEVRRobot

    return QualityAdapter(
        name="clevr", state_dim=tasks.STATE_DIM, success=CLEVRRobot.success, legal=CLEVRRobot.legal,
        simulate=_clevr_simulate, entity_size=2, error_scale=tasks.BALL_RADIUS,
        error_unit=f"ball radii ({tasks.BALL_RADIUS:g})", threshold=1.0,
        violations=clevr_violations, project=project_clevr,
        project_name="clip to the workbench + separate overlapping balls")


# ---------------------------------------------------------------------------------------- BabyAI


def project_babyai(states: jax.Array) -> jax.Array:
    """Rounds BabyAI states to integers and clips every field to its range: (..., 17) -> (..., 17).

    This makes each field well-formed (colours, positions, door, carried type) but does not enforce
    the relational rules of :func:`imaginejax.envs.babyai.tasks.legal` (a carried object at (0, 0),
    distinct object cells), so a projected state can still be illegal.
    """
    from imaginejax.envs.babyai import grid as G

    colour = (0, G.NUM_COLOURS - 1)
    position = (0, G.ROOM_MAX)  # objects: interior, or (0, 0) when carried
    bounds = [colour, position, position] * 3 + [
        colour, (G.DOOR_X, G.DOOR_X), (G.ROOM_MIN, G.ROOM_MAX), (G.OPEN, G.LOCKED),
        (G.ROOM_MIN, G.ROOM_MAX), (G.ROOM_MIN, G.ROOM_MAX), (G.NOTHING, G.KEY), colour]
    low = jnp.asarray([b[0] for b in bounds], states.dtype)
    high = jnp.asarray([b[1] for b in bounds], states.dtype)
    return jnp.clip(jnp.round(states), low, high)


def _babyai_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    from imaginejax.envs.babyai import grid as G

    return G.step_vector(states, actions.astype(jnp.int32))


def _babyai_adapter() -> QualityAdapter:
    from imaginejax.envs.babyai import grid as G
    from imaginejax.envs.babyai.env import BabyAI

    return QualityAdapter(
        name="babyai", state_dim=G.STATE_DIM, success=BabyAI.success, legal=BabyAI.legal,
        simulate=_babyai_simulate, entity_size=1, error_scale=1.0,
        error_unit="grid cells / category indices", threshold=0.5, violations=None,
        project=project_babyai, project_name="round + clip each field to its range")


# ------------------------------------------------------------------------------------ HalfCheetah

CHEETAH_ERROR_SCALE: Final[tuple[float, ...]] = (0.01,) * 9 + (0.1,) * 9
"""Unit of HalfCheetah's transition error per state dimension: 0.01 (m or rad) for dx, the torso's
height and pitch and the six leg angles, 0.1 (m/s or rad/s) for the nine velocities. Under uniform
random actions the median one-step (0.05 s) change is 0.02 m in dx and rootz, 0.05 rad in pitch,
0.17-0.22 rad in the leg angles, 0.5-1.4 m/s or rad/s in the root velocities and 6-9 rad/s in the joint
speeds (measured on 12 random-action episodes of the train and hard tasks), so the threshold 1.0 is
at most half a median step in dx and rootz and a few per cent of it elsewhere. Re-simulating real
trajectories from their own float32 states gives errors below 2e-3 in these units."""


def cheetah_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    """HalfCheetah's simulator set to each 18-d state and stepped once: (K, 18), (K, 6) -> (K, 18).

    The state ``[dx, qpos[1:], qvel]`` determines the whole MuJoCo state except the root's x
    position ``qpos[0]`` (HalfCheetah has no activations, mocap or warm-start state that matters:
    each step starts the solver cold, see :mod:`imaginejax.envs.cheetah.backends`). The dynamics
    do not depend on x (the floor is an infinite plane), so ``qpos[0] = 0`` is used; the result's
    dx is the step's x displacement, as in the environment. The state's own dx (slot 0, the
    *previous* step's displacement) does not enter the physics. Runs on the environment's default
    backend (MuJoCo C through ``pure_callback`` on a CPU, MJX on accelerators) in float64 from the
    float32 states; rows with a non-finite state or action come back NaN.
    """
    from imaginejax.envs.cheetah import backends
    from imaginejax.envs.cheetah import tasks as ct

    dtype = jnp.result_type(float)
    s = states.astype(dtype)
    qpos = jnp.concatenate([jnp.zeros_like(s[..., :1]), s[..., ct.ROOTZ:ct.LEG_ANGLES.stop]], axis=-1)
    qvel = s[..., ct.VX:]
    physics, dx = backends.physics_step(backends.Physics.from_qpos_qvel(qpos, qvel),
                                        actions.astype(dtype), "auto")
    return ct.state_vector(dx, physics.qpos, physics.qvel).astype(states.dtype)


def cheetah_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why HalfCheetah states are illegal: (..., 18) -> {category: (...) bool}.

    The rules and constants of :func:`imaginejax.envs.cheetah.tasks.legal`, split by cause:
    ``non-finite``; ``displacement`` (|dx| > 1.5 m per step); ``torso height`` (rootz outside
    [-0.7, 2.5] m); ``joint limits`` (a leg angle beyond its limits widened by 0.5 rad);
    ``speed`` (|vx| or |vz| > 30 m/s, |pitch rate| > 60 rad/s, a joint speed > 100 rad/s). A
    non-finite state is only counted as non-finite; a state may fall in several other categories.
    """
    from imaginejax.envs.cheetah import model as M
    from imaginejax.envs.cheetah import tasks as ct

    finite = jnp.all(jnp.isfinite(states), axis=-1)
    s = jnp.where(jnp.isfinite(states), states, 0.0)
    low = jnp.asarray(M.LEG_JOINT_RANGE[:, 0]) - ct.LEG_ANGLE_MARGIN
    high = jnp.asarray(M.LEG_JOINT_RANGE[:, 1]) + ct.LEG_ANGLE_MARGIN
    legs = s[..., ct.LEG_ANGLES]
    speed = ((jnp.abs(s[..., ct.VX]) > ct.MAX_ABS_ROOT_SPEED)
             | (jnp.abs(s[..., ct.VZ]) > ct.MAX_ABS_ROOT_SPEED)
             | (jnp.abs(s[..., ct.PITCH_RATE]) > ct.MAX_ABS_PITCH_RATE)
             | jnp.any(jnp.abs(s[..., ct.LEG_VELOCITIES]) > ct.MAX_ABS_JOINT_SPEED, axis=-1))
    return {
        "non-finite": ~finite,
        "displacement": finite & (jnp.abs(s[..., ct.DX]) > ct.MAX_ABS_DX),
        "torso height": finite & ((s[..., ct.ROOTZ] < ct.MIN_ROOTZ) | (s[..., ct.ROOTZ] > ct.MAX_ROOTZ)),
        "joint limits": finite & jnp.any((legs < low) | (legs > high), axis=-1),
        "speed": finite & speed,
    }


def _cheetah_init(s0: jax.Array, goal: jax.Array) -> Any:
    from imaginejax.envs.cheetah.tasks import Progress

    del goal
    return Progress.zeros(s0.shape[:-1], jnp.float32)


def _cheetah_step(progress: Any, prev: jax.Array, action: jax.Array, following: jax.Array,
                  goal: jax.Array, t: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
    from imaginejax.envs.cheetah import tasks as ct

    after = ct.update_progress(progress, following, t)
    return (after, ct.success(after, t, goal),
            ct.reward(prev, action, following, goal, progress))


@functools.lru_cache(maxsize=None)
def cheetah_rules(max_steps: int) -> EpisodeRules:
    """HalfCheetah's :class:`EpisodeRules`: the carry is :class:`~imaginejax.envs.cheetah.tasks.Progress`
    (Σ dx, leg counts and sums, when each leg got done), updated from each new state's dx by
    :func:`~imaginejax.envs.cheetah.tasks.update_progress`; success is
    :func:`~imaginejax.envs.cheetah.tasks.success` on it and the reward
    :func:`~imaginejax.envs.cheetah.tasks.reward` with the progress before the step — what the
    environment's ``step_batch`` does. ``max_steps`` does not enter (the tasks' step thresholds are
    absolute)."""
    del max_steps
    return EpisodeRules(_cheetah_init, _cheetah_step)


def _cheetah_adapter() -> QualityAdapter:
    from imaginejax.envs.cheetah import tasks as ct

    return QualityAdapter(
        name="cheetah", state_dim=ct.STATE_DIM, success=None, legal=ct.legal,
        simulate=cheetah_simulate, entity_size=1, error_scale=CHEETAH_ERROR_SCALE,
        error_unit="0.01 m or rad (positions, angles), 0.1 m/s or rad/s (velocities)",
        threshold=1.0, violations=cheetah_violations, episode=cheetah_rules)


# ------------------------------------------------------------------------------------- Meta-World

METAWORLD_NO_SIMULATOR: Final[str] = (
    "the 91-d Meta-World state does not determine the simulator's state: it holds no velocities "
    "(arm, fingers, objects, fixture joints), not the hand's mocap target (the hand lags it), the "
    "finger joints only through the gripper opening, and fixture joints (door hinge, lock, window "
    "slide, faucet, buttons, nail) only through the poses of their handles; a simulator set from it "
    "would score a different transition than the one generated")


def metaworld_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why Meta-World states are illegal: (..., 91) -> {category: (...) bool}.

    The rules and constants of :func:`imaginejax.envs.metaworld.tasks.legal`, split by cause:
    ``non-finite``; ``out of workspace`` (the hand or a filled entity slot's position outside
    ``[WORKSPACE_LOW, WORKSPACE_HIGH]``, the paper's "out of workbench"); ``gripper opening``
    (outside [0, 1]); ``implausible pose`` (a filled slot's quaternion norm off 1 by more than
    0.05). A slot is filled when any of its 7 entries is non-zero. A non-finite state is only
    counted as non-finite.
    """
    from imaginejax.envs.metaworld import tasks as mt

    finite = jnp.all(jnp.isfinite(states), axis=-1)
    s = jnp.where(jnp.isfinite(states), states, 0.0)
    low, high = jnp.asarray(mt.WORKSPACE_LOW, s.dtype), jnp.asarray(mt.WORKSPACE_HIGH, s.dtype)
    hand_out = ~jnp.all((s[..., 0:3] >= low) & (s[..., 0:3] <= high), axis=-1)
    slots = s[..., mt.SLOT_START:].reshape(s.shape[:-1] + (mt.NUM_SLOTS, mt.SLOT_DIM))
    filled = jnp.any(slots != 0, axis=-1)
    slot_out = filled & ~jnp.all((slots[..., :3] >= low) & (slots[..., :3] <= high), axis=-1)
    norm = jnp.linalg.norm(slots[..., 3:], axis=-1)
    bad_quat = filled & ~((jnp.abs(norm - 1.0) <= 0.05) | (norm == 0.0))
    return {
        "non-finite": ~finite,
        "out of workspace": finite & (hand_out | jnp.any(slot_out, axis=-1)),
        "gripper opening": finite & ((s[..., 3] < 0.0) | (s[..., 3] > 1.0)),
        "implausible pose": finite & jnp.any(bad_quat, axis=-1),
    }


def project_metaworld(states: jax.Array) -> jax.Array:
    """Projection of Meta-World states (..., 91) onto the legal set of :func:`~imaginejax.envs.
    metaworld.tasks.legal`: the hand clipped to the workspace and the gripper opening to [0, 1]; an
    entity slot whose quaternion has norm below 0.5 is empty and set to zeros (a filled slot always
    holds a unit quaternion, an empty one only zeros: a generated state's small values in an empty
    slot otherwise make it "filled" with an implausible pose outside the workspace); a filled slot's
    position clipped to the workspace and its quaternion normalised. The goal (entries 4:7) is kept.
    Legal states come back unchanged (to round-off); non-finite entries stay non-finite."""
    from imaginejax.envs.metaworld import tasks as mt

    dtype = states.dtype
    low, high = jnp.asarray(mt.WORKSPACE_LOW, dtype), jnp.asarray(mt.WORKSPACE_HIGH, dtype)
    hand = jnp.clip(states[..., 0:3], low, high)
    grip = jnp.clip(states[..., 3:4], 0.0, 1.0)
    slots = states[..., mt.SLOT_START:].reshape(states.shape[:-1] + (mt.NUM_SLOTS, mt.SLOT_DIM))
    norm = jnp.linalg.norm(slots[..., 3:], axis=-1, keepdims=True)
    empty = norm < 0.5  # False for NaN: a non-finite slot stays non-finite
    filled = jnp.concatenate([jnp.clip(slots[..., :3], low, high), slots[..., 3:] / jnp.where(empty, 1.0, norm)], -1)
    slots = jnp.where(empty, 0.0, filled).reshape(states.shape[:-1] + (mt.NUM_SLOTS * mt.SLOT_DIM,))
    return jnp.concatenate([hand, grip, states[..., 4:mt.SLOT_START], slots], -1)


def _metaworld_success(prev: jax.Array, action: jax.Array, following: jax.Array,
                       goal: jax.Array) -> jax.Array:
    from imaginejax.envs.metaworld import tasks as mt

    del prev, action
    return mt.success(following, goal)


def _metaworld_init(s0: jax.Array, goal: jax.Array) -> jax.Array:
    del goal
    return s0


def _metaworld_step(first: jax.Array, prev: jax.Array, action: jax.Array, following: jax.Array,
                    goal: jax.Array, t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    from imaginejax.envs.metaworld import tasks as mt

    del t
    return (first, mt.success(following, goal),
            mt.reward(prev, action, following, goal, first_state=first))


@functools.lru_cache(maxsize=None)
def metaworld_rules(max_steps: int) -> EpisodeRules:
    """Meta-World's :class:`EpisodeRules`: the carry is the episode's first state ``s0`` (the dense
    rewards' per-episode constants are rebuilt from it, :func:`~imaginejax.envs.metaworld.tasks.
    extras_from_state`); success is :func:`~imaginejax.envs.metaworld.tasks.success` on the new
    state and the reward :func:`~imaginejax.envs.metaworld.tasks.reward` (10 on success, else the
    change of the dense reward). ``max_steps`` does not enter."""
    del max_steps
    return EpisodeRules(_metaworld_init, _metaworld_step)


def _metaworld_adapter() -> QualityAdapter:
    from imaginejax.envs.metaworld import tasks as mt

    return QualityAdapter(
        name="metaworld", state_dim=mt.STATE_DIM, success=_metaworld_success, legal=mt.legal,
        simulate=None, entity_size=1, error_scale=1.0, error_unit="m", threshold=1.0,
        violations=metaworld_violations, no_simulator_reason=METAWORLD_NO_SIMULATOR,
        episode=metaworld_rules, project=project_metaworld,
        project_name="hand and filled slots clipped to the workspace, gripper to [0, 1], slots with a "
                     "quaternion norm below 0.5 emptied, quaternions normalised")


# ------------------------------------------------------------------------------------------- LIBERO

LIBERO_NO_SIMULATOR: Final[str] = (
    "the 44-d LIBERO state holds every joint position (arm, fingers, objects, basket) but no velocities "
    "and not the joint servos' targets, which the delta-pose controller integrates from step to step; a "
    "simulator set from it (at rest, targets at the joints) would score a different transition than the "
    "one generated")


def libero_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why LIBERO states are illegal: (..., 44) -> {category: (...) bool}.

    The rules and constants of :func:`imaginejax.envs.libero.tasks.legal`, split by cause:
    ``non-finite``; ``joint limits`` (an arm joint more than 0.05 rad outside its range);
    ``end-effector off the arm`` (the end-effector position more than ``FK_TOLERANCE`` from the
    forward kinematics of the joints, or its orientation off by more than |q·q'| = 0.99);
    ``gripper opening`` (a finger slide outside [-0.005, 0.045]); ``out of workspace`` (the
    end-effector, an object or the basket outside ``[WORKSPACE_LOW, WORKSPACE_HIGH]``, the paper's
    "out of workbench"); ``implausible pose`` (a quaternion's norm off 1 by more than 0.05). A
    non-finite state is only counted as non-finite.
    """
    from imaginejax.envs.libero import model as lm
    from imaginejax.envs.libero import tasks as lt

    finite = jnp.all(jnp.isfinite(states), axis=-1)
    s = jnp.where(jnp.isfinite(states), states, 0.0)
    q = s[..., 0:7]
    joints = jnp.all((q >= lm.JOINT_LOW - 0.05) & (q <= lm.JOINT_HIGH + 0.05), axis=-1)
    tcp, quat, _, _ = lm.fk(q)
    eef = ((jnp.linalg.norm(tcp - s[..., 7:10], axis=-1) < lt.FK_TOLERANCE)
           & (jnp.abs(jnp.sum(quat * s[..., 10:14], -1)) > 0.99))
    fingers = jnp.all((s[..., 14:16] >= -0.005) & (s[..., 14:16] <= 0.045), axis=-1)
    poses = s[..., lt.OBJ_START:].reshape(s.shape[:-1] + (4, 7))
    positions = jnp.concatenate([s[..., None, 7:10], poses[..., :3]], -2)
    inside = jnp.all((positions >= lt.WORKSPACE_LOW) & (positions <= lt.WORKSPACE_HIGH), axis=(-2, -1))
    quats = jnp.concatenate([s[..., None, 10:14], poses[..., 3:]], -2)
    unit = jnp.all(jnp.abs(jnp.linalg.norm(quats, axis=-1) - 1.0) <= 0.05, axis=-1)
    return {
        "non-finite": ~finite,
        "joint limits": finite & ~joints,
        "end-effector off the arm": finite & ~eef,
        "gripper opening": finite & ~fingers,
        "out of workspace": finite & ~inside,
        "implausible pose": finite & ~unit,
    }


def project_libero(states: jax.Array) -> jax.Array:
    """Projection of LIBERO states (..., 44) towards the legal set of :func:`~imaginejax.envs.libero.
    tasks.legal`, field by field: arm joints clipped to their ranges; the end-effector pose replaced by
    the forward kinematics of those joints (what the state defines it as, :func:`~imaginejax.envs.
    libero.tasks.state_from_qpos`); finger slides clipped to [0, ``GRIPPER_OPEN``]; object and basket
    positions clipped to the workspace; every quaternion normalised with w >= 0 (a zero one becomes the
    identity). Legal states produced by the environment come back unchanged (to float32 round-off);
    non-finite entries stay non-finite (the row is dropped by generation). The end-effector follows the
    joints and is not clipped, so a state whose clipped joints put the hand outside the workspace stays
    illegal."""
    from imaginejax.envs.libero import model as lm
    from imaginejax.envs.libero import tasks as lt

    dtype = states.dtype
    q = jnp.clip(states[..., 0:7], jnp.asarray(lm.JOINT_LOW, dtype), jnp.asarray(lm.JOINT_HIGH, dtype))
    fingers = jnp.clip(states[..., 14:16], 0.0, lm.GRIPPER_OPEN)
    poses = states[..., lt.OBJ_START:].reshape(states.shape[:-1] + (4, 7))
    pos = jnp.clip(poses[..., :3], jnp.asarray(lt.WORKSPACE_LOW, dtype), jnp.asarray(lt.WORKSPACE_HIGH, dtype))
    rot = poses[..., 3:]
    norm = jnp.linalg.norm(rot, axis=-1, keepdims=True)
    identity = jnp.broadcast_to(jnp.asarray([1.0, 0.0, 0.0, 0.0], dtype), rot.shape)
    rot = jnp.where(norm <= 1e-6, identity, rot / jnp.where(norm <= 1e-6, 1.0, norm))  # NaN stays NaN
    objects = jnp.concatenate([pos, rot], -1).reshape(states.shape[:-1] + (28,))
    # The environment's own state of these joint positions: end-effector by FK, quaternions with w >= 0.
    return lt.state_from_qpos(jnp.concatenate([q, fingers, objects], -1)).astype(dtype)


def _libero_init(s0: jax.Array, goal: jax.Array) -> Any:
    from imaginejax.envs.libero.tasks import Progress

    del goal
    return Progress.initial(s0)


def _libero_step(progress: Any, prev: jax.Array, action: jax.Array, following: jax.Array,
                 goal: jax.Array, t: jax.Array) -> tuple[Any, jax.Array, jax.Array]:
    from imaginejax.envs.libero import tasks as lt

    del action, t
    after = lt.update_progress(progress, following, goal)
    return (after, lt.success(following, goal, after),
            lt.reward(prev, following, goal, progress, after))


@functools.lru_cache(maxsize=None)
def libero_rules(max_steps: int) -> EpisodeRules:
    """LIBERO's :class:`EpisodeRules`: the carry is :class:`~imaginejax.envs.libero.tasks.Progress`
    (the episode's first state, for "move aside", and the sub-goal stage of "a then b" / "all in
    basket"), updated from each new state by :func:`~imaginejax.envs.libero.tasks.update_progress`;
    success is :func:`~imaginejax.envs.libero.tasks.success` with the updated progress and the reward
    :func:`~imaginejax.envs.libero.tasks.reward` with the progress before and after the step — what
    the environment's ``step_batch`` does. ``max_steps`` does not enter."""
    del max_steps
    return EpisodeRules(_libero_init, _libero_step)


def _libero_adapter() -> QualityAdapter:
    from imaginejax.envs.libero import tasks as lt

    return QualityAdapter(
        name="libero", state_dim=lt.STATE_DIM, success=None, legal=lt.legal, simulate=None,
        entity_size=1, error_scale=1.0, error_unit="m or rad", threshold=1.0,
        violations=libero_violations, project=project_libero,
        project_name="joints clipped to their ranges, end-effector = forward kinematics of the joints, "
                     "fingers clipped, positions clipped to the workspace, unit quaternions",
        no_simulator_reason=LIBERO_NO_SIMULATOR, episode=libero_rules)


_ADAPTER_FACTORIES: dict[str, Callable[[], QualityAdapter]] = {
    "clevr": _clevr_adapter,
    "babyai": _babyai_adapter,
    "cheetah": _cheetah_adapter,
    "metaworld": _metaworld_adapter,
    "libero": _libero_adapter,
}
_ADAPTERS: dict[str, QualityAdapter] = {}


def register_quality_adapter(name: str, factory: Callable[[], QualityAdapter]) -> None:
    """Registers (or replaces) the adapter factory of environment ``name`` (called lazily, once)."""
    _ADAPTER_FACTORIES[name] = factory
    _ADAPTERS.pop(name, None)


def registered_quality_adapters() -> tuple[str, ...]:
    """Environment names with a quality adapter."""
    return tuple(sorted(_ADAPTER_FACTORIES))


def quality_adapter(env: str | QualityAdapter) -> QualityAdapter:
    """The adapter of an environment name (built once), or the adapter itself."""
    if isinstance(env, QualityAdapter):
        return env
    if env not in _ADAPTER_FACTORIES:
        raise QualityError(f"no quality adapter for environment {env!r} (known: "
                           f"{', '.join(registered_quality_adapters())}); add one with "
                           "register_quality_adapter(name, factory)")
    if env not in _ADAPTERS:
        adapter = _ADAPTER_FACTORIES[env]()
        if adapter.name != env:
            raise QualityError(f"the adapter registered for {env!r} names itself {adapter.name!r}")
        _ADAPTERS[env] = adapter
    return _ADAPTERS[env]


# ---------------------------------------------------------------------------------------------------
# Scoring


@dataclasses.dataclass(frozen=True)
class RolloutScores:
    """Per-step scores of one dataset (host NumPy; ``N`` rollouts, ``T`` steps, ``S`` state width).

    Attributes:
      env, level: the dataset's.
      fingerprint: SHA-256 of the dataset's states, actions, mask, goals (what
        :func:`filter_dataset` checks before applying these scores).
      mask: (N, T) bool valid steps.
      transition_error: (N, T) float32 error of s_{t+1} against the simulator in ``error_unit``
        (NaN everywhere when the environment has no simulator; 0 on padding).
      per_dimension_error: (N, T, S) float32 ``|s' - s'_sim| / error_scale`` (NaN without
        simulator).
      exceeds_dynamics: (N, T) bool, ``transition_error > threshold`` on valid steps.
      legal_next: (N, T) bool, ``env.legal(s_{t+1})`` (True on padding).
      violations: category -> (N, T) bool, why s_{t+1} is illegal (False on padding).
      legal_initial: (N,) bool, ``env.legal(s_0)``.
      step_success: (N, T) bool, ``env.success`` of each transition (False on padding).
      goal_reached: (N,) bool, the success predicate holds on each rollout's last transition.
      threshold: the "exceeds dynamics" threshold used.
      error_unit: description of the error unit.
      simulated: whether transitions were checked against a simulator.
      no_simulator_reason: why not, else None.
    """

    env: str
    level: str
    fingerprint: str
    mask: np.ndarray
    transition_error: np.ndarray
    per_dimension_error: np.ndarray
    exceeds_dynamics: np.ndarray
    legal_next: np.ndarray
    violations: dict[str, np.ndarray]
    legal_initial: np.ndarray
    step_success: np.ndarray
    goal_reached: np.ndarray
    threshold: float
    error_unit: str
    simulated: bool
    no_simulator_reason: str | None = None

    @property
    def lengths(self) -> np.ndarray:
        """(N,) valid steps per rollout."""
        return self.mask.sum(axis=1)

    def bad_steps(self, *, max_transition_error: float | None = None,
                  require_legal: bool = True) -> np.ndarray:
        """(N, T) bool: valid steps whose transition error exceeds ``max_transition_error`` (in
        ``error_unit``; None: not checked) or, with ``require_legal``, whose next state is illegal."""
        bad = np.zeros_like(self.mask)
        if max_transition_error is not None:
            if not self.simulated:
                raise QualityError(
                    f"max_transition_error was given but environment {self.env!r} has no "
                    f"simulator to check transitions against ({self.no_simulator_reason}); pass "
                    "max_transition_error=None")
            bad |= ~(self.transition_error <= max_transition_error)  # NaN counts as bad
        if require_legal:
            bad |= ~self.legal_next
        return bad & self.mask


def dataset_fingerprint(ds: TrajectoryDataset) -> str:
    """SHA-256 over the env, level, states, actions, mask and goals of a dataset."""
    digest = hashlib.sha256(f"{ds.env}/{ds.level}".encode())
    for part in (ds.states, ds.actions, ds.mask, ds.goals):
        value = np.ascontiguousarray(part)
        digest.update(f"{value.dtype.name}{value.shape}".encode())
        digest.update(value.view(np.uint8).tobytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=16)
def _scorer(adapter: QualityAdapter) -> Callable[..., dict[str, Any]]:
    """The jitted per-transition scorer of one adapter (compiled once per padded size)."""
    entities = adapter.state_dim // adapter.entity_size
    scale = np.asarray(adapter.error_scale, np.float32)

    def score(prev: jax.Array, action: jax.Array, following: jax.Array, goal: jax.Array
              ) -> dict[str, Any]:
        """prev, following (K, S); action (K,) / (K, A); goal (K, G) -> per-transition scores."""
        out: dict[str, Any] = {
            "legal_next": adapter.legal(following),
            "violations": adapter.categories(following),
        }
        if adapter.episode is None:
            out["success"] = adapter.success(prev, action, following, goal)
        if adapter.simulate is not None:
            simulated = adapter.simulate(prev, action)
            diff = (following - simulated).astype(jnp.float32) / jnp.asarray(scale)
            diff = jnp.where(jnp.isnan(diff), jnp.inf, diff)  # a NaN state is infinitely wrong
            per_entity = jnp.linalg.norm(diff.reshape(diff.shape[:-1] + (entities, adapter.entity_size)),
                                         axis=-1)
            out["per_dimension_error"] = jnp.abs(diff)
            out["transition_error"] = jnp.max(per_entity, axis=-1)
        return out

    return jax.jit(score)


@functools.lru_cache(maxsize=16)
def _episode_scorer(adapter: QualityAdapter) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    """The jitted per-step success of whole trajectories with the adapter's :class:`EpisodeRules`:
    ``(states (N, T+1, S), actions (N, T) / (N, T, A), goals (N, G)) -> (N, T) bool``, the rules
    scanned from s_0 (steps after a rollout's end are computed but masked by the caller)."""

    def run(states: jax.Array, actions: jax.Array, goals: jax.Array) -> jax.Array:
        horizon = actions.shape[1]
        rules = adapter.episode(horizon)  # the step cap only enters rewards, not success
        batch = states.shape[0]
        carry = rules.init(states[:, 0], goals)
        xs = (jnp.swapaxes(states[:, :-1], 0, 1), jnp.swapaxes(actions, 0, 1),
              jnp.swapaxes(states[:, 1:], 0, 1), jnp.arange(1, horizon + 1, dtype=jnp.int32))

        def body(carry: Any, x: tuple[jax.Array, ...]) -> tuple[Any, jax.Array]:
            prev, action, following, t = x
            carry, succeeded, _ = rules.step(carry, prev, action, following, goals,
                                             jnp.full((batch,), t, jnp.int32))
            return carry, succeeded

        _, success = jax.lax.scan(body, carry, xs)
        return jnp.swapaxes(success, 0, 1)

    return jax.jit(run)


def trajectory_success(ds: TrajectoryDataset, adapter: QualityAdapter | None = None) -> np.ndarray:
    """(N, T) bool: the success predicate after every step of ``ds`` (False on padding), with the
    adapter's :class:`EpisodeRules` when it has them, else its transition ``success``."""
    adapter = quality_adapter(ds.env if adapter is None else adapter)
    if adapter.episode is None:
        prev, following = ds.states[:, :-1], ds.states[:, 1:]
        goals = np.broadcast_to(ds.goals[:, None], ds.mask.shape + ds.goals.shape[1:])
        out = adapter.success(jnp.asarray(prev, jnp.float32), jnp.asarray(ds.actions),
                              jnp.asarray(following, jnp.float32), jnp.asarray(goals))
        return np.asarray(out, bool) & ds.mask
    n = ds.mask.shape[0]
    padded = _bucket(n, minimum=8)
    take = np.concatenate([np.arange(n), np.zeros(padded - n, np.int64)])
    out = _episode_scorer(adapter)(ds.states[take].astype(np.float32), ds.actions[take],
                                   ds.goals[take])
    return np.asarray(jax.device_get(out), bool)[:n] & ds.mask


def _bucket(size: int, minimum: int = 256) -> int:
    """The padded flat size: the next power of two >= max(size, minimum)."""
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(size, 1)))))


def score_dataset(ds: TrajectoryDataset, *, adapter: QualityAdapter | None = None,
                  threshold: float | None = None, chunk: int = 65536) -> RolloutScores:
    """Scores every valid transition of ``ds`` against its environment (see the module docstring).

    Args:
      ds: a rollout dataset (any source; imaginary is the intended one).
      adapter: default: the registered adapter of ``ds.env``.
      threshold: "exceeds dynamics" threshold in the adapter's error unit (default: the adapter's).
      chunk: at most this many transitions per compiled call.
    Returns:
      :class:`RolloutScores`.
    """
    validate_dataset(ds)
    adapter = quality_adapter(ds.env if adapter is None else adapter)
    if ds.states.shape[-1] != adapter.state_dim:
        raise QualityError(f"dataset states have width {ds.states.shape[-1]} but the {adapter.name!r} "
                           f"adapter expects {adapter.state_dim}; score it with its own environment")
    threshold = float(adapter.threshold if threshold is None else threshold)
    if not threshold > 0:
        raise QualityError(f"threshold must be > 0, got {threshold}")
    n, horizon = ds.mask.shape
    rows, steps = np.nonzero(ds.mask)
    flat = {
        "prev": ds.states[rows, steps].astype(np.float32),
        "action": ds.actions[rows, steps],
        "following": ds.states[rows, steps + 1].astype(np.float32),
        "goal": ds.goals[rows],
    }
    scorer = _scorer(adapter)
    parts: list[dict[str, Any]] = []
    for lo in range(0, len(rows), chunk):
        piece = {k: v[lo : lo + chunk] for k, v in flat.items()}
        size = len(piece["prev"])
        padded = _bucket(size)
        piece = {k: np.concatenate([v, np.repeat(v[:1], padded - size, axis=0)]) for k, v in piece.items()}
        out = jax.device_get(scorer(piece["prev"], piece["action"], piece["following"], piece["goal"]))
        parts.append(jax.tree.map(lambda x: np.asarray(x)[:size], out))
    merged = jax.tree.map(lambda *xs: np.concatenate(xs), *parts)

    def grid(values: np.ndarray, fill: Any) -> np.ndarray:
        full = np.full((n, horizon) + values.shape[1:], fill, values.dtype)
        full[rows, steps] = values
        return full

    lengths = ds.mask.sum(axis=1)
    last = lengths - 1
    if adapter.episode is None:
        step_success = grid(merged["success"].astype(bool), False)
    else:
        step_success = trajectory_success(ds, adapter)
    initial_legal = np.asarray(jax.device_get(adapter.legal(jnp.asarray(ds.states[:, 0], jnp.float32))))
    if adapter.simulate is not None:
        transition_error = grid(merged["transition_error"].astype(np.float32), np.float32(0.0))
        per_dim = grid(merged["per_dimension_error"].astype(np.float32), np.float32(0.0))
        exceeds = ~(transition_error <= threshold) & ds.mask
    else:
        transition_error = np.full((n, horizon), np.nan, np.float32)
        per_dim = np.full(ds.states[:, 1:].shape, np.nan, np.float32)
        exceeds = np.zeros((n, horizon), bool)
    return RolloutScores(
        env=ds.env, level=ds.level, fingerprint=dataset_fingerprint(ds), mask=ds.mask.astype(bool),
        transition_error=transition_error, per_dimension_error=per_dim, exceeds_dynamics=exceeds,
        legal_next=grid(merged["legal_next"].astype(bool), True),
        violations={name: grid(v.astype(bool), False) for name, v in merged["violations"].items()},
        legal_initial=initial_legal.astype(bool),
        step_success=step_success, goal_reached=step_success[np.arange(n), last],
        threshold=threshold, error_unit=adapter.error_unit, simulated=adapter.simulate is not None,
        no_simulator_reason=adapter.no_simulator_reason)


def _rate(values: np.ndarray) -> float:
    return float(np.mean(values)) if values.size else float("nan")


def summarize(scores: RolloutScores) -> dict[str, Any]:
    """The JSON-able summary of one dataset's scores (rates in [0, 1]; errors in ``error_unit``).

    Keys: ``num_rollouts``, ``num_transitions``, ``goal_consistency``, ``illegal_state_rate``
    (generated states s_1..s_L), ``illegal_states_by_category`` (rate per category, same
    denominator), ``legal_rollout_rate`` (all states of the rollout legal, s0 included),
    ``transition_error`` (``mean``, ``median``, ``p90``, ``max``; None without simulator),
    ``per_dimension_error`` (S means, None without simulator), ``exceeds_dynamics_rate``
    (transitions; None without simulator), ``realistic_rollout_rate`` (legal and no transition
    exceeding), ``consistent_and_legal_rate``, ``consistent_and_realistic_rate``, ``threshold``,
    ``error_unit``, ``simulated``, ``no_simulator_reason``.
    """
    mask = scores.mask
    lengths = scores.lengths
    illegal_steps = ~scores.legal_next & mask
    legal_rollout = scores.legal_initial & ~illegal_steps.any(axis=1)
    exceeding = scores.exceeds_dynamics.any(axis=1)
    realistic = legal_rollout & (~exceeding if scores.simulated else True)
    goal = scores.goal_reached
    errors = scores.transition_error[mask]
    summary: dict[str, Any] = {
        "num_rollouts": int(mask.shape[0]),
        "num_transitions": int(mask.sum()),
        "mean_length": float(lengths.mean()),
        "goal_consistency": _rate(goal),
        "illegal_state_rate": _rate(illegal_steps[mask]),
        "illegal_states_by_category": {name: _rate(v[mask]) for name, v in scores.violations.items()},
        "legal_rollout_rate": _rate(legal_rollout),
        "consistent_and_legal_rate": _rate(goal & legal_rollout),
        "simulated": bool(scores.simulated),
        "no_simulator_reason": scores.no_simulator_reason,
        "threshold": float(scores.threshold),
        "error_unit": scores.error_unit,
    }
    if scores.simulated:
        summary.update(
            transition_error={"mean": float(np.mean(errors)), "median": float(np.median(errors)),
                              "p90": float(np.quantile(errors, 0.9)), "max": float(np.max(errors))},
            per_dimension_error=[float(v) for v in scores.per_dimension_error[mask].mean(axis=0)],
            exceeds_dynamics_rate=_rate(scores.exceeds_dynamics[mask]),
            realistic_rollout_rate=_rate(realistic),
            consistent_and_realistic_rate=_rate(goal & realistic))
    else:
        summary.update(transition_error=None, per_dimension_error=None, exceeds_dynamics_rate=None,
                       realistic_rollout_rate=None, consistent_and_realistic_rate=None)
    return summary


# ---------------------------------------------------------------------------------------------------
# Reports


def _pct(value: float | None) -> str:
    """A rate as ``"12.3 %"`` (``"n/a"`` for None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.1f} %"


@dataclasses.dataclass(frozen=True)
class QualityReport:
    """The quality of one environment's rollout datasets, per level.

    Attributes:
      env: environment name.
      levels: level -> :func:`summarize` dict (in the order given).
      scores: level -> :class:`RolloutScores`.
    """

    env: str
    levels: dict[str, dict[str, Any]]
    scores: dict[str, RolloutScores]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able ``{"env", "levels": {level: summary}}``."""
        return {"env": self.env, "levels": {k: dict(v) for k, v in self.levels.items()}}

    def to_markdown(self) -> str:
        """The :func:`summary_markdown` table of :attr:`levels`."""
        return summary_markdown(self.levels)


def summary_markdown(levels: Mapping[str, Mapping[str, Any]]) -> str:
    """A markdown table of :func:`summarize` dicts, one row per level (name -> summary): rollouts,
    goal consistency, legal rollouts, consistent ∧ legal, illegal states (and per category),
    transition error (mean / p90), exceeds dynamics, consistent ∧ realistic; then a note on the
    error unit and threshold."""
    if not levels:
        raise QualityError("summary_markdown needs at least one level")
    first = next(iter(levels.values()))
    categories = list(first["illegal_states_by_category"])
    head = ["level", "rollouts", "goal consistency", "legal rollouts", "consistent & legal",
            "illegal states"] + [f"{c} (states)" for c in categories] + [
            "transition error mean / p90", "exceeds dynamics (transitions)",
            "consistent & realistic"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for level, s in levels.items():
        error = s["transition_error"]
        cells = [level, str(s["num_rollouts"]), _pct(s["goal_consistency"]),
                 _pct(s["legal_rollout_rate"]), _pct(s["consistent_and_legal_rate"]),
                 _pct(s["illegal_state_rate"])]
        cells += [_pct(s["illegal_states_by_category"].get(c)) for c in categories]
        cells += ["n/a" if error is None else f"{error['mean']:.2f} / {error['p90']:.2f}",
                  _pct(s["exceeds_dynamics_rate"]), _pct(s["consistent_and_realistic_rate"])]
        lines.append("| " + " | ".join(cells) + " |")
    unit, threshold = first["error_unit"], first["threshold"]
    if first["simulated"]:
        note = (f"Transition error: largest per-entity distance between the generated next state "
                f"and the simulator's, in {unit}; it exceeds dynamics above {threshold:g}.")
    else:
        note = f"Transitions were not checked: {first['no_simulator_reason']}."
    return "\n".join(lines) + "\n\n" + note + "\n"


def quality_report(datasets: (TrajectoryDataset | Sequence[TrajectoryDataset]
                             | Mapping[str, TrajectoryDataset]),
                   *, threshold: float | None = None, adapter: QualityAdapter | None = None
                   ) -> QualityReport:
    """Scores and summarises rollout datasets of one environment, one per level.

    ``datasets``: one dataset, a sequence (keyed by their ``level``) or a mapping level -> dataset.
    ``threshold``: "exceeds dynamics" threshold (default: the adapter's).
    """
    if isinstance(datasets, TrajectoryDataset):
        datasets = [datasets]
    if not isinstance(datasets, Mapping):
        items = [(ds.level, ds) for ds in datasets]
        if len({level for level, _ in items}) != len(items):
            raise QualityError("two datasets of the same level; pass a mapping name -> dataset")
        datasets = dict(items)
    if not datasets:
        raise QualityError("quality_report needs at least one dataset")
    envs = {ds.env for ds in datasets.values()}
    if len(envs) != 1:
        raise QualityError(f"datasets of several environments {sorted(envs)}; report each separately")
    scores = {name: score_dataset(ds, adapter=adapter, threshold=threshold)
              for name, ds in datasets.items()}
    return QualityReport(envs.pop(), {name: summarize(s) for name, s in scores.items()}, scores)


# ---------------------------------------------------------------------------------------------------
# Filtering


def filter_dataset(dataset: TrajectoryDataset, report: QualityReport | RolloutScores, *,
                   max_transition_error: float | None = None, require_legal: bool = True,
                   require_goal: bool = False,
                   mode: Literal["trajectory", "truncate"] = "trajectory") -> TrajectoryDataset:
    """Keeps the rollouts of ``dataset`` that pass the criteria; records the filter in provenance.

    A step is *bad* when its transition error exceeds ``max_transition_error`` (in the report's
    error unit; None: not checked) or, with ``require_legal``, its next state is illegal.

    Modes:
      ``"trajectory"`` (default): whole rollouts are kept or dropped — a rollout is dropped if any
        step is bad, its initial state is illegal (``require_legal``), or (``require_goal``) its
        final transition misses the goal. Kept rollouts are unchanged, so terminals, rewards and
        goal-reaching behaviour are exactly what was generated.
      ``"truncate"``: a rollout is cut before its first bad step (steps before it are kept and the
        new last step becomes a truncation unless it is a terminal); rollouts with a bad first step
        or an illegal initial state are dropped; with ``require_goal`` a rollout must still reach
        its goal within the kept prefix. This keeps more transitions from long rollouts that go
        wrong late, at the price of more truncated episodes.

    Args:
      dataset: the rollouts the report was computed on (checked by fingerprint).
      report: a :class:`QualityReport` holding ``dataset.level`` or that level's
        :class:`RolloutScores`.
    Returns:
      A new validated dataset; its provenance gains ``filters`` (a list, one record per filter
      applied: criteria, mode, counts, the source fingerprint and its quality summary) and
      ``quality`` becomes the summary of the filtered rollouts.
    Raises:
      QualityError: the report does not match the dataset, or nothing passes.
    """
    if mode not in ("trajectory", "truncate"):
        raise QualityError(f"mode must be 'trajectory' or 'truncate', got {mode!r}")
    if isinstance(report, QualityReport):
        if dataset.level not in report.scores:
            raise QualityError(f"the report has no level {dataset.level!r} (it has "
                               f"{', '.join(report.scores)}); pass that level's RolloutScores")
        scores = report.scores[dataset.level]
    else:
        scores = report
    if scores.fingerprint != dataset_fingerprint(dataset):
        raise QualityError("report: these scores were computed on different rollouts than "
                           "`dataset` (fingerprint mismatch); score this dataset with "
                           "quality_report(dataset) first")
    if max_transition_error is not None and not max_transition_error > 0:
        raise QualityError(f"max_transition_error must be > 0 or None, got {max_transition_error}")
    bad = scores.bad_steps(max_transition_error=max_transition_error, require_legal=require_legal)
    mask = dataset.mask
    n, horizon = mask.shape
    lengths = mask.sum(axis=1)
    start_ok = scores.legal_initial if require_legal else np.ones(n, bool)
    if mode == "trajectory":
        keep = start_ok & ~bad.any(axis=1)
        if require_goal:
            keep &= scores.goal_reached
        new_lengths = lengths
    else:
        first_bad = np.where(bad.any(axis=1), np.argmax(bad, axis=1), lengths)
        new_lengths = np.minimum(lengths, first_bad)
        keep = start_ok & (new_lengths > 0)
        if require_goal:
            within = np.arange(horizon)[None, :] < new_lengths[:, None]
            keep &= (dataset.terminals & within).any(axis=1)
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        raise QualityError(f"no rollout of {dataset.env}/{dataset.level} passes the filter "
                           f"(max_transition_error={max_transition_error}, "
                           f"require_legal={require_legal}, require_goal={require_goal}, "
                           f"mode={mode!r}); loosen the criteria")
    kept_lengths = new_lengths[rows]
    steps = np.arange(horizon)[None, :]
    new_mask = steps < kept_lengths[:, None]
    state_steps = np.arange(horizon + 1)[None, :] <= kept_lengths[:, None]
    terminals = dataset.terminals[rows] & new_mask
    last = np.zeros_like(new_mask)
    last[np.arange(len(rows)), kept_lengths - 1] = True
    truncations = last & ~terminals.any(axis=1, keepdims=True)
    action_mask = new_mask.reshape(new_mask.shape + (1,) * (dataset.actions.ndim - 2))
    record = {
        "filter": "imaginejax.imaginer.quality.filter_dataset", "mode": mode,
        "max_transition_error": max_transition_error, "error_unit": scores.error_unit,
        "require_legal": bool(require_legal), "require_goal": bool(require_goal),
        "source_fingerprint": scores.fingerprint,
        "rollouts_in": int(n), "rollouts_kept": int(len(rows)),
        "transitions_in": int(lengths.sum()), "transitions_kept": int(kept_lengths.sum()),
        "quality_before": summarize(scores),
    }
    provenance = dict(dataset.provenance)
    provenance["filters"] = list(provenance.get("filters", [])) + [record]
    filtered = dataclasses.replace(
        dataset,
        states=np.where(state_steps[..., None], dataset.states[rows], 0.0).astype(np.float32),
        actions=np.where(action_mask, dataset.actions[rows], 0).astype(dataset.actions.dtype),
        rewards=np.where(new_mask, dataset.rewards[rows], 0.0).astype(np.float32),
        mask=new_mask, terminals=terminals, truncations=truncations,
        instruction_ids=dataset.instruction_ids[rows], goals=dataset.goals[rows],
        provenance=provenance)
    quality = summarize(score_dataset(filtered, threshold=scores.threshold))
    return dataclasses.replace(filtered, provenance={**provenance, "quality": quality})
