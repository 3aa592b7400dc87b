"""Scripted BabyAI expert: sub-goal selection plus breadth-first-search navigation on the grid.

At every step the expert reads the true world and the goal and picks a target mask (the interior cells
where it wants to stand next) and an interaction for when it stands there (pick up, drop, toggle or
nothing). Off target it moves along a shortest path from a BFS wavefront on the 6 × 6 interior
(``d ← min(d, d(neighbour) + 1)``); ties are broken at random, and with probability ``epsilon`` a random
action replaces the expert's. Masks are batch-last, (6, 6, B). The sub-goals of each kind: docs/envs.md.
"""

from __future__ import annotations

from typing import Any, Callable, Final

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks

ARRIVE: Final[int] = -1  # interaction code: arriving on the target cell is the goal
BFS_SWEEPS: Final[int] = 2 * (G.ROOM_SIZE - 1)  # longest shortest path in the empty room
UNREACHABLE: Final[int] = 1000

# Cell coordinates of the (6, 6) interior masks: row i is y = i + 1, column j is x = j + 1.
_CELL_X: Final[np.ndarray] = np.tile(np.arange(G.ROOM_MIN, G.ROOM_MAX + 1, dtype=np.int32), (G.ROOM_SIZE, 1))
_CELL_Y: Final[np.ndarray] = _CELL_X.T.copy()
# Top-left corners of the 25 2 × 2 blocks, (5, 5): row bi is y = bi + 1, column bj is x = bj + 1.
_BLOCK_X: Final[np.ndarray] = np.tile(np.arange(G.ROOM_MIN, G.ROOM_MAX, dtype=np.int32), (G.ROOM_SIZE - 1, 1))
_BLOCK_Y: Final[np.ndarray] = _BLOCK_X.T.copy()
_ROWS: Final[np.ndarray] = np.arange(G.ROOM_MIN, G.ROOM_MAX + 1, dtype=np.int32)


@struct.dataclass
class ExpertConfig:
    """Expert hyperparameters (a pytree; both may be traced): ``epsilon``, the probability of a uniformly
    random action; ``tie_noise``, the noise breaking ties between equally good moves / objects (< 1, so it
    never overrides a strictly shorter path)."""

    epsilon: float = 0.0
    tie_noise: float = 0.5


# ---------------------------------------------------------------------------------------------------
# Masks (batch-last: (6, 6, B) bool; per-environment fields (B,) broadcast as [None, None, :])
# ---------------------------------------------------------------------------------------------------
def _b(v: jax.Array) -> jax.Array:
    """(B,) → (1, 1, B)."""
    return jnp.asarray(v)[None, None, :]


def _cell_at(x: jax.Array, y: jax.Array) -> jax.Array:
    """Mask of cell (x, y): (B,), (B,) → (6, 6, B)."""
    return (jnp.asarray(_CELL_X)[..., None] == _b(x)) & (jnp.asarray(_CELL_Y)[..., None] == _b(y))


def _cells_near(x: jax.Array, y: jax.Array) -> jax.Array:
    """Cells within Manhattan distance 1 of (x, y) (the cell itself and its 4-neighbours): (6, 6, B)."""
    return G.manhattan(jnp.asarray(_CELL_X)[..., None], jnp.asarray(_CELL_Y)[..., None], _b(x), _b(y)) <= 1


def _free_cells(g: G.Grid) -> jax.Array:
    """Interior cells with no object on them: (6, 6, B)."""
    occupied = _cell_at(g.x[0], g.y[0]) | _cell_at(g.x[1], g.y[1]) | _cell_at(g.x[2], g.y[2])
    return ~occupied


def _read(mask_or_values: jax.Array, x: jax.Array, y: jax.Array, outside: Any) -> jax.Array:
    """Value of a (6, 6, B) array at cell (x, y) per environment, ``outside`` off the interior: (B,)."""
    at = _cell_at(x, y)
    inside = G.in_room(x, y)
    values = jnp.where(at, mask_or_values, jnp.zeros_like(mask_or_values)).sum(axis=(0, 1))
    if mask_or_values.dtype == jnp.bool_:
        values = values > 0
    return jnp.where(inside, values, outside)


