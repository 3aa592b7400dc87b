"""Minibatch samplers: uniform over one buffer, and mixed real / imaginary at an exact ratio.

Both are pure functions of an explicit key, jit-compatible (``batch_size`` is static) and vmappable over
the key and — for :func:`sample_mixed` — the ratio, so a sweep over seeds × ratios is one compiled call.

The mixing rule: a batch of ``B`` rows holds exactly ``n = num_imaginary(ratio, B)`` imaginary rows,

    n = round_half_even(float32(ratio) * B),   clipped to [0, B]

computed in float32 with ``jnp.round`` (ties go to the even integer, as NumPy does: ratio 0.5 gives
n = 2 of B = 5 and n = 4 of B = 7). Rows ``[0, n)`` come from the imaginary buffer and rows ``[n, B)``
from the real one; ``Batch.imaginary`` flags them. Within each buffer, indices are drawn uniformly with
replacement (``jax.random.randint``, independently per buffer and row; the draws do not depend on the
ratio): for a fixed key, changing the ratio changes which rows are imaginary but not the indices drawn
for the rows that stay real (common random numbers across a ratio sweep). Each row's embedding is
looked up in its own buffer's table (real and imaginary tables differ).

Several imaginary sources (e.g. one per task level, or imaginary and oracle data) can share one buffer:
``imag_rows = (start, count)`` restricts the imaginary draws to rows ``[start, start + count)`` (traced, so
runs of one compiled sweep can each mix in their own source).

With ``ratio = 0`` no imaginary row is ever selected, so the imaginary buffer may be a
:func:`~imaginejax.data.transitions.placeholder_like` stand-in (it still needs one row: both buffers are
indexed, and the imaginary values are discarded by a select).
"""

from __future__ import annotations

import math
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.data.transitions import check_transitions
from imaginejax.data.types import Batch, Transitions

__all__ = ["num_imaginary", "sample_mixed", "sample_uniform"]


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a static Python int >= 1, got {batch_size!r} "
                         "(under jit, mark it static: jax.jit(f, static_argnames='batch_size'))")
    return int(batch_size)


def _as_ratio(ratio: Any) -> jax.Array:
    """The ratio as a float32 scalar; Python / NumPy values are range-checked eagerly."""
    if isinstance(ratio, (int, float, np.number, np.ndarray)) and np.ndim(ratio) == 0:
        value = float(ratio)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"ratio must be in [0, 1], got {value}")
    ratio = jnp.asarray(ratio, dtype=jnp.float32)
    chex.assert_shape(ratio, (), custom_message="ratio is one scalar per call (vmap for several)")
    return ratio


def num_imaginary(ratio: jax.Array | float, batch_size: int) -> jax.Array:
    """The number of imaginary rows in a mixed batch: ``round_half_even(float32(ratio) * B)``.

    Args:
      ratio: () float, the imaginary fraction in [0, 1] (may be traced). A traced value outside the range
        is clipped; a traced NaN gives 0.
      batch_size: B, a static int >= 1.

    Returns:
      () int32 in [0, B].
    """
    b = _check_batch_size(batch_size)
    n = jnp.round(_as_ratio(ratio) * jnp.float32(b))
    n = jnp.where(jnp.isnan(n), 0.0, jnp.clip(n, 0.0, float(b)))
    return n.astype(jnp.int32)


def _gather(data: Transitions, idx: jax.Array) -> dict[str, jax.Array]:
    """Rows ``idx`` (B,) of ``data`` as Batch fields (without ``imaginary``); embeddings looked up."""
    return {
        "state": data.state[idx],
        "embedding": data.embeddings[data.instruction[idx]],
        "action": data.action[idx],
        "reward": data.reward[idx],
        "next_state": data.next_state[idx],
        "terminal": data.terminal[idx],
    }


def sample_uniform(key: jax.Array, data: Transitions, batch_size: int, *, imaginary: bool = False) -> Batch:
    """Draws ``batch_size`` transitions uniformly with replacement from one buffer.

    Args:
      key: PRNG key.
      data: the buffer, K >= 1 transitions (see :func:`check_transitions`).
      batch_size: B, a static int >= 1.
      imaginary: the value of every row's ``imaginary`` flag (whether ``data`` is an imaginary buffer).

    Returns:
      Batch: state, next_state (B, S); embedding (B, E); action (B,) or (B, A); reward, terminal (B,);
      imaginary (B,) bool.
    """
    b = _check_batch_size(batch_size)
    check_transitions(data)
    idx = jax.random.randint(key, (b,), 0, data.state.shape[0])
    return Batch(**_gather(data, idx), imaginary=jnp.full((b,), imaginary, dtype=bool))


def sample_mixed(key: jax.Array, real: Transitions, imag: Transitions, batch_size: int,
                 ratio: jax.Array | float, imag_rows: jax.Array | None = None) -> Batch:
    """Draws a batch with exactly ``num_imaginary(ratio, B)`` imaginary rows and the rest real.

    See the module docstring for the rule, the row layout and the randomness. Works under ``jit`` (with
    ``batch_size`` static) and ``vmap`` over ``key`` and ``ratio``.

    Args:
      key: PRNG key.
      real: the real buffer, K_r >= 1 transitions, an (M_r, E) table.
      imag: the imaginary buffer, K_i >= 1 transitions, an (M_i, E) table, with the same state width,
        action shape and dtype, and embedding width as ``real``.
      batch_size: B, a static int >= 1.
      ratio: () float in [0, 1], the imaginary fraction (an array, possibly traced).
      imag_rows: optional (2,) int32 (start, count), count >= 1: imaginary rows are drawn from
        ``imag[start : start + count]`` only (None: the whole buffer).

    Returns:
      Batch: state, next_state (B, S); embedding (B, E); action (B,) or (B, A); reward, terminal (B,);
      imaginary (B,) bool, True exactly on rows [0, n).
    """
    b = _check_batch_size(batch_size)
    check_transitions(real, name="real")
    check_transitions(imag, name="imag")
    for field in ("state", "action", "embeddings"):
        r, i = getattr(real, field), getattr(imag, field)
        if r.shape[1:] != i.shape[1:] or r.dtype != i.dtype:
            raise ValueError(f"imag.{field} is {i.dtype}{list(i.shape[1:])} per row but real.{field} is "
                             f"{r.dtype}{list(r.shape[1:])}: both buffers must share the spaces and encoder")
    is_imag = jnp.arange(b) < num_imaginary(ratio, b)
    # One draw for both buffers (row 0 real, row 1 imaginary): half the compile time of two under vmap.
    if imag_rows is None:
        imag_rows = jnp.array([0, imag.state.shape[0]], dtype=jnp.int32)
    chex.assert_shape(imag_rows, (2,))
    sizes = jnp.stack([jnp.int32(real.state.shape[0]), imag_rows[1].astype(jnp.int32)])[:, None]
    idx = jax.random.randint(key, (2, b), 0, sizes)
    idx = idx.at[1].add(imag_rows[0].astype(jnp.int32))
    from_real, from_imag = _gather(real, idx[0]), _gather(imag, idx[1])
    select = lambda r, i: jnp.where(is_imag.reshape((b,) + (1,) * (r.ndim - 1)), i, r)
    return Batch(**{name: select(from_real[name], from_imag[name]) for name in from_real}, imaginary=is_imag)
