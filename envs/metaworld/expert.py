"""Scripted experts for every Meta-World task, in JAX, from the 91-d state alone: memoryless state
machines whose phase is read off the state, built from the primitives move (``_act``: Δ = clip(gain ·
(waypoint - hand), -1, 1)), grasp and carry (``_grasp_then``), press (``_press_y``, ``_lock_turn``) and pull
(``_pull_round``, ``_slide_x``). ``expert_action(state, task)`` computes every task's action and selects
the row's own, so one compiled policy serves a mixed batch. Design and success rates: docs/envs.md.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from imaginejax.envs.metaworld import tasks
from imaginejax.envs.metaworld.tasks import TASK_INDEX, TCP_OFFSET, slot_of

__all__ = ["expert_action", "expert_policy"]

OPEN, CLOSE = -1.0, 1.0


def _move(hand: jax.Array, to: jax.Array, gain: float | jax.Array) -> jax.Array:
    return jnp.clip(gain * (to - hand), -1.0, 1.0)


def _act(hand: jax.Array, to: jax.Array, gain: float | jax.Array, grip: jax.Array | float) -> jax.Array:
    grip = jnp.broadcast_to(jnp.asarray(grip, hand.dtype), hand.shape[:-1])
    return jnp.concatenate([_move(hand, to, gain), grip[..., None]], -1)


def _point(x: jax.Array, y: jax.Array, z: float | jax.Array) -> jax.Array:
    """Waypoint (..., 3) from coordinates x, y (...) and a height z (scalar or (...))."""
    return jnp.stack([x, y, jnp.broadcast_to(jnp.asarray(z, x.dtype), x.shape)], -1)


def _xy(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.linalg.norm(a[..., :2] - b[..., :2], axis=-1)


def _sel(cond: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(cond[..., None], a, b)


def _v(*xs: float) -> jax.Array:
    return jnp.asarray(xs, jnp.float32)


_TCP = jnp.asarray(TCP_OFFSET, jnp.float32)


# ------------------------------------------------------------------------------------------------ tasks
def _reach(s: jax.Array) -> jax.Array:
    hand, target = s[..., 0:3], s[..., 4:7]
    return _act(hand, target - _TCP, 12.0, OPEN)


def _reach_wall(s: jax.Array) -> jax.Array:
    """Climb over the wall (y ≈ 0.75, 0.12 high) when below its top in its band, then go to the goal."""
    hand, target = s[..., 0:3], s[..., 4:7]
    wall = slot_of(s, "wall")[..., 0:3]
    in_band = (hand[..., 1] < wall[..., 1] + 0.06) & (target[..., 1] > wall[..., 1])
    low = hand[..., 2] < 0.26
    over = jnp.stack([hand[..., 0], hand[..., 1], jnp.full_like(hand[..., 0], 0.32)], -1)
    way = _sel(in_band & low, over, _sel(in_band, jnp.stack([target[..., 0], target[..., 1] + 0.0, jnp.full_like(hand[..., 0], 0.32)], -1), target - _TCP))
    way = _sel(in_band & ~low & (_xy(hand, target) < 0.03), target - _TCP, way)
    return _act(hand, way, 12.0, OPEN)


def _grasp_then(s: jax.Array, obj: jax.Array, goal: jax.Array, *, lift_first: float, gain: float,
                above: float = 0.12, cone: float = 0.0, held_opening: float = 0.6) -> jax.Array:
    """Grasp ``obj`` from above, then carry it to ``goal`` (first raising it to ``lift_first`` if > 0).

    The hand goes to ``above`` over the object (with ``cone`` > 0: to ``cone`` times its horizontal distance
    over it, at most ``above``, so that it descends while closing in), down to the grip height, closes, and
    carries once the gripper is closed on the object (opening below ``held_opening``)."""
    hand, opening = s[..., 0:3], s[..., 3]
    grip_at = obj + _v(0.0, 0.0, 0.045 - 0.02)  # the fingertips (tcp) 2 cm below the object's top
    dist = _xy(hand, grip_at)
    far = dist > 0.015
    high = hand[..., 2] - grip_at[..., 2] > 0.012
    holding = (~far) & (~high) & (opening < held_opening)
    lifted = obj[..., 2] > lift_first
    lift_to = jnp.stack([hand[..., 0], hand[..., 1], jnp.full_like(hand[..., 0], lift_first + 0.06)], -1)
    carry_to = _sel(lifted | (lift_first <= 0), goal - _TCP + _v(0.0, 0.0, 0.02), lift_to)
    height = jnp.minimum(above, cone * dist) if cone > 0 else jnp.full_like(dist, above)
    over = grip_at + jnp.concatenate([jnp.zeros_like(grip_at[..., :2]), height[..., None]], -1)
    way = _sel(far, over, _sel(high, grip_at, _sel(holding, carry_to, hand)))
    grip = jnp.where(far | (hand[..., 2] - grip_at[..., 2] > 0.04), OPEN, CLOSE)
    return _act(hand, way, gain, grip)


def _pick_place(s: jax.Array) -> jax.Array:
    obj = slot_of(s, "target_object")[..., 0:3]
    return _grasp_then(s, obj, s[..., 4:7], lift_first=0.0, gain=10.0)


def _pick_place_wall(s: jax.Array) -> jax.Array:
    """Grasp, lift above the wall, carry over it at that height, and only then lower onto the goal."""
    obj = slot_of(s, "target_object")[..., 0:3]
    wall = slot_of(s, "wall")[..., 0:3]
    goal = s[..., 4:7]
    over = jnp.stack([goal[..., 0], goal[..., 1], jnp.maximum(goal[..., 2], 0.2)], -1)
    # the lift applies only until the object is past the wall (lowering onto a low goal must not re-lift it)
    before_wall = obj[..., 1] < wall[..., 1] + 0.06
    return _sel(before_wall, _grasp_then(s, obj, over, lift_first=0.16, gain=25.0, cone=1.5),
                _grasp_then(s, obj, goal, lift_first=0.0, gain=25.0, cone=1.5))


def _push(s: jax.Array) -> jax.Array:
    """Grasp the puck and slide it along the table to the goal (the goal is at the puck's resting height)."""
    obj = slot_of(s, "target_object")[..., 0:3]
    return _grasp_then(s, obj, s[..., 4:7] - _v(0.0, 0.0, 0.02), lift_first=0.0, gain=10.0)


def _push_wall(s: jax.Array) -> jax.Array:
    """Carry the puck (held, just off the table) around the wall's left end, then to the goal."""
    hand = s[..., 0:3]
    obj = slot_of(s, "target_object")[..., 0:3]
    wall = slot_of(s, "wall")[..., 0:3]
    goal = s[..., 4:7]
    before_wall = obj[..., 1] < wall[..., 1] + 0.04
    left_of_wall = obj[..., 0] < wall[..., 0] - 0.17
    table = goal[..., 2] - 0.02  # carry with the fingertips just above the table (the goal is at puck height)
    detour = jnp.stack([wall[..., 0] - 0.2, obj[..., 1], table], -1)
    past = jnp.stack([wall[..., 0] - 0.2, wall[..., 1] + 0.08, table], -1)
    dest = _sel(before_wall, _sel(left_of_wall, past, detour), jnp.stack([goal[..., 0], goal[..., 1], table], -1))
    del hand
    return _grasp_then(s, obj, dest, lift_first=0.0, gain=10.0)


def _press_y(s: jax.Array, button: jax.Array, depth: float, gain: float, z_offset: float,
             grip: float = CLOSE, backoff: float = 0.06) -> jax.Array:
    """Align x and z with a button facing -y (standing ``backoff`` in front of it), then push it along +y
    (``grip`` while pressing)."""
    hand = s[..., 0:3]
    aim = button + _v(0.0, 0.0, z_offset)
    aligned = jnp.linalg.norm((hand - aim)[..., ::2], axis=-1) < 0.02
    back = jnp.stack([aim[..., 0], jnp.minimum(hand[..., 1], aim[..., 1] - backoff), aim[..., 2]], -1)
    way = _sel(aligned, aim + _v(0.0, depth, 0.0), back)
    return _act(hand, way, gain, jnp.where(aligned, grip, CLOSE))


def _button_press(s: jax.Array) -> jax.Array:
    return _press_y(s, slot_of(s, "button")[..., 0:3], 0.12, 20.0, -0.06)


def _button_press_wall(s: jax.Array) -> jax.Array:
    """Over the wall (y 0.6, in front of the box), down in front of the button, then press."""
    hand = s[..., 0:3]
    button = slot_of(s, "button")[..., 0:3]
    wall = slot_of(s, "wall")[..., 0:3]
    aim = button + _v(0.0, 0.0, 0.04)  # press with the fingertips: the arm stays above the wall
    behind_wall = hand[..., 1] > wall[..., 1] + 0.02
    above = hand[..., 2] > 0.26
    over = jnp.stack([aim[..., 0], hand[..., 1], jnp.full_like(hand[..., 0], 0.3)], -1)
    cross = jnp.stack([aim[..., 0], jnp.maximum(aim[..., 1] - 0.05, wall[..., 1] + 0.04), jnp.full_like(hand[..., 0], 0.3)], -1)
    # the open front finger reaches 5 cm further; stand only 2.5 cm in front of the button (behind the wall)
    press = _press_y(s, button, 0.12, 20.0, 0.04, OPEN, backoff=0.025)
    way = _sel(behind_wall, aim, _sel(above, cross, over))
    far_action = _act(hand, way, 20.0, CLOSE)
    return _sel(behind_wall, press, far_action)


def _coffee_button(s: jax.Array) -> jax.Array:
    return _press_y(s, slot_of(s, "coffee_button")[..., 0:3], 0.15, 12.0, -0.06)


def _lock_turn(s: jax.Array, lock: jax.Array, start: jax.Array, push: jax.Array) -> jax.Array:
    """Bring the hand to ``lock + start`` (coming from the front at that height), then push by ``push``."""
    hand = s[..., 0:3]
    at = lock + start
    front = at + _v(0.0, -0.06, 0.0)  # line up in front of the lever, clear of it, then step in
    in_front = hand[..., 1] < at[..., 1] - 0.03
    aligned = (jnp.abs(hand[..., 0] - at[..., 0]) < 0.015) & (jnp.abs(hand[..., 2] - at[..., 2]) < 0.015)
    engaged = ~in_front & (jnp.abs(hand[..., 2] - at[..., 2]) < 0.025) & (hand[..., 0] > at[..., 0] - 0.02)
    way = _sel(engaged, at + push, _sel(aligned | ~in_front, at, front))
    return _act(hand, way, 25.0, CLOSE)


def _door_unlock(s: jax.Array) -> jax.Array:
    lock = slot_of(s, "lock")[..., 0:3]
    return _lock_turn(s, lock, _v(-0.04, -0.02, -0.03), _v(0.12, 0.0, 0.01))


def _door_lock(s: jax.Array) -> jax.Array:
    """Come down onto the lever's tip from above, then push it down and back."""
    hand = s[..., 0:3]
    lock = slot_of(s, "lock")[..., 0:3]
    at = lock + _v(-0.02, -0.02, 0.0)
    near = _xy(hand, at) < 0.02
    level = jnp.abs(hand[..., 2] - at[..., 2]) < 0.02
    below = hand[..., 2] < at[..., 2] + 0.05
    rise = jnp.stack([hand[..., 0], hand[..., 1], at[..., 2] + 0.08], -1)
    way = _sel(near, _sel(level | (hand[..., 2] < at[..., 2]), at + _v(-0.06, 0.0, -0.2), at),
               _sel(below, rise, at + _v(0.0, 0.0, 0.06)))
    return _act(hand, way, 25.0, CLOSE)


# Door geometry (Meta-World's door scenes): the hinge is 0.115 in x and 0.35 in y from the goal of the
# handle; the closed handle (its mesh centre) is at goal + (0.4907, 0.2429).
_HINGE_FROM_GOAL = (0.115, 0.35, 0.0)
_HANDLE_CLOSED_FROM_GOAL = (0.4907, 0.2429, 0.0)


def _rot(xy: jax.Array, angle: jax.Array) -> jax.Array:
    c, sn = jnp.cos(angle), jnp.sin(angle)
    return jnp.stack([c * xy[..., 0] - sn * xy[..., 1], sn * xy[..., 0] + c * xy[..., 1]], -1)


def _pull_round(hand: jax.Array, hinge: jax.Array, radius: float | jax.Array, z: jax.Array) -> jax.Array:
    """The **pull** primitive on a hinge: the waypoint (..., 3) 10 cm ahead of the hand along the clockwise
    (opening) tangent round ``hinge`` (..., 3), corrected half-way back to ``radius`` from it, at height
    ``z`` (..., 1)."""
    r = (hand - hinge)[..., :2]
    dist = jnp.linalg.norm(r, axis=-1, keepdims=True)
    unit = r / jnp.maximum(dist, 1e-6)
    tangent = jnp.stack([unit[..., 1], -unit[..., 0]], -1)
    return jnp.concatenate([hand[..., :2] + 0.1 * tangent + 0.5 * (radius - dist) * unit, z], -1)


def _door_open(s: jax.Array) -> jax.Array:
    """Put the closed gripper between the handle's bar and the door, just outside the bar's stem (0.36 from
    the hinge, so the hand stays inside its y bound at 80° open), then push the bar round the hinge along the
    clockwise tangent at that radius; worked out in the door's frame (its angle from the handle's position).
    """
    hand = s[..., 0:3]
    handle = slot_of(s, "handle")[..., 0:3]
    goal = s[..., 4:7]
    hinge = goal + _v(*_HINGE_FROM_GOAL)
    closed = goal + _v(*_HANDLE_CLOSED_FROM_GOAL)
    h0, h1 = (closed - hinge)[..., :2], (handle - hinge)[..., :2]
    angle = jnp.arctan2(h1[..., 1], h1[..., 0]) - jnp.arctan2(h0[..., 1], h0[..., 0])  # <= 0 when opening
    z = handle[..., 2:3]
    slot_door = jnp.broadcast_to(_v(0.356, -0.07), h0.shape)
    slot = jnp.concatenate([hinge[..., :2] + _rot(slot_door, angle), z], -1)
    near_slot = _xy(hand, slot) < 0.03
    at_slot = near_slot & (jnp.abs(hand[..., 2] - slot[..., 2]) < 0.02)
    q = _rot((hand - hinge)[..., :2], -angle)  # the hand in the door's frame
    pull = _pull_round(hand, hinge, jnp.linalg.norm(slot_door, axis=-1, keepdims=True), z)
    # keep pulling while the hand stays in the slot (the slot moves with the door)
    pulling = at_slot | ((_xy(hand, slot) < 0.045) & (jnp.abs(hand[..., 2] - z[..., 0]) < 0.03) & (q[..., 1] < 0.0))
    way = _sel(pulling, pull, _sel(near_slot, slot, slot + _v(0.0, 0.0, 0.07)))
    return _act(hand, way, 25.0, CLOSE)


def _door_close(s: jax.Array) -> jax.Array:
    """Go round the open door's outer face and push it shut towards the goal."""
    hand = s[..., 0:3]
    handle = slot_of(s, "handle")[..., 0:3]
    goal = s[..., 4:7]
    corner = handle + _v(0.05, 0.12, 0.1)
    outside = hand[..., 0] > corner[..., 0]
    lifted = hand[..., 2] > corner[..., 2] + 0.15
    way = _sel(outside, _sel(lifted, jnp.stack([corner[..., 0] - 0.03, corner[..., 1], hand[..., 2]], -1),
                             jnp.stack([hand[..., 0], hand[..., 1], corner[..., 2] + 0.22], -1)),
               _sel(jnp.abs(hand[..., 2] - corner[..., 2]) > 0.04, corner + _v(-0.03, 0.0, 0.0), goal))
    return _act(hand, way, 25.0, CLOSE)


def _slide_x(s: jax.Array, handle: jax.Array, offset: jax.Array, direction: float, gain: float, above: float
             ) -> jax.Array:
    """Drop beside a handle and push it along x (windows, faucets)."""
    hand = s[..., 0:3]
    at = handle + offset
    far = _xy(hand, at) > 0.03
    high = jnp.abs(hand[..., 2] - at[..., 2]) > 0.02
    way = _sel(far, at + _v(0.0, 0.0, above), _sel(high, at, at + _v(0.12 * direction, 0.0, 0.0)))
    return _act(hand, way, gain, CLOSE)


def _window_open(s: jax.Array) -> jax.Array:
    return _slide_x(s, slot_of(s, "window")[..., 0:3], _v(-0.03, -0.03, -0.08), 1.0, 25.0, 0.25)


def _window_close(s: jax.Array) -> jax.Array:
    return _slide_x(s, slot_of(s, "window")[..., 0:3], _v(0.03, -0.03, -0.08), -1.0, 25.0, 0.25)


def _faucet(s: jax.Array, direction: float) -> jax.Array:
    hand = s[..., 0:3]
    handle = slot_of(s, "faucet")[..., 0:3] + _v(-0.04 * direction, 0.0, 0.03)
    far = _xy(hand, handle) > 0.03
    high = jnp.abs(hand[..., 2] - handle[..., 2]) > 0.03
    way = _sel(far, handle + _v(0.0, 0.0, 0.1), _sel(high, handle, handle + _v(0.1 * direction, 0.05, 0.0)))
    return _act(hand, way, 25.0, CLOSE)


def _coffee_push_to(s: jax.Array, goal: jax.Array) -> jax.Array:
    """Cup the mug loosely with the gripper (half closed) and push it to ``goal``."""
    hand = s[..., 0:3]
    mug = slot_of(s, "coffee")[..., 0:3] + _v(0.01, 0.0, 0.05)
    far = _xy(hand, mug) > 0.04
    high = jnp.abs(hand[..., 2] - mug[..., 2]) > 0.02
    dest = jnp.stack([goal[..., 0], goal[..., 1], jnp.full_like(goal[..., 0], 0.1)], -1)
    way = _sel(far, mug + _v(0.0, 0.0, 0.2), _sel(high, mug, dest))
    grip = jnp.where(far | (jnp.abs(hand[..., 2] - mug[..., 2]) > 0.1), OPEN, 0.5)
    return _act(hand, way, 10.0, grip)


def _coffee_push(s: jax.Array) -> jax.Array:
    return _coffee_push_to(s, s[..., 4:7])


def _make_coffee(s: jax.Array) -> jax.Array:
    """Push the mug under the nozzle; once it is there, back off upwards and press the button."""
    hand = s[..., 0:3]
    placed, _ = tasks._make_coffee_stages(s, jnp.zeros(s.shape[:-1], jnp.int32))
    mug = slot_of(s, "coffee")[..., 0:3]
    push = _coffee_push_to(s, s[..., 4:7])
    # after placing: rise above the mug, then press the button from the front
    button = slot_of(s, "coffee_button")[..., 0:3]
    clear = hand[..., 2] > mug[..., 2] + 0.22
    rise = _act(hand, jnp.stack([hand[..., 0], hand[..., 1] - 0.05, mug[..., 2] + 0.3], -1), 10.0, OPEN)
    press = _press_y(s, button, 0.15, 12.0, -0.06)
    return _sel(placed, _sel(clear | (jnp.abs(hand[..., 2] - (button[..., 2] - 0.06)) < 0.03), press, rise), push)


def _locked_door_open(s: jax.Array) -> jax.Array:
    """Unlock (door-unlock's motion on the lock slot), then drag the door open by the turned lever caught
    with the wrist, pulled round the hinge at about the lever's radius; more than 13 cm from the lever's tip,
    door-open's motion on the handle."""
    hand = s[..., 0:3]
    lock = slot_of(s, "lock")[..., 0:3]
    hinge = s[..., 4:7] + _v(*_HINGE_FROM_GOAL)
    unlocked = tasks._locked_door_unlocked(s, None)
    lever_radius = 0.21  # the lever's hinge sits 0.186 from the door's hinge
    pull = _act(hand, _pull_round(hand, hinge, lever_radius, hand[..., 2:3]), 25.0, CLOSE)
    on_lever = jnp.linalg.norm(hand - lock, axis=-1) < 0.13  # ``lock`` is the lever's tip
    return _sel(unlocked, _sel(on_lever, pull, _door_open(s)), _door_unlock(s))


def _hammer(s: jax.Array) -> jax.Array:
    """Grasp the hammer's handle, lift it, swing over to the nail's line, drive the head into the nail."""
    hand, opening = s[..., 0:3], s[..., 3]
    hammer = slot_of(s, "hammer")[..., 0:3] + _v(-0.04, 0.0, -0.01)
    strike = _v(0.05, 0.71, 0.16)
    far = _xy(hand, hammer) > 0.03
    high = (hand[..., 2] - hammer[..., 2] > 0.05) & (hammer[..., 2] < 0.03)
    holding = ~far & ~high
    off_line = jnp.linalg.norm((hand - strike)[..., ::2], axis=-1) > 0.02
    line_up = jnp.stack([strike[0] + 0 * hand[..., 0], hand[..., 1], strike[2] + 0 * hand[..., 0]], -1)
    way = _sel(far, hammer + _v(0.0, 0.0, 0.1), _sel(high, hammer + _v(0.0, 0.0, 0.03),
                                                   _sel(off_line, line_up, jnp.broadcast_to(strike + _v(0.0, 0.06, 0.0), hand.shape))))
    grip = jnp.where(far | (jnp.abs(hand[..., 2] - hammer[..., 2]) > 0.1), OPEN, 0.8)
    del opening, holding
    return _act(hand, way, 10.0, grip)


def _soccer(s: jax.Array) -> jax.Array:
    """Carry the ball onto the goal's axis 18 cm in front of the goal (a sphere pushed by the fingers moves
    along the face's normal, so it is lined up by carrying), let go, get behind it and push it in with the
    closed fingers' flat face. Lined up: held within 1 cm of the spot, or free within 4 cm of the axis less
    than 24 cm in front of the goal.
    """
    hand, opening = s[..., 0:3], s[..., 3]
    ball = slot_of(s, "soccer")[..., 0:3]
    goal = s[..., 4:7]
    gx, gy = goal[..., 0], goal[..., 1]
    bx, by = ball[..., 0], ball[..., 1]
    mouth = _point(gx, gy - 0.18, -0.012)  # the ball's spot on the goal's axis (table height for the carry)
    held = (opening < 0.7) & (_xy(hand, ball) < 0.02) & (hand[..., 2] < 0.07)
    lined = jnp.where(held, _xy(ball, mouth) < 0.01,
                      (jnp.abs(bx - gx) < 0.04) & (by > gy - 0.24) & (ball[..., 2] < 0.035))
    # carry the ball (not the hand) to the spot: the fingers hold it off the hand's axis by up to ~1 cm
    offset = jnp.concatenate([(hand - ball)[..., :2], jnp.zeros_like(hand[..., 2:])], -1)
    carry = _grasp_then(s, ball, mouth + offset, lift_first=0.0, gain=15.0, cone=1.5, held_opening=0.7)
    aimed = jnp.abs(hand[..., 0] - bx) < 0.02
    low = hand[..., 2] < 0.07
    pushing = low & aimed & (hand[..., 1] < by - 0.03)
    behind = aimed & (hand[..., 1] < by - 0.055)
    over = (jnp.abs(hand[..., 1] - by) < 0.03) & (jnp.abs(hand[..., 0] - bx) < 0.05) & (hand[..., 2] < 0.1)
    releasing = over & low & (opening < 0.75)
    way = _sel(pushing, _point(bx, gy - 0.125, 0.05),  # push in; stop where the wrist would meet the roof
               _sel(behind, _point(bx, by - 0.065, 0.03),  # come down behind the ball
                    _sel(releasing, hand,  # open in place
                         _sel(over, _point(hand[..., 0], hand[..., 1], 0.115),  # rise clear of the ball
                              _point(bx, by - 0.07, 0.11)))))  # go behind it, high
    lineup = _act(hand, way, 50.0, jnp.where(over, OPEN, CLOSE))
    return _sel(lined, lineup, carry)


_EXPERTS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "reach": _reach, "push": _push, "pick-place": _pick_place, "button-press": _button_press,
    "door-unlock": _door_unlock, "door-open": _door_open, "window-open": _window_open,
    "faucet-open": lambda s: _faucet(s, 1.0), "coffee-push": _coffee_push, "coffee-button": _coffee_button,
    "reach-wall": _reach_wall, "push-wall": _push_wall, "pick-place-wall": _pick_place_wall,
    "button-press-wall": _button_press_wall, "door-lock": _door_lock, "door-close": _door_close,
    "window-close": _window_close, "faucet-close": lambda s: _faucet(s, -1.0),
    "make-coffee": _make_coffee, "locked-door-open": _locked_door_open, "hammer": _hammer, "soccer": _soccer,
}


def expert_action(state: jax.Array, task: jax.Array) -> jax.Array:
    """Expert actions: state (..., 91), task ids (...) into :data:`tasks.TASKS` → (..., 4) in [-1, 1]."""
    out = jnp.zeros(state.shape[:-1] + (4,), jnp.float32)
    for name, fn in _EXPERTS.items():
        out = jnp.where((task == TASK_INDEX[name])[..., None], fn(state).astype(jnp.float32), out)
    return jnp.clip(out, -1.0, 1.0)


def expert_policy(noise: float = 0.0) -> Callable[[jax.Array, jax.Array, Any, Any], jax.Array]:
    """``policy(key, obs, state, params) -> (B, 4)`` for :func:`imaginejax.data.collect.collect`, with
    optional Gaussian action noise of standard deviation ``noise`` (clipped to [-1, 1])."""

    def policy(key: jax.Array, obs: jax.Array, state: Any, params: Any) -> jax.Array:
        del obs
        action = expert_action(state.vec, params.goals[state.task, 0])
        if noise > 0.0:
            action = jnp.clip(action + noise * jax.random.normal(key, action.shape), -1.0, 1.0)
        return action

    return policy