def bfs_distances(target: jax.Array, passable: jax.Array | None = None) -> jax.Array:
    """Shortest-path distances to the nearest target cell by a breadth-first wavefront.

    Args:
      target: (6, 6, B) bool target cells.
      passable: optional (6, 6, B) bool cells the agent may enter (default: every interior cell: 10 sweeps;
        with obstacles 35).
    Returns: (6, 6, B) int32 distances (:data:`UNREACHABLE` where no target can be reached).
    """
    d0 = jnp.where(target, 0, UNREACHABLE).astype(jnp.int32)
    far = jnp.full_like(d0[:1], UNREACHABLE)
    far_col = far.transpose(1, 0, 2)

    def sweep(_: int, d: jax.Array) -> jax.Array:
        north = jnp.concatenate([far, d[:-1]], axis=0)  # value of the cell above (y - 1)
        south = jnp.concatenate([d[1:], far], axis=0)
        west = jnp.concatenate([far_col, d[:, :-1]], axis=1)
        east = jnp.concatenate([d[:, 1:], far_col], axis=1)
        relaxed = jnp.minimum(d, jnp.minimum(jnp.minimum(north, south), jnp.minimum(west, east)) + 1)
        return relaxed if passable is None else jnp.where(passable | target, relaxed, UNREACHABLE)

    # A loop (not unrolled): keeps the compiled program small and the sweeps out of the callers' fusions.
    sweeps = BFS_SWEEPS if passable is None else G.NUM_CELLS - 1  # longest path around obstacles
    d = jax.lax.fori_loop(0, sweeps, sweep, d0)
    return jnp.minimum(d, UNREACHABLE)


# ---------------------------------------------------------------------------------------------------
# Sub-goals
# ---------------------------------------------------------------------------------------------------
class _Plan(struct.PyTreeNode):
    """Target cells (6, 6, B) bool and the interaction (B,) int32 to perform on them."""

    mask: jax.Array
    act: jax.Array


def _plan(mask: jax.Array, act: Any, batch: int) -> _Plan:
    return _Plan(mask=mask, act=jnp.broadcast_to(jnp.asarray(act, jnp.int32), (batch,)))


def _choose(cond: jax.Array, a: _Plan, b: _Plan) -> _Plan:
    """Per environment: plan ``a`` where cond (B,) else ``b``."""
    return _Plan(mask=jnp.where(_b(cond), a.mask, b.mask), act=jnp.where(cond, a.act, b.act))


def _object_xy(g: G.Grid, obj: jax.Array) -> tuple[jax.Array, jax.Array]:
    return G.select_object(g.x, obj), G.select_object(g.y, obj)


def _plan_pick(g: G.Grid, obj: jax.Array, free: jax.Array) -> _Plan:
    """Pick up ``obj`` (B,), dropping any other carried object on a free cell first."""
    batch = g.agent_x.shape[0]
    busy = (g.carried != G.NOTHING) & (g.carried != obj)
    ox, oy = _object_xy(g, obj)
    return _choose(busy, _plan(free, G.DROP, batch), _plan(_cell_at(ox, oy), G.PICKUP, batch))


def _plan_go_to(g: G.Grid, obj: jax.Array, free: jax.Array) -> _Plan:
    """Stand within distance 1 of ``obj``; if carrying it, drop it first."""
    batch = g.agent_x.shape[0]
    ox, oy = _object_xy(g, obj)
    return _choose(g.carried == obj, _plan(free, G.DROP, batch), _plan(_cells_near(ox, oy), ARRIVE, batch))


def _plan_open(g: G.Grid) -> _Plan:
    """Stand in front of the door and toggle it."""
    return _plan(_cell_at(g.door_x - 1, g.door_y), G.TOGGLE, g.agent_x.shape[0])


def _plan_put(g: G.Grid, obj_a: jax.Array, obj_b: jax.Array, free: jax.Array) -> _Plan:
    """Pick up ``obj_a`` and drop it on a free cell 4-adjacent to ``obj_b``."""
    batch = g.agent_x.shape[0]
    bx, by = _object_xy(g, obj_b)
    beside_b = _cells_near(bx, by) & ~_cell_at(bx, by) & free
    return _choose(g.carried == obj_a, _plan(beside_b, G.DROP, batch), _plan_pick(g, obj_a, free))


def _best_object(value: jax.Array, g: G.Grid, noise: jax.Array) -> jax.Array:
    """Object type (B,) with the highest value (3, B), nearest to the agent among ties."""
    dist = jnp.stack([G.manhattan(g.agent_x, g.agent_y, g.x[s], g.y[s]) for s in range(G.NUM_OBJECTS)])
    score = 100.0 * value.astype(jnp.float32) - dist.astype(jnp.float32) + noise
    return (jnp.argmax(score, axis=0) + 1).astype(jnp.int32)


