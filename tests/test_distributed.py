"""Sweeps across processes (jax.distributed on 127.0.0.1, gloo CPU collectives, forced host devices).

Every process runs tests/distributed_worker.py; with ``run_block = 1`` the engine's numbers do not
depend on the device count, so P processes × D devices must give bitwise the single-process result,
on every process. Also: inputs that differ between processes are refused on every process before
compiling; a killed process stops the others within the heartbeat timeout; restarting every process
resumes from the checkpoints to the uninterrupted result. The helpers' single-process behaviour and the
mismatch report are checked in this process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from imaginejax.core import distributed

WORKER = Path(__file__).parent / "distributed_worker.py"
HEARTBEAT = 10  # seconds a dead process is waited for


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, devices: int, args: list[str], out: Path,
           extra: dict[int, list[str]] | None = None) -> list[subprocess.Popen]:
    """``processes`` workers (one job when > 1), each with ``devices`` host devices and ``args`` (then
    ``extra[i]`` for process i); logs in out/log-<i>."""
    out.mkdir(parents=True, exist_ok=True)
    port, procs = _port(), []
    for i in range(processes):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "IMAGINEJAX_DISTRIBUTED"))}
        env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
                   IMAGINEJAX_HEARTBEAT_SECONDS=str(HEARTBEAT), PYTHONUNBUFFERED="1")
        if processes > 1:
            env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
                       JAX_PROCESS_ID=str(i))
        log = open(out / f"log-{i}", "w")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args, *(extra or {}).get(i, [])], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))
    return procs


def finish(procs: list[subprocess.Popen], out: Path, timeout: float = 900) -> None:
    """Waits for every worker; fails with their logs' tails when one fails."""
    codes = [p.wait(timeout=timeout) for p in procs]
    if any(codes):
        tails = "\n".join(f"--- process {i} (exit {c}):\n" + (out / f"log-{i}").read_text()[-3000:]
                          for i, c in enumerate(codes))
        pytest.fail(f"workers failed:\n{tails}")


def results(out: Path, processes: int) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(out / f"result-{i}.npz")) for i in range(processes)]


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def metric_lines(run_dir: Path) -> list[str]:
    return (run_dir / "metrics.jsonl").read_text().splitlines()


# ---------------------------------------------------------------------------------------------------
# In this process: the helpers of one process, the mismatch report
# ---------------------------------------------------------------------------------------------------
def test_mismatches_name_the_inputs_and_the_processes_that_differ():
    digests = np.zeros((3, 2, 32), np.uint8)
    assert distributed.mismatches(("real data", "sweep table"), digests) == []
    digests[2, 0, 5] = 1
    digests[1, 1, 0] = digests[2, 1, 0] = 9
    assert distributed.mismatches(("real data", "sweep table"), digests) == [
        "real data (process 2 differs from process 0)", "sweep table (processes 1, 2 differ from process 0)"]


