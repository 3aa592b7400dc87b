"""BabyAI env-step throughput: the batched plain-JAX kernel against single-environment Python loops.

    python experiments/benchmarks/babyai_env_steps.py [--batches 1 1024 4096] [--steps 100] [--repeats 5]
        [--minigrid-python /path/to/venv/bin/python]

One env step = the full ``BabyAI.step_batch`` of the train level: dynamics, freezing of finished
episodes, success predicate, shaped reward, truncation, observation. Every JAX variant runs a
``jit(lax.scan)`` over ``--steps`` steps with uniformly random actions drawn beforehand, from states of
``reset_to_task_batch`` (round-robin tasks), and consumes the observations and rewards (so nothing is
dead code). Throughput = batch × steps / wall time of one call after compilation; at each batch size all
columns are timed in alternation (``_common.alternate``) ``--repeats`` times and every cell is the best /
median. The run refuses to start at a load average above the core count unless ``--allow-busy`` (the
table then says busy).

Columns, all measured in this run:

* **ours**: ``BabyAI.step_batch`` with the world as 17 int32 fields of shape (B,) (structure of arrays:
  the batch is both the leading and the last axis); E = 0 (bare 17-d observations), and E = 384 (a
  384-d instruction embedding gathered and concatenated every step, as with the MiniLM table);
* **(B, 17) array**: the same rules on a batch-leading int32 state array, fields sliced as columns;
* **vmap(single)**: the same rules written for one (17,) state vector and ``vmap``-ped;
* **(17, B) array**: the same rules on a batch-last int32 state array, fields sliced as rows;
* **jit call / step**: ``step_batch`` called once per Python-loop step (how a gymnax-style user who
  does not ``scan`` drives it; dispatch-bound at small batch);
* **NumPy loop**: a reference-style single environment written here in plain Python/NumPy with the same
  rules (one env, one Python call per step, NumPy observation), timed over ``--python-steps`` steps;
* **minigrid loop**: the ``minigrid`` package's ``BabyAI-GoToLocal-v0`` (one 8 × 8 room: the same 6 × 6
  interior, with distractor objects) stepped with random actions in a Python loop (only ``step`` calls
  are timed; resets excluded), run in a separate interpreter given by ``--minigrid-python`` (a scratch
  virtualenv with ``pip install minigrid``; the column reads n/a without it).

The table is printed as markdown and written to ``results/benchmarks/babyai_env_steps.{md,json}``
(or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks as T
from imaginejax.envs.babyai.env import BabyAI, make_params
from _common import (RESULTS, Spread, add_load_arguments, alternate, check_load, fmt_ratio, fmt_spread, is_busy,
                     machine_note, timed, write_results)

ENV = BabyAI()


# ---------------------------------------------------------------------------------------------------
# JAX variants
# ---------------------------------------------------------------------------------------------------
def array_step(vec: jax.Array, t: jax.Array, done: jax.Array, goal: jax.Array, action: jax.Array,
               layout: str) -> tuple[jax.Array, ...]:
    """The environment step on an int32 state *array*: (B, 17) ("leading") or (17, B) ("last").

    Same rules as ``BabyAI.step_batch``; returns (vec, t, done, reward, obs (B, 17) float32).
    """
    rows = vec.T if layout == "last" else vec
    grid = G.from_vector(rows)
    goal_f = T.goal_fields(goal)
    active = ~done
    nxt = jax.tree.map(lambda n, o: jnp.where(active, n, o), G.step(grid, action), grid)
    t = t + active.astype(jnp.int32)
    success = T.success_grid(nxt, goal_f) & active
    reward = jnp.where(active, T.reward_grid(grid, nxt, goal_f, t), 0.0)
    truncated = active & ~success & (t >= T.MAX_STEPS)
    out = G.to_vector(nxt, jnp.int32)
    return (out.T if layout == "last" else out), t, done | success | truncated, reward, out.astype(jnp.float32)


def make_rollout(variant: str, batch: int) -> Callable:
    """A jitted ``rollout(state, actions (S, B), params) -> scalar`` for one variant (the level's tables
    are an argument, as in the engine, not constants folded into the program)."""
    keys = jnp.zeros((batch, 2), jnp.uint32)

    if variant == "ours":
        def rollout(state, actions, params):
            def body(carry, action):
                state, acc = carry
                obs, state, reward, _, _ = ENV.step_batch(keys, state, action, params)
                return (state, acc + obs.sum() + reward.sum()), None
            return jax.lax.scan(body, (state, 0.0), actions)[0][1]
        return jax.jit(rollout)

    def rollout(state, actions, params):
        goal = params.goals[state.task]
        vec = G.to_vector(state.grid, jnp.int32)
        if variant == "last":
            vec = vec.T

        def body(carry, action):
            vec, t, done, acc = carry
            if variant == "vmap":
                single = lambda v, t, d, g, a: jax.tree.map(  # noqa: E731
                    lambda x: x[0], array_step(v[None], t[None], d[None], g[None], a[None], "leading"))
                vec, t, done, reward, obs = jax.vmap(single)(vec, t, done, goal, action)
            else:
                vec, t, done, reward, obs = array_step(vec, t, done, goal, action, variant)
            return (vec, t, done, acc + obs.sum() + reward.sum()), None

        return jax.lax.scan(body, (vec, state.t, state.done, 0.0), actions)[0][3]

    return jax.jit(rollout)


def scan_contender(variant: str, params, batch: int, steps: int) -> tuple[float, Callable[[], float]]:
    """(compile seconds, a warmed contender timing one ``steps``-step scan of ``batch`` envs) of one variant."""
    keys = jax.random.split(jax.random.PRNGKey(batch), batch)
    _, state = jax.jit(lambda k: ENV.reset_to_task_batch(k, params, jnp.arange(batch) % params.num_tasks))(keys)
    actions = jax.random.randint(jax.random.PRNGKey(1), (steps, batch), 0, G.NUM_ACTIONS, jnp.int32)
    fn = make_rollout(variant, batch)
    start = time.perf_counter()
    compiled = fn.lower(state, actions, params).compile()
    compile_s = time.perf_counter() - start
    compiled(state, actions, params).block_until_ready()
    return compile_s, timed(lambda: compiled(state, actions, params).block_until_ready())


def time_scan(variant: str, params, batch: int, steps: int, repeats: int) -> tuple[float, float, float]:
    """(compile seconds, env steps/s of the best call, of the median call) of one variant, timed alone."""
    compile_s, measure = scan_contender(variant, params, batch, steps)
    best, median = Spread.of(alternate({variant: measure}, repeats)[variant]).rates(batch * steps)
    return compile_s, best, median


def call_per_step_contender(params, batch: int, steps: int) -> Callable[[], float]:
    """A warmed contender timing ``steps`` Python-loop steps, each one call of the jitted ``step_batch``."""
    keys = jax.random.split(jax.random.PRNGKey(batch), batch)
    _, state = ENV.reset_to_task_batch(keys, params, jnp.arange(batch) % params.num_tasks)
    step = jax.jit(lambda s, a, p: ENV.step_batch(keys, s, a, p))
    actions = jax.random.randint(jax.random.PRNGKey(2), (steps, batch), 0, G.NUM_ACTIONS, jnp.int32)
    jax.block_until_ready(step(state, actions[0], params))

    def run() -> None:
        current = state
        for i in range(steps):
            obs, current, reward, done, info = step(current, actions[i], params)
        jax.block_until_ready(obs)

    return timed(run)


# ---------------------------------------------------------------------------------------------------
# Reference-style single environment in plain Python / NumPy (same rules as envs/babyai/grid.py)
# ---------------------------------------------------------------------------------------------------
class NumpyBabyAI:
    """One BabyAI room stepped in Python, a NumPy observation per step (the reference's usage pattern).

    Task: "go to the <colour> ball" (success when the agent is on or next to the ball); reward as in
    ``tasks.reward`` for that task.
    """

    MOVES = {G.WEST: (-1, 0), G.EAST: (1, 0), G.NORTH: (0, -1), G.SOUTH: (0, 1)}

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.reset()

    def reset(self) -> np.ndarray:
        cells = self.rng.choice(36, 4, replace=False)
        xy = [(int(c) % 6 + 1, int(c) // 6 + 1) for c in cells]
        self.colour = [int(c) for c in self.rng.integers(0, 6, 3)]
        self.pos = [list(p) for p in xy[:3]]
        self.door = [int(self.rng.integers(0, 6)), 7, int(self.rng.integers(1, 7)), G.CLOSED]
        self.agent = list(xy[3])
        self.carried, self.carried_colour, self.t = 0, 0, 0
        return self.obs()

    def obs(self) -> np.ndarray:
        objects = [v for s in range(3) for v in (self.colour[s], *self.pos[s])]
        return np.array(objects + self.door + self.agent + [self.carried, self.carried_colour], np.float32)

    def phi(self) -> int:
        bx, by = (self.agent if self.carried == G.BALL else self.pos[0])
        return max(abs(self.agent[0] - bx) + abs(self.agent[1] - by) - 1, 0) + int(self.carried == G.BALL)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        before = self.phi()
        ax, ay = self.agent
        here = [s for s in range(3) if self.pos[s] == [ax, ay]]
        if action in self.MOVES:
            dx, dy = self.MOVES[action]
            if 1 <= ax + dx <= 6 and 1 <= ay + dy <= 6:
                self.agent = [ax + dx, ay + dy]
        elif action == G.PICKUP and self.carried == 0 and here:
            s = here[0]
            self.carried, self.carried_colour, self.pos[s] = s + 1, self.colour[s], [0, 0]
        elif action == G.DROP and self.carried and not here:
            self.pos[self.carried - 1] = [ax, ay]
            self.carried, self.carried_colour = 0, 0
        elif action == G.TOGGLE and abs(ax - 7) + abs(ay - self.door[2]) == 1:
            state = self.door[3]
            has_key = self.carried == G.KEY and self.carried_colour == self.door[0]
            if state == G.OPEN:
                self.door[3] = G.CLOSED
            elif state == G.CLOSED or has_key:
                self.door[3] = G.OPEN
        self.t += 1
        bx, by = self.pos[0]
        success = self.carried != G.BALL and abs(self.agent[0] - bx) + abs(self.agent[1] - by) <= 1
        reward = 1 - 0.9 * self.t / 128 if success else 0.1 * (before - self.phi())
        return self.obs(), reward, success, self.t >= 128, {}


def numpy_loop_contender(steps: int) -> Callable[[], float]:
    """A contender timing ``steps`` random-action steps of :class:`NumpyBabyAI` (resets included)."""
    env = NumpyBabyAI()
    actions = np.random.default_rng(1).integers(0, G.NUM_ACTIONS, steps)

    def run() -> None:
        for a in actions:
            _, _, success, truncated, _ = env.step(int(a))
            if success or truncated:
                env.reset()

    return timed(run)


MINIGRID_SCRIPT = """
import time, sys, numpy as np, gymnasium as gym, minigrid  # importing minigrid registers its environments
steps = int(sys.argv[1])
env = gym.make("BabyAI-GoToLocal-v0")
env.reset(seed=0)
acts = np.random.default_rng(1).integers(0, 6, steps)
spent = 0.0
for a in acts:
    t0 = time.perf_counter()
    _, _, term, trunc, _ = env.step(int(a))
    spent += time.perf_counter() - t0
    if term or trunc:
        env.reset()
print("RESULT", spent, minigrid.__version__)
"""


def minigrid_contender(python: str | None, steps: int) -> tuple[Callable[[], float] | None, str | None]:
    """(a contender timing ``steps`` minigrid ``step`` calls in a fresh process of ``python``, the minigrid
    version), or (None, None) without that interpreter or if its first run fails."""
    if not python or not Path(python).exists():
        return None, None

    def run() -> tuple[float, str]:
        stdout = subprocess.run([python, "-c", MINIGRID_SCRIPT, str(steps)], capture_output=True, text=True,
                                timeout=600, check=True).stdout
        out = next(line for line in stdout.splitlines() if line.startswith("RESULT ")).split()
        return float(out[1]), out[2]

    try:
        _, version = run()
    except (subprocess.SubprocessError, ValueError, IndexError, StopIteration) as err:
        print(f"minigrid baseline failed: {err}", file=sys.stderr)
        return None, None
    return (lambda: run()[0]), version


# ---------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 1024, 4096])
    parser.add_argument("--steps", type=int, default=100, help="scan length per timed call")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--python-steps", type=int, default=20000, help="steps of the Python loops")
    parser.add_argument("--minigrid-python", default=os.environ.get("MINIGRID_PYTHON", "/tmp/mgvenv/bin/python"),
                        help="interpreter of a scratch virtualenv with minigrid installed")
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_load_arguments(parser)
    args = parser.parse_args()

    load_before = check_load(args.allow_busy)
    params = make_params("train", embed=False)
    table = jax.random.normal(jax.random.PRNGKey(0), (params.instruction_embeddings.shape[0], 384))
    params_e = params.replace(instruction_embeddings=table)  # MiniLM-sized stand-in (values do not matter)
    loops = {"numpy": numpy_loop_contender(args.python_steps)}
    minigrid, minigrid_version = minigrid_contender(args.minigrid_python, args.python_steps)
    if minigrid is not None:
        loops["minigrid"] = minigrid

    rows = []
    for batch in args.batches:
        row: dict = {"batch": batch, "scan_steps": args.steps, "call_steps": min(args.steps, 200)}
        contenders = {}
        for name, variant, p in (("ours", "ours", params), ("ours_e384", "ours", params_e),
                                 ("leading", "leading", params), ("vmap", "vmap", params),
                                 ("last", "last", params)):
            row[f"{name}_compile_s"], contenders[name] = scan_contender(variant, p, batch, args.steps)
        contenders["call_per_step"] = call_per_step_contender(params, batch, row["call_steps"])
        contenders.update(loops)
        for name, seconds in alternate(contenders, args.repeats).items():
            row[f"{name}_seconds"] = seconds
        rows.append(row)
        print(f"batch {batch}: ours {batch * args.steps / Spread.of(row['ours_seconds']).median:,.0f} steps/s "
              "(median)", flush=True)

    def cell(r: dict, name: str) -> tuple[float, Spread] | None:
        if f"{name}_seconds" not in r:
            return None
        work = {"numpy": args.python_steps, "minigrid": args.python_steps,
                "call_per_step": r["batch"] * r["call_steps"]}.get(name, r["batch"] * args.steps)
        return work, Spread.of(r[f"{name}_seconds"])

    lines = [
        "| batch | ours, E=0 (compile s) | ours, E=384 | (B, 17) array | vmap(single) | (17, B) array | "
        "jit call / step | NumPy loop | minigrid loop | ours / NumPy | ours / minigrid |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {fmt_spread(*cell(r, 'ours'))} ({r['ours_compile_s']:.1f}) | "
            + "".join(f"{fmt_spread(*cell(r, name))} | " for name in ("ours_e384", "leading", "vmap", "last",
                                                                      "call_per_step", "numpy"))
            + f"{fmt_spread(*cell(r, 'minigrid')) if 'minigrid' in loops else 'n/a'} | "
            f"{fmt_ratio(cell(r, 'ours'), cell(r, 'numpy'))} | {fmt_ratio(cell(r, 'ours'), cell(r, 'minigrid'))} |")
    notes = [
        "",
        f"Env steps/s of BabyAI (train level, random actions), best / median of {args.repeats} samples per "
        "column, all columns of a batch size timed in alternation (ratios: of the best, of the medians). JAX "
        f"columns: compiled `lax.scan`s of {args.steps} steps, observations and rewards consumed. 'ours' is "
        "`BabyAI.step_batch` (17 int32 fields of shape (B,)); the array columns run the same rules on one "
        "int32 state array, batch-leading, vmapped per environment, or batch-last. 'jit call / step' calls "
        "the compiled `step_batch` once per Python step.",
        f"NumPy loop: one environment with the same rules in Python, {args.python_steps} steps. minigrid loop: "
        f"`BabyAI-GoToLocal-v0` (8 × 8 room) of minigrid {minigrid_version or 'n/a'} in its own interpreter, "
        "`step` calls only.",
        machine_note(load_before, f"jax {jax.__version__}"),
    ]
    load_after = os.getloadavg()[0]
    meta = dict(jax=jax.__version__, minigrid=minigrid_version, cpus=os.cpu_count(), load_before=load_before,
                load_after=load_after, busy=is_busy(load_before, load_after), steps=args.steps,
                repeats=args.repeats, python_steps=args.python_steps, time=time.strftime("%Y-%m-%d %H:%M:%S"))
    write_results(args.out, "babyai_env_steps", "\n".join(lines + notes), meta, rows)


if __name__ == "__main__":
    main()
