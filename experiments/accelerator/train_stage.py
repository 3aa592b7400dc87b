"""Training throughput on the accelerator: every algorithm at R runs in one call, against d3rlpy on the same GPU.

The JAX side is ``experiments/benchmarks/algo_updates.py``'s (the engine's inner loop: ``sample_mixed`` a
batch, ``algo.update``, interval means; R runs vmapped in one jitted ``lax.scan`` of N updates, state
donated), at the reference's shapes and batch sizes. Programs are compiled in a thread pool (XLA
compiles on the host's cores while the GPU idles), then timed one after another, the R values of a pair
alternating. A run count whose state would not fit in half the device's memory is skipped and says so.

d3rlpy (PyTorch on the same GPU, ``IMAGINEJAX_D3RLPY_DEVICE``): one process per seed, what a user runs, timed
alternately with the JAX R = 1 call; then ``procs`` processes at once, one seed each (how a GPU is shared
between runs without vmapping), whose summed updates/s is set against JAX at R = ``procs``.
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import algo_updates as au  # noqa: E402

from _common import Spread, Worker, alternate  # noqa: E402
from budget import Budget  # noqa: E402


def state_bytes(name: str, shapes: au.ShapeSet, setting: au.Setting, data: Any) -> int:
    """Bytes of one run's algorithm state (parameters, targets, optimiser), from shapes only."""
    from imaginejax.algos.common import DataStats
    from imaginejax.training.kernel import broadcast_runs

    algo = au.algos.make(name, shapes.spec, setting.net)
    stats = jax.eval_shape(DataStats.from_transitions, data)
    hp = broadcast_runs(algo.default_hp(shapes.spec), 1)
    state = jax.eval_shape(jax.vmap(lambda k, h: algo.init(k, shapes.spec, stats, h)),
                           jax.random.split(jax.random.PRNGKey(0), 1), hp)
    return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state)))