def _plan_arrangement(g: G.Grid, free: jax.Array, member: jax.Array, cells_of: Callable[[jax.Array], jax.Array],
                      noise: jax.Array) -> _Plan:
    """Shared logic of "line" and "pile" over a family of regions (rows/columns or 2 × 2 blocks).

    Args:
      member: (3, R..., B) bool, object slot s lies on the floor inside region r.
      cells_of: maps a (R..., B) bool selection of regions to the (6, 6, B) mask of their cells.
      noise: (3, B) tie-break noise for the choice of the object to move.
    """
    batch = g.agent_x.shape[0]
    region_axes = tuple(range(1, member.ndim - 1))
    count = member.sum(axis=0)  # (R..., B)
    best = count.max(axis=tuple(a - 1 for a in region_axes))  # (B,)
    carry_target = cells_of(count == best[(None,) * len(region_axes)]) & free
    # With empty hands: move the object whose best region without it holds the most other objects.
    value = jnp.stack([jnp.where(member[s], -1, count).max(axis=tuple(a - 1 for a in region_axes))
                       for s in range(G.NUM_OBJECTS)])  # (3, B)
    pick = _best_object(value, g, noise)
    carrying = g.carried != G.NOTHING
    return _choose(carrying, _plan(carry_target, G.DROP, batch), _plan_pick(g, pick, free))


def _plan_line(g: G.Grid, free: jax.Array, noise: jax.Array) -> _Plan:
    """Three objects sharing a row or a column (regions: 6 rows then 6 columns)."""
    rows = jnp.asarray(_ROWS)[:, None]  # (6, 1)
    floor = [g.carried != obj for obj in G.OBJECTS]
    on_row = jnp.stack([floor[s][None] & (g.y[s][None] == rows) for s in range(G.NUM_OBJECTS)])  # (3, 6, B)
    on_col = jnp.stack([floor[s][None] & (g.x[s][None] == rows) for s in range(G.NUM_OBJECTS)])
    member = jnp.concatenate([on_row, on_col], axis=1)  # (3, 12, B)

    def cells_of(selected: jax.Array) -> jax.Array:  # (12, B) → (6, 6, B)
        return selected[: G.ROOM_SIZE][:, None, :] | selected[G.ROOM_SIZE:][None, :, :]

    return _plan_arrangement(g, free, member, cells_of, noise)


def _plan_pile(g: G.Grid, free: jax.Array, noise: jax.Array) -> _Plan:
    """Three objects inside one 2 × 2 block (regions: the 25 blocks)."""
    bx, by = jnp.asarray(_BLOCK_X)[..., None], jnp.asarray(_BLOCK_Y)[..., None]  # (5, 5, 1)
    member = jnp.stack([
        (g.carried != obj)[None, None] & (g.x[s] >= bx) & (g.x[s] <= bx + 1) & (g.y[s] >= by) & (g.y[s] <= by + 1)
        for s, obj in enumerate(G.OBJECTS)
    ])  # (3, 5, 5, B)

    def cells_of(selected: jax.Array) -> jax.Array:  # (5, 5, B) → (6, 6, B): cells covered by a selected block
        p = jnp.pad(selected, ((1, 1), (1, 1), (0, 0)))
        return p[1:, 1:] | p[:-1, 1:] | p[1:, :-1] | p[:-1, :-1]

    return _plan_arrangement(g, free, member, cells_of, noise)


