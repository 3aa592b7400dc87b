"""Sweep scaling: how the cost of one compiled interval grows with the number of runs R on this machine.

    python experiments/benchmarks/sweep_scaling.py [--runs 1 2 4 8 16 32 64] [--updates 200]

Language-conditioned BC on CLEVR-Robot (MiniLM-width embeddings, the reference network), real expert
data (cached under the cache root), batch 256; one interval = ``--updates`` gradient updates per run plus
an evaluation of ``--eval-episodes`` episodes per run on the train level. For each R the engine
(``imaginejax.training``) is built once, the first interval (compilation included) and then ``--repeats``
further intervals are timed; the table reports the median steady interval, total updates/s over all
runs, runs·intervals per second, and the cost per run relative to R = 1 (1.0 = perfect scaling; above
1 = each extra run costs more than the first), with the best steady interval beside the median.
Everything is measured in the same process, in order: the intervals of one R run inside one engine call,
so the R values cannot alternate; the run refuses to start at a load average above the core count unless
``--allow-busy`` (the table then says busy).
The table is printed as markdown and written to ``results/benchmarks/sweep_scaling.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax import envs
from imaginejax.algos.base import Spec
from imaginejax.algos.bc import BCHyperparams, make_bc
from imaginejax.data import to_transitions
from imaginejax.data.experts import cached_expert_data
from imaginejax.training.kernel import EngineConfig
from imaginejax.training.loop import make_train
from imaginejax.lang import encode_instructions
from imaginejax.core.paths import cache_root
from imaginejax.training.sweep import Sweep

from _common import REPO_ROOT, Spread, add_load_arguments, check_load, is_busy, load_note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--updates", type=int, default=200, help="updates per run per interval")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-episodes", type=int, default=40)
    parser.add_argument("--trajectories", type=int, default=200, help="real expert trajectories")
    parser.add_argument("--repeats", type=int, default=2, help="timed intervals after the first")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks")
    add_load_arguments(parser)
    args = parser.parse_args()
    load_before = check_load(args.allow_busy)

    root = cache_root() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    real = to_transitions(cached_expert_data("clevr", "train", args.trajectories, 0, 0.1, root))
    env, params = envs.make("clevr", "train", embed=encode_instructions)
    spec = Spec(state_dim=env.state_dim, embed_dim=int(params.instruction_embeddings.shape[1]),
                discrete=True, action_dim=env.num_actions)
    cfg = EngineConfig(batch_size=args.batch_size, updates_per_interval=args.updates,
                       num_intervals=1 + args.repeats, eval_episodes=args.eval_episodes)
    rows = []
    for runs in args.runs:
        trainer = make_train(make_bc(spec), spec, cfg, {"train": (env, params)})
        arrays = Sweep.grid(seeds=runs).build(BCHyperparams(learning_rate=jnp.float32(1e-3)))
        estimate = trainer.memory_estimate(jax.tree.map(lambda x: x[0], arrays.hp), real)
        result = trainer.train(arrays.keys, arrays.hp, real, log=None)
        spread = Spread.of(result.seconds[1:].tolist())
        steady = spread.median
        rows.append({"runs": runs, "first_interval_s": float(result.seconds[0]), "interval_s": steady,
                     "best_interval_s": spread.min,
                     "updates_per_s": runs * args.updates / steady, "run_intervals_per_s": runs / steady,
                     "estimated_mib": estimate.total(runs) / 2**20})
        print(f"R={runs:3d}: first interval {result.seconds[0]:6.1f}s, steady {steady:6.2f}s, "
              f"{rows[-1]['updates_per_s']:,.0f} updates/s", flush=True)
    base = rows[0]["interval_s"] / rows[0]["runs"]
    head = ("| runs R | first interval (s, incl. compile) | interval (s, best / median) | updates/s (all runs) | "
            "runs·intervals/s | cost per run vs R=1 | estimated memory (MiB) |\n|---:|---:|---:|---:|---:|---:|---:|\n")
    table = head + "\n".join(
        f"| {r['runs']} | {r['first_interval_s']:.1f} | {r['best_interval_s']:.2f} / {r['interval_s']:.2f} | "
        f"{r['updates_per_s']:,.0f} | "
        f"{r['run_intervals_per_s']:.2f} | {r['interval_s'] / r['runs'] / base:.2f} | {r['estimated_mib']:,.0f} |"
        for r in rows)
    load_after = os.getloadavg()[0]
    table += (f"\n\nMedian of {args.repeats} steady intervals per R (updates/s and the ratios from it); "
              f"{os.cpu_count()} CPUs, {load_note(load_before, load_after)}.")
    meta = {"load_before": load_before, "load_after": load_after, "busy": is_busy(load_before, load_after),"jax": jax.__version__, "devices": [str(d) for d in jax.devices()], "machine": platform.machine(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sweep_scaling.md").write_text(table + "\n", encoding="utf-8")
    (args.out / "sweep_scaling.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2),
                                                 encoding="utf-8")


if __name__ == "__main__":
    main()
