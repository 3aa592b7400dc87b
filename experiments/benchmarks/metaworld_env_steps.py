"""Meta-World env-step throughput: the port (MuJoCo C on the host, reached from jit) against the metaworld
package's own environments, in the same run.

    python experiments/benchmarks/metaworld_env_steps.py [--batches 1 256 1024] [--steps 50] [--threads 2]
                                                          [--reference-python .venv-metaworld/bin/python] [--allow-busy]

One env step = the 4-d action → mocap/gripper controls → 5 MuJoCo steps of 2.5 ms → observables → 91-d state,
dense reward and success predicate. Rows mix all 10 train-level tasks (row i runs task i mod 10), actions
are uniform random (they almost never succeed, so every row stays live), episodes are reset once and
stepped ``--steps`` times.

* **port, jit(scan)**: ``lax.scan`` over ``env.step_batch`` inside one ``jit`` (the engine's evaluation
  shape), started from a reset state; compile time reported separately; throughput = B · steps / wall
  time of one call after compilation. Resets (Meta-World's 250-step hand reset per row)
  are timed separately (resets/s).
* **port, host only**: the same physics called directly from Python (``MetaWorldHost.step64``), without
  JAX around it: what the callback costs.
* **metaworld (own MuJoCo)**: the package's environments in a Python loop, one environment per task, in
  the reference interpreter given by ``--reference-python`` (metaworld 3.1.1 with its pinned MuJoCo 3.3.0),
  single-threaded, in a long-lived worker; skipped if that interpreter is missing.

At each batch size the four columns are timed in alternation (``_common.alternate``) ``--repeats`` times;
cells give the best and the median. The run refuses to start at a load average above the core count unless
``--allow-busy`` (the table then says busy). The table is printed as markdown and written to
``results/benchmarks/metaworld_env_steps.{md,json}`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.metaworld import tasks
from imaginejax.envs.metaworld.env import MetaWorld, make_params
from imaginejax.envs.metaworld.host import get_host
from _common import (REPO_ROOT, Spread, Worker, add_load_arguments, alternate, check_load, fmt_ratio, fmt_spread,
                     is_busy, load_note, timed)

# The metaworld side, served in its own interpreter (argv: tests/reference, this folder).
REFERENCE_WORKER = r"""
import json, sys, time
sys.path[:0] = sys.argv[1:3]
from _common import protocol_stdout, serve
channel = protocol_stdout()
import numpy as np
import mujoco
import metaworld_reference as R
if mujoco.mjNEQDATA != 11:
    R.patch_mocap_welds()
from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE as G
held = {"rng": np.random.default_rng(0)}

def handle(req):
    if req["op"] == "load":
        held["envs"] = [G[n + "-goal-observable"](seed=0) for n in req["names"]]
        for e in held["envs"]:
            e.max_path_length = 10 ** 9
            e.reset()
        return {"mujoco": mujoco.__version__}
    envs, steps = held["envs"], int(req["steps"])
    actions = held["rng"].uniform(-1, 1, (steps, len(envs), 4)).astype(np.float32)
    start = time.perf_counter()
    for t in range(steps):
        for i, e in enumerate(envs):
            e.step(actions[t, i])
    return {"seconds": time.perf_counter() - start, "env_steps": steps * len(envs)}

