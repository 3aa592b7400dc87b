"""Environment steps per second on the accelerator: the plain-JAX envs at large batches, MJX against MuJoCo C.

One measurement = a jitted ``lax.scan`` of ``steps`` calls of the environment's ``step_batch`` (dynamics,
success, reward, observation) on B rows, with uniformly random actions drawn inside the scan, from
``reset_to_task_batch`` states (tasks round-robin, or all rows on one named task). steps/s = B × steps /
seconds of one call after compilation (min and median of the repeats). The MuJoCo environments run the
same program on both physics backends: ``mjx`` on the accelerator and ``mujoco`` (MuJoCo C through
``mujoco.rollout`` on all host threads, reached by a callback) — the ratio is MJX over C, alternated.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _common import Spread, alternate, timed
from budget import Budget

from imaginejax import envs


@dataclasses.dataclass(frozen=True)
class Case:
    """One environment configuration: registry name, level, physics backend, and optionally one task."""

    env: str
    level: str = "train"
    backend: str | None = None
    task: str | None = None

    @property
    def label(self) -> str:
        return f"{self.env}{'/' + self.task if self.task else ''}{' ' + self.backend if self.backend else ''}"


def task_index(case: Case) -> int | None:
    """Row of ``case.task`` among the level's tasks (Meta-World names its tasks), or None."""
    if case.task is None:
        return None
    from imaginejax.envs.metaworld import tasks

    return tasks.LEVEL_TASKS[case.level].index(case.task)


def compile_rollout(case: Case, batch: int, steps: int) -> tuple[Callable[[], Any], float]:
    """(a call running ``steps`` steps of ``batch`` rows and blocking, its compile seconds)."""
    options = {"backend": case.backend} if case.backend else {}
    env, params = envs.make(case.env, case.level, embed=None, **options)
    keys = jax.random.split(jax.random.PRNGKey(batch), batch)
    fixed = task_index(case)
    tasks = (jnp.full((batch,), fixed, jnp.int32) if fixed is not None
             else jnp.arange(batch, dtype=jnp.int32) % params.num_tasks)
    obs, state = jax.jit(env.reset_to_task_batch)(keys, params, tasks)

    def rollout(state: Any, key: jax.Array) -> jax.Array:
        def body(carry, step_key):
            state, total = carry
            if env.discrete:
                action = jax.random.randint(step_key, (batch,), 0, env.num_actions, jnp.int32)
            else:
                action = jax.random.uniform(step_key, (batch, env.action_dim), jnp.float32, -1.0, 1.0)
            obs, state, reward, _, _ = env.step_batch(keys, state, action, params)
            return (state, total + reward.sum() + obs[:, 0].sum()), None

        (_, total), _ = jax.lax.scan(body, (state, jnp.float32(0)), jax.random.split(key, steps))
        return total

    start = time.perf_counter()
    compiled = jax.jit(rollout).lower(state, jax.random.PRNGKey(0)).compile()
    seconds = time.perf_counter() - start
    call = lambda: jax.block_until_ready(compiled(state, jax.random.PRNGKey(1)))  # noqa: E731
    call()  # first execution
    return call, seconds


