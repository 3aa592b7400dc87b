"""Jitted greedy generation with the KV cache: one prefill call, then a ``lax.while_loop`` of decode steps.

Batches may be padded on the left or the right (or both): the prompt's ``attention_mask`` marks real
tokens, each row's positions count only its real tokens, padded cache slots are never attended to,
and the first new token of a row follows its *last real* prompt token. So a row's output does not
depend on how it was padded or what it was batched with (up to float rounding).

Each row stops at its first EOS (any of ``eos_token_ids``; the EOS is kept in the output) or after
``max_new_tokens``; later slots hold ``pad_token_id``. The loop ends early once every row has
stopped. ``max_new_tokens`` and the EOS set are static (one compilation per value); the prompt
width is a shape (one compilation per width: pad prompts to a few bucket widths).

``dtype`` and ``precision`` are the forward pass's (:func:`~imaginejax.imaginer.llama.compute_setting`):
with ``dtype=jnp.bfloat16`` every step computes in bfloat16 and the KV cache holds bfloat16.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from imaginejax.imaginer.llama import (
    DEFAULT_PRECISION,
    KVCache,
    LlamaConfig,
    Params,
    forward,
    init_cache,
    lm_logits,
)


class GenerationOutput(NamedTuple):
    """Result of :func:`greedy_generate`.

    ``tokens``: (B, N) int32 new tokens, ``pad_token_id`` after a row's EOS. ``num_generated``:
    (B,) int32, tokens up to and including the first EOS (N if none). ``finished``: (B,) bool, the
    row emitted an EOS.
    """

    tokens: jax.Array
    num_generated: jax.Array
    finished: jax.Array


def last_real_index(attention_mask: jax.Array) -> jax.Array:
    """Index of the last real token of each row: (B, P) {0,1} -> (B,) int32 (P - 1 for an all-pad
    row, whose output is meaningless)."""
    width = attention_mask.shape[1]
    reversed_first = jnp.argmax(attention_mask[:, ::-1].astype(bool), axis=1)
    return (width - 1 - reversed_first).astype(jnp.int32)


def prefill(params: Params, config: LlamaConfig, *, input_ids: jax.Array | None = None,
            inputs_embeds: jax.Array | None = None, attention_mask: jax.Array | None = None,
            max_length: int, cache_dtype: Any = None,
            precision: Any = DEFAULT_PRECISION, dtype: Any = None) -> tuple[jax.Array, KVCache]:
    """Run a (padded) prompt into a fresh cache of ``max_length`` slots.

    Exactly one of ``input_ids`` (B, P) and ``inputs_embeds`` (B, P, D); ``attention_mask`` (B, P)
    {0,1}, default all ones. ``dtype``: the compute dtype (None: the parameters'); ``cache_dtype``
    defaults to it, else to the embedding table's dtype.
    -> (final hidden state at each row's last real token (B, D), the cache holding the prompt).
    """
    source = input_ids if input_ids is not None else inputs_embeds
    if source is None:
        raise ValueError("prefill needs input_ids or inputs_embeds")
    batch, width = source.shape[:2]
    if attention_mask is None:
        attention_mask = jnp.ones((batch, width), jnp.int32)
    if max_length < width:
        raise ValueError(f"max_length={max_length} is shorter than the prompt width {width}")
    cache_dtype = cache_dtype or dtype or params["embed_tokens"]["embedding"].dtype
    cache = init_cache(config, batch, max_length, cache_dtype)
    out = forward(params, config, input_ids, inputs_embeds=inputs_embeds,
                  attention_mask=attention_mask, cache=cache, compute_logits=False,
                  precision=precision, dtype=dtype)
    last = last_real_index(attention_mask)
    final_hidden = jnp.take_along_axis(out.hidden_states, last[:, None, None], axis=1)[:, 0]
    return final_hidden, out.cache


@functools.partial(jax.jit, static_argnames=("config", "max_new_tokens", "eos_token_ids",
                                             "pad_token_id", "precision", "dtype"))
def greedy_generate(params: Params, config: LlamaConfig, input_ids: jax.Array,
                    attention_mask: jax.Array | None = None, *, max_new_tokens: int,
                    eos_token_ids: tuple[int, ...] | None = None, pad_token_id: int | None = None,
                    precision: Any = DEFAULT_PRECISION, dtype: Any = None) -> GenerationOutput:
    """Greedy (argmax) continuation of a batch of prompts, jitted, with a KV cache.

    ``input_ids``: (B, P) int; ``attention_mask``: (B, P) {0,1} (left and/or right padding; default
    all ones). ``eos_token_ids`` defaults to ``config.eos_token_ids`` (empty: never stop early);
    ``pad_token_id`` to ``config.pad_token_id``, else the first EOS, else 0. ``dtype``,
    ``precision``: the compute dtype (None: the parameters') and matmul precision.
    -> :class:`GenerationOutput` with (B, ``max_new_tokens``) tokens.
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens}")
    eos_ids = tuple(config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    if pad_token_id is None:
        pad_token_id = (config.pad_token_id if config.pad_token_id is not None
                        else eos_ids[0] if eos_ids else 0)
    batch, width = input_ids.shape
    eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)

    final_hidden, cache = prefill(params, config, input_ids=input_ids,
                                  attention_mask=attention_mask,
                                  max_length=width + max_new_tokens, precision=precision, dtype=dtype)
    first = jnp.argmax(lm_logits(params, config, final_hidden, precision, dtype), axis=-1).astype(jnp.int32)
    tokens = jnp.full((batch, max_new_tokens), pad_token_id, jnp.int32).at[:, 0].set(first)
    finished = jnp.isin(first, eos)

    def keep_going(state: tuple[jax.Array, jax.Array, jax.Array, jax.Array, KVCache]) -> jax.Array:
        step, _, _, finished, _ = state
        return (step < max_new_tokens) & ~jnp.all(finished)

    def decode(state: tuple[jax.Array, jax.Array, jax.Array, jax.Array, KVCache]
               ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, KVCache]:
        step, tokens, current, finished, cache = state
        out = forward(params, config, current[:, None], cache=cache, precision=precision, dtype=dtype)
        following = jnp.argmax(out.logits[:, 0], axis=-1).astype(jnp.int32)
        following = jnp.where(finished, pad_token_id, following)
        tokens = jax.lax.dynamic_update_slice(tokens, following[:, None], (0, step))
        finished = finished | jnp.isin(following, eos)
        return step + 1, tokens, following, finished, out.cache

    state = (jnp.ones((), jnp.int32), tokens, first, finished, cache)
    _, tokens, _, finished, _ = jax.lax.while_loop(keep_going, decode, state)
    is_eos = jnp.isin(tokens, eos)
    num_generated = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1) + 1,
                              max_new_tokens).astype(jnp.int32)
    return GenerationOutput(tokens, num_generated, finished)
