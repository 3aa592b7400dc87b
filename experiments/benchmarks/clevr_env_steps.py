"""CLEVR-Robot env-step throughput: the plain-JAX push kernel against MuJoCo C on the same MJCF.

    python experiments/benchmarks/clevr_env_steps.py [--batches 1 1024 4096] [--repeats 5] [--allow-busy]

One env step is one push: zero velocities, place the pusher, 40 physics steps of 0.01 s (see
``envs/clevr/physics.py``). Every backend pushes the same states (random layouts advanced by five
random pushes, so balls touch) with the same actions, in the same run:

* **JAX batch-last**: ``jit(physics.push)`` (float32; the kernel computes with the batch as the last
  axis). Compile time is reported separately; each timed call is ended by ``block_until_ready``.
* **JAX vmap(single)**: the same physics written for one environment and ``vmap``-ped (batch-leading
  layout), to show why the kernel is batch-last.
* **MuJoCo loop**: ``mujoco_ref.push_mujoco``, a Python loop over ``mj_step`` on scene.xml (exact
  solver settings: tolerance 0, at most 10 Newton iterations), and the same loop with MuJoCo's
  default tolerance 1e-8 (its usual speed; it leaves tiny resting-contact forces inexact).
* **MuJoCo rollout**: ``mujoco.rollout`` with ``--threads`` threads on scene.xml.

MuJoCo's cost per push does not depend on the batch, so for batches above ``--mujoco-subset`` it is
timed on that many pushes and reported as throughput (marked with * in the table). After a warm-up of
each, the backends are timed in alternation (``_common.alternate``: JAX, vmap, loop, loop 1e-8, rollout,
JAX, …) ``--repeats`` times; every cell is the best / median throughput. The run refuses to start at a
load average above the core count unless ``--allow-busy`` (the table then says busy). The table is
printed as markdown and written to ``results/benchmarks/clevr_env_steps.{md,json}`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from imaginejax.envs.clevr import mujoco_ref
from imaginejax.envs.clevr import physics as P
from _common import (RESULTS, Spread, add_load_arguments, alternate, check_load, fmt_ratio, fmt_spread, is_busy,
                     machine_note, timed, write_results)



def make_states(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, 5, 2) float32 states with touching balls, and (B,) ball / direction actions."""
    key = jax.random.PRNGKey(seed)
    balls = P.sample_layout(key, batch)
    action = jax.random.randint(jax.random.fold_in(key, 1), (6, batch), 0, P.N_ACTIONS)
    ball, direction = P.decode_action(action)
    step = jax.jit(P.push)
    for t in range(5):
        balls = step(balls, ball[t], direction[t])
    return np.asarray(balls), np.asarray(ball[5]), np.asarray(direction[5])


def single_env_push(balls: jax.Array, ball: jax.Array, direction: jax.Array) -> jax.Array:
    """The batch-leading layout: one environment per call, vmapped. (5, 2), (), () -> (5, 2)."""
    return P.push(balls[None], ball[None], direction[None])[0]


def jax_contender(fn: Callable, balls: np.ndarray, ball: np.ndarray, direction: np.ndarray
                  ) -> tuple[float, Callable[[], float]]:
    """(compile seconds, a warmed contender timing one call of ``jit(fn)`` on these inputs)."""
    args = (jnp.asarray(balls), jnp.asarray(ball, jnp.int32), jnp.asarray(direction, jnp.int32))
    start = time.perf_counter()
    # a fresh function object, so nothing traced or compiled earlier in this process is re-used
    compiled = jax.jit(lambda *a: fn(*a)).lower(*args).compile()
    compile_s = time.perf_counter() - start
    compiled(*args).block_until_ready()  # warm-up
    return compile_s, timed(lambda: compiled(*args).block_until_ready())


def mujoco_contender(push: Callable, balls: np.ndarray, ball: np.ndarray, direction: np.ndarray
                     ) -> Callable[[], float]:
    """A warmed contender timing a host-side push driver on these inputs (float64 states)."""
    states = balls.astype(np.float64)
    push(states[:1], ball[:1], direction[:1])  # warm-up
    return timed(lambda: push(states, ball, direction))


def time_jax(fn: Callable, balls: np.ndarray, ball: np.ndarray, direction: np.ndarray,
             repeats: int) -> tuple[float, float]:
    """(compile seconds, median env steps/s) of ``jit(fn)`` on these inputs, timed alone."""
    compile_s, measure = jax_contender(fn, balls, ball, direction)
    return compile_s, len(balls) / Spread.of(alternate({"jax": measure}, repeats)["jax"]).median


