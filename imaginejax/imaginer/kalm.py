"""KALM adapters: numbers in and out of a Llama without writing them as text (BENCHMARK.md §5).

A state vector enters the model through one linear layer into the token-embedding space, a discrete
action through an embedding table (a continuous one through a linear layer). They are *spliced* into
the token embeddings at placeholder positions: the token ids carry two reserved placeholder ids
(``state_token_id``, ``action_token_id``, appended to the vocabulary by
:func:`add_placeholder_tokens`, so no tokenizer can ever produce them), and the rows of
``embed(tokens)`` at those ids are replaced by the projected vectors. Linear heads read the final
hidden states back: a regression head for states (MSE on normalised states) and a classification head
for discrete actions (cross-entropy; MSE for continuous actions). The loss of one task is
``0.5 · state loss + 0.5 · action loss + token cross-entropy`` (text targets only).

The state head predicts either the normalised state itself (``state_prediction="absolute"``, KALM's
choice) or the normalised *change* from the state it follows (``"delta"``)::

    absolute:  head(h) ≈ n(s')                 s' = n⁻¹(head(h))
    delta:     head(h) ≈ n(s') - n(s_base)      s' = n⁻¹(head(h) + n(s_base))

with ``n(s) = (s - mean) / std`` the :class:`StateNormalizer` and ``s_base`` the latest state placed
in the sequence before the target (rollout: s_t for s_{t+1}; dynamics: s for s'; consequence: s0
for s_L). A target with no earlier state (the rollout task's optional s0) is predicted absolutely in
both modes. Since ``n(s') - n(s_base) = (s' - s_base) / std``, the delta target is the state change
normalised by the state scale, and the state error is *the same quantity* in both modes (the
prediction error of n(s')): losses and metrics compare directly. The delta form is a residual
connection: a head at zero predicts "nothing moves", which is most of every CLEVR transition (one
ball of five moves per push). :func:`state_head_targets` and :func:`decode_states` are the only
places the two modes differ; training and generation both go through them.

Every output is predicted from the *previous* position (causal next-item prediction): the hidden
state at position ``p - 1`` predicts the item placed at ``p``.

Four supervised tasks are built from each real trajectory ``s_0, a_0, …, a_{L-1}, s_L`` with
instruction ``I`` (token layouts; ``[S x]`` / ``[A x]`` are placeholders carrying x, ``^`` marks a
target predicted from the previous position; ``<start>`` is e.g. ``<|im_start|>``)::

    rollout      <start> "rollout\\n"     I "\\n" ^[S s0] ^[A a0] ^[S s1] … ^[A a_{L-1}] ^[S sL]
    dynamics     <start> "dynamics\\n"    [S s_t] [A a_t] ^[S s_{t+1}]
    consequence  <start> "consequence\\n" I "\\n" [S s0] ^[S sL]
    explanation  <start> "explain\\n"     [S s0] [A a0] … [S sL] "\\n" ^I ^<end>

(``^[S s0]`` of the rollout task is optional, :attr:`TaskLayout.predict_initial_state`: at
generation time s0 comes from the environment's reset distribution.) Sequences are right-padded to
a fixed length per task (:class:`TaskLayout`, rounded up to a multiple of 8), so a training step
compiles once. The batch builders run on the host in NumPy and return :class:`KalmBatch` arrays of
fixed shape.

Shapes: ``B`` rows, ``L`` sequence length, ``D`` hidden size, ``S`` state width, ``A`` continuous
action width, ``C`` discrete action count, ``Lt`` text-target slots, ``V`` vocabulary.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from imaginejax.data.types import TrajectoryDataset
from imaginejax.imaginer.llama import (COMPUTE_DTYPES, LlamaConfig, Params, check_choice, compute_setting, embed, forward,
                                       lm_logits)

__all__ = [
    "TASKS", "TASK_TARGETS", "KalmConfig", "StateNormalizer", "KalmAdapter", "KalmBatch",
    "TextFormat", "TaskLayout", "KalmCorpus", "add_placeholder_tokens", "init_adapter_params",
    "embedding_std", "layout_for_corpus",
    "splice_embeddings", "kalm_hidden", "task_loss", "multitask_loss", "make_text_format",
    "build_corpus", "make_layout", "build_task_batch", "sample_task_batches", "rollout_prompts",
    "tokenize_instructions", "adapter_apply", "round_up_length", "STATE_PREDICTIONS",
    "state_head_targets", "decode_states",
]

TASKS: Final[tuple[str, ...]] = ("rollout", "dynamics", "consequence", "explanation")
"""The four KALM supervised tasks, in a fixed order."""

TASK_TARGETS: Final[dict[str, tuple[str, ...]]] = {
    "rollout": ("state", "action"),
    "dynamics": ("state",),
    "consequence": ("state",),
    "explanation": ("text",),
}
"""Which loss terms each task has (static: the others are not computed)."""

ROUND_LENGTH_TO: Final[int] = 8

STATE_PREDICTIONS: Final[tuple[str, ...]] = ("absolute", "delta")
"""What the state head predicts: the normalised state, or its normalised change (module doc)."""


# ---------------------------------------------------------------------------------------------------
# Configuration and parameters


@dataclasses.dataclass(frozen=True)
class KalmConfig:
    """Static description of a KALM model (hashable: a static argument of ``jax.jit``).

    Attributes:
      llama: the backbone's config, whose vocabulary includes the two placeholder ids.
      state_dim: S.
      discrete: True for Discrete(C) actions, False for Box actions of width A.
      num_actions: C (discrete) or A (continuous).
      state_token_id, action_token_id: the placeholder ids (see :func:`add_placeholder_tokens`).
      state_loss_weight, action_loss_weight, text_loss_weight: the loss mix (0.5, 0.5, 1.0).
      state_prediction: ``"absolute"`` or ``"delta"`` (see the module docstring).
      compute_dtype: ``"float32"`` or ``"bfloat16"``, the backbone's matmuls
        (:func:`~imaginejax.imaginer.llama.compute_setting`); the adapters, heads and losses are float32
        either way. Left out of :meth:`to_json` when float32.
    """

    llama: LlamaConfig
    state_dim: int
    discrete: bool
    num_actions: int
    state_token_id: int
    action_token_id: int
    state_loss_weight: float = 0.5
    action_loss_weight: float = 0.5
    text_loss_weight: float = 1.0
    state_prediction: str = "absolute"
    compute_dtype: str = "float32"

    def __post_init__(self) -> None:
        check_choice("KalmConfig", "compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        check_choice("KalmConfig", "state_prediction", self.state_prediction, STATE_PREDICTIONS)
        for name in ("state_dim", "num_actions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KalmConfig.{name} must be a positive int, got {value!r}")
        vocab = self.llama.vocab_size
        for name in ("state_token_id", "action_token_id"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < vocab:
                raise ValueError(f"KalmConfig.{name}={value!r} is outside the vocabulary [0, {vocab}); "
                                 "reserve placeholder ids with add_placeholder_tokens")
        if self.state_token_id == self.action_token_id:
            raise ValueError("KalmConfig.state_token_id and action_token_id must differ, both are "
                             f"{self.state_token_id}")

    @property
    def hidden_size(self) -> int:
        """D."""
        return self.llama.hidden_size

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable fields (the backbone as its Hugging Face config)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "llama"}
        if self.compute_dtype == "float32":
            del fields["compute_dtype"]
        return {"llama": self.llama.to_hf(), **fields}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KalmConfig:
        """Inverse of :meth:`to_json`."""
        fields = dict(data)
        return cls(llama=LlamaConfig.from_hf(fields.pop("llama")), **fields)


@struct.dataclass
class StateNormalizer:
    """Per-dimension affine normalisation of states (a pytree; not trained).

    ``mean``, ``std``: (S,) float32, ``std`` > 0. The adapters read and predict normalised states
    ``(s - mean) / std``.
    """

    mean: jax.Array
    std: jax.Array

    def normalize(self, states: jax.Array) -> jax.Array:
        """(..., S) raw -> (..., S) normalised."""
        return (states - self.mean) / self.std

    def denormalize(self, normalized: jax.Array) -> jax.Array:
        """(..., S) normalised -> (..., S) raw."""
        return normalized * self.std + self.mean

    @staticmethod
    def identity(state_dim: int) -> StateNormalizer:
        """Zero mean, unit scale."""
        return StateNormalizer(jnp.zeros((state_dim,), jnp.float32),
                               jnp.ones((state_dim,), jnp.float32))

    @staticmethod
    def from_datasets(datasets: Sequence[TrajectoryDataset], min_std: float = 1e-3) -> StateNormalizer:
        """Mean and standard deviation of every valid state ``s_0 .. s_L`` of the datasets.

        ``min_std`` floors the scale of (near-)constant dimensions.
        """
        valid = [ds.states[_state_valid(ds.mask)] for ds in datasets]
        states = np.concatenate(valid, axis=0).astype(np.float64)
        mean = states.mean(axis=0)
        std = np.maximum(states.std(axis=0), min_std)
        return StateNormalizer(jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32))

    def to_json(self) -> dict[str, list[float]]:
        """``{"mean": [...], "std": [...]}``."""
        return {"mean": np.asarray(self.mean).tolist(), "std": np.asarray(self.std).tolist()}

    @staticmethod
    def from_json(data: Mapping[str, Sequence[float]]) -> StateNormalizer:
        """Inverse of :meth:`to_json`."""
        return StateNormalizer(jnp.asarray(data["mean"], jnp.float32),
                               jnp.asarray(data["std"], jnp.float32))


def _state_valid(mask: np.ndarray) -> np.ndarray:
    """(N, T) valid-step mask -> (N, T+1): states s_0 .. s_L of each row."""
    mask = np.asarray(mask, bool)
    return np.arange(mask.shape[1] + 1)[None, :] <= mask.sum(axis=1)[:, None]


class KalmAdapter(nn.Module):
    """The numeric adapters: projections into the embedding space and heads out of the hidden states.

    Parameters (``params["kalm"]``)::

        state_in/{kernel (S, D), bias (D,)}          normalised state -> embedding
        action_in/embedding (C, D)                   discrete action -> embedding
          or action_in/{kernel (A, D), bias (D,)}    continuous action -> embedding
        state_out/{kernel (D, S), bias (S,)}         hidden -> normalised state
        action_out/{kernel (D, C|A), bias}           hidden -> action logits / continuous action

    ``embed_std`` scales the input projections so that a unit-variance input lands at the token
    embeddings' typical magnitude; the heads start at ``head_std`` (the backbone's
    ``initializer_range``). Computed in float32.
    """

    hidden_size: int
    state_dim: int
    discrete: bool
    num_actions: int
    embed_std: float = 0.02
    head_std: float = 0.02

    def setup(self) -> None:
        self.state_in = nn.Dense(self.hidden_size, kernel_init=nn.initializers.normal(
            self.embed_std / np.sqrt(self.state_dim)))
        if self.discrete:
            self.action_in = nn.Embed(self.num_actions, self.hidden_size,
                                      embedding_init=nn.initializers.normal(self.embed_std))
        else:
            self.action_in = nn.Dense(self.hidden_size, kernel_init=nn.initializers.normal(
                self.embed_std / np.sqrt(self.num_actions)))
        self.state_out = nn.Dense(self.state_dim, kernel_init=nn.initializers.normal(self.head_std))
        self.action_out = nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(self.head_std))

    def embed_state(self, normalized_states: jax.Array) -> jax.Array:
        """(..., S) normalised states -> (..., D) float32."""
        return self.state_in(normalized_states.astype(jnp.float32))

    def embed_action(self, actions: jax.Array) -> jax.Array:
        """(...) int actions or (..., A) float actions -> (..., D) float32."""
        if self.discrete:
            return self.action_in(actions.astype(jnp.int32))
        return self.action_in(actions.astype(jnp.float32))

    def predict_state(self, hidden: jax.Array) -> jax.Array:
        """(..., D) hidden -> (..., S) normalised states (float32)."""
        return self.state_out(hidden.astype(jnp.float32))

    def predict_action(self, hidden: jax.Array) -> jax.Array:
        """(..., D) hidden -> (..., C) logits (discrete) or (..., A) actions (continuous), float32."""
        return self.action_out(hidden.astype(jnp.float32))

    def __call__(self, normalized_states: jax.Array, actions: jax.Array,
                 hidden: jax.Array) -> tuple[jax.Array, ...]:
        """All four maps (used by ``init``)."""
        return (self.embed_state(normalized_states), self.embed_action(actions),
                self.predict_state(hidden), self.predict_action(hidden))


def _adapter(config: KalmConfig, embed_std: float = 0.02) -> KalmAdapter:
    return KalmAdapter(config.hidden_size, config.state_dim, config.discrete, config.num_actions,
                       embed_std, config.llama.initializer_range)


def adapter_apply(params: Params, config: KalmConfig, method: str, *args: jax.Array) -> jax.Array:
    """One :class:`KalmAdapter` method (``"embed_state"``, ``"embed_action"``, ``"predict_state"``,
    ``"predict_action"``) with ``params["kalm"]``."""
    module = _adapter(config)
    return module.apply({"params": params["kalm"]}, *args, method=getattr(KalmAdapter, method))


def _host_mean(array: jax.Array, axis: int) -> np.ndarray:
    """float32 mean of ``array`` along ``axis``, accumulated in float64 by numpy (platform-independent)."""
    return np.mean(np.asarray(jax.device_get(array), np.float32), axis=axis, dtype=np.float64).astype(np.float32)


def add_placeholder_tokens(params: Params, config: LlamaConfig, count: int = 2
                           ) -> tuple[Params, LlamaConfig, tuple[int, ...]]:
    """Reserve ``count`` new token ids at the end of the vocabulary (ids V .. V+count-1).

    No tokenizer produces these ids, so a placeholder can never collide with text. The new rows of
    the embedding table (and of an untied LM head) are the mean of the existing rows (the usual
    resizing rule; their input embedding is always replaced by a splice anyway), computed on the host
    with a float64 accumulator so that every platform builds the same bits (an accelerator's reduction
    order differs from the CPU's, and the frozen backbone's hash covers these rows).
    ``params``: a backbone parameter dict -> (new params, config with ``vocab_size + count``, ids).
    """
    if count <= 0:
        raise ValueError(f"count must be > 0, got {count}")
    vocab = config.vocab_size
    table = params["embed_tokens"]["embedding"]
    if table.shape[0] != vocab:
        raise ValueError(f"embedding table has {table.shape[0]} rows but config.vocab_size={vocab}")
    new = dict(params)
    rows = jnp.broadcast_to(_host_mean(table, axis=0), (count, table.shape[1]))
    new["embed_tokens"] = {"embedding": jnp.concatenate([table, rows.astype(table.dtype)], axis=0)}
    if not config.tie_word_embeddings:
        kernel = params["lm_head"]["kernel"]  # (D, V)
        cols = jnp.broadcast_to(_host_mean(kernel, axis=1)[:, None], (kernel.shape[0], count))
        new["lm_head"] = {"kernel": jnp.concatenate([kernel, cols.astype(kernel.dtype)], axis=1)}
    new_config = dataclasses.replace(config, vocab_size=vocab + count)
    return new, new_config, tuple(range(vocab, vocab + count))


def embedding_std(llama_params: Params) -> float:
    """Standard deviation of the backbone's token-embedding table (host float)."""
    return float(jnp.std(llama_params["embed_tokens"]["embedding"].astype(jnp.float32)))


