"""Helpers shared by the benchmark scripts: wall-time measurement, table cells, the machine note, writing
``results/benchmarks/<name>.{md,json}``, and the PyTorch side run in the reference interpreter.

The scripts run as ``python experiments/benchmarks/<script>.py`` (their folder is then first on
``sys.path``) and import this module as ``_common``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "results" / "benchmarks"


# ------------------------------------------------------------------------------------------ timing


def wall_times(run: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``run`` (it must block until its work is done)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``run``."""
    return statistics.median(wall_times(run, repeats))


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """Minimum wall time of ``repeats`` calls of ``run``."""
    return min(wall_times(run, repeats))


# ------------------------------------------------------------------------------------------ tables


def fmt_rate(x: float | None) -> str:
    """A rate as a table cell: thousands separators, no decimals; "n/a" for None."""
    return "n/a" if x is None else f"{x:,.0f}"


def machine_note(load_before: float, versions: str) -> str:
    """The table note on the machine: processor, CPUs, load average before (``load_before``) and now, and
    ``versions`` (e.g. "jax 0.12.0, mujoco 3.3.0")."""
    return (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
            f"{load_before:.1f} before / {os.getloadavg()[0]:.1f} after the run (other processes share the "
            f"cores); {versions}.")


def write_results(out: Path, name: str, table: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Prints ``table`` and writes ``out/<name>.md`` (the table) and ``out/<name>.json`` ({meta, rows})."""
    print()
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table + "\n", encoding="utf-8")
    (out / f"{name}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2), encoding="utf-8")
    print(f"\nwritten to {out}/{name}.{{md,json}}")


# ------------------------------------------------------------------------------------------ PyTorch side


def add_reference_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ref-python`` (default ``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref/bin/python``) and the hidden
    ``--torch-worker SPEC OUT`` with which :func:`run_torch_worker` re-launches a script."""
    default_ref = os.environ.get("IMAGINEJAX_REF_PYTHON") or str(REPO_ROOT / ".venv-ref" / "bin" / "python")
    parser.add_argument("--ref-python", type=Path, default=Path(default_ref))
    parser.add_argument("--torch-worker", nargs=2, type=Path, help=argparse.SUPPRESS)


def run_torch_worker(ref_python: Path, script: str, spec: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    """Runs ``script --torch-worker SPEC OUT`` in the reference interpreter and returns OUT's JSON.

    Args:
      ref_python: the reference interpreter (torch installed); when it does not exist the PyTorch side
        is skipped (a message says so) and None is returned.
      script: the benchmark script's path (its ``__file__``).
      spec: builds what the worker reads from SPEC (JSON); called only when the interpreter exists.
    """
    if not ref_python.exists():
        print(f"no reference interpreter at {ref_python}: PyTorch side skipped", flush=True)
        return None
    with tempfile.TemporaryDirectory() as work:
        spec_path, out = Path(work) / "spec.json", Path(work) / "out.json"
        spec_path.write_text(json.dumps(spec()))
        subprocess.run([str(ref_python), script, "--torch-worker", str(spec_path), str(out)], check=True)
        return json.loads(out.read_text(encoding="utf-8"))