def time_mujoco(push: Callable, balls: np.ndarray, ball: np.ndarray, direction: np.ndarray,
                repeats: int) -> float:
    """Median env steps/s of a host-side push driver on these inputs, timed alone."""
    measure = mujoco_contender(push, balls, ball, direction)
    return len(balls) / Spread.of(alternate({"mujoco": measure}, repeats)["mujoco"]).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 1024, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mujoco-subset", type=int, default=512,
                        help="largest number of pushes timed per MuJoCo measurement")
    parser.add_argument("--threads", type=int, default=2, help="mujoco.rollout threads")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--skip-vmap", action="store_true", help="skip the vmap(single) layout")
    add_load_arguments(parser)
    args = parser.parse_args()

    load_before = check_load(args.allow_busy)
    model = mujoco_ref.load_model()
    data = mujoco.MjData(model)
    default_tol = mujoco_ref.load_model()
    default_tol.opt.tolerance, default_tol.opt.iterations = 1e-8, 100
    default_data = mujoco.MjData(default_tol)
    roller = mujoco_ref.PushRollout(nthread=args.threads, model=model)

    rows = []
    try:
        for batch in args.batches:
            balls, ball, direction = make_states(batch, seed=batch)
            compile_s, jax_measure = jax_contender(P.push, balls, ball, direction)
            contenders = {"jax": jax_measure}
            vmap_compile_s = None
            if not args.skip_vmap:
                vmap_compile_s, contenders["vmap"] = jax_contender(jax.vmap(single_env_push), balls, ball, direction)
            n = min(batch, args.mujoco_subset)
            sub = (balls[:n], ball[:n], direction[:n])
            contenders["mujoco_loop"] = mujoco_contender(lambda *a: mujoco_ref.push_mujoco(*a, model, data), *sub)
            contenders["mujoco_loop_default_tol"] = mujoco_contender(
                lambda *a: mujoco_ref.push_mujoco(*a, default_tol, default_data), *sub)
            contenders["mujoco_rollout"] = mujoco_contender(roller, *sub)
            samples = alternate(contenders, args.repeats)
            row = dict(batch=batch, mujoco_pushes_timed=n, jax_compile_s=compile_s, vmap_compile_s=vmap_compile_s)
            for name, seconds in samples.items():
                work = batch if name in ("jax", "vmap") else n
                row[f"{name}_seconds"] = seconds
                row[f"{name}_steps_per_s"] = Spread.of(seconds).rates(work)  # (best, median)
                row[f"{name}_work"] = work
            rows.append(row)
            print(f"batch {batch}: done", flush=True)
    finally:
        roller.close()

    def cell(r: dict, name: str) -> tuple[float, Spread] | None:
        return (r[f"{name}_work"], Spread.of(r[f"{name}_seconds"])) if f"{name}_seconds" in r else None

    lines = [
        "| batch | JAX batch-last (compile s) | JAX vmap(single) (compile s) | MuJoCo loop | "
        "MuJoCo loop, tol 1e-8 | MuJoCo rollout, "
        f"{args.threads} thr | JAX / loop | JAX / rollout | JAX / fastest MuJoCo |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        star = "*" if r["mujoco_pushes_timed"] < r["batch"] else ""
        host = ("mujoco_loop", "mujoco_loop_default_tol", "mujoco_rollout")
        fastest = max(host, key=lambda name: r[f"{name}_steps_per_s"][1])
        vmap = ("n/a" if r["vmap_compile_s"] is None
                else f"{fmt_spread(*cell(r, 'vmap'))} ({r['vmap_compile_s']:.1f})")
        lines.append(
            f"| {r['batch']} | {fmt_spread(*cell(r, 'jax'))} ({r['jax_compile_s']:.1f}) | {vmap} | "
            + "".join(f"{fmt_spread(*cell(r, name))}{star} | " for name in host)
            + f"{fmt_ratio(cell(r, 'jax'), cell(r, 'mujoco_loop'))} | "
            f"{fmt_ratio(cell(r, 'jax'), cell(r, 'mujoco_rollout'))} | "
            f"{fmt_ratio(cell(r, 'jax'), cell(r, fastest))} |")
    notes = [
        "",
        "Env steps/s (one env step = one 40-substep push), best / median of "
        f"{args.repeats} alternating calls per backend after a warm-up (ratios: of the best, of the "
        "medians); JAX float32 on the CPU, MuJoCo on float64 states; * = timed on the first "
        f"{args.mujoco_subset} pushes of the batch (its cost per push does not depend on the batch).",
        "MuJoCo loop / rollout use scene.xml (exact solve: tolerance 0, <= 10 Newton iterations); "
        "'tol 1e-8' is MuJoCo's default solver tolerance.",
        machine_note(load_before, f"jax {jax.__version__}, mujoco {mujoco.__version__}"),
    ]
    load_after = os.getloadavg()[0]
    meta = dict(jax=jax.__version__, mujoco=mujoco.__version__, cpus=os.cpu_count(), load_before=load_before,
                load_after=load_after, busy=is_busy(load_before, load_after),
                repeats=args.repeats, threads=args.threads, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    write_results(args.out, "clevr_env_steps", "\n".join(lines + notes), meta, rows)


if __name__ == "__main__":
    main()