serve(handle, channel)
"""


def port_contenders(env: MetaWorld, params, batch: int, steps: int
                    ) -> tuple[float, Callable[[], float], Callable[[], float]]:
    """(compile seconds, a contender timing one ``jit(lax.scan(step_batch))`` of ``steps`` steps from a reset
    state, a contender timing one jitted reset) of the port at a batch size, both warmed."""
    tasks_ = jnp.arange(batch) % params.num_tasks
    reset = jax.jit(lambda key: env.reset_to_task_batch(jax.random.split(key, batch), params, tasks_)[1])

    @jax.jit
    def rollout(state, key):
        def body(state, t):
            k = jax.random.fold_in(key, t)
            action = jax.random.uniform(k, (batch, 4), minval=-1.0, maxval=1.0)
            _, state, reward, _, _ = env.step_batch(jax.random.split(k, batch), state, action, params)
            return state, reward

        return jax.lax.scan(body, state, jnp.arange(steps))

    state = jax.block_until_ready(reset(jax.random.key(0)))
    start = time.perf_counter()
    jax.block_until_ready(rollout.lower(state, jax.random.key(0)).compile())
    compile_s = time.perf_counter() - start
    jax.block_until_ready(rollout(state, jax.random.key(1)))
    calls = iter(range(2, 1 << 30))
    return (compile_s, timed(lambda: jax.block_until_ready(rollout(state, jax.random.key(next(calls))))),
            timed(lambda: jax.block_until_ready(reset(jax.random.key(next(calls))))))


def host_contender(batch: int, steps: int) -> Callable[[], float]:
    """A contender timing ``steps`` env steps of the host physics alone (no JAX), same task mix, from one
    reset state with fresh random actions each call."""
    host = get_host()
    task = np.arange(batch) % len(tasks.LEVEL_TASKS["train"])
    rng = np.random.default_rng(0)
    rand = tasks.RAND_LOW[task] + rng.uniform(size=(batch, tasks.RAND_DIM)) * (tasks.RAND_HIGH[task] - tasks.RAND_LOW[task])
    out = host.reset64(task, rand)

    def measure() -> float:
        state, control = out["state"], out["control"]
        actions = rng.uniform(-1, 1, (steps, batch, 4)).astype(np.float32)
        start = time.perf_counter()
        for t in range(steps):
            state, control, _ = host.step64(state, control, actions[t], task)
        return time.perf_counter() - start

    return measure


def reference_worker(python: Path, our_names: tuple[str, ...] | None = None) -> tuple[Worker, str] | None:
    """(a worker holding the metaworld package's environments of ``our_names`` (default: the train level's 10
    tasks), one per task, in the reference interpreter ``python``; its MuJoCo version), or None if that
    interpreter is missing or fails. Ask it ``{"op": "time", "steps": n}`` for the seconds of ``n`` uniform
    random steps of every environment in a Python loop."""
    if not python.exists():
        return None
    names = [tasks.TASKS[tasks.TASK_INDEX[n]].metaworld for n in (our_names or tasks.LEVEL_TASKS["train"])]
    worker = Worker([str(python), "-c", REFERENCE_WORKER, str(REPO_ROOT / "tests" / "reference"),
                     str(Path(__file__).resolve().parent)])
    try:
        return worker, worker.ask({"op": "load", "names": names})["mujoco"]
    except RuntimeError as err:
        print(f"metaworld reference failed: {err}", file=sys.stderr)
        worker.close()
        return None


def time_reference(python: Path, steps: int, our_names: tuple[str, ...] | None = None) -> dict | None:
    """One timed loop of :func:`reference_worker`: ``{"seconds", "env_steps", "mujoco"}``, or None."""
    started = reference_worker(python, our_names)
    if started is None:
        return None
    worker, version = started
    try:
        return {**worker.ask({"op": "time", "steps": steps}), "mujoco": version}
    finally:
        worker.close()


def time_port(env: MetaWorld, params, batch: int, steps: int, repeats: int) -> tuple[float, float, float]:
    """(compile seconds, median env steps per second, median resets per second) of the port, timed alone."""
    compile_s, rollout, reset = port_contenders(env, params, batch, steps)
    samples = alternate({"reset": reset, "rollout": rollout}, repeats)
    return compile_s, batch * steps / Spread.of(samples["rollout"]).median, batch / Spread.of(samples["reset"]).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256, 1024])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="MuJoCo C threads (default: all CPUs)")
    parser.add_argument("--reference-python", type=Path,
                        default=Path(os.environ.get("IMAGINEJAX_METAWORLD_PYTHON", REPO_ROOT / ".venv-metaworld/bin/python")))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks")
    add_load_arguments(parser)
    args = parser.parse_args()

    load_before = check_load(args.allow_busy)
    env = MetaWorld(nthread=args.threads)
    params = make_params("train", embed=False)
    ref_steps = max(args.steps, 50)
    started = reference_worker(args.reference_python)
    rows = []
    try:
        for batch in args.batches:
            compile_s, rollout, reset = port_contenders(env, params, batch, args.steps)
            contenders = {"port": rollout, "reset": reset, "host": host_contender(batch, args.steps)}
            if started is not None:
                contenders["metaworld"] = lambda: started[0].ask({"op": "time", "steps": ref_steps})["seconds"]
            samples = alternate(contenders, args.repeats)
            rows.append({"batch": batch, "port_compile_s": compile_s, "port_seconds": samples["port"],
                         "port_jit_scan": batch * args.steps / Spread.of(samples["port"]).median,
                         "host_seconds": samples["host"],
                         "host_only": batch * args.steps / Spread.of(samples["host"]).median,
                         "reset_seconds": samples["reset"],
                         "resets_per_s": batch / Spread.of(samples["reset"]).median,
                         "metaworld_seconds": samples.get("metaworld")})
            r = rows[-1]
            print(f"batch {batch}: port {r['port_jit_scan']:,.0f} env steps/s (median; compile {compile_s:.1f} s), "
                  f"host only {r['host_only']:,.0f}, {r['resets_per_s']:,.0f} resets/s", file=sys.stderr)
    finally:
        if started is not None:
            started[0].close()
    load_after = os.getloadavg()[0]
    n_ref = len(tasks.LEVEL_TASKS["train"]) * ref_steps

    def spread(r: dict, name: str, work: float) -> tuple[float, Spread] | None:
        return None if r.get(f"{name}_seconds") is None else (work, Spread.of(r[f"{name}_seconds"]))

    lines = ["| batch | port: jit(scan(step)), env steps/s (best / median) | ÷ metaworld loop (best / median) | "
             "compile (s) | host physics only, env steps/s | resets/s | metaworld loop, env steps/s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        work = r["batch"] * args.steps
        port, ref = spread(r, "port", work), spread(r, "metaworld", n_ref)
        r["ratio_to_metaworld_loop"] = None if ref is None else ref[1].median / port[1].median * work / n_ref
        lines.append(f"| {r['batch']} | {fmt_spread(*port)} | {fmt_ratio(port, ref)} | {r['port_compile_s']:.1f} "
                     f"| {fmt_spread(*spread(r, 'host', work))} | {fmt_spread(*spread(r, 'reset', r['batch']))} | "
                     f"{fmt_spread(*ref) if ref else '—'} |")
    ref_line = (f"metaworld 3.1.1 (own MuJoCo {started[1]}), Python loop over the 10 train tasks' environments, "
                f"{ref_steps} steps each per sample, 1 thread" if started else
                "metaworld reference interpreter not found: skipped")
    table = ("\n".join(lines) + "\n\n" + ref_line + f". Best / median of {args.repeats} samples per column, the "
             f"columns of a batch size timed in alternation; {os.cpu_count()} CPUs, "
             f"{load_note(load_before, load_after)}.\n")
    print(table)
    meta = {"rows": rows, "reference_mujoco": started[1] if started else None, "reference_steps": ref_steps,
            "steps": args.steps, "repeats": args.repeats, "threads": args.threads or os.cpu_count(),
            "machine": platform.platform(), "cpus": os.cpu_count(), "jax": jax.__version__,
            "load_before": load_before, "load_after": load_after, "busy": is_busy(load_before, load_after)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metaworld_env_steps.md").write_text(table)
    (args.out / "metaworld_env_steps.json").write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
