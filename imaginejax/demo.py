"""The main job on the embedded default: the ImagineBench experiment on CLEVR-Robot, in minutes on a CPU.

``make demo`` (or ``python -m imaginejax.demo``) runs the ``clevr-demo`` preset through the same pipeline
as ``imaginejax bench``:

1. real expert data for the 80 training goals (scripted expert, cached);
2. imaginary rollouts for the novel levels (rephrase, easy, hard), written by the package's trained
   imaginer — SmolLM2-135M with LoRA adapters fine-tuned on CLEVR (:mod:`imaginejax.imaginer.shipped`;
   nothing is fine-tuned at run time) — scored by the automatic quality report; and *oracle* rollouts
   (real expert rollouts of the novel tasks, the paper's upper bound);
3. BC with several seeds on real data only, and for each novel level on real + that level's imaginary
   data and real + that level's oracle data, 50/50 per batch: every run in ONE compiled call, each
   evaluated on every task of every level inside it;
4. the three-way table (real only / real + imaginary / real + oracle per level, IQM and 95 %
   stratified-bootstrap intervals over seeds), the random policy's success as the floor, the
   imaginer's quality line, and the timing of each stage.

Everything lands in a workspace under the cache root (``$IMAGINEJAX_HOME/demo-workspace``), so a second
run reuses the data and the finished sweep.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax

from imaginejax.bench.config import load_config, resolve
from imaginejax.bench.protocol import report, train
from imaginejax.bench.report import table
from imaginejax.bench.results import Results
from imaginejax.bench.sweeps import eval_episodes, evaluation_levels
from imaginejax.bench.workspace import RANDOM_FILE, RANDOM_FIX
from imaginejax.core.files import fields_of, read_json
from imaginejax.core.paths import absolute, cache_root
from imaginejax.data import LEVELS


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def quality_lines(results: Results) -> list[str]:
    """One line per imagined level: the quality summary recorded with the imaginary data."""
    lines = []
    for name, source in results.sources.items():
        q = source.get("quality")
        if not name.startswith("imaginary/") or not q:
            continue
        exceeds = q.get("exceeds_dynamics_rate")
        lines.append(f"  {name.split('/', 1)[1]:>8}: {source['trajectories']} rollouts, mean length "
                     f"{q['mean_length']:.1f}, reach their goal {100 * q['goal_consistency']:.1f} %, consistent & "
                     f"legal {100 * q['consistent_and_legal_rate']:.1f} %, steps exceeding the simulator's dynamics "
                     + (f"{100 * exceeds:.1f} %" if exceeds is not None else "n/a"))
    return lines


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="imaginejax-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="clevr-demo", help="configuration preset (default: clevr-demo)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a preset key, as for imaginejax bench (repeatable)")
    parser.add_argument("--out", type=absolute, default=None,
                        help="workspace (default: $IMAGINEJAX_HOME/demo-workspace)")
    args = parser.parse_args(argv)
    config = load_config(args.preset, args.set)
    out = args.out or cache_root() / "demo-workspace"
    _log(f"ImagineJAX demo on {jax.devices()[0].platform.upper()} ({jax.device_count()} device(s)); "
         f"workspace: {out}")
    start = time.perf_counter()
    outcome = train(config, out, log=_log)
    report(outcome.results, outcome.workspace, config.report, figures=False, log=_log)
    total = time.perf_counter() - start

    eval_levels = evaluation_levels(resolve(config))
    with fields_of(outcome.workspace / RANDOM_FILE, RANDOM_FIX):
        floor = dict(read_json(outcome.workspace / RANDOM_FILE, RANDOM_FIX)["success"])
    r = config.report
    protocol = table(outcome.results, r.statistic, r.reps, r.seed, r.last, plain=False)
    print(f"\n{', '.join(config.train.algos).upper()} success rate (%) on {config.data.env}, "
          f"{config.train.seeds} seeds, {config.train.updates} updates:\n")
    print(protocol)
    episodes = eval_episodes(config.train, eval_levels)
    print("\nRandom policy (the floor): " + ", ".join(
        f"{lv} {100 * floor[lv]:.1f} %" for lv in LEVELS if lv in floor)
          + f" ({', '.join(f'{lv} {n}' for lv, n in episodes.items())} episodes per evaluation).")
    lines = quality_lines(outcome.results)
    if lines:
        print("Imaginary data (automatic quality report):\n" + "\n".join(lines))
    timing = ", ".join(f"{k} {v:.0f}s" for k, v in outcome.seconds.items())
    print(f"\nDone in {total:.0f}s (training and evaluation: {timing}); workspace {outcome.workspace} "
          f"(results.md, runs/, sources.json)")
    return protocol

