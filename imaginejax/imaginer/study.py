"""Imaginer quality study on CLEVR-Robot: fine-tune on real expert data, imagine, score, compare.

    python -m imaginejax.imaginer.study train RUN [--state-prediction absolute|delta] [--steps 600]
        [--set state_loss_weight=0.5 ...]
    python -m imaginejax.imaginer.study evaluate RUN [--num 256] [--project] [--levels ...]
    python -m imaginejax.imaginer.study compare RUN_A:LABEL RUN_B:LABEL ...

``train`` fine-tunes the ``tiny`` preset on ``--trajectories`` real expert trajectories of the CLEVR
training goals (collected once by the demo's cache, :func:`imaginejax.demo.cached_expert_data`, seed
0, epsilon 0.1) into ``$IMAGINEJAX_HOME/imaginer-study/RUN`` (resumable; progress every 20 steps on
stderr). ``evaluate`` loads that run, generates ``--num`` imaginary rollouts per level with a fixed
key (the same initial states and tasks for every run), scores them
(:func:`~imaginejax.imaginer.quality.quality_report`) and writes
``RUN/quality[-projected].json`` and ``.md``. ``compare`` prints the per-level metrics of several
evaluated runs side by side. Everything runs on the CPU it finds; other users of the machine slow it
down but do not change the results (fixed seeds).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from imaginejax.paths import cache_root

LEVELS = ("rephrase", "easy", "hard")
STUDY_DIR = "imaginer-study"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_dir(name: str) -> Path:
    """``$IMAGINEJAX_HOME/imaginer-study/<name>``."""
    return cache_root() / STUDY_DIR / name


def real_data(num: int, seed: int = 0, epsilon: float = 0.1) -> Any:
    """The demo's cached expert trajectories of the CLEVR training goals (collected if missing)."""
    from imaginejax.demo import cached_expert_data

    root = cache_root() / "demo"
    root.mkdir(parents=True, exist_ok=True)
    return cached_expert_data("train", num, seed, epsilon, root)


def _overrides(pairs: list[str]) -> dict[str, Any]:
    """``["learning_rate=3e-4", ...]`` -> ``{"learning_rate": 3e-4}`` (values as Python literals)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"--set expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def train(args: argparse.Namespace) -> None:
    from imaginejax.imaginer.finetune import finetune

    data = real_data(args.trajectories)
    overrides = dict(num_steps=args.steps, checkpoint_every=args.steps, **_overrides(args.set))
    if args.state_prediction is not None:
        overrides["state_prediction"] = args.state_prediction
    _log(f"fine-tuning preset {args.preset!r} on {data.num_trajectories} trajectories "
         f"({data.num_transitions} steps) with {overrides}")
    start = time.perf_counter()
    result = finetune(args.preset, data, run_dir(args.run), **overrides)
    _log(f"done: {result.imaginer.step} steps in {time.perf_counter() - start:.0f} s "
         f"(this call), run {result.run_dir}")


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from imaginejax.envs import make
    from imaginejax.imaginer.finetune import load_imaginer
    from imaginejax.imaginer.imagine import imagine
    from imaginejax.imaginer.quality import quality_report

    directory = run_dir(args.run)
    imaginer = load_imaginer(directory)
    datasets = {}
    seconds = {}
    for index, level in enumerate(args.levels):
        env, params = make("clevr", level, embed=False)
        result = imagine(imaginer, env, params, jax.random.fold_in(jax.random.key(args.seed), index),
                         args.num, project=args.project, quality=False, progress=True)
        datasets[level] = result.dataset
        seconds[level] = result.seconds
    report = quality_report(datasets)
    tag = "quality-projected" if args.project else "quality"
    record = {"run": args.run, "step": imaginer.step, "preset": imaginer.preset,
              "state_prediction": imaginer.config.state_prediction, "project": bool(args.project),
              "num": args.num, "seed": args.seed, "generation_seconds": seconds, **report.to_dict()}
    (directory / f"{tag}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    table = report.to_markdown()
    (directory / f"{tag}.md").write_text(f"# {args.run} ({tag})\n\n{table}", encoding="utf-8")
    print(f"{args.run}: state prediction {imaginer.config.state_prediction}, projection "
          f"{'on' if args.project else 'off'}, {args.num} rollouts per level\n\n{table}")
    return record


def compare(args: argparse.Namespace) -> None:
    rows = []
    for item in args.runs:
        name, _, label = item.partition(":")
        run, _, tag = name.partition("@")
        record = json.loads((run_dir(run) / f"{tag or 'quality'}.json").read_text(encoding="utf-8"))
        for level, s in record["levels"].items():
            error = s["transition_error"] or {}
            rows.append([label or name, level, s["goal_consistency"], s["legal_rollout_rate"],
                         s["consistent_and_legal_rate"], s["illegal_state_rate"],
                         error.get("mean", float("nan")), s["exceeds_dynamics_rate"],
                         s["consistent_and_realistic_rate"]])
    head = ["run", "level", "goal consistency", "legal rollouts", "consistent & legal",
            "illegal states", "transition error (radii)", "exceeds dynamics", "consistent & realistic"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [row[0], row[1]] + [f"{100 * v:.1f} %" for v in row[2:6]] + [f"{row[6]:.2f}"] + [
            f"{100 * v:.1f} %" for v in row[7:]]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imaginejax.imaginer.study",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="fine-tune an imaginer on real CLEVR data")
    p_train.add_argument("run")
    p_train.add_argument("--preset", default="tiny")
    p_train.add_argument("--state-prediction", default=None, choices=("absolute", "delta"),
                         help="default: the preset's")
    p_train.add_argument("--steps", type=int, default=600)
    p_train.add_argument("--trajectories", type=int, default=2000)
    p_train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="other preset fields, e.g. --set learning_rate=3e-4")
    p_eval = sub.add_parser("evaluate", help="imagine rollouts per level and score them")
    p_eval.add_argument("run")
    p_eval.add_argument("--num", type=int, default=256)
    p_eval.add_argument("--seed", type=int, default=7)
    p_eval.add_argument("--project", action="store_true", help="project states onto the legal set")
    p_eval.add_argument("--levels", nargs="+", default=list(LEVELS))
    p_cmp = sub.add_parser("compare", help="side-by-side table of evaluated runs")
    p_cmp.add_argument("runs", nargs="+", metavar="RUN[@quality-projected][:LABEL]")
    args = parser.parse_args(argv)
    {"train": train, "evaluate": evaluate, "compare": compare}[args.command](args)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