def test_one_process_is_the_writer_and_the_helpers_change_nothing(monkeypatch):
    for name in ("JAX_COORDINATOR_ADDRESS", "IMAGINEJAX_DISTRIBUTED"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.initialize() is False and distributed.is_writer()
    calls = []
    assert distributed.writer_first(lambda: calls.append(1) or "x") == "x" and calls == [1]
    distributed.check_same({"a": "1"})
    assert distributed.smallest(1 << 40) == 1 << 40 and distributed.broadcast_text("é") == "é"
    assert distributed.gather_text("é") == ["é"] and distributed.agree({"train": {"updates": 1}}) is None
    distributed.raise_together(None)
    with pytest.raises(KeyError, match="mine"):
        distributed.raise_together(KeyError("mine"))
    gathered = distributed.gather({"w": np.arange(3)})
    np.testing.assert_array_equal(gathered["w"], [0, 1, 2])
    assert distributed.digest({"a": np.arange(3)}) != distributed.digest({"a": np.arange(3.0)})
    assert distributed.digest({"a": np.arange(3)}) == distributed.digest({"a": np.arange(3)})


def test_a_coordinator_without_process_count_and_id_is_refused(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
    monkeypatch.setenv("JAX_PROCESS_ID", "0")
    with pytest.raises(distributed.DistributedError, match="JAX_NUM_PROCESSES or JAX_PROCESS_ID"):
        distributed.initialize()


# ---------------------------------------------------------------------------------------------------
# Across processes
# ---------------------------------------------------------------------------------------------------
def test_two_processes_train_the_toy_sweep_bitwise_like_one(tmp_path):
    """2 processes × 2 devices and 1 process × 1 device (run concurrently): the same numbers on both
    processes and in the single process; metrics and sweep.json written once, by process 0."""
    one, two = tmp_path / "one", tmp_path / "two"
    procs = launch(1, 1, ["toy", str(one)], one) + launch(2, 2, ["toy", str(two)], two)
    finish(procs[:1], one)
    finish(procs[1:], two)
    (alone,), (first, second) = results(one, 1), results(two, 2)
    assert_same(first, second)
    assert_same(alone, first)
    assert len(metric_lines(two / "bc")) == len(metric_lines(one / "bc")) == 6 * 2  # 6 runs × 2 intervals
    assert "of 2 processes" in (two / "log-0").read_text()


def test_inputs_that_differ_between_processes_are_refused_on_every_process(tmp_path):
    procs = launch(2, 1, ["mismatch", str(tmp_path)], tmp_path)
    codes = [p.wait(timeout=600) for p in procs]
    assert all(codes)
    for i in range(2):
        log = (tmp_path / f"log-{i}").read_text()
        assert "do not hold the same inputs: real data (process 1 differs from process 0). Every" in log, log[-2000:]
    assert not (tmp_path / "bc" / "checkpoints").exists()  # refused before anything was trained


@pytest.mark.parametrize("odd, named", [
    (["--set", "train.updates=40"], "train.updates is 20 on process 0, 40 on process 1"),
    (["--set", "train.updatez=40"], "--set 'train.updatez=40': unknown field train.updatez")])
def test_a_process_started_differently_is_named_by_every_process(tmp_path, odd, named):
    """One process of two started with another --set (a valid one, or one its own parsing refuses), after a
    workspace was made with the first settings: every process exits 2 naming the key, none in a gloo
    traceback (before, only the odd process named it — the workspace check ran first on it alone — and
    process 0 died with 'Connection closed by peer')."""
    from imaginejax.bench.config import load_config
    from imaginejax.bench.workspace import open_workspace

    ws = tmp_path / "ws"
    sets = [f"data.dir={json.dumps(str(tmp_path / 'data'))}", 'train.algos=["bc"]', "train.updates=20", "train.intervals=2"]
    open_workspace(ws, load_config("clevr-quick", sets))  # the workspace process 0's settings resume
    base = ["cli", str(tmp_path), "train", "--out", str(ws)] + [arg for s in sets for arg in ("--set", s)]
    procs = launch(2, 1, base, tmp_path, extra={1: odd})
    codes = [p.wait(timeout=300) for p in procs]
    logs = [(tmp_path / f"log-{i}").read_text() for i in range(2)]
    assert codes == [2, 2], logs
    for log in logs:
        assert named in log and "Traceback" not in log and "Connection closed" not in log, log[-2000:]
    assert "error: the processes of this job" in logs[0] or "error: a process of this job stopped before it " \
        "started: process 1: ConfigError: --set 'train.updatez=40'" in logs[0], logs[0]
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("processes", [2, 4])
def test_clevr_sweeps_across_processes_equal_one_process(tmp_path_factory, processes):
    """BC and discrete CQL on CLEVR, TD3+BC on the continuous reach: bitwise the single-process run."""
    root = tmp_path_factory.getbasetemp() / "distributed-clevr"
    data, one = root / "data", root / "one"
    if not (one / "result-0.npz").exists():
        finish(launch(1, 1, ["clevr", str(one), "2", str(data)], one), one)
    many = tmp_path_factory.mktemp(f"clevr-{processes}")
    finish(launch(processes, 2, ["clevr", str(many), "2", str(data)], many), many)
    reference = results(one, 1)[0]
    for got in results(many, processes):
        assert_same(reference, got)


def _wait_for_interval(run_dir: Path, interval: int, procs: list[subprocess.Popen], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = run_dir / "metrics.jsonl"
        if path.exists() and any(f'"interval": {interval},' in line for line in path.read_text().splitlines()):
            return
        if any(p.poll() is not None for p in procs):
            pytest.fail("a worker ended before the interval to interrupt")
        time.sleep(0.5)
    pytest.fail(f"interval {interval} not reached in {timeout} s")


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_process_stops_the_others_and_a_restart_resumes_to_the_same_result(tmp_path, victim):
    """SIGKILL one of 2 processes after interval 2 of 60: the other stops within the heartbeat timeout
    (plus slack for a loaded machine) with JAX's message naming the cause; the same command on both
    again resumes from the checkpoints and ends with the uninterrupted run's numbers."""
    intervals = "60"
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    reference = launch(1, 1, ["toy", str(whole), intervals], whole)
    procs = launch(2, 2, ["toy", str(cut), intervals], cut)
    _wait_for_interval(cut / "bc", 2, procs)
    procs[victim].kill()
    killed = time.monotonic()
    survivor = procs[1 - victim]
    code = survivor.wait(timeout=HEARTBEAT + 120)
    stopped = time.monotonic() - killed
    log = (cut / f"log-{1 - victim}").read_text()
    assert code != 0 and stopped < HEARTBEAT + 120
    assert "Terminating process because the JAX distributed service detected fatal errors" in log \
        or "heartbeat" in log.lower(), log[-3000:]
    assert not (cut / "result-0.npz").exists()
    finish(launch(2, 2, ["toy", str(cut), intervals], cut), cut)
    finish(reference, whole)
    assert "resumed chunk 0 from" in (cut / "log-0").read_text()
    (alone,), (first, second) = results(whole, 1), results(cut, 2)
    assert_same(first, second)
    assert_same(alone, first)
    lines = metric_lines(cut / "bc")
    assert len(lines) == len(metric_lines(whole / "bc")) == 6 * int(intervals)
