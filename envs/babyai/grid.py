"""BabyAI single room: the world, its 17-d state encoding and the action semantics (plain JAX).

An 8 × 8 grid in minigrid's coordinates (x east, y south); the agent stays in the 6 × 6 interior
``x, y ∈ [1, 6]``; one door in the east wall (x = 7); one ball, box and key. Walls and the door (in every
state) block, objects do not. State vector (..., 17), integral values::

    0 ball colour   1 ball x   2 ball y
    3 box colour    4 box x    5 box y
    6 key colour    7 key x    8 key y
    9 door colour  10 door x  11 door y  12 door state
   13 agent x      14 agent y
   15 carried type 16 carried colour

Colours 0 red, 1 green, 2 blue, 3 purple, 4 yellow, 5 grey; types 0 nothing, 1 ball, 2 box, 3 key; door 0
open, 1 closed, 2 locked; a carried object reads (0, 0). Actions (Discrete(7), absolute): 0 west, 1 east,
2 north, 6 south (step if the target cell is interior), 3 pick up (own cell, empty hands), 4 drop (own
cell, if free), 5 toggle the door from (6, door y) (open ↔ closed; locked → open only with the key of
its colour); any other value is a no-op. Every rule is elementwise on :class:`Grid`'s fields, so the
step vectorises along the batch. The rules' reasons: docs/envs.md, "BabyAI".
"""

from __future__ import annotations

from typing import Final

import jax
import jax.numpy as jnp
from flax import struct

# ---------------------------------------------------------------------------------------------------
# Encodings
# ---------------------------------------------------------------------------------------------------
GRID_SIZE: Final[int] = 8
ROOM_MIN: Final[int] = 1  # interior cells are ROOM_MIN..ROOM_MAX in x and y
ROOM_MAX: Final[int] = 6
ROOM_SIZE: Final[int] = ROOM_MAX - ROOM_MIN + 1
NUM_CELLS: Final[int] = ROOM_SIZE * ROOM_SIZE
DOOR_X: Final[int] = GRID_SIZE - 1  # the door is in the east wall

COLOURS: Final[tuple[str, ...]] = ("red", "green", "blue", "purple", "yellow", "grey")
NUM_COLOURS: Final[int] = len(COLOURS)
RED, GREEN, BLUE, PURPLE, YELLOW, GREY = range(NUM_COLOURS)

NOTHING, BALL, BOX, KEY = 0, 1, 2, 3
OBJECT_NAMES: Final[tuple[str, ...]] = ("nothing", "ball", "box", "key")
OBJECTS: Final[tuple[int, ...]] = (BALL, BOX, KEY)
NUM_OBJECTS: Final[int] = len(OBJECTS)

OPEN, CLOSED, LOCKED = 0, 1, 2
DOOR_STATE_NAMES: Final[tuple[str, ...]] = ("open", "closed", "locked")

WEST, EAST, NORTH, PICKUP, DROP, TOGGLE, SOUTH = 0, 1, 2, 3, 4, 5, 6
NUM_ACTIONS: Final[int] = 7
ACTION_NAMES: Final[tuple[str, ...]] = ("west", "east", "north", "pickup", "drop", "toggle", "south")
MOVE_ACTIONS: Final[tuple[int, ...]] = (WEST, EAST, NORTH, SOUTH)
MOVE_DELTAS: Final[dict[int, tuple[int, int]]] = {WEST: (-1, 0), EAST: (1, 0), NORTH: (0, -1), SOUTH: (0, 1)}

# State-vector indices.
BALL_COLOUR, BALL_X, BALL_Y = 0, 1, 2
BOX_COLOUR, BOX_X, BOX_Y = 3, 4, 5
KEY_COLOUR, KEY_X, KEY_Y = 6, 7, 8
DOOR_COLOUR, DOOR_X_INDEX, DOOR_Y, DOOR_STATE = 9, 10, 11, 12
AGENT_X, AGENT_Y = 13, 14
CARRIED_TYPE, CARRIED_COLOUR = 15, 16
STATE_DIM: Final[int] = 17
FIELD_NAMES: Final[tuple[str, ...]] = (
    "ball colour", "ball x", "ball y",
    "box colour", "box x", "box y",
    "key colour", "key x", "key y",
    "door colour", "door x", "door y", "door state",
    "agent x", "agent y",
    "carried type", "carried colour",
)


