"""BabyAI (one room with a door, a ball, a box and a key) as a pure, gymnax-style JAX environment:
state (17,), Discrete(7) actions, obs (17+E,), 128 steps. The world is :class:`grid.Grid` (17 int32
fields of shape (B,)); reset draws a world that does not already satisfy the goal (:func:`sample_grid`);
reward :func:`tasks.reward_grid`.
"""

from __future__ import annotations

from typing import Final

import chex
import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.envs.base import Encoder, EnvParams, EpisodeState, TaskEnv, make_level_params

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import instructions as instr
from imaginejax.envs.babyai import tasks

ENV_NAME: Final[str] = "babyai"
DEFAULT_RESET_TRIES: Final[int] = 4


@struct.dataclass
class EnvState(EpisodeState):
    """Environment state: the episode fields of :class:`~imaginejax.envs.base.EpisodeState` and the world
    below; every leaf gets a leading (B,) axis in the batched kernels.

    Attributes:
      grid: :class:`grid.Grid`, the world (17 int32 fields).
    """

    grid: G.Grid


def make_params(level: str, *, embed: Encoder | None = None, reset_tries: int = DEFAULT_RESET_TRIES) -> EnvParams:
    """The :class:`EnvParams` of a level (:data:`tasks.LEVELS`); ``embed`` as in
    :func:`~imaginejax.envs.base.make_level_params`; ``reset_tries`` object layouts are drawn at reset."""
    return make_level_params(level, tasks.level_goals(level), instr.level_instruction_table(level),
                             tasks.level_max_steps(level), embed=embed, reset_tries=reset_tries)


def _draw_phrasing(keys: jax.Array, counts: jax.Array) -> jax.Array:
    """BabyAI's phrasing draw: keys (B,), counts (B,) -> (B,) int32 in [0, count), from 32 random bits."""
    bits = jax.vmap(lambda k: jax.random.bits(k, (), jnp.uint32))(keys)
    return (bits % counts.astype(jnp.uint32)).astype(jnp.int32)  # bias < 1e-8 for P <= 40


