"""HalfCheetah env-step throughput: our two physics backends inside ``jit`` against Gymnasium's
HalfCheetah-v5 in a Python loop, in the same run.

    python experiments/benchmarks/cheetah_env_steps.py [--batches 1 1024 4096] [--mjx-batches 1 64] [--allow-busy]

One env step = 5 MuJoCo steps of 0.01 s plus the task bookkeeping (Σ, legs, reward, success). Rows:

* **MuJoCo C in jit**: ``jit(lax.scan(policy → HalfCheetah("mujoco").step_batch))`` for ``--steps``
  steps; the physics is one ``pure_callback`` → ``mujoco.rollout`` call per step for the whole batch on
  ``--threads`` C threads. The policy is a small random MLP (18 → 64 → 6, tanh) on the observations,
  so the loop is closed through JAX every step. Episodes run the "forward then backward" task, which
  cannot end before step 199, so every row is simulated on every step.
* **MuJoCo C, host only**: the same batched ``mujoco.rollout`` calls from a Python loop with fixed
  actions (no JAX): what the callback costs.
* **MJX in jit**: the same scan with ``HalfCheetah("mjx")`` (XLA on this CPU), only at the small
  ``--mjx-batches`` (it compiles for tens of seconds and is slow on CPU), fewer steps.
* **Gymnasium loop**: the reference style, one ``gymnasium.make("HalfCheetah-v5")`` env stepped in a
  Python loop with pre-drawn random actions (env cost only: no policy, no task bookkeeping).

Throughput is env steps / s = batch × steps / wall time of one call after a warm-up (compile time reported
separately). Every batch size's contenders (MuJoCo C in jit, host only, the Gymnasium loop; MJX with its
own batch sizes) are timed in alternation (``_common.alternate``) ``--repeats`` times; cells give the best
and the median. The run refuses to start at a load average above the core count unless ``--allow-busy``
(the table then says busy). The table is printed as markdown and written to
``results/benchmarks/cheetah_env_steps.{md,json}`` (or ``--out``).
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

from imaginejax.envs.cheetah import backends, tasks
from imaginejax.envs.cheetah.env import HalfCheetah, make_params
from _common import (RESULTS, Spread, add_load_arguments, alternate, check_load, fmt_ratio, fmt_spread, is_busy,
                     machine_note, timed, write_results)

TASK_FORWARD_BACKWARD = 0  # row of the hard level: ends at t >= 199 at the earliest


def mlp_policy(key: jax.Array, obs_dim: int, hidden: int = 64) -> Callable[[jax.Array], jax.Array]:
    """A random two-layer tanh MLP obs (B, D) → actions (B, 6) in [-1, 1]."""
    k1, k2 = jax.random.split(key)
    w1 = jax.random.normal(k1, (obs_dim, hidden)) / np.sqrt(obs_dim)
    w2 = jax.random.normal(k2, (hidden, tasks.ACTION_DIM)) / np.sqrt(hidden)
    return lambda obs: jnp.tanh(jnp.tanh(obs @ w1) @ w2)


def scan_contender(env: HalfCheetah, batch: int, steps: int) -> tuple[float, Callable[[], float]]:
    """(compile seconds, a warmed contender timing one jitted scan of ``steps`` closed-loop steps on ``batch``
    envs)."""
    params = make_params("hard", embed=False)
    policy = mlp_policy(jax.random.PRNGKey(1), env.obs_dim(params))
    keys = jax.random.split(jax.random.PRNGKey(batch), batch)
    obs, state = env.reset_to_task_batch(keys, params, jnp.full((batch,), TASK_FORWARD_BACKWARD))

    def run(obs: jax.Array, state) -> jax.Array:
        def body(carry, _):
            obs, state = carry
            obs, state, reward, _, _ = env.step_batch(keys, state, policy(obs), params)
            return (obs, state), reward

        (_, state), rewards = jax.lax.scan(body, (obs, state), None, length=steps)
        return rewards.sum() + state.t.sum()

    start = time.perf_counter()
    compiled = jax.jit(run).lower(obs, state).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(obs, state))  # warm-up
    return compile_s, timed(lambda: jax.block_until_ready(compiled(obs, state)))


def host_contender(runner: backends.MujocoRunner, batch: int, steps: int) -> Callable[[], float]:
    """A warmed contender timing ``steps`` calls of ``runner.step64`` (batched mujoco.rollout) from a Python
    loop."""
    rng = np.random.default_rng(batch)
    qpos0, qvel0 = rng.uniform(-0.1, 0.1, (batch, 9)), 0.1 * rng.standard_normal((batch, 9))
    actions = rng.uniform(-1, 1, (steps, batch, 6))

    def run() -> None:
        qpos, qvel = qpos0, qvel0
        for t in range(steps):
            qpos, qvel = runner.step64(qpos, qvel, actions[t])

    run()
    return timed(run)


def gymnasium_contender(steps: int) -> Callable[[], float]:
    """A warmed contender timing ``steps`` steps of one Gymnasium HalfCheetah-v5 env in a Python loop."""
    import gymnasium

    env = gymnasium.make("HalfCheetah-v5")
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, 6))

    def run() -> None:
        env.reset(seed=0)
        for a in actions:
            env.step(a)

    run()
    return timed(run)


def time_scan(env: HalfCheetah, batch: int, steps: int, repeats: int) -> tuple[float, float]:
    """(compile seconds, median env steps/s) of :func:`scan_contender`, timed alone."""
    compile_s, measure = scan_contender(env, batch, steps)
    return compile_s, batch * steps / Spread.of(alternate({"scan": measure}, repeats)["scan"]).median


def time_host(runner: backends.MujocoRunner, batch: int, steps: int, repeats: int) -> float:
    """Median env steps/s of :func:`host_contender`, timed alone."""
    measure = host_contender(runner, batch, steps)
    return batch * steps / Spread.of(alternate({"host": measure}, repeats)["host"]).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 1024, 4096])
    parser.add_argument("--mjx-batches", type=int, nargs="*", default=[1, 64])
    parser.add_argument("--steps", type=int, default=100, help="scan length (<= 198) at batch <= 1024")
    parser.add_argument("--large-steps", type=int, default=20, help="scan length at batch > 1024")
    parser.add_argument("--mjx-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=backends.default_threads(), help="MuJoCo C threads")
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_load_arguments(parser)
    args = parser.parse_args()
    if max(args.steps, args.large_steps, args.mjx_steps) > 198:
        parser.error("scan lengths must stay below 199 (the task would start ending episodes)")

    load_before = check_load(args.allow_busy)
    gym_steps = 2000
    gymnasium = gymnasium_contender(gym_steps)
    runner = backends.get_runner(args.threads)
    env_c = HalfCheetah("mujoco", nthread=args.threads)
    env_m = HalfCheetah("mjx")
    rows, gym_seconds = [], []
    for batch in args.batches:
        steps = args.steps if batch <= 1024 else args.large_steps
        compile_s, scan = scan_contender(env_c, batch, steps)
        samples = alternate({"scan": scan, "host": host_contender(runner, batch, steps), "gym": gymnasium},
                            args.repeats)
        gym_seconds += samples["gym"]
        rows.append(dict(backend=f"MuJoCo C in jit ({args.threads} thr)", batch=batch, steps=steps,
                         compile_s=compile_s, seconds=samples["scan"], host_only_seconds=samples["host"],
                         gym_seconds=samples["gym"]))
        print(f"mujoco batch {batch}: {batch * steps / Spread.of(samples['scan']).median:,.0f} env steps/s "
              f"(median; host only {batch * steps / Spread.of(samples['host']).median:,.0f})", flush=True)
    for batch in args.mjx_batches:
        compile_s, scan = scan_contender(env_m, batch, args.mjx_steps)
        samples = alternate({"scan": scan, "gym": gymnasium}, args.repeats)
        gym_seconds += samples["gym"]
        rows.append(dict(backend="MJX in jit (CPU)", batch=batch, steps=args.mjx_steps, compile_s=compile_s,
                         seconds=samples["scan"], host_only_seconds=None, gym_seconds=samples["gym"]))
        print(f"mjx batch {batch}: {batch * args.mjx_steps / Spread.of(samples['scan']).median:,.0f} env steps/s "
              f"(median), compile {compile_s:.1f} s", flush=True)
    for r in rows:
        r["steps_per_s"] = Spread.of(r["seconds"]).rates(r["batch"] * r["steps"])  # (best, median)

    gym_all = (gym_steps, Spread.of(gym_seconds))
    lines = [
        "| backend | batch | steps per call | compile s | env steps/s | host-only rollout steps/s | "
        "÷ Gymnasium loop (same rounds) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| Gymnasium HalfCheetah-v5, Python loop (all rounds) | 1 | {gym_steps} | – | {fmt_spread(*gym_all)} | – "
        "| 1.00 / 1.00 |",
    ]
    for r in rows:
        work = r["batch"] * r["steps"]
        host = "–" if r["host_only_seconds"] is None else fmt_spread(work, Spread.of(r["host_only_seconds"]))
        lines.append(f"| {r['backend']} | {r['batch']} | {r['steps']} | {r['compile_s']:.1f} | "
                     f"{fmt_spread(work, Spread.of(r['seconds']))} | {host} | "
                     f"{fmt_ratio((work, Spread.of(r['seconds'])), (gym_steps, Spread.of(r['gym_seconds'])))} |")
    notes = [
        "",
        f"Env steps/s = batch × steps / wall time, best / median of {args.repeats} calls after compilation, "
        "each backend alternating with the Gymnasium loop (the ratio divides by the loop's samples of the same "
        "rounds, best by best, median by median). 'in jit' rows close the loop through a JAX MLP policy "
        "and compute the task bookkeeping; the host-only column is the same batched mujoco.rollout "
        "calls from a Python loop with fixed actions; the Gymnasium row steps one env with pre-drawn "
        "actions (no policy).",
        machine_note(load_before, f"jax {jax.__version__}, mujoco {mujoco.__version__}"),
    ]
    load_after = os.getloadavg()[0]
    meta = dict(jax=jax.__version__, mujoco=mujoco.__version__, cpus=os.cpu_count(), load_before=load_before,
                load_after=load_after, busy=is_busy(load_before, load_after), repeats=args.repeats,
                threads=args.threads, gymnasium_seconds=gym_seconds, gymnasium_steps=gym_steps,
                time=time.strftime("%Y-%m-%d %H:%M:%S"))
    write_results(args.out, "cheetah_env_steps", "\n".join(lines + notes), meta, rows)


if __name__ == "__main__":
    main()
