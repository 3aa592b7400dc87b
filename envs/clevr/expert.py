"""Scripted CLEVR-Robot expert: model-predictive greedy search with the true simulator.

At every step all 40 pushes are simulated (:func:`physics.push`, B × 40 candidates) and the best

    score(a) = progress(next_a, goal) + SUCCESS_BONUS · success(s, a, next_a, goal)
               - WORKBENCH_WEIGHT · (distance of balls outside the safe box)

is taken; where no push improves the score, the ``lookahead_width`` best are expanded by a second push,
scored ``max(score(a1), max_a2 score(a1, a2) - LOOKAHEAD_PENALTY)``. Tie-break noise, and ε-random
actions for data diversity. The design: docs/envs.md, "CLEVR-Robot".
"""

from __future__ import annotations

import math
from typing import Callable, Final

import chex
import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.envs.clevr import physics
from imaginejax.envs.clevr import tasks

TARGET_HALF_ANGLE: Final[float] = math.radians(30.0)  # safe part of the ±45° relation sector
TARGET_MIN: Final[float] = 0.28  # safe distances of A from B (contact is 0.26, the limit 0.39)
TARGET_MAX: Final[float] = 0.34
WAYPOINT_RADIUS: Final[float] = 0.34  # side waypoint used to walk A around B
UNSATISFIED_PENALTY: Final[float] = 0.1  # extra cost of an unsatisfied sub-condition
SUCCESS_BONUS: Final[float] = 100.0
LOOKAHEAD_PENALTY: Final[float] = 0.02  # a two-push plan must beat a one-push plan by this much
STUCK_TOLERANCE: Final[float] = 1e-3  # greedy is stuck when no push improves the score by more
LINE_SLOPE: Final[float] = math.tan(math.radians(22.0))  # aim inside the ±30° cone
LINE_SPACING: Final[float] = 0.30
GATHER_TARGET: Final[float] = 0.29  # aim inside the 0.325 gather radius
SAFE_MARGIN: Final[float] = 0.25  # the expert keeps balls within the layout box widened by this
WORKBENCH_WEIGHT: Final[float] = 10.0


@struct.dataclass
class ExpertConfig:
    """Expert hyperparameters (a pytree: epsilon and tie_noise may be traced; the rest is static).

    Attributes:
      epsilon: probability of replacing the expert's action by a uniformly random one.
      tie_noise: amplitude of the uniform noise added to every candidate's score.
      lookahead_width: 0 for pure greedy; k > 0: when no single push improves the score (greedy is
        stuck), the k best first pushes are expanded by a second push.
      chunk: environments per physics call (``chunk × 40`` candidate pushes).
    """

    epsilon: float = 0.0
    tie_noise: float = 1e-4
    lookahead_width: int = struct.field(pytree_node=False, default=8)
    chunk: int = struct.field(pytree_node=False, default=32)


def _workbench_excess(state: jax.Array) -> jax.Array:
    """Total distance of balls beyond the safe box: (..., 10) → (...)."""
    balls = tasks.balls_of(state)
    low = jnp.asarray(tasks.LAYOUT_LOW) - SAFE_MARGIN
    high = jnp.asarray(tasks.LAYOUT_HIGH) + SAFE_MARGIN
    return (jnp.maximum(low - balls, 0.0) + jnp.maximum(balls - high, 0.0)).sum(axis=(-2, -1))


def _clause_path_length(a_pos: jax.Array, b_pos: jax.Array, direction: jax.Array) -> jax.Array:
    """Approximate travel of A into the safe part of the region "A is <direction> of B" (angles within
    ±TARGET_HALF_ANGLE, distances in [TARGET_MIN, TARGET_MAX] around B), around B through a waypoint at
    ``WAYPOINT_RADIUS`` when A is behind it.

    Args: a_pos, b_pos (..., 2); direction (...) int.
    Returns: path length (...) and the target point (..., 2).
    """
    axis = jnp.asarray(tasks.RELATION_VECTORS)[direction]
    normal = jnp.stack([-axis[..., 1], axis[..., 0]], axis=-1)
    delta = a_pos - b_pos
    along, across = (delta * axis).sum(-1), (delta * normal).sum(-1)
    angle = jnp.arctan2(across, along)
    radius = jnp.sqrt(along**2 + across**2)
    t_angle = jnp.clip(angle, -TARGET_HALF_ANGLE, TARGET_HALF_ANGLE)
    t_radius = jnp.clip(radius, TARGET_MIN, TARGET_MAX)
    target = b_pos + t_radius[..., None] * (jnp.cos(t_angle)[..., None] * axis + jnp.sin(t_angle)[..., None] * normal)
    side = jnp.where(angle >= 0, 1.0, -1.0)[..., None]
    waypoint = b_pos + WAYPOINT_RADIUS * side * normal
    direct = jnp.linalg.norm(a_pos - target, axis=-1)
    around = jnp.linalg.norm(a_pos - waypoint, axis=-1) + jnp.linalg.norm(waypoint - target, axis=-1)
    return jnp.where(jnp.abs(angle) > math.pi / 2, around, direct), target


