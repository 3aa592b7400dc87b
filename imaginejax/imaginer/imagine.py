"""Imaginary rollouts: a fine-tuned KALM imaginer writes trajectories for new instructions.

For each row, an instruction of a level (rephrase / easy / hard) and an initial state drawn from the
environment's reset distribution (``env.reset_to_task_batch``) form the rollout prompt of training
(:func:`~imaginejax.imaginer.kalm.rollout_prompts`: ``<start> rollout I sep [S s0]``). Then, in one
jitted function (:func:`generate_rollouts`) with the KV cache:

    h ← hidden state at [S s0]                                    (prefill)
    repeat for t = 0 .. H-1, while some row is still running:
        a_t     = argmax action_head(h)          (continuous: the regression output, clipped into the
                                                  action box as the simulator would execute it)
        h_a     = Llama([A a_t])                 (one cached decode step)
        s_{t+1} = decode(state_head(h_a), s_t)   (absolute or delta head, kalm.decode_states)
        s_{t+1} = project(s_{t+1})               (optional: onto the legal set, see below)
        c, success, r_t = rules.step(c, s_t, a_t, s_{t+1}, goal, t+1)
        stop the row if success, or s_{t+1} is not finite
        h       = Llama([S s_{t+1}])             (one cached decode step)

``H`` is the level's episode cap (``params.max_steps``). Success and rewards are the environment's
own, through its :class:`~imaginejax.envs.registry.EpisodeRules` (:func:`episode_rules`, from
its registry entry's quality rules): by default its transition predicates
``success(s_t, a_t, s_{t+1}, goal)`` and ``reward(s_t, a_t, s_{t+1}, goal)`` (an environment whose
reward depends on the step index, BabyAI's ``reward(prev, action, next, goal, t, max_steps)``, gets
``t`` = steps taken including this one); environments whose predicates need running quantities carry
them per row (HalfCheetah: Σ dx and the legs' counts, updated from each generated state's dx;
Meta-World: the episode's first state for the dense reward's constants). An optional success bonus
(default 0) is added so imaginary and real rewards agree by default. A row that produced a
non-finite state is dropped, and counted: such a rollout is never written
(:class:`ImaginationResult.num_dropped_nonfinite`, the provenance, a warning). Terminals mark
success; a row that reaches ``H`` without success ends in a truncation.

**Projection** (``imagine(..., project=...)``, on by default for every environment whose quality
rules have one): each generated state is replaced by the environment's projection onto its legal
set (:attr:`~imaginejax.envs.registry.QualityRules.project`; CLEVR: balls clipped into the
workbench and overlapping balls pushed apart) *before* the success check, the reward and being fed
back, so the written rollout is exactly what the model continued from.

**Quality** (``imagine(..., quality=...)``, on by default for every environment with quality
rules): the written dataset's provenance carries
``quality``, the :func:`~imaginejax.imaginer.quality.summarize` dict of
:func:`~imaginejax.imaginer.quality.score_dataset` (goal consistency, transition error against the
simulator, illegal-state rates), so every exported imaginary dataset says how good it is;
:func:`write_imaginary_datasets` also writes ``<env>-imaginary-quality.json`` and ``.md`` for all levels
next to the dataset directories.

**Oversampling** (``imagine(..., oversample=k)``, default 1: nothing changes): k·N rows are generated
with the same key — rows 0 .. N-1 are exactly the rollouts ``oversample=1`` writes, the rest more draws
of the same kind — every finite row is scored against the simulator
(:func:`~imaginejax.imaginer.quality.score_dataset`), and N are kept by
:func:`~imaginejax.imaginer.quality.rank_rollouts`' order (goal reached with every state legal, then goal
reached, then legal, then the rest; within a class lower mean transition error; ties in generation
order), *per task*: of each task, the best as many as it has among rows 0 .. N-1 (where non-finite rows
leave a task short, the best of the other tasks fill up to N). So the kept data has exactly the task mix
``oversample=1`` writes, and only the rollouts within each task get better: ranking all k·N at once
would fill the budget with the tasks the imaginer finds easy and drop the hard ones, shifting the
training distribution away from the tasks evaluation weighs equally. Per task, the kept rollouts rank
at or above every dropped one, and, holding the ``oversample=1`` rows among their candidates, reach
their goal at least as often. The provenance's ``oversample`` records k, the counts generated and kept,
the ranking rule and the quality summary of all k·N rows (``quality`` is the kept rollouts').

The environment supplies (see ARCHITECTURE.md "Contracts"): ``reset_to_task_batch``,
``state_vector``, ``goal_of``, ``instructions(level)``, the pure predicates ``success`` and
``reward`` (or quality rules with :class:`~imaginejax.envs.registry.EpisodeRules`), ``name``,
``discrete``, ``num_actions``; its params ``max_steps``, ``level``, ``num_tasks``,
``instruction_embeddings``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from imaginejax import envs
from imaginejax.data.types import TrajectoryDataset, take_trajectories
from imaginejax.data.validate import EnvFacts, validate_dataset, validate_for_env
from imaginejax.envs.registry import EpisodeRules, QualityRules, transition_rules
from imaginejax.imaginer.finetune import Imaginer
from imaginejax.imaginer.generate import prefill
from imaginejax.imaginer.kalm import (KalmConfig, StateNormalizer, adapter_apply, decode_states, rollout_prompts,
                                      round_up_length, splice_embeddings, tokenize_instructions)
from imaginejax.imaginer.llama import Params, compute_setting, forward
from imaginejax.imaginer.quality import RANKING_RULE, best_rows, score_dataset, summarize, summary_markdown

__all__ = ["GeneratedRollouts", "ImaginationError", "ImaginationResult", "episode_rules",
           "generate_rollouts", "imagine", "rollouts_to_dataset", "write_imaginary_datasets"]

StatePredicate = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


class ImaginationError(ValueError):
    """Generation produced nothing that may be written (e.g. every row non-finite)."""


class GeneratedRollouts(NamedTuple):
    """Output of :func:`generate_rollouts` (device or host arrays).

    ``states``: (B, H+1, S) raw states, s0 first, zeros after a row's end. ``actions``: (B, H) int32
    or (B, H, A). ``rewards``: (B, H) float32. ``mask``: (B, H) bool valid steps (a prefix).
    ``success``: (B, H) bool, the step on which the goal held. ``lengths``: (B,) int32 valid steps.
    ``finite``: (B,) bool, every generated state of the row was finite. ``clipped``: (B,) int32 valid
    steps whose predicted continuous action left the action box and was clipped into it (0 if discrete).
    """

    states: Any
    actions: Any
    rewards: Any
    mask: Any
    success: Any
    lengths: Any
    finite: Any
    clipped: Any


@functools.partial(jax.jit, static_argnames=("config", "horizon", "success_fn", "reward_fn",
                                             "project_fn", "reward_uses_step", "rules", "action_box"))
def generate_rollouts(params: Params, config: KalmConfig, normalizer: StateNormalizer,
                      tokens: jax.Array, attention_mask: jax.Array, state_inputs: jax.Array,
                      initial_states: jax.Array, goals: jax.Array, *, horizon: int,
                      success_fn: StatePredicate | None = None,
                      reward_fn: Callable[..., jax.Array] | None = None,
                      project_fn: Callable[[jax.Array], jax.Array] | None = None,
                      reward_uses_step: bool = False,
                      rules: EpisodeRules | None = None,
                      action_box: tuple[float, float] | None = None) -> GeneratedRollouts:
    """Greedy, batched, KV-cached generation of state/action sequences (one compiled call).

    The backbone computes in ``config.compute_dtype`` (its KV cache too); the adapters, heads and the
    states and actions returned are float32.

    Args:
      params: ``{"llama", "kalm"}`` (LoRA merged).
      config: static KALM config.
      normalizer: the training state normaliser.
      tokens, attention_mask, state_inputs: the prompts from
        :func:`~imaginejax.imaginer.kalm.rollout_prompts`, (B, P), (B, P), (B, P, S).
      initial_states: (B, S) raw s0 (the state of each prompt's last placeholder).
      goals: (B, G) goal vectors for the predicates.
      horizon: H, maximum steps (static).
      success_fn, reward_fn: the environment's pure transition ``success`` / ``reward`` (static;
        used when ``rules`` is None; reward None: 0).
      project_fn: optional ``(B, S) -> (B, S)`` applied to every finite generated state (static).
      reward_uses_step: call ``reward_fn(s, a, s', goal, t)`` with ``t`` (B,) int32 the steps taken
        including this one (static; BabyAI's reward).
      rules: the environment's :class:`~imaginejax.imaginer.quality.EpisodeRules` (static; e.g.
        :func:`episode_rules`); replaces ``success_fn`` / ``reward_fn``.
      action_box: (low, high) of a continuous environment's actions (static): the regression head's
        action is clipped into it before it is fed back, scored and written (None: unclipped).
    Returns:
      :class:`GeneratedRollouts`.
    """
    if rules is None:
        if success_fn is None:
            raise ValueError("generate_rollouts needs `rules` (EpisodeRules) or `success_fn`")
        rules = transition_rules(success_fn, reward_fn, reward_uses_step=reward_uses_step)
    batch, width = tokens.shape
    state_dim = config.state_dim
    action_shape = (batch,) if config.discrete else (batch, config.num_actions)
    prompt_actions = jnp.zeros((batch, width) + action_shape[1:],
                               jnp.int32 if config.discrete else jnp.float32)
    embeds = splice_embeddings(params, config, tokens, state_inputs, prompt_actions, normalizer)
    compute_dtype, precision = compute_setting(config.compute_dtype)  # the KV cache holds compute_dtype
    hidden, cache = prefill(params["llama"], config.llama, inputs_embeds=embeds,
                            attention_mask=attention_mask, max_length=width + 2 * horizon,
                            dtype=compute_dtype, precision=precision)
    dtype = embeds.dtype

    def decode(inputs: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        out = forward(params["llama"], config.llama, inputs_embeds=inputs[:, None, :].astype(dtype),
                      cache=cache, compute_logits=False, dtype=compute_dtype, precision=precision)
        return out.hidden_states[:, 0], out.cache

    initial_states = initial_states.astype(jnp.float32)
    buffers = GeneratedRollouts(
        states=jnp.zeros((batch, horizon + 1, state_dim), jnp.float32).at[:, 0].set(initial_states),
        actions=jnp.zeros((batch, horizon) + action_shape[1:],
                          jnp.int32 if config.discrete else jnp.float32),
        rewards=jnp.zeros((batch, horizon), jnp.float32),
        mask=jnp.zeros((batch, horizon), bool),
        success=jnp.zeros((batch, horizon), bool),
        lengths=jnp.zeros((batch,), jnp.int32),
        finite=jnp.ones((batch,), bool),
        clipped=jnp.zeros((batch,), jnp.int32))
    done = jnp.zeros((batch,), bool)
    episode = rules.init(initial_states, goals)

    def keep_going(carry: tuple[Any, ...]) -> jax.Array:
        t, _, _, _, done, _, _ = carry
        return (t < horizon) & ~jnp.all(done)

    def step(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        t, hidden, cache, current, done, out, episode = carry
        prediction = adapter_apply(params, config, "predict_action", hidden)
        if config.discrete:
            action, outside = jnp.argmax(prediction, axis=-1).astype(jnp.int32), jnp.zeros((batch,), bool)
        elif action_box is None:
            action, outside = prediction, jnp.zeros((batch,), bool)
        else:
            action = jnp.clip(prediction, *action_box)
            outside = jnp.any(action != prediction, axis=-1)
        hidden_action, cache = decode(adapter_apply(params, config, "embed_action", action), cache)
        following = decode_states(config, normalizer,
                                  adapter_apply(params, config, "predict_state", hidden_action),
                                  current)
        finite = jnp.all(jnp.isfinite(following), axis=-1)
        safe = jnp.where(finite[:, None], following, 0.0)
        if project_fn is not None:
            safe = project_fn(safe)
            following = jnp.where(finite[:, None], safe, following)
        active = ~done
        advanced, step_success, step_reward = rules.step(
            episode, current, action, safe, goals, jnp.full((batch,), t + 1, jnp.int32))
        episode = jax.tree.map(
            lambda new, old: jnp.where(active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old),
            advanced, episode)
        succeeded = step_success & active & finite
        reward = jnp.where(active & finite, step_reward, 0.0)
        keep = active.reshape((batch,) + (1,) * (action.ndim - 1))
        out = GeneratedRollouts(
            states=out.states.at[:, t + 1].set(jnp.where(active[:, None], following, 0.0)),
            actions=out.actions.at[:, t].set(jnp.where(keep, action, jnp.zeros_like(action))),
            rewards=out.rewards.at[:, t].set(reward.astype(jnp.float32)),
            mask=out.mask.at[:, t].set(active),
            success=out.success.at[:, t].set(succeeded),
            lengths=out.lengths + active.astype(jnp.int32),
            finite=out.finite & (finite | ~active),
            clipped=out.clipped + (outside & active).astype(jnp.int32))
        done = done | succeeded | (active & ~finite) | (t + 1 >= horizon)
        hidden, cache = decode(adapter_apply(params, config, "embed_state",
                                              normalizer.normalize(safe)), cache)
        return t + 1, hidden, cache, safe, done, out, episode

    carry = (jnp.zeros((), jnp.int32), hidden, cache, initial_states, done, buffers, episode)
    out = jax.lax.while_loop(keep_going, step, carry)[5]
    return out


class ImaginationResult(NamedTuple):
    """``dataset``: the valid imaginary rollouts; ``num_requested``: the N rollouts asked for (k·N
    generated with ``oversample=k``); ``num_dropped_nonfinite``: generated rows dropped for a non-finite
    state; ``seconds``: wall time."""

    dataset: TrajectoryDataset
    num_requested: int
    num_dropped_nonfinite: int
    seconds: float


def rollouts_to_dataset(rollouts: GeneratedRollouts, *, instruction_ids: np.ndarray, goals: np.ndarray,
                        instructions: Sequence[str], instruction_embeddings: np.ndarray, env: str,
                        level: str, discrete: bool, provenance: dict[str, Any],
                        success_bonus: float = 0.0, num_actions: int | None = None,
                        env_facts: EnvFacts | None = None) -> tuple[TrajectoryDataset, int]:
    """Host-side assembly: drops rows with a non-finite state, sets terminals (success) and
    truncations (the last step of a row without success), validates (against the environment, as
    ``train`` does, when ``env_facts`` is given; else ``num_actions`` bounds discrete actions).

    -> (dataset with ``source="imaginary"``, number of rows dropped). Raises
    :class:`ImaginationError` when no row is left (nothing is built).
    """
    host = GeneratedRollouts(*(np.asarray(x) for x in jax.device_get(tuple(rollouts))))
    keep = _written_rows(host)
    dropped = int(len(host.finite) - len(keep))
    if len(keep) == 0:
        raise ImaginationError(
            f"all {len(host.finite)} generated rollouts held non-finite states (or no step); nothing "
            "was written. The imaginer's weights or state normaliser are broken: check the training "
            "losses and the checkpoint")
    mask = host.mask[keep]
    lengths = mask.sum(axis=1)
    terminals = host.success[keep] & mask
    last = np.zeros_like(mask)
    last[np.arange(len(keep)), lengths - 1] = True
    truncations = last & ~terminals.any(axis=1, keepdims=True)
    rewards = np.where(mask, host.rewards[keep] + success_bonus * terminals, 0.0).astype(np.float32)
    actions = host.actions[keep]
    meta = dict(provenance)
    meta.update(num_dropped_nonfinite=dropped, **_outcome(mask, terminals), success_bonus=float(success_bonus))
    dataset = TrajectoryDataset(
        states=host.states[keep].astype(np.float32),
        actions=actions.astype(np.int32 if discrete else np.float32),
        rewards=rewards, mask=mask.astype(bool), terminals=terminals.astype(bool),
        truncations=truncations.astype(bool),
        instruction_ids=np.asarray(instruction_ids)[keep].astype(np.int32),
        goals=_goal_array(np.asarray(goals)[keep]),
        instructions=tuple(instructions),
        instruction_embeddings=np.asarray(instruction_embeddings, np.float32),
        env=env, level=level, source="imaginary", discrete=bool(discrete), provenance=meta)
    if env_facts is None:
        validate_dataset(dataset, num_actions=num_actions if discrete else None)
    else:  # what `train` checks (action box, widths): never write what it refuses
        validate_for_env(dataset, env_facts)
    return dataset, dropped


def _clipped_rate(host: GeneratedRollouts) -> float:
    """Share of the written rows' valid steps whose predicted action was clipped into the action box (with
    oversampling: of every finite candidate, before the best are kept)."""
    rows = _written_rows(host)
    steps = int(host.mask[rows].sum())
    return round(float(host.clipped[rows].sum()) / max(steps, 1), 6)


def _written_rows(host: GeneratedRollouts) -> np.ndarray:
    """Indices of the rows :func:`rollouts_to_dataset` writes: every state finite, at least one step."""
    finite = host.finite & np.all(np.isfinite(host.states.reshape(len(host.finite), -1)), axis=1)
    return np.flatnonzero(finite & (host.lengths > 0))


def _outcome(mask: np.ndarray, terminals: np.ndarray) -> dict[str, Any]:
    """The provenance's ``num_rollouts``, ``success_rate`` and ``mean_length`` of rollouts (N, T)."""
    return {"num_rollouts": int(len(mask)), "success_rate": float(terminals.any(axis=1).mean()),
            "mean_length": float(mask.sum(axis=1).mean())}