def init_adapter_params(key: jax.Array, config: KalmConfig, embed_std: float = 0.02) -> Params:
    """Fresh adapter parameters (``params["kalm"]``), float32.

    ``embed_std``: the scale of the input projections' outputs, normally :func:`embedding_std` of the
    backbone (so projected vectors look like token embeddings).
    """
    module = _adapter(config, embed_std)
    action = (jnp.zeros((1,), jnp.int32) if config.discrete
              else jnp.zeros((1, config.num_actions), jnp.float32))
    variables = module.init(key, jnp.zeros((1, config.state_dim), jnp.float32), action,
                            jnp.zeros((1, config.hidden_size), jnp.float32))
    return dict(variables["params"])


# ---------------------------------------------------------------------------------------------------
# Batches and the model's forward pass


@struct.dataclass
class KalmBatch:
    """One task's fixed-shape batch (host NumPy from the builders, device arrays inside ``jit``).

    Attributes:
      tokens: (B, L) int32 token ids; placeholder ids where a state / action goes; 0 on padding.
      attention_mask: (B, L) bool, real tokens (a prefix of each row: right padding).
      state_inputs: (B, L, S) float32 raw states at state placeholders, 0 elsewhere.
      action_inputs: (B, L) int32 or (B, L, A) float32 actions at action placeholders, 0 elsewhere.
      state_targets: (B, L, S) float32 raw state predicted from position p (the state at p + 1).
      state_target_mask: (B, L) bool.
      state_bases: (B, L, S) float32 raw state each state target follows (the latest state input
        at or before position p; used by ``state_prediction="delta"``), 0 elsewhere.
      state_base_mask: (B, L) bool, the target at p has such a base state.
      action_targets: (B, L) int32 or (B, L, A) float32, the action at p + 1.
      action_target_mask: (B, L) bool.
      text_positions: (B, Lt) int32 positions whose hidden state predicts a text token.
      text_targets: (B, Lt) int32 the token at ``text_positions + 1``.
      text_mask: (B, Lt) bool.
    """

    tokens: Any
    attention_mask: Any
    state_inputs: Any
    action_inputs: Any
    state_targets: Any
    state_target_mask: Any
    action_targets: Any
    action_target_mask: Any
    text_positions: Any
    text_targets: Any
    text_mask: Any
    state_bases: Any
    state_base_mask: Any

    @property
    def shape(self) -> tuple[int, int]:
        """(B, L)."""
        return tuple(self.tokens.shape)  # type: ignore[return-value]


