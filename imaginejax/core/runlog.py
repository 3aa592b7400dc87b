"""Message sinks (one line of text each), and per-interval metrics of a sweep as JSONL and CSV under a run directory.

One record per (interval, run): ``chunk``, ``interval`` (1-based), ``step`` (updates done), ``run``
(index into the sweep table), ``seconds`` (the interval's wall clock, shared by the runs of a chunk),
``finite`` (False once the run was frozen), then every training metric and ``success/<level>``,
``return/<level>``. ``metrics.jsonl`` is appended and flushed after each interval; ``metrics.csv`` is
rewritten from it (atomically) so both always agree. On resume, records after the restored interval
are dropped first, so an interrupted-and-resumed sweep logs exactly what an uninterrupted one does
(apart from ``seconds``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from imaginejax.core.files import append_text, atomic_path, write_text

Log = Callable[[str], None]  # a message sink: one line of text


def log_stderr(message: str) -> None:
    """The default message sink: one line on stderr."""
    print(message, file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    """The message sink of every process but the writer."""


class MetricsLog:
    """Appends interval records to ``<run_dir>/metrics.jsonl`` and mirrors them in ``metrics.csv``."""

    def __init__(self, run_dir: str | os.PathLike[str]):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.csv = self.run_dir / "metrics.csv"

    def records(self) -> list[dict[str, Any]]:
        """Every record written so far (a torn last line from a crash is skipped)."""
        if not self.jsonl.exists():
            return []
        out = []
        for line in self.jsonl.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def truncate(self, chunk: int, interval: int) -> None:
        """Keeps records of earlier chunks and of ``chunk`` up to ``interval``; drops the rest."""
        kept = [r for r in self.records() if r["chunk"] < chunk or (r["chunk"] == chunk and r["interval"] <= interval)]
        self._rewrite(kept)

    def write_interval(self, chunk: int, interval: int, step: int, seconds: float, runs: np.ndarray,
                       finite: np.ndarray, metrics: Mapping[str, np.ndarray],
                       success: Mapping[str, np.ndarray], returns: Mapping[str, np.ndarray]) -> None:
        """Appends one interval of one chunk.

        Args:
          runs: (n,) sweep run indices of the chunk's (unpadded) runs.
          finite: (n,) bool; metrics / success / returns: name -> (n,) values.
        """
        lines = []
        for j, run in enumerate(np.asarray(runs).tolist()):
            record: dict[str, Any] = {"chunk": chunk, "interval": interval, "step": step, "run": run,
                                      "seconds": round(float(seconds), 6), "finite": bool(finite[j])}
            record.update({k: _number(v[j]) for k, v in metrics.items()})
            record.update({f"success/{k}": _number(v[j]) for k, v in success.items()})
            record.update({f"return/{k}": _number(v[j]) for k, v in returns.items()})
            lines.append(json.dumps(record))
        append_text(self.jsonl, "\n".join(lines) + "\n", fsync=True)
        self._write_csv(self.records())

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in records))
        self._write_csv(records)

    def _write_csv(self, records: list[dict[str, Any]]) -> None:
        columns: list[str] = []
        for r in records:
            columns += [k for k in r if k not in columns]
        with atomic_path(self.csv) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(records)


def _number(value: Any) -> float | int | None:
    """JSON-safe scalar: NaN / inf become None (JSON has no NaN)."""
    value = np.asarray(value).item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