def _keep_best(pool: TrajectoryDataset, tasks: np.ndarray, quotas: dict[int, int], count: int, oversample: int,
               generated: int, threshold: float | None) -> TrajectoryDataset:
    """The ``count`` best rollouts of ``pool`` (see the module docstring, "Oversampling"): ``tasks`` (P,)
    each pool row's task, ``quotas`` task -> rollouts to keep; the provenance gains ``oversample``."""
    scores = score_dataset(pool, threshold=threshold)
    rows = best_rows(scores, count, groups=tasks, quotas=quotas)
    kept = take_trajectories(pool, rows)
    record = {"k": int(oversample), "generated": int(generated), "kept": int(len(rows)), "rule": RANKING_RULE,
              "per_task": "each task keeps as many as oversample = 1 writes of it (its count among the first "
                          f"{count} generated rows)", "quality_generated": summarize(scores)}
    return dataclasses.replace(kept, provenance={**pool.provenance, **_outcome(kept.mask, kept.terminals),
                                                 "oversample": record})


def _goal_array(goals: np.ndarray) -> np.ndarray:
    return goals.astype(np.int32) if np.issubdtype(goals.dtype, np.integer) else goals.astype(np.float32)


def _key_data(key: jax.Array) -> list[int]:
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return [int(v) for v in np.asarray(key).ravel()]