def splice_embeddings(params: Params, config: KalmConfig, tokens: jax.Array, state_inputs: jax.Array,
                      action_inputs: jax.Array, normalizer: StateNormalizer) -> jax.Array:
    """``embed(tokens)`` with the rows at placeholder ids replaced by projected states / actions.

    ``params``: ``{"llama": ..., "kalm": ...}``; ``tokens`` (B, L) int; ``state_inputs`` (B, L, S)
    raw states; ``action_inputs`` (B, L) int or (B, L, A); -> (B, L, D) in the embedding dtype.
    Rows whose token is neither placeholder are exactly the token embeddings.
    """
    token_embeds = embed(params["llama"], config.llama, tokens)
    states = adapter_apply(params, config, "embed_state", normalizer.normalize(state_inputs))
    actions = adapter_apply(params, config, "embed_action", action_inputs)
    is_state = (tokens == config.state_token_id)[..., None]
    is_action = (tokens == config.action_token_id)[..., None]
    dtype = token_embeds.dtype
    return jnp.where(is_state, states.astype(dtype),
                     jnp.where(is_action, actions.astype(dtype), token_embeds))


def state_head_targets(config: KalmConfig, normalizer: StateNormalizer, targets: jax.Array,
                       bases: jax.Array, has_base: jax.Array) -> jax.Array:
    """What the state head should output for raw target states.

    ``targets``, ``bases``: (..., S) raw; ``has_base``: (...) bool. -> (..., S): ``n(targets)``
    (absolute, or a target without base) or ``n(targets) - n(bases)`` (delta).
    """
    normalized = normalizer.normalize(targets)
    if config.state_prediction == "absolute":
        return normalized
    return normalized - jnp.where(has_base[..., None], normalizer.normalize(bases), 0.0)


