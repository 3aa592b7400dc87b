"""Why an imaginer fails on CLEVR's rephrase level: wrong goal (language) or bad states (dynamics)?

    .venv/bin/python experiments/diagnosis/imaginer_rephrase.py probe MODEL [--num 128] [--seed 1] [--data DIR]
        [--no-generate] [--tag=-NAME]
    .venv/bin/python experiments/diagnosis/imaginer_rephrase.py embed MODEL [--centroid 4 --queries 2]

MODEL: ``shipped:clevr`` (the package's imaginer), a study run name or directory (``RUN@best``, ``RUN@500``
pick a checkpoint), or, for ``embed`` only, ``base:smollm2`` (SmolLM2-135M before fine-tuning).

**probe** — fresh expert trajectories of the training level (``--seed``, epsilon 0, not the fine-tuning
data), goals of the default validation split's held-out goals left out so that every model sees the same
rows. Each trajectory is asked twice, with a training phrasing (never one a validation split held out) and
with a rephrase phrasing of the same goal; everything else is identical. Per set:

* teacher-forced rollout on the expert trajectory (``rollout I sep [S s0] [A a0] [S s1] …``): the
  predicted first action and every predicted action against the expert's; the first action's correctness
  (:func:`imaginejax.envs.clevr.expert.push_advances_goal`); the error of each predicted state s_{t+1}
  given the true s_t, a_t (max over balls, in ball radii; > 1 is what quality.py calls exceeding dynamics),
  next to the error of predicting no motion;
* consequence prediction (``consequence I sep [S s0]`` → s_L): the predicted final state satisfies the
  goal; how many of the 80 goals it satisfies on average (a state that satisfies many says little);
* free generation (greedy, projection on, horizon 50): goal reached, first action correct, rate of
  generated steps whose action advances the goal from the generated state, transition error and
  exceeds-dynamics rate against the simulator (:func:`imaginejax.imaginer.quality.score_dataset`).

``--data DIR`` (e.g. the fine-tuning data) probes its first rows instead of fresh trajectories, each asked with
its own instruction and with a rephrase: a model that memorised its data agrees with 100 % of the recorded
actions there, ε-random ones included.

**embed** — mean-pooled final hidden states over the instruction tokens of the rollout prompt
(``<start> rollout\\n I \\n``). Goal centroids from ``--centroid`` training phrasings per goal; queries:
``--queries`` other training phrasings and ``--queries`` rephrase phrasings per goal (the same template
positions for every goal); nearest centroid (cosine, after subtracting the mean centroid; ``*_own_centre``: the
queries centred on their own mean) over the 80 goals; top-1 accuracy and per slot (ball a, ball b, direction).

Both print JSON and write it to ``$IMAGINEJAX_HOME/imaginer-study/diagnosis/``. Findings: docs/imaginer.md,
"Why SmolLM2 loses to tiny on rephrase".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax import envs
from imaginejax.core.files import write_text
from imaginejax.core.paths import cache_root
from imaginejax.envs.clevr import tasks
from imaginejax.envs.clevr.expert import push_advances_goal
from imaginejax.envs.clevr.quality import project_clevr
from imaginejax.imaginer.finetune import Imaginer, build_base_model, get_preset, load_imaginer
from imaginejax.imaginer.imagine import episode_rules, generate_rollouts, rollouts_to_dataset
from imaginejax.imaginer.kalm import (KalmCorpus, adapter_apply, build_task_batch, decode_states, kalm_hidden,
                                      make_layout, rollout_prompts, round_up_length,
                                      tokenize_instructions)
from imaginejax.imaginer.llama import forward
from imaginejax.imaginer.quality import score_dataset
from imaginejax.imaginer.records import validation_settings
from imaginejax.imaginer.validation import validation_split

CHUNK = 32
HORIZON = 50
OUT_DIR = "imaginer-study/diagnosis"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# Models and the probe set


def load_model(spec: str) -> Imaginer:
    """``shipped:clevr``, ``RUN[@best|@K]`` (a study run name or directory)."""
    if spec.startswith("shipped:"):
        from imaginejax.imaginer.shipped import load_shipped

        return load_shipped(spec.split(":", 1)[1])
    name, _, step = spec.partition("@")
    directory = Path(name) if Path(name).is_dir() else cache_root() / "imaginer-study" / name
    chosen: int | str | None = None if not step else (step if step == "best" else int(step))
    return load_imaginer(directory, chosen)


def probe_set(num: int, seed: int, data: str | None = None) -> dict[str, Any]:
    """``num`` fresh expert trajectories (training level, epsilon 0) outside the default validation split's
    held-out goals, each with a training phrasing (not held out by that split) and a rephrase phrasing of its
    goal (drawn with ``seed``). ``data``: a dataset directory to take the first rows of instead (e.g. the
    fine-tuning data), each asked with its own instruction as the training phrasing."""
    from imaginejax.data.experts import cached_expert_data
    from imaginejax.data.io import load_dataset

    split = validation_split("clevr", validation_settings({"every": 1}))
    ds = (cached_expert_data("clevr", "train", 2 * num, seed, 0.0, cache_root() / OUT_DIR, embed=False, log=_log)
          if data is None else load_dataset(data))
    table = tasks.level_goals("train")
    task = np.array([int(np.flatnonzero(np.all(table == g, axis=1))[0]) for g in ds.goals])
    keep = np.flatnonzero(~np.isin(task, split.held_out_goals))[:num]
    if len(keep) < num:
        raise SystemExit(f"only {len(keep)} probe trajectories outside the held-out goals; lower --num")
    rng = np.random.default_rng(seed)
    phrasings = {}
    for level in ("train", "rephrase"):
        _, params = envs.make("clevr", level, embed=False)
        strings = envs.make("clevr", level, embed=False)[0].instructions(level)
        ids, counts = np.asarray(params.phrasing_ids), np.asarray(params.phrasing_counts)
        chosen = []
        for k in task[keep]:
            options = [strings[m] for m in ids[k, : counts[k]] if strings[m] not in split.held_out]
            chosen.append(options[rng.integers(len(options))])
        phrasings[level] = chosen
    if data is not None:
        phrasings["train"] = [ds.instructions[i] for i in ds.instruction_ids[keep]]
    return {"states": ds.states[keep], "actions": ds.actions[keep], "lengths": ds.mask[keep].sum(1).astype(np.int32),
            "goals": ds.goals[keep], "tasks": task[keep], "phrasings": phrasings,
            "expert_success": float(ds.terminals[keep].any(1).mean())}


# ---------------------------------------------------------------------------------------------------
# Teacher-forced rollout and consequence prediction


def _corpus(data: dict[str, Any], tokens: tuple[tuple[int, ...], ...]) -> KalmCorpus:
    lengths = data["lengths"]
    rows, steps = np.nonzero(np.arange(data["actions"].shape[1])[None] < lengths[:, None])
    return KalmCorpus(data["states"].astype(np.float32), data["actions"].astype(np.int32), lengths, tokens,
                      np.stack([rows, steps], 1), True, "probe")


def _heads(params: Any, config: Any, batch: Any, normalizer: Any) -> tuple[jax.Array, jax.Array]:
    hidden = kalm_hidden(params, config, batch, normalizer)
    states = decode_states(config, normalizer, adapter_apply(params, config, "predict_state", hidden),
                           batch.state_bases, batch.state_base_mask)
    actions = jnp.argmax(adapter_apply(params, config, "predict_action", hidden), axis=-1)
    return states, actions


_heads = jax.jit(_heads, static_argnums=(1,))


def _batched_heads(im: Imaginer, task: str, corpus: KalmCorpus, layout: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """Host batch of all rows and the heads' outputs, computed in chunks of CHUNK rows (padded)."""
    n = corpus.num_trajectories
    index = np.arange(-(-n // CHUNK) * CHUNK) % n
    batch = build_task_batch(task, corpus, index, im.text_format, layout, im.config)
    states, actions = [], []
    for lo in range(0, len(index), CHUNK):
        part = jax.tree.map(lambda x: x[lo : lo + CHUNK], batch)
        s, a = jax.device_get(_heads(im.params, im.config, part, im.normalizer))
        states.append(s)
        actions.append(a)
    batch = jax.tree.map(lambda x: x[:n], batch)
    return batch, np.concatenate(states)[:n], np.concatenate(actions)[:n]


def _ball_error(predicted: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Max over balls of the position error, in ball radii: (..., 10) -> (...)."""
    diff = (predicted - true).reshape(predicted.shape[:-1] + (tasks.N_BALLS, 2))
    return np.linalg.norm(diff, axis=-1).max(-1) / tasks.BALL_RADIUS


def teacher_forced(im: Imaginer, data: dict[str, Any], phrasings: list[str]) -> dict[str, float]:
    tokens = tokenize_instructions(im.tokenizer, phrasings)
    corpus = _corpus(data, tokens)
    layout = make_layout(im.text_format, max(len(t) for t in tokens), int(data["lengths"].max()),
                         predict_initial_state=im.layout.predict_initial_state)
    batch, states, actions = _batched_heads(im, "rollout", corpus, layout)
    amask = batch.action_target_mask
    first = amask.argmax(1)
    rows = np.arange(len(first))
    first_action = actions[rows, first]
    smask = batch.state_target_mask & batch.state_base_mask
    error = _ball_error(states[smask], batch.state_targets[smask])
    still = _ball_error(batch.state_bases[smask], batch.state_targets[smask])
    advances = np.asarray(push_advances_goal(jnp.asarray(data["states"][:, 0]), jnp.asarray(first_action),
                                             jnp.asarray(data["goals"])))
    expert_first = np.asarray(push_advances_goal(jnp.asarray(data["states"][:, 0]),
                                                 jnp.asarray(data["actions"][:, 0]), jnp.asarray(data["goals"])))
    ball = first_action // tasks.NUM_DIRECTIONS
    cons_batch, cons_states, _ = _batched_heads(
        im, "consequence", corpus, make_layout(im.text_format, max(len(t) for t in tokens), 1))
    final = cons_states[cons_batch.state_target_mask]  # one target per row, in row order
    goals = jnp.asarray(data["goals"])
    satisfied = np.asarray(tasks.state_satisfied(jnp.asarray(final), goals))
    table = jnp.asarray(tasks.level_goals("train"))
    any_goal = np.asarray(tasks.state_satisfied(jnp.asarray(final)[:, None, :], table[None])).mean(1)
    final_true = data["states"][rows, data["lengths"]]
    return {
        "tf_first_action_agreement": float((first_action == data["actions"][:, 0]).mean()),
        "tf_action_agreement": float((actions[amask] == batch.action_targets[amask]).mean()),
        "tf_first_action_correct": float(advances.mean()),
        "tf_first_action_right_ball": float(((ball == data["goals"][:, 2]) | (ball == data["goals"][:, 3])).mean()),
        "expert_first_action_correct": float(expert_first.mean()),
        "tf_state_error_mean": float(error.mean()), "tf_state_error_exceeds_1": float((error > 1).mean()),
        "no_motion_error_mean": float(still.mean()), "no_motion_exceeds_1": float((still > 1).mean()),
        "consequence_goal_satisfied": float(satisfied.mean()),
        "consequence_goals_satisfied_of_80": float(any_goal.mean() * len(table)),
        "consequence_error_mean": float(_ball_error(final, final_true).mean()),
    }


# ---------------------------------------------------------------------------------------------------
# Free generation


def generated(im: Imaginer, data: dict[str, Any], phrasings: list[str]) -> dict[str, float]:
    env, params = envs.make("clevr", "train", embed=False)
    rules = episode_rules(env, HORIZON)
    tokens = tokenize_instructions(im.tokenizer, phrasings)
    width = round_up_length(len(im.text_format.prefix("rollout")) + len(im.text_format.separator) + 1
                            + max(len(t) for t in tokens))
    s0, goals = data["states"][:, 0].astype(np.float32), data["goals"]
    n = len(s0)
    index = np.arange(-(-n // CHUNK) * CHUNK) % n
    parts = []
    for lo in range(0, len(index), CHUNK):
        rows = index[lo : lo + CHUNK]
        prompt = rollout_prompts(im.text_format, im.config, [tokens[i] for i in rows], s0[rows], width)
        out = generate_rollouts(im.params, im.config, im.normalizer, *prompt, s0[rows], goals[rows], horizon=HORIZON,
                                rules=rules, project_fn=project_clevr)
        parts.append(jax.device_get(tuple(out)))
    merged = type(out)(*(np.concatenate(field)[:n] for field in zip(*parts)))
    ds, dropped = rollouts_to_dataset(merged, instruction_ids=np.arange(n), goals=goals, instructions=phrasings,
                                      instruction_embeddings=np.zeros((n, 0), np.float32), env="clevr",
                                      level="train", discrete=True, provenance={}, num_actions=tasks.NUM_ACTIONS)
    scores = score_dataset(ds)
    first = np.asarray(push_advances_goal(jnp.asarray(ds.states[:, 0]), jnp.asarray(ds.actions[:, 0]),
                                          jnp.asarray(ds.goals)))
    mask = ds.mask
    steps = np.asarray(push_advances_goal(jnp.asarray(ds.states[:, :-1]), jnp.asarray(ds.actions),
                                          jnp.asarray(ds.goals)[:, None]))[mask]
    reached = scores.goal_reached
    return {
        "gen_goal_reached": float(reached.sum() / n), "gen_dropped": int(dropped),
        "gen_first_action_correct": float(first.mean()),
        "gen_goal_reached_if_first_correct": float(reached[first].mean()) if first.any() else float("nan"),
        "gen_goal_reached_if_first_wrong": float(reached[~first].mean()) if (~first).any() else float("nan"),
        "gen_steps_advancing": float(steps.mean()),
        "gen_transition_error_mean": float(scores.transition_error[mask].mean()),
        "gen_exceeds_dynamics": float(scores.exceeds_dynamics[mask].mean()),
        "gen_mean_length": float(mask.sum(1).mean()),
    }


def probe(args: argparse.Namespace) -> dict[str, Any]:
    data = probe_set(args.num, args.seed, args.data)
    started = time.perf_counter()
    im = load_model(args.model)
    _log(f"loaded {args.model} (step {im.step}) in {time.perf_counter() - started:.0f} s")
    out: dict[str, Any] = {"model": args.model, "step": im.step, "num": args.num, "seed": args.seed, "data": args.data,
                           "expert_success": data["expert_success"], "sets": {}}
    for level in ("train", "rephrase"):
        started = time.perf_counter()
        row = teacher_forced(im, data, data["phrasings"][level])
        row["tf_seconds"] = round(time.perf_counter() - started, 1)
        if not args.no_generate:
            started = time.perf_counter()
            row.update(generated(im, data, data["phrasings"][level]))
            row["gen_seconds"] = round(time.perf_counter() - started, 1)
        out["sets"][level] = row
        _log(f"{level}: {json.dumps(row)}")
    return out


# ---------------------------------------------------------------------------------------------------
# Instruction embeddings


def embed_model(spec: str) -> tuple[Any, Any, Any, Any]:
    """(llama params, llama config, tokenizer, text format) of a model spec (``base:smollm2`` too)."""
    if spec == "base:smollm2":
        base = build_base_model(get_preset("smollm2-lora"), jax.random.key(0))
        return base.params, base.config, base.tokenizer, base.text_format
    im = load_model(spec)
    return im.params["llama"], im.config.llama, im.tokenizer, im.text_format


def _pooled(params: Any, config: Any, tokenizer: Any, fmt: Any, strings: list[str]) -> np.ndarray:
    """Mean final hidden state over each instruction's tokens in the rollout prompt: (N, D)."""
    tokens = tokenize_instructions(tokenizer, strings)
    prefix, sep = fmt.prefix("rollout"), fmt.separator
    width = round_up_length(len(prefix) + len(sep) + max(len(t) for t in tokens))
    ids = np.zeros((len(strings), width), np.int32)
    attention = np.zeros_like(ids, bool)
    pool = np.zeros((len(strings), width), np.float32)
    for r, t in enumerate(tokens):
        row = list(prefix) + list(t) + list(sep)
        ids[r, : len(row)], attention[r, : len(row)] = row, True
        pool[r, len(prefix) : len(prefix) + len(t)] = 1.0 / len(t)
    run = jax.jit(lambda p, i, m: forward(p, config, i, attention_mask=m, compute_logits=False).hidden_states)
    out = []
    for lo in range(0, len(strings), CHUNK):
        hidden = np.asarray(jax.device_get(run(params, ids[lo : lo + CHUNK], attention[lo : lo + CHUNK])), np.float32)
        out.append(np.einsum("bld,bl->bd", hidden, pool[lo : lo + CHUNK]))
    return np.concatenate(out)


def nearest_centroid(centroid_vectors: np.ndarray, centroid_goal: np.ndarray, query_vectors: np.ndarray,
                     own_centre: bool = False) -> np.ndarray:
    """Goal of the nearest centroid (cosine, after subtracting the mean centroid) for each query: (Q,).

    ``own_centre``: subtract the queries' own mean from them instead (removes a shift shared by every query,
    e.g. a new template's words, when the queries cover the goals evenly)."""
    goals = np.unique(centroid_goal)
    centroids = np.stack([centroid_vectors[centroid_goal == g].mean(0) for g in goals])
    centre = centroids.mean(0)
    c = centroids - centre
    q = query_vectors - (query_vectors.mean(0) if own_centre else centre)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return goals[np.argmax(q @ c.T, axis=1)]


def embed(args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    strings: dict[str, list[str]] = {"centroid": [], "train": [], "rephrase": []}
    goal_of: dict[str, list[int]] = {name: [] for name in strings}
    tables = {}
    for level in ("train", "rephrase"):
        env, params = envs.make("clevr", level, embed=False)
        tables[level] = (env.instructions(level), np.asarray(params.phrasing_ids), np.asarray(params.phrasing_counts))
    # The same templates (phrasing positions) for every goal: a query's template never singles out a goal.
    train_order = rng.permutation(int(tables["train"][2].min()))[: args.centroid + args.queries]
    rephrase_order = rng.permutation(int(tables["rephrase"][2].min()))[: args.queries]
    for k in range(len(tasks.level_goals("train"))):
        texts, ids, _ = tables["train"]
        picked = [texts[m] for m in ids[k, train_order]]
        strings["centroid"] += picked[: args.centroid]
        strings["train"] += picked[args.centroid :]
        texts, ids, _ = tables["rephrase"]
        strings["rephrase"] += [texts[m] for m in ids[k, rephrase_order]]
        goal_of["centroid"] += [k] * args.centroid
        goal_of["train"] += [k] * args.queries
        goal_of["rephrase"] += [k] * args.queries
    started = time.perf_counter()
    params, config, tokenizer, fmt = embed_model(args.model)
    vectors = {name: _pooled(params, config, tokenizer, fmt, s) for name, s in strings.items()}
    table = tasks.level_goals("train")
    out: dict[str, Any] = {"model": args.model, "centroid_phrasings": args.centroid, "queries": args.queries,
                           "seconds": round(time.perf_counter() - started, 1)}
    for name in ("train", "rephrase"):
        truth = np.asarray(goal_of[name])
        for own in (False, True):
            guess = nearest_centroid(vectors["centroid"], np.asarray(goal_of["centroid"]), vectors[name], own)
            out[name + ("_own_centre" if own else "")] = {
                "top1": float((guess == truth).mean()), "ball_a": float((table[guess, 2] == table[truth, 2]).mean()),
                "ball_b": float((table[guess, 3] == table[truth, 3]).mean()),
                "direction": float((table[guess, 4] == table[truth, 4]).mean())}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("model")
    p.add_argument("--num", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default=None, help="a dataset directory to probe on instead of fresh expert data")
    p.add_argument("--tag", default="", help="appended to the output file's name")
    p.add_argument("--no-generate", action="store_true", help="teacher-forced and consequence metrics only")
    e = sub.add_parser("embed")
    e.add_argument("model")
    e.add_argument("--centroid", type=int, default=4)
    e.add_argument("--queries", type=int, default=2)
    e.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = {"probe": probe, "embed": embed}[args.command](args)
    name = f"{args.command}{getattr(args, 'tag', '')}-{args.model.replace(':', '-').replace('/', '_').replace('@', '-')}.json"
    path = write_text(cache_root() / OUT_DIR / name, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    _log(f"written: {path}")


if __name__ == "__main__":
    main()