def plan(g: G.Grid, goal: tasks.Goal, noise: jax.Array) -> _Plan:
    """The expert's current sub-goal for every environment.

    Args:
      g: :class:`grid.Grid` with (B,) fields.
      goal: :class:`tasks.Goal` with (B,) fields.
      noise: (3, B) tie-break noise for the choice of the object to move (line / pile).
    Returns: target mask (6, 6, B) and interaction (B,).
    """
    batch = g.agent_x.shape[0]
    free = _free_cells(g)
    cx, cy = jnp.asarray(_CELL_X)[..., None], jnp.asarray(_CELL_Y)[..., None]  # cell coordinates (6, 6, 1)
    door_open = g.door_state == G.OPEN
    side = _b(goal.side)
    west, east, north, south = cx == G.ROOM_MIN, cx == G.ROOM_MAX, cy == G.ROOM_MIN, cy == G.ROOM_MAX
    walls = jnp.where(side == tasks.SIDE_WEST, west,
                      jnp.where(side == tasks.SIDE_EAST, east,
                                jnp.where(side == tasks.SIDE_NORTH, north,
                                          jnp.where(side == tasks.SIDE_SOUTH, south, west | east | north | south))))
    lo, hi = tasks.CENTRE_CELLS
    centre = jnp.broadcast_to((cx >= lo) & (cx <= hi) & (cy >= lo) & (cy <= hi), free.shape)
    go_to = _plan_go_to(g, goal.object_a, free)
    pick = _plan_pick(g, goal.object_a, free)
    open_ = _plan_open(g)
    key = jnp.full((batch,), G.KEY, jnp.int32)
    plans = (
        go_to,
        open_,
        pick,
        _plan_put(g, goal.object_a, goal.object_b, free),
        _choose(door_open, go_to, open_),
        _choose(door_open, pick, open_),
        _plan(jnp.broadcast_to(walls, free.shape), ARRIVE, batch),
        _plan(centre, ARRIVE, batch),
        _choose(g.carried == G.KEY, open_, _plan_pick(g, key, free)),
        _plan_line(g, free, noise),
        _plan_pile(g, free, noise),
    )
    out = plans[-1]
    for k in range(tasks.NUM_KINDS - 2, -1, -1):
        out = _choose(goal.kind == k, plans[k], out)
    return out


def expert_actions(key: jax.Array, g: G.Grid, goal: jax.Array, config: ExpertConfig = ExpertConfig()) -> jax.Array:
    """Expert actions for a batch of environments.

    Args:
      key: PRNG key.
      g: :class:`grid.Grid` with (B,) fields (the true world).
      goal: (B, GOAL_DIM) int32 goal vectors.
      config: :class:`ExpertConfig`.
    Returns: (B,) int32 actions in [0, 7).
    """
    batch = g.agent_x.shape[0]
    chex.assert_shape(goal, (batch, tasks.GOAL_DIM))
    # One draw of random bits serves every choice (one threefry kernel keeps compilation short).
    bits = jax.random.bits(key, (G.NUM_OBJECTS + len(G.MOVE_ACTIONS) + 2, batch), jnp.uint32)
    uniform = (bits >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # [0, 1)
    fields = tasks.goal_fields(goal)
    obj_noise = config.tie_noise * uniform[: G.NUM_OBJECTS]
    sub = plan(g, fields, obj_noise)
    dist = bfs_distances(sub.mask)
    moves = jnp.asarray(G.MOVE_ACTIONS, jnp.int32)
    neighbour = jnp.stack([
        _read(dist, g.agent_x + G.MOVE_DELTAS[a][0], g.agent_y + G.MOVE_DELTAS[a][1], UNREACHABLE)
        for a in G.MOVE_ACTIONS
    ]).astype(jnp.float32)  # (4, B)
    move_noise = config.tie_noise * uniform[G.NUM_OBJECTS : G.NUM_OBJECTS + len(G.MOVE_ACTIONS)]
    move = moves[jnp.argmin(neighbour + move_noise, axis=0)]
    on_target = _read(sub.mask, g.agent_x, g.agent_y, False)
    greedy = jnp.where(on_target & (sub.act != ARRIVE), sub.act, move)
    random = (bits[-1] % jnp.uint32(G.NUM_ACTIONS)).astype(jnp.int32)
    explore = uniform[-2] < config.epsilon
    return jnp.where(explore, random, greedy).astype(jnp.int32)


Policy = Callable[..., jax.Array]


def make_policy(config: ExpertConfig = ExpertConfig()) -> Policy:
    """The expert as a collection policy ``policy(key, obs, state, params) -> actions (B,)``; it reads
    ``state.grid`` and ``params.goals[state.task]`` (``obs`` is unused)."""

    def policy(key: jax.Array, obs: jax.Array, state: Any, params: Any) -> jax.Array:
        del obs
        return expert_actions(key, state.grid, params.goals[state.task], config)

    return policy


def expert_policy(noise: float = 0.0) -> Policy:
    """The expert as a collection policy (its registry entry): ``noise`` is ε, the probability of
    replacing the expert's action by a uniformly random one."""
    return make_policy(ExpertConfig(epsilon=noise))
