"""``fit()``: train from Python in one call, on the path of ``imaginejax train``.

    import imaginejax
    results = imaginejax.fit("bc", env="clevr", real=["data/clevr-train-real"], seeds=3, updates=2000)
    print(imaginejax.table(results))
    policy = imaginejax.Policy.from_results(results, seed=0)

The arguments become a :class:`~imaginejax.bench.config.Config` (a preset, then the arguments, then
``overrides`` as ``--set`` strings), checked like the command line's, and :func:`imaginejax.bench.protocol.train`
runs the sweep in a workspace: ``out``, or a temporary directory removed afterwards (the trained states
stay in the returned :class:`~imaginejax.bench.results.Results`).
"""

from __future__ import annotations

import difflib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from imaginejax import algos as algo_registry
from imaginejax.bench.config import Config, ConfigError, apply_override, from_dict, read_preset, validate
from imaginejax.bench.datasets import DataArg
from imaginejax.bench.results import Results
from imaginejax.core.paths import absolute, enable_compilation_cache
from imaginejax.core.runlog import log_stderr
from imaginejax.data import TrajectoryDataset

# fit's argument -> the configuration field it sets (an error about the field names the argument).
ARGUMENTS = {"algo": "train.algos", "env": "data.env", "seeds": "train.seeds", "ratios": "train.ratios",
             "updates": "train.updates", "intervals": "train.intervals", "batch_size": "train.batch_size",
             "eval_levels": "train.eval_levels", "eval_episodes": "train.eval_episodes"}