_RESET_CACHE: dict[Any, Callable] = {}


def _reset_fn(env: Any) -> Callable:
    """Jitted ``(keys, params, tasks) -> (s0 (B, S), goals (B, G), instruction ids (B,))``."""
    if env not in _RESET_CACHE:
        def reset(keys: jax.Array, params: Any, tasks: jax.Array) -> tuple[jax.Array, ...]:
            _, state = env.reset_to_task_batch(keys, params, tasks)
            return env.state_vector(state), env.goal_of(state, params), state.instruction
        _RESET_CACHE[env] = jax.jit(reset)
    return _RESET_CACHE[env]


_REWARD_CACHE: dict[tuple[Any, int], Callable[..., jax.Array]] = {}


def _reward_fn(env: Any, max_steps: int) -> tuple[Callable[..., jax.Array], bool]:
    """The environment's reward as generation calls it, and whether it takes the step index.

    A reward with a ``t`` parameter (BabyAI) is bound to ``max_steps`` (one object per pair, so the
    jitted generation is not recompiled)."""
    parameters = inspect.signature(env.reward).parameters
    if "t" not in parameters:
        return env.reward, False
    cache_key = (env.reward, int(max_steps))
    if cache_key not in _REWARD_CACHE:
        if "max_steps" in parameters:
            _REWARD_CACHE[cache_key] = functools.partial(env.reward, max_steps=int(max_steps))
        else:
            _REWARD_CACHE[cache_key] = env.reward
    return _REWARD_CACHE[cache_key], True


