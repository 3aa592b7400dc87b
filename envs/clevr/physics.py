"""CLEVR-Robot physics: a plain-JAX, batched re-implementation of MuJoCo stepping ``scene.xml``.

Five balls (radius 0.13) and a point-mass pusher (radius 0.05), each on two slide joints (x, y); joint
damping, the pusher's motors and frictionless soft sphere-sphere contacts. One substep is MuJoCo's
pipeline for this model: ``qacc_smooth = M^-1 (gear clamp(ctrl) - damping qvel)``; contact rows of the 15
sphere pairs with ``dist < 0``; the dual LCP ``f >= 0, (A + R) f + J qacc_smooth - aref >= 0, f.w = 0``
(``A = J M^-1 J^T``) solved by projected Gauss-Seidel; Euler with implicit damping. One environment step
(:func:`push`) zeroes the velocities, puts the pusher behind the chosen ball and drives it for
``SUBSTEPS``. The kernel is batch-last (bodies (6, N), rows (15, N)), the public API batch-leading
(B, 5, 2). Derivation, convergence and speed: docs/envs.md, "CLEVR-Robot".
"""

from __future__ import annotations

import pathlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "N_BALLS", "BALL_RADIUS", "PUSHER_RADIUS", "DT", "SUBSTEPS", "PUSH_OFFSET", "DIRECTIONS", "COLOURS",
    "N_ACTIONS", "MIN_CENTRE_DISTANCE", "X_RANGE", "Y_RANGE", "BALL_MASS", "BALL_DAMPING", "PUSHER_MASS",
    "PUSHER_DAMPING", "MOTOR_GEAR", "CTRL_RANGE", "SOLREF", "SOLIMP", "MAX_SWEEPS", "PAIRS",
    "decode_action", "push", "push_batch_last", "push_batch_last_with_stats", "sample_layout",
    "scene_xml_path",
]

# ----------------------------------------------------------------------------------------------------
# Scene constants (must match scene.xml; tests/test_clevr_physics.py checks them against MuJoCo).
# ----------------------------------------------------------------------------------------------------
N_BALLS = 5
BALL_RADIUS = 0.13
PUSHER_RADIUS = 0.05
DT = 0.01
SUBSTEPS = 40
PUSH_OFFSET = 0.15
N_ACTIONS = N_BALLS * 8
DIRECTIONS = np.array(
    [(1, 0), (0, 1), (-1, 0), (0, -1), (0.8, 0.8), (-0.8, 0.8), (0.8, -0.8), (-0.8, -0.8)], np.float32
)
COLOURS = ("red", "blue", "green", "purple", "cyan")

BALL_MASS = 1.0
BALL_DAMPING = 50.0
PUSHER_MASS = 0.2
PUSHER_DAMPING = 10.0
MOTOR_GEAR = 30.0
CTRL_RANGE = 2.0
SOLREF = (0.02, 1.0)  # (timeconst, dampratio)
SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)  # (d0, dwidth, width, midpoint, power)

# Initial layout box and minimum centre distance (two radii plus a 0.04 gap).
X_RANGE = (-0.5, 0.5)
Y_RANGE = (-0.3, 0.5)
MIN_CENTRE_DISTANCE = 2 * BALL_RADIUS + 0.04
LAYOUT_CANDIDATES = 32
LAYOUT_ATTEMPTS = 4

# Contact solver: PGS stops for an environment when a sweep changes no force by more than
# SOLVER_RTOL_EPS * eps(dtype) * max(1, max force); at most MAX_SWEEPS sweeps. Once at most
# 1/COMPACT_FRACTION of the batch is unfinished, the rest is gathered into a chunk of that size.
SOLVER_RTOL_EPS = 64.0
MAX_SWEEPS = 200
COMPACT_FRACTION = 16
# On a CPU, batches larger than PUSH_CHUNK are pushed in chunks of this many environments (lax.map),
# so the per-substep intermediates stay in the L2 cache (push_chunk).
PUSH_CHUNK = 2048

