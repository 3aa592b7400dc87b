"""Multi-process runs: every process runs the same program, one of them writes.

A sweep across P processes (hosts of a TPU pod slice, nodes of a GPU cluster, or P processes on one
machine) is one ``jax.distributed`` job: each process builds the same sweep and datasets, the engine's
default mesh spans the devices of all of them (:func:`imaginejax.training.kernel.default_mesh`), and every
process gets the same results back. What this module adds to JAX's runtime:

* :func:`initialize` joins the job from the environment (``JAX_COORDINATOR_ADDRESS``,
  ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``; or ``IMAGINEJAX_DISTRIBUTED=1`` for JAX's own SLURM /
  Cloud TPU / MPI detection) with a heartbeat timeout: a process that dies (killed, crashed, its host
  lost) makes every other one stop after ``IMAGINEJAX_HEARTBEAT_SECONDS`` (JAX's coordination service
  terminates them, naming the task that stopped answering) instead of waiting forever in a collective.
  Heartbeats come from a runtime thread, so a process that is alive but stuck is not detected.
* :func:`agree` is the first exchange of a command: every process sends its settings (configuration,
  paths) or the error that stopped it before, and every process refuses, naming each key that differs and
  its value on every process, or the process that failed and its message — before any check that could
  fail on one process only (a workspace made with other settings, a dataset not on shared storage).
* :func:`check_same` compares digests of named inputs across processes before anything is compiled; a
  mismatch raises :class:`DistributedError` on every process, naming the inputs and processes that differ.
* :func:`is_writer` (process 0) decides who writes logs, metrics, results and figures;
  :func:`writer_first` runs a step that fills a cache on the writer first, then on the others (who then
  read it); an error on any process is raised on every process (:func:`raise_together`).
* :func:`gather` brings arrays laid across processes back as the same host arrays on every process.

Files are written by the writer only, so the workspace must be on storage every process sees (NFS,
Lustre, a Filestore mount); checkpoints go through orbax, whose multi-host save has every process take
part and the primary host (process 0) write and finalize.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Mapping, TypeVar

import jax
import numpy as np

PyTree = Any
T = TypeVar("T")
HEARTBEAT_SECONDS = 100  # JAX's default: how long a silent process is waited for before the job stops
_MESSAGE_BYTES = 4096  # a broadcast error message is cut to this length
_agreed = False  # whether this process has taken part in agree()


class DistributedError(ValueError):
    """The processes of a job disagree (inputs, or a step that failed on the writer); raised on every process."""


def initialize(*, heartbeat_seconds: int | None = None, initialization_seconds: int = 300) -> bool:
    """Joins a multi-process job when the environment describes one; call before any other JAX work.

    A job is described by ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0) with
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, or by ``IMAGINEJAX_DISTRIBUTED=1``, which lets JAX
    detect SLURM, Cloud TPU or MPI itself. CPU collectives go through gloo (a no-op for GPU/TPU).

    Args:
      heartbeat_seconds: a process silent this long stops the job (None: ``IMAGINEJAX_HEARTBEAT_SECONDS``,
        else :data:`HEARTBEAT_SECONDS`).
      initialization_seconds: how long to wait for every process to join.

    Returns:
      True if a job was joined (also when it already was), False for a single-process run.
    """
    env = os.environ
    if not env.get("JAX_COORDINATOR_ADDRESS") and env.get("IMAGINEJAX_DISTRIBUTED") != "1":
        return False
    if jax.distributed.is_initialized():
        return True
    if heartbeat_seconds is None:
        heartbeat_seconds = int(env.get("IMAGINEJAX_HEARTBEAT_SECONDS", HEARTBEAT_SECONDS))
    count, index = env.get("JAX_NUM_PROCESSES"), env.get("JAX_PROCESS_ID")
    if env.get("JAX_COORDINATOR_ADDRESS") and (count is None or index is None):
        raise DistributedError("JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES or JAX_PROCESS_ID is not: set "
                               "all three on every process (or unset it and set IMAGINEJAX_DISTRIBUTED=1 under "
                               "SLURM / Cloud TPU / MPI)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(num_processes=None if count is None else int(count),
                               process_id=None if index is None else int(index),
                               initialization_timeout=initialization_seconds,
                               heartbeat_timeout_seconds=heartbeat_seconds)
    return True


def is_writer() -> bool:
    """True on the process that writes files (process 0; the only one of a single-process run)."""
    return jax.process_index() == 0


def digest(tree: PyTree) -> str:
    """SHA-256 (hex) of a pytree's structure, shapes, dtypes and bytes (host copies of its leaves)."""
    h = hashlib.sha256(repr(jax.tree.structure(tree)).encode())
    for leaf in jax.tree.leaves(tree):
        leaf = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{leaf.dtype}{leaf.shape}".encode())
        h.update(leaf.tobytes())
    return h.hexdigest()


def mismatches(names: tuple[str, ...], digests: np.ndarray) -> list[str]:
    """What differs between processes: ``digests`` (P, K, 32) uint8, process p's digest of input k.

    Returns:
      One line per input whose digest is not the same on every process, naming the processes that
      disagree with process 0 (empty: all agree).
    """
    out = []
    for k, name in enumerate(names):
        differ = [p for p in range(digests.shape[0]) if not np.array_equal(digests[p, k], digests[0, k])]
        if differ:
            which = (f"processes {', '.join(map(str, differ))} differ" if len(differ) > 1
                     else f"process {differ[0]} differs")
            out.append(f"{name} ({which} from process 0)")
    return out


