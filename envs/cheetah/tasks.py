"""HalfCheetah tasks: goal encoding, the running quantities of an episode, and the pure success /
reward / legality predicates on state vectors, broadcasting over leading dims (BENCHMARK §2.5).

State (..., 18): [0] dx of the step that produced it (0 at reset), [1] rootz, [2] rooty (pitch),
[3:9] leg joint angles, [9:18] qvel. Goal (..., 2) int32 ``[kind, direction]``, direction +1, -1 or 0.
Success (t steps, Σ = Σ dx): run t ≥ 99, ±Σ > 7; jump t ≥ 5, ±Σ > 0; run fast t ≥ 99, ±Σ > 8.5;
forward-backward t ≥ 199 with both legs done in the named order (a leg: > 30 steps of its sign
summing beyond ±3); jump in place t ≥ 15, |Σ| < 1.05. Rewards (v = dx / DT, c = 0.1 Σ a²): run ±v − c;
forward-backward +v − c until the first leg is done, then −v − c; jump ±clip(v, −1, 1) + 10·hop − c,
in place −|v| + 10·hop − c, ``hop = max(rootz − REST_HEIGHT, 0) max(cos rooty, 0)``.
Why these choices, against the reference: docs/envs.md, "HalfCheetah".
"""

from __future__ import annotations

from typing import Final

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.envs.base import check_level
from imaginejax.envs.cheetah import model as M

STATE_DIM: Final[int] = 18
ACTION_DIM: Final[int] = M.NU
GOAL_DIM: Final[int] = 2
MAX_STEPS: Final[int] = 200
ENV_TITLE: Final[str] = "HalfCheetah"  # in error messages
LEVELS: Final[tuple[str, ...]] = ("train", "rephrase", "easy", "hard")

# State-vector layout.
DX, ROOTZ, ROOTY = 0, 1, 2
LEG_ANGLES: Final[slice] = slice(3, 9)
VX, VZ, PITCH_RATE = 9, 10, 11
LEG_VELOCITIES: Final[slice] = slice(12, 18)

# Goal kinds.
KIND_RUN, KIND_RUN_FAST, KIND_JUMP, KIND_FORWARD_BACKWARD, KIND_JUMP_IN_PLACE = 0, 1, 2, 3, 4
KIND_NAMES: Final[tuple[str, ...]] = ("run", "run fast", "jump", "forward-backward", "jump in place")
FORWARD, BACKWARD, IN_PLACE = 1, -1, 0

# Success thresholds (BENCHMARK §2.5), t = steps taken after the step.
RUN_DISTANCE: Final[float] = 7.0
RUN_FAST_DISTANCE: Final[float] = 8.5
RUN_MIN_STEPS: Final[int] = 99
JUMP_MIN_STEPS: Final[int] = 5
LEG_MIN_STEPS: Final[int] = 30  # a leg needs MORE than this many steps in its direction
LEG_DISTANCE: Final[float] = 3.0  # ... and their displacements beyond ±this
FORWARD_BACKWARD_MIN_STEPS: Final[int] = 199
IN_PLACE_RADIUS: Final[float] = 1.05
IN_PLACE_MIN_STEPS: Final[int] = 15

# Rewards.
CTRL_COST_WEIGHT: Final[float] = 0.1
HOP_SPEED_CAP: Final[float] = 1.0  # m/s
HOP_HEIGHT_WEIGHT: Final[float] = 10.0  # reward per metre of rise above the resting height
REST_HEIGHT: Final[float] = -0.13  # rootz of the cheetah standing still (measured; tested)

# Legality bounds (generous: ~2x the extremes seen under random, bang-bang and periodic policies).
MAX_ABS_DX: Final[float] = 1.5  # m per 0.05 s step (30 m/s)
MIN_ROOTZ: Final[float] = -(M.TORSO_START_HEIGHT - M.TORSO_RADIUS) - 0.05  # torso lying on the floor
MAX_ROOTZ: Final[float] = 2.5
LEG_ANGLE_MARGIN: Final[float] = 0.5  # rad beyond the (soft) joint limits
MAX_ABS_ROOT_SPEED: Final[float] = 30.0  # m/s, vx and vz
MAX_ABS_PITCH_RATE: Final[float] = 60.0  # rad/s
MAX_ABS_JOINT_SPEED: Final[float] = 100.0  # rad/s


