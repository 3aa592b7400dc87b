"""A BERT-family transformer encoder in ``flax.linen`` (inference).

The math follows Hugging Face's ``BertModel`` exactly (post-LayerNorm blocks, padded keys masked out
of the attention softmax, the activation named by ``hidden_act``, ``layer_norm_eps`` from the config,
two-pass LayerNorm variance), so weights trained in PyTorch load unchanged (see
:mod:`imaginejax.lang.encoder`). Dropout is omitted: this module is only used to *embed* text, where
dropout is the identity.

Shapes: ``B`` batch rows, ``L`` tokens per row, ``H`` hidden size, ``N`` heads, ``D = H / N``.

Parameter tree (what :func:`imaginejax.lang.encoder.bert_params_from_state_dict` fills)::

    embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding
    embeddings/LayerNorm/{scale,bias}
    layer_{i}/attention/{query,key,value,output}/{kernel,bias}
    layer_{i}/attention_norm/{scale,bias}
    layer_{i}/intermediate/{kernel,bias}
    layer_{i}/output/{kernel,bias}
    layer_{i}/output_norm/{scale,bias}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

# Matmul precision: full float32 on every backend (accelerators otherwise default to bf16/TF32 passes),
# so embeddings agree with the PyTorch reference to ~1e-6 wherever they are computed.
DEFAULT_PRECISION = jax.lax.Precision.HIGHEST

_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # erf form, as torch.nn.functional.gelu
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_fast": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}
SUPPORTED_ACTIVATIONS: tuple[str, ...] = tuple(sorted(_ACTIVATIONS))


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Static architecture of a BERT encoder (the fields of a Hugging Face ``config.json`` we use).

    Frozen and hashable, so a module built from it can be a static argument of ``jax.jit``.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"BertConfig.hidden_act={self.hidden_act!r} is not supported; "
                             f"use one of {SUPPORTED_ACTIVATIONS}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"BertConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")

    @property
    def head_dim(self) -> int:
        """Width ``D`` of one attention head."""
        return self.hidden_size // self.num_attention_heads


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    """LayerNorm with BERT's epsilon and the two-pass variance PyTorch uses."""
    return nn.LayerNorm(epsilon=config.layer_norm_eps, use_fast_variance=False, name=name)


class BertEmbeddings(nn.Module):
    """Word + absolute position + token-type embeddings, then LayerNorm.

    ``input_ids``, ``token_type_ids``: (B, L) int32 -> (B, L, H) float32.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
        cfg = self.config
        seq_len = input_ids.shape[-1]
        if seq_len > cfg.max_position_embeddings:
            raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings "
                             f"{cfg.max_position_embeddings}; truncate the tokens first")
        words = nn.Embed(cfg.vocab_size, cfg.hidden_size, name="word_embeddings")(input_ids)
        positions = nn.Embed(cfg.max_position_embeddings, cfg.hidden_size,
                             name="position_embeddings")(jnp.arange(seq_len)[None, :])
        types = nn.Embed(cfg.type_vocab_size, cfg.hidden_size,
                         name="token_type_embeddings")(token_type_ids)
        return _layer_norm(cfg, "LayerNorm")(words + positions + types)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with a padding mask, followed by the output projection.

    ``hidden``: (B, L, H); ``attention_mask``: (B, L), 1/True for real tokens -> (B, L, H).
    Padded key positions get zero weight; a row with no real token attends uniformly (finite output,
    discarded by the caller's pooling).
    """

    config: BertConfig
    precision: jax.lax.Precision = DEFAULT_PRECISION

    @nn.compact
    def __call__(self, hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
        cfg = self.config
        batch, seq_len, _ = hidden.shape
        heads, head_dim = cfg.num_attention_heads, cfg.head_dim

        def project(name: str) -> jax.Array:
            out = nn.Dense(cfg.hidden_size, precision=self.precision, name=name)(hidden)
            return out.reshape(batch, seq_len, heads, head_dim)  # (B, L, N, D)

        query, key, value = project("query"), project("key"), project("value")
        scores = jnp.einsum("bqnd,bknd->bnqk", query, key, precision=self.precision)
        scores = scores / jnp.asarray(math.sqrt(head_dim), scores.dtype)  # (B, N, L, L)
        keep = attention_mask.astype(bool)[:, None, None, :]  # (B, 1, 1, L)
        scores = jnp.where(keep, scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
        context = jnp.einsum("bnqk,bknd->bqnd", weights, value, precision=self.precision)
        context = context.reshape(batch, seq_len, cfg.hidden_size)
        return nn.Dense(cfg.hidden_size, precision=self.precision, name="output")(context)


class BertLayer(nn.Module):
    """One post-LN encoder block: x = LN(x + Attn(x)); x = LN(x + W2 act(W1 x)).

    ``hidden``: (B, L, H); ``attention_mask``: (B, L) -> (B, L, H).
    """

    config: BertConfig
    precision: jax.lax.Precision = DEFAULT_PRECISION

    @nn.compact
    def __call__(self, hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
        cfg = self.config
        attended = BertSelfAttention(cfg, self.precision, name="attention")(hidden, attention_mask)
        hidden = _layer_norm(cfg, "attention_norm")(hidden + attended)
        inner = nn.Dense(cfg.intermediate_size, precision=self.precision, name="intermediate")(hidden)
        inner = _ACTIVATIONS[cfg.hidden_act](inner)
        out = nn.Dense(cfg.hidden_size, precision=self.precision, name="output")(inner)
        return _layer_norm(cfg, "output_norm")(hidden + out)


class BertEncoder(nn.Module):
    """Embeddings followed by ``num_hidden_layers`` encoder blocks (no pooler head).

    ``input_ids``: (B, L) int; ``attention_mask``: (B, L) {0,1}; ``token_type_ids``: (B, L) int or
    None (all zeros) -> last hidden states (B, L, H) float32.
    """

    config: BertConfig
    precision: jax.lax.Precision = DEFAULT_PRECISION

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(f"input_ids and attention_mask must both be (B, L); got "
                             f"{input_ids.shape} and {attention_mask.shape}")
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        hidden = BertEmbeddings(self.config, name="embeddings")(input_ids, token_type_ids)
        for index in range(self.config.num_hidden_layers):
            hidden = BertLayer(self.config, self.precision, name=f"layer_{index}")(
                hidden, attention_mask)
        return hidden