@struct.dataclass
class Grid:
    """The world state as 17 int32 fields of one common shape ``(...)`` (``()`` for one environment,
    ``(B,)`` in the batched kernels).

    Attributes:
      colour: per object slot (ball, box, key), its colour index.
      x, y: per object slot, its cell; (0, 0) while carried.
      door_colour, door_x, door_y, door_state: the door (door_x is 7).
      agent_x, agent_y: the agent's cell, always in the interior.
      carried: type of the carried object (0 nothing, 1 ball, 2 box, 3 key).
      carried_colour: its colour (0 when nothing is carried).
    """

    colour: tuple[jax.Array, jax.Array, jax.Array]
    x: tuple[jax.Array, jax.Array, jax.Array]
    y: tuple[jax.Array, jax.Array, jax.Array]
    door_colour: jax.Array
    door_x: jax.Array
    door_y: jax.Array
    door_state: jax.Array
    agent_x: jax.Array
    agent_y: jax.Array
    carried: jax.Array
    carried_colour: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.agent_x.shape)


def from_vector(state: jax.Array) -> Grid:
    """(..., 17) state vectors (float or int) → :class:`Grid` of int32 fields (...). Values are rounded."""
    state = jnp.asarray(state)
    if state.ndim == 0 or state.shape[-1] != STATE_DIM:
        raise ValueError(f"BabyAI state vectors have {STATE_DIM} entries, got shape {state.shape}")
    v = jnp.round(state).astype(jnp.int32) if jnp.issubdtype(state.dtype, jnp.floating) else state.astype(jnp.int32)
    f = [v[..., i] for i in range(STATE_DIM)]
    return Grid(
        colour=(f[BALL_COLOUR], f[BOX_COLOUR], f[KEY_COLOUR]),
        x=(f[BALL_X], f[BOX_X], f[KEY_X]),
        y=(f[BALL_Y], f[BOX_Y], f[KEY_Y]),
        door_colour=f[DOOR_COLOUR],
        door_x=f[DOOR_X_INDEX],
        door_y=f[DOOR_Y],
        door_state=f[DOOR_STATE],
        agent_x=f[AGENT_X],
        agent_y=f[AGENT_Y],
        carried=f[CARRIED_TYPE],
        carried_colour=f[CARRIED_COLOUR],
    )


