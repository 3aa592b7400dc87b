"""HalfCheetah env-step throughput: our two physics backends inside ``jit`` against Gymnasium's
HalfCheetah-v5 in a Python loop, in the same run.

    python experiments/benchmarks/cheetah_env_steps.py [--batches 1 1024 4096] [--mjx-batches 1 64]

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

Throughput is env steps / s = batch × steps / wall time, median of ``--repeats`` timed calls after a
warm-up (compile time reported separately). The table is printed as markdown and written to
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
from _common import RESULTS, fmt_rate, machine_note, median_seconds, write_results

TASK_FORWARD_BACKWARD = 0  # row of the hard level: ends at t >= 199 at the earliest


def mlp_policy(key: jax.Array, obs_dim: int, hidden: int = 64) -> Callable[[jax.Array], jax.Array]:
    """A random two-layer tanh MLP obs (B, D) → actions (B, 6) in [-1, 1]."""
    k1, k2 = jax.random.split(key)
    w1 = jax.random.normal(k1, (obs_dim, hidden)) / np.sqrt(obs_dim)
    w2 = jax.random.normal(k2, (hidden, tasks.ACTION_DIM)) / np.sqrt(hidden)
    return lambda obs: jnp.tanh(jnp.tanh(obs @ w1) @ w2)


def time_scan(env: HalfCheetah, batch: int, steps: int, repeats: int) -> tuple[float, float]:
    """(compile seconds, env steps/s) of a jitted scan of ``steps`` closed-loop steps on ``batch`` envs."""
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
    seconds = median_seconds(lambda: jax.block_until_ready(compiled(obs, state)), repeats)
    return compile_s, batch * steps / seconds


def time_host(runner: backends.MujocoRunner, batch: int, steps: int, repeats: int) -> float:
    """Env steps/s of ``runner.step64`` (batched mujoco.rollout) called from a Python loop."""
    rng = np.random.default_rng(batch)
    qpos0, qvel0 = rng.uniform(-0.1, 0.1, (batch, 9)), 0.1 * rng.standard_normal((batch, 9))
    actions = rng.uniform(-1, 1, (steps, batch, 6))

    def run() -> None:
        qpos, qvel = qpos0, qvel0
        for t in range(steps):
            qpos, qvel = runner.step64(qpos, qvel, actions[t])

    run()
    return batch * steps / median_seconds(run, repeats)


def time_gymnasium(steps: int, repeats: int) -> float:
    """Env steps/s of one Gymnasium HalfCheetah-v5 env in a Python loop (resets excluded)."""
    import gymnasium

    env = gymnasium.make("HalfCheetah-v5")
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, 6))

    def run() -> None:
        env.reset(seed=0)
        for a in actions:
            env.step(a)

    run()
    return steps / median_seconds(run, repeats)


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
    args = parser.parse_args()
    if max(args.steps, args.large_steps, args.mjx_steps) > 198:
        parser.error("scan lengths must stay below 199 (the task would start ending episodes)")

    load = os.getloadavg()
    gym_sps = time_gymnasium(2000, args.repeats)
    print(f"gymnasium loop: {gym_sps:,.0f} env steps/s", flush=True)
    runner = backends.get_runner(args.threads)
    env_c = HalfCheetah("mujoco", nthread=args.threads)
    env_m = HalfCheetah("mjx")
    rows = []
    for batch in args.batches:
        steps = args.steps if batch <= 1024 else args.large_steps
        compile_s, sps = time_scan(env_c, batch, steps, args.repeats)
        host = time_host(runner, batch, steps, args.repeats)
        rows.append(dict(backend=f"MuJoCo C in jit ({args.threads} thr)", batch=batch, steps=steps,
                         compile_s=compile_s, steps_per_s=sps, host_only_steps_per_s=host))
        print(f"mujoco batch {batch}: {sps:,.0f} env steps/s (host only {host:,.0f})", flush=True)
    for batch in args.mjx_batches:
        compile_s, sps = time_scan(env_m, batch, args.mjx_steps, args.repeats)
        rows.append(dict(backend="MJX in jit (CPU)", batch=batch, steps=args.mjx_steps, compile_s=compile_s,
                         steps_per_s=sps, host_only_steps_per_s=None))
        print(f"mjx batch {batch}: {sps:,.0f} env steps/s, compile {compile_s:.1f} s", flush=True)

    lines = [
        "| backend | batch | steps per call | compile s | env steps/s | host-only rollout steps/s | "
        "÷ Gymnasium loop |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| Gymnasium HalfCheetah-v5, Python loop | 1 | 2000 | – | {gym_sps:,.0f} | – | 1.0x |",
    ]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['batch']} | {r['steps']} | {r['compile_s']:.1f} | "
                     f"{fmt_rate(r['steps_per_s'])} | {fmt_rate(r['host_only_steps_per_s'])} | "
                     f"{r['steps_per_s'] / gym_sps:.2f}x |")
    notes = [
        "",
        "Env steps/s = batch × steps / wall time, median of "
        f"{args.repeats} calls after compilation. 'in jit' rows close the loop through a JAX MLP policy "
        "and compute the task bookkeeping; the host-only column is the same batched mujoco.rollout "
        "calls from a Python loop with fixed actions; the Gymnasium row steps one env with pre-drawn "
        "actions (no policy).",
        machine_note(load[0], f"jax {jax.__version__}, mujoco {mujoco.__version__}"),
    ]
    meta = dict(jax=jax.__version__, mujoco=mujoco.__version__, cpus=os.cpu_count(), load_before=load[0],
                load_after=os.getloadavg()[0], repeats=args.repeats, threads=args.threads,
                gymnasium_steps_per_s=gym_sps, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    write_results(args.out, "cheetah_env_steps", "\n".join(lines + notes), meta, rows)


if __name__ == "__main__":
    main()
