"""The protocol behind ``imaginejax collect / imagine / train / bench``: data → imaginary data → sweeps → report.

One :class:`~imaginejax.bench.config.Config` drives every step; each step is resumable, so re-running a command
continues where it stopped:

1. **real data** — expert trajectories of the training level, collected with the environment's scripted
   expert (``imaginejax.envs.<env>.expert.make_policy``) and cached under ``data.dir`` by their collection
   parameters (:func:`cached_expert_data`);
2. **imaginary data** for the novel levels (``imagine.source``): a KALM imaginer fine-tuned on the real
   data writes rollouts (:mod:`imaginejax.imaginer.finetune`, :mod:`imaginejax.imaginer.imagine`; the
   fine-tuning resumes from its checkpoints, finished datasets are reused), or *oracle* expert rollouts
   of the novel tasks (the paper's upper bound), or none;
3. **training** — for each algorithm, one sweep of seeds × hyperparameters × data conditions × ratios
   (:class:`~imaginejax.training.sweep.Sweep`) in one compiled call per chunk, evaluated on every level (every task
   equally often) after every interval (:mod:`imaginejax.training.loop`), with metrics, per-task success and
   checkpoints in ``<out>/runs/<algorithm>/``; a re-run resumes from the checkpoints (the engine refuses
   a checkpoint of a different sweep). The data conditions (``train.conditions``) follow the reference
   protocol: *real* runs train on real data only; for each novel level L, *imaginary* runs mix the
   real data with L's imaginary rollouts and *oracle* runs with real expert rollouts of L's tasks
   (``train.protocol = "pooled"`` mixes one buffer of every novel level's data instead);
4. **report** — the three-way table per algorithm and level (real only / real + imaginary / real +
   oracle; IQM and bootstrap 95 % intervals over seeds of each run's success averaged over its last
   ``report.last`` evaluations, with the imaginary data's quality beside it), the per-configuration
   table and figures (:mod:`imaginejax.bench.figures`).

The workspace (``--out``) and its layout: :mod:`imaginejax.bench.workspace`.

Under several processes (:mod:`imaginejax.core.distributed`) every process runs the same command: process 0
opens the workspace and prepares the data first (the others then read what it wrote), process 0 alone
logs and writes, and every process returns the same results.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import jax

from imaginejax import envs
from imaginejax.bench.config import Config, ConfigError, ReportConfig, Resolved, resolve
from imaginejax.bench.datasets import (DataArg, check_oracle_given, first_trajectories, load_datasets, mixed_sources,
                                       origin, real_data)
from imaginejax.bench.report import table
from imaginejax.bench.results import SOURCES_FILE, Results
from imaginejax.bench.sweeps import (algorithm_names, algorithm_sweep, check_algorithms, env_interface, eval_episodes,
                                     eval_steps_per_run, evaluation_levels, interface, train_algorithm)
from imaginejax.bench.workspace import (RANDOM_FILE, RANDOM_FIX, check_data, fingerprint, open_workspace,
                                        random_policy_success, report_paths, workspace_env)
from imaginejax.core import distributed
from imaginejax.core.checkpoint import Interrupted
from imaginejax.core.files import fields_of, read_json, write_json, write_text
from imaginejax.core.runlog import Log, log_stderr, quiet
from imaginejax.data import (EnvFacts, TrajectoryDataset, concat_transitions, read_manifest, to_transitions,
                             validate_for_env)
from imaginejax.data.budget import available_memory
from imaginejax.data.errors import DatasetError
from imaginejax.data.experts import cached_expert_path
from imaginejax.training.progress import count, format_seconds
from imaginejax.training.sweep import Sweep


def source_summary(datasets: Sequence[TrajectoryDataset]) -> dict[str, Any]:
    """What a data source holds: trajectories, transitions, the quality summary of imaginary data (the
    first dataset's, None for expert data), the filters applied to it and, for oversampled imaginary data,
    ``oversample`` (k, rollouts generated and kept, the ranking rule)."""
    provenance = datasets[0].provenance
    summary = {"trajectories": int(sum(ds.num_trajectories for ds in datasets)),
               "transitions": int(sum(ds.num_transitions for ds in datasets)),
               "source": datasets[0].source, "quality": provenance.get("quality"),
               "filters": provenance.get("filters", [])}
    if isinstance(provenance.get("oversample"), dict):
        summary["oversample"] = {k: provenance["oversample"].get(k) for k in ("k", "generated", "kept", "rule")}
    return summary


# Seconds per unit of work on a 2-core CPU, for the plan's rough estimate (measured: docs/estimates.md).
ROUGH_SECONDS = {"compile": 20.0, "sample": 1.5e-5, "eval_step": 2e-5, "rollout": 0.2, "collect": 10.0,
                 "finetune_step": 1.5, "finetune_step_tiny": 0.5}


def data_memory(run: Resolved, *, real_given: bool = False, imaginary_given: bool = False,
                oracle_given: bool = False) -> dict[str, int]:
    """Host bytes the datasets of ``run`` take at most, before any is collected: per dataset, N padded
    trajectories of the level's step cap T (states (N, T+1, S), actions, rewards and flags (N, T)) and
    their transitions (state, next state, action, reward, terminal, instruction per step), float32.

    Returns: ``{"real": bytes, "imaginary": bytes, "oracle": bytes}`` (0 for given or untrained data);
    imaginary counts ``imagine.oversample`` × the kept rollouts, which generation holds at once.
    """
    def level_bytes(level: str, trajectories: int) -> int:
        env, params = envs.make(run.env, level)
        steps, state = int(params.max_steps), int(env.state_dim)
        action = 1 if env.discrete else int(env.action_dim)
        per_step = 4 * (state + action + 1) + 3 + 4 * (2 * state + action + 3)
        return trajectories * (4 * state + steps * per_step)

    imaginary = "imaginary" in run.conditions and run.imagine.source != "none" and not imaginary_given
    return {"real": 0 if real_given else level_bytes("train", run.data.episodes),
            "imaginary": sum(level_bytes(lv, n * run.imagine.oversample) for lv, n in run.episodes.items())
            if imaginary else 0,
            "oracle": sum(level_bytes(lv, n) for lv, n in run.episodes.items())
            if "oracle" in run.conditions and not oracle_given else 0}


def format_bytes(size: int) -> str:
    """``"1.25 GiB"`` / ``"3.4 MiB"``."""
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def check_data_memory(run: Resolved, estimate: dict[str, int], available: int | None = None) -> None:
    """Refuses a configuration whose datasets (:func:`data_memory`) exceed the memory available now.

    Raises:
      ConfigError: naming the estimate per kind of data, the memory available and what to lower.
    """
    available = available_memory() if available is None else available
    total = sum(estimate.values())
    if total > available:
        parts = ", ".join(f"{kind} {format_bytes(size)}" for kind, size in estimate.items() if size)
        raise ConfigError(f"the datasets of this configuration take up to {format_bytes(total)} of host memory "
                          f"({parts}; {run.data.episodes} real trajectories of {run.env}, "
                          + ", ".join(f"{n} per {lv}" for lv, n in run.episodes.items())
                          + f" imaginary / oracle) but {format_bytes(available)} are available: lower "
                          "data.episodes or imagine.episodes (imagine.level_episodes, imagine.oversample), or "
                          "run on a machine with more memory; nothing was collected")


def plan(config: Config, out: str | Path, *, imaginary: Sequence[DataArg] = (), real_given: bool = False,
         oracle: Sequence[DataArg] = ()) -> str:
    """What :func:`train` is about to do, before it does it: data, imaginer (fine-tuned or loaded, and how
    to skip fine-tuning), algorithms, runs, levels, evaluation episodes, updates, and a rough time
    estimate from these sizes (``ROUGH_SECONDS`` per unit of work; compilation dominates small runs)."""
    from imaginejax.imaginer.finetune import PRESETS

    d, im, t = config.data, config.imagine, config.train
    run = resolve(config)
    bare_levels = {lv: envs.make(d.env, lv) for lv in run.levels}
    spec = env_interface(run)
    algos = algorithm_names(t, spec)
    conditions, imagined = run.conditions, run.imagined
    imaginary_given = bool(imaginary)
    given_levels = {"imaginary": sorted({_level(item) for item in imaginary}),
                    "oracle": sorted({_level(item) for item in oracle})}
    sources = [""] if "real" in conditions else []
    for condition in ("imaginary", "oracle"):
        if condition in conditions or (condition == "imaginary" and imaginary_given):
            given = imaginary_given if condition == "imaginary" else bool(oracle)
            levels_of = given_levels[condition] if given else imagined
            sources += [f"{condition}/pooled"] if t.protocol == "pooled" else [f"{condition}/{lv}" for lv in levels_of]
    runs = {name: algorithm_sweep(t, run, name, spec, sources)[2].num_runs for name in algos}  # as trained
    configs = Sweep.grid(seeds=1, ratios=t.ratios, data=sources).num_runs  # data configurations per seed
    eval_steps = eval_steps_per_run(t, bare_levels)
    seconds = sum(ROUGH_SECONDS["compile"] + n * t.updates * t.batch_size * ROUGH_SECONDS["sample"]
                  + n * t.intervals * eval_steps * ROUGH_SECONDS["eval_step"] for n in runs.values())
    lines = [f"plan ({d.env}, preset {config.name or 'custom'}) -> {out}:",
             "  real data: " + ("the given --real datasets" if real_given else
                                f"{d.episodes} expert trajectories of train (cached in {run.data_root})")]
    collections = ([] if real_given else [("train", d.episodes, d.seed)]) + (
        [(lv, run.episodes[lv], im.seed + i) for i, lv in enumerate(imagined)]
        if ("oracle" in conditions and not oracle)
        or ("imaginary" in conditions and im.source == "oracle" and not imaginary_given) else [])
    seconds += ROUGH_SECONDS["collect"] * sum(  # datasets not cached yet
        not (cached_expert_path(d.env, lv, n, seed, d.epsilon, run.data_root, embed=d.embed) / "manifest.json").exists()
        for lv, n, seed in collections)
    if imaginary_given:
        lines.append("  imaginary data: the given --imaginary datasets (no imaginer)")
    elif "imaginary" in conditions and im.source == "imaginer":
        rollouts = sum(run.episodes.values())
        seconds += im.oversample * rollouts * ROUGH_SECONDS["rollout"]
        if im.preset == "shipped":
            lines.append(f"  imaginary data: the package's trained {d.env} imaginer, loaded (no fine-tuning)")
        else:
            steps = int(dict(im.finetune).get("num_steps", PRESETS[im.preset].num_steps))
            seconds += steps * ROUGH_SECONDS["finetune_step_tiny" if im.preset == "tiny" else "finetune_step"]
            lines.append(f"  imaginary data: FINE-TUNES imaginer preset {im.preset!r} for {steps} steps on the real "
                         f"data first (resumable, in {Path(out) / 'imaginary' / 'imaginer'}); skip it with --set "
                         "imagine.preset=shipped (a trained imaginer, where one ships), --set imagine.source=oracle "
                         "or none, or --imaginary DIR")
        counts = sorted(set(run.episodes.values()))
        if im.oversample == 1:
            lines.append(f"    then {rollouts} imaginary rollouts for {', '.join(imagined)}")
        elif len(counts) == 1:
            lines.append(f"    then {im.oversample} × {counts[0]} imaginary rollouts generated for each of "
                         f"{', '.join(imagined)}, best {counts[0]} kept (imagine.oversample: the best of each task by "
                         "the quality report)")
        else:
            lines.append("    then imaginary rollouts for " + ", ".join(
                f"{lv} ({im.oversample} × {run.episodes[lv]} generated, best {run.episodes[lv]} kept)"
                for lv in imagined) + " (imagine.oversample: the best of each task by the quality report)")
        if im.filter != "none":
            lines.append(f"    imagine.filter {im.filter!r} then drops the {'kept ' if im.oversample > 1 else ''}"
                         "rollouts that fail it")
    elif "imaginary" in conditions and im.source == "oracle":
        lines.append(f"  imaginary data: oracle expert rollouts of {', '.join(imagined)} (no imaginer)")
    else:
        lines.append("  imaginary data: none")
    if "oracle" in conditions:
        lines.append("  oracle data: " + (f"the given --oracle datasets ({', '.join(given_levels['oracle'])})" if oracle
                                          else f"expert rollouts of {', '.join(imagined)} (cached)"))
    lines += [f"  algorithms: {', '.join(algos)}" + ("" if t.algos else " (every registered one; choose with --algo "
                                                     "or train.algos)"),
              "  runs: " + ", ".join(f"{name} {n}" for name, n in runs.items())
              + f" ({count(t.seeds, 'seed')} × {count(configs, 'data configuration')}"
              + "".join(f" × {name}'s {count(n // (t.seeds * configs), 'hyperparameter setting')}"
                        for name, n in runs.items() if n != t.seeds * configs)
              + f"), {t.updates} updates each (batch {t.batch_size})",
              f"  evaluation: {'once' if t.intervals == 1 else f'{t.intervals} times'}, episodes per level: "
              + ", ".join(f"{lv} {n}" for lv, n in eval_episodes(t, bare_levels).items()),
              f"  estimate: roughly {format_seconds(seconds)} on a 2-core CPU (from these sizes, measured within 10-30 % "
              "on such a machine; more cores are faster, a loaded machine slower)" if jax.default_backend() == "cpu"
              else f"  estimate: none for a {jax.default_backend().upper()} yet (the progress line's ETA follows from "
                   "the second interval)",
              "  host memory for the datasets: up to " + format_bytes(sum(data_memory(
                  run, real_given=real_given, imaginary_given=imaginary_given, oracle_given=bool(oracle)).values()))
              + f" ({format_bytes(available_memory())} available now)"]
    return "\n".join(lines)


def _level(item: DataArg) -> str:
    """The level of a given dataset (its manifest's, for a directory: nothing else is read)."""
    return item.level if isinstance(item, TrajectoryDataset) else read_manifest(item)["level"]


@dataclasses.dataclass
class TrainOutcome:
    """What :func:`train` did: every algorithm's runs, the workspace, seconds per algorithm."""

    workspace: Path
    results: Results
    seconds: dict[str, float]


def train(config: Config, out: str | Path, *, real: Sequence[DataArg] = (), imaginary: Sequence[DataArg] = (),
          oracle: Sequence[DataArg] = (), log: Log = log_stderr) -> TrainOutcome:
    """Data (given or from the pipeline), then every configured algorithm's sweep, in workspace ``out``.

    Args:
      config: the configuration.
      out: workspace directory (created, or resumed).
      real: real datasets, as directories or in memory (default: the configuration's expert data).
      imaginary: imaginary datasets (default: ``imagine.source``'s data).
      oracle: real rollouts of the novel levels for the oracle condition (default: collected by the
        environment's expert, cached).
      log: message sink.
    """
    log = log if distributed.is_writer() else quiet
    # Across processes: the settings first, then the data, before any check that can fail on one process.
    distributed.agree({**config.to_json(), "--out": str(out), "--real": [origin(item) for item in real],
                       "--imaginary": [origin(item) for item in imaginary],
                       "--oracle": [origin(item) for item in oracle]})
    check_algorithms(config)
    run = resolve(config)
    check_oracle_given(run, config.train, oracle)
    check_data_memory(run, data_memory(run, real_given=bool(real), imaginary_given=bool(imaginary),
                                       oracle_given=bool(oracle)))
    out = distributed.writer_first(lambda: open_workspace(out, config))
    log(plan(config, out, imaginary=imaginary, real_given=bool(real), oracle=oracle))
    env_name = run.env
    log(f"data ({env_name}):")
    given_real = bool(real)
    real = load_datasets(real, "real", env_name, log) if given_real else distributed.writer_first(
        lambda: real_data(run, log))
    sources = distributed.writer_first(lambda: mixed_sources(run, real, out, imaginary=imaginary, oracle=oracle,
                                                             log=log))
    imag = [ds for datasets in sources.values() for ds in datasets]
    if jax.process_count() > 1:
        distributed.check_same({"real data": fingerprint(real),
                                **{f"imaginary data {name}": fingerprint(ds) for name, ds in sources.items()}})
    distributed.writer_first(lambda: check_data(out, real, imag))
    eval_levels = evaluation_levels(run)
    spec = interface(real[0], eval_levels)
    facts = EnvFacts.of(next(iter(eval_levels.values()))[0])
    for ds in list(real) + imag:  # before anything compiles: actions, states, widths against the environment
        try:
            validate_for_env(ds, facts, embed_dim=spec.embed_dim)
        except DatasetError as error:
            raise ConfigError(f"{ds.source} data of {ds.env}/{ds.level}: {error}") from None
    for ds in imag:
        if ds.instruction_embeddings.shape[1] != spec.embed_dim or ds.states.shape[-1] != spec.state_dim:
            raise ConfigError(f"imaginary data of level {ds.level} has {ds.states.shape[-1]}-d states and "
                              f"{ds.instruction_embeddings.shape[1]}-d embeddings, the real data "
                              f"{spec.state_dim}-d and {spec.embed_dim}-d: generate both with the same data.embed")
    if config.data.rl_episodes and not given_real:
        real = first_trajectories(real, config.data.rl_episodes)
        log(f"  RL trains on the first {config.data.rl_episodes} real trajectories (data.rl_episodes)")
    real_t = concat_transitions([to_transitions(ds, validate=False) for ds in real])
    imag_t = {name: concat_transitions([to_transitions(ds, validate=False) for ds in datasets])
              for name, datasets in sources.items()}
    summaries = {name: source_summary(datasets) for name, datasets in sources.items()}
    if distributed.is_writer():
        write_json(out / SOURCES_FILE, summaries)
    if distributed.is_writer() and not (out / RANDOM_FILE).exists():
        write_json(out / RANDOM_FILE, {"policy": "uniformly random actions",
                                       "success": random_policy_success(eval_levels, spec,
                                                                  eval_episodes(config.train, eval_levels))})
    results, seconds = Results(runs=(), levels=(), sources=json.loads(json.dumps(summaries))), {}
    for name in algorithm_names(config.train, spec):
        start = time.perf_counter()
        try:
            trained = train_algorithm(config, run, name, spec, eval_levels, real_t, imag_t, out / "runs" / name, log)
        except Interrupted as stop:
            raise Interrupted(f"{name} {stop}") from None
        results = results.merge(trained)
        seconds[name] = time.perf_counter() - start
        log(f"{name}: done in {seconds[name]:.0f}s")
    return TrainOutcome(workspace=out, results=results, seconds=seconds)


def report(results: Results, out: str | Path, settings: ReportConfig, *, figures: bool | None = None,
           log: Log = log_stderr) -> str:
    """The results tables (:func:`imaginejax.bench.report.table`) and the figures (``report.figures``, or
    ``figures`` when given) written to :func:`report_paths` (by the writer process); returns the tables.

    Args:
      results: in memory from :func:`train`, or :func:`imaginejax.bench.results.load_sweep` of a directory.
      out: the workspace or sweep directory.
      settings: the configuration's ``report`` section.
      figures: override ``report.figures``.
    """
    r = settings
    text = table(results, r.statistic, r.reps, r.seed, r.last)
    if not distributed.is_writer():
        return text
    table_path, figures_dir = report_paths(out, r.statistic)
    write_text(table_path, text + "\n")
    if r.figures if figures is None else figures:
        from imaginejax.bench.figures import write_figures

        found = workspace_env(out)
        env = floor = None
        if found is not None:
            workspace, env = found
            if (workspace / RANDOM_FILE).exists():
                with fields_of(workspace / RANDOM_FILE, RANDOM_FIX):
                    floor = {str(k): float(v) for k, v in read_json(workspace / RANDOM_FILE, RANDOM_FIX)["success"].items()}
        written = write_figures(results, figures_dir, statistic=r.statistic, reps=r.reps, seed=r.seed,
                                last=r.last, env=env, floor=floor)
        log(f"figures: {', '.join(sorted(p.name for p in written.values()))} in {figures_dir}")
    return text


def bench(config: Config, out: str | Path, log: Log = log_stderr) -> str:
    """The whole protocol (see the module docstring); returns the results table."""
    start = time.perf_counter()
    outcome = train(config, out, log=log)
    text = report(outcome.results, outcome.workspace, config.report, log=log)
    total = time.perf_counter() - start
    timing = ", ".join(f"{k} {v:.0f}s" for k, v in outcome.seconds.items())
    log(f"bench: {total:.0f}s in total (training: {timing})")
    return text