def check_same(parts: Mapping[str, str]) -> None:
    """Checks that every process holds the same inputs, given as name -> digest (e.g. :func:`digest`).

    Every process must call it with the same names in the same order; a no-op in a single process.

    Raises:
      DistributedError: on every process, when some digest differs; names the inputs and processes.
    """
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    names = tuple(parts)
    mine = np.stack([np.frombuffer(hashlib.sha256(f"{n}={parts[n]}".encode()).digest(), np.uint8) for n in names])
    width = np.asarray(multihost_utils.process_allgather(np.asarray([len(names)], np.int32)))
    if len(set(width.ravel().tolist())) > 1:
        raise DistributedError(f"the processes check different numbers of inputs ({width.ravel().tolist()} by "
                               "process): every process must run the same program with the same configuration")
    differ = mismatches(names, np.asarray(multihost_utils.process_allgather(mine)))
    if differ:
        raise DistributedError("the processes of this job do not hold the same inputs: " + "; ".join(differ)
                               + ". Every process must run the same command with the same configuration and "
                               "datasets (a shared filesystem, or identical copies)")


def smallest(value: int) -> int:
    """The smallest of every process's ``value`` (e.g. a memory budget every process must plan with)."""
    if jax.process_count() == 1:
        return int(value)
    from jax.experimental import multihost_utils

    # As bytes: without jax_enable_x64 an int64 would travel as int32.
    raw = np.frombuffer(np.asarray([value], np.int64).tobytes(), np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(raw))
    return int(np.ascontiguousarray(gathered).view(np.int64).min())


def broadcast_text(text: str) -> str:
    """Process 0's ``text`` on every process (cut to 4096 UTF-8 bytes)."""
    if jax.process_count() == 1:
        return text
    from jax.experimental import multihost_utils

    buffer = np.zeros(_MESSAGE_BYTES, np.uint8)
    raw = text.encode()[:_MESSAGE_BYTES]
    buffer[:len(raw)] = np.frombuffer(raw, np.uint8)
    out = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return bytes(out[out != 0].tolist()).decode(errors="replace")


def gather_text(text: str) -> list[str]:
    """Every process's ``text``, in process order, on every process (every process must call it)."""
    if jax.process_count() == 1:
        return [text]
    from jax.experimental import multihost_utils

    raw = np.frombuffer(text.encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.asarray([raw.size], np.int32))).ravel()
    buffer = np.zeros(max(int(lengths.max()), 1), np.uint8)
    buffer[:raw.size] = raw
    gathered = np.asarray(multihost_utils.process_allgather(buffer))
    return [bytes(row[:n].tolist()).decode(errors="replace") for row, n in zip(gathered, lengths.tolist())]


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Nested tables -> {dotted key: value} (lists and other values are leaves)."""
    if isinstance(tree, Mapping) and tree:
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


def agree(settings: Mapping[str, Any], error: BaseException | None = None) -> None:
    """The first exchange of a command across processes: every process sends its ``settings`` (nested
    JSON-ready tables, e.g. the configuration and the paths it was given) or the ``error`` that stopped it
    before; a no-op in a single process.

    Raises:
      DistributedError: on every process, when a process sent an error (naming the process and its
        message) or some setting differs from process 0's (naming each key and its value on every process).
    """
    global _agreed
    if jax.process_count() == 1:
        return
    _agreed = True
    mine = {"error": "" if error is None else f"{type(error).__name__}: {error}", "settings": settings}
    sent = [json.loads(text) for text in gather_text(json.dumps(mine, sort_keys=True, default=str))]
    failed = [f"process {p}: {record['error']}" for p, record in enumerate(sent) if record["error"]]
    if failed:
        raise DistributedError(f"a process of this job stopped before it started: {'; '.join(failed)}")
    flat = [_flat(record["settings"]) for record in sent]
    differ = []
    for key in sorted(set().union(*flat)):
        values = [json.dumps(f.get(key)) for f in flat]
        if len(set(values)) > 1:
            differ.append(f"{key} is " + ", ".join(f"{v} on process {p}" for p, v in enumerate(values)))
    if differ:
        raise DistributedError("the processes of this job were started with different settings: " + "; ".join(differ)
                               + ". Every process must run the same command (the same preset, --config, --set "
                               "values and paths)")


def agreed() -> bool:
    """True once this process has taken part in :func:`agree` (an error before it must still be sent there)."""
    return _agreed


def raise_together(error: BaseException | None) -> None:
    """Gathers every process's ``error`` (None: this process succeeded) and raises on every process: its own
    error if it has one, else :class:`DistributedError` naming the processes that failed and their messages
    (every process must call it; a single process re-raises its own error)."""
    if jax.process_count() == 1:
        if error is not None:
            raise error
        return
    texts = gather_text("" if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [f"process {p} failed: {text}" for p, text in enumerate(texts) if text]
    if failed:
        raise DistributedError("; ".join(failed))


def writer_first(step: Callable[[], T]) -> T:
    """``step()`` on the writer, then on every other process: the writer fills a cache or workspace file,
    the others find and read it. An exception on the writer, or then on any other process, is raised on
    every process (the others as :class:`DistributedError` with its message) instead of leaving them
    waiting for it."""
    if jax.process_count() == 1:
        return step()
    error: BaseException | None = None
    result = None
    if is_writer():
        try:
            result = step()
        except Exception as err:  # every kind: the other processes must learn of it
            error = err
    message = broadcast_text("" if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if message:
        raise DistributedError(f"process 0 failed: {message}")
    if not is_writer():
        try:
            result = step()
        except Exception as err:
            error = err
    raise_together(error)
    return result


def gather(tree: PyTree) -> PyTree:
    """Host NumPy copies of ``tree``'s leaves on every process; arrays laid across processes are
    all-gathered (every process must call it)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    def one(x: Any) -> np.ndarray:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)
