"""experiments/benchmarks/_common.py: alternating timing, spreads, the load guard, the worker protocol.

Hand-computed cases only; nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
_spec = importlib.util.spec_from_file_location("_common", BENCH_DIR / "_common.py")
common = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("_common", common)
_spec.loader.exec_module(common)


def test_contenders_alternate_round_by_round_and_keep_their_own_samples():
    calls: list[str] = []
    scripted = {"A": iter([3.0, 1.0, 2.0]), "B": iter([10.0, 30.0, 20.0]), "C": iter([5.0, 5.0, 6.0])}

    def contender(name: str):
        def measure() -> float:
            calls.append(name)
            return next(scripted[name])
        return measure

    samples = common.alternate({name: contender(name) for name in "ABC"}, repeats=3)
    assert calls == list("ABCABCABC")
    assert samples == {"A": [3.0, 1.0, 2.0], "B": [10.0, 30.0, 20.0], "C": [5.0, 5.0, 6.0]}

    spreads = {name: common.Spread.of(s) for name, s in samples.items()}
    assert spreads["A"] == common.Spread(min=1.0, median=2.0)
    assert spreads["B"] == common.Spread(min=10.0, median=20.0)
    # 40 units of work per sample: best 40 / 10 = 4, median 40 / 20 = 2 units/s.
    assert spreads["B"].rates(40.0) == (4.0, 2.0)
    assert common.fmt_spread(40.0, spreads["B"]) == "4 / 2"
    # Ours (A) does 6 units per sample: best 6/1 = 6 vs 4 → 1.50; median 6/2 = 3 vs 2 → 1.50.
    assert common.fmt_ratio((6.0, spreads["A"]), (40.0, spreads["B"])) == "1.50 / 1.50"
    assert common.fmt_ratio((6.0, spreads["A"]), None) == "n/a"
    # C's median (5) beats B's (20); A's median (2) beats C's.
    assert common.fastest({"B": spreads["B"], "C": spreads["C"]}) == "C"
    assert common.fastest(spreads) == "A"
    # Equal medians: the smaller minimum wins.
    assert common.fastest({1: common.Spread(3.0, 4.0), 2: common.Spread(2.0, 4.0)}) == 2


def test_timed_and_wall_times_measure_each_call():
    ticks = iter(range(100))
    calls = []
    samples = common.alternate({"x": lambda: float(next(ticks))}, repeats=4)
    assert samples == {"x": [0.0, 1.0, 2.0, 3.0]}
    times = common.wall_times(lambda: calls.append(1), repeats=3)
    assert len(calls) == 3 and len(times) == 3 and all(t >= 0 for t in times)
    with pytest.raises(ValueError, match="repeats"):
        common.alternate({"x": lambda: 1.0}, repeats=0)
    with pytest.raises(ValueError):
        common.Spread.of([])


def test_load_guard_refuses_above_the_core_count_unless_allowed():
    assert common.check_load(False, cores=2, load=1.9) == 1.9
    assert common.check_load(False, cores=2, load=2.0) == 2.0  # at the core count: every core has work
    with pytest.raises(SystemExit, match="--allow-busy"):
        common.check_load(False, cores=2, load=2.5)
    assert common.check_load(True, cores=2, load=7.0) == 7.0
    assert not common.is_busy(1.0, 2.0, cores=2)
    assert common.is_busy(1.0, 2.1, cores=2) and common.is_busy(3.0, 0.5, cores=2)
    assert 1 <= common.available_cores() <= (os.cpu_count() or 1)
    assert common.load_note(0.5, 1.5, cores=2) == "load average 0.5 before / 1.5 after on 2 cores"
    assert "**busy**" in common.load_note(0.5, 4.0, cores=2)


def test_thread_env_sets_passive_openmp_workers():
    env = common.thread_env(2)
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OMP_WAIT_POLICY"]) == ("2", "2", "PASSIVE")


def test_worker_protocol_round_trip(tmp_path):
    script = tmp_path / "echo_worker.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(BENCH_DIR)!r})\n"
        "from _common import serve\n"
        "def handle(req):\n"
        "    if req['op'] == 'boom':\n"
        "        raise ValueError('asked to fail')\n"
        "    print('noise on stdout goes to stderr')\n"
        "    return {'double': 2 * req['x']}\n"
        "serve(handle)\n")
    worker = common.Worker([sys.executable, str(script)])
    try:
        assert worker.ask({"op": "go", "x": 21}) == {"ok": True, "double": 42}
        with pytest.raises(RuntimeError, match="asked to fail"):
            worker.ask({"op": "boom"})
        assert worker.ask({"op": "go", "x": 1})["double"] == 2  # a failure does not end the worker
    finally:
        worker.close()
    assert worker.proc.returncode == 0