@struct.dataclass
class Progress:
    """Running quantities of an episode; each field (...) float32 (counts and step numbers are exact).

    Attributes:
      sigma: Σ, total x displacement since the reset.
      forward_steps: steps with dx > 0.
      backward_steps: steps with dx < 0.
      forward_sum: sum of dx over the forward steps (>= 0).
      backward_sum: sum of dx over the backward steps (<= 0).
      forward_done_at: step count t at which the forward leg got done (> 30 forward steps and
        forward_sum > 3), 0 while not done.
      backward_done_at: same for the backward leg (> 30 backward steps and backward_sum < -3).
    """

    sigma: jax.Array
    forward_steps: jax.Array
    backward_steps: jax.Array
    forward_sum: jax.Array
    backward_sum: jax.Array
    forward_done_at: jax.Array
    backward_done_at: jax.Array

    @classmethod
    def zeros(cls, shape: tuple[int, ...] = (), dtype: jnp.dtype = jnp.float32) -> "Progress":
        """The progress of a fresh episode, fields of the given shape."""
        z = jnp.zeros(shape, dtype)
        return cls(z, z, z, z, z, z, z)


# ---------------------------------------------------------------------------------------------------
# Goals and levels
# ---------------------------------------------------------------------------------------------------
LEVEL_GOALS: Final[dict[str, np.ndarray]] = {
    "train": np.array([[KIND_RUN, FORWARD], [KIND_RUN, BACKWARD], [KIND_JUMP, FORWARD], [KIND_JUMP, BACKWARD]],
                      np.int32),
    "easy": np.array([[KIND_RUN_FAST, FORWARD], [KIND_RUN_FAST, BACKWARD]], np.int32),
    "hard": np.array([[KIND_FORWARD_BACKWARD, FORWARD], [KIND_FORWARD_BACKWARD, BACKWARD],
                      [KIND_JUMP_IN_PLACE, IN_PLACE]], np.int32),
}
LEVEL_GOALS["rephrase"] = LEVEL_GOALS["train"]
for _goals in LEVEL_GOALS.values():
    _goals.setflags(write=False)

TASK_NAMES: Final[dict[tuple[int, int], str]] = {
    (KIND_RUN, FORWARD): "run forward", (KIND_RUN, BACKWARD): "run backward",
    (KIND_JUMP, FORWARD): "jump forward", (KIND_JUMP, BACKWARD): "jump backward",
    (KIND_RUN_FAST, FORWARD): "run forward fast", (KIND_RUN_FAST, BACKWARD): "run backward fast",
    (KIND_FORWARD_BACKWARD, FORWARD): "forward then backward",
    (KIND_FORWARD_BACKWARD, BACKWARD): "backward then forward",
    (KIND_JUMP_IN_PLACE, IN_PLACE): "jump in place",
}


def level_goals(level: str) -> np.ndarray:
    """The goal table of a level, (K, 2) int32 read-only (train and rephrase share goals)."""
    check_level(ENV_TITLE, level, LEVELS)
    return LEVEL_GOALS[level]


def level_max_steps(level: str) -> int:
    """Episode cap: 200 steps at every level (a time limit is a truncation, not a terminal)."""
    check_level(ENV_TITLE, level, LEVELS)
    return MAX_STEPS


def describe_goal(goal: np.ndarray) -> str:
    """The canonical task name of a goal vector (for logs; not an instruction)."""
    key = (int(goal[0]), int(goal[1]))
    if key not in TASK_NAMES:
        raise ValueError(f"not a HalfCheetah goal: {tuple(int(g) for g in goal)}")
    return TASK_NAMES[key]


# ---------------------------------------------------------------------------------------------------
# Running quantities
# ---------------------------------------------------------------------------------------------------
def update_progress(progress: Progress, next_state: jax.Array, t: jax.Array) -> Progress:
    """Adds one step to the running quantities.

    Args:
      progress: :class:`Progress` before the step, fields (...).
      next_state: (..., 18) state after the step (its dx, slot 0, is the step's displacement).
      t: (...) int, steps taken *after* this step (1 for the first step).
    Returns: the updated :class:`Progress`.
    """
    chex.assert_axis_dimension(next_state, -1, STATE_DIM)
    dx = next_state[..., DX].astype(progress.sigma.dtype)
    t = jnp.asarray(t).astype(progress.sigma.dtype)
    forward, backward = dx > 0, dx < 0
    forward_steps = progress.forward_steps + forward
    backward_steps = progress.backward_steps + backward
    forward_sum = progress.forward_sum + jnp.where(forward, dx, 0.0)
    backward_sum = progress.backward_sum + jnp.where(backward, dx, 0.0)
    forward_leg = (forward_steps > LEG_MIN_STEPS) & (forward_sum > LEG_DISTANCE)
    backward_leg = (backward_steps > LEG_MIN_STEPS) & (backward_sum < -LEG_DISTANCE)
    return Progress(
        sigma=progress.sigma + dx,
        forward_steps=forward_steps,
        backward_steps=backward_steps,
        forward_sum=forward_sum,
        backward_sum=backward_sum,
        forward_done_at=jnp.where((progress.forward_done_at == 0) & forward_leg, t, progress.forward_done_at),
        backward_done_at=jnp.where((progress.backward_done_at == 0) & backward_leg, t, progress.backward_done_at),
    )


