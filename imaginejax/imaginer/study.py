"""Imaginer quality study: fine-tune on real expert data, imagine, score, compare (any environment
with an expert and quality rules; CLEVR-Robot by default).

    python -m imaginejax.imaginer.study train RUN [--env clevr|babyai|...] [--steps 600]
        [--trajectories 2000] [--state-prediction absolute|delta] [--validate-every K]
        [--set state_loss_weight=0.5 ...]
    python -m imaginejax.imaginer.study evaluate RUN [--num 256] [--project] [--levels ...] [--step K|best]
    python -m imaginejax.imaginer.study compare RUN_A:LABEL RUN_B:LABEL ...

``train`` fine-tunes the ``tiny`` preset on ``--trajectories`` real expert trajectories of the
environment's training level (seed 0, epsilon 0.1, collected once and cached by
:func:`imaginejax.data.experts.cached_expert_data`: CLEVR in the demo's
cache; other environments under ``$IMAGINEJAX_HOME/imaginer-study/data``) into
``$IMAGINEJAX_HOME/imaginer-study/RUN`` (resumable; progress every 20 steps on stderr; the
environment is recorded in ``RUN/study.json``); ``--validate-every K`` turns on the preset's validation
(:mod:`~imaginejax.imaginer.validation`: held-out phrasings and goals, scored every K steps; its other
settings with ``--set validation={...}``) and prints the table of its rows at the end. ``evaluate`` loads
that run (``--step best``: its best checkpoint by validation), generates ``--num``
imaginary rollouts per level with a fixed key (the same initial states and tasks for every run),
scores them (:func:`~imaginejax.imaginer.quality.quality_report`) and writes
``RUN/quality[-projected][-step<K>|-best][-n<NUM>][-seed<SEED>][-k<K>].json`` and ``.md`` (the plain name
for the defaults: latest checkpoint, 256 rollouts, seed 7, no oversampling; so another count never
overwrites a table); ``evaluate shipped:ENV`` scores the package's trained
imaginer of ENV instead (into ``$IMAGINEJAX_HOME/imaginer-study/shipped-ENV``). ``compare`` prints the per-level metrics of several
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

from imaginejax.core.files import write_text
from imaginejax.core.paths import cache_root

LEVELS = ("rephrase", "easy", "hard")
STUDY_DIR = "imaginer-study"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_dir(name: str) -> Path:
    """``$IMAGINEJAX_HOME/imaginer-study/<name>``."""
    return cache_root() / STUDY_DIR / name


STUDY_FILE = "study.json"
SHIPPED_PREFIX = "shipped:"
DEFAULT_NUM = 256  # rollouts per level that `evaluate` writes under the plain file name
DEFAULT_SEED = 7


def real_data(num: int, seed: int = 0, epsilon: float = 0.1, env: str = "clevr") -> Any:
    """Cached expert trajectories of the environment's training level (collected if missing).

    CLEVR reads the demo's cache (so earlier CLEVR runs resume on the same data); other environments
    use :func:`imaginejax.data.experts.cached_expert_data` (instructions not embedded: the imaginer reads
    the strings) under ``$IMAGINEJAX_HOME/imaginer-study/data``.
    """
    from imaginejax.data.experts import cached_expert_data

    root = cache_root() / ("demo" if env == "clevr" else f"{STUDY_DIR}/data")
    root.mkdir(parents=True, exist_ok=True)
    return cached_expert_data(env, "train", num, seed, epsilon, root, embed=env == "clevr", log=_log)


def run_env(directory: Path) -> str:
    """The environment a study run was trained on (``study.json``; runs without one are CLEVR)."""
    path = directory / STUDY_FILE
    if not path.is_file():
        return "clevr"
    return str(json.loads(path.read_text(encoding="utf-8"))["env"])


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

    directory = run_dir(args.run)
    if (directory / STUDY_FILE).is_file() and run_env(directory) != args.env:
        raise SystemExit(f"run {args.run!r} was trained on {run_env(directory)!r}, not {args.env!r}; "
                         "choose another RUN name")
    data = real_data(args.trajectories, env=args.env)
    overrides = {"num_steps": args.steps, "checkpoint_every": args.steps, **_overrides(args.set)}
    if args.state_prediction is not None:
        overrides["state_prediction"] = args.state_prediction
    if args.validate_every is not None:
        overrides["validation"] = {**(overrides.get("validation") or {}), "every": args.validate_every}
    _log(f"fine-tuning preset {args.preset!r} on {data.num_trajectories} trajectories "
         f"({data.num_transitions} steps) with {overrides}")
    start = time.perf_counter()
    result = finetune(args.preset, data, directory, **overrides)
    (directory / STUDY_FILE).write_text(json.dumps({"env": args.env, "trajectories": args.trajectories},
                                                   indent=2) + "\n", encoding="utf-8")
    _log(f"done: {result.imaginer.step} steps in {time.perf_counter() - start:.0f} s "
         f"(this call), run {result.run_dir}")
    if result.validation:
        from imaginejax.imaginer.validation import rows_markdown

        print(f"{args.run}: goal consistency by validation step (best in bold; {directory / 'validation.json'})\n\n"
              + rows_markdown(result.validation))


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from imaginejax.envs import make
    from imaginejax.imaginer.finetune import load_imaginer
    from imaginejax.imaginer.imagine import imagine
    from imaginejax.imaginer.quality import quality_report

    if args.run.startswith(SHIPPED_PREFIX):  # the package's trained imaginer of an environment
        from imaginejax.imaginer.shipped import load_shipped

        if args.step is not None:
            raise SystemExit(f"--step picks a checkpoint of a study run; {args.run} is the package's one imaginer")
        env_name = args.run[len(SHIPPED_PREFIX):]
        imaginer = load_shipped(env_name)
        directory = run_dir(args.run.replace(":", "-"))
        directory.mkdir(parents=True, exist_ok=True)
    else:
        directory = run_dir(args.run)
        env_name = run_env(directory)
        imaginer = load_imaginer(directory, args.step)
    datasets = {}
    seconds = {}
    for index, level in enumerate(args.levels):
        env, params = make(env_name, level, embed=False)
        result = imagine(imaginer, env, params, jax.random.fold_in(jax.random.key(args.seed), index),
                         args.num, project=args.project, quality=False, oversample=args.oversample, progress=True)
        datasets[level] = result.dataset
        seconds[level] = result.seconds
    report = quality_report(datasets)
    tag = ("quality-projected" if args.project else "quality") + (
        "-best" if args.step == "best" else f"-step{args.step}" if args.step else "") + (
        f"-n{args.num}" if args.num != DEFAULT_NUM else "") + (
        f"-seed{args.seed}" if args.seed != DEFAULT_SEED else "") + (
        f"-k{args.oversample}" if args.oversample > 1 else "")
    record = {"run": args.run, "env": env_name, "step": imaginer.step, "selection": imaginer.selection,
              "preset": imaginer.preset,
              "state_prediction": imaginer.config.state_prediction, "project": bool(args.project),
              "num": args.num, "seed": args.seed, "oversample": args.oversample, "generation_seconds": seconds,
              **report.to_dict()}
    table = report.to_markdown()
    written = [write_text(directory / f"{tag}.json", json.dumps(record, indent=2) + "\n"),
               write_text(directory / f"{tag}.md", f"# {args.run} ({tag})\n\n{table}")]
    print(f"{args.run} ({env_name}): state prediction {imaginer.config.state_prediction}, projection "
          f"{'on' if args.project else 'off'}, {args.num} rollouts per level"
          f"{f' (best of {args.oversample}x generated per task)' if args.oversample > 1 else ''}\n\n{table}\n\n"
          f"written: {', '.join(str(path) for path in written)}")
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
            "illegal states", "transition error (mean, error unit)", "exceeds dynamics",
            "consistent & realistic"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        cells = [row[0], row[1]] + [_percent(v) for v in row[2:6]] + [f"{row[6]:.2f}"] + [
            _percent(v) for v in row[7:]]
        print("| " + " | ".join(cells) + " |")


def _step(text: str) -> int | str:
    """``--step``: a checkpoint's step or ``best``."""
    if text == "best":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a step or 'best', got {text!r}") from None


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imaginejax.imaginer.study",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="fine-tune an imaginer on real expert data")
    p_train.add_argument("run")
    p_train.add_argument("--env", default="clevr", help="environment (default: clevr)")
    p_train.add_argument("--preset", default="tiny")
    p_train.add_argument("--state-prediction", default=None, choices=("absolute", "delta"),
                         help="default: the preset's")
    p_train.add_argument("--steps", type=int, default=600)
    p_train.add_argument("--trajectories", type=int, default=2000)
    p_train.add_argument("--validate-every", type=int, default=None, metavar="K",
                         help="validate on held-out phrasings and goals every K steps and keep the best checkpoint")
    p_train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="other preset fields, e.g. --set learning_rate=3e-4")
    p_eval = sub.add_parser("evaluate", help="imagine rollouts per level and score them")
    p_eval.add_argument("run", help="a study run, or shipped:ENV for the package's trained imaginer of ENV")
    p_eval.add_argument("--num", type=int, default=DEFAULT_NUM,
                        help=f"rollouts per level (default {DEFAULT_NUM}; another count writes ...-n<NUM>)")
    p_eval.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"generation key (default {DEFAULT_SEED}; another writes ...-seed<SEED>)")
    p_eval.add_argument("--project", action="store_true", help="project states onto the legal set")
    p_eval.add_argument("--levels", nargs="+", default=list(LEVELS))
    p_eval.add_argument("--oversample", type=int, default=1, metavar="K",
                        help="generate K x --num rollouts per level and keep the --num best per task (imagine's "
                             "oversample; writes ...-k<K>)")
    p_eval.add_argument("--step", type=_step, default=None,
                        help="checkpoint to evaluate: a step (writes quality[-projected]-step<k>) or best (the best "
                             "by validation, writes quality[-projected]-best); default: the latest")
    p_cmp = sub.add_parser("compare", help="side-by-side table of evaluated runs")
    p_cmp.add_argument("runs", nargs="+", metavar="RUN[@quality-projected][:LABEL]")
    args = parser.parse_args(argv)
    {"train": train, "evaluate": evaluate, "compare": compare}[args.command](args)


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