# MuJoCo constants used by the soft-constraint model (engine headers).
_MJ_MINVAL = 1e-15
_MJ_MINIMP = 0.0001
_MJ_MAXIMP = 0.9999

# Bodies in geom order: balls 0..4, then the pusher (index 5).
_N_BODIES = N_BALLS + 1
_PUSHER = N_BALLS
_MASS = (BALL_MASS,) * N_BALLS + (PUSHER_MASS,)
_DAMPING = (BALL_DAMPING,) * N_BALLS + (PUSHER_DAMPING,)
_RADIUS = (BALL_RADIUS,) * N_BALLS + (PUSHER_RADIUS,)
_INVWEIGHT0 = tuple(1.0 / m for m in _MASS)  # MuJoCo's body_invweight0[:, 0] for slide-xy bodies


def _one_factorisation(n_bodies: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Split the pairs of an even number of bodies into n-1 perfect matchings ("colours").

    Round-robin schedule: in colour c the last body meets c and the others pair up symmetrically
    around c. Rows of one colour share no body, so a Gauss-Seidel sweep may update them together.
    """
    m = n_bodies - 1
    return tuple(
        tuple(tuple(sorted(p))
              for p in [(c, m)] + [((c + k) % m, (c - k) % m) for k in range(1, n_bodies // 2)])
        for c in range(m)
    )


_COLOURING = _one_factorisation(_N_BODIES)  # 5 colours x 3 pairs
_N_COLOURS = len(_COLOURING)
_PER_COLOUR = len(_COLOURING[0])
PAIRS = tuple(pair for colour in _COLOURING for pair in colour)  # 15 pairs (i < j), colour-major
_N_ROWS = len(PAIRS)
_I = np.array([i for i, _ in PAIRS], np.int32)
_J = np.array([j for _, j in PAIRS], np.int32)
# Per colour, for every body: its row within the colour and the sign of its Jacobian (-1 for i, +1 for j).
_SLOT = np.zeros((_N_COLOURS, _N_BODIES), np.int32)
_SIGN = np.zeros((_N_COLOURS, _N_BODIES))
for _c, _colour in enumerate(_COLOURING):
    for _s, (_i, _j) in enumerate(_colour):
        _SLOT[_c, _i], _SIGN[_c, _i] = _s, -1.0
        _SLOT[_c, _j], _SIGN[_c, _j] = _s, 1.0
# For every body: the 5 rows that involve it and its sign in them; for every body pair: its row.
_ROWS_OF_BODY = np.array([[k for k, p in enumerate(PAIRS) if b in p] for b in range(_N_BODIES)], np.int32)
_SIGN_OF_BODY = np.array([[1.0 if PAIRS[k][1] == b else -1.0 for k in ks]
                          for b, ks in enumerate(_ROWS_OF_BODY)])
_ROW_OF_PAIR = np.zeros((_N_BODIES, _N_BODIES), np.int32)
for _k, (_i, _j) in enumerate(PAIRS):
    _ROW_OF_PAIR[_i, _j] = _ROW_OF_PAIR[_j, _i] = _k
assert sorted(PAIRS) == [(i, j) for i in range(_N_BODIES) for j in range(i + 1, _N_BODIES)]

# Derived soft-constraint coefficients (timeconst is already >= 2*DT, so refsafe does not change it).
_TIMECONST = max(SOLREF[0], 2 * DT)
_K = 1.0 / (SOLIMP[1] ** 2 * _TIMECONST**2 * SOLREF[1] ** 2)
_B = 2.0 / (SOLIMP[1] * _TIMECONST)


def scene_xml_path() -> pathlib.Path:
    """Path of the MJCF that this module reproduces (``envs/clevr/scene.xml``)."""
    return pathlib.Path(__file__).with_name("scene.xml")


def decode_action(action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Split a discrete action into (ball index, direction index).

    Args:
        action: (...,) integer array with values in [0, 40).
    Returns:
        ``(action // 8, action % 8)``, each (...,) of the input's integer dtype.
    """
    action = jnp.asarray(action)
    return action // 8, action % 8


# ----------------------------------------------------------------------------------------------------
# The kernel. Every array has the flat batch N as its LAST axis (structure of arrays): bodies are
# (6, N), contact rows (15, N) in colour-major order, so each operation is one vectorised loop over
# N and XLA emits a few dozen fused kernels per substep instead of hundreds.
# ----------------------------------------------------------------------------------------------------
class _State(NamedTuple):
    """Per-substep carry. x, y, vx, vy: (6, N) body coordinates and velocities; force: (15, N)."""

    x: jax.Array
    y: jax.Array
    vx: jax.Array
    vy: jax.Array
    force: jax.Array


class _Rows(NamedTuple):
    """The 15 potential contact rows, each field (15, N) in ``PAIRS`` order.

    ``nx, ny``: unit normal from body i to body j; ``present``: a contact exists (``dist < 0``);
    ``aref``: reference acceleration; ``reg``: regulariser R; ``diag``: ``A_kk + R_k``;
    ``inv_diag``: its reciprocal.
    """

    nx: jax.Array
    ny: jax.Array
    present: jax.Array
    aref: jax.Array
    reg: jax.Array
    diag: jax.Array
    inv_diag: jax.Array


def _const(values, dtype) -> jax.Array:
    """A NumPy constant as a column ``(len, 1)`` of ``dtype`` (broadcasts against (len, N))."""
    return jnp.asarray(np.asarray(values, np.float64)[:, None], dtype)


def _take(a: jax.Array, index: np.ndarray) -> jax.Array:
    """``a[index]`` along axis 0 for a static int index array of any shape (a constant gather)."""
    return a[np.asarray(index, np.int32)]


def _impedance(penetration: jax.Array) -> jax.Array:
    """MuJoCo's solimp impedance as a function of ``|dist - margin|`` (any shape -> same shape)."""
    d0, dwidth, width, mid, power = SOLIMP
    x = jnp.clip(penetration / width, 0.0, 1.0)
    p = int(power) if float(power).is_integer() else power  # integer powers stay multiplications
    lower = x**p / mid ** (power - 1)
    upper = 1.0 - (1.0 - x) ** p / (1.0 - mid) ** (power - 1)
    imp = d0 + jnp.where(x < mid, lower, upper) * (dwidth - d0)
    return jnp.clip(imp, _MJ_MINIMP, _MJ_MAXIMP)


def _contact_rows(x: jax.Array, y: jax.Array, vx: jax.Array, vy: jax.Array) -> _Rows:
    """Collision detection and MuJoCo's soft-constraint parameters for all 15 sphere pairs.

    Args:
        x, y, vx, vy: (6, N) positions and velocities.
    Returns:
        The rows, each field (15, N).
    """
    dtype = x.dtype
    dx, dy = _take(x, _J) - _take(x, _I), _take(y, _J) - _take(y, _I)
    centre = jnp.sqrt(dx * dx + dy * dy)
    safe = jnp.where(centre > 0, centre, 1.0)
    nx = jnp.where(centre > 0, dx / safe, 1.0)
    ny = jnp.where(centre > 0, dy / safe, 0.0)
    radii = np.asarray(_RADIUS)
    dist = centre - _const(radii[_I] + radii[_J], dtype)
    imp = _impedance(jnp.abs(dist))
    vn = nx * (_take(vx, _J) - _take(vx, _I)) + ny * (_take(vy, _J) - _take(vy, _I))  # J qvel
    invweight = np.asarray(_INVWEIGHT0)
    reg = jnp.maximum((1.0 - imp) / imp * _const(invweight[_I] + invweight[_J], dtype), _MJ_MINVAL)
    inv_mass = 1.0 / np.asarray(_MASS)
    diag = (nx * nx + ny * ny) * _const(inv_mass[_I] + inv_mass[_J], dtype) + reg
    aref = -_B * vn - _K * imp * dist
    return _Rows(nx, ny, dist < 0.0, aref, reg, diag, 1.0 / diag)


def _jt_times(rows: _Rows, amount: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``J^T amount``: per-row scalars (15, N) -> generalised forces per body (x and y, each (6, N))."""
    dtype = amount.dtype
    sign = jnp.asarray(_SIGN_OF_BODY[:, :, None], dtype)  # (6, 5, 1)
    gx = jnp.sum(sign * _take(amount * rows.nx, _ROWS_OF_BODY), axis=1)
    gy = jnp.sum(sign * _take(amount * rows.ny, _ROWS_OF_BODY), axis=1)
    return gx, gy


def _pgs_sweep(rows: _Rows, force: jax.Array, ax: jax.Array, ay: jax.Array, frozen: jax.Array
               ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One projected Gauss-Seidel sweep over the 15 rows of the dual LCP, one colour at a time.

    Rows of a colour share no body, so updating them together is exactly sequential Gauss-Seidel.

    Args:
        rows: contact rows (15, N); force: (15, N) current forces;
        ax, ay: (6, N), must equal ``qacc_smooth + M^-1 J^T force`` (kept so);
        frozen: (N,) environments left unchanged.
    Returns:
        New force (15, N), ax, ay (6, N), and the largest absolute force change (N,).
    """
    dtype = force.dtype
    inv_mass = 1.0 / np.asarray(_MASS)
    shape = (_N_COLOURS, _PER_COLOUR) + force.shape[1:]
    nx, ny, present, aref, reg, inv_diag = (
        v.reshape(shape) for v in (rows.nx, rows.ny, rows.present, rows.aref, rows.reg, rows.inv_diag))
    forces = list(force.reshape(shape))
    max_delta = jnp.zeros(force.shape[1:], dtype)
    for c in range(_N_COLOURS):
        i, j = _I[c * _PER_COLOUR:(c + 1) * _PER_COLOUR], _J[c * _PER_COLOUR:(c + 1) * _PER_COLOUR]
        w = nx[c] * (_take(ax, j) - _take(ax, i)) + ny[c] * (_take(ay, j) - _take(ay, i))
        w = w - aref[c] + reg[c] * forces[c]
        new = jnp.maximum(forces[c] - w * inv_diag[c], 0.0)
        delta = jnp.where(present[c] & ~frozen, new - forces[c], 0.0)
        forces[c] = forces[c] + delta
        coef = _const(_SIGN[c] * inv_mass, dtype)  # (6, 1): +-1/m of each body in this colour
        ax = ax + coef * _take(delta * nx[c], _SLOT[c])
        ay = ay + coef * _take(delta * ny[c], _SLOT[c])
        max_delta = jnp.maximum(max_delta, jnp.max(jnp.abs(delta), axis=0))
    return jnp.concatenate(forces, axis=0), ax, ay, max_delta


def _capacity(n: int) -> int:
    """Chunk size of the compacted tail of the contact solve for a batch of n environments."""
    return max(1, -(-n // COMPACT_FRACTION))


def _solve_contacts(rows: _Rows, fx: jax.Array, fy: jax.Array, warm: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """The contact forces: the unique solution of the dual LCP, by projected Gauss-Seidel.

    ``A + R`` is symmetric positive definite, so PGS converges from any start; an environment stops when a
    sweep changes no force by more than ``SOLVER_RTOL_EPS * eps * max(1, max f)``. Sweeps run over the whole
    batch while more than ``N / COMPACT_FRACTION`` environments are unfinished, then over the unfinished ones
    gathered into chunks (a finished environment is frozen, so no environment depends on the batch).

    Args:
        rows: (15, N) rows; fx, fy: (6, N) qfrc_smooth; warm: (15, N) forces to start from (>= 0),
            the previous substep's (changes the number of sweeps, not the solution).
    Returns:
        forces (15, N) and the PGS sweeps each environment used (N,) int32.
    """
    dtype = fx.dtype
    n = fx.shape[1]
    capacity = _capacity(n)
    inv_mass = jnp.asarray((1.0 / np.asarray(_MASS))[:, None], dtype)
    force0 = jnp.where(rows.present, warm, 0.0)
    gx, gy = _jt_times(rows, force0)
    ax, ay = (fx + gx) * inv_mass, (fy + gy) * inv_mass
    rtol = SOLVER_RTOL_EPS * jnp.finfo(dtype).eps

    def sweep(rows, force, ax, ay, done, count):
        force, ax, ay, max_delta = _pgs_sweep(rows, force, ax, ay, done)
        count = count + (~done).astype(jnp.int32)
        converged = max_delta <= rtol * jnp.maximum(jnp.max(force, axis=0), 1.0)
        return force, ax, ay, done | converged | (count >= MAX_SWEEPS), count

    # Phase 1: the whole batch, while many environments are unfinished.
    def many_unfinished(carry):
        return jnp.sum(~carry[3]) > capacity

    def full_sweep(carry):
        return sweep(rows, *carry)

    init = (force0, ax, ay, ~jnp.any(rows.present, axis=0), jnp.zeros((n,), jnp.int32))
    force, ax, ay, done, count = jax.lax.while_loop(many_unfinished, full_sweep, init)

    # Phase 2: chunks of at most `capacity` unfinished environments, each swept to convergence.
    def any_unfinished(carry):
        return jnp.any(~carry[3])

    def chunk(carry):
        force, ax, ay, done, count = carry
        index = jnp.nonzero(~done, size=capacity, fill_value=n)[0]  # (capacity,), n = empty slot
        safe = jnp.minimum(index, n - 1)
        sub_rows = _Rows(*(v[:, safe] for v in rows))
        sub = (force[:, safe], ax[:, safe], ay[:, safe], (index >= n) | done[safe], count[safe])
        sub = jax.lax.while_loop(any_unfinished, lambda c: sweep(sub_rows, *c), sub)
        force = force.at[:, index].set(sub[0], mode="drop")
        count = count.at[index].set(sub[4], mode="drop")
        done = done.at[index].set(True, mode="drop")
        return force, ax, ay, done, count

    force, _, _, _, count = jax.lax.while_loop(any_unfinished, chunk, (force, ax, ay, done, count))
    return force, count


def _substep(state: _State, ux: jax.Array, uy: jax.Array) -> tuple[_State, jax.Array]:
    """One MuJoCo ``mj_step`` (Euler) of the scene.

    Args:
        state: (6, N) positions/velocities and the previous (15, N) contact forces.
        ux, uy: (N,) pusher controls, already clamped to the control range.
    Returns:
        The state after one step of ``DT`` (``force`` holds this step's contact forces) and the
        PGS sweeps per environment (N,).
    """
    dtype = state.x.dtype
    damping = _const(_DAMPING, dtype)
    is_pusher = np.arange(_N_BODIES)[:, None] == _PUSHER
    # Smooth forces qfrc_smooth = actuation - damping * qvel (no bias force on the slide axes).
    fx = -damping * state.vx + jnp.where(is_pusher, MOTOR_GEAR * ux, 0.0)
    fy = -damping * state.vy + jnp.where(is_pusher, MOTOR_GEAR * uy, 0.0)
    rows = _contact_rows(state.x, state.y, state.vx, state.vy)
    force, count = _solve_contacts(rows, fx, fy, state.force)
    gx, gy = _jt_times(rows, force)  # qfrc_constraint = J^T f
    # Euler with implicit damping: qacc = (M + h D)^-1 (qfrc_smooth + qfrc_constraint).
    inv = _const(1.0 / (np.asarray(_MASS) + DT * np.asarray(_DAMPING)), dtype)
    vx = state.vx + DT * ((fx + gx) * inv)
    vy = state.vy + DT * ((fy + gy) * inv)
    return _State(state.x + DT * vx, state.y + DT * vy, vx, vy, force), count


def _push_flat(balls_x: jax.Array, balls_y: jax.Array, ball: jax.Array, direction: jax.Array
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One environment step on flat structure-of-arrays ball positions.

    Args:
        balls_x, balls_y: (5, N) ball coordinates; ball: (N,) int ball index; direction: (N,) int.
    Returns:
        New ``(balls_x, balls_y)``, each (5, N), and the PGS sweeps per substep (SUBSTEPS, N).
    """
    dtype = balls_x.dtype
    dirs = jnp.asarray(DIRECTIONS, dtype)
    dir_x, dir_y = dirs[direction, 0], dirs[direction, 1]
    onehot = ball[None, :] == jnp.arange(N_BALLS)[:, None]
    target_x = jnp.sum(jnp.where(onehot, balls_x, 0.0), axis=0)
    target_y = jnp.sum(jnp.where(onehot, balls_y, 0.0), axis=0)
    x = jnp.concatenate([balls_x, (target_x - PUSH_OFFSET * dir_x)[None]], axis=0)
    y = jnp.concatenate([balls_y, (target_y - PUSH_OFFSET * dir_y)[None]], axis=0)
    zeros = jnp.zeros_like(x)
    state = _State(x, y, zeros, zeros, jnp.zeros((_N_ROWS,) + x.shape[1:], dtype))
    ux = jnp.clip(dir_x, -CTRL_RANGE, CTRL_RANGE)
    uy = jnp.clip(dir_y, -CTRL_RANGE, CTRL_RANGE)
    state, counts = jax.lax.scan(lambda s, _: _substep(s, ux, uy), state, None, length=SUBSTEPS)
    return state.x[:N_BALLS], state.y[:N_BALLS], counts


def push_chunk(backend: str | None = None) -> int | None:
    """Environments per sequential chunk of a large push on ``backend`` (default: JAX's): ``PUSH_CHUNK``
    on a CPU, None (the whole batch at once) on an accelerator."""
    return PUSH_CHUNK if (backend or jax.default_backend()) == "cpu" else None


def push_batch_last(balls: jax.Array, ball: jax.Array, direction: jax.Array) -> jax.Array:
    """One environment step with the batch as the trailing axes (the kernel's native layout).

    Args:
        balls: (5, 2, *batch) float ball positions.
        ball: (*batch,) int ball index; direction: (*batch,) int direction index.
    Returns:
        (5, 2, *batch) ball positions after the push, same dtype as ``balls``.
    """
    return push_batch_last_with_stats(balls, ball, direction)[0]


def push_batch_last_with_stats(balls: jax.Array, ball: jax.Array, direction: jax.Array
                               ) -> tuple[jax.Array, jax.Array]:
    """:func:`push_batch_last` that also returns the contact solver's work (a diagnostic).

    Returns:
        (5, 2, *batch) positions and (SUBSTEPS, *batch) int32 PGS sweeps per substep.
    """
    balls = jnp.asarray(balls)
    if not jnp.issubdtype(balls.dtype, jnp.floating):
        balls = balls.astype(jnp.result_type(float))
    batch = balls.shape[2:]
    flat = balls.reshape((N_BALLS, 2, -1))
    ball = jnp.asarray(ball).reshape(-1)
    direction = jnp.asarray(direction).reshape(-1)
    n = flat.shape[-1]
    chunk = push_chunk()
    if chunk is None or n <= chunk:
        new_x, new_y, counts = _push_flat(flat[:, 0], flat[:, 1], ball, direction)
    else:
        # Large batches: cache-sized chunks, one after another (environments are independent).
        # Equal chunks of at most `chunk`; the last is padded with copies of environment 0.
        n_chunks = -(-n // chunk)
        size = -(-n // n_chunks)
        pad = n_chunks * size - n

        def chunks(a: jax.Array) -> jax.Array:  # (..., n) -> (n_chunks, ..., size)
            a = jnp.concatenate([a, jnp.repeat(a[..., :1], pad, axis=-1)], axis=-1) if pad else a
            return jnp.moveaxis(a.reshape(a.shape[:-1] + (n_chunks, size)), -2, 0)

        def unchunk(a: jax.Array) -> jax.Array:  # (n_chunks, ..., size) -> (..., n)
            return jnp.moveaxis(a, 0, -2).reshape(a.shape[1:-1] + (n_chunks * size,))[..., :n]

        new_x, new_y, counts = (unchunk(a) for a in jax.lax.map(
            lambda args: _push_flat(*args), (chunks(flat[:, 0]), chunks(flat[:, 1]), chunks(ball),
                                             chunks(direction))))
    out = jnp.stack([new_x, new_y], axis=1).reshape((N_BALLS, 2) + batch)
    return out, counts.reshape((SUBSTEPS,) + batch)


def push(balls: jax.Array, ball: jax.Array, direction: jax.Array) -> jax.Array:
    """One environment step (a 40-substep push), batch-leading API.

    Args:
        balls: (B, 5, 2) float32 or float64 ball positions (the dtype of the result follows it).
        ball: (B,) int32 index of the ball to push.
        direction: (B,) int32 index into ``DIRECTIONS``.
    Returns:
        (B, 5, 2) ball positions after the push.
    """
    balls = jnp.asarray(balls)
    moved = push_batch_last(jnp.moveaxis(balls, 0, -1), ball, direction)
    return jnp.moveaxis(moved, -1, 0)


def _place_sequentially(key: jax.Array, batch: int, dtype) -> jax.Array:
    """One attempt per layout: balls placed one by one, each the first far-enough candidate.

    Returns (B, 5, 2); a layout may violate the gap when some ball found no far-enough candidate.
    """
    low = jnp.asarray([X_RANGE[0], Y_RANGE[0]], dtype)
    high = jnp.asarray([X_RANGE[1], Y_RANGE[1]], dtype)
    keys = jax.random.split(key, N_BALLS)
    # the first ball is always accepted: one candidate
    placed: list[jax.Array] = [jax.random.uniform(keys[0], (batch, 2), dtype, low, high)]
    # The other balls' candidates: one vmapped draw over their keys gives exactly the numbers of one
    # draw per key, but one random-bits kernel instead of four (a third of the compile time).
    cands = jax.vmap(lambda k: jax.random.uniform(k, (batch, LAYOUT_CANDIDATES, 2), dtype, low, high))(
        keys[1:])
    for n in range(1, N_BALLS):
        cand = cands[n - 1]
        prev = jnp.stack(placed, axis=1)  # (B, n, 2)
        dist = jnp.linalg.norm(cand[:, :, None, :] - prev[:, None, :, :], axis=-1)  # (B, K, n)
        ok = jnp.min(dist, axis=-1) >= MIN_CENTRE_DISTANCE  # (B, K)
        placed.append(jnp.take_along_axis(cand, jnp.argmax(ok, axis=1)[:, None, None], axis=1)[:, 0])
    return jnp.stack(placed, axis=1)


def _min_centre_distance(layout: jax.Array) -> jax.Array:
    """(..., 5, 2) -> (...,) smallest distance between two ball centres."""
    i, j = np.triu_indices(N_BALLS, 1)
    return jnp.min(jnp.linalg.norm(layout[..., i, :] - layout[..., j, :], axis=-1), axis=-1)


def sample_layout(key: jax.Array, batch: int) -> jax.Array:
    """Random initial layouts: x ~ U[-0.5, 0.5], y ~ U[-0.3, 0.5], centres >= MIN_CENTRE_DISTANCE apart.

    Fixed work, so it is jit-able: ``LAYOUT_ATTEMPTS`` attempts per layout, each ball the first of
    ``LAYOUT_CANDIDATES`` uniform candidates far enough from those placed; the first attempt that succeeded
    is returned, else the one with the largest minimum distance (how rarely: docs/envs.md).

    Args:
        key: PRNG key.
        batch: number of layouts B (static).
    Returns:
        (B, 5, 2) ball positions in the default float dtype.
    """
    dtype = jnp.result_type(float)
    attempts = _place_sequentially(key, LAYOUT_ATTEMPTS * batch, dtype)
    attempts = attempts.reshape(LAYOUT_ATTEMPTS, batch, N_BALLS, 2)
    clearance = _min_centre_distance(attempts)  # (A, B)
    ok = clearance >= MIN_CENTRE_DISTANCE
    pick = jnp.where(jnp.any(ok, axis=0), jnp.argmax(ok, axis=0), jnp.argmax(clearance, axis=0))
    return jnp.take_along_axis(attempts, pick[None, :, None, None], axis=0)[0]