# ---------------------------------------------------------------------------------------------------
# Initial worlds
# ---------------------------------------------------------------------------------------------------
def sample_grid(key: jax.Array, goal: jax.Array, tries: int = DEFAULT_RESET_TRIES) -> G.Grid:
    """One initial world for a goal: colours uniform except those the goal names, the door locked / closed
    / either as the task needs, objects on distinct cells, the agent on an object-free cell; among ``tries``
    object layouts × 36 agent cells a uniform candidate not already satisfying the goal (else the first).

    Args:
      key: PRNG key.
      goal: (G,) int32 goal vector.
      tries: object layouts drawn.
    Returns: :class:`grid.Grid` with () fields.
    """
    # One draw of random bits serves every choice (one threefry kernel keeps compilation short).
    n_cells = tries * G.NUM_CELLS
    bits = jax.random.bits(key, (6 + 2 * n_cells,), jnp.uint32)
    uniform = lambda b: (b >> 8).astype(jnp.float32) * (1.0 / (1 << 24))  # noqa: E731  [0, 1)
    below = lambda b, n: (b % jnp.uint32(n)).astype(jnp.int32)  # noqa: E731  bias < 2e-9 for n <= 6
    g = tasks.goal_fields(goal)
    colours = below(bits[:4], G.NUM_COLOURS)
    uses_a = tasks.is_kind(g.kind, tasks.KINDS_WITH_OBJECT_A) & (g.colour_a != tasks.ANY_COLOUR)
    uses_b = tasks.is_kind(g.kind, tasks.KINDS_WITH_OBJECT_B) & (g.colour_b != tasks.ANY_COLOUR)
    uses_door = tasks.is_kind(g.kind, tasks.KINDS_WITH_DOOR) & (g.door_colour != tasks.ANY_COLOUR)
    door_colour = jnp.where(uses_door, g.door_colour, colours[3])
    unlock = g.kind == tasks.KIND_UNLOCK
    obj_colour = []
    for s, obj in enumerate(G.OBJECTS):
        c = jnp.where(uses_b & (g.object_b == obj), g.colour_b, colours[s])
        c = jnp.where(uses_a & (g.object_a == obj), g.colour_a, c)
        if obj == G.KEY:
            c = jnp.where(unlock, door_colour, c)
        obj_colour.append(c)
    door_y = G.ROOM_MIN + below(bits[4], G.ROOM_SIZE)
    coin = (bits[5] & jnp.uint32(1)) == 1
    needs_closed = tasks.is_kind(g.kind, (tasks.KIND_OPEN, tasks.KIND_OPEN_GO_TO, tasks.KIND_OPEN_PICK_UP))
    door_state = jnp.where(unlock, G.LOCKED, jnp.where(needs_closed | coin, G.CLOSED, G.OPEN)).astype(jnp.int32)

    # tries × 3 distinct object cells, combined with every agent cell.
    cell_noise = uniform(bits[6 : 6 + n_cells]).reshape(tries, G.NUM_CELLS)
    _, cells = jax.lax.top_k(cell_noise, G.NUM_OBJECTS)  # (R, 3) distinct cells
    obj_x = (cells % G.ROOM_SIZE + G.ROOM_MIN)[:, :, None]  # (R, 3, 1)
    obj_y = (cells // G.ROOM_SIZE + G.ROOM_MIN)[:, :, None]
    agent = jnp.arange(G.NUM_CELLS, dtype=jnp.int32)
    agent_x = (agent % G.ROOM_SIZE + G.ROOM_MIN)[None, :]  # (1, 36)
    agent_y = (agent // G.ROOM_SIZE + G.ROOM_MIN)[None, :]
    shape = (tries, G.NUM_CELLS)
    full = lambda v: jnp.broadcast_to(jnp.asarray(v, jnp.int32), shape)  # noqa: E731
    candidates = G.Grid(
        colour=tuple(full(c) for c in obj_colour),  # type: ignore[arg-type]
        x=tuple(full(obj_x[:, s]) for s in range(G.NUM_OBJECTS)),  # type: ignore[arg-type]
        y=tuple(full(obj_y[:, s]) for s in range(G.NUM_OBJECTS)),  # type: ignore[arg-type]
        door_colour=full(door_colour),
        door_x=full(G.DOOR_X),
        door_y=full(door_y),
        door_state=full(door_state),
        agent_x=full(agent_x),
        agent_y=full(agent_y),
        carried=full(G.NOTHING),
        carried_colour=full(0),
    )
    on_object = jnp.any((obj_x == agent_x[:, None]) & (obj_y == agent_y[:, None]), axis=1)  # (R, 36)
    valid = ~on_object & ~tasks.success_grid(candidates, g)
    score = jnp.where(valid, uniform(bits[6 + n_cells :]).reshape(shape), -1.0)
    pick = jnp.argmax(score.reshape(-1))
    layout, cell = pick // G.NUM_CELLS, pick % G.NUM_CELLS
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return G.Grid(
        colour=tuple(i32(c) for c in obj_colour),  # type: ignore[arg-type]
        x=tuple(obj_x[layout, s, 0] for s in range(G.NUM_OBJECTS)),  # type: ignore[arg-type]
        y=tuple(obj_y[layout, s, 0] for s in range(G.NUM_OBJECTS)),  # type: ignore[arg-type]
        door_colour=i32(door_colour),
        door_x=i32(G.DOOR_X),
        door_y=door_y,
        door_state=door_state,
        agent_x=(cell % G.ROOM_SIZE + G.ROOM_MIN).astype(jnp.int32),
        agent_y=(cell // G.ROOM_SIZE + G.ROOM_MIN).astype(jnp.int32),
        carried=i32(G.NOTHING),
        carried_colour=i32(0),
    )


class BabyAI(TaskEnv, tasks=tasks, instructions=instr.__name__, make_params=make_params):
    """BabyAI single room: Discrete(7) absolute actions, language-conditioned goals. Stateless; the level
    lives in :class:`EnvParams`; the predicates and metadata come from :mod:`.tasks` (:class:`~imaginejax.envs.base.TaskEnv`)."""

    name: Final[str] = ENV_NAME
    num_actions: Final[int] = tasks.NUM_ACTIONS
    discrete: Final[bool] = True

    # ------------------------------------------------------------------ views
    @staticmethod
    def state_vector(state: EnvState) -> jax.Array:
        """State(s) → (..., 17) float32 state vectors."""
        return G.to_vector(state.grid)

    # ------------------------------------------------------------------ batched kernels
    def reset_to_task_batch(
        self, keys: jax.Array, params: EnvParams, task: jax.Array, phrasing: jax.Array | None = None
    ) -> tuple[jax.Array, EnvState]:
        """Resets B environments to given tasks (:meth:`TaskEnv.reset_to_task_batch`): obs (B, 17+E), state."""
        key_world = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
        task, instruction = self.task_instruction(keys, params, task, phrasing, draw=_draw_phrasing)
        goals = params.goals[task]
        grid = jax.vmap(lambda k, g: sample_grid(k, g, params.reset_tries))(key_world, goals)
        state = EnvState(grid=grid, **self.episode_start(task, instruction))
        return self.observation_batch(state, params), state

    def reset_batch(self, keys: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        """Resets B environments with uniformly sampled tasks: keys (B,) → obs (B, 17+E), state."""
        bits = jax.vmap(lambda k: jax.random.bits(jax.random.fold_in(k, 2), (), jnp.uint32))(keys)
        task = (bits % jnp.uint32(params.num_tasks)).astype(jnp.int32)  # bias < 1e-7 for K <= 78
        return self.reset_to_task_batch(keys, params, task)

    def step_batch(
        self, keys: jax.Array, state: EnvState, action: jax.Array, params: EnvParams
    ) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, jax.Array]]:
        """Steps B environments (:meth:`TaskEnv.step_batch`): action (B,) int32 in [0, 7); the keys are unused
        (deterministic dynamics); obs (B, 17+E)."""
        del keys
        batch = state.t.shape[0]
        action = jnp.asarray(action, jnp.int32)
        chex.assert_shape(action, (batch,))
        active = ~state.done
        moved = G.step(state.grid, action)
        grid = jax.tree.map(lambda new, old: jnp.where(active, new, old), moved, state.grid)
        goal = tasks.goal_fields(params.goals[state.task])
        t = state.t + active.astype(jnp.int32)
        succeeded = tasks.success_grid(grid, goal) & active
        reward = tasks.reward_grid(state.grid, grid, goal, t, params.max_steps)
        reward = jnp.where(active, reward, 0.0).astype(jnp.float32)
        done, success, info = self.episode_flags(state, succeeded, t, params)
        next_state = state.replace(grid=grid, t=t, done=done, success=success)
        return self.observation_batch(next_state, params), next_state, reward, done, info