def decode_states(config: KalmConfig, normalizer: StateNormalizer, head_output: jax.Array,
                  bases: jax.Array, has_base: jax.Array | bool = True) -> jax.Array:
    """Raw states from the state head's output: the inverse of :func:`state_head_targets`.

    ``head_output``: (..., S); ``bases``: (..., S) raw states the predictions follow; ``has_base``:
    (...) bool or a Python bool. -> (..., S) raw states.
    """
    if config.state_prediction == "absolute":
        return normalizer.denormalize(head_output)
    has_base = jnp.broadcast_to(jnp.asarray(has_base, bool), head_output.shape[:-1])
    return normalizer.denormalize(
        head_output + jnp.where(has_base[..., None], normalizer.normalize(bases), 0.0))


def kalm_hidden(params: Params, config: KalmConfig, batch: KalmBatch,
                normalizer: StateNormalizer) -> jax.Array:
    """Final hidden states of the spliced batch, computed in ``config.compute_dtype``: (B, L, D) in the
    embeddings' dtype."""
    embeds = splice_embeddings(params, config, batch.tokens, batch.state_inputs, batch.action_inputs,
                               normalizer)
    dtype, precision = compute_setting(config.compute_dtype)
    out = forward(params["llama"], config.llama, inputs_embeds=embeds,
                  attention_mask=batch.attention_mask, compute_logits=False, dtype=dtype,
                  precision=precision)
    return out.hidden_states


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    mask = mask.astype(jnp.float32)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def task_loss(params: Params, config: KalmConfig, batch: KalmBatch, normalizer: StateNormalizer,
              targets: tuple[str, ...] = ("state", "action", "text")
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The KALM loss of one task's batch.

    ``loss = state_w · state_mse + action_w · action_loss + text_w · text_ce`` over the terms named in
    ``targets`` (static; see :data:`TASK_TARGETS`). ``state_mse``: mean over target positions of the
    per-dimension mean squared error of normalised states (the error of n(s') in both
    ``state_prediction`` modes, see :func:`state_head_targets`); ``action_loss``: cross-entropy (discrete,
    with ``action_acc``) or MSE (continuous); ``text_ce``: token cross-entropy at the text slots
    (with ``text_acc``). -> (loss (), metrics dict of () arrays).
    """
    hidden = kalm_hidden(params, config, batch, normalizer)
    metrics: dict[str, jax.Array] = {}
    loss = jnp.zeros((), jnp.float32)
    if "state" in targets:
        predicted = adapter_apply(params, config, "predict_state", hidden)
        wanted = state_head_targets(config, normalizer, batch.state_targets, batch.state_bases,
                                    batch.state_base_mask)
        error = jnp.mean(jnp.square(predicted - wanted), axis=-1)
        metrics["state_mse"] = _masked_mean(error, batch.state_target_mask)
        loss = loss + config.state_loss_weight * metrics["state_mse"]
    if "action" in targets:
        predicted = adapter_apply(params, config, "predict_action", hidden)
        if config.discrete:
            labels = batch.action_targets.astype(jnp.int32)
            nll = optax.softmax_cross_entropy_with_integer_labels(predicted, labels)
            metrics["action_ce"] = _masked_mean(nll, batch.action_target_mask)
            metrics["action_acc"] = _masked_mean(
                (jnp.argmax(predicted, axis=-1) == labels).astype(jnp.float32), batch.action_target_mask)
            action_loss = metrics["action_ce"]
        else:
            error = jnp.mean(jnp.square(predicted - batch.action_targets), axis=-1)
            metrics["action_mse"] = _masked_mean(error, batch.action_target_mask)
            action_loss = metrics["action_mse"]
        loss = loss + config.action_loss_weight * action_loss
    if "text" in targets and batch.text_positions.shape[1] > 0:
        gathered = jnp.take_along_axis(hidden, batch.text_positions[..., None].astype(jnp.int32), axis=1)
        dtype, precision = compute_setting(config.compute_dtype)
        logits = lm_logits(params["llama"], config.llama, gathered, precision, dtype)  # (B, Lt, V) float32
        labels = batch.text_targets.astype(jnp.int32)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        metrics["text_ce"] = _masked_mean(nll, batch.text_mask)
        metrics["text_acc"] = _masked_mean(
            (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32), batch.text_mask)
        loss = loss + config.text_loss_weight * metrics["text_ce"]
    metrics["loss"] = loss
    return loss, metrics


def multitask_loss(params: Params, config: KalmConfig, batches: Mapping[str, KalmBatch],
                   normalizer: StateNormalizer,
                   task_weights: Mapping[str, float] | None = None
                   ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Sum over the tasks present in ``batches`` of ``weight · task_loss``.

    -> (total loss (), metrics ``{"loss": total, "<task>/<metric>": ...}``).
    """
    total = jnp.zeros((), jnp.float32)
    metrics: dict[str, jax.Array] = {}
    for task in TASKS:
        if task not in batches:
            continue
        weight = 1.0 if task_weights is None else float(task_weights.get(task, 1.0))
        loss, task_metrics = task_loss(params, config, batches[task], normalizer, TASK_TARGETS[task])
        total = total + weight * loss
        metrics.update({f"{task}/{name}": value for name, value in task_metrics.items()})
    unknown = set(batches) - set(TASKS)
    if unknown:
        raise ValueError(f"unknown KALM tasks {sorted(unknown)}; valid: {TASKS}")
    metrics["loss"] = total
    return total, metrics


# ---------------------------------------------------------------------------------------------------
# Host side: text format, corpus, layouts, batch builders


@dataclasses.dataclass(frozen=True)
class TextFormat:
    """The text tokens around the placeholders (token ids; host side, hashable).

    Attributes:
      start_id: first token of every sequence (e.g. ``<|im_start|>``, or BOS).
      end_id: the token closing a text target (e.g. ``<|im_end|>`` or EOS).
      separator: tokens between an instruction and the numeric part (``"\\n"``).
      prefixes: per task, the tokens of its tag (``"rollout\\n"`` ...), in :data:`TASKS` order.
    """

    start_id: int
    end_id: int
    separator: tuple[int, ...]
    prefixes: tuple[tuple[int, ...], ...]

    def prefix(self, task: str) -> tuple[int, ...]:
        """``(start_id, *tag tokens)`` of ``task``."""
        return (self.start_id, *self.prefixes[TASKS.index(task)])

    def to_json(self) -> dict[str, Any]:
        return {"start_id": self.start_id, "end_id": self.end_id, "separator": list(self.separator),
                "prefixes": [list(p) for p in self.prefixes]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TextFormat:
        return cls(int(data["start_id"]), int(data["end_id"]), tuple(int(t) for t in data["separator"]),
                   tuple(tuple(int(t) for t in p) for p in data["prefixes"]))


TASK_TAGS: Final[dict[str, str]] = {"rollout": "rollout\n", "dynamics": "dynamics\n",
                                    "consequence": "consequence\n", "explanation": "explain\n"}


def _encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    """Token ids of ``text`` without special tokens (a ``tokenizers.Tokenizer``)."""
    return tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False).ids)


def make_text_format(tokenizer: Any, *, start_token: str | None = "<|im_start|>",
                     end_token: str | None = "<|im_end|>", start_id: int | None = None,
                     end_id: int | None = None) -> TextFormat:
    """The :class:`TextFormat` for a ``tokenizers.Tokenizer``.

    ``start_token`` / ``end_token`` are looked up in the vocabulary (ChatML names by default, as in
    SmolLM2); pass ``start_id`` / ``end_id`` instead for tokenizers without them (Llama 2: BOS 1,
    EOS 2).
    """
    def lookup(name: str | None, given: int | None, role: str) -> int:
        if given is not None:
            return int(given)
        token_id = None if name is None else tokenizer.token_to_id(name)
        if token_id is None:
            raise ValueError(f"the tokenizer has no {role} token {name!r}; pass {role}_id=<token id> "
                             "(e.g. the BOS/EOS id of the model)")
        return int(token_id)

    return TextFormat(
        start_id=lookup(start_token, start_id, "start"), end_id=lookup(end_token, end_id, "end"),
        separator=_encode(tokenizer, "\n"),
        prefixes=tuple(_encode(tokenizer, TASK_TAGS[task]) for task in TASKS))


def tokenize_instructions(tokenizer: Any, instructions: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Token ids of each instruction (no special tokens)."""
    return tuple(_encode(tokenizer, text) for text in instructions)


@dataclasses.dataclass(frozen=True)
class KalmCorpus:
    """Real trajectories prepared for the task builders (host NumPy).

    Attributes:
      states: (N, T+1, S) float32.
      actions: (N, T) int32 or (N, T, A) float32.
      lengths: (N,) int32 valid steps L_i >= 1.
      instruction_tokens: N token-id tuples (each row's instruction, tokenized).
      transitions: (K, 2) int64 (row, step) of every valid transition.
      discrete: action kind.
      fingerprint: SHA-256 of the arrays and tokens (to check a resumed run sees the same data).
    """

    states: np.ndarray
    actions: np.ndarray
    lengths: np.ndarray
    instruction_tokens: tuple[tuple[int, ...], ...]
    transitions: np.ndarray
    discrete: bool
    fingerprint: str

    @property
    def num_trajectories(self) -> int:
        return int(self.states.shape[0])

    @property
    def state_dim(self) -> int:
        return int(self.states.shape[-1])


def build_corpus(datasets: Sequence[TrajectoryDataset], tokenizer: Any) -> KalmCorpus:
    """A :class:`KalmCorpus` from one or more datasets of the same environment (padded to the
    longest horizon), with every row's instruction tokenized."""
    if isinstance(datasets, TrajectoryDataset):
        datasets = [datasets]
    if not datasets:
        raise ValueError("build_corpus needs at least one dataset")
    envs = {ds.env for ds in datasets}
    kinds = {bool(ds.discrete) for ds in datasets}
    widths = {ds.states.shape[-1] for ds in datasets}
    if len(envs) > 1 or len(kinds) > 1 or len(widths) > 1:
        raise ValueError(f"datasets mix environments/action kinds/state widths: envs={sorted(envs)}, "
                         f"discrete={sorted(kinds)}, S={sorted(widths)}")
    horizon = max(ds.horizon for ds in datasets)
    states, actions, lengths, tokens = [], [], [], []
    for ds in datasets:
        pad = horizon - ds.horizon
        states.append(np.pad(ds.states, ((0, 0), (0, pad), (0, 0))).astype(np.float32))
        widths_a = ((0, 0), (0, pad)) + ((0, 0),) * (ds.actions.ndim - 2)
        actions.append(np.pad(ds.actions, widths_a))
        lengths.append(ds.mask.sum(axis=1).astype(np.int32))
        table = tokenize_instructions(tokenizer, ds.instructions)
        tokens.extend(table[int(i)] for i in ds.instruction_ids)
    discrete = kinds.pop()
    states_arr = np.concatenate(states)
    actions_arr = np.concatenate(actions).astype(np.int32 if discrete else np.float32)
    lengths_arr = np.concatenate(lengths)
    if np.any(lengths_arr < 1):
        raise ValueError("every trajectory needs at least one valid step")
    rows, steps = np.nonzero(np.arange(horizon)[None, :] < lengths_arr[:, None])
    digest = hashlib.sha256()
    for part in (states_arr, actions_arr, lengths_arr):
        digest.update(np.ascontiguousarray(part).tobytes())
    digest.update(repr(tokens).encode())
    return KalmCorpus(states_arr, actions_arr, lengths_arr, tuple(tokens),
                      np.stack([rows, steps], axis=1), discrete, digest.hexdigest())


@dataclasses.dataclass(frozen=True)
class TaskLayout:
    """Fixed sequence lengths of the four tasks (one compilation per layout).

    Attributes:
      max_instruction_tokens: I, the longest instruction (tokens).
      max_steps: the longest trajectory used by the rollout and explanation tasks (longer ones are
        cut to their first ``max_steps`` steps there).
      lengths: per task (in :data:`TASKS` order) the padded sequence length L.
      text_length: Lt of the explanation task (I + 1: the instruction and the end token).
      predict_initial_state: the rollout task also predicts s0 from the instruction.
    """

    max_instruction_tokens: int
    max_steps: int
    lengths: tuple[int, int, int, int]
    text_length: int
    predict_initial_state: bool = True

    def length(self, task: str) -> int:
        return self.lengths[TASKS.index(task)]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskLayout:
        fields = dict(data)
        fields["lengths"] = tuple(fields["lengths"])
        return cls(**fields)


def round_up_length(value: int, multiple: int = ROUND_LENGTH_TO) -> int:
    """``value`` rounded up to a multiple of ``multiple`` (padded sequence lengths)."""
    return -(-value // multiple) * multiple


def make_layout(fmt: TextFormat, max_instruction_tokens: int, max_steps: int, *,
                predict_initial_state: bool = True) -> TaskLayout:
    """The :class:`TaskLayout` for instructions up to I tokens and trajectories up to ``max_steps``."""
    if max_instruction_tokens < 1 or max_steps < 1:
        raise ValueError(f"need max_instruction_tokens >= 1 and max_steps >= 1, got "
                         f"{max_instruction_tokens} and {max_steps}")
    instr, steps, sep = max_instruction_tokens, max_steps, len(fmt.separator)
    raw = {
        "rollout": len(fmt.prefix("rollout")) + instr + sep + 2 * steps + 1,
        "dynamics": len(fmt.prefix("dynamics")) + 3,
        "consequence": len(fmt.prefix("consequence")) + instr + sep + 2,
        "explanation": len(fmt.prefix("explanation")) + 2 * steps + 1 + sep + instr + 1,
    }
    lengths = tuple(round_up_length(raw[task]) for task in TASKS)
    return TaskLayout(instr, steps, lengths, instr + 1, predict_initial_state)  # type: ignore[arg-type]


def layout_for_corpus(fmt: TextFormat, corpus: KalmCorpus, *, max_steps: int | None = None,
                      predict_initial_state: bool = True) -> TaskLayout:
    """The layout fitting every instruction and trajectory of ``corpus`` (``max_steps`` caps the
    trajectory length used by rollout/explanation)."""
    longest = int(corpus.lengths.max())
    steps = longest if max_steps is None else min(longest, int(max_steps))
    instr = max(len(t) for t in corpus.instruction_tokens)
    return make_layout(fmt, instr, steps, predict_initial_state=predict_initial_state)


class _Rows:
    """Preallocated (B, L) arrays of a :class:`KalmBatch` and a writer per row."""

    def __init__(self, rows: int, length: int, text_length: int, state_dim: int, discrete: bool,
                 action_dim: int) -> None:
        action_shape = (rows, length) if discrete else (rows, length, action_dim)
        self.tokens = np.zeros((rows, length), np.int32)
        self.attention_mask = np.zeros((rows, length), bool)
        self.state_inputs = np.zeros((rows, length, state_dim), np.float32)
        self.action_inputs = np.zeros(action_shape, np.int32 if discrete else np.float32)
        self.state_targets = np.zeros((rows, length, state_dim), np.float32)
        self.state_target_mask = np.zeros((rows, length), bool)
        self.action_targets = np.zeros(action_shape, np.int32 if discrete else np.float32)
        self.action_target_mask = np.zeros((rows, length), bool)
        self.text_positions = np.zeros((rows, text_length), np.int32)
        self.text_targets = np.zeros((rows, text_length), np.int32)
        self.text_mask = np.zeros((rows, text_length), bool)
        self.state_bases = np.zeros((rows, length, state_dim), np.float32)
        self.state_base_mask = np.zeros((rows, length), bool)
        self.position = np.zeros(rows, np.int64)
        self.text_count = np.zeros(rows, np.int64)
        self.last_state: list[np.ndarray | None] = [None] * rows

    def _next(self, row: int) -> int:
        pos = int(self.position[row])
        if pos >= self.tokens.shape[1]:
            raise ValueError(f"sequence of row {row} exceeds the layout length {self.tokens.shape[1]}")
        self.position[row] = pos + 1
        self.attention_mask[row, pos] = True
        return pos

    def text(self, row: int, ids: Sequence[int], *, target: bool = False) -> None:
        for token in ids:
            pos = self._next(row)
            self.tokens[row, pos] = token
            if target:
                slot = int(self.text_count[row])
                if pos == 0 or slot >= self.text_positions.shape[1]:
                    raise ValueError(f"row {row}: no room for text target at position {pos}")
                self.text_positions[row, slot] = pos - 1
                self.text_targets[row, slot] = token
                self.text_mask[row, slot] = True
                self.text_count[row] = slot + 1

    def state(self, row: int, value: np.ndarray, token_id: int, *, target: bool = False) -> None:
        pos = self._next(row)
        self.tokens[row, pos] = token_id
        self.state_inputs[row, pos] = value
        if target:
            self.state_targets[row, pos - 1] = value
            self.state_target_mask[row, pos - 1] = True
            base = self.last_state[row]
            if base is not None:
                self.state_bases[row, pos - 1] = base
                self.state_base_mask[row, pos - 1] = True
        self.last_state[row] = np.asarray(value, np.float32)

    def action(self, row: int, value: Any, token_id: int, *, target: bool = False) -> None:
        pos = self._next(row)
        self.tokens[row, pos] = token_id
        self.action_inputs[row, pos] = value
        if target:
            self.action_targets[row, pos - 1] = value
            self.action_target_mask[row, pos - 1] = True

    def batch(self) -> KalmBatch:
        return KalmBatch(self.tokens, self.attention_mask, self.state_inputs, self.action_inputs,
                         self.state_targets, self.state_target_mask, self.action_targets,
                         self.action_target_mask, self.text_positions, self.text_targets,
                         self.text_mask, self.state_bases, self.state_base_mask)


def _check_instruction(tokens: Sequence[int], layout: TaskLayout) -> None:
    if len(tokens) > layout.max_instruction_tokens:
        raise ValueError(f"an instruction of {len(tokens)} tokens exceeds the layout's "
                         f"max_instruction_tokens={layout.max_instruction_tokens}; build the layout "
                         "from every dataset you train on")


def _write_rollout(rows: _Rows, row: int, fmt: TextFormat, config: KalmConfig,
                   instruction: Sequence[int], states: np.ndarray, actions: np.ndarray,
                   predict_initial_state: bool, targets: bool = True) -> None:
    """``<start> rollout I sep [S s0] [A a0] … [S sL]`` with ``len(actions)`` = L steps."""
    rows.text(row, fmt.prefix("rollout"))
    rows.text(row, instruction)
    rows.text(row, fmt.separator)
    rows.state(row, states[0], config.state_token_id, target=targets and predict_initial_state)
    for t in range(len(actions)):
        rows.action(row, actions[t], config.action_token_id, target=targets)
        rows.state(row, states[t + 1], config.state_token_id, target=targets)


def build_task_batch(task: str, corpus: KalmCorpus, indices: np.ndarray, fmt: TextFormat,
                     layout: TaskLayout, config: KalmConfig) -> KalmBatch:
    """One task's batch for the given rows (host NumPy, fixed shape (B, layout length)).

    ``indices``: (B,) trajectory rows for rollout / consequence / explanation, (B,) transition
    indices (into ``corpus.transitions``) for dynamics.
    """
    if task not in TASKS:
        raise ValueError(f"unknown KALM task {task!r}; valid: {TASKS}")
    if corpus.discrete != config.discrete or corpus.state_dim != config.state_dim:
        raise ValueError("corpus and KalmConfig disagree on the action kind or state width")
    indices = np.asarray(indices, np.int64)
    text_length = layout.text_length if task == "explanation" else 0
    action_dim = 1 if config.discrete else config.num_actions
    rows = _Rows(len(indices), layout.length(task), text_length, config.state_dim, config.discrete,
                 action_dim)
    s_id, a_id = config.state_token_id, config.action_token_id
    for row, index in enumerate(indices):
        if task == "dynamics":
            traj, t = corpus.transitions[index]
            rows.text(row, fmt.prefix("dynamics"))
            rows.state(row, corpus.states[traj, t], s_id)
            rows.action(row, corpus.actions[traj, t], a_id)
            rows.state(row, corpus.states[traj, t + 1], s_id, target=True)
            continue
        instruction = corpus.instruction_tokens[index]
        _check_instruction(instruction, layout)
        length = int(corpus.lengths[index])
        if task == "consequence":
            rows.text(row, fmt.prefix("consequence"))
            rows.text(row, instruction)
            rows.text(row, fmt.separator)
            rows.state(row, corpus.states[index, 0], s_id)
            rows.state(row, corpus.states[index, length], s_id, target=True)
            continue
        steps = min(length, layout.max_steps)
        states, actions = corpus.states[index, : steps + 1], corpus.actions[index, :steps]
        if task == "rollout":
            _write_rollout(rows, row, fmt, config, instruction, states, actions,
                           layout.predict_initial_state)
        else:  # explanation
            rows.text(row, fmt.prefix("explanation"))
            rows.state(row, states[0], s_id)
            for t in range(steps):
                rows.action(row, actions[t], a_id)
                rows.state(row, states[t + 1], s_id)
            rows.text(row, fmt.separator)
            rows.text(row, instruction, target=True)
            rows.text(row, (fmt.end_id,), target=True)
    return rows.batch()


def sample_task_batches(corpus: KalmCorpus, fmt: TextFormat, layout: TaskLayout, config: KalmConfig,
                        batch_sizes: Mapping[str, int], rng: np.random.Generator
                        ) -> dict[str, KalmBatch]:
    """One multi-task step: for each task with a positive batch size, rows drawn uniformly with
    replacement (trajectories, or transitions for dynamics). Deterministic given ``rng``."""
    batches: dict[str, KalmBatch] = {}
    for task in TASKS:
        size = int(batch_sizes.get(task, 0))
        if size <= 0:
            continue
        population = len(corpus.transitions) if task == "dynamics" else corpus.num_trajectories
        indices = rng.integers(0, population, size=size)
        batches[task] = build_task_batch(task, corpus, indices, fmt, layout, config)
    if not batches:
        raise ValueError("every task batch size is 0; give at least one task rows")
    return batches


def rollout_prompts(fmt: TextFormat, config: KalmConfig, instructions: Sequence[Sequence[int]],
                    initial_states: np.ndarray, width: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Generation prompts: the rollout task's sequence up to and including ``[S s0]``.

    ``instructions``: B token-id sequences; ``initial_states``: (B, S) raw.
    ``width``: padded width P (default: the longest prompt rounded up to a multiple of 8).
    -> (tokens (B, P) int32, attention_mask (B, P) bool, state_inputs (B, P, S) float32),
    right-padded, exactly the rollout training layout.
    """
    initial_states = np.asarray(initial_states, np.float32)
    fixed = len(fmt.prefix("rollout")) + len(fmt.separator) + 1
    longest = fixed + max(len(t) for t in instructions)
    width = round_up_length(longest) if width is None else int(width)
    if width < longest:
        raise ValueError(f"prompt width {width} is shorter than the longest prompt ({longest} tokens)")
    rows = _Rows(len(instructions), width, 0, config.state_dim, config.discrete,
                 1 if config.discrete else config.num_actions)
    for row, tokens in enumerate(instructions):
        _write_rollout(rows, row, fmt, config, tokens, initial_states[row : row + 1],
                       np.zeros((0,)), False, targets=False)
    return rows.tokens, rows.attention_mask, rows.state_inputs
