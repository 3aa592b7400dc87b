"""The main job on the embedded default: CLEVR-Robot, language-conditioned BC, every level.

``make demo`` (or ``python -m imaginejax.demo``) does, on a CPU, in minutes:

1. builds the four CLEVR-Robot levels (train, rephrase, easy, hard) with instruction embeddings from
   the MiniLM sentence encoder;
2. collects real expert data for the training goals, and *oracle* real data for the novel levels (the
   paper's upper bound: real rollouts of the very tasks the imaginer would have to imagine) — both with
   the scripted expert, cached on disk so a second run starts at training;
3. trains BC for several seeds × two data mixes in ONE compiled call (the run axis is vmapped):
   real data only (ratio 0), and real + oracle novel-level data drawn 50/50 (ratio 0.5);
4. evaluates every run on every level inside the same compiled call and prints the success table
   (mean ± standard deviation over seeds), saving it as JSON under the cache root.

Imaginary data (an LLM imaginer fine-tuned on the real data) replaces the oracle data once the imaginer
lands; the table's second row is the bound it is measured against.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax import envs
from imaginejax.algos.base import Spec
from imaginejax.algos.bc import BCHyperparams, make_bc
from imaginejax.bench import cached_expert_data
from imaginejax.data import LEVELS, concat_transitions, to_transitions
from imaginejax.engine import EngineConfig, TrainResult, make_train
from imaginejax.evaluation import evaluate
from imaginejax.paths import cache_root

NOVEL_LEVELS = ("rephrase", "easy", "hard")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def random_policy_success(eval_levels: dict, num_actions: int, episodes: int, seeds: int) -> dict:
    """Success rate of a uniformly random policy per level: (seeds,) per level, same protocol as BC."""
    out = {}
    for level, (env, params) in eval_levels.items():
        policy = lambda obs, key: jax.random.randint(key, obs.shape[:1], 0, num_actions)
        run = jax.jit(jax.vmap(lambda k: evaluate(policy, env, params, k, episodes).success_rate))
        out[level] = np.asarray(run(jax.random.split(jax.random.PRNGKey(7), seeds)))
    return out


def format_table(result: TrainResult, row_names: list[str], rows: list[np.ndarray],
                 random_success: dict | None = None) -> str:
    """Markdown table of final success rates: one row per group of runs, mean ± std over its seeds."""
    head = "| data | " + " | ".join(LEVELS) + " |\n|---|" + "---:|" * len(LEVELS) + "\n"
    lines = []
    if random_success is not None:
        lines.append("| random policy (reference point) | " + " | ".join(
            f"{100 * random_success[lv].mean():.1f} ± {100 * random_success[lv].std():.1f}" for lv in LEVELS
        ) + " |")
    for name, idx in zip(row_names, rows):
        cells = []
        for level in LEVELS:
            final = 100 * result.success[level][-1, idx]
            cells.append(f"{final.mean():.1f} ± {final.std():.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="imaginejax-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds per data mix (runs = 2 × seeds)")
    parser.add_argument("--train-trajectories", type=int, default=2000,
                        help="real expert trajectories for the 80 training goals")
    parser.add_argument("--oracle-trajectories", type=int, default=200,
                        help="oracle real trajectories per novel level (rephrase, easy, hard)")
    parser.add_argument("--epsilon", type=float, default=0.1, help="expert's random-action probability")
    parser.add_argument("--updates", type=int, default=4000, help="gradient updates per run")
    parser.add_argument("--intervals", type=int, default=2, help="evaluations during training")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-episodes", type=int, default=240, help="episodes per level per evaluation")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (reference: 1e-3)")
    args = parser.parse_args(argv)

    root = cache_root() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    _log(f"ImagineJAX demo on {jax.devices()[0].platform.upper()} ({jax.device_count()} device(s)); "
         f"cache: {root}")

    _log("1/3 data (scripted expert; cached after the first run)")
    real = cached_expert_data("clevr", "train", args.train_trajectories, 0, args.epsilon, root, log=_log)
    oracle = [cached_expert_data("clevr", level, args.oracle_trajectories, 1 + i, args.epsilon, root, log=_log)
              for i, level in enumerate(NOVEL_LEVELS)]
    real_t = to_transitions(real)
    oracle_t = concat_transitions([to_transitions(ds) for ds in oracle])

    _log(f"2/3 training BC: {args.seeds} seeds × 2 data mixes = {2 * args.seeds} runs in one compiled call")
    eval_levels = {level: envs.make("clevr", level) for level in LEVELS}
    env, params = eval_levels["train"]
    spec = Spec(state_dim=env.state_dim, embed_dim=int(params.instruction_embeddings.shape[1]),
                discrete=True, action_dim=env.num_actions)
    if args.updates % args.intervals:
        raise SystemExit("--updates must be a multiple of --intervals")
    config = EngineConfig(batch_size=args.batch_size, updates_per_interval=args.updates // args.intervals,
                          num_intervals=args.intervals, eval_episodes=args.eval_episodes)
    trainer = make_train(make_bc(spec), spec, config, eval_levels)
    runs = 2 * args.seeds
    keys = jax.random.split(jax.random.PRNGKey(2024), runs)
    ratios = jnp.repeat(jnp.asarray([0.0, 0.5], jnp.float32), args.seeds)
    hp = BCHyperparams(learning_rate=jnp.full((runs,), args.lr, jnp.float32))
    start = time.perf_counter()
    result = trainer.train(keys, hp, real_t, oracle_t, ratios, log=_log)
    seconds = time.perf_counter() - start

    _log("3/3 results")
    names = ["real (train goals) only", "real + oracle novel-level data, 50/50"]
    rows = [np.arange(args.seeds), np.arange(args.seeds, runs)]
    table = format_table(result, names, rows,
                         random_policy_success(eval_levels, spec.action_dim, args.eval_episodes, args.seeds))
    print(f"\nBC success rate (%) on CLEVR-Robot, mean ± std over {args.seeds} seeds, "
          f"{args.updates} updates, {args.eval_episodes} episodes per level:\n")
    print(table)
    print(f"\n{runs} runs trained and evaluated in {seconds:.0f}s "
          f"({runs * args.updates / seconds:,.0f} updates/s including evaluation and compilation)")
    summary = {
        "args": vars(args),
        "table": table,
        "success": {lv: result.success[lv].tolist() for lv in LEVELS},
        "ratios": np.asarray(ratios).tolist(),
        "seconds": seconds,
        "interval_seconds": result.seconds.tolist(),
        "jax": jax.__version__,
    }
    out = cache_root() / "results" / "demo.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out)
    print(f"saved {out}")
    return summary


if __name__ == "__main__":
    main()
