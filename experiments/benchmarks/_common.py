"""Helpers shared by the benchmark scripts: alternating timing of contenders, the load-average guard,
table cells, writing ``results/benchmarks/<name>.{md,json}``, and long-lived worker processes for the
alternatives run in another interpreter (PyTorch, d3rlpy, metaworld) at their best thread setting.

The scripts run as ``python experiments/benchmarks/<script>.py`` (their folder is then first on
``sys.path``) and import this module as ``_common``; it needs the standard library only, so the
workers in the reference interpreter import it too.

Fair timing, as every script does it:

* contenders alternate (:func:`alternate`: A B A B …), so a burst of load from other processes falls on
  every contender of a round instead of on all the repeats of one;
* each contender is reported by the minimum *and* the median of its samples (:class:`Spread`);
* a run refuses to start at a load average above the core count (:func:`check_load`) unless
  ``--allow-busy`` is given, and its table then says "busy" (:func:`load_note`);
* the alternative runs at each thread setting of :data:`ALTERNATIVE_THREADS` with
  ``OMP_WAIT_POLICY=PASSIVE`` (:func:`thread_env`), interleaved with ours, and the better one is
  reported (:func:`fastest`): OpenMP workers that spin-wait stall on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "results" / "benchmarks"
ALTERNATIVE_THREADS = (1, 2)


# ------------------------------------------------------------------------------------------ timing


def timed(run: Callable[[], object]) -> Callable[[], float]:
    """A contender from a blocking call: calling it runs ``run`` once and returns its wall seconds."""
    def measure() -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    return measure


def alternate(contenders: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Samples of every contender, taken in rounds: each round calls every contender once, in order.

    Args:
      contenders: name -> a call that measures once and returns seconds (per unit of work, or of a
        fixed amount of work: the caller divides).
      repeats: rounds (>= 1).

    Returns:
      name -> its ``repeats`` samples, in call order. With contenders A, B the calls are A B A B ….
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, measure in contenders.items():
            samples[name].append(float(measure()))
    return samples


@dataclasses.dataclass(frozen=True)
class Spread:
    """The minimum and the median of a contender's samples of seconds."""

    min: float
    median: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Spread:
        if not seconds:
            raise ValueError("no samples")
        return cls(min(seconds), statistics.median(seconds))

    def rates(self, work: float) -> tuple[float, float]:
        """(best, median) rate of ``work`` units per sample: work / min, work / median."""
        return work / self.min, work / self.median


def fastest(spreads: Mapping[Any, Spread]) -> Any:
    """The key of the spread with the smallest median (ties: the smaller minimum, then the first)."""
    if not spreads:
        raise ValueError("no spreads")
    return min(spreads, key=lambda k: (spreads[k].median, spreads[k].min))