def _hp_section(hp: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``hp`` -> ``train.algo.<name>`` tables: fixed values under ``hp``, lists under ``sweep``. Keyed by
    algorithm names it is per algorithm, else it applies to every algorithm of ``names``.

    Raises:
      ConfigError: a table for an algorithm not trained, a table under a name that is no algorithm, or
        algorithm tables mixed with hyperparameter values.
    """
    known = algo_registry.registered()
    for key, value in hp.items():
        if isinstance(value, Mapping) and key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"fit(): hp[{key!r}] is a table but {key!r} is not an algorithm; {hint}registered: "
                              f"{', '.join(known)}")
    tables_given = [k for k, v in hp.items() if isinstance(v, Mapping)]
    if tables_given and len(tables_given) < len(hp):
        values = [k for k in hp if k not in tables_given]
        raise ConfigError(f"fit(): hp mixes algorithm tables ({', '.join(tables_given)}) with values "
                          f"({', '.join(values)}): give hp={{name: {{hyperparameter: value}}}} for every algorithm, "
                          "or {hyperparameter: value} for all of them")
    unused = [k for k in tables_given if k not in names]
    if unused:
        raise ConfigError(f"fit(): hp has tables for {', '.join(map(repr, unused))}, which algo={list(names)} does "
                          f"not train: add them to algo or drop them from hp")
    per_algo = bool(tables_given)
    tables = {}
    for name in names:
        mine = dict(hp.get(name, {})) if per_algo else dict(hp)
        fixed = {k: v for k, v in mine.items() if not isinstance(v, (list, tuple))}
        swept = {k: list(v) for k, v in mine.items() if isinstance(v, (list, tuple))}
        tables[name] = {"hp": fixed, "sweep": swept}
    return tables


def _datasets(datasets: DataArg | Sequence[DataArg] | None, kind: str) -> list[DataArg]:
    """fit's ``real`` / ``imaginary`` as a list for training: datasets in memory as they are (never written
    to disk), directories checked to hold a dataset and made absolute."""
    if datasets is None:
        return []
    items = [datasets] if isinstance(datasets, (str, os.PathLike, TrajectoryDataset)) else list(datasets)
    out: list[DataArg] = []
    for item in items:
        if isinstance(item, TrajectoryDataset):
            out.append(item)
        elif isinstance(item, (str, os.PathLike)):
            if not (Path(item) / "manifest.json").is_file():
                raise ConfigError(f"{kind}: {item} is not a dataset directory (no manifest.json): pass directories "
                                  "written by imaginejax collect / save_dataset, or TrajectoryDataset objects")
            out.append(absolute(item))
        else:
            raise ConfigError(f"{kind}: expected dataset directories or TrajectoryDataset objects, got "
                              f"{type(item).__name__}")
    return out


def _toml(value: Any) -> str:
    """A Python value as the TOML text of a ``--set`` value (numbers, booleans, strings, lists of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def configure(algo: str | Sequence[str], env: str, *, imaginary: bool, seeds: int, ratios: Sequence[float] | None,
              hp: Mapping[str, Any] | None, updates: int, intervals: int, batch_size: int,
              eval_levels: Sequence[str] | None, eval_episodes: int, preset: str | None,
              overrides: Sequence[str] | Mapping[str, Any]) -> Config:
    """The configuration :func:`fit` trains with (``imaginary``: imaginary datasets are given).

    Raises:
      ConfigError: naming fit's argument (or the ``overrides`` key) and the fix.
    """
    from imaginejax.bench.sweeps import check_algorithms

    names = [algo] if isinstance(algo, str) else list(algo)
    raw: dict[str, Any] = read_preset(preset) if preset else {}
    raw.setdefault("name", Path(preset).stem if preset else "fit")
    raw.setdefault("data", {})["env"] = env
    raw.setdefault("imagine", {})["source"] = "imaginer" if imaginary else "none"
    train = raw.setdefault("train", {})
    train.update({"algos": names, "seeds": seeds, "updates": updates, "intervals": intervals,
                  "batch_size": batch_size, "eval_episodes": eval_episodes,
                  "eval_levels": list(eval_levels or ()),
                  "ratios": list(ratios) if ratios is not None else ([0.5] if imaginary else [0.0]),
                  "conditions": ["real", "imaginary"] if imaginary else ["real"]})
    if hp:
        for name, table in _hp_section(hp, names).items():
            current = train.setdefault("algo", {}).setdefault(name, {})
            current.setdefault("hp", {}).update(table["hp"])
            current.setdefault("sweep", {}).update(table["sweep"])
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(f"fit(): overrides is one string {overrides!r}: give a list of 'KEY=VALUE' strings, "
                          f"e.g. overrides=[{overrides!r}], or a dict {{KEY: value}}")
    if isinstance(overrides, Mapping):
        overrides = [f"{key}={_toml(value)}" for key, value in overrides.items()]
    try:
        for assignment in overrides:
            raw = apply_override(raw, assignment)
        config = from_dict(Config, raw)
        validate(config)
        check_algorithms(config)
    except ConfigError as error:
        message = str(error)
        for argument, field in ARGUMENTS.items():
            message = message.replace(field, f"{argument} ({field})")
        message = message.replace("train.algo.", "hp of ")
        raise ConfigError(f"fit(): {message}") from None
    return config


def fit(algo: str | Sequence[str] = "bc", env: str = "clevr",
        real: DataArg | Sequence[DataArg] | None = None, imaginary: DataArg | Sequence[DataArg] | None = None, *,
        seeds: int = 1, ratios: Sequence[float] | None = None, hp: Mapping[str, Any] | None = None,
        updates: int = 1000, intervals: int = 4, batch_size: int = 256, eval_levels: Sequence[str] | None = None,
        eval_episodes: int = 40, preset: str | None = None, overrides: Sequence[str] | Mapping[str, Any] = (),
        out: str | os.PathLike[str] | None = None, log: Callable[[str], None] | None = None) -> Results:
    """Trains ``algo`` (one name or several) on ``env`` and returns every run.

    Args:
      algo: algorithm registry name(s) (``imaginejax.algos.registered()``).
      env: environment registry name.
      real: real dataset directories or :class:`~imaginejax.data.TrajectoryDataset` objects (None: the
        configuration's expert data, collected once and cached).
      imaginary: imaginary datasets of novel levels, mixed into the real data at ``ratios`` (None: real only).
      seeds: seeds 0 .. n-1 per configuration.
      ratios: imaginary fraction of each batch (default 0.5 with imaginary data, else 0).
      hp: hyperparameter -> value (fixed) or list of values (swept); keyed by algorithm name for several.
      updates, intervals: gradient updates per run, evaluations during training (intervals divides updates).
      batch_size: transitions per update.
      eval_levels: levels evaluated after every interval (None: every level).
      eval_episodes: episodes per level per evaluation (rounded up to whole rounds of the level's tasks).
      preset: a preset of ``experiments/presets`` under the arguments (network widths, per-algorithm hp).
      overrides: ``"key=value"`` strings on top, as ``--set`` of the command line, or ``{key: value}``.
      out: the workspace (kept, resumable); None: a temporary one. Under several processes
        (:mod:`imaginejax.core.distributed`) every process trains; ``out`` is then required, on storage all see.
      log: message sink (default: stderr).

    Returns:
      The :class:`~imaginejax.bench.results.Results` (plain data): ``imaginejax.table(results)``,
      ``imaginejax.curves(results)``, ``imaginejax.Policy.from_results(results, algo=, seed=, ...)``.

    Raises:
      ConfigError: an argument is invalid (named with the fix).
    """
    import jax

    from imaginejax.bench import protocol

    if out is None and jax.process_count() > 1:
        raise ConfigError(f"fit() in a job of {jax.process_count()} processes needs out=: a workspace on storage "
                          "every process sees (each process's temporary directory would be its own)")
    enable_compilation_cache()
    config = configure(algo, env, imaginary=imaginary is not None, seeds=seeds, ratios=ratios, hp=hp,
                       updates=updates, intervals=intervals, batch_size=batch_size, eval_levels=eval_levels,
                       eval_episodes=eval_episodes, preset=preset, overrides=overrides)
    given_real, given_imaginary = _datasets(real, "real"), _datasets(imaginary, "imaginary")
    with tempfile.TemporaryDirectory(prefix="imaginejax-fit-") as scratch:
        outcome = protocol.train(config, absolute(out if out is not None else scratch), real=given_real,
                                 imaginary=given_imaginary, log=log or log_stderr)
    return outcome.results
