"""Meta-World env-step throughput: the port (MuJoCo C on the host, reached from jit) against the metaworld
package's own environments, in the same run.

    python experiments/benchmarks/metaworld_env_steps.py [--batches 1 256 1024] [--steps 50] [--threads 2]
                                                          [--reference-python .venv-metaworld/bin/python]

One env step = the 4-d action → mocap/gripper controls → 5 MuJoCo steps of 2.5 ms → observables → 91-d state,
dense reward and success predicate. Rows mix all 10 train-level tasks (row i runs task i mod 10), actions
are uniform random (they almost never succeed, so every row stays live), episodes are reset once and
stepped ``--steps`` times.

* **port, jit(scan)**: ``lax.scan`` over ``env.step_batch`` inside one ``jit`` (the engine's evaluation
  shape), started from a reset state; compile time reported separately; throughput = B · steps / median
  wall time of ``--repeats`` calls after compilation. Resets (Meta-World's 250-step hand reset per row)
  are timed separately (resets/s).
* **port, host only**: the same physics called directly from Python (``MetaWorldHost.step64``), without
  JAX around it: what the callback costs.
* **metaworld (own MuJoCo)**: the package's environments in a Python loop, one environment per task, in
  the reference interpreter given by ``--reference-python`` (metaworld 3.1.1 with its pinned MuJoCo 3.3.0),
  single-threaded; skipped if that interpreter is missing.

The table is printed as markdown and written to ``results/benchmarks/metaworld_env_steps.{md,json}``
(or ``--out``). Run it on a quiet machine: the numbers are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.metaworld import tasks
from imaginejax.envs.metaworld.env import MetaWorld, make_params
from imaginejax.envs.metaworld.host import get_host

REPO_ROOT = Path(__file__).resolve().parents[2]

REFERENCE_SCRIPT = r"""
import json, sys, time, numpy as np
import mujoco
sys.path.insert(0, sys.argv[1])
import metaworld_reference as R
if mujoco.mjNEQDATA != 11:
    R.patch_mocap_welds()
from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE as G
names, steps = json.loads(sys.argv[2]), int(sys.argv[3])
envs = [G[n + "-goal-observable"](seed=0) for n in names]
rng = np.random.default_rng(0)
for e in envs:
    e.max_path_length = 10 ** 9
    e.reset()
actions = rng.uniform(-1, 1, (steps, len(envs), 4)).astype(np.float32)
start = time.perf_counter()
for t in range(steps):
    for i, e in enumerate(envs):
        e.step(actions[t, i])
print(json.dumps({"seconds": time.perf_counter() - start, "env_steps": steps * len(envs),
                  "mujoco": mujoco.__version__}))
"""


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def time_port(env: MetaWorld, params, batch: int, steps: int, repeats: int) -> tuple[float, float, float]:
    """(compile seconds, env steps per second, resets per second) of the port at a batch size: a jitted
    reset, then ``jit(lax.scan(step_batch))`` from that state (timed without the reset)."""
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
    times, reset_times = [], []
    for r in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(reset(jax.random.key(10 + r)))
        reset_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        jax.block_until_ready(rollout(state, jax.random.key(2 + r)))
        times.append(time.perf_counter() - start)
    return compile_s, batch * steps / median(times), batch / median(reset_times)


def time_host(batch: int, steps: int, repeats: int) -> float:
    """Env steps per second of the host physics alone (no JAX), same task mix."""
    host = get_host()
    task = np.arange(batch) % len(tasks.LEVEL_TASKS["train"])
    rng = np.random.default_rng(0)
    rand = tasks.RAND_LOW[task] + rng.uniform(size=(batch, tasks.RAND_DIM)) * (tasks.RAND_HIGH[task] - tasks.RAND_LOW[task])
    out = host.reset64(task, rand)
    times = []
    for _ in range(repeats):
        state, control = out["state"], out["control"]
        actions = rng.uniform(-1, 1, (steps, batch, 4)).astype(np.float32)
        start = time.perf_counter()
        for t in range(steps):
            state, control, _ = host.step64(state, control, actions[t], task)
        times.append(time.perf_counter() - start)
    return batch * steps / median(times)


def time_reference(python: Path, steps: int, our_names: tuple[str, ...] | None = None) -> dict | None:
    """The metaworld package's environments of ``our_names`` (default: the train level's 10 tasks), one per
    task, stepped ``steps`` times each with uniform random actions in a Python loop in the reference
    interpreter ``python``: ``{"seconds", "env_steps", "mujoco"}``, or None if that interpreter is missing."""
    if not python.exists():
        return None
    names = [tasks.TASKS[tasks.TASK_INDEX[n]].metaworld for n in (our_names or tasks.LEVEL_TASKS["train"])]
    proc = subprocess.run([str(python), "-c", REFERENCE_SCRIPT, str(REPO_ROOT / "tests" / "reference"), json.dumps(names), str(steps)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256, 1024])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="MuJoCo C threads (default: all CPUs)")
    parser.add_argument("--reference-python", type=Path,
                        default=Path(os.environ.get("IMAGINEJAX_METAWORLD_PYTHON", REPO_ROOT / ".venv-metaworld/bin/python")))
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks")
    args = parser.parse_args()

    env = MetaWorld(nthread=args.threads)
    params = make_params("train", embed=False)
    rows = []
    for batch in args.batches:
        compile_s, port, resets = time_port(env, params, batch, args.steps, args.repeats)
        host = time_host(batch, args.steps, args.repeats)
        rows.append({"batch": batch, "port_jit_scan": port, "port_compile_s": compile_s, "host_only": host,
                     "resets_per_s": resets})
        print(f"batch {batch}: port {port:,.0f} env steps/s (compile {compile_s:.1f} s), host only {host:,.0f}, "
              f"{resets:,.0f} resets/s", file=sys.stderr)
    ref = time_reference(args.reference_python, max(args.steps, 50))
    ref_rate = None if ref is None else ref["env_steps"] / ref["seconds"]
    for r in rows:
        r["ratio_to_metaworld_loop"] = None if ref_rate is None else r["port_jit_scan"] / ref_rate

    lines = ["| batch | port: jit(scan(step)), env steps/s | ÷ metaworld loop | compile (s) | host physics only, "
             "env steps/s | resets/s |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = "—" if r["ratio_to_metaworld_loop"] is None else f"{r['ratio_to_metaworld_loop']:.2f}×"
        lines.append(f"| {r['batch']} | {r['port_jit_scan']:,.0f} | {ratio} | {r['port_compile_s']:.1f} "
                     f"| {r['host_only']:,.0f} | {r['resets_per_s']:,.0f} |")
    ref_line = ("metaworld 3.1.1 (own MuJoCo " + ref["mujoco"] + "), Python loop, 1 thread: "
                f"{ref_rate:,.0f} env steps/s") if ref else "metaworld reference interpreter not found: skipped"
    table = "\n".join(lines) + "\n\n" + ref_line + "\n"
    print(table)
    meta = {"rows": rows, "reference": ref, "steps": args.steps, "threads": args.threads or os.cpu_count(),
            "machine": platform.platform(), "cpus": os.cpu_count(), "jax": jax.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metaworld_env_steps.md").write_text(table)
    (args.out / "metaworld_env_steps.json").write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