def to_vector(grid: Grid, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """:class:`Grid` with fields (...) → (..., 17) state vectors of ``dtype``."""
    fields = (
        grid.colour[0], grid.x[0], grid.y[0],
        grid.colour[1], grid.x[1], grid.y[1],
        grid.colour[2], grid.x[2], grid.y[2],
        grid.door_colour, grid.door_x, grid.door_y, grid.door_state,
        grid.agent_x, grid.agent_y,
        grid.carried, grid.carried_colour,
    )
    shape = jnp.broadcast_shapes(*(jnp.shape(f) for f in fields))
    return jnp.stack([jnp.broadcast_to(f, shape) for f in fields], axis=-1).astype(dtype)


def make_grid(
    *,
    ball: tuple[int, int, int],
    box: tuple[int, int, int],
    key: tuple[int, int, int],
    door: tuple[int, int, int],
    agent: tuple[int, int],
    carried: tuple[int, int] = (NOTHING, 0),
) -> Grid:
    """A single-environment :class:`Grid` from Python ints (for tests and examples).

    Args:
      ball, box, key: (colour, x, y) each; use (colour, 0, 0) for the carried object.
      door: (colour, y, state); the door's x is 7.
      agent: (x, y).
      carried: (type, colour) of the carried object.
    """
    i = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return Grid(
        colour=(i(ball[0]), i(box[0]), i(key[0])),
        x=(i(ball[1]), i(box[1]), i(key[1])),
        y=(i(ball[2]), i(box[2]), i(key[2])),
        door_colour=i(door[0]),
        door_x=i(DOOR_X),
        door_y=i(door[1]),
        door_state=i(door[2]),
        agent_x=i(agent[0]),
        agent_y=i(agent[1]),
        carried=i(carried[0]),
        carried_colour=i(carried[1]),
    )


# ---------------------------------------------------------------------------------------------------
# Elementwise helpers (all broadcast over "...")
# ---------------------------------------------------------------------------------------------------
def select_object(values: tuple[jax.Array, jax.Array, jax.Array], obj: jax.Array) -> jax.Array:
    """The field of object type ``obj`` (1 ball, 2 box, 3 key; 0 → 0): values 3 × (...), obj (...) → (...).

    A chain of selects rather than a gather, so it stays elementwise (and vectorises) in the batch.
    """
    zero = jnp.zeros_like(values[0])
    return jnp.where(obj == BALL, values[0], jnp.where(obj == BOX, values[1], jnp.where(obj == KEY, values[2], zero)))


def in_room(x: jax.Array, y: jax.Array) -> jax.Array:
    """Whether cell (x, y) is in the 6 × 6 interior: (...) → (...) bool."""
    return (x >= ROOM_MIN) & (x <= ROOM_MAX) & (y >= ROOM_MIN) & (y <= ROOM_MAX)


def manhattan(x0: jax.Array, y0: jax.Array, x1: jax.Array, y1: jax.Array) -> jax.Array:
    """|x0 - x1| + |y0 - y1| (...)."""
    return jnp.abs(x0 - x1) + jnp.abs(y0 - y1)


def objects_at(grid: Grid, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per object slot, whether it lies on cell (x, y): 3 × (...) bool. Carried objects read (0, 0), so
    they are never on an interior cell."""
    return tuple((grid.x[o] == x) & (grid.y[o] == y) for o in range(NUM_OBJECTS))  # type: ignore[return-value]


def effective_position(grid: Grid, slot: int) -> tuple[jax.Array, jax.Array]:
    """Where object ``slot`` (0 ball, 1 box, 2 key) physically is: its cell, or the agent's cell while it is
    carried. (...) each."""
    held = grid.carried == OBJECTS[slot]
    return jnp.where(held, grid.agent_x, grid.x[slot]), jnp.where(held, grid.agent_y, grid.y[slot])


# ---------------------------------------------------------------------------------------------------
# Dynamics
# ---------------------------------------------------------------------------------------------------
def step(grid: Grid, action: jax.Array) -> Grid:
    """One transition of the world (elementwise; the rules in the module docstring).

    Args:
      grid: :class:`Grid` with fields (...).
      action: (...) int in [0, 7).
    Returns: the next :class:`Grid`, fields (...).
    """
    action = jnp.asarray(action, jnp.int32)
    ax, ay = grid.agent_x, grid.agent_y

    # Moves: face and step if the target cell is in the interior (walls and the door block).
    dx = jnp.where(action == WEST, -1, jnp.where(action == EAST, 1, 0))
    dy = jnp.where(action == NORTH, -1, jnp.where(action == SOUTH, 1, 0))
    tx, ty = ax + dx, ay + dy
    can_move = in_room(tx, ty)
    new_ax = jnp.where(can_move, tx, ax)
    new_ay = jnp.where(can_move, ty, ay)

    here = objects_at(grid, ax, ay)
    any_here = here[0] | here[1] | here[2]
    empty_hands = grid.carried == NOTHING

    # Pick up the (first) object on the own cell with empty hands.
    pick_base = (action == PICKUP) & empty_hands
    pick = (pick_base & here[0], pick_base & here[1] & ~here[0], pick_base & here[2] & ~here[0] & ~here[1])
    picked_type = jnp.where(pick[0], BALL, jnp.where(pick[1], BOX, jnp.where(pick[2], KEY, NOTHING)))
    picked_colour = jnp.where(pick[0], grid.colour[0], jnp.where(pick[1], grid.colour[1], grid.colour[2]))
    any_pick = pick[0] | pick[1] | pick[2]

    # Drop the carried object onto the own cell if no object lies there.
    can_drop = (action == DROP) & ~empty_hands & ~any_here
    drop = tuple(can_drop & (grid.carried == OBJECTS[o]) for o in range(NUM_OBJECTS))

    new_x = tuple(jnp.where(pick[o], 0, jnp.where(drop[o], ax, grid.x[o])) for o in range(NUM_OBJECTS))
    new_y = tuple(jnp.where(pick[o], 0, jnp.where(drop[o], ay, grid.y[o])) for o in range(NUM_OBJECTS))
    carried = jnp.where(any_pick, picked_type, jnp.where(can_drop, NOTHING, grid.carried))
    carried_colour = jnp.where(any_pick, picked_colour, jnp.where(can_drop, 0, grid.carried_colour))

    # Toggle the door in the 4-neighbourhood.
    adjacent = manhattan(ax, ay, grid.door_x, grid.door_y) == 1
    toggle = (action == TOGGLE) & adjacent
    has_key = (grid.carried == KEY) & (grid.carried_colour == grid.door_colour)
    opens = (grid.door_state == CLOSED) | ((grid.door_state == LOCKED) & has_key)
    closes = grid.door_state == OPEN
    door_state = jnp.where(toggle & opens, OPEN, jnp.where(toggle & closes, CLOSED, grid.door_state))

    return grid.replace(
        x=new_x,
        y=new_y,
        door_state=door_state.astype(jnp.int32),
        agent_x=new_ax.astype(jnp.int32),
        agent_y=new_ay.astype(jnp.int32),
        carried=carried.astype(jnp.int32),
        carried_colour=carried_colour.astype(jnp.int32),
    )


def step_vector(state: jax.Array, action: jax.Array) -> jax.Array:
    """:func:`step` on state vectors: (..., 17) float, (...) int → (..., 17) float32 (for the imaginer's
    transition checks and for tests)."""
    return to_vector(step(from_vector(state), action))
