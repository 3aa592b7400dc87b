"""Meta-World on MJX: what the MJX-friendly models cost and change, and MJX against MuJoCo C, per scene.

    python experiments/benchmarks/metaworld_mjx.py effect [--tasks reach push ...] [--episodes 2]
    python experiments/benchmarks/metaworld_mjx.py speed  [--tasks reach ...] [--batches 1 256 1024] [--steps 3]
                                                          [--chunk 16] [--reference-python .venv-metaworld/bin/python]
    python experiments/benchmarks/metaworld_mjx.py parity [--tasks reach ...] [--horizon 20] [--dtype float64]

``effect`` — the substitutions of :mod:`imaginejax.envs.metaworld.mjx_model` measured on MuJoCo C (no MJX
involved): for each task and episode (reset vector drawn from a fixed key), the scripted expert
(:func:`imaginejax.envs.metaworld.expert.expert_action`) runs closed loop on Meta-World's models; its
action sequence is replayed open loop on the MJX-friendly models from the same reset vector. Reported:
hand and object position difference (m) between the two after 10 steps, 50 steps and at most over the
100 steps, and the expert's closed-loop success on both models.

``speed`` — per task: MJX compile time of one jitted environment step (5 MuJoCo steps + observables),
candidate geom pairs and the static contact count ``ncon`` of the MJX model, and environment steps/s at each
batch size of MJX (``jit(MjxPhysics.step)``, rows of the one task) against MuJoCo C on the same
MJX-friendly models (``MetaWorldHost.step64``, all threads, at least 20 steps) and against the alternative a
user would pick, the ``metaworld`` package's env of the task in a Python loop (500 random-action steps per sample
in a worker of the reference interpreter ``--reference-python``, metaworld 3.1.1 on its pinned MuJoCo), in the
same run: MuJoCo C and that loop alternate ``--repeats`` times per batch size (median rates; best ones in the
``*_best`` columns), MJX is timed once (it is orders of magnitude slower on a CPU); the ``*_ratio`` columns
are env steps/s over the loop's median. ``speed`` refuses to start at a load average above the core count
unless ``--allow-busy`` (the JSON then says busy). Also MuJoCo C's active contacts on the reset state. Each MJX
measurement runs at most ``--steps`` steps (and is skipped past ``--budget`` s of estimated time); ``--chunk``
bounds the rows MJX simulates together (:class:`~imaginejax.envs.metaworld.mjx_backend.MjxPhysics`). Run
under ``timeout``: MJX on a CPU compiles for minutes and steps slowly (ARCHITECTURE.md, "Measured").

``parity`` — per task, MJX against MuJoCo C on the same MJX-friendly model: the reset in MJX
(:meth:`MjxPhysics.reset`) against MuJoCo C's (``reset64``) from the same reset vector, then the scripted expert
closed loop on MJX for ``--horizon`` steps and its actions replayed on MuJoCo C from the MJX reset state.
Reported: the largest hand / object position difference (m) after the reset, at step 10 and over the horizon,
the largest arm-joint difference after the reset (rad), MJX compile time, and whether the expert's episode
succeeded on each backend within the horizon. One compiled kernel per task serves its reset and its steps.

All modes write markdown and JSON to ``results/benchmarks/metaworld_mjx_{effect,speed}.{md,json}`` (or ``--out``).
Measurements: ``docs/metaworld_mjx.md``.
Wall-clock numbers: run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.metaworld import mjx_model, scenes, tasks
from imaginejax.envs.metaworld.host import CONTROL_SPEC, get_host
from imaginejax.envs.mujoco_host import FULLPHYSICS
from _common import Spread, add_load_arguments, alternate, check_load, is_busy, timed

REPO_ROOT = Path(__file__).resolve().parents[2]
ALL_TASKS = tuple(t.name for t in tasks.TASKS)
C_STEPS = 20  # MuJoCo C steps per measurement (at least)
REFERENCE_STEPS = 500  # steps of the metaworld package's env per measurement


def _rand(task: int, seed: int) -> np.ndarray:
    """(RAND_DIM,) a reset vector in the task's reset space (Meta-World's rejection rule applied)."""
    rng = np.random.default_rng(seed)
    for _ in range(1000):
        r = tasks.RAND_LOW[task] + rng.random(tasks.RAND_DIM) * (tasks.RAND_HIGH[task] - tasks.RAND_LOW[task])
        if np.linalg.norm(r[0:2] - r[3:5]) >= tasks.MIN_XY_GAP[task]:
            return r
    raise RuntimeError("no reset vector passed the rejection rule")


@jax.jit
def _observe(sensors: jax.Array, consts: jax.Array, task: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(1, 39) sensors, (1, CONST_DIM) constants, (1,) task → the expert's (1, 4) action and (1,) success."""
    from imaginejax.envs.metaworld.expert import expert_action

    vec = tasks.state_from_sensors(sensors, task, consts[:, 0:3])
    extras = tasks.extras_from_sensors(sensors, consts)
    return expert_action(vec, task), tasks.success_from(vec, task, extras)