def device_memory() -> int | None:
    """Bytes the first device's allocator may use (None where the backend does not say, e.g. CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def pairs(names: list[str]) -> list[tuple[str, au.ShapeSet]]:
    """(algorithm, action space) pairs with a registered variant, continuous first."""
    return [(name, shapes) for shapes in au.SHAPES for name in names if name in au.algos.registered(shapes.discrete)]


def run(sizes: Any, budget: Budget, peak: float, log: Callable[[str], None]) -> dict[str, Any]:
    """All rows of the stage: one per (algorithm, action space, R), plus the d3rlpy comparisons."""
    names = list(sizes.algos or au.algos.registered())
    data = {shapes.name: au.random_transitions(jax.random.PRNGKey(0), shapes, sizes.dataset_size)
            for shapes in au.SHAPES}
    memory = device_memory()
    jobs, skipped = [], []
    per_run_bytes: dict[tuple[str, str], int] = {}
    for name, shapes in pairs(names):
        setting = au.SETTINGS.get((name, shapes.discrete), au.DEFAULT_SETTING)
        try:
            per_run = per_run_bytes[(name, shapes.name)] = state_bytes(name, shapes, setting, data[shapes.name])
        except Exception as error:  # noqa: BLE001 - an unsupported pair is reported, the others go on
            skipped.append({"algorithm": name, "action_space": shapes.name, "reason": f"{type(error).__name__}: {error}"})
            continue
        for runs in sizes.runs:
            if memory is not None and 4 * runs * per_run > memory // 2:
                skipped.append({"algorithm": name, "action_space": shapes.name, "runs": runs,
                                "reason": f"state {runs * per_run / 2**30:.1f} GiB at R={runs} (×4 for the "
                                          f"update's temporaries) exceeds half of {memory / 2**30:.0f} GiB"})
                continue
            jobs.append((name, shapes, setting, runs))

    log(f"train: compiling {len(jobs)} programs on {sizes.compile_threads} threads")
    built: dict[tuple[str, str, int], au.JaxBench] = {}
    failures: list[dict[str, Any]] = []
    lock = threading.Lock()

    def build(job: tuple) -> None:
        name, shapes, setting, runs = job
        if budget.expired(reserve=sizes.train_timing_reserve):
            with lock:
                skipped.append({"algorithm": name, "action_space": shapes.name, "runs": runs, "reason": "budget"})
            return
        try:
            bench = au.build_jax(name, shapes, setting, runs, sizes.updates, data[shapes.name])
        except Exception as error:  # noqa: BLE001 - e.g. out of memory at large R: recorded, others go on
            with lock:
                failures.append({"algorithm": name, "action_space": shapes.name, "runs": runs,
                                 "error": f"{type(error).__name__}: {str(error)[:400]}"})
            return
        with lock:
            built[(name, shapes.name, runs)] = bench

    start = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(sizes.compile_threads)
    futures = [pool.submit(build, job) for job in sorted(jobs, key=lambda job: job[3])]
    concurrent.futures.wait(futures, timeout=max(1.0, budget.left() - sizes.train_timing_reserve))
    pool.shutdown(wait=False, cancel_futures=True)  # a compilation past the budget is left behind
    compile_wall = time.perf_counter() - start
    with lock:
        built = dict(built)
    log(f"train: {len(built)} programs compiled in {compile_wall:.0f} s wall")

    rows = []
    for name, shapes in pairs(names):
        mine = {runs: built[(name, shapes.name, runs)] for runs in sizes.runs if (name, shapes.name, runs) in built}
        if not mine:
            continue
        if budget.expired(reserve=1.0):
            skipped.append({"algorithm": name, "action_space": shapes.name, "reason": "budget (timing)"})
            continue
        setting = au.SETTINGS.get((name, shapes.discrete), au.DEFAULT_SETTING)
        algo = au.algos.make(name, shapes.spec, setting.net)
        flops = au.update_flops(algo, shapes, setting.batch_size, data[shapes.name])
        for bench in mine.values():
            bench.time_call()  # a second untimed call: on a GPU the first timed call was still slow
        times = alternate({str(runs): bench.time_call for runs, bench in mine.items()}, sizes.repeats)
        for runs, bench in mine.items():
            ups_best, ups_median = Spread.of(times[str(runs)]).rates(runs * sizes.updates)
            rows.append({"algorithm": name, "action_space": shapes.name, "runs": runs,
                         "batch_size": setting.batch_size, "updates_per_call": sizes.updates,
                         "seed_updates_per_s": ups_median, "seed_updates_per_s_best": ups_best,
                         "seconds": times[str(runs)], "compile_seconds": bench.compile_seconds,
                         "matmul_flops_per_update": flops["matmul"],
                         "percent_of_peak": 100.0 * flops["matmul"] * ups_median / peak,
                         "state_mib_per_run": per_run_bytes[(name, shapes.name)] / 2**20})
            log(f"  {name} {shapes.name} R={runs}: {ups_median:,.0f} seed-updates/s "
                f"({rows[-1]['percent_of_peak']:.1f} % of peak), compile {bench.compile_seconds:.1f} s")
    keep = {key: bench for key, bench in built.items() if key[2] in (1, sizes.d3rlpy_procs)}
    built.clear()

    d3rlpy = measure_d3rlpy(names, sizes, budget, keep, log) if sizes.d3rlpy else \
        {"note": "d3rlpy not run (--no-d3rlpy)"}
    return {"rows": rows, "skipped": skipped, "failures": failures, "compile_wall_seconds": compile_wall,
            "d3rlpy": d3rlpy}


def measure_d3rlpy(names: list[str], sizes: Any, budget: Budget, benches: dict[tuple[str, str, int], au.JaxBench],
                   log: Callable[[str], None]) -> dict[str, Any]:
    """d3rlpy one process per seed, alternated with JAX's R = 1 call; then ``sizes.d3rlpy_procs`` processes
    at once, alternated with JAX's call of R = that many runs."""
    env = dict(os.environ, IMAGINEJAX_D3RLPY_DEVICE=sizes.d3rlpy_device)
    out: dict[str, Any] = {"device": sizes.d3rlpy_device, "rows": []}
    workers = [Worker([sys.executable, str(au.WORKER)], env, quiet=True) for _ in range(sizes.d3rlpy_procs)]
    try:
        out["info"] = workers[0].ask({"op": "hello"})
    except (RuntimeError, ValueError) as error:  # d3rlpy missing or broken: the JAX rows stand alone
        for worker in workers:
            worker.close()
        return {"note": f"d3rlpy workers did not start: {error}"}

    def all_at_once(request: dict[str, Any]) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = [{} for _ in workers]

        def ask(i: int) -> None:
            answers[i] = workers[i].ask(request)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(workers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if any(not answer for answer in answers):
            raise RuntimeError("a d3rlpy worker did not answer")
        return answers

    try:
        for name, shapes in pairs(names):
            setting = au.SETTINGS.get((name, shapes.discrete), au.DEFAULT_SETTING)
            one_run, many_runs = (benches.get((name, shapes.name, r)) for r in (1, len(workers)))
            if setting.d3rlpy is None or one_run is None:
                continue
            if budget.expired(reserve=5.0):
                out["rows"].append({"algorithm": name, "action_space": shapes.name, "note": "skipped: budget"})
                continue
            request = au.d3rlpy_request(name, shapes, setting, 1, sizes.d3rlpy_updates, sizes.dataset_size,
                                        sizes.d3rlpy_warmup, sizes.d3rlpy_seconds)
            jax_one, jax_many, d3_one, d3_many = [], [], [], []
            try:
                all_at_once(dict(request, updates=1, max_seconds=None))  # every worker builds (untimed)
                for _ in range(sizes.d3rlpy_repeats):  # A B A B: JAX and d3rlpy under the same conditions
                    jax_one.append(sizes.updates / one_run.time_call())
                    answer = workers[0].ask(request)
                    d3_one.append(answer["updates"] / answer["seconds"])
                    if many_runs is not None:
                        jax_many.append(len(workers) * sizes.updates / many_runs.time_call())
                    answers = all_at_once(request)
                    d3_many.append(sum(a["updates"] for a in answers) / max(a["seconds"] for a in answers))
            except RuntimeError as error:
                out["rows"].append({"algorithm": name, "action_space": shapes.name, "note": f"d3rlpy failed: {error}"})
                continue
            row = {"algorithm": name, "action_space": shapes.name, "d3rlpy_class": setting.d3rlpy,
                   "processes": len(workers),
                   "jax_r1": statistics.median(jax_one), "d3rlpy_one_process": statistics.median(d3_one),
                   "jax_r_procs": statistics.median(jax_many) if jax_many else None,
                   "d3rlpy_processes_total": statistics.median(d3_many)}
            row["ratio_one"] = row["jax_r1"] / row["d3rlpy_one_process"]
            row["ratio_procs"] = row["jax_r_procs"] / row["d3rlpy_processes_total"] if jax_many else None
            out["rows"].append(row)
            log(f"  d3rlpy {name} {shapes.name}: 1 process {row['d3rlpy_one_process']:,.0f} updates/s "
                f"(JAX R=1 {row['jax_r1']:,.0f}); {len(workers)} processes {row['d3rlpy_processes_total']:,.0f} "
                f"in total (JAX R={len(workers)} {row['jax_r_procs'] or 0:,.0f})")
    finally:
        for worker in workers:
            worker.close()
    return out
