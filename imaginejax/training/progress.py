"""Progress over training intervals with throughput, and optional metric sinks (TensorBoard, W&B).

:class:`IntervalProgress` monitors :meth:`imaginejax.training.loop.Trainer.train` /
:func:`imaginejax.training.sweep.run_sweep`: it receives each finished interval as a structured
:class:`~imaginejax.training.loop.IntervalEvent` (their ``on_interval=`` argument) and other lines as text (``log=``),
and shows

    <label>: 70%|███████   | 28/40 [00:42<00:18, 0.67 run-interval/s, 1,234 updates/s, 56,789 env steps/s]

where *updates/s* counts gradient updates of all runs of the last interval and *env steps/s* its
evaluation steps (``Σ_levels eval_episodes × max_steps`` per run; training is offline and steps no
environment). The first trained interval of each chunk includes compilation: :meth:`IntervalProgress.compiling`
says so before it starts, and rates and the ETA are measured on the later intervals only
(ETA = mean seconds per run-interval over them × run-intervals left). Modes: ``bar`` is a tqdm bar; ``lines`` prints one line per interval
(for logs: no carriage returns); ``off`` prints nothing; ``auto`` is ``bar`` on a terminal, else ``lines``.
Other engine lines (resume, non-finite runs) are printed as they come, and every line is also appended
to ``log_file`` when one is given (never through a link: :func:`imaginejax.core.files.append_text`).

:class:`MetricSinks` mirrors a run directory's ``metrics.jsonl`` (:mod:`imaginejax.core.runlog`) into
TensorBoard event files (``tensorboardX``; one TensorBoard run per sweep run, named
``<algo>/seed<s>/ratio<r>[/<data>][/<hp>]`` from ``sweep.json``) and/or Weights & Biases (``wandb``, offline unless asked
otherwise). Both are optional dependencies, imported only when enabled; a missing package raises
:class:`MissingDependency` naming the ``pip install``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, TextIO

from tqdm import tqdm

from imaginejax.core.files import RETRAIN, append_text, fields_of, read_json

ProgressMode = Literal["auto", "bar", "lines", "off"]



def count(n: int, noun: str) -> str:
    """``n`` and ``noun`` in the number it takes: ``count(1, "seed")`` -> "1 seed", ``count(2, ...)`` -> "2 seeds"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def format_seconds(seconds: float) -> str:
    """``h:mm:ss`` (or ``m:ss`` under an hour)."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class IntervalProgress:
    """Displays progress over intervals (see the module docstring) from the engine's events.

    Use it as both sinks of :meth:`imaginejax.training.loop.Trainer.train` / :func:`imaginejax.training.sweep.run_sweep`:
    ``log=progress`` (free-form lines: sweep plan, resume, non-finite runs) and
    ``on_interval=progress.interval`` (one :class:`~imaginejax.training.loop.IntervalEvent` per interval per chunk).

    Args:
      label: shown in front of the bar (e.g. the algorithm name).
      num_runs: R, runs in the sweep.
      num_intervals: N, intervals per run.
      updates_per_interval: gradient updates per run per interval.
      eval_steps_per_run: environment steps of one evaluation of one run (all levels).
      mode: see :data:`ProgressMode`.
      stream: where the display goes (default stderr).
      log_file: every line and every interval's message is appended here (None: nowhere).
      on_interval: called after each trained interval (e.g. :meth:`MetricSinks.sync`).
    """

    def __init__(self, label: str, num_runs: int, num_intervals: int, updates_per_interval: int,
                 eval_steps_per_run: int, mode: ProgressMode = "auto", stream: TextIO | None = None,
                 log_file: str | os.PathLike[str] | None = None,
                 on_interval: Callable[[], None] | None = None):
        self.stream = sys.stderr if stream is None else stream
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "lines"
        self.mode = mode
        self.label = label
        self.num_runs, self.num_intervals = num_runs, num_intervals
        self.updates_per_interval, self.eval_steps_per_run = updates_per_interval, eval_steps_per_run
        self.total = num_runs * num_intervals  # run-intervals
        self.chunks: dict[int, int] = {}  # chunk -> run-intervals done (incl. restored ones)
        self.log_file = None if log_file is None else Path(log_file)
        self.on_interval = on_interval
        self.start = time.perf_counter()
        self.compiled: set[int] = set()  # chunks whose first trained interval (with compilation) is done
        self.timed_runs, self.timed_seconds = 0, 0.0  # run-intervals and wall clock after compilation
        self.bar = None
        if mode == "bar":
            self.bar = tqdm(total=self.total, desc=label, unit="run-interval", file=self.stream,
                            dynamic_ncols=True, smoothing=0, mininterval=0)

    @property
    def done(self) -> int:
        """Run-intervals done over all chunks, restored ones included."""
        return sum(self.chunks.values())

    def _record(self, line: str) -> None:
        if self.log_file is not None:
            append_text(self.log_file, line + "\n")

    def compiling(self) -> None:
        """Says, before the first interval, that it compiles (silent for a minute or more on a CPU)."""
        self(f"{self.label}: compiling the training and evaluation step; the first interval includes it, "
             "rates and ETA follow from the second")

    @property
    def eta(self) -> float | None:
        """Seconds left: measured seconds per run-interval after compilation × run-intervals left (None
        before a compiled interval was measured)."""
        if not self.timed_runs:
            return None
        return self.timed_seconds / self.timed_runs * (self.total - self.done)

    # -- the sinks ----------------------------------------------------------------------------
    def __call__(self, line: str) -> None:
        """Receives one free-form engine line: recorded and shown as it is."""
        self._record(line)
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        elif self.mode == "lines":
            self.stream.write(line + "\n")
            self.stream.flush()

    def interval(self, event: Any) -> None:
        """Receives one :class:`~imaginejax.training.loop.IntervalEvent`."""
        self._record(event.message)
        runs = len(event.runs)
        before = self.done
        self.chunks[event.chunk] = event.interval * runs
        if self.bar is not None:  # restored intervals count as done; the rate restarts below, at compilation
            self.bar.update(self.done - before)
        if event.resumed:
            return
        compiled = event.chunk in self.compiled
        self.compiled.add(event.chunk)
        if compiled:
            self.timed_runs += runs
            self.timed_seconds += event.seconds
        if self.bar is not None:
            seconds = max(event.seconds, 1e-9)
            if not compiled:  # tqdm's rate and ETA restart after the compiling interval
                self.bar.initial, self.bar.start_t = self.bar.n, self.bar._time()
            self.bar.set_postfix_str(f"{runs * self.updates_per_interval / seconds:,.0f} updates/s, "
                                     f"{runs * self.eval_steps_per_run / seconds:,.0f} env steps/s"
                                     + ("" if compiled else " (incl. compilation)"))
        elif self.mode == "lines":
            self.stream.write(self.status(event.interval, runs, event.seconds, time.perf_counter() - self.start,
                                          compiled) + "\n")
            self.stream.flush()
        if self.on_interval is not None:
            self.on_interval()

    # -- display ------------------------------------------------------------------------------
    def status(self, interval: int, runs: int, seconds: float, elapsed: float, compiled: bool = True) -> str:
        """The log line (``lines`` mode) after an interval of ``runs`` runs that took ``seconds`` of wall
        clock, ``elapsed`` seconds in (``compiled`` False: the interval included compilation)."""
        seconds = max(seconds, 1e-9)
        updates = runs * self.updates_per_interval / seconds
        env_steps = runs * self.eval_steps_per_run / seconds
        width = 20
        done = self.done
        filled = int(width * done / max(self.total, 1))
        eta = self.eta
        if done == self.total:
            eta_text = "done"
        elif eta is None:
            eta_text = "ETA after the next interval (this one included compilation)"
        else:
            eta_text = f"ETA {format_seconds(eta)}"
        return (f"{self.label} [{'#' * filled}{'-' * (width - filled)}] {done}/{self.total} run-intervals "
                f"(interval {interval}/{self.num_intervals}) · {updates:,.0f} updates/s · "
                f"{env_steps:,.0f} env steps/s{'' if compiled else ' (incl. compilation)'} · "
                f"elapsed {format_seconds(elapsed)} · {eta_text}")

    def close(self) -> None:
        """Closes the bar (bar mode)."""
        if self.bar is not None:
            self.bar.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# Optional metric sinks
# ---------------------------------------------------------------------------------------------------
class MissingDependency(RuntimeError):
    """An optional feature was enabled but its package is not installed."""


def _require(module: str, pip_name: str, setting: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(f"{setting} = true needs the {pip_name!r} package, which is not installed: "
                                f"pip install {pip_name}   (or set {setting}=false)") from None


_BOOKKEEPING = ("chunk", "interval", "step", "run", "seconds", "finite")


def run_names(run_dir: str | os.PathLike[str]) -> dict[int, str]:
    """Run index -> ``<algo>/seed<s>/ratio<r>[/<data>][/<hp>]`` from the sweep's ``sweep.json`` (hp: the
    hyperparameters that vary within the sweep, ``name=value`` joined by commas); ``run<r>`` without it."""
    path = Path(run_dir) / "sweep.json"
    if not path.exists():
        return {}
    record = read_json(path, RETRAIN)
    with fields_of(path, RETRAIN):
        table, algo = record["runs"], record.get("algo", "run")
        varying = sorted({k for row in table for k in row["hp"] if len({str(r["hp"].get(k)) for r in table}) > 1})
        names = {}
        for row in table:
            parts = [algo, f"seed{row['seed']}", f"ratio{row['ratio']:g}"]
            parts += [row["data"]] if row.get("data") else []
            parts += [",".join(f"{k}={row['hp'][k]:g}" for k in varying if k in row["hp"])] if varying else []
            names[int(row["run"])] = "/".join(parts)
    return names


class MetricSinks:
    """Mirrors ``<run_dir>/metrics.jsonl`` into TensorBoard and/or Weights & Biases.

    Each record (one run, one interval) becomes scalars at x = ``step``: in TensorBoard the tag is the
    metric and the TensorBoard run is the sweep run's name (:func:`run_names`, event files under
    ``<run_dir>/tensorboard/<name>``), so the same metric of every run overlays in one chart; in W&B (one
    W&B run per sweep) the key is ``<metric>/<name>``. Records are sent once (keyed by run and interval);
    call :meth:`sync` as often as convenient and :meth:`close` at the end.

    Args:
      run_dir: the sweep's run directory.
      name: the W&B run's name (e.g. the algorithm).
      tensorboard, wandb: which sinks to enable.
      wandb_project, wandb_mode: Weights & Biases project and mode (``offline`` never uses the network).
      config: recorded as the W&B run's config.
    """

    def __init__(self, run_dir: str | os.PathLike[str], name: str, *, tensorboard: bool = False,
                 wandb: bool = False, wandb_project: str = "imaginejax", wandb_mode: str = "offline",
                 config: Mapping[str, Any] | None = None):
        self.run_dir = Path(run_dir)
        self.sent: set[tuple[int, int]] = set()
        self.tb_writers: dict[str, Any] = {}
        self.tbx = None
        self.wandb_run = None
        if tensorboard:
            self.tbx = _require("tensorboardX", "tensorboardX", "logging.tensorboard")
        if wandb:
            wb = _require("wandb", "wandb", "logging.wandb")
            self.wandb_run = wb.init(project=wandb_project, name=name, mode=wandb_mode, dir=str(self.run_dir),
                                     config=dict(config or {}), reinit=True)

    @property
    def enabled(self) -> bool:
        """True when at least one sink is on."""
        return self.tbx is not None or self.wandb_run is not None

    def _tb(self, name: str) -> Any:
        if name not in self.tb_writers:
            self.tb_writers[name] = self.tbx.SummaryWriter(logdir=str(self.run_dir / "tensorboard" / name))
        return self.tb_writers[name]

    def sync(self) -> int:
        """Sends every record of ``metrics.jsonl`` not sent yet; returns how many records were sent."""
        if not self.enabled:
            return 0
        from imaginejax.core.runlog import MetricsLog

        names = run_names(self.run_dir)
        sent = 0
        for record in MetricsLog(self.run_dir).records():
            key = (int(record["run"]), int(record["interval"]))
            if key in self.sent:
                continue
            self.sent.add(key)
            name = names.get(key[0], f"run{key[0]:03d}")
            scalars = {k: float(v) for k, v in record.items()
                       if k not in _BOOKKEEPING and isinstance(v, (int, float)) and not isinstance(v, bool)}
            step = int(record["step"])
            if self.tbx is not None:
                writer = self._tb(name)
                for tag, value in scalars.items():
                    writer.add_scalar(tag, value, step)
            if self.wandb_run is not None:
                self.wandb_run.log({f"{k}/{name}": v for k, v in scalars.items()} | {"step": step})
            sent += 1
        for writer in self.tb_writers.values():
            writer.flush()
        return sent

    def close(self) -> None:
        """Final :meth:`sync`, then closes the writers."""
        self.sync()
        for writer in self.tb_writers.values():
            writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