def _closed_loop(host, task: int, rand: np.ndarray, steps: int = tasks.MAX_STEPS):
    """Expert episode on ``host``'s models: actions (T, 4), sensors (T, 39), success flag."""
    out = host.reset64(np.array([task]), rand[None])
    state, control, consts, sensors = out["state"], out["control"], out["consts"], out["sensors"]
    consts32, tid = jnp.asarray(consts, jnp.float32), jnp.asarray([task])
    actions, trace, success = [], [], False
    action, _ = _observe(jnp.asarray(sensors, jnp.float32), consts32, tid)
    for _ in range(steps):
        action = np.asarray(action, np.float32)
        state, control, sensors = host.step64(state, control, action, np.array([task]))
        actions.append(action[0])
        trace.append(sensors[0])
        action, done = _observe(jnp.asarray(sensors, jnp.float32), consts32, tid)
        if bool(done[0]):
            success = True
            break
    return np.array(actions), np.array(trace), success


def _open_loop(host, task: int, rand: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Sensors (T, 39) of ``actions`` replayed on ``host``'s models from the reset of ``rand``."""
    out = host.reset64(np.array([task]), rand[None])
    state, control = out["state"], out["control"]
    trace = []
    for a in actions:
        state, control, sensors = host.step64(state, control, a[None], np.array([task]))
        trace.append(sensors[0])
    return np.array(trace)


def effect(names: tuple[str, ...], episodes: int) -> list[dict]:
    """Rows of the ``effect`` table (see the module docstring)."""
    original, friendly = get_host(), get_host(mjx_friendly=True)
    sl = scenes.sensor_slices()
    rows = []
    for name in names:
        k = tasks.TASK_INDEX[name]
        d_hand, d_obj, ok_orig, ok_mjx = {10: [], 50: [], "max": []}, {10: [], 50: [], "max": []}, 0, 0
        for ep in range(episodes):
            rand = _rand(k, 1000 * k + ep)
            actions, trace, success = _closed_loop(original, k, rand)
            ok_orig += success
            ok_mjx += _closed_loop(friendly, k, rand)[2]
            replay = _open_loop(friendly, k, rand, actions)
            hand = np.linalg.norm(trace[:, sl["hand"]] - replay[:, sl["hand"]], axis=-1)
            obj = np.linalg.norm(trace[:, sl["obj"]] - replay[:, sl["obj"]], axis=-1)
            for store, dist in ((d_hand, hand), (d_obj, obj)):
                for t in (10, 50):
                    store[t].append(dist[min(t, len(dist)) - 1])
                store["max"].append(dist.max())
        m0 = scenes.build_model(tasks.TASKS[k].scene)
        m1 = scenes.build_model(tasks.TASKS[k].scene, mjx_friendly=True)
        rows.append({"task": name, "pairs_original": mjx_model.candidate_pairs(m0),
                     "pairs_mjx": mjx_model.candidate_pairs(m1),
                     **{f"hand_{t}": float(np.max(v)) for t, v in d_hand.items()},
                     **{f"obj_{t}": float(np.max(v)) for t, v in d_obj.items()},
                     "success_original": ok_orig / episodes, "success_mjx_model": ok_mjx / episodes})
        print(rows[-1], flush=True)
    return rows


def reference_contender(worker) -> Callable[[], float]:
    """A contender timing ``REFERENCE_STEPS`` steps of the metaworld worker's environment."""
    return lambda: worker.ask({"op": "time", "steps": REFERENCE_STEPS})["seconds"]


def speed(names: tuple[str, ...], batches: tuple[int, ...], steps: int, budget: float, chunk: int | None,
          reference_python: Path, repeats: int = 3) -> list[dict]:
    """Rows of the ``speed`` table (see the module docstring): MuJoCo C and the metaworld loop alternate
    ``repeats`` times per batch size (median rates, best ones in ``*_best``); MJX, far slower, is timed once."""
    import mujoco
    from mujoco import mjx

    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics
    from metaworld_env_steps import reference_worker

    host = get_host(mjx_friendly=True)
    rows = []
    for name in names:
        k = tasks.TASK_INDEX[name]
        physics = MjxPhysics(host, (name,), chunk=chunk)
        ncon = int(mjx.make_data(physics.mjx_models[0])._impl.contact.dist.shape[0])
        step = jax.jit(physics.step)
        started = reference_worker(reference_python, (name,))
        ref_seconds: list[float] = []
        out = host.reset64(np.array([k]), _rand(k, 0)[None])
        m = physics.models[0]
        d = mujoco.MjData(m)  # MuJoCo C's active contacts on the reset state (fixtures at their mocap poses)
        mujoco.mj_setState(m, d, out["state"][0, : host.stepper.state_sizes[k]], FULLPHYSICS)
        mujoco.mj_setState(m, d, out["control"][0, : host.stepper.control_sizes[k]], CONTROL_SPEC)
        mujoco.mj_forward(m, d)
        row = {"task": name, "pairs": mjx_model.candidate_pairs(m), "ncon": ncon, "active_contacts_reset": int(d.ncon),
               "chunk": chunk}
        per_row_s = None
        for b in batches:
            out = host.reset64(np.full(b, k), np.stack([_rand(k, i) for i in range(b)]))
            c_steps = max(steps, C_STEPS)  # MuJoCo C is cheap: more steps for a steadier number
            actions = np.random.default_rng(0).uniform(-1, 1, (c_steps, b, 4)).astype(np.float32)
            task = np.full(b, k)
            host.step64(out["state"], out["control"], actions[0], task)  # warm-up

            def run_c() -> None:
                state, control = out["state"], out["control"]
                for a in actions:
                    state, control, _ = host.step64(state, control, a, task)

            contenders = {"mujoco": timed(run_c)}
            if started is not None:
                contenders["metaworld"] = reference_contender(started[0])
            samples = alternate(contenders, repeats)
            ref_seconds += samples.get("metaworld", [])
            row[f"mujoco_b{b}_best"], row[f"mujoco_b{b}"] = Spread.of(samples["mujoco"]).rates(b * c_steps)
            actions = actions[:steps]
            if per_row_s is not None and per_row_s * b * steps > budget:
                row[f"mjx_b{b}"] = None  # estimated past the budget
                continue
            p, c = jnp.asarray(out["state"], jnp.float32), jnp.asarray(out["control"], jnp.float32)
            tk, act = jnp.asarray(task), jnp.ones(b, bool)
            t0 = time.perf_counter()
            compiled = step.lower(p, c, jnp.asarray(actions[0]), tk, act).compile()  # called directly: no
            row[f"compile_b{b}_s"] = time.perf_counter() - t0                      # second compile, no warm-up
            t0 = time.perf_counter()
            for a in actions:
                p, c, s = compiled(p, c, jnp.asarray(a), tk, act)
            jax.block_until_ready(s)
            elapsed = time.perf_counter() - t0
            row[f"mjx_b{b}"] = b * steps / elapsed
            per_row_s = elapsed / (b * steps)
        if started is not None:
            if not ref_seconds:  # no batch sizes: the loop alone
                ref_seconds = alternate({"metaworld": reference_contender(started[0])}, repeats)["metaworld"]
            started[0].close()
            row["metaworld_loop_best"], row["metaworld_loop"] = Spread.of(ref_seconds).rates(REFERENCE_STEPS)
        if row.get("metaworld_loop"):
            for b in batches:
                for backend in ("mujoco", "mjx"):
                    if row.get(f"{backend}_b{b}") is not None:
                        row[f"{backend}_b{b}_ratio"] = row[f"{backend}_b{b}"] / row["metaworld_loop"]
        rows.append(row)
        print(row, flush=True)
    return rows


def parity(names: tuple[str, ...], horizon: int, dtype: str = "float32") -> list[dict]:
    """Rows of the ``parity`` table (see the module docstring); ``dtype`` the MJX precision."""
    from imaginejax.envs.metaworld.mjx_backend import MjxPhysics

    host = get_host(mjx_friendly=True)
    sl = scenes.sensor_slices()
    rows = []
    for name in names:
        k = tasks.TASK_INDEX[name]
        physics = MjxPhysics(host, (name,), dtype=jnp.dtype(dtype))
        rand = _rand(k, 1000 * k)
        tk = jnp.asarray([k])
        t0 = time.perf_counter()
        p, c, consts, sensors = jax.block_until_ready(physics.reset(tk, jnp.asarray(rand[None], dtype)))
        reset_s = time.perf_counter() - t0  # compile + 250 steps
        want = host.reset64(np.array([k]), rand[None])
        qpos = host.state_layouts[k]["qpos"]
        row = {"task": name, "reset_compile_run_s": reset_s,
               "reset_hand": float(np.abs(np.asarray(sensors)[0, sl["hand"]] - want["sensors"][0, sl["hand"]]).max()),
               "reset_obj": float(np.abs(np.asarray(sensors)[0, sl["obj"]] - want["sensors"][0, sl["obj"]]).max()),
               "reset_consts": float(np.abs(np.asarray(consts)[0] - want["consts"][0]).max()),
               "reset_arm_rad": float(np.abs(np.asarray(p)[0, qpos][:7] - want["state"][0, qpos][:7]).max())}
        c_state, c_control = np.asarray(p, np.float64), np.asarray(c, np.float64)
        consts = jnp.asarray(consts, jnp.float32)  # the expert runs in float32 whatever the MJX precision
        action, done = _observe(jnp.asarray(sensors, jnp.float32), consts, tk)
        d_hand, d_obj, ok_mjx, ok_c = [], [], False, False
        for t in range(horizon):
            a = np.asarray(action, np.float32)
            p, c, sensors = physics.step(p, c, jnp.asarray(a, dtype), tk, jnp.ones(1, bool))
            c_state, c_control, c_sensors = host.step64(c_state, c_control, a, np.array([k]))
            got = np.asarray(sensors)
            d_hand.append(float(np.abs(got[0, sl["hand"]] - c_sensors[0, sl["hand"]]).max()))
            d_obj.append(float(np.abs(got[0, sl["obj"]] - c_sensors[0, sl["obj"]]).max()))
            ok_c |= bool(_observe(jnp.asarray(c_sensors, jnp.float32), consts, tk)[1][0])
            action, done = _observe(jnp.asarray(sensors, jnp.float32), consts, tk)
            ok_mjx |= bool(done[0])
        row.update({"hand_10": d_hand[min(10, horizon) - 1], "hand_max": max(d_hand),
                    "obj_10": d_obj[min(10, horizon) - 1], "obj_max": max(d_obj),
                    "success_mjx": ok_mjx, "success_mujoco": ok_c})
        rows.append(row)
        print(row, flush=True)
    return rows


def _table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: "—" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("effect", "speed", "parity"))
    parser.add_argument("--tasks", nargs="+", default=list(ALL_TASKS), choices=ALL_TASKS)
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 256, 1024],
                        help="speed: batch sizes (none: only the contact counts and the metaworld loop)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--horizon", type=int, default=20, help="parity: environment steps after the reset")
    parser.add_argument("--budget", type=float, default=300.0, help="skip an MJX batch estimated to take longer (s)")
    parser.add_argument("--chunk", type=int, default=None,
                        help="speed: rows the MJX kernel simulates together (MjxPhysics chunk; default all)")
    parser.add_argument("--reference-python", type=Path,
                        default=Path(os.environ.get("IMAGINEJAX_METAWORLD_PYTHON", REPO_ROOT / ".venv-metaworld/bin/python")),
                        help="speed: interpreter with the metaworld package (its env in a Python loop is the baseline)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="parity: MJX precision (float64 enables jax_enable_x64: it separates float32 rounding "
                             "from differences of MJX's algorithms)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="speed: alternating samples of MuJoCo C and the metaworld loop per batch size")
    parser.add_argument("--out", type=Path, default=None)
    add_load_arguments(parser)
    args = parser.parse_args()
    load_before = check_load(args.allow_busy) if args.mode == "speed" else os.getloadavg()[0]
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    names = tuple(args.tasks)
    if args.mode == "effect":
        rows = effect(names, args.episodes)
    elif args.mode == "speed":
        rows = speed(names, tuple(args.batches), args.steps, args.budget, args.chunk, args.reference_python,
                     args.repeats)
    else:
        rows = parity(names, args.horizon, args.dtype)
    conditions = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                  "jax": jax.__version__, "backend": jax.default_backend(), "argv": os.sys.argv[1:],
                  "load_before": load_before, "load_after": os.getloadavg()[0],
                  "busy": is_busy(load_before, os.getloadavg()[0])}
    out = args.out or REPO_ROOT / "results" / "benchmarks" / f"metaworld_mjx_{args.mode}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"conditions": conditions, "rows": rows}, indent=1))
    table = _table(rows)
    out.with_suffix(".md").write_text(f"{table}\n\nconditions: {conditions}\n")
    print(table)


if __name__ == "__main__":
    main()
