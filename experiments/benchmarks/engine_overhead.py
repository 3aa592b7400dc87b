"""What the engine costs on top of its kernel: the interval of ``imaginejax.training`` against the bare update scan.

    python experiments/benchmarks/engine_overhead.py [--algos bc cql] [--runs 1 8 64] [--updates 200]
                                                     [--eval-episodes 80] [--repeats 5] [--allow-busy]

For each algorithm (discrete, CLEVR-Robot shapes: state 10 ⊕ MiniLM embedding 384, 40 actions; the
reference's batch size and networks, as ``algo_updates.py``) and each run count R, four contenders are
timed in alternation (``_common.alternate``), each doing the same N = ``--updates`` updates per run:

* **bare**: ``algo_updates.scan_updates``, the kernel benchmark: ``sample_mixed`` + ``update`` in a jitted
  ``lax.scan``, runs vmapped, interval-mean metrics, the state donated from call to call.
* **interval**: the engine's compiled interval (``Kernel.interval``) with no evaluation level: the same
  updates plus the engine's own work (per-run imaginary window, NaN isolation, key handling).
* **interval + eval**: the same with an evaluation of ``--eval-episodes`` episodes per run on CLEVR's train
  level (the JAX environment, batched over runs and episodes); the evaluation's cost is the difference.
* **trainer**: ``Trainer.train`` of ``--intervals`` such intervals from fresh runs (the host loop: chunk
  plan, metrics and evaluations brought to the host after every interval, history), per interval,
  the first (compiling) interval excluded.

Reported per (algorithm, R): seconds per interval (best / median), seed-updates/s (R·N / seconds) and the
share of the bare scan's rate, which is the engine's efficiency (goal on a GPU: ≥ 80 % without
evaluation). Compilation is excluded everywhere (one untimed call first). The same script runs on any
JAX backend; on a CPU the load average is checked first (``--allow-busy`` marks the table busy).
Writes ``results/benchmarks/engine_overhead.{md,json}``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (RESULTS, Spread, add_load_arguments, alternate, check_load, load_note,  # noqa: E402
                     timed, write_results)
from algo_updates import SETTINGS, SHAPES, random_transitions, scan_updates  # noqa: E402

from imaginejax import algos, envs  # noqa: E402
from imaginejax.algos.common import DataStats  # noqa: E402
from imaginejax.data.transitions import placeholder_like  # noqa: E402
from imaginejax.data.types import Transitions  # noqa: E402
from imaginejax.lang import encode_instructions  # noqa: E402
from imaginejax.training.kernel import EngineConfig, Kernel, broadcast_runs  # noqa: E402
from imaginejax.training.loop import make_train  # noqa: E402

CONTENDERS = ("bare", "interval", "interval + eval", "trainer")


def contenders(name: str, runs: int, updates: int, eval_episodes: int, intervals: int, data: Transitions,
               level: tuple[Any, Any]) -> dict[str, Callable[[], float]]:
    """name -> a call that runs one interval's work (N updates of R runs) and returns its wall seconds.

    Each contender is compiled and run once before it is returned (untimed); ``trainer`` returns the
    median seconds of its intervals after the first.
    """
    shapes = SHAPES[1]  # discrete CLEVR shapes
    setting = SETTINGS.get((name, True))
    batch = setting.batch_size if setting else 256
    net = setting.net if setting else algos.NetConfig()
    spec = shapes.spec
    algo = algos.make(name, spec, net)
    hp = broadcast_runs(algo.default_hp(spec), runs)
    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    imag = placeholder_like(data)
    ratio = jnp.zeros((runs,), jnp.float32)

    stats = DataStats.from_transitions(data)
    bare_run = jax.jit(scan_updates(algo, batch, updates), donate_argnums=(0,))
    bare = {"carry": (jax.jit(jax.vmap(lambda k, h: algo.init(k, spec, stats, h)))(keys, hp), jnp.copy(keys))}

    def bare_call() -> None:
        bare["carry"], metrics = bare_run(bare["carry"], hp, (data, imag))
        jax.block_until_ready((bare["carry"], metrics))

    def kernel_call(levels: dict[str, tuple[Any, Any]]) -> Callable[[], None]:
        config = EngineConfig(batch_size=batch, updates_per_interval=updates, num_intervals=1,
                              eval_episodes=eval_episodes)
        kernel = Kernel(algo, spec, config, levels)
        box = {"state": kernel.init(keys, hp, data)}

        def call() -> None:
            box["state"], metrics, results = kernel.interval(box["state"], hp, ratio, data, imag)
            jax.block_until_ready((box["state"], metrics, results))

        return call

    config = EngineConfig(batch_size=batch, updates_per_interval=updates, num_intervals=intervals,
                          eval_episodes=eval_episodes)
    trainer = make_train(algo, spec, config, {"train": level})

    def trainer_call() -> float:
        result = trainer.train(keys, hp, data, log=None)
        return float(np.median(result.seconds[1:]))

    calls = {"bare": timed(bare_call), "interval": timed(kernel_call({})),
             "interval + eval": timed(kernel_call({"train": level})), "trainer": trainer_call}
    for call in calls.values():  # compile, untimed
        call()
    return calls


def measure(name: str, runs: int, updates: int, eval_episodes: int, intervals: int, repeats: int,
            data: Transitions, level: tuple[Any, Any]) -> list[dict[str, Any]]:
    """The :data:`CONTENDERS` of (``name``, R = ``runs``), alternated ``repeats`` times: one row each with
    seconds per interval (min, median), seed-updates/s (best, median), share of the bare scan's rate (of
    the bests, of the medians) and the samples."""
    samples = alternate(contenders(name, runs, updates, eval_episodes, intervals, data, level), repeats)
    bare = Spread.of(samples["bare"])
    rows = []
    for contender in CONTENDERS:
        spread = Spread.of(samples[contender])
        best, median = spread.rates(runs * updates)
        rows.append({"algo": name, "runs": runs, "contender": contender, "seconds_min": spread.min,
                     "seconds_median": spread.median, "updates_per_s_best": best, "updates_per_s_median": median,
                     "share_of_bare_best": bare.min / spread.min, "share_of_bare_median": bare.median / spread.median,
                     "samples": samples[contender]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["bc", "cql"])
    parser.add_argument("--runs", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--updates", type=int, default=200, help="updates per run per interval (N)")
    parser.add_argument("--eval-episodes", type=int, default=80, help="evaluation episodes per run")
    parser.add_argument("--intervals", type=int, default=3, help="intervals of the trainer contender")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dataset-size", type=int, default=50_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_load_arguments(parser)
    args = parser.parse_args()
    load_before = check_load(args.allow_busy)

    level = envs.make("clevr", "train", embed=encode_instructions)
    data = random_transitions(jax.random.PRNGKey(1), SHAPES[1], args.dataset_size)
    rows = []
    for name in args.algos:
        for runs in args.runs:
            rows += measure(name, runs, args.updates, args.eval_episodes, args.intervals, args.repeats, data, level)
            for r in rows[-len(CONTENDERS):]:
                print(f"{name} R={runs} {r['contender']:16s} {r['seconds_min'] * 1e3:9.1f} / "
                      f"{r['seconds_median'] * 1e3:9.1f} ms  {r['updates_per_s_best']:12,.0f} / "
                      f"{r['updates_per_s_median']:12,.0f} updates/s  {r['share_of_bare_median']:6.1%} of bare",
                      flush=True)
    device = jax.devices()[0]
    header = ("| algorithm | R | contender | ms per interval (best / median) | seed-updates/s (best / median) "
              "| share of the bare scan (median) |\n|---|---:|---|---:|---:|---:|")
    lines = [f"| {r['algo']} | {r['runs']} | {r['contender']} | {r['seconds_min'] * 1e3:,.1f} / "
             f"{r['seconds_median'] * 1e3:,.1f} | {r['updates_per_s_best']:,.0f} / {r['updates_per_s_median']:,.0f} | "
             f"{r['share_of_bare_median']:.0%} |" for r in rows]
    note = (f"{device.platform} {device.device_kind}, {platform.processor() or platform.machine()}, jax "
            f"{jax.__version__}; N = {args.updates} updates per run per interval, evaluation {args.eval_episodes} "
            f"episodes per run on CLEVR train; {args.repeats} alternating samples; {load_note(load_before)}")
    write_results(args.out, "engine_overhead", "\n".join([header, *lines, "", note]),
                  {"args": {k: str(v) for k, v in vars(args).items()}, "device": str(device), "note": note}, rows)


if __name__ == "__main__":
    main()
