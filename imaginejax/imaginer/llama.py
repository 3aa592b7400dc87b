"""The Llama architecture in ``flax.linen``: configuration, decoder, KV cache, a pure forward function.

The math follows Hugging Face's PyTorch ``LlamaForCausalLM`` (transformers 5) so that checkpoints
trained there load unchanged (see :mod:`imaginejax.imaginer.loading`):

* pre-norm decoder blocks ``x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x))``, a final RMSNorm and an LM
  head (its own matrix, or the token-embedding matrix when ``tie_word_embeddings``);
* RMSNorm computed in float32 and cast back before the learned scale;
* rotary position embeddings in the *rotate-half* layout (dimension ``i`` of a head pairs with
  ``i + head_dim / 2``), with the config's ``rope_theta`` and optional ``"linear"`` or ``"llama3"``
  frequency scaling;
* grouped-query attention (query head ``h`` reads key/value head ``h // (heads / kv_heads)``), scores
  scaled by ``head_dim ** -0.5``, causal and padding masks, softmax in float32;
* a SwiGLU MLP ``down(silu(gate(x)) * up(x))``.

Compute dtype (``dtype`` of the modules and of :func:`forward`, Flax's convention; :func:`compute_setting`
maps a name to it and its matmul precision): None computes every matmul in the parameters' dtype
(float32 parameters: float32 at ``Precision.HIGHEST``); ``jnp.bfloat16`` casts the weights and inputs
of every projection, the attention products and the LM head to bfloat16 (the backend's default
precision, float32 accumulation), while the residual stream keeps the embeddings' dtype (float32 for
float32 parameters), RMSNorm statistics, rotary embeddings and softmax are float32, and attention
scores and logits come out of their matmuls in float32. Parameters keep their own dtype (``param_dtype``).

Shapes: ``B`` batch rows, ``L`` new tokens per row, ``T`` key/value slots (``L`` without a cache, the
cache's fixed length with one), ``D`` hidden size, ``H`` query heads, ``K`` key/value heads,
``Dh`` head width, ``V`` vocabulary.

Parameter tree (a plain nested dict; what :mod:`~imaginejax.imaginer.loading` fills)::

    embed_tokens/embedding                                    (V, D)
    layers_{i}/input_layernorm/scale                          (D,)
    layers_{i}/self_attn/{q_proj,k_proj,v_proj}/kernel        (D, H*Dh) / (D, K*Dh) [+ bias]
    layers_{i}/self_attn/o_proj/kernel                        (H*Dh, D)             [+ bias]
    layers_{i}/post_attention_layernorm/scale                 (D,)
    layers_{i}/mlp/{gate_proj,up_proj}/kernel                 (D, I)                [+ bias]
    layers_{i}/mlp/down_proj/kernel                           (I, D)                [+ bias]
    norm/scale                                                (D,)
    lm_head/kernel                                            (D, V)  (only when not tied)

Padding and positions: ``attention_mask`` (B, L) marks real tokens. Padded keys never receive
attention; a padded *query* row is computed (finite) but meaningless. Positions default to the
number of real tokens before each token in its row (so left and right padding give every real
token the position it would have unpadded), continuing from the cache's per-row counts.

KV cache: :class:`KVCache` holds fixed-length key/value buffers shared by all rows, written at one
slot index for the whole batch with ``lax.dynamic_update_slice``; ``valid`` records which slots hold
real tokens of each row, so rows of different lengths share the buffers. The caller sizes the cache:
writing past its end is not detected inside ``jit`` (the write start is clamped by XLA).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# Full float32 matmuls on every backend (accelerators otherwise default to reduced-precision passes),
# so float32 logits agree with the PyTorch reference to ~1e-5 wherever they are computed. With
# bfloat16 parameters the matmuls run in bfloat16 regardless.
DEFAULT_PRECISION = jax.lax.Precision.HIGHEST

COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
"""Names of the compute dtypes :func:`compute_setting` knows."""


def check_choice(owner: str, field: str, value: Any, choices: tuple[str, ...], hint: str = "") -> None:
    """Refuse a setting outside its choices: ``ValueError("<owner>: <field> = <value> is not one of ...")``."""
    if value not in choices:
        raise ValueError(f"{owner}: {field} = {value!r} is not one of {', '.join(choices)}" + (f"; {hint}" if hint else ""))

Params = dict[str, Any]
"""The ``params`` collection of :class:`LlamaForCausalLM`: a nested dict of arrays (see module doc)."""

SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")


def compute_setting(compute_dtype: str) -> tuple[Any, Any]:
    """``(dtype, precision)`` of :func:`forward` for a compute dtype name.

    ``"float32"`` -> ``(None, Precision.HIGHEST)``: the parameters' dtype, full float32 matmuls (the
    float32 path, bit for bit). ``"bfloat16"`` -> ``(jnp.bfloat16, None)``: bfloat16 matmuls at the
    backend's default precision (its bfloat16 units).
    """
    if compute_dtype == "float32":
        return None, DEFAULT_PRECISION
    if compute_dtype == "bfloat16":
        return jnp.bfloat16, None
    raise ValueError(f"compute dtype {compute_dtype!r} is not supported; use one of {COMPUTE_DTYPES}")


# ---------------------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Frequency scaling of the rotary embedding (Hugging Face ``rope_scaling`` / ``rope_parameters``).

    ``"linear"``: every inverse frequency divided by ``factor`` (positions interpolated).
    ``"llama3"``: Llama 3.1's piecewise rule — wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, shorter than
    ``original_max_position_embeddings / high_freq_factor`` are kept, and those in between are
    interpolated smoothly.
    """

    rope_type: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"RopeScaling.rope_type must be 'linear' or 'llama3', got "
                             f"{self.rope_type!r}")
        if not self.factor > 0:
            raise ValueError(f"RopeScaling.factor must be > 0, got {self.factor!r}")
        if self.rope_type == "llama3":
            if not self.high_freq_factor > self.low_freq_factor > 0:
                raise ValueError(
                    "RopeScaling (llama3) needs high_freq_factor > low_freq_factor > 0, got "
                    f"{self.high_freq_factor!r} and {self.low_freq_factor!r}")
            if self.original_max_position_embeddings <= 0:
                raise ValueError("RopeScaling.original_max_position_embeddings must be > 0, got "
                                 f"{self.original_max_position_embeddings!r}")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Static architecture of a Llama decoder (the fields of a Hugging Face ``LlamaConfig`` we use).

    Frozen and hashable, so it can be a static argument of ``jax.jit``. ``num_key_value_heads``
    defaults to ``num_attention_heads`` (plain multi-head attention) and ``head_dim`` to
    ``hidden_size // num_attention_heads``. ``eos_token_ids`` is a tuple (Llama 3 lists several).
    Build one from a Hugging Face config with :meth:`from_hf`.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        # Frozen dataclass: fill the derived defaults in place once, before anyone can hash it.
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None and isinstance(self.num_attention_heads, int) \
                and self.num_attention_heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if isinstance(self.eos_token_ids, int):
            object.__setattr__(self, "eos_token_ids", (self.eos_token_ids,))
        else:
            object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"LlamaConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even for rotary embeddings, got "
                             f"{self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"LlamaConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"LlamaConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError("LlamaConfig.rope_scaling must be a RopeScaling or None, got "
                            f"{type(self.rope_scaling).__name__}; use LlamaConfig.from_hf for dicts")
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"LlamaConfig.{name}={value!r} is outside the vocabulary "
                                 f"[0, {self.vocab_size})")
        for value in self.eos_token_ids:
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"LlamaConfig.eos_token_ids contains {value!r}, outside the "
                                 f"vocabulary [0, {self.vocab_size})")

    @property
    def num_key_value_groups(self) -> int:
        """Query heads per key/value head (``H / K``)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | Any) -> LlamaConfig:
        """A :class:`LlamaConfig` from a Hugging Face config: a ``config.json`` dict or a
        ``transformers.LlamaConfig`` (anything with ``to_dict()``).

        Reads both the transformers 5 ``rope_parameters`` layout and the older top-level
        ``rope_theta`` + ``rope_scaling`` (``"type"`` or ``"rope_type"``). Rejects what this
        implementation does not compute (another ``model_type`` or activation, other RoPE types,
        attention or MLP tensor parallel slicing) with the field named.
        """
        if not isinstance(config, Mapping):
            if not hasattr(config, "to_dict"):
                raise TypeError("LlamaConfig.from_hf expects a dict or a transformers config, got "
                                f"{type(config).__name__}")
            config = config.to_dict()
        fields = dict(config)
        model_type = fields.get("model_type", "llama")
        if model_type not in ("llama", "mistral"):
            raise ValueError(f"config model_type={model_type!r} is not a Llama model; this loader "
                             "computes the Llama architecture only")
        activation = fields.get("hidden_act", "silu")
        if activation not in ("silu", "swish"):
            raise ValueError(f"config hidden_act={activation!r} is not supported; Llama's SwiGLU "
                             "MLP uses 'silu'")
        if fields.get("sliding_window") not in (None, 0):
            raise ValueError(f"config sliding_window={fields['sliding_window']!r} is not supported "
                             "(full causal attention only)")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads"):
            if fields.get(name) is None:
                raise ValueError(f"config is missing required field {name!r}")

        rope = fields.get("rope_parameters")
        if rope is None:
            rope = dict(fields.get("rope_scaling") or {})
            rope.setdefault("rope_theta", fields.get("rope_theta", 10000.0))
        else:
            rope = dict(rope)
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        rope_theta = float(rope.get("rope_theta", fields.get("rope_theta", 10000.0)))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"config rope type {rope_type!r} is not supported; use one of "
                             f"{SUPPORTED_ROPE_TYPES}")
        scaling: RopeScaling | None = None
        if rope_type == "linear":
            scaling = RopeScaling("linear", float(rope["factor"]))
        elif rope_type == "llama3":
            for name in ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"):
                if name not in rope:
                    raise ValueError(f"llama3 rope scaling is missing {name!r}")
            scaling = RopeScaling("llama3", float(rope["factor"]),
                                  float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                                  int(rope["original_max_position_embeddings"]))

        eos = fields.get("eos_token_id")
        eos_ids: tuple[int, ...] = () if eos is None else (
            (int(eos),) if isinstance(eos, int) else tuple(int(value) for value in eos))
        return cls(
            vocab_size=int(fields["vocab_size"]),
            hidden_size=int(fields["hidden_size"]),
            intermediate_size=int(fields["intermediate_size"]),
            num_hidden_layers=int(fields["num_hidden_layers"]),
            num_attention_heads=int(fields["num_attention_heads"]),
            num_key_value_heads=(None if fields.get("num_key_value_heads") is None
                                 else int(fields["num_key_value_heads"])),
            head_dim=None if fields.get("head_dim") is None else int(fields["head_dim"]),
            rms_norm_eps=float(fields.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            max_position_embeddings=int(fields.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(fields.get("tie_word_embeddings", False)),
            attention_bias=bool(fields.get("attention_bias", False)),
            mlp_bias=bool(fields.get("mlp_bias", False)),
            initializer_range=float(fields.get("initializer_range", 0.02)),
            bos_token_id=None if fields.get("bos_token_id") is None else int(fields["bos_token_id"]),
            eos_token_ids=eos_ids,
            pad_token_id=None if fields.get("pad_token_id") is None else int(fields["pad_token_id"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` fields of this config (transformers 5 layout)."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope.update(dataclasses.asdict(self.rope_scaling))
            if self.rope_scaling.rope_type == "linear":
                for name in ("low_freq_factor", "high_freq_factor",
                             "original_max_position_embeddings"):
                    rope.pop(name)
        eos: int | list[int] | None = (
            None if not self.eos_token_ids else
            self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids))
        return {
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps, "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias, "mlp_bias": self.mlp_bias,
            "initializer_range": self.initializer_range, "bos_token_id": self.bos_token_id,
            "eos_token_id": eos, "pad_token_id": self.pad_token_id,
        }


# ---------------------------------------------------------------------------------------------------
# Rotary embeddings


def rope_inverse_frequencies(config: LlamaConfig) -> np.ndarray:
    """Inverse frequencies ``theta ** (-2i / Dh)`` for ``i < Dh / 2``, with the config's scaling.

    Computed in float32 as PyTorch does, at trace time (the config is static). -> (Dh/2,) float32.
    """
    dim = config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
    old_context = np.float32(scaling.original_max_position_embeddings)
    low_freq_wavelen = old_context / np.float32(scaling.low_freq_factor)
    high_freq_wavelen = old_context / np.float32(scaling.high_freq_factor)
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(scaling.factor), inv_freq)
    smooth = (old_context / wavelen - np.float32(scaling.low_freq_factor)) / (
        np.float32(scaling.high_freq_factor) - np.float32(scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / np.float32(scaling.factor) + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(config: LlamaConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cosines and sines of ``position * inv_freq``: positions (B, L) int -> two (B, L, Dh/2) float32."""
    inv_freq = jnp.asarray(rope_inverse_frequencies(config))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate each head's pairs ``(x[i], x[i + Dh/2])`` by the angles (rotate-half layout).

    ``x``: (B, L, N, Dh); ``cos``, ``sin``: (B, L, Dh/2) float32 -> (B, L, N, Dh) in ``x.dtype``
    (the products are formed in float32 and rounded once to ``x.dtype``).
    """
    half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.astype(jnp.float32)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(dtype)


# ---------------------------------------------------------------------------------------------------
# KV cache


@flax.struct.dataclass
class KVCache:
    """Fixed-length key/value buffers for incremental decoding (a pytree; jit/scan friendly).

    ``keys``, ``values``: one (B, T, K, Dh) array per layer. ``valid``: (B, T) bool, slots holding a
    real token of that row. ``index``: () int32, the next slot to write (shared by all rows).
    ``lengths``: (B,) int32, real tokens written per row (the next default position).
    """

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]
    valid: jax.Array
    index: jax.Array
    lengths: jax.Array

    @property
    def max_length(self) -> int:
        """Number of slots ``T``."""
        return self.valid.shape[1]


def init_cache(config: LlamaConfig, batch_size: int, max_length: int,
               dtype: jnp.dtype = jnp.float32) -> KVCache:
    """An empty :class:`KVCache` of ``max_length`` slots for ``batch_size`` rows (zeros, no valid slot)."""
    if batch_size <= 0 or max_length <= 0:
        raise ValueError(f"init_cache needs batch_size and max_length > 0, got {batch_size} and "
                         f"{max_length}")
    shape = (batch_size, max_length, config.num_key_value_heads, config.head_dim)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_hidden_layers))
    return KVCache(keys=zeros, values=tuple(jnp.zeros(shape, dtype) for _ in zeros),
                   valid=jnp.zeros((batch_size, max_length), bool),
                   index=jnp.zeros((), jnp.int32), lengths=jnp.zeros((batch_size,), jnp.int32))


def default_positions(attention_mask: jax.Array, offsets: jax.Array | None = None) -> jax.Array:
    """Position of each token = real tokens before it in its row (+ ``offsets``, e.g. cache lengths).

    ``attention_mask``: (B, L) {0,1}; ``offsets``: (B,) int or None -> (B, L) int32. Padding positions
    get the position of the next real token (clipped at 0); they are masked anyway.
    """
    counts = jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1
    positions = jnp.maximum(counts, 0) if offsets is None else offsets[:, None] + jnp.maximum(counts, 0)
    return positions.astype(jnp.int32)


# ---------------------------------------------------------------------------------------------------
# Modules


class RMSNorm(nn.Module):
    """``scale * (x / sqrt(mean(x^2) + eps))``, normalised in float32 and cast back before the scale.

    ``x``: (..., D) -> (..., D) in the promoted dtype of ``x`` and ``scale``.
    """

    epsilon: float
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        as_float = x.astype(jnp.float32)
        variance = jnp.mean(jnp.square(as_float), axis=-1, keepdims=True)
        normed = (as_float * jax.lax.rsqrt(variance + self.epsilon)).astype(x.dtype)
        return scale * normed


# Matmuls whose outputs feed a softmax (scores, logits) return float32 whatever their input dtype.
_float32_out = functools.partial(jax.lax.dot_general, preferred_element_type=jnp.float32)


class Projection(nn.Dense):
    """``nn.Dense`` with an optional unmerged low-rank update: when its parameters also hold ``lora_a``
    (D_in, r) and ``lora_b`` (r, D_out) (:func:`imaginejax.imaginer.lora.attach_lora`, the LoRA scale
    folded into ``lora_a``), ``y = x W + b + (x lora_a) lora_b``, both factors in the kernel's compute dtype.
    Training through this form never forms the gradient of the frozen (D_in, D_out) kernel; without the two
    entries it is ``nn.Dense`` exactly."""

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        y = super().__call__(inputs)
        if self.has_variable("params", "lora_a"):
            a, b = self.get_variable("params", "lora_a"), self.get_variable("params", "lora_b")
            low = jnp.dot(inputs.astype(y.dtype), a.astype(y.dtype), precision=self.precision)
            y = y + jnp.dot(low, b.astype(y.dtype), precision=self.precision)
        return y


def _dense(config: LlamaConfig, features: int, use_bias: bool, precision: Any, dtype: Any, name: str
           ) -> nn.Dense:
    """A projection initialised as Hugging Face does (normal(initializer_range), zero bias), computed
    in ``dtype`` (None: the promoted dtype of input and kernel); a :class:`Projection`."""
    return Projection(features, use_bias=use_bias, precision=precision, dtype=dtype, name=name,
                      kernel_init=nn.initializers.normal(config.initializer_range))


class LlamaAttention(nn.Module):
    """Grouped-query self-attention with rotary embeddings, a causal + padding mask and a KV cache.

    ``hidden``: (B, L, D); ``cos``, ``sin``: (B, L, Dh/2); ``attention_mask``: (B, L) bool;
    ``cache``: None or (keys, values, valid, index) with keys/values (B, T, K, Dh), valid (B, T)
    bool (already including this call's tokens) and index () int32.
    -> output (B, L, D) in the projections' dtype, and the updated (keys, values) (B, T, K, Dh) — or
    this call's own when ``cache`` is None (T = L).
    """

    config: LlamaConfig
    precision: Any = DEFAULT_PRECISION
    dtype: Any = None

    @nn.compact
    def __call__(self, hidden: jax.Array, cos: jax.Array, sin: jax.Array,
                 attention_mask: jax.Array,
                 cache: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None = None,
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        cfg = self.config
        batch, length, _ = hidden.shape
        heads, kv_heads, head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        groups = cfg.num_key_value_groups

        dense = functools.partial(_dense, cfg, use_bias=cfg.attention_bias, precision=self.precision,
                                  dtype=self.dtype)
        query = dense(heads * head_dim, name="q_proj")(hidden)
        key = dense(kv_heads * head_dim, name="k_proj")(hidden)
        value = dense(kv_heads * head_dim, name="v_proj")(hidden)
        query = apply_rope(query.reshape(batch, length, heads, head_dim), cos, sin)
        key = apply_rope(key.reshape(batch, length, kv_heads, head_dim), cos, sin)
        value = value.reshape(batch, length, kv_heads, head_dim)

        if cache is None:
            keys, values, key_valid = key, value, attention_mask
            first_slot = jnp.zeros((), jnp.int32)
        else:
            cached_keys, cached_values, key_valid, first_slot = cache
            start = (0, first_slot, 0, 0)
            keys = jax.lax.dynamic_update_slice(cached_keys, key.astype(cached_keys.dtype), start)
            values = jax.lax.dynamic_update_slice(cached_values, value.astype(cached_values.dtype),
                                                  start)
        num_slots = keys.shape[1]

        # Query head h = k * groups + g reads key/value head k (Hugging Face's repeat_kv order).
        grouped = query.reshape(batch, length, kv_heads, groups, head_dim)
        scores = jnp.einsum("blkgd,btkd->bkglt", grouped, keys.astype(query.dtype),
                            precision=self.precision, preferred_element_type=jnp.float32)
        scores = (scores * jnp.asarray(head_dim ** -0.5, scores.dtype)).astype(jnp.float32)
        query_slots = first_slot + jnp.arange(length)  # (L,)
        causal = jnp.arange(num_slots)[None, :] <= query_slots[:, None]  # (L, T)
        keep = causal[None, None, None] & key_valid.astype(bool)[:, None, None, None, :]
        scores = jnp.where(keep, scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(query.dtype)  # (B, K, G, L, T)
        context = jnp.einsum("bkglt,btkd->blkgd", weights, values.astype(query.dtype),
                             precision=self.precision)
        context = context.reshape(batch, length, heads * head_dim)
        output = dense(cfg.hidden_size, name="o_proj")(context)
        return output, (keys, values)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward ``down(silu(gate(x)) * up(x))``: (B, L, D) -> (B, L, D)."""

    config: LlamaConfig
    precision: Any = DEFAULT_PRECISION
    dtype: Any = None

    @nn.compact
    def __call__(self, hidden: jax.Array) -> jax.Array:
        cfg = self.config
        dense = functools.partial(_dense, cfg, use_bias=cfg.mlp_bias, precision=self.precision,
                                  dtype=self.dtype)
        gate = dense(cfg.intermediate_size, name="gate_proj")(hidden)
        up = dense(cfg.intermediate_size, name="up_proj")(hidden)
        return dense(cfg.hidden_size, name="down_proj")(jax.nn.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    """One pre-norm block: ``x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x))``.

    Arguments as :class:`LlamaAttention`; -> (B, L, D) and the layer's updated (keys, values).
    """

    config: LlamaConfig
    precision: Any = DEFAULT_PRECISION
    dtype: Any = None

    @nn.compact
    def __call__(self, hidden: jax.Array, cos: jax.Array, sin: jax.Array,
                 attention_mask: jax.Array,
                 cache: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None = None,
                 ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        cfg = self.config
        normed = RMSNorm(cfg.rms_norm_eps, name="input_layernorm")(hidden)
        attended, kv = LlamaAttention(cfg, self.precision, self.dtype, name="self_attn")(
            normed, cos, sin, attention_mask, cache)
        hidden = hidden + attended
        normed = RMSNorm(cfg.rms_norm_eps, name="post_attention_layernorm")(hidden)
        return hidden + LlamaMLP(cfg, self.precision, self.dtype, name="mlp")(normed), kv


class LlamaOutput(NamedTuple):
    """What :class:`LlamaForCausalLM` returns.

    ``logits``: (B, L, V) float32, or None when not requested. ``hidden_states``: (B, L, D), the
    final-norm output (what the LM head reads) in the residual stream's dtype (the embeddings', also
    with a bfloat16 compute dtype). ``cache``: the updated :class:`KVCache`, or None.
    """

    logits: jax.Array | None
    hidden_states: jax.Array
    cache: KVCache | None


class LlamaForCausalLM(nn.Module):
    """Token embeddings, ``num_hidden_layers`` decoder blocks, final RMSNorm and the LM head.

    Methods: ``__call__`` (the forward pass, see :func:`forward`), ``embed`` (token ids (B, L) ->
    embeddings (B, L, D), for splicing other vectors into ``inputs_embeds``) and ``logits``
    (hidden states (..., D) -> float32 logits (..., V)). ``dtype``: the compute dtype (module doc).
    """

    config: LlamaConfig
    precision: Any = DEFAULT_PRECISION
    dtype: Any = None

    def setup(self) -> None:
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.hidden_size, embedding_init=init)
        self.layers = [LlamaDecoderLayer(cfg, self.precision, self.dtype, name=f"layers_{index}")
                       for index in range(cfg.num_hidden_layers)]
        self.norm = RMSNorm(cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Dense(cfg.vocab_size, use_bias=False, precision=self.precision,
                                    dtype=self.dtype, kernel_init=init, dot_general=_float32_out)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        """Token embeddings: (B, L) int -> (B, L, D) in the embedding table's dtype."""
        if not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise TypeError(f"input_ids must be integers, got {input_ids.dtype}")
        return jnp.take(self.embed_tokens.embedding, input_ids, axis=0)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """LM head: (..., D) -> (..., V) float32 (tied: ``hidden @ embedding.T``)."""
        if self.config.tie_word_embeddings:
            dtype = hidden.dtype if self.dtype is None else self.dtype
            out = jnp.einsum("...d,vd->...v", hidden.astype(dtype),
                             self.embed_tokens.embedding.astype(dtype), precision=self.precision,
                             preferred_element_type=jnp.float32)
        else:
            out = self.lm_head(hidden)
        return out.astype(jnp.float32)

    def __call__(self, input_ids: jax.Array | None = None, *,
                 inputs_embeds: jax.Array | None = None, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, cache: KVCache | None = None,
                 compute_logits: bool = True) -> LlamaOutput:
        cfg = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids (B, L) and inputs_embeds (B, L, D)")
        if inputs_embeds is None:
            if input_ids.ndim != 2:
                raise ValueError(f"input_ids must be (B, L), got shape {input_ids.shape}")
            hidden = self.embed(input_ids)
        else:
            if inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != cfg.hidden_size:
                raise ValueError(f"inputs_embeds must be (B, L, {cfg.hidden_size}), got shape "
                                 f"{inputs_embeds.shape}")
            hidden = inputs_embeds
            # Touch the table so that `init` creates it even from embeddings.
            if self.is_initializing():
                _ = self.embed_tokens.embedding
        batch, length = hidden.shape[:2]
        if attention_mask is None:
            attention_mask = jnp.ones((batch, length), bool)
        elif attention_mask.shape != (batch, length):
            raise ValueError(f"attention_mask must be (B, L) = {(batch, length)}, got "
                             f"{attention_mask.shape}")
        attention_mask = attention_mask.astype(bool)
        if cache is not None:
            if cache.valid.shape[0] != batch:
                raise ValueError(f"cache has {cache.valid.shape[0]} rows, inputs have {batch}")
            if length > cache.max_length:
                raise ValueError(f"{length} tokens do not fit a cache of {cache.max_length} slots")
        if positions is None:
            positions = default_positions(attention_mask,
                                          None if cache is None else cache.lengths)
        elif positions.shape != (batch, length):
            raise ValueError(f"positions must be (B, L) = {(batch, length)}, got {positions.shape}")
        cos, sin = rope_cos_sin(cfg, positions)

        if cache is not None:
            valid = jax.lax.dynamic_update_slice(cache.valid, attention_mask, (0, cache.index))
        new_keys, new_values = [], []
        for index, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (
                cache.keys[index], cache.values[index], valid, cache.index)
            hidden, (keys, values) = layer(hidden, cos, sin, attention_mask, layer_cache)
            new_keys.append(keys)
            new_values.append(values)
        hidden = self.norm(hidden)

        new_cache = None
        if cache is not None:
            new_cache = KVCache(
                keys=tuple(new_keys), values=tuple(new_values), valid=valid,
                index=cache.index + length,
                lengths=cache.lengths + attention_mask.sum(axis=1, dtype=jnp.int32))
        logits = self.logits(hidden) if compute_logits else None
        return LlamaOutput(logits, hidden, new_cache)


# ---------------------------------------------------------------------------------------------------
# Pure functions


def init_params(config: LlamaConfig, key: jax.Array, precision: Any = DEFAULT_PRECISION) -> Params:
    """Randomly initialised parameters (Hugging Face's scheme: normal(initializer_range), unit norms).

    ``key``: a PRNG key -> the ``params`` dict of :class:`LlamaForCausalLM` (float32).
    """
    model = LlamaForCausalLM(config, precision)
    variables = model.init(key, jnp.zeros((1, 1), jnp.int32))
    return dict(variables["params"])


def forward(params: Params, config: LlamaConfig, input_ids: jax.Array | None = None, *,
            inputs_embeds: jax.Array | None = None, positions: jax.Array | None = None,
            attention_mask: jax.Array | None = None, cache: KVCache | None = None,
            compute_logits: bool = True, precision: Any = DEFAULT_PRECISION,
            dtype: Any = None) -> LlamaOutput:
    """The Llama forward pass (pure; jit it with ``config`` static).

    Exactly one of ``input_ids`` (B, L) int and ``inputs_embeds`` (B, L, D) (e.g. :func:`embed`
    output with other vectors spliced in). ``attention_mask`` (B, L) {0,1}, default all ones.
    ``positions`` (B, L) int, default :func:`default_positions` continuing from ``cache.lengths``.
    ``cache``: a :class:`KVCache` (from :func:`init_cache`) to append this call's keys/values to at
    slot ``cache.index`` and attend over, or None to attend over these tokens only.
    ``dtype``, ``precision``: the matmuls' compute dtype (None: the parameters') and precision
    (module doc; :func:`compute_setting` gives the pair for a name).
    -> :class:`LlamaOutput` (logits (B, L, V) float32 unless ``compute_logits=False``,
    final hidden states (B, L, D), the new cache or None).
    """
    return LlamaForCausalLM(config, precision, dtype).apply(
        {"params": params}, input_ids, inputs_embeds=inputs_embeds, positions=positions,
        attention_mask=attention_mask, cache=cache, compute_logits=compute_logits)


def embed(params: Params, config: LlamaConfig, input_ids: jax.Array) -> jax.Array:
    """Token embeddings of ``input_ids`` (B, L) -> (B, L, D), the input :func:`forward` accepts as
    ``inputs_embeds``."""
    return LlamaForCausalLM(config).apply({"params": params}, input_ids,
                                          method=LlamaForCausalLM.embed)


def lm_logits(params: Params, config: LlamaConfig, hidden: jax.Array,
              precision: Any = DEFAULT_PRECISION, dtype: Any = None) -> jax.Array:
    """The LM head on final hidden states: (..., D) -> (..., V) float32 (computed in ``dtype``, None:
    the parameters')."""
    return LlamaForCausalLM(config, precision, dtype).apply({"params": params}, hidden,
                                                     method=LlamaForCausalLM.logits)


def count_params(params: Params) -> int:
    """Number of scalar parameters in ``params``."""
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)))
