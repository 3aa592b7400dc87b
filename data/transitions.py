"""From padded trajectories (host) to flat transition buffers (device).

* :func:`to_transitions` flattens the valid steps of a :class:`TrajectoryDataset`. ``terminal`` is 1.0
  only on true terminations: a time-limit truncation or the end of a generated rollout is *not* terminal,
  so its next state is still bootstrapped (the reference treated every trajectory end as terminal).
* :func:`concat_transitions` merges buffers of the same spaces into one (instruction tables appended).
* :func:`placeholder_like` builds the imaginary buffer of a level that has no imaginary data (``train``):
  the engine always calls ``sample_mixed(key, real, imag, B, ratio)``, which indexes both buffers, so
  ``imag`` needs at least one row; with ratio 0 none of its rows is ever drawn into a batch.
* :func:`check_transitions` is the shape / dtype contract of a buffer, asserted (statically, so also
  under ``jit``) by the samplers.
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.data.errors import DatasetError
from imaginejax.data.types import TrajectoryDataset, Transitions
from imaginejax.data.validate import validate_dataset

__all__ = ["check_transitions", "concat_transitions", "placeholder_like", "to_transitions"]


def check_transitions(data: Transitions, name: str = "data") -> None:
    """Asserts the shape and dtype contract of a transition buffer (static: works under ``jit``).

    The contract: ``state``, ``next_state`` (K, S) float32 with K >= 1; ``action`` (K,) int32 or (K, A)
    float32; ``reward``, ``terminal`` (K,) float32; ``instruction`` (K,) int32; ``goal`` (K, G) int32 or
    float32; ``embeddings`` (M, E) float32 with M >= 1.

    Args:
      data: the buffer.
      name: how to call it in error messages (e.g. ``"imag"``).

    Raises:
      DatasetError: the buffer is empty (K = 0 or M = 0).
      AssertionError: (chex) a shape or dtype breaks the contract.
    """
    chex.assert_rank(data.state, 2, custom_message=f"{name}.state must be (K, S)")
    k, s = data.state.shape
    if k < 1 or data.embeddings.shape[0] < 1:
        raise DatasetError(f"{name}", f"empty buffer (K = {k} transitions, M = {data.embeddings.shape[0]} "
                           "instructions)", "a level without imaginary data takes "
                           "imaginejax.data.placeholder_like(real) as its imaginary buffer, with ratio 0")
    chex.assert_shape(data.next_state, (k, s), custom_message=f"{name}.next_state must match {name}.state")
    chex.assert_type([data.state, data.next_state, data.reward, data.terminal, data.embeddings], jnp.float32)
    chex.assert_shape([data.reward, data.terminal, data.instruction], (k,),
                      custom_message=f"{name}: reward, terminal and instruction must be (K,)")
    chex.assert_type(data.instruction, jnp.int32)
    if data.action.ndim == 1:
        chex.assert_type(data.action, jnp.int32, custom_message=f"{name}.action: discrete actions are int32")
    else:
        chex.assert_shape(data.action, (k, None), custom_message=f"{name}.action must be (K,) or (K, A)")
        chex.assert_type(data.action, jnp.float32, custom_message=f"{name}.action: continuous actions are float32")
    chex.assert_shape(data.goal, (k, None), custom_message=f"{name}.goal must be (K, G)")
    chex.assert_rank(data.embeddings, 2, custom_message=f"{name}.embeddings must be (M, E)")


def to_transitions(ds: TrajectoryDataset, *, validate: bool = True) -> Transitions:
    """Flattens the valid steps of ``ds`` into a device buffer, in trajectory-major order.

    Transition ``k`` is step ``t`` of trajectory ``i`` for the k-th valid (i, t) in row-major order:
    ``state = states[i, t]``, ``next_state = states[i, t + 1]``, ``terminal = terminals[i, t]`` (1.0 on
    true terminations only; truncations are 0.0), ``instruction = instruction_ids[i]``,
    ``goal = goals[i]``; ``embeddings`` is the dataset's instruction-embedding table.

    Args:
      ds: the dataset, N trajectories of T padded steps with K valid steps in total.
      validate: run :func:`validate_dataset` first (default). Only skip it for a dataset that was just
        validated, e.g. returned by :func:`load_dataset`.

    Returns:
      Transitions with state, next_state (K, S) float32; action (K,) int32 or (K, A) float32; reward,
      terminal (K,) float32; instruction (K,) int32; goal (K, G); embeddings (M, E) float32.
    """
    if validate:
        validate_dataset(ds)
    mask = ds.mask
    n, t = mask.shape
    per_step = lambda x: np.broadcast_to(x.reshape((n, 1) + x.shape[1:]), (n, t) + x.shape[1:])[mask]
    out = Transitions(
        state=jnp.asarray(ds.states[:, :-1][mask]),
        action=jnp.asarray(ds.actions[mask]),
        reward=jnp.asarray(ds.rewards[mask]),
        next_state=jnp.asarray(ds.states[:, 1:][mask]),
        terminal=jnp.asarray(ds.terminals[mask].astype(np.float32)),
        instruction=jnp.asarray(per_step(ds.instruction_ids)),
        goal=jnp.asarray(per_step(ds.goals)),
        embeddings=jnp.asarray(ds.instruction_embeddings),
    )
    check_transitions(out, name=f"{ds.source}")
    return out


def concat_transitions(parts: Sequence[Transitions]) -> Transitions:
    """Concatenates buffers of the same spaces (e.g. several imaginary datasets of one level) into one.

    The instruction tables are appended in order and each part's ``instruction`` ids are offset by the
    number of table rows before it, so every transition keeps its own embedding.

    Args:
      parts: P >= 1 buffers with equal S, action shape/dtype, G, goal dtype and E; part p has K_p
        transitions and M_p instructions.

    Returns:
      One buffer with sum(K_p) transitions (part order kept) and an (sum(M_p), E) table.
    """
    if not parts:
        raise ValueError("concat_transitions needs at least one buffer")
    for p, part in enumerate(parts):
        check_transitions(part, name=f"parts[{p}]")
    first = parts[0]
    for p, part in enumerate(parts[1:], start=1):
        for field in ("state", "action", "goal", "embeddings"):
            a, b = getattr(first, field), getattr(part, field)
            if a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
                raise ValueError(f"parts[{p}].{field} is {b.dtype}{list(b.shape)[1:]} per row but parts[0].{field} "
                                 f"is {a.dtype}{list(a.shape)[1:]}: only buffers of the same spaces concatenate")
    offsets = np.cumsum([0] + [part.embeddings.shape[0] for part in parts[:-1]])
    cat = lambda field: jnp.concatenate([getattr(part, field) for part in parts], axis=0)
    return Transitions(
        state=cat("state"),
        action=cat("action"),
        reward=cat("reward"),
        next_state=cat("next_state"),
        terminal=cat("terminal"),
        instruction=jnp.concatenate([part.instruction + jnp.int32(off) for part, off in zip(parts, offsets)]),
        goal=cat("goal"),
        embeddings=cat("embeddings"),
    )


def placeholder_like(reference: Transitions) -> Transitions:
    """A one-transition, all-zero buffer with the per-row shapes and dtypes of ``reference``.

    It stands in for the imaginary buffer of a level without imaginary data (``train``), so the engine
    compiles the same ``sample_mixed(key, real, imag, B, ratio)`` call for every level. With ``ratio = 0``
    :func:`~imaginejax.data.sampling.sample_mixed` draws none of its rows (the batch equals an all-real
    draw); a ratio > 0 would draw zero transitions flagged imaginary, so callers that pass a placeholder
    must keep ratio 0 (check this on the host, where the ratios are known).

    Args:
      reference: a buffer, typically the real one; (K, ...) fields and an (M, E) table.

    Returns:
      Transitions with every field of shape (1, ...) — the table (1, E) — filled with zeros.
    """
    check_transitions(reference, name="reference")
    return jax.tree.map(lambda x: jnp.zeros((1,) + x.shape[1:], x.dtype), reference)
