"""LIBERO-style env-step throughput: the port on MuJoCo C (reached from jit) against the same MJCF stepped by
MuJoCo C in a plain Python loop, in the same run.

    python experiments/benchmarks/libero_env_steps.py [--batches 1 256 1024] [--steps 20] [--repeats 3]
                                                       [--threads N] [--out results/benchmarks/libero_env_steps]

One env step of the port = the 7-d action → the JAX delta-pose controller (Jacobian, damped least squares)
→ 20 MuJoCo steps of 2.5 ms for every live row in one ``mujoco.rollout`` call → 44-d state (JAX forward
kinematics), predicates and shaped reward. Rows mix the six train tasks; actions are uniform random in
[-1, 1] (rarely successful, so rows stay live).

* **port, jit(scan)**: ``lax.scan`` of ``--steps`` calls of ``env.step_batch`` inside one ``jit``, started from
  a reset state; compile time reported separately; throughput = B · steps / median wall time of ``--repeats``
  calls after compilation.
* **MuJoCo C, Python loop**: the same compiled ``MjModel``, one ``MjData`` per row, ``mj_step`` × 20 per env step
  with random servo targets held, in a plain single-threaded Python loop (no controller, no state vector,
  no reward: the physics alone). For B >= 256 the loop runs fewer steps (at least 2) to bound the time.

The MJX backend is not implemented yet (no MJX column). The table is printed as markdown and written to
``<out>.md`` / ``<out>.json``. Run it on a quiet machine: the numbers are wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from imaginejax.envs.libero import model as M
from imaginejax.envs.libero.env import Libero, make_params

REPO_ROOT = Path(__file__).resolve().parents[2]


def bench_port(batch: int, steps: int, repeats: int, nthread: int | None) -> dict[str, float]:
    """Env steps/s of ``env.step_batch`` in ``jit(lax.scan)`` at batch ``batch``."""
    env = Libero(backend="mujoco", nthread=nthread)
    params = make_params("train", embed=False)
    keys = jax.random.split(jax.random.key(0), batch)
    _, state = jax.jit(env.reset_to_task_batch)(keys, params, jnp.arange(batch) % params.num_tasks)

    @jax.jit
    def run(state, key):
        def body(state, k):
            action = jax.random.uniform(k, (batch, M.ACTION_DIM), minval=-1.0, maxval=1.0)
            _, state, reward, _, _ = env.step_batch(keys, state.replace(done=jnp.zeros(batch, bool)), action, params)
            return state, reward.sum()
        return jax.lax.scan(body, state, jax.random.split(key, steps))

    start = time.perf_counter()
    jax.block_until_ready(run(state, jax.random.key(1)))
    compile_s = time.perf_counter() - start
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(state, jax.random.key(2 + r)))
        times.append(time.perf_counter() - start)
    return {"steps_per_s": batch * steps / statistics.median(times), "compile_s": compile_s}


def bench_python_loop(batch: int, steps: int) -> dict[str, float]:
    """Env steps/s of the same MJCF stepped by MuJoCo C in a plain Python loop (physics only)."""
    model = M.load_model()
    datas = []
    rng = np.random.default_rng(0)
    for i in range(batch):
        d = mujoco.MjData(model)
        d.qpos[:7] = M.HOME_QPOS
        d.qpos[7:9] = M.GRIPPER_OPEN
        for k in range(3):
            d.qpos[9 + 7 * k: 12 + 7 * k] = (0.40 + 0.1 * k, -0.2, M.REST_Z[k])
            d.qpos[12 + 7 * k] = 1.0
        d.qpos[30:34] = (0.55, 0.25, 0.0, 1.0)
        d.ctrl[:7] = M.HOME_QPOS
        d.ctrl[7:] = M.GRIPPER_OPEN
        mujoco.mj_forward(model, d)
        datas.append(d)
    targets = M.HOME_QPOS + rng.uniform(-0.05, 0.05, (steps, batch, 7))
    start = time.perf_counter()
    for t in range(steps):
        for i, d in enumerate(datas):
            d.ctrl[:7] = targets[t, i]
            for _ in range(M.FRAME_SKIP):
                mujoco.mj_step(model, d)
    return {"steps_per_s": batch * steps / (time.perf_counter() - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256, 1024])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="MuJoCo C threads of the port (default: all)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks" / "libero_env_steps")
    args = parser.parse_args()
    rows = []
    for batch in args.batches:
        port = bench_port(batch, args.steps, args.repeats, args.threads)
        loop_steps = args.steps if batch < 256 else max(2, args.steps * 64 // batch)
        loop = bench_python_loop(batch, loop_steps)
        rows.append({"batch": batch, "port_steps_per_s": port["steps_per_s"], "port_compile_s": port["compile_s"],
                     "python_loop_steps_per_s": loop["steps_per_s"]})
        print(f"B={batch}: port {port['steps_per_s']:.0f} steps/s (compile {port['compile_s']:.1f} s), "
              f"MuJoCo C Python loop {loop['steps_per_s']:.0f} steps/s", flush=True)
    meta = {"machine": platform.platform(), "cpus": len(os.sched_getaffinity(0)), "jax": jax.__version__,
            "mujoco": mujoco.__version__, "steps": args.steps, "repeats": args.repeats, "threads": args.threads,
            "note": "port: controller + 20 physics steps + 44-d state + reward per env step; loop: physics only"}
    lines = ["| batch | port, jit(scan) (env steps/s) | compile (s) | MuJoCo C Python loop (env steps/s) |",
             "|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['port_steps_per_s']:.0f} | {r['port_compile_s']:.1f} | "
              f"{r['python_loop_steps_per_s']:.0f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n",
                                             encoding="utf-8")


if __name__ == "__main__":
    main()
