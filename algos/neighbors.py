"""Exact nearest-neighbour search over transition buffers inside compiled code (PRDC's dataset constraint).

Row j of a buffer (state s_j, instruction embedding e_{m_j}, action a_j) and a query b (s_b, e_b, α_b):

    d(b, j) = β² ‖s̃_b − s̃_j‖² + β² ‖e_b − e_{m_j}‖² + ‖α_b − φ(a_j)‖²,    φ(a) = a, or one-hot(a) if discrete

computed in chunks (memory O(B · chunk)) as one matrix product per chunk with the embedding part from a
(B, M) table, a per-block min, then the winning block recomputed directly. Ties go to the lowest row.
``subset = m`` searches m random rows per buffer (plus optional candidate rows) instead. How and why:
docs/algorithms/prdc.md.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import struct

from imaginejax.algos.common import DataStats, Datasets
from imaginejax.data.types import Batch, Transitions

# Rows per block of the two-pass argmin (a min per block, then an argmin inside the winning block):
# XLA's CPU argmin over a long axis is a slow variadic reduction.
BLOCK = 64
# Dataset rows per step of the chunked search (rounded down to whole blocks).
DEFAULT_CHUNK = 4096
# Instruction tables with at most this many rows fold the embedding distance into the chunk's matrix
# product (one-hot columns); larger tables gather it from the (B, M) table instead.
FOLD_INSTRUCTIONS = 64


@struct.dataclass
class Neighbor:
    """The nearest dataset row for each of B queries.

    Attributes:
      distance: (B,) float32 squared joint distance d(b, j*) (recomputed directly for the chosen row).
      index: (B,) int32 row j* in its buffer; −1 when it is one of the extra ``candidates`` rows of
        :func:`nearest_neighbor` (rows given by value, e.g. the training batch).
      imaginary: (B,) bool, True when the row is in (or, for a candidate, from) the imaginary buffer.
      action: (B,) int32 or (B, A) float32, the row's dataset action a_{j*}.
    """

    distance: jax.Array
    index: jax.Array
    imaginary: jax.Array
    action: jax.Array


def action_features(action: jax.Array, num_actions: int | None) -> jax.Array:
    """φ(a): continuous (K, A) float -> itself; discrete (K,) int -> (K, n) float32 one-hot."""
    if num_actions is None:
        return action.astype(jnp.float32)
    return jax.nn.one_hot(action, num_actions, dtype=jnp.float32)


def embedding_distances(query_embedding: jax.Array, table: jax.Array, beta: jax.Array | float) -> jax.Array:
    """T[b, m] = β² ‖e_b − e_m‖²: query_embedding (B, E), table (M, E) -> (B, M), clipped at 0.

    E = 0 gives zeros (no instruction embedding).
    """
    chex.assert_rank([query_embedding, table], 2)
    if table.shape[-1] == 0:
        return jnp.zeros((query_embedding.shape[0], table.shape[0]), jnp.float32)
    sq = (jnp.sum(jnp.square(query_embedding), -1)[:, None] - 2.0 * query_embedding @ table.T
          + jnp.sum(jnp.square(table), -1)[None, :])
    return jnp.square(beta) * jnp.maximum(sq, 0.0)


def _keys(data_state: jax.Array, data_action: jax.Array, normalizer: DataStats, beta: jax.Array | float,
          num_actions: int | None) -> jax.Array:
    """y_j = (β s̃_j, φ(a_j)): (c, S), (c,) or (c, A) -> (c, S + A')."""
    return jnp.concatenate([beta * normalizer(data_state), action_features(data_action, num_actions)], -1)


def _chunk_sizes(num_rows: int, chunk: int, block: int) -> tuple[int, int]:
    """(rows per chunk, rows per block): chunks are whole blocks and never longer than the buffer."""
    if num_rows < block:
        return num_rows, num_rows
    return max(block, (min(chunk, num_rows) // block) * block), block


def nearest_row(query_state: jax.Array, query_embedding: jax.Array, query_action: jax.Array, data: Transitions,
                normalizer: DataStats, beta: jax.Array | float, *, chunk: int,
                num_actions: int | None = None, allowed: jax.Array | bool = True,
                block: int = BLOCK, window: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Exact nearest row of one buffer in the joint space (chunked brute force, see the module docstring).

    Args:
      query_state: (B, S) raw (un-normalised) query states s_b.
      query_embedding: (B, E) query instruction embeddings e_b.
      query_action: (B, A') α_b: a continuous action (A' = A) or a probability vector (A' = n).
      data: the buffer: state (K, S), action (K, A) or (K,), instruction (K,), embeddings (M, E).
      normalizer: the state normaliser (μ, σ) of the run.
      beta: () β, weight of the state (and embedding) part.
      chunk: static, rows per scan step (rounded down to whole blocks, at most K); memory O(B · chunk).
      num_actions: static; None for continuous actions, n for discrete ones (φ = one-hot).
      allowed: () bool (traced); False makes the distance +inf (the buffer is not part of the search).
      block: static, rows per block of the two-pass argmin (module docstring).
      window: optional (2,) int32 (start, count): rows outside [start, start + count) are not searched.

    Returns:
      (distance (B,) float32: d(b, j*) with its state-action part recomputed directly, or +inf when not
      ``allowed``; index (B,) int32 j* in [0, K)).
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a static int >= 1 (dataset rows per scan step), got {chunk!r}")
    if (data.action.ndim == 1) != (num_actions is not None):
        raise ValueError(f"data.action has shape {tuple(data.action.shape)}: pass num_actions=n for discrete "
                         "(K,) actions and num_actions=None for continuous (K, A) ones")
    chex.assert_rank([query_state, query_embedding, query_action], 2)
    num_rows, num_instructions = int(data.state.shape[0]), int(data.embeddings.shape[0])
    size, block = _chunk_sizes(num_rows, chunk, block)
    num_chunks = -(-num_rows // size)
    b = query_state.shape[0]
    x = jnp.concatenate([beta * normalizer(query_state), query_action.astype(jnp.float32)], -1)  # (B, D)
    table = embedding_distances(query_embedding, data.embeddings, beta)  # (B, M)
    fold = num_instructions <= FOLD_INSTRUCTIONS
    # Row b of x_aug times row j of y_aug is  −2 x_b·y_j + ‖y_j‖² (+ T[b, m_j] when folded):
    # d(b, j) minus the per-query constant ‖x_b‖², so its argmin over j is the nearest row.
    x_aug = jnp.concatenate([-2.0 * x, jnp.ones((b, 1), jnp.float32)] + ([table] if fold else []), -1)

    def outside(rows: jax.Array) -> jax.Array:
        """0 for rows inside ``window``, +inf outside."""
        return jnp.where((rows >= window[0]) & (rows < window[0] + window[1]), 0.0, jnp.inf)

    def step(carry, i):
        best_v, best_start = carry
        start = jnp.minimum(i * size, num_rows - size)  # the last chunk ends at row K (overlap is harmless)
        rows = lambda a: jax.lax.dynamic_slice_in_dim(a, start, size)
        y = _keys(rows(data.state), rows(data.action), normalizer, beta, num_actions)
        instruction = rows(data.instruction)
        y_aug = [y, jnp.sum(jnp.square(y), -1, keepdims=True)]
        if fold:
            y_aug.append(jax.nn.one_hot(instruction, num_instructions, dtype=jnp.float32))
        v = x_aug @ jnp.concatenate(y_aug, -1).T  # (B, size)
        if not fold:
            v = v + jnp.take(table, instruction, axis=1)
        if window is not None:
            v = v + outside(start + jnp.arange(size, dtype=jnp.int32))[None, :]
        block_min = v.reshape(b, size // block, block).min(-1)  # (B, blocks): one cheap reduction
        jb = jnp.argmin(block_min, axis=1)
        v_j = jnp.take_along_axis(block_min, jb[:, None], axis=1)[:, 0]
        better = v_j < best_v  # strict: the earliest block wins ties, as numpy.argmin
        return (jnp.where(better, v_j, best_v), jnp.where(better, start + jb * block, best_start)), None

    init = (jnp.full((b,), jnp.inf, jnp.float32), jnp.zeros((b,), jnp.int32))
    (_, best_start), _ = jax.lax.scan(step, init, jnp.arange(num_chunks, dtype=jnp.int32))
    # Second pass: the winning block of each query, distances computed directly, argmin within it.
    index = best_start[:, None] + jnp.arange(block, dtype=jnp.int32)[None, :]  # (B, block)
    y = _keys(data.state[index], data.action[index], normalizer, beta, num_actions)  # (B, block, D)
    d = jnp.sum(jnp.square(x[:, None, :] - y), -1) + jnp.take_along_axis(table, data.instruction[index], axis=1)
    if window is not None:
        d = d + outside(index)
    j = jnp.argmin(d, axis=1)
    distance = jnp.take_along_axis(d, j[:, None], axis=1)[:, 0]
    return jnp.where(jnp.asarray(allowed), distance, jnp.inf), jnp.take_along_axis(index, j[:, None], axis=1)[:, 0]


def joint_distance(query_state: jax.Array, query_embedding: jax.Array, query_action: jax.Array, data: Transitions,
                   index: jax.Array, normalizer: DataStats, beta: jax.Array | float,
                   num_actions: int | None = None) -> jax.Array:
    """d(b, index_b) computed directly as a sum of squared differences: (B, ...) queries, index (B,) -> (B,)."""
    y = _keys(data.state[index], data.action[index], normalizer, beta, num_actions)
    x = jnp.concatenate([beta * normalizer(query_state), query_action.astype(jnp.float32)], -1)
    emb = beta * (query_embedding - data.embeddings[data.instruction[index]])
    return jnp.sum(jnp.square(x - y), -1) + jnp.sum(jnp.square(emb), -1)


def random_rows(key: jax.Array, data: Transitions, size: int,
                window: jax.Array | None = None) -> tuple[Transitions, jax.Array]:
    """``size`` rows of ``data`` (of rows [start, start + count) with ``window``) drawn uniformly with
    replacement, for the approximate search.

    Returns:
      (a buffer whose state, action and instruction are the drawn rows — the fields the search reads; the
      others are left as they are —, rows (size,) int32 into ``data``).
    """
    if window is None:
        rows = jax.random.randint(key, (size,), 0, data.state.shape[0], dtype=jnp.int32)
    else:
        rows = window[0] + jax.random.randint(key, (size,), 0, window[1], dtype=jnp.int32)
    return data.replace(state=data.state[rows], action=data.action[rows], instruction=data.instruction[rows]), rows


def rows_as_buffer(state: jax.Array, embedding: jax.Array, action: jax.Array) -> Transitions:
    """Dataset rows given by value (e.g. a training batch) as a buffer the search reads: its instruction
    table is the rows' own embeddings. state (B', S), embedding (B', E), action (B', ...) -> K = B' rows."""
    n = state.shape[0]
    zeros = jnp.zeros((n,), jnp.float32)
    return Transitions(state=state, action=action, reward=zeros, next_state=state, terminal=zeros,
                       instruction=jnp.arange(n, dtype=jnp.int32), goal=zeros[:, None], embeddings=embedding)


def nearest_neighbor(query_state: jax.Array, query_embedding: jax.Array, query_action: jax.Array,
                     data: Datasets, normalizer: DataStats, beta: jax.Array | float, *, chunk: int,
                     num_actions: int | None = None, use_real: jax.Array | bool = True,
                     use_imag: jax.Array | bool = True, subset: int | None = None, key: jax.Array | None = None,
                     candidates: tuple[Transitions, jax.Array] | None = None) -> Neighbor:
    """The nearest row of real ∪ imaginary in the joint space (each buffer searched by :func:`nearest_row`).

    Args:
      query_state, query_embedding, query_action: (B, S), (B, E), (B, A') as in :func:`nearest_row`.
      data: the two buffers (same state width, action shape and embedding width).
      normalizer, beta, chunk, num_actions: as in :func:`nearest_row`.
      use_real, use_imag: () bool (traced): which buffers belong to the searched set; at least one must be
        True (with both False every distance is +inf and row 0 of the real buffer is returned).
      subset: static; None (default) searches every row (exact). m >= 1 searches m rows drawn uniformly
        with replacement from each buffer holding more than m rows (approximate, module docstring).
      key: PRNG key of the draw; required with ``subset``.
      candidates: optional extra rows known to belong to the searched set, e.g. the training batch
        itself: (a buffer from :func:`rows_as_buffer`, (B',) bool imaginary flags of its rows). With the
        batch, the approximate search is never worse than each query's own row.

    Returns:
      The :class:`Neighbor` of each query (indices into the full buffers; −1 when the winner is one of
      ``candidates``). On exact ties the real buffer wins, then the imaginary one, then ``candidates``.
    """
    kw = dict(chunk=chunk, num_actions=num_actions)

    def search(buffer: Transitions, allowed, buffer_key, window) -> tuple[jax.Array, jax.Array]:
        if subset is None or subset >= buffer.state.shape[0]:
            return nearest_row(query_state, query_embedding, query_action, buffer, normalizer, beta,
                               allowed=allowed, window=window, **kw)
        sample, rows = random_rows(buffer_key, buffer, subset, window)
        distance, index = nearest_row(query_state, query_embedding, query_action, sample, normalizer, beta,
                                      allowed=allowed, **kw)
        return distance, rows[index]

    if subset is not None:
        if isinstance(subset, bool) or not isinstance(subset, int) or subset < 1:
            raise ValueError(f"subset must be None (exact search) or a static int >= 1, got {subset!r}")
        if key is None:
            raise ValueError("subset search draws rows at random: pass key=...")
        real_key, imag_key = jax.random.split(key)
    else:
        real_key = imag_key = None
    b = query_state.shape[0]
    exact = lambda buffer, i: joint_distance(query_state, query_embedding, query_action, buffer, i, normalizer,
                                             beta, num_actions)
    found = []  # (distance, index, imaginary, action) per source, in tie-breaking order
    for buffer, allowed, buffer_key, flag, window in ((data.real, use_real, real_key, False, None),
                                                      (data.imag, use_imag, imag_key, True, data.imag_rows)):
        d, i = search(buffer, allowed, buffer_key, window)
        found.append((jnp.where(jnp.isinf(d), d, exact(buffer, i)), i, jnp.full((b,), flag), buffer.action[i]))
    if candidates is not None:
        buffer, flags = candidates
        d, i = nearest_row(query_state, query_embedding, query_action, buffer, normalizer, beta, **kw)
        found.append((exact(buffer, i), jnp.full((b,), -1, jnp.int32), flags[i], buffer.action[i]))
    distances = jnp.stack([f[0] for f in found])  # (sources, B)
    best = jnp.argmin(distances, axis=0)  # the first source on ties
    pick = lambda n: jnp.stack([f[n] for f in found])[best, jnp.arange(b)]
    return Neighbor(distance=pick(0), index=pick(1), imaginary=pick(2), action=pick(3))


def check_search_options(chunk: int, subset: int | None) -> None:
    """Refuses a ``chunk`` that is not a static int >= 1 or a ``subset`` that is neither None nor one."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a static int >= 1 (dataset rows per search step), got {chunk!r}")
    if subset is not None and (isinstance(subset, bool) or not isinstance(subset, int) or subset < 1):
        raise ValueError(f"subset must be None (exact search, the default) or a static int >= 1 (rows drawn "
                         f"per buffer and update), got {subset!r}")


def batch_neighbor(batch: Batch, query_action: jax.Array, data: Datasets, stats: DataStats, beta: jax.Array | float,
                   *, chunk: int, num_actions: int | None = None, subset: int | None = None,
                   key: jax.Array | None = None) -> Neighbor:
    """The neighbours of a training batch's (state, embedding, ``query_action``) in the batch's own support.

    The real buffer is searched when the batch has real rows, the imaginary one when it has imaginary rows;
    with ``subset`` the batch's own rows join the candidates (each is a dataset row of the searched set).
    """
    approximate = {} if subset is None else {
        "subset": subset, "key": key,
        "candidates": (rows_as_buffer(batch.state, batch.embedding, batch.action), batch.imaginary)}
    return nearest_neighbor(batch.state, batch.embedding, query_action, data, stats, beta, chunk=chunk,
                            num_actions=num_actions, use_real=~jnp.all(batch.imaginary),
                            use_imag=jnp.any(batch.imaginary), **approximate)