def progress(state: jax.Array, goal: jax.Array) -> jax.Array:
    """Goal-specific progress potential (higher is better; 0 once every clause of a relational goal holds):
    state (..., 10), goal (..., G) -> (...) float32.

    relational: Σ over unsatisfied clauses of -(:func:`_clause_path_length` + 0.1); line: Σ over the 4
    consecutive pairs of the violation of "next ball >= 0.30 to the right and within 22° of +x" (+0.1 when the
    pair's sub-condition fails); gather: Σ over the non-centre balls of -(max(0, |ball - centre| - 0.29)
    + 0.1 if outside 0.325); push: 0.
    """
    balls = tasks.balls_of(state)
    kind = goal[..., 0]
    satisfied, valid = tasks.subconditions(state, goal)
    unsat = (valid & ~satisfied).astype(jnp.float32)  # (..., 4)

    # Relational clauses: path length of A to the nearest "safe" point of its target region next to B.
    a, b, d = tasks.clause_fields(goal)
    balls_c = balls[..., None, :, :]
    dist, _ = _clause_path_length(tasks.select_ball(balls_c, a), tasks.select_ball(balls_c, b), d)  # (..., 3)
    unsat_c = unsat[..., : tasks.MAX_CLAUSES]
    rel = -((dist + UNSATISFIED_PENALTY) * unsat_c).sum(-1)

    # Line: consecutive pairs.
    step = balls[..., 1:, :] - balls[..., :-1, :]
    slope_violation = jnp.maximum(jnp.abs(step[..., 1]) - LINE_SLOPE * jnp.maximum(step[..., 0], 0.0), 0.0)
    spacing_violation = jnp.maximum(LINE_SPACING - step[..., 0], 0.0)
    line = -(slope_violation + spacing_violation + UNSATISFIED_PENALTY * unsat).sum(-1)

    # Gather: distances to the centre ball.
    centre = tasks.select_ball(balls, goal[..., 2])[..., None, :]
    radial = jnp.linalg.norm(balls - centre, axis=-1)  # (..., 5); the centre itself is 0
    gather = -(jnp.maximum(radial - GATHER_TARGET, 0.0).sum(-1) + UNSATISFIED_PENALTY * unsat.sum(-1))

    out = jnp.where(kind == tasks.KIND_RELATIONAL, rel, jnp.where(kind == tasks.KIND_LINE, line, jnp.where(kind == tasks.KIND_GATHER, gather, 0.0)))
    return out.astype(jnp.float32)


def score(prev_state: jax.Array, action: jax.Array, next_state: jax.Array, goal: jax.Array) -> jax.Array:
    """Expert score of a simulated transition: (..., 10), (...), (..., 10), (..., G) → (...) float32."""
    bonus = SUCCESS_BONUS * tasks.success(prev_state, action, next_state, goal).astype(jnp.float32)
    return progress(next_state, goal) + bonus - WORKBENCH_WEIGHT * _workbench_excess(next_state)


