"""Checking an imaginer's run record (``run.json`` of a fine-tuning run, ``<name>.json`` of a shipped
imaginer) field by field before anything is built from it or opened because of it.

A record is JSON anyone can edit: every field must have its type, lie within bounds that keep the
rebuilt model to a size this package trains (a backbone up to Llama-2-70B's shapes), and agree with the
fields it depends on (normaliser width = state width, token ids within the vocabulary). A record never
names a file to open: ``preset.model_path`` is refused unless the caller gives the path itself, and
``backbone`` (where the run's backbone came from) is provenance, never read back. The record's format
and the fine-tuning :class:`Preset` it holds are defined here, so checking a record needs no model code.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Final, Literal, Mapping

from imaginejax.core.files import field_problem
from imaginejax.imaginer import lora
from imaginejax.imaginer.llama import COMPUTE_DTYPES, check_choice

LORA_FORMS = ("merged", "attached")
VOCABULARIES = ("tokenizer", "corpus")

RUN_FORMAT: Final[str] = "imaginejax-kalm-run"
RUN_SCHEMA_VERSION: Final[int] = 1
# Preset.validation's settings and their defaults (imaginejax.imaginer.validation uses them).
VALIDATION_DEFAULTS: Final[Mapping[str, Any]] = {
    "every": 100, "phrasings_per_goal": 2, "goals": 8, "seed": 0, "rollouts": 64, "levels": None,
    "instructions": ()}


def validation_settings(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``spec`` (a part of :data:`VALIDATION_DEFAULTS`) with the defaults filled in; ``levels`` and
    ``instructions`` as tuples. Giving ``instructions`` (the caller's own held-out phrasings) makes
    ``phrasings_per_goal`` default to 0.

    Raises:
      ValueError: an unknown key, a value of the wrong type or range, both kinds of held-out phrasings,
        or nothing held out; the message names the key and the fix.
    """
    if not isinstance(spec, Mapping):
        raise ValueError(f"preset validation must be a table like {{'every': 100, 'goals': 8}} or None, got "
                         f"{spec!r}")
    unknown = sorted(set(spec) - set(VALIDATION_DEFAULTS))
    if unknown:
        raise ValueError(f"preset validation: unknown key(s) {unknown}; valid: {', '.join(VALIDATION_DEFAULTS)}")
    out = dict(VALIDATION_DEFAULTS, **spec)
    if spec.get("instructions") and "phrasings_per_goal" not in spec:
        out["phrasings_per_goal"] = 0
    for key, low in (("every", 1), ("phrasings_per_goal", 0), ("goals", 0), ("seed", 0), ("rollouts", 1)):
        if type(out[key]) is not int or out[key] < low:
            raise ValueError(f"preset validation.{key} = {out[key]!r}: not an integer >= {low}; e.g. "
                             f"{key}={VALIDATION_DEFAULTS[key]}")
    for key in ("levels", "instructions"):
        value = out[key]
        if value is None and key == "levels":
            continue
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(
                isinstance(v, str) for v in value):
            raise ValueError(f"preset validation.{key} = {value!r}: not a list of strings"
                             + ("; None scores every level but train" if key == "levels" else ""))
        out[key] = tuple(value)
    if out["instructions"] and out["phrasings_per_goal"]:
        raise ValueError("preset validation: give either instructions (your own held-out phrasings) or "
                         f"phrasings_per_goal = {out['phrasings_per_goal']} (chosen by seed), not both")
    if not (out["instructions"] or out["phrasings_per_goal"] or out["goals"]):
        raise ValueError("preset validation holds nothing out (phrasings_per_goal = goals = 0, no instructions): "
                         "hold out some, e.g. {'phrasings_per_goal': 2, 'goals': 8}, or set validation=None")
    return out