def trajectory_progress(states: jax.Array) -> Progress:
    """Running quantities after every step of state trajectories.

    Args:
      states: (..., T+1, 18), s_0 first (its dx is ignored).
    Returns: :class:`Progress` with fields (..., T): entry t holds the quantities after step t+1.
    """
    chex.assert_axis_dimension(states, -1, STATE_DIM)
    steps = jnp.moveaxis(states[..., 1:, :], -2, 0)  # (T, ..., 18)
    t = jnp.arange(1, steps.shape[0] + 1, dtype=jnp.int32)

    def body(progress: Progress, xs: tuple[jax.Array, jax.Array]) -> tuple[Progress, Progress]:
        state, t_now = xs
        progress = update_progress(progress, state, t_now)
        return progress, progress

    _, out = jax.lax.scan(body, Progress.zeros(states.shape[:-2]), (steps, t))
    return jax.tree.map(lambda x: jnp.moveaxis(x, 0, -1), out)


# ---------------------------------------------------------------------------------------------------
# Predicates
# ---------------------------------------------------------------------------------------------------
def success(progress: Progress, t: jax.Array, goal: jax.Array) -> jax.Array:
    """Task success after a step.

    Args:
      progress: :class:`Progress` *after* the step, fields (...).
      t: (...) int, steps taken after the step (the reference's ``timestep``).
      goal: (..., 2) int32 ``[kind, direction]``.
    Returns: (...) bool (the module docstring's thresholds).
    """
    chex.assert_axis_dimension(goal, -1, GOAL_DIM)
    kind, direction = goal[..., 0], goal[..., 1]
    t = jnp.asarray(t)
    signed = direction.astype(progress.sigma.dtype) * progress.sigma
    run = (t >= RUN_MIN_STEPS) & (signed > RUN_DISTANCE)
    run_fast = (t >= RUN_MIN_STEPS) & (signed > RUN_FAST_DISTANCE)
    jump = (t >= JUMP_MIN_STEPS) & (signed > 0)
    first = jnp.where(direction >= 0, progress.forward_done_at, progress.backward_done_at)
    second = jnp.where(direction >= 0, progress.backward_done_at, progress.forward_done_at)
    forward_backward = (t >= FORWARD_BACKWARD_MIN_STEPS) & (first > 0) & (second > first)
    in_place = (t >= IN_PLACE_MIN_STEPS) & (jnp.abs(progress.sigma) < IN_PLACE_RADIUS)
    return jnp.select(
        [kind == KIND_RUN, kind == KIND_RUN_FAST, kind == KIND_JUMP, kind == KIND_FORWARD_BACKWARD,
         kind == KIND_JUMP_IN_PLACE],
        [run, run_fast, jump, forward_backward, in_place], False)


def hop_height(state: jax.Array) -> jax.Array:
    """Upright rise of the torso above its resting height: (..., 18) → (...) >= 0 (metres)."""
    rise = jnp.maximum(state[..., ROOTZ] - REST_HEIGHT, 0.0)
    return rise * jnp.maximum(jnp.cos(state[..., ROOTY]), 0.0)


def control_cost(action: jax.Array) -> jax.Array:
    """Gymnasium's control cost 0.1·Σ a² of the action as given (unclamped): (..., 6) → (...)."""
    return CTRL_COST_WEIGHT * jnp.sum(jnp.square(action), axis=-1)


