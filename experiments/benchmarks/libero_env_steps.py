"""LIBERO-style env-step throughput per physics backend — the port on MuJoCo C (reached from jit) and on MJX —
against the same MJCF stepped by MuJoCo C in a plain Python loop, in the same run.

    python experiments/benchmarks/libero_env_steps.py [--batches 1 256 1024] [--steps 20] [--repeats 3]
        [--threads N] [--mjx-steps 5] [--mjx-large-steps 1] [--mjx-timeout 900]
        [--out results/benchmarks/libero_env_steps]

One env step of the port = the 7-d action → the JAX delta-pose controller (Jacobian, damped least squares)
→ 20 MuJoCo steps of 2.5 ms for every live row in one ``mujoco.rollout`` call → 44-d state (JAX forward
kinematics), predicates and shaped reward. Rows mix the six train tasks; actions are uniform random in
[-1, 1] (rarely successful, so rows stay live).

* **port, jit(scan)**: ``lax.scan`` of ``--steps`` calls of ``env.step_batch`` inside one ``jit``, started from
  a reset state; "compile" = wall time of the first call (compilation plus one run); throughput =
  B · steps / wall time of one call after compilation.
* **MuJoCo C, Python loop**: the same compiled ``MjModel``, one ``MjData`` per row, ``mj_step`` × 20 per env step
  with random servo targets held, in a plain single-threaded Python loop (no controller, no state vector,
  no reward: the physics alone). For B >= 256 the loop runs fewer steps (at least 2) to bound the time.
* **MJX, jit(scan)**: the same ``lax.scan`` with ``Libero(backend="mjx")`` (float32, pure JAX on the default
  device). Each batch size runs in its own subprocess under a wall-clock limit (``--mjx-timeout``), because
  on a CPU MJX is slow to compile and may run out of memory at large batch; a row that times out or fails
  is recorded as such. ``--mjx-steps`` env steps per call at B = 1, ``--mjx-large-steps`` at B >= 256, one
  timed call after the compiling one (``--repeats`` at B = 1).
* **contacts**: MJX's candidate geom pairs (checked every MuJoCo step whatever the state), the contact slots
  it allocates, and on one reset state (the arm over the objects, objects on the floor) the active MJX
  contacts and MuJoCo C's ``ncon``.

At each batch size the port and the Python loop are timed in alternation (``_common.alternate``) ``--repeats``
times; cells give the best and the median. The ratio columns divide by the Python loop at the same batch. The
run refuses to start at a load average above the core count unless ``--allow-busy`` (the table then says
busy). The table is printed as markdown and written to ``<out>.md`` / ``<out>.json``, with the load average
before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from imaginejax.envs.libero import model as M
from imaginejax.envs.libero.env import Libero, make_params
from _common import (REPO_ROOT, Spread, add_load_arguments, alternate, check_load, fmt_ratio, fmt_spread, is_busy,
                     load_note, timed)


def port_contender(batch: int, steps: int, nthread: int | None, backend: str = "mujoco"
                   ) -> tuple[float, Callable[[], float]]:
    """(seconds of the first, compiling call; a contender timing one ``jit(lax.scan)`` of ``steps`` calls of
    ``env.step_batch`` at batch ``batch`` on ``backend``, with fresh random actions each call)."""
    env = Libero(backend=backend, nthread=nthread)
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
    calls = iter(range(2, 1 << 30))
    return compile_s, timed(lambda: jax.block_until_ready(run(state, jax.random.key(next(calls)))))


def bench_port(batch: int, steps: int, repeats: int, nthread: int | None, backend: str = "mujoco"
               ) -> dict[str, float]:
    """Env steps/s (best and median of ``repeats`` calls) and compile seconds of :func:`port_contender`,
    timed alone."""
    compile_s, measure = port_contender(batch, steps, nthread, backend)
    seconds = alternate({"port": measure}, repeats)["port"]
    best, median = Spread.of(seconds).rates(batch * steps)
    return {"steps_per_s": median, "best_steps_per_s": best, "compile_s": compile_s, "seconds": seconds}


def python_loop_contender(batch: int, steps: int) -> Callable[[], float]:
    """A contender timing ``steps`` env steps of the same MJCF stepped by MuJoCo C in a plain Python loop
    over ``batch`` ``MjData`` (physics only; the state carries over from call to call)."""
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

    def run() -> None:
        for t in range(steps):
            for i, d in enumerate(datas):
                d.ctrl[:7] = targets[t, i]
                for _ in range(M.FRAME_SKIP):
                    mujoco.mj_step(model, d)

    return timed(run)


def contact_stats() -> dict[str, int]:
    """MJX candidate pairs / contact slots and active contacts on one reset state (both backends)."""
    env = Libero(backend="mjx")
    params = make_params("train", embed=False)
    _, state = Libero(backend="mujoco", nthread=1).reset_to_task_batch(jax.random.split(jax.random.key(0), 1), params,
                                                                       jnp.zeros(1, jnp.int32))
    return env.mjx.contact_stats(np.asarray(state.hi + state.lo)[0], np.asarray(state.ctrl)[0])


def run_mjx_subprocess(batch: int, steps: int, repeats: int, limit: float) -> dict[str, object]:
    """:func:`bench_port` on MJX in a subprocess with a wall-clock limit; the outcome is recorded either way."""
    cmd = [sys.executable, __file__, "--mjx-one", str(batch), "--steps", str(steps), "--repeats", str(repeats)]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {limit:.0f} s", "steps": steps}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1][:200]
        return {"status": f"failed (exit {out.returncode}): {tail}", "steps": steps,
                "wall_s": time.perf_counter() - start}
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"status": "ok", "steps": steps, **result}


def _fmt(x: object, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256, 1024])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="MuJoCo C threads of the port (default: all)")
    parser.add_argument("--mjx-steps", type=int, default=5, help="MJX env steps per call at batch 1")
    parser.add_argument("--mjx-large-steps", type=int, default=1, help="MJX env steps per call at batch >= 256")
    parser.add_argument("--mjx-timeout", type=float, default=900.0, help="wall-clock limit (s) of one MJX batch size")
    parser.add_argument("--no-mjx", action="store_true", help="skip the MJX column")
    parser.add_argument("--mjx-one", type=int, default=None, help=argparse.SUPPRESS)  # subprocess mode
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks" / "libero_env_steps")
    add_load_arguments(parser)
    args = parser.parse_args()
    if args.mjx_one is not None:
        print(json.dumps(bench_port(args.mjx_one, args.steps, args.repeats, None, backend="mjx")), flush=True)
        return
    load_before = check_load(args.allow_busy)
    rows = []
    for batch in args.batches:
        compile_s, port = port_contender(batch, args.steps, args.threads)
        loop_steps = args.steps if batch < 256 else max(2, args.steps * 64 // batch)
        samples = alternate({"port": port, "loop": python_loop_contender(batch, loop_steps)}, args.repeats)
        row = {"batch": batch, "port_compile_s": compile_s, "port_seconds": samples["port"],
               "port_steps_per_s": batch * args.steps / Spread.of(samples["port"]).median,
               "python_loop_seconds": samples["loop"], "python_loop_steps": loop_steps,
               "python_loop_steps_per_s": batch * loop_steps / Spread.of(samples["loop"]).median}
        print(f"B={batch}: port {row['port_steps_per_s']:.0f} steps/s (median; compile {compile_s:.1f} s), "
              f"MuJoCo C Python loop {row['python_loop_steps_per_s']:.0f} steps/s", flush=True)
        if not args.no_mjx:
            small = batch < 256
            m = run_mjx_subprocess(batch, args.mjx_steps if small else args.mjx_large_steps,
                                   args.repeats if small else 1, args.mjx_timeout)
            row.update({f"mjx_{k}": v for k, v in m.items()})
            print(f"B={batch}: MJX {m}", flush=True)
        rows.append(row)
    contacts = {} if args.no_mjx else contact_stats()
    meta = {"machine": platform.platform(), "cpus": len(os.sched_getaffinity(0)), "jax": jax.__version__,
            "jax_backend": jax.default_backend(), "mujoco": mujoco.__version__, "steps": args.steps,
            "repeats": args.repeats, "threads": args.threads, "mjx_steps": args.mjx_steps,
            "mjx_large_steps": args.mjx_large_steps, "mjx_timeout_s": args.mjx_timeout,
            "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
            "busy": is_busy(load_before, os.getloadavg()[0]), "contacts": contacts,
            "note": "port: controller + 20 physics steps + 44-d state + reward per env step; loop: physics only"}
    lines = ["| batch | MuJoCo C from jit(scan) (env steps/s, best / median) | compile (s) | MJX jit(scan) (env "
             "steps/s, best / median) | MJX compile (s) | MuJoCo C Python loop (env steps/s, best / median) | "
             "MuJoCo C jit / loop (best / median) | MJX / loop (medians) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        port = (r["batch"] * args.steps, Spread.of(r["port_seconds"]))
        loop = (r["batch"] * r["python_loop_steps"], Spread.of(r["python_loop_seconds"]))
        mjx_rate = r.get("mjx_steps_per_s")
        mjx_cell = (f"{_fmt(r.get('mjx_best_steps_per_s'), '.1f')} / {_fmt(mjx_rate, '.1f')}" if mjx_rate is not None
                    else str(r.get("mjx_status", "not run")))
        lines.append(f"| {r['batch']} | {fmt_spread(*port)} | {r['port_compile_s']:.1f} | {mjx_cell} | "
                     f"{_fmt(r.get('mjx_compile_s'), '.0f')} | {fmt_spread(*loop)} | {fmt_ratio(port, loop)} | "
                     f"{_fmt(mjx_rate / r['python_loop_steps_per_s'] if mjx_rate else None, '.4f')} |")
    lines.append("")
    lines.append(f"Best / median of {args.repeats} calls; the port and the Python loop alternate call by call, MJX "
                 f"runs afterwards in its own process. {meta['cpus']} CPUs, "
                 f"{load_note(load_before, meta['load_average_after'], meta['cpus'])}; "
                 f"jax {jax.__version__} ({jax.default_backend()}), mujoco {mujoco.__version__}.")
    if contacts:
        lines.append(f"MJX contacts: {contacts['candidate_pairs']} candidate geom pairs, {contacts['mjx_contacts']} "
                     f"contact slots per step; on a reset state {contacts['active_mjx']} active (MuJoCo C ncon "
                     f"{contacts['mujoco_ncon']}).")
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n",
                                             encoding="utf-8")


if __name__ == "__main__":
    main()