def run(sizes: Any, budget: Budget, log: Callable[[str], None]) -> dict[str, Any]:
    """Rows per (case, batch): steps/s (min, median), compile seconds; MJX rows carry the ratio to C."""
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for env in sizes.jax_envs:
        for batch in sizes.jax_batches:
            if budget.expired(reserve=sizes.mjx_reserve):
                skipped.append(f"{env} B={batch}: budget")
                continue
            try:
                call, compile_s = compile_rollout(Case(env), batch, sizes.env_steps)
                first = timed(call)()
                # A call that would eat the share left for MJX is timed once (the first call is warm).
                repeats = sizes.repeats if first * sizes.repeats < budget.left() - sizes.mjx_reserve else 1
                t = alternate({"jax": timed(call)}, repeats)["jax"] if repeats > 1 else [first]
                best, median = Spread.of(t).rates(batch * sizes.env_steps)
            except Exception as error:  # noqa: BLE001 - e.g. out of memory at the largest batch
                rows.append({"env": env, "backend": "jax", "batch": batch, "error": f"{type(error).__name__}: {str(error)[:300]}"})
                continue
            rows.append({"env": env, "backend": "jax", "batch": batch, "steps": sizes.env_steps,
                         "compile_seconds": compile_s, "seconds": t,
                         "steps_per_s": median, "steps_per_s_best": best})
            log(f"  {env} B={batch}: {rows[-1]['steps_per_s']:,.0f} steps/s (compile {compile_s:.1f} s)")

    # MJX programs compile in parallel on the host's cores; MuJoCo C needs no compilation of its physics.
    cases = [Case(env, task=task) for env, task in sizes.mjx_cases]
    jobs = [(case, batch) for case in cases for batch in sizes.mjx_batches]
    compiled: dict[tuple[Case, int], tuple[Callable[[], Any], float]] = {}
    errors: dict[tuple[Case, int], str] = {}

    def build(job: tuple[Case, int]) -> None:
        case, batch = job
        try:
            compiled[job] = compile_rollout(dataclasses.replace(case, backend="mjx"), batch, sizes.mjx_steps)
        except Exception as error:  # noqa: BLE001
            errors[job] = f"{type(error).__name__}: {str(error)[:300]}"

    start = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(sizes.compile_threads)
    futures = [pool.submit(build, job) for job in jobs]
    concurrent.futures.wait(futures, timeout=max(1.0, budget.left() - sizes.mjx_timing_reserve))
    pool.shutdown(wait=False, cancel_futures=True)  # a compilation past the budget is left behind
    log(f"  MJX: {len(compiled)} of {len(jobs)} programs compiled in {time.perf_counter() - start:.0f} s wall")

    for case in cases:
        # MuJoCo C's rate saturates its threads at a few hundred rows: it runs at most c_batch rows.
        c_batch = min(max(sizes.mjx_batches), sizes.c_batch)
        c_call = None
        if any((case, batch) in compiled for batch in sizes.mjx_batches):
            try:
                c_call, _ = compile_rollout(dataclasses.replace(case, backend="mujoco"), c_batch, sizes.mjx_steps)
            except Exception as error:  # noqa: BLE001
                skipped.append(f"{case.label} MuJoCo C: {type(error).__name__}: {error}")
        for batch in sizes.mjx_batches:
            if (case, batch) not in compiled:
                rows.append({"env": case.label, "backend": "mjx", "batch": batch,
                             "error": errors.get((case, batch), "not compiled within the budget")})
                continue
            if budget.expired(reserve=2.0):
                skipped.append(f"{case.label} B={batch}: budget (timing)")
                continue
            mjx_call, compile_s = compiled[(case, batch)]
            contenders = {"mjx": timed(mjx_call)}
            if c_call is not None:
                contenders["mujoco"] = timed(c_call)
            t = alternate(contenders, sizes.repeats)
            row = {"env": case.label, "backend": "mjx", "batch": batch, "steps": sizes.mjx_steps,
                   "compile_seconds": compile_s, "seconds": t["mjx"],
                   "steps_per_s": Spread.of(t["mjx"]).rates(batch * sizes.mjx_steps)[1]}
            if "mujoco" in t:
                row.update(mujoco_c_batch=c_batch, mujoco_c_seconds=t["mujoco"],
                           mujoco_c_steps_per_s=Spread.of(t["mujoco"]).rates(c_batch * sizes.mjx_steps)[1])
                row["ratio"] = row["steps_per_s"] / row["mujoco_c_steps_per_s"]
            rows.append(row)
            log(f"  {case.label} B={batch}: MJX {row['steps_per_s']:,.0f} steps/s (compile {compile_s:.0f} s)"
                + (f", MuJoCo C {row['mujoco_c_steps_per_s']:,.0f} (B={c_batch})" if "ratio" in row else ""))
    return {"rows": rows, "skipped": skipped}