def _quality_rules(env: Any) -> QualityRules | None:
    """The quality rules of ``env``'s registry entry; None outside the registry or without rules."""
    name = str(env.name)
    return envs.quality_rules(name) if name in envs.registered() else None


def episode_rules(env: Any, max_steps: int) -> EpisodeRules:
    """The :class:`~imaginejax.envs.registry.EpisodeRules` generation uses for ``env`` at step cap
    ``max_steps``: its quality rules' ``episode`` rules when it has them (HalfCheetah, Meta-World),
    else the environment's transition predicates ``env.success`` / ``env.reward`` (the same object
    for the same arguments, so the jitted generation compiles once)."""
    rules = _quality_rules(env)
    if rules is not None and rules.episode is not None:
        return rules.episode(int(max_steps))
    reward_fn, reward_uses_step = _reward_fn(env, int(max_steps))
    return transition_rules(env.success, reward_fn, reward_uses_step=reward_uses_step)


def imagine(imaginer: Imaginer, env: Any, env_params: Any, key: jax.Array, num_rollouts: int, *,
            task_indices: np.ndarray | None = None, chunk_size: int = 64, horizon: int | None = None,
            success_bonus: float = 0.0, project: bool | None = None, quality: bool | None = None,
            quality_threshold: float | None = None, oversample: int = 1,
            progress: bool = True) -> ImaginationResult:
    """Generates ``num_rollouts`` imaginary rollouts for the level of ``env_params``.

    Args:
      imaginer: a fine-tuned model (:func:`~imaginejax.imaginer.finetune.finetune` or
        :func:`~imaginejax.imaginer.finetune.load_imaginer`).
      env, env_params: e.g. ``imaginejax.envs.make("clevr", "rephrase")``.
      key: PRNG key; chunk c resets with ``fold_in(key, c)``.
      num_rollouts: N >= 1 rows to generate (rows with non-finite states are then dropped).
      task_indices: optional (N,) task rows of the level (default: uniform).
      chunk_size: rows per compiled call (the last chunk is padded and cut).
      horizon: step cap (default ``env_params.max_steps``).
      success_bonus: added to the reward of a successful step (default 0: the environment's reward).
      project: project every generated state onto the legal set with the projection of the
        environment's quality rules (:class:`~imaginejax.envs.registry.QualityRules`). None (default): when the
        environment has one; True: always (an error without one); False: never (the model's raw
        states).
      quality: score the rollouts against the simulator and store the summary in the provenance
        (``provenance["quality"]``). None (default): when the environment's registry entry has quality
        rules; True: always (an error without rules); False: never.
      quality_threshold: "exceeds dynamics" threshold (default: the rules').
      oversample: k >= 1: generate k·N rows and keep the N best per task (module docstring,
        "Oversampling"; needs the environment's quality rules). 1 (default): the N rows as generated.
      progress: print a line per chunk to stderr.
    Returns:
      :class:`ImaginationResult`; its dataset has ``source="imaginary"``, the level's instruction
      table and embeddings, and provenance naming the model, preset, checkpoint hash and training step
      (and how the checkpoint was chosen, ``checkpoint_selection``, when the imaginer says), state
      prediction, compute dtype (and ``trained_compute_dtype`` when it generated in another), projection,
      (``quality``) the quality summary and (``oversample`` > 1) the oversampling.
    """
    if num_rollouts < 1:
        raise ValueError(f"num_rollouts must be >= 1, got {num_rollouts}")
    if isinstance(oversample, bool) or not isinstance(oversample, (int, np.integer)) or oversample < 1:
        raise ValueError(f"oversample must be an integer >= 1 (1: keep every generated rollout), got {oversample!r}")
    config = imaginer.config
    if config.discrete != bool(env.discrete):
        raise ValueError("the imaginer and the environment disagree on discrete actions")
    project_fn, project_name = None, None
    quality_rules = _quality_rules(env)
    if project is None:
        project = quality_rules is not None and quality_rules.project is not None
    if project:
        if quality_rules is None or quality_rules.project is None:
            raise ValueError(f"project=True but environment {env.name!r} has no projection onto its "
                             "legal set in its quality rules; pass project=False")
        project_fn, project_name = quality_rules.project, quality_rules.project_name
    if oversample > 1 and quality_rules is None:
        raise ValueError(f"oversample={oversample} ranks rollouts by their quality, but environment {env.name!r} "
                         "has no quality rules to score them with; pass oversample=1")
    rules = episode_rules(env, int(env_params.max_steps))
    action_box = None if env.discrete else (float(env.action_low), float(env.action_high))
    level = str(env_params.level)
    horizon = int(env_params.max_steps if horizon is None else horizon)
    instructions = tuple(env.instructions(level))
    table = tokenize_instructions(imaginer.tokenizer, instructions)
    fixed = len(imaginer.text_format.prefix("rollout")) + len(imaginer.text_format.separator) + 1
    width = round_up_length(fixed + max(len(t) for t in table))
    if task_indices is not None:
        task_indices = np.asarray(task_indices, np.int32)
        if task_indices.shape != (num_rollouts,):
            raise ValueError(f"task_indices must have shape ({num_rollouts},), got {task_indices.shape}")
        task_indices = np.tile(task_indices, int(oversample))
    generated = int(oversample) * num_rollouts
    chunk = int(min(chunk_size, num_rollouts))  # of N, not k·N: rows 0 .. N-1 are oversample=1's
    reset = _reset_fn(env)
    parts: list[GeneratedRollouts] = []
    ids_parts, goal_parts, task_parts = [], [], []
    start = time.perf_counter()
    bar = tqdm(total=generated, desc=f"imagine {env.name}/{level}", unit="rollout", file=sys.stderr,
               disable=not progress)
    for c in range(-(-generated // chunk)):
        lo, hi = c * chunk, min((c + 1) * chunk, generated)
        key_chunk = jax.random.fold_in(key, c)
        key_tasks, key_reset = jax.random.split(key_chunk)
        if task_indices is None:
            tasks = jax.random.randint(key_tasks, (chunk,), 0, env_params.num_tasks, jnp.int32)
        else:
            tasks = jnp.asarray(np.resize(task_indices[lo:hi], chunk))
        s0, goals, ids = jax.device_get(reset(jax.random.split(key_reset, chunk), env_params, tasks))
        tokens, attention, state_inputs = rollout_prompts(
            imaginer.text_format, config, [table[int(i)] for i in ids], s0, width)
        out = generate_rollouts(imaginer.params, config, imaginer.normalizer, tokens, attention,
                                state_inputs, s0, goals, horizon=horizon, rules=rules,
                                project_fn=project_fn, action_box=action_box)
        out = GeneratedRollouts(*(np.asarray(x)[: hi - lo] for x in jax.device_get(tuple(out))))
        parts.append(out)
        ids_parts.append(np.asarray(ids)[: hi - lo])
        goal_parts.append(np.asarray(goals)[: hi - lo])
        task_parts.append(np.asarray(tasks)[: hi - lo])
        if progress:
            steps = sum(int(p.mask.sum()) for p in parts)
            bar.set_postfix_str(f"{steps:,} steps, {steps / max(time.perf_counter() - start, 1e-9):,.0f} "
                                "steps/s", refresh=False)
            bar.update(hi - lo)
    bar.close()
    merged = GeneratedRollouts(*(np.concatenate(field) for field in zip(*parts)))
    seconds = time.perf_counter() - start
    provenance = {
        "generator": "imaginejax.imaginer.imagine", "model": imaginer.model_name,
        "preset": imaginer.preset, "checkpoint_hash": imaginer.checkpoint_hash,
        "training_step": int(imaginer.step), "run_dir": imaginer.run_dir, "key": _key_data(key),
        "num_requested": int(num_rollouts), "horizon": horizon, "decoding": "greedy",
        "task_indices": "given" if task_indices is not None else "uniform",
        "state_prediction": config.state_prediction, "compute_dtype": config.compute_dtype,
        "projection": project_name,
        **({} if action_box is None else {"action_box": list(action_box), "clipped_action_rate": _clipped_rate(merged)}),
        "seconds": round(seconds, 3), "jax_version": jax.__version__,
    }
    if imaginer.trained_compute_dtype is not None:  # finetune.with_compute_dtype: not the dtype it was trained in
        provenance["trained_compute_dtype"] = imaginer.trained_compute_dtype
    if imaginer.selection is not None:  # e.g. the best checkpoint by validation, not the last
        provenance["checkpoint_selection"] = dict(imaginer.selection)
    dataset, dropped = rollouts_to_dataset(
        merged, instruction_ids=np.concatenate(ids_parts), goals=np.concatenate(goal_parts),
        instructions=instructions, instruction_embeddings=np.asarray(env_params.instruction_embeddings),
        env=str(env.name), level=level, discrete=bool(env.discrete), provenance=provenance,
        success_bonus=success_bonus, num_actions=getattr(env, "num_actions", None),
        env_facts=EnvFacts.of(env, legality=False))
    if oversample > 1:
        tasks = np.concatenate(task_parts)
        quotas = {int(t): int(n) for t, n in zip(*np.unique(tasks[:num_rollouts], return_counts=True))}
        dataset = _keep_best(dataset, tasks[_written_rows(merged)], quotas, num_rollouts, oversample, generated,
                             quality_threshold)
    if quality is None:
        quality = quality_rules is not None
    if quality:
        summary = summarize(score_dataset(dataset, threshold=quality_threshold))
        dataset = dataclasses.replace(dataset, provenance={**dataset.provenance, "quality": summary})
    if dropped:
        message = (f"imagine {env.name}/{level}: dropped {dropped} of {generated} rollouts with "
                   "non-finite generated states (never written)")
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return ImaginationResult(dataset, int(num_rollouts), dropped, seconds)


def write_imaginary_datasets(imaginer: Imaginer, env_name: str, out_root: str | os.PathLike[str],
                             num_rollouts: int, key: jax.Array, *,
                             levels: Sequence[str] = ("rephrase", "easy", "hard"), embed: bool = True,
                             overwrite: bool = False, **kwargs: Any) -> dict[str, Path]:
    """Generates and writes one imaginary dataset per level to ``out_root/<env>-<level>-imaginary``
    (atomic :func:`~imaginejax.data.io.save_dataset`). ``kwargs`` go to :func:`imagine`.

    With quality scoring on (the default where the environment has quality rules), every
    dataset's manifest carries its quality summary (``provenance["quality"]``), and
    ``out_root/<env>-imaginary-quality.json`` (``{"env", "levels": {level: summary}, "datasets":
    {level: {"dir", "checkpoint_hash"}}}``, with ``"oversample": {"k", "generated", "kept"}`` for an
    oversampled level) and ``.md`` (the table; an oversampled level's rollouts read "kept of
    generated") are written atomically after the last level; levels already in an existing file
    (written by an earlier call into the same ``out_root``) are kept unless regenerated.
    -> level -> dataset directory."""
    from imaginejax.core.files import write_text
    from imaginejax.data.io import save_dataset
    from imaginejax.envs import make
    from imaginejax.lang import encode_instructions

    written: dict[str, Path] = {}
    summaries: dict[str, Any] = {}
    oversampled: dict[str, Any] = {}
    for index, level in enumerate(levels):
        env, params = make(env_name, level, embed=encode_instructions if embed else None)
        result = imagine(imaginer, env, params, jax.random.fold_in(key, index), num_rollouts, **kwargs)
        written[level] = save_dataset(result.dataset,
                                      Path(out_root) / f"{env_name}-{level}-imaginary",
                                      overwrite=overwrite)
        if "quality" in result.dataset.provenance:
            summaries[level] = result.dataset.provenance["quality"]
        if "oversample" in result.dataset.provenance:
            oversampled[level] = result.dataset.provenance["oversample"]
    if summaries:
        root = Path(out_root)
        path = root / f"{env_name}-imaginary-quality.json"
        report: dict[str, Any] = {"env": env_name, "levels": {}, "datasets": {}}
        if path.is_file():
            try:
                previous = json.loads(path.read_text(encoding="utf-8"))
                if previous.get("env") == env_name:
                    report["levels"].update(previous.get("levels", {}))
                    report["datasets"].update(previous.get("datasets", {}))
            except (OSError, ValueError):
                pass  # an unreadable old report is replaced
        report["levels"].update(summaries)
        for level in summaries:
            entry: dict[str, Any] = {"dir": written[level].name, "checkpoint_hash": imaginer.checkpoint_hash}
            if level in oversampled:
                entry["oversample"] = {k: oversampled[level][k] for k in ("k", "generated", "kept")}
            report["datasets"][level] = entry
        generated = {level: entry["oversample"]["generated"] for level, entry in report["datasets"].items()
                     if isinstance(entry, dict) and isinstance(entry.get("oversample"), dict)}
        write_text(root / f"{env_name}-imaginary-quality.json",
                   json.dumps(report, indent=2) + "\n")
        write_text(root / f"{env_name}-imaginary-quality.md",
                   f"# Imaginary rollouts of {env_name}: quality\n\n"
                   + summary_markdown(report["levels"], generated=generated))
    return written