@dataclasses.dataclass(frozen=True)
class Preset:
    """Everything that defines a fine-tuning run besides the data.

    Attributes:
      name: preset name (recorded in provenance).
      source: ``"random"`` (fresh Llama of ``architecture``), ``"gguf"`` or ``"hf"`` (pretrained).
      architecture: LlamaConfig fields for ``"random"`` (the vocabulary size is the tokenizer's).
      model_path: GGUF file / Hugging Face directory; None: SmolLM2's packaged GGUF for ``"gguf"``,
        ``$IMAGINEJAX_LLAMA2_DIR`` for ``"hf"``.
      tokenizer: ``"smollm2"`` (the GGUF's tokenizer) or ``"model"`` (the checkpoint's own).
      vocabulary: ``"tokenizer"`` (default: every token of the tokenizer) or ``"corpus"`` (a ``"random"``
        model only: the tokens of the fine-tuning data's instructions, those merged on the way to them
        and the 256 byte tokens, :func:`~imaginejax.imaginer.loading.corpus_vocabulary`; the training
        instructions tokenize as before, other text in smaller pieces; SmolLM2's 49,152-row embedding
        becomes a few hundred rows, so a ``tiny`` imaginer is 7 MB instead of 45). The kept ids are the
        run record's ``vocabulary``. Left out of :meth:`to_json` when ``"tokenizer"``.
      start_token, end_token: text-format tokens by name; ``start_id``/``end_id`` override them.
      dtype: parameter dtype of the backbone (``"float32"`` or ``"bfloat16"``).
      compute_dtype: what the backbone's matmuls compute in, in fine-tuning and generation:
        ``"float32"`` (default: the parameters' dtype, full-precision matmuls) or ``"bfloat16"`` (mixed
        precision: float32 parameters and optimiser state, bfloat16 matmuls and KV cache; norms,
        softmax, rotary embeddings, the KALM adapters and every loss in float32; see
        :mod:`~imaginejax.imaginer.llama`). Part of what the imaginer is: recorded in the KALM config
        and left out of :meth:`to_json` when float32, so the records of float32 runs are unchanged.
      lora_rank: 0 for full fine-tuning, r > 0 for LoRA; ``lora_alpha``: its scale numerator;
        ``lora_targets``: the adapted projections (:data:`~imaginejax.imaginer.lora.LORA_TARGETS`);
        ``lora_form``: what fine-tuning differentiates, ``"merged"`` (``W + s a b`` formed each step) or
        ``"attached"`` (``x W + (x s a) b``: no kernel-sized gradient; :mod:`~imaginejax.imaginer.lora`), the
        same model up to rounding; left out of :meth:`to_json` when merged.
      learning_rate, warmup_steps, weight_decay, grad_clip, adam_b2: the optimiser.
      num_steps: micro-batches (train-step calls); ``grad_accum`` micro-batches per update.
      batch_sizes: rows per task per micro-batch (0 drops a task, e.g. for KALM's ablations).
      task_weights: per-task loss weights (default 1).
      max_steps: cap on trajectory steps used by the rollout/explanation tasks (None: the longest).
      predict_initial_state: the rollout task also predicts s0 from the instruction (KALM's
        layout). Off by default: generation takes s0 from the environment's reset distribution,
        so that term only adds irreducible loss (the reset distribution's spread, ≈ 1 in
        normalised units) that swamps the rollout state metric.
      state_loss_weight: weight of the state MSE in each task's loss (KALM: 0.5, as the action
        loss; the ``tiny`` preset uses 2.0, see below).
      state_prediction: what the state head predicts: ``"delta"`` (default; the normalised change
        from the previous state, see :mod:`~imaginejax.imaginer.kalm`) or ``"absolute"`` (KALM's
        choice; set it to reproduce KALM exactly).
      log_every, checkpoint_every, max_to_keep: progress and checkpoint cadence.
      seed: model initialisation and batch order.
      validation: None (off, the default) or the validation of :mod:`~imaginejax.imaginer.validation`,
        its settings filled in from :data:`VALIDATION_DEFAULTS`: ``every`` k steps (and at the last),
        the imaginer's rollouts are scored on ``phrasings_per_goal`` phrasings held out of each
        training goal and ``goals`` training goals held out with all their phrasings (both chosen by
        ``seed``, their trajectories left out of fine-tuning; or ``instructions``, the caller's own
        held-out phrasings, which the data must not contain), and on the novel ``levels`` (None: all);
        ``rollouts`` per set; the best checkpoint is kept. Left out of :meth:`to_json` when None, so
        the records of runs without it are unchanged.
    """

    name: str
    source: Literal["random", "gguf", "hf"]
    architecture: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model_path: str | None = None
    tokenizer: Literal["smollm2", "model"] = "model"
    vocabulary: str = "tokenizer"
    start_token: str | None = "<|im_start|>"
    end_token: str | None = "<|im_end|>"
    start_id: int | None = None
    end_id: int | None = None
    dtype: str = "float32"
    compute_dtype: str = "float32"
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = lora.ATTENTION_TARGETS
    lora_form: str = "merged"
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    adam_b2: float = 0.99
    num_steps: int = 600
    grad_accum: int = 1
    batch_sizes: Mapping[str, int] = dataclasses.field(default_factory=lambda: {
        "rollout": 16, "dynamics": 32, "consequence": 16, "explanation": 8})
    task_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    max_steps: int | None = None
    predict_initial_state: bool = False
    state_loss_weight: float = 0.5
    state_prediction: str = "delta"
    log_every: int = 20
    checkpoint_every: int = 200
    max_to_keep: int = 2
    seed: int = 0
    validation: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if self.validation is not None:
            object.__setattr__(self, "validation", validation_settings(self.validation))
        owner = f"preset {self.name!r}"
        check_choice(owner, "compute_dtype", self.compute_dtype, COMPUTE_DTYPES,
                     "e.g. compute_dtype='bfloat16' for mixed precision")
        check_choice(owner, "vocabulary", self.vocabulary, VOCABULARIES)
        if self.vocabulary == "corpus" and self.source != "random":
            raise ValueError(f"preset {self.name!r}: vocabulary = 'corpus' needs source = 'random' (a pretrained "
                             f"{self.source} backbone keeps its whole embedding table)")
        check_choice(owner, "lora_form", self.lora_form, LORA_FORMS)
        unknown = set(self.lora_targets) - set(lora.LORA_TARGETS)
        if unknown:
            raise ValueError(f"preset {self.name!r}: unknown lora_targets {sorted(unknown)}; valid: "
                             f"{', '.join(lora.LORA_TARGETS)}")

    def replace(self, **changes: Any) -> Preset:
        """A copy with fields changed (unknown names raise TypeError)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["architecture"] = dict(self.architecture)
        data["batch_sizes"] = dict(self.batch_sizes)
        data["task_weights"] = dict(self.task_weights)
        data["lora_targets"] = list(self.lora_targets)
        if self.compute_dtype == "float32":
            del data["compute_dtype"]
        if self.lora_form == "merged":
            del data["lora_form"]
        if self.vocabulary == "tokenizer":
            del data["vocabulary"]
        if self.validation is None:
            del data["validation"]
        else:
            data["validation"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.validation.items()}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Preset:
        return cls(**dict(data))

RUN_FIELDS: Final[tuple[str, ...]] = (
    "format", "schema_version", "preset", "kalm_config", "text_format", "layout", "normalizer",
    "data_fingerprint", "num_trajectories", "backbone", "frozen_backbone_hash")
# Optional: the kept ids of the tokenizer (Preset.vocabulary = "corpus").
OPTIONAL_RUN_FIELDS: Final[tuple[str, ...]] = ("vocabulary",)
# What a shipped imaginer's record adds (imaginer/shipped.py export, and the hash measured on the GPU).
SHIPPED_FIELDS: Final[tuple[str, ...]] = ("env", "step", "checkpoint_hash", "weights_sha256", "command",
                                          "frozen_backbone_hash_on_the_gpu")
# Upper bounds of the backbone's shapes: Llama-2-70B has hidden 8192, MLP 28672, 80 layers, 64 heads.
LLAMA_BOUNDS: Final[dict[str, int]] = {
    "vocab_size": 1 << 18, "hidden_size": 1 << 14, "intermediate_size": 1 << 16, "num_hidden_layers": 128,
    "num_attention_heads": 256, "num_key_value_heads": 256, "head_dim": 1024, "max_position_embeddings": 1 << 20}
MAX_COUNT: Final[int] = 1 << 31
MAX_LENGTH: Final[int] = 1 << 16
FIX: Final[str] = "fine-tune the run again (or re-export the shipped imaginer)"


class RunRecordError(ValueError):
    """A run record with a field of the wrong type, out of bounds, inconsistent, or naming a file."""


def _refuse(path: Path, field: str, value: Any, problem: str, fix: str = FIX) -> RunRecordError:
    return RunRecordError(field_problem(path, field, value, problem, fix))


def _table(path: Path, field: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _refuse(path, field, value, "not a table")
    return value


def _int(path: Path, field: str, value: Any, low: int = 0, high: int = MAX_COUNT, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if type(value) is not int or not low <= value <= high:
        raise _refuse(path, field, value, f"not an integer in [{low}, {high}]" + (" or null" if none else ""))
    return value


def _number(path: Path, field: str, value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _refuse(path, field, value, "not a finite number")
    return float(value)


def _bool(path: Path, field: str, value: Any) -> bool:
    if type(value) is not bool:
        raise _refuse(path, field, value, "not true or false")
    return value


def _text(path: Path, field: str, value: Any, none: bool = False, choices: tuple[str, ...] = ()) -> str | None:
    if value is None and none:
        return None
    if not isinstance(value, str) or len(value) > 10_000 or (choices and value not in choices):
        raise _refuse(path, field, value, f"not one of {', '.join(choices)}" if choices else "not a string")
    return value


def _digest(path: Path, field: str, value: Any, none: bool = False) -> str | None:
    if value is None and none:
        return None
    if not (isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef")):
        raise _refuse(path, field, value, "not a SHA-256 (64 hexadecimal digits)")
    return value


def _ids(path: Path, field: str, value: Any, vocab: int) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_LENGTH:
        raise _refuse(path, field, value, "not a list of token ids")
    return [_int(path, f"{field}[{i}]", t, 0, vocab - 1) for i, t in enumerate(value)]


def _llama(path: Path, field: str, value: Any) -> None:
    """The shape fields of a Llama configuration within :data:`LLAMA_BOUNDS` (the rest LlamaConfig checks)."""
    for key, high in LLAMA_BOUNDS.items():
        if key in value:
            _int(path, f"{field}.{key}", value[key], 1, high, none=key == "head_dim")


def _preset(path: Path, preset: Mapping[str, Any], trusted_model_path: bool) -> None:
    fields = {f.name for f in dataclasses.fields(Preset)}
    for key in preset:
        if key not in fields:
            raise _refuse(path, f"preset.{key}", preset[key], f"not a field of a preset (fields: {', '.join(sorted(fields))})")
    for key in ("name", "source"):
        if key not in preset:
            raise RunRecordError(f"{path}: field preset.{key} is missing; {FIX}")
    _text(path, "preset.name", preset["name"])
    _text(path, "preset.source", preset["source"], choices=("random", "gguf", "hf"))
    _llama(path, "preset.architecture", _table(path, "preset.architecture", preset.get("architecture", {})))
    model_path = _text(path, "preset.model_path", preset.get("model_path"), none=True)
    if model_path is not None and not trusted_model_path:
        raise _refuse(path, "preset.model_path", model_path, "a record never names a file to open",
                      "give the backbone's path yourself (load_imaginer(run_dir, model_path=...)) if you trust it")
    _text(path, "preset.tokenizer", preset.get("tokenizer", "model"), choices=("smollm2", "model"))
    _text(path, "preset.vocabulary", preset.get("vocabulary", "tokenizer"), choices=VOCABULARIES)
    for key in ("start_token", "end_token"):
        _text(path, f"preset.{key}", preset.get(key), none=True)
    for key in ("start_id", "end_id", "max_steps"):
        _int(path, f"preset.{key}", preset.get(key), none=True)
    _text(path, "preset.dtype", preset.get("dtype", "float32"), choices=("float32", "bfloat16", "float16"))
    _text(path, "preset.compute_dtype", preset.get("compute_dtype", "float32"), choices=COMPUTE_DTYPES)
    _int(path, "preset.lora_rank", preset.get("lora_rank", 0), 0, 4096)
    _text(path, "preset.lora_form", preset.get("lora_form", "merged"), choices=LORA_FORMS)
    targets = preset.get("lora_targets", list(lora.ATTENTION_TARGETS))
    if not isinstance(targets, list) or not set(map(str, targets)) <= set(lora.LORA_TARGETS) or not all(
            isinstance(t, str) for t in targets):
        raise _refuse(path, "preset.lora_targets", targets, f"not a list of {', '.join(lora.LORA_TARGETS)}")
    for key in ("lora_alpha", "learning_rate", "weight_decay", "grad_clip", "adam_b2", "state_loss_weight"):
        if key in preset:
            _number(path, f"preset.{key}", preset[key])
    for key in ("warmup_steps", "num_steps", "grad_accum", "log_every", "checkpoint_every", "max_to_keep", "seed"):
        if key in preset:
            _int(path, f"preset.{key}", preset[key])
    for key, check in (("batch_sizes", _int), ("task_weights", _number)):
        for task, value in _table(path, f"preset.{key}", preset.get(key, {})).items():
            check(path, f"preset.{key}.{task}", value)
    if "predict_initial_state" in preset:
        _bool(path, "preset.predict_initial_state", preset["predict_initial_state"])
    _text(path, "preset.state_prediction", preset.get("state_prediction", "delta"), choices=("delta", "absolute"))
    if preset.get("validation") is not None:
        try:
            validation_settings(preset["validation"])
        except ValueError as error:
            raise _refuse(path, "preset.validation", preset["validation"], str(error)) from None


def check_compute_dtype(record: Mapping[str, Any], asked: str | None, origin: str) -> None:
    """Refuses an imaginer fine-tuned in another compute dtype than ``asked`` (None: whatever it was
    fine-tuned in). ``record``: a checked run record; ``origin``: what to name (its run directory).

    Raises:
      ValueError: ``asked`` is not a compute dtype, or not the one of the record (both named, with the fixes).
    """
    trained = record["preset"].get("compute_dtype", "float32")
    if asked is None or asked == trained:
        return
    if asked not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype = {asked!r} is not one of {', '.join(COMPUTE_DTYPES)} (None: as trained)")
    raise ValueError(f"{origin} was fine-tuned with compute_dtype {trained!r}, but compute_dtype {asked!r} was "
                     f"asked for: load it as trained (compute_dtype=None) or fine-tune it with compute_dtype="
                     f"{asked!r}; to generate with it in {asked} anyway, say so: finetune.with_compute_dtype("
                     f"imaginer, {asked!r}) (its rollouts' provenance then records both)")


def check_run_record(record: Any, path: Path, *, shipped: bool = False, trusted_model_path: bool = False) -> None:
    """Checks every field of a run record (``shipped``: a shipped imaginer's, with :data:`SHIPPED_FIELDS`).

    ``trusted_model_path``: the caller gives the backbone's path itself, so ``preset.model_path`` is
    provenance and not refused (it is never opened either way).

    Raises:
      RunRecordError: naming the file, the field, the value and the fix.
    """
    record = _table(path, "(the record)", record)
    allowed = RUN_FIELDS + (SHIPPED_FIELDS if shipped else ())
    for key in record:
        if key not in allowed + OPTIONAL_RUN_FIELDS:
            raise _refuse(path, key, record[key], f"not a field of a run record (fields: "
                          f"{', '.join(allowed + OPTIONAL_RUN_FIELDS)})")
    for key in allowed[:-1] if shipped else allowed:  # the GPU's hash is optional
        if key not in record:
            raise RunRecordError(f"{path}: field {key} is missing; {FIX}")
    if record["format"] != RUN_FORMAT or record["schema_version"] != RUN_SCHEMA_VERSION:
        raise _refuse(path, "format", [record["format"], record["schema_version"]],
                      f"not a {RUN_FORMAT} record of schema version {RUN_SCHEMA_VERSION}")
    _preset(path, _table(path, "preset", record["preset"]), trusted_model_path)

    config = _table(path, "kalm_config", record["kalm_config"])
    llama = _table(path, "kalm_config.llama", config.get("llama"))
    _llama(path, "kalm_config.llama", llama)
    vocab = _int(path, "kalm_config.llama.vocab_size", llama.get("vocab_size"), 1, LLAMA_BOUNDS["vocab_size"])
    state_dim = _int(path, "kalm_config.state_dim", config.get("state_dim"), 1, 1 << 14)
    _bool(path, "kalm_config.discrete", config.get("discrete"))
    _int(path, "kalm_config.num_actions", config.get("num_actions"), 1, 1 << 16)
    for key in ("state_token_id", "action_token_id"):
        _int(path, f"kalm_config.{key}", config.get(key), 0, vocab - 1)
    for key in ("state_loss_weight", "action_loss_weight", "text_loss_weight"):
        _number(path, f"kalm_config.{key}", config.get(key))
    _text(path, "kalm_config.state_prediction", config.get("state_prediction"), choices=("delta", "absolute"))
    compute_dtype = _text(path, "kalm_config.compute_dtype", config.get("compute_dtype", "float32"),
                          choices=COMPUTE_DTYPES)
    if compute_dtype != record["preset"].get("compute_dtype", "float32"):
        raise _refuse(path, "kalm_config.compute_dtype", compute_dtype,
                      f"not the preset's compute_dtype {record['preset'].get('compute_dtype', 'float32')!r}")

    text = _table(path, "text_format", record["text_format"])
    for key in ("start_id", "end_id"):
        _int(path, f"text_format.{key}", text.get(key), 0, vocab - 1)
    _ids(path, "text_format.separator", text.get("separator"), vocab)
    prefixes = text.get("prefixes")
    if not isinstance(prefixes, list) or len(prefixes) != 4:
        raise _refuse(path, "text_format.prefixes", prefixes, "not a list of the four tasks' token ids")
    for i, prefix in enumerate(prefixes):
        _ids(path, f"text_format.prefixes[{i}]", prefix, vocab)

    layout = _table(path, "layout", record["layout"])
    for key in ("max_instruction_tokens", "max_steps", "text_length"):
        _int(path, f"layout.{key}", layout.get(key), 0, MAX_LENGTH)
    lengths = layout.get("lengths")
    if not isinstance(lengths, list) or len(lengths) != 4:
        raise _refuse(path, "layout.lengths", lengths, "not the four tasks' sequence lengths")
    for i, length in enumerate(lengths):
        _int(path, f"layout.lengths[{i}]", length, 1, MAX_LENGTH)
    _bool(path, "layout.predict_initial_state", layout.get("predict_initial_state"))

    normalizer = _table(path, "normalizer", record["normalizer"])
    for key in ("mean", "std"):
        values = normalizer.get(key)
        if not isinstance(values, list) or len(values) != state_dim:
            raise _refuse(path, f"normalizer.{key}", values, f"not {state_dim} numbers (kalm_config.state_dim)")
        for i, value in enumerate(values):
            if _number(path, f"normalizer.{key}[{i}]", value) <= 0 and key == "std":
                raise _refuse(path, f"normalizer.std[{i}]", value, "not > 0")

    _digest(path, "data_fingerprint", record["data_fingerprint"])
    _int(path, "num_trajectories", record["num_trajectories"])
    _table(path, "backbone", record["backbone"])  # provenance: never opened
    corpus = record["preset"].get("vocabulary", "tokenizer") == "corpus"
    if corpus != ("vocabulary" in record):
        raise _refuse(path, "vocabulary", record.get("vocabulary"), "present exactly when preset.vocabulary is 'corpus'")
    if corpus:
        kept = _ids(path, "vocabulary", record["vocabulary"], LLAMA_BOUNDS["vocab_size"])
        if len(kept) != vocab - 2 or any(b <= a for a, b in zip(kept, kept[1:])):
            raise _refuse(path, "vocabulary", f"{len(kept)} ids", f"not {vocab - 2} strictly increasing token ids "
                          "(kalm_config.llama.vocab_size less the two placeholders)")
    _digest(path, "frozen_backbone_hash", record["frozen_backbone_hash"], none=True)
    if shipped:
        from imaginejax import envs

        _text(path, "env", record["env"], choices=envs.registered())
        _int(path, "step", record["step"])
        for key in ("checkpoint_hash", "weights_sha256"):
            _digest(path, key, record[key])
        _text(path, "command", record["command"])
        _digest(path, "frozen_backbone_hash_on_the_gpu", record.get("frozen_backbone_hash_on_the_gpu"), none=True)