def wall_times(run: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``run`` (it must block until its work is done)."""
    return alternate({"run": timed(run)}, repeats)["run"]


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """Minimum wall time of ``repeats`` calls of ``run`` (for a peak: load only ever slows a call)."""
    return min(wall_times(run, repeats))


# ------------------------------------------------------------------------------------------ load


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform has one, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """``--allow-busy``: run even at a load average above the core count, the table then marked busy."""
    parser.add_argument("--allow-busy", action="store_true",
                        help="run even when the load average exceeds the core count (the table says busy)")


def check_load(allow_busy: bool, cores: int | None = None, load: float | None = None) -> float:
    """The 1-minute load average now; exits when it exceeds ``cores`` (default: this machine's) unless
    ``allow_busy``: above it, other processes take CPU time from every contender and the ratios mean
    little."""
    cores = cores or available_cores()
    load = os.getloadavg()[0] if load is None else load
    if load > cores and not allow_busy:
        raise SystemExit(f"load average {load:.1f} exceeds the {cores} cores: the timings would measure other "
                         "processes; run on a quiet machine, or pass --allow-busy to run anyway (the table "
                         "is then marked busy)")
    return load


def is_busy(load_before: float, load_after: float, cores: int | None = None) -> bool:
    """Whether the load average exceeded the core count before or after the run."""
    return max(load_before, load_after) > (cores or available_cores())


def load_note(load_before: float, load_after: float | None = None, cores: int | None = None) -> str:
    """"load average B before / A after on C cores", followed by a **busy** flag when either exceeds C."""
    cores = cores or available_cores()
    after = os.getloadavg()[0] if load_after is None else load_after
    note = f"load average {load_before:.1f} before / {after:.1f} after on {cores} cores"
    if is_busy(load_before, after, cores):
        note += " — **busy**: other processes held the cores, so these timings are not a quiet machine's"
    return note


def machine_note(load_before: float, versions: str) -> str:
    """The table note on the machine: processor, CPUs, :func:`load_note`, and ``versions`` (e.g.
    "jax 0.12.0, mujoco 3.3.0")."""
    return (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"{load_note(load_before)}; {versions}.")


# ------------------------------------------------------------------------------------------ tables


def fmt_rate(x: float | None) -> str:
    """A rate as a table cell: thousands separators, no decimals; "n/a" for None."""
    return "n/a" if x is None else f"{x:,.0f}"


def fmt_spread(work: float, spread: Spread | None, digits: int = 0) -> str:
    """The rate cell "best / median" of ``work`` units per sample; "n/a" for None."""
    if spread is None:
        return "n/a"
    best, median = spread.rates(work)
    return f"{best:,.{digits}f} / {median:,.{digits}f}"


def fmt_ratio(ours: tuple[float, Spread] | None, theirs: tuple[float, Spread] | None) -> str:
    """The ratio cell "best / median" of two (work, spread) rates: ours over theirs; "n/a" if either
    is missing."""
    if ours is None or theirs is None:
        return "n/a"
    (a_best, a_median), (b_best, b_median) = ours[1].rates(ours[0]), theirs[1].rates(theirs[0])
    return f"{a_best / b_best:.2f} / {a_median / b_median:.2f}"


def write_results(out: Path, name: str, table: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Prints ``table`` and writes ``out/<name>.md`` (the table) and ``out/<name>.json`` ({meta, rows})."""
    print()
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table + "\n", encoding="utf-8")
    (out / f"{name}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2, default=str),
                                      encoding="utf-8")
    print(f"\nwritten to {out}/{name}.{{md,json}}")


# ------------------------------------------------------------------------------------------ workers


def add_reference_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ref-python`` (default ``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref/bin/python``), ``--torch-threads``
    (the settings tried, default :data:`ALTERNATIVE_THREADS`) and the hidden ``--torch-worker`` with
    which :class:`Worker` re-launches a script in that interpreter."""
    default_ref = os.environ.get("IMAGINEJAX_REF_PYTHON") or str(REPO_ROOT / ".venv-ref" / "bin" / "python")
    parser.add_argument("--ref-python", type=Path, default=Path(default_ref))
    parser.add_argument("--torch-threads", type=int, nargs="+", default=list(ALTERNATIVE_THREADS),
                        help="PyTorch thread settings tried (OMP_WAIT_POLICY=PASSIVE); the faster is reported")
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)


def thread_env(threads: int) -> dict[str, str]:
    """This process's environment with OpenMP / MKL limited to ``threads`` passive (sleeping) workers."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                OMP_WAIT_POLICY="PASSIVE")


class Worker:
    """A long-lived subprocess that answers each JSON-line request with one JSON line (see :func:`serve`)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, quiet: bool = False):
        self.argv = list(argv)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL if quiet else None, text=True,
                                     env=None if env is None else dict(env))

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Sends one request and returns the answer; RuntimeError if the worker died or failed."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            raise RuntimeError(f"the worker exited (code {self.proc.poll()}); run `{' '.join(self.argv)}` by "
                               "hand to see why")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise RuntimeError(answer.get("error", "unknown worker error"))
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


def torch_workers(ref_python: Path, script: str, threads: Sequence[int]) -> dict[int, Worker]:
    """One ``script --torch-worker`` process in ``ref_python`` per thread setting ({} when that
    interpreter does not exist: a message says the PyTorch side is skipped)."""
    if not ref_python.exists():
        print(f"no reference interpreter at {ref_python}: PyTorch side skipped", flush=True)
        return {}
    return {t: Worker([str(ref_python), script, "--torch-worker"], thread_env(t)) for t in threads}


def protocol_stdout() -> IO[str]:
    """The worker side's answer channel: the real stdout, duplicated; afterwards anything printed to
    stdout (library logging, progress bars) goes to stderr and cannot corrupt an answer. Call it before
    importing chatty libraries."""
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def serve(handle: Callable[[dict[str, Any]], dict[str, Any]], channel: IO[str] | None = None) -> None:
    """The worker side's loop: answers every JSON-line request on stdin with ``{"ok": True, **handle(req)}``
    (or ``{"ok": False, "error"}`` if it raised) on ``channel``, until ``{"op": "quit"}``."""
    channel = channel or protocol_stdout()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            if request.get("op") == "quit":
                break
            answer = {"ok": True, **handle(request)}
        except Exception as exc:  # the launcher reports it and goes on with the other cases
            traceback.print_exc(file=sys.stderr)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        channel.write(json.dumps(answer) + "\n")
        channel.flush()

