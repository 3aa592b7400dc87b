"""LoRA: low-rank adapters on the projections of a frozen Llama (attention by default, MLP optional).

For each targeted projection ``W`` (D_in, D_out) of each layer, two trainable matrices
``a`` (D_in, r) and ``b`` (r, D_out) add ``scale · a @ b`` to ``W`` with ``scale = alpha / r``.
``a`` starts random (normal, std 1/sqrt(D_in)) and ``b`` at zero, so the model starts exactly at the
base model. Two forms of the same function:

* *attached* (:func:`attach_lora`, what fine-tuning differentiates): the kernels stay as they are and each
  targeted projection computes ``x W + (x · scale a) b`` (:class:`~imaginejax.imaginer.llama.Projection`).
  Its backward pass costs ``2 T r (D_in + D_out)`` FLOPs per projection for the factors' gradients instead
  of the ``2 T D_in D_out`` of the frozen kernel's gradient, which the merged form must form first (a third
  of a step's matmul FLOPs with every projection targeted; docs/imaginer.md "LoRA merged or attached");
* *merged* (:func:`merge_lora`, what generation and export use): ``W + scale a b`` written into a copy
  of the kernels, so a merged model generates at the plain Llama's speed.

Gradients reach only ``a`` and ``b``; the base tree is an input that is never differentiated, so it stays
bit-identical.

LoRA tree: ``{"layers_{i}": {"q_proj": {"a": (D, r), "b": (r, H*Dh)}, ...}}`` (float32); a target's
module (``self_attn`` or ``mlp``) follows from its name (:data:`TARGET_MODULE`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import jax
import jax.numpy as jnp

from imaginejax.imaginer.llama import LlamaConfig, Params

__all__ = ["LORA_TARGETS", "ATTENTION_TARGETS", "TARGET_MODULE", "init_lora", "merge_lora", "attach_lora",
           "lora_scale"]

ATTENTION_TARGETS: Final[tuple[str, ...]] = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS: Final[tuple[str, ...]] = ("gate_proj", "up_proj", "down_proj")
LORA_TARGETS: Final[tuple[str, ...]] = ATTENTION_TARGETS + MLP_TARGETS
TARGET_MODULE: Final[dict[str, str]] = {**{t: "self_attn" for t in ATTENTION_TARGETS},
                                        **{t: "mlp" for t in MLP_TARGETS}}


def lora_scale(rank: int, alpha: float) -> float:
    """``alpha / rank``."""
    if rank <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {rank}")
    return float(alpha) / float(rank)


def init_lora(key: jax.Array, llama_params: Params, config: LlamaConfig, rank: int,
              targets: Sequence[str] = ATTENTION_TARGETS) -> Params:
    """Fresh LoRA matrices for ``targets`` of every layer (``b`` zero: the merged model equals the
    base)."""
    if rank <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {rank}")
    unknown = set(targets) - set(LORA_TARGETS)
    if unknown:
        raise ValueError(f"unknown LoRA targets {sorted(unknown)}; valid: {LORA_TARGETS}")
    lora: Params = {}
    for layer in range(config.num_hidden_layers):
        name = f"layers_{layer}"
        entry = {}
        for index, target in enumerate(targets):
            d_in, d_out = llama_params[name][TARGET_MODULE[target]][target]["kernel"].shape
            sub = jax.random.fold_in(jax.random.fold_in(key, layer), index)
            entry[target] = {
                "a": jax.random.normal(sub, (d_in, rank), jnp.float32) / jnp.sqrt(float(d_in)),
                "b": jnp.zeros((rank, d_out), jnp.float32),
            }
        lora[name] = entry
    return lora


def _replace_targets(llama_params: Params, lora: Params,
                     replace: Callable[[Params, Params], Params]) -> Params:
    """``llama_params`` with each LoRA-targeted module replaced by ``replace(module, factors)``; new dicts on
    the path to each replaced module, every other leaf shared (``llama_params`` is not modified)."""
    out = dict(llama_params)
    for name, targets in lora.items():
        layer = dict(out[name])
        for target, factors in targets.items():
            parent = dict(layer[TARGET_MODULE[target]])
            parent[target] = replace(parent[target], factors)
            layer[TARGET_MODULE[target]] = parent
        out[name] = layer
    return out


def merge_lora(llama_params: Params, lora: Params, scale: float) -> Params:
    """Backbone parameters with ``kernel + scale · a @ b`` for every LoRA entry (in the kernel's dtype).

    Pure and differentiable in ``lora``; ``llama_params`` is not modified (new dicts on the path to
    each merged kernel, every other leaf shared).
    """

    def merged(module: Params, factors: Params) -> Params:
        kernel = module["kernel"]
        delta = scale * jnp.dot(factors["a"], factors["b"], precision=jax.lax.Precision.HIGHEST)
        return {**module, "kernel": (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)}

    return _replace_targets(llama_params, lora, merged)


def attach_lora(llama_params: Params, lora: Params, scale: float) -> Params:
    """Backbone parameters whose targeted modules also hold ``lora_a = scale · a`` and ``lora_b = b`` (the
    unmerged form :class:`~imaginejax.imaginer.llama.Projection` computes); kernels untouched, every other
    leaf shared. Equal to :func:`merge_lora`'s model up to rounding, and differentiable in ``lora``."""
    return _replace_targets(llama_params, lora, lambda module, factors: {
        **module, "lora_a": scale * factors["a"], "lora_b": factors["b"]})
