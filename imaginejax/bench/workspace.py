"""A workspace directory (``--out``): its record of the configuration and data, resumed or refused, the random
policy's floor, and where reports go.

    workspace.json        the configuration that determines results + fingerprints of the data used
    imaginary/imaginer/   the imaginer's fine-tuning run (imagine.source = "imaginer")
    imaginary/<env>-<level>-imaginary/   imaginary datasets
    runs/<algorithm>/     sweep.json, metrics.jsonl, metrics.csv, train.log, checkpoints/
    random.json           the random policy's success per level (the floor on the bar chart)
    figures/              curves.png, curves.csv, bars.png, bars.csv, results.md (IQM)
    results.md            the results table (IQM; ``report --statistic mean``: results-mean.md, figures-mean/)

Re-running with a configuration that would change results (data, imagine or train sections, except the
list of algorithms) in an existing workspace is refused with the differing fields named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from imaginejax.algos.base import Spec
from imaginejax.bench.config import Config, ConfigError
from imaginejax.core import distributed
from imaginejax.core.files import fields_of, read_json, write_json
from imaginejax.data import TrajectoryDataset


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------
def fingerprint(datasets: Sequence[TrajectoryDataset]) -> str:
    """SHA-256 over the arrays (and level, source) of ``datasets``: identifies the data a sweep used."""
    digest = hashlib.sha256()
    for ds in datasets:
        digest.update(f"{ds.env}/{ds.level}/{ds.source}".encode())
        for field in ("states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids",
                      "goals", "instruction_embeddings"):
            digest.update(np.ascontiguousarray(getattr(ds, field)).tobytes())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------
# Workspace
# ---------------------------------------------------------------------------------------------------
WORKSPACE_FILE = "workspace.json"


RANDOM_FILE = "random.json"


WORKSPACE_FIX = "it records the workspace's configuration; restore it, or train into a new --out"


RANDOM_FIX = "delete it: the next imaginejax train / bench in this workspace measures the random policy again"


def random_policy_success(eval_levels: dict[str, tuple[Any, Any]], spec: Spec, episodes: Mapping[str, int],
                          key: jax.Array | None = None) -> dict[str, float]:
    """Success rate of the uniformly random policy per level (discrete actions), evaluated as every run is
    (``episodes[level]`` episodes, every task equally often): the floor drawn on the bar chart. Empty for
    continuous actions."""
    from imaginejax.training.evaluation import evaluate

    if not spec.discrete:
        return {}
    key = jax.random.PRNGKey(0) if key is None else key

    def policy(obs: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, obs.shape[:1], 0, spec.action_dim)

    def success(env: Any, params: Any, episodes: int) -> float:
        return float(jax.jit(lambda key: evaluate(policy, env, params, key, episodes).success_rate)(key))

    return {level: success(env, params, episodes[level]) for level, (env, params) in eval_levels.items()}


def _results_key(config: Config) -> dict[str, Any]:
    key = config.results_key()
    # An empty train.eval_levels (every level) and imagine.oversample = 1 stay out of the key, so it equals
    # the key of a workspace made before these fields existed.
    key["train"] = {k: v for k, v in key["train"].items() if k != "algos" and (k != "eval_levels" or v)}
    key["imagine"] = {k: v for k, v in key["imagine"].items() if k != "oversample" or v != 1}
    return key


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _differences(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: {json.dumps(old)} -> {json.dumps(new)}"]


def open_workspace(out: str | Path, config: Config) -> Path:
    """Creates ``out`` or checks that its recorded configuration matches ``config`` (resume).

    Raises:
      ConfigError: ``out`` was created with a configuration that changes results (fields named).
    """
    out = Path(out).expanduser()
    record_path = out / WORKSPACE_FILE
    key = _results_key(config)
    if record_path.exists():
        old = read_json(record_path, WORKSPACE_FIX)
        with fields_of(record_path, WORKSPACE_FIX):
            diff = _differences(old["key"], key)
            recorded_report = old["config"].get("report")
        if diff:
            raise ConfigError(f"{out} was created with another configuration ({'; '.join(diff)}): re-run with the "
                              "same preset and --set values to resume it, or choose a new --out")
        report_section = config.to_json()["report"]
        if recorded_report != report_section and distributed.is_writer():
            # The report settings change no result: the latest ones are what `imaginejax report` reuses.
            old["config"]["report"] = report_section
            write_json(record_path, old)
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(record_path, {"key": key, "config": config.to_json(), "data": {}})
    return out


def check_data(out: Path, real: Sequence[TrajectoryDataset], imag: Sequence[TrajectoryDataset]) -> None:
    """Records the data fingerprints in the workspace, or checks them against the recorded ones.

    Raises:
      ConfigError: the workspace's sweeps were trained on other data.
    """
    record_path = out / WORKSPACE_FILE
    record = read_json(record_path, WORKSPACE_FIX)
    now = {"real": fingerprint(real), "imaginary": fingerprint(imag)}
    if record.get("data"):
        with fields_of(record_path, WORKSPACE_FIX):
            changed = [k for k in now if record["data"].get(k) != now[k]]
        if changed:
            raise ConfigError(f"{out} was trained on other {' and '.join(changed)} data: pass the same datasets "
                              "to resume it, or choose a new --out")
        return
    record["data"] = now
    write_json(record_path, record)


def report_paths(out: str | Path, statistic: str) -> tuple[Path, Path]:
    """Where a statistic's table and figures go: ``results.md`` and ``figures/`` for the default IQM,
    ``results-<statistic>.md`` and ``figures-<statistic>/`` otherwise, so no statistic overwrites another's."""
    suffix = "" if statistic == "iqm" else f"-{statistic}"
    return Path(out) / f"results{suffix}.md", Path(out) / f"figures{suffix}"


def _workspace_of(out: Path) -> Path | None:
    """The workspace holding ``out`` (itself, or the workspace of a ``runs/<algo>`` directory)."""
    return next((d for d in (out, out.parent.parent) if (d / WORKSPACE_FILE).exists()), None)


def workspace_config(out: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(workspace, its recorded configuration as JSON) of the workspace holding ``out``
    (:func:`_workspace_of`), or None.

    Raises:
      DamagedFile: the workspace's record is not readable JSON or lacks its fields (the file is named).
    """
    workspace = _workspace_of(Path(out))
    if workspace is None:
        return None
    record = workspace / WORKSPACE_FILE
    with fields_of(record, WORKSPACE_FIX):
        config = read_json(record, WORKSPACE_FIX)["config"]
        if not isinstance(config["data"]["env"], str) or not isinstance(config.get("report", {}), dict):
            raise TypeError("config.data.env is not a string or config.report not a table")
    return workspace, config


def workspace_env(out: str | Path) -> tuple[Path, str] | None:
    """(workspace, its ``data.env``) of the workspace holding ``out`` (:func:`_workspace_of`), or None."""
    found = workspace_config(out)
    return None if found is None else (found[0], found[1]["data"]["env"])