def reward(prev_state: jax.Array, action: jax.Array, next_state: jax.Array, goal: jax.Array,
           progress: Progress) -> jax.Array:
    """Reward of the transition (prev_state, action) → next_state.

    Args:
      prev_state: (..., 18) (unused; the common predicate signature).
      action: (..., 6).
      next_state: (..., 18); its dx gives v = dx / 0.05 s.
      goal: (..., 2) int32.
      progress: :class:`Progress` *before* the step (the hard tasks' current leg), fields (...).
    Returns: (...) float32 (the module docstring's formulas).
    """
    del prev_state
    chex.assert_axis_dimension(next_state, -1, STATE_DIM)
    chex.assert_axis_dimension(action, -1, ACTION_DIM)
    kind, direction = goal[..., 0], goal[..., 1]
    sign = direction.astype(next_state.dtype)
    speed = next_state[..., DX] / M.DT
    hop = HOP_HEIGHT_WEIGHT * hop_height(next_state)
    first_done = jnp.where(direction >= 0, progress.forward_done_at, progress.backward_done_at) > 0
    leg_sign = jnp.where(first_done, -sign, sign)
    task = jnp.select(
        [(kind == KIND_RUN) | (kind == KIND_RUN_FAST), kind == KIND_JUMP, kind == KIND_FORWARD_BACKWARD,
         kind == KIND_JUMP_IN_PLACE],
        [sign * speed, sign * jnp.clip(speed, -HOP_SPEED_CAP, HOP_SPEED_CAP) + hop, leg_sign * speed,
         -jnp.abs(speed) + hop], 0.0)
    return (task - control_cost(action)).astype(jnp.float32)


def trajectory_success_and_reward(states: jax.Array, actions: jax.Array, goal: jax.Array
                                  ) -> tuple[jax.Array, jax.Array]:
    """Per-step success and reward of whole trajectories (e.g. imaginary rollouts).

    Args:
      states: (..., T+1, 18), s_0 first.
      actions: (..., T, 6).
      goal: (..., 2) int32.
    Returns:
      success (..., T) bool: the predicate after step t+1 (an episode ends at its first True);
      reward (..., T) float32: the reward of step t+1.
    """
    after = trajectory_progress(states)  # fields (..., T)
    before = jax.tree.map(lambda x: jnp.concatenate([jnp.zeros_like(x[..., :1]), x[..., :-1]], axis=-1), after)
    horizon = states.shape[-2] - 1
    t = jnp.arange(1, horizon + 1, dtype=jnp.int32)
    goal_t = goal[..., None, :]
    succeeded = success(after, t, goal_t)
    rewards = reward(states[..., :-1, :], actions, states[..., 1:, :], jnp.broadcast_to(
        goal_t, states.shape[:-2] + (horizon, GOAL_DIM)), before)
    return succeeded, rewards


def legal(state: jax.Array) -> jax.Array:
    """Physical plausibility of a state: (..., 18) → (...) bool. Finite, |dx| <= 1.5 m per step, rootz in
    [-0.7, 2.5] m, leg joints within their limits widened by 0.5 rad, |vx|, |vz| <= 30 m/s, |pitch rate|
    <= 60 rad/s, joint speeds <= 100 rad/s; the pitch is unbounded (the cheetah may flip)."""
    chex.assert_axis_dimension(state, -1, STATE_DIM)
    finite = jnp.all(jnp.isfinite(state), axis=-1)
    low = jnp.asarray(M.LEG_JOINT_RANGE[:, 0]) - LEG_ANGLE_MARGIN
    high = jnp.asarray(M.LEG_JOINT_RANGE[:, 1]) + LEG_ANGLE_MARGIN
    legs = state[..., LEG_ANGLES]
    return (finite
            & (jnp.abs(state[..., DX]) <= MAX_ABS_DX)
            & (state[..., ROOTZ] >= MIN_ROOTZ) & (state[..., ROOTZ] <= MAX_ROOTZ)
            & jnp.all((legs >= low) & (legs <= high), axis=-1)
            & (jnp.abs(state[..., VX]) <= MAX_ABS_ROOT_SPEED) & (jnp.abs(state[..., VZ]) <= MAX_ABS_ROOT_SPEED)
            & (jnp.abs(state[..., PITCH_RATE]) <= MAX_ABS_PITCH_RATE)
            & jnp.all(jnp.abs(state[..., LEG_VELOCITIES]) <= MAX_ABS_JOINT_SPEED, axis=-1))


def state_vector(dx: jax.Array, qpos: jax.Array, qvel: jax.Array) -> jax.Array:
    """dx (...), qpos (..., 9), qvel (..., 9) → the (..., 18) state vector [dx, qpos[1:], qvel]."""
    return jnp.concatenate([jnp.asarray(dx)[..., None], qpos[..., 1:], qvel], axis=-1)