def push_advances_goal(state: jax.Array, action: jax.Array, goal: jax.Array) -> jax.Array:
    """Whether a push is a step towards the goal: state (..., 10), action (...) int, goal (..., G) -> (...) bool
    (broadcast).

    relational: the pushed ball is one of the two balls (A or B) of one of the goal's clauses and the simulated
    push raises :func:`progress` by more than ``STUCK_TOLERANCE`` (the expert moves A or B, about half each);
    push (easy): :func:`tasks.push_matches`; line / gather: :func:`progress` rises. A push of a third ball
    that happens to help counts as wrong.
    """
    shape = jnp.broadcast_shapes(state.shape[:-1], jnp.shape(action), goal.shape[:-1])
    state = jnp.broadcast_to(state, shape + state.shape[-1:]).reshape(-1, tasks.STATE_DIM)
    action = jnp.broadcast_to(jnp.asarray(action, jnp.int32), shape).reshape(-1)
    goal = jnp.broadcast_to(goal, shape + goal.shape[-1:]).reshape(-1, tasks.GOAL_DIM)
    ball, direction = physics.decode_action(action)
    after = physics.push(tasks.balls_of(state), ball, direction).reshape(state.shape)
    gains = progress(after, goal) > progress(state, goal) + STUCK_TOLERANCE
    a, b, _ = tasks.clause_fields(goal)
    moved = (a == ball[:, None]) | (b == ball[:, None])
    subject = jnp.any(moved & (jnp.arange(tasks.MAX_CLAUSES) < goal[:, 1:2]), axis=-1)
    kind = goal[:, 0]
    out = jnp.where(kind == tasks.KIND_PUSH, tasks.push_matches(action, goal),
                    jnp.where(kind == tasks.KIND_RELATIONAL, subject & gains, gains))
    return out.reshape(shape)


def _push_all(balls: jax.Array) -> jax.Array:
    """All 40 pushes from each layout: balls (B, 5, 2) → (B, 40, 5, 2)."""
    batch = balls.shape[0]
    actions = jnp.tile(jnp.arange(tasks.NUM_ACTIONS, dtype=jnp.int32), batch)
    ball, direction = physics.decode_action(actions)
    flat = jnp.repeat(balls, tasks.NUM_ACTIONS, axis=0)
    return physics.push(flat, ball, direction).reshape(batch, tasks.NUM_ACTIONS, tasks.N_BALLS, 2)


def _plan_chunk(balls: jax.Array, goal: jax.Array, noise: jax.Array, lookahead_width: int) -> jax.Array:
    """Scores of the 40 first actions for a chunk of environments.

    Args:
      balls: (C, 5, 2); goal: (C, G); noise: (C, 40) tie-break noise.
    Returns: (C, 40) float32 scores.
    """
    c = balls.shape[0]
    actions = jnp.arange(tasks.NUM_ACTIONS, dtype=jnp.int32)
    first = _push_all(balls)  # (C, 40, 5, 2)
    prev_vec = balls.reshape(c, 1, tasks.STATE_DIM)
    first_vec = first.reshape(c, tasks.NUM_ACTIONS, tasks.STATE_DIM)
    goal_c = goal[:, None, :]
    first_score = score(prev_vec, actions[None], first_vec, goal_c) + noise
    if lookahead_width <= 0:
        return first_score
    # Greedy is stuck when no push improves on staying put: only then expand a second push.
    current = score(prev_vec[:, 0], jnp.zeros((c,), jnp.int32), prev_vec[:, 0], goal)
    current = jnp.where(goal[:, 0] == tasks.KIND_PUSH, -jnp.inf, current)
    # A layout that already satisfies its goal (a finished, frozen episode) is not stuck.
    solved = tasks.state_satisfied(prev_vec[:, 0], goal)
    stuck = (first_score.max(-1) <= current + STUCK_TOLERANCE) & ~solved
    return jax.lax.cond(
        jnp.any(stuck),
        lambda: jnp.where(stuck[:, None], _lookahead(first, first_score, prev_vec, goal, lookahead_width), first_score),
        lambda: first_score,
    )


def _lookahead(first: jax.Array, first_score: jax.Array, prev_vec: jax.Array, goal: jax.Array, width: int) -> jax.Array:
    """Two-push scores: the ``width`` best first pushes are expanded by all 40 second pushes.

    Args:
      first: (C, 40, 5, 2) layouts after each first push; first_score: (C, 40); prev_vec: (C, 1, 10);
      goal: (C, G).
    Returns: (C, 40) scores ``max(first, best second - LOOKAHEAD_PENALTY)`` (unexpanded: first).
    """
    c = first.shape[0]
    actions = jnp.arange(tasks.NUM_ACTIONS, dtype=jnp.int32)
    first_vec = first.reshape(c, tasks.NUM_ACTIONS, tasks.STATE_DIM)
    succeeded = tasks.success(prev_vec, actions[None], first_vec, goal[:, None, :])
    ranked = jnp.where(succeeded, -jnp.inf, first_score)
    _, top = jax.lax.top_k(ranked, width)  # (C, k)
    mids = jnp.take_along_axis(first, top[:, :, None, None], axis=1)  # (C, k, 5, 2)
    second = _push_all(mids.reshape(c * width, tasks.N_BALLS, 2))
    second_vec = second.reshape(c, width, tasks.NUM_ACTIONS, tasks.STATE_DIM)
    mid_vec = mids.reshape(c, width, 1, tasks.STATE_DIM)
    second_score = score(mid_vec, actions[None, None], second_vec, goal[:, None, None, :])
    best_second = second_score.max(-1) - LOOKAHEAD_PENALTY  # (C, k)
    expanded = jnp.full_like(first_score, -jnp.inf)
    expanded = jax.vmap(lambda row, idx, val: row.at[idx].set(val))(expanded, top, best_second)
    return jnp.maximum(first_score, expanded)


