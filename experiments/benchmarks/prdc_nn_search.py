"""PRDC's in-graph nearest-neighbour search: cost per update against dataset size, and the approximation.

    python experiments/benchmarks/prdc_nn_search.py [--sizes 10000 100000 1000000] [--batch 256]
        [--subsets 10000 100000] [--repeats 5] [--kdtree-max 100000]

Shapes of language-conditioned HalfCheetah (BENCHMARK.md §2.5): 18-d state, 6-d action, 384-d
instruction embeddings (MiniLM width; random unit vectors here) for 4 instructions. The data are
synthetic trajectories of 200 steps (a random walk in state space, actions a smooth function of the
state plus noise), so that states have the local structure of real rollouts. Queries are a batch of B
dataset rows with the policy's action taken as the data action plus N(0, 0.1²) noise (a policy near the
data, as PRDC's regulariser keeps it). β = 2, states normalised with the data's statistics.

For each dataset size K, measured in the same process, every timed call below after one compiling call, all
jitted, results blocked on, and all of them timed in alternation (``_common.alternate``) ``--repeats``
times (best and median wall time, median process CPU time):

* ``search``: the exact chunked search alone (:func:`imaginejax.algos.neighbors.nearest_neighbor`);
* ``PRDC update``: one full continuous PRDC update (TD3+BC networks 256×256, the search included);
* ``TD3+BC update``: one TD3+BC update at the same shapes — the cost PRDC adds to;
* ``KD-tree`` (K ≤ ``--kdtree-max``, needs scipy): the reference's approach, a host ``scipy`` cKDTree over
  the same joint keys (β·obs ⊕ a, 408-d, as the reference builds it on observations that hold the
  embedding), its build time once and its query time for one batch;
* for each ``--subsets`` m < K: the approximate search over m random rows per update, alone and with the
  batch's own rows as extra candidates (what PRDC's ``subset`` option does) — its time, its recall
  (fraction of queries for which it returns a row at the exact neighbour's distance, over 8 batches) and
  the mean ratio of its neighbour's distance to the exact one.

Prints a markdown table and writes ``results/benchmarks/prdc_nn_search.{md,json}``. The run refuses to start
at a load average above the core count unless ``--allow-busy`` (the table then says busy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.algos.base import Spec
from imaginejax.algos.common import DataStats, Datasets
from imaginejax.algos.neighbors import DEFAULT_CHUNK, nearest_neighbor, rows_as_buffer
from imaginejax.algos.prdc import make_prdc
from imaginejax.algos.td3bc import make_td3bc
from imaginejax.data.transitions import placeholder_like
from imaginejax.data.types import Batch, Transitions

from _common import REPO_ROOT, Spread, add_load_arguments, alternate, check_load, is_busy, load_note

S, A, E, M, T = 18, 6, 384, 4, 200
BETA = 2.0


def synthetic_transitions(num: int, seed: int = 0) -> Transitions:
    """``num`` transitions from ⌈num / 200⌉ random-walk trajectories (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_traj = -(-num // T)
    start = rng.normal(size=(n_traj, 1, S)).astype(np.float32)
    walk = start + np.cumsum(0.1 * rng.normal(size=(n_traj, T + 1, S)).astype(np.float32), axis=1)
    states, next_states = walk[:, :-1].reshape(-1, S)[:num], walk[:, 1:].reshape(-1, S)[:num]
    mix = rng.normal(size=(S, A)).astype(np.float32) / np.sqrt(S)
    actions = np.clip(np.tanh(states @ mix) + 0.3 * rng.normal(size=(num, A)), -1, 1).astype(np.float32)
    table = rng.normal(size=(M, E)).astype(np.float32)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    instruction = np.repeat(rng.integers(0, M, n_traj), T)[:num].astype(np.int32)
    return Transitions(state=jnp.asarray(states), action=jnp.asarray(actions),
                       reward=jnp.asarray(rng.normal(size=num).astype(np.float32)), next_state=jnp.asarray(next_states),
                       terminal=jnp.zeros((num,), jnp.float32), instruction=jnp.asarray(instruction),
                       goal=jnp.zeros((num, 1), jnp.float32), embeddings=jnp.asarray(table))


def batch_of(data: Transitions, key: jax.Array, size: int) -> Batch:
    rows = jax.random.randint(key, (size,), 0, data.state.shape[0])
    return Batch(state=data.state[rows], embedding=data.embeddings[data.instruction[rows]], action=data.action[rows],
                 reward=data.reward[rows], next_state=data.next_state[rows], terminal=data.terminal[rows],
                 imaginary=jnp.zeros((size,), bool))


def policy_actions(batch: Batch, key: jax.Array, sigma: float = 0.1) -> jax.Array:
    """The queries' policy actions: the data action plus N(0, σ²) noise, clipped to [−1, 1]."""
    return jnp.clip(batch.action + sigma * jax.random.normal(key, batch.action.shape), -1.0, 1.0)


def contender(fn: Callable, *args, cpu: list[float]) -> Callable[[], float]:
    """A contender timing one call of ``fn(*args)`` (after one warm-up, compiling call, made now): it returns
    the wall seconds and appends the process CPU seconds to ``cpu``.

    On a busy machine the wall time is inflated by other processes; the CPU time is not (it counts all of
    this process's threads, so on an idle 2-core machine wall ≈ CPU / 1–2)."""
    jax.block_until_ready(fn(*args))

    def measure() -> float:
        wall, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        cpu.append(time.process_time() - start_cpu)
        return time.perf_counter() - wall

    return measure


def timed(fn: Callable, *args, repeats: int) -> tuple[float, float]:
    """Median (wall, process CPU) seconds of ``repeats`` calls of ``fn(*args)`` after a warm-up, timed alone."""
    cpu: list[float] = []
    walls = alternate({"fn": contender(fn, *args, cpu=cpu)}, repeats)["fn"]
    return statistics.median(walls), statistics.median(cpu)


def record(row: dict, name: str, walls: list[float], cpus: list[float]) -> None:
    spread = Spread.of(walls)
    row[f"{name}_best_ms"], row[f"{name}_ms"] = 1e3 * spread.min, 1e3 * spread.median
    row[f"{name}_cpu_ms"] = 1e3 * statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--subsets", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--policy-noise", type=float, nargs="+", default=[0.1, 0.5],
                        help="σ of the queries' actions around the data action, for the recall measurements")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kdtree-max", type=int, default=100_000, help="largest K for the scipy KD-tree (0: skip)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks")
    add_load_arguments(parser)
    args = parser.parse_args()
    load_before = check_load(args.allow_busy)

    spec = Spec(state_dim=S, embed_dim=E, discrete=False, action_dim=A)
    prdc, td3bc = make_prdc(spec, chunk=args.chunk), make_td3bc(spec)
    prdc_update, td3bc_update = jax.jit(prdc.update), jax.jit(td3bc.update)
    rows = []
    for k in args.sizes:
        real = synthetic_transitions(k)
        norm = DataStats.from_transitions(real)
        data = Datasets.of(real, placeholder_like(real))
        batch = batch_of(real, jax.random.PRNGKey(1), args.batch)
        query = policy_actions(batch, jax.random.PRNGKey(2))

        def search(batch, query, data, norm, key, subset=None, with_batch=False):
            candidates = ((rows_as_buffer(batch.state, batch.embedding, batch.action), batch.imaginary)
                          if with_batch else None)
            return nearest_neighbor(batch.state, batch.embedding, query, data, norm, jnp.float32(BETA),
                                    chunk=args.chunk, use_imag=False, subset=subset, key=key, candidates=candidates)

        exact = jax.jit(search)
        row = {"K": k}
        cpus: dict[str, list[float]] = {}
        contenders = {}

        def add(name: str, fn: Callable, *fn_args) -> None:
            cpus[name] = []
            contenders[name] = contender(fn, *fn_args, cpu=cpus[name])

        add("search", exact, batch, query, data, norm, None)
        hp = prdc.default_hp(spec)
        add("prdc_update", prdc_update, prdc.init(jax.random.PRNGKey(0), spec, norm, hp), batch,
            jax.random.PRNGKey(3), hp, data)
        hp_td3 = td3bc.default_hp(spec)
        add("td3bc_update", td3bc_update, td3bc.init(jax.random.PRNGKey(0), spec, norm, hp_td3), batch,
            jax.random.PRNGKey(3), hp_td3, data)
        if 0 < k <= args.kdtree_max:
            tree = kdtree(real, norm, batch, query)
            if tree is not None:
                row["kdtree_build_s"] = tree[0]
                add("kdtree_query", tree[1])
        row["subsets"] = []
        for m in args.subsets:
            if m >= k:
                continue
            for with_batch in (False, True):
                approx = jax.jit(lambda b, q, d, n, key, m=m, w=with_batch: search(b, q, d, n, key, m, w))
                entry = {"m": m, "with_batch": with_batch}
                add(f"subset_{m}_{with_batch}", approx, batch, query, data, norm, jax.random.PRNGKey(4))
                for sigma in args.policy_noise:
                    hits, ratios = [], []
                    for i in range(8):  # recall over 8 batches of B queries
                        b = batch_of(real, jax.random.PRNGKey(100 + i), args.batch)
                        q = policy_actions(b, jax.random.PRNGKey(200 + i), sigma)
                        truth = exact(b, q, data, norm, None)
                        found = approx(b, q, data, norm, jax.random.PRNGKey(300 + i))
                        d_true, d_found = np.asarray(truth.distance), np.asarray(found.distance)
                        hits.append(d_found <= d_true * (1 + 1e-5) + 1e-7)  # the exact neighbour (or a tie)
                        ratios.append(d_found[d_true > 0] / d_true[d_true > 0])
                    entry[f"recall_{sigma}"] = float(np.concatenate(hits).mean())
                    entry[f"distance_ratio_{sigma}"] = float(np.concatenate(ratios).mean())
                row["subsets"].append(entry)
        walls = alternate(contenders, args.repeats)
        for name in ("search", "prdc_update", "td3bc_update", "kdtree_query"):
            if name in walls:
                record(row, name, walls[name], cpus[name])
        for entry in row["subsets"]:
            name = f"subset_{entry['m']}_{entry['with_batch']}"
            record(entry, "search", walls[name], cpus[name])
        rows.append(row)
        print(json.dumps(row), flush=True)

    both = lambda r, name: f"{r[name + '_best_ms']:.1f} / {r[name + '_ms']:.1f} ({r[name + '_cpu_ms']:.1f})"  # noqa: E731
    table = ["| K | exact search (ms) | PRDC update (ms) | TD3+BC update (ms) | KD-tree build (s) / query (ms, best / "
             "median) |", "|---:|---:|---:|---:|---:|"]
    for r in rows:
        kd = (f"{r['kdtree_build_s']:.1f} / {r['kdtree_query_best_ms']:.0f} / {r['kdtree_query_ms']:.0f}"
              if "kdtree_query_ms" in r else "—")
        table.append(f"| {r['K']:,} | {both(r, 'search')} | {both(r, 'prdc_update')} | {both(r, 'td3bc_update')} "
                     f"| {kd} |")
    noise = args.policy_noise
    table += ["", "| K | approximate search | time (ms) | "
              + " | ".join(f"recall σ={s} | distance ratio σ={s}" for s in noise) + " |",
              "|---:|---|---:|" + "---:|" * (2 * len(noise))]
    for r in rows:
        for e in r["subsets"]:
            cells = " | ".join(f"{100 * e[f'recall_{s}']:.1f} % | {e[f'distance_ratio_{s}']:.2f}" for s in noise)
            table.append(f"| {r['K']:,} | m = {e['m']:,} random rows{' + the batch' if e['with_batch'] else ''} | "
                         f"{both(e, 'search')} | {cells} |")
    load_after = os.getloadavg()[0]
    table.append(f"\nTimes: best / median wall milliseconds of {args.repeats} alternating calls (median process CPU "
                 "milliseconds, all threads) per call. Recall: "
                 "fraction of queries given a row at the exact neighbour's distance; distance ratio: mean "
                 "d(found) / d(exact). σ: the policy's distance from the data action. "
                 f"{os.cpu_count()} CPUs, {load_note(load_before, load_after)}.")
    table = "\n".join(table)
    meta = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()], "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after,
            "busy": is_busy(load_before, load_after),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "shapes": {"S": S, "A": A, "E": E, "M": M, "beta": BETA},
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print("\n" + table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prdc_nn_search.md").write_text(table + "\n", encoding="utf-8")
    (args.out / "prdc_nn_search.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2), encoding="utf-8")


def kdtree(real: Transitions, norm: DataStats, batch: Batch, query: jax.Array
           ) -> tuple[float, Callable[[], object]] | None:
    """The reference's host KD-tree over the joint keys (β·obs ⊕ a): (build seconds, a call querying it for
    the batch), or None without scipy."""
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        return None
    obs = np.concatenate([np.asarray(norm(real.state)), np.asarray(real.embeddings)[np.asarray(real.instruction)]], -1)
    keys = np.concatenate([BETA * obs, np.asarray(real.action)], -1)
    start = time.perf_counter()
    tree = cKDTree(keys)
    build = time.perf_counter() - start
    q_obs = np.concatenate([np.asarray(norm(batch.state)), np.asarray(batch.embedding)], -1)
    q = np.concatenate([BETA * q_obs, np.asarray(query)], -1)
    return build, lambda: tree.query(q, k=1)

if __name__ == "__main__":
    main()