def expert_actions(key: jax.Array, balls: jax.Array, goal: jax.Array, config: ExpertConfig = ExpertConfig(),
                   active: jax.Array | None = None) -> jax.Array:
    """Expert actions for a batch of environments.

    Args:
      key: PRNG key.
      balls: (B, 5, 2) current ball positions.
      goal: (B, G) int32 goal vectors.
      config: :class:`ExpertConfig`.
      active: optional (B,) bool, the environments whose action is needed; chunks without one skip the
        simulation, inactive ones get action 0 (or ε-random); active ones get what they would without it.
    Returns: (B,) int32 actions in [0, 40).
    """
    batch = balls.shape[0]
    chex.assert_shape(balls, (batch, tasks.N_BALLS, 2))
    chex.assert_shape(goal, (batch, tasks.GOAL_DIM))
    key_noise, key_eps, key_rand = jax.random.split(key, 3)
    noise = config.tie_noise * jax.random.uniform(key_noise, (batch, tasks.NUM_ACTIONS))

    chunk = max(1, min(config.chunk, batch))
    n_chunks = -(-batch // chunk)
    pad = n_chunks * chunk - batch

    def padded(x: jax.Array) -> jax.Array:
        x = jnp.concatenate([x, jnp.repeat(x[:1], pad, axis=0)], axis=0) if pad else x
        return x.reshape((n_chunks, chunk) + x.shape[1:])

    if active is None:
        scores = jax.lax.map(
            lambda args: _plan_chunk(*args, lookahead_width=config.lookahead_width),
            (padded(balls), padded(goal), padded(noise)),
        ).reshape(n_chunks * chunk, tasks.NUM_ACTIONS)[:batch]
    else:
        # Active environments first (stable order), so the finished ones fill whole chunks that are
        # skipped; late in a collection most chunks are then free.
        order = jnp.argsort(~active, stable=True)
        act = padded(active[order])

        def plan(args):
            b, g, n, a = args
            return jax.lax.cond(jnp.any(a), lambda: _plan_chunk(b, g, n, lookahead_width=config.lookahead_width),
                                lambda: jnp.zeros((chunk, tasks.NUM_ACTIONS), jnp.float32))

        sorted_scores = jax.lax.map(plan, (padded(balls[order]), padded(goal[order]), padded(noise[order]), act))
        sorted_scores = sorted_scores.reshape(n_chunks * chunk, tasks.NUM_ACTIONS)[:batch]
        scores = jnp.zeros_like(sorted_scores).at[order].set(sorted_scores)
    greedy = jnp.argmax(scores, axis=-1).astype(jnp.int32)
    random = jax.random.randint(key_rand, (batch,), 0, tasks.NUM_ACTIONS, jnp.int32)
    explore = jax.random.uniform(key_eps, (batch,)) < config.epsilon
    return jnp.where(explore, random, greedy)


Policy = Callable[..., jax.Array]


def make_policy(config: ExpertConfig = ExpertConfig()) -> Policy:
    """The expert as a collection policy ``policy(key, obs, state, params) -> actions (B,)``; it reads
    ``state.balls`` and ``params.goals[state.task]`` (``obs`` is unused) and skips ended episodes (action 0)."""

    def policy(key: jax.Array, obs: jax.Array, state, params) -> jax.Array:
        del obs
        # Ended episodes (``state.done``) are frozen by the environment: their action is not needed.
        return expert_actions(key, state.balls, params.goals[state.task], config, active=~state.done)

    return policy


def expert_policy(noise: float = 0.0) -> Policy:
    """The expert as a collection policy (its registry entry): ``noise`` is ε, the probability of
    replacing the expert's action by a uniformly random one."""
    return make_policy(ExpertConfig(epsilon=noise))
