"""Gradient updates per second of every registered algorithm, against d3rlpy (PyTorch), with % of matmul peak.

    python experiments/benchmarks/algo_updates.py [--algos bc td3bc ...] [--seeds 1 8] [--updates N]
                                                  [--repeats 5] [--torch-threads 1 2] [--cpu-devices D]
                                                  [--d3rlpy-budget 20] [--no-d3rlpy] [--allow-busy]

What is measured, for every algorithm in ``imaginejax.algos.registered()`` (or ``--algos``) and both
action spaces it supports (a missing (algorithm, action space) pair is listed as skipped):

* **Shapes** (ImagineBench): continuous = HalfCheetah-like state 18 ⊕ instruction embedding 384, 6-d
  actions; discrete = CLEVR-Robot state 10 ⊕ embedding 384, 40 actions. The batch size is the
  reference's per algorithm (:data:`SETTINGS`: 256, except discrete CQL / BCQ 32 and continuous BCQ 100),
  the networks the reference's (BENCHMARK.md §4): two tanh layers of 256 over state ⊕ embedding in front
  of every network, then ReLU 256×256 (3×256 for continuous CQL; 400-300 critics / perturbation and
  750-750 VAE for continuous BCQ on the d3rlpy side). Data: random transitions in memory
  (``--dataset-size``, 64 instructions), identical shapes on both sides.
* **JAX**: ``seeds`` runs vmapped, one jitted ``lax.scan`` of N updates per call, exactly the engine's
  inner loop (``imaginejax.training``: ``sample_mixed`` a batch, ``algo.update``, interval-mean metrics),
  the state donated and carried from call to call. Compilation is excluded (one untimed call first);
  each repeat times one call (``block_until_ready``). updates/s = seeds × N / seconds (summed over seeds).
* **d3rlpy** 2.8.1 in the reference interpreter (``.venv-ref``, PyTorch CPU; ``_d3rlpy_worker.py``, a
  long-lived subprocess): d3rlpy's own training loop, ``dataset.sample_transition_batch`` then
  ``algo.update``, N updates per seed. Several seeds are several sequential runs (what a user does);
  updates/s is summed over them (total updates / total time). Building and a few warm-up updates are
  excluded. One measurement stops early after ``--d3rlpy-budget`` seconds (updates/s then counts the
  updates done; the JSON keeps both), so a very slow pair cannot stall the run. Compared: BC
  (deterministic) / DiscreteBC, TD3PlusBC, CQL / DiscreteCQL, BCQ / DiscreteBCQ, PRDC (d3rlpy 2.8 ships
  it: TD3 + an sklearn ``NearestNeighbors`` query per actor step, the reference's design). Discrete
  TD3+BC and COMBO have no d3rlpy counterpart: "no comparison".
* **Alternation and threads**: d3rlpy runs in one worker per ``--torch-threads`` setting (default 1 and 2,
  ``OMP_WAIT_POLICY=PASSIVE``); for every repeat, JAX and each d3rlpy worker are timed one after the
  other (``_common.alternate``) for each seed count, so all see the same machine load. The table gives
  the best and the median rate of each side (d3rlpy at its faster thread setting, by median) and
  ratio = JAX / d3rlpy of the best rates and of the medians.
* **Load**: the run refuses to start at a load average above the core count unless ``--allow-busy``
  is given; the table then says "busy" beside the load average before and after.
* **FLOPs and % of peak**: the matrix-multiply FLOPs of one update are counted exactly on its jaxpr
  (``matmul_peak.matmul_flops``: forward and backward dots as ``jax.grad`` wrote them, scan bodies ×
  length) and cross-checked against XLA's cost analysis of the compiled call (all FLOPs, elementwise
  included; XLA counts a loop body once, so this is one update, and loops *inside* an update — PRDC's
  chunked search, COMBO's rollouts — are undercounted there, not in the jaxpr count). GFLOP/s = matmul
  FLOPs per update × JAX's best updates/s; % of peak divides it by this CPU's float32 matmul peak, the best
  rate of large square ``jnp.dot`` s and of chained batch-256 products (``matmul_peak.py``), probed before,
  between and after the algorithms (the best counts; above 100% means the machine was busy).
* N (``--updates``): by default chosen per algorithm from its FLOPs so that one 1-seed call lasts about
  ``--target-seconds`` at 30% of peak (clipped to [1, 200]); the same N per seed on both sides.

Set-up of the reference interpreter for the d3rlpy side (d3rlpy 2.8.1 asks for torch >= 2.5 and pulls
no other torch when the pin is given; its light dependencies come along):

    .venv-ref/bin/pip install "d3rlpy==2.8.1" "torch==2.13.0"

Threads and devices: XLA uses all cores by default (one device, intra-op threads). ``--cpu-devices 2``
splits the CPU into two JAX devices and shards the seed axis over them, as the engine does on a
multi-device machine. To see whether XLA's flags matter, run the same subset under each setting, e.g.

    python experiments/benchmarks/algo_updates.py --algos bc td3bc --no-d3rlpy --out /tmp/a
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
        python experiments/benchmarks/algo_updates.py --algos bc td3bc --no-d3rlpy --out /tmp/b
    python experiments/benchmarks/algo_updates.py --algos bc td3bc --no-d3rlpy --cpu-devices 2 --out /tmp/c

On a machine shared with other busy processes, OpenMP workers that spin-wait for each other stall
d3rlpy by an order of magnitude (docs/timing.md); hence the passive wait policy and the thread
settings tried side by side. XLA's flags (e.g.
``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"``) are read from the
environment and recorded too.

Output: a markdown table printed and written with machine information to
``results/benchmarks/algo_updates.{md,json}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from imaginejax import algos
from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import DataStats, Datasets
from imaginejax.algos.networks import NetConfig
from imaginejax.data.sampling import sample_mixed
from imaginejax.data.transitions import placeholder_like
from imaginejax.data.types import Transitions
from imaginejax.training.kernel import broadcast_runs
from imaginejax.core.files import write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Spread, Worker, add_load_arguments, alternate, check_load, fastest, is_busy,  # noqa: E402
                     load_note, thread_env)
from matmul_peak import FlopCount, chained_product_rate, matmul_flops, matmul_peak, xla_flops  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "_d3rlpy_worker.py"
NUM_INSTRUCTIONS = 64


@dataclasses.dataclass(frozen=True)
class ShapeSet:
    """One benchmark shape set: the environment interface the networks see."""

    name: str
    state_dim: int
    embed_dim: int
    action_dim: int
    discrete: bool

    @property
    def spec(self) -> Spec:
        return Spec(state_dim=self.state_dim, embed_dim=self.embed_dim, discrete=self.discrete,
                    action_dim=self.action_dim)


SHAPES = (ShapeSet("continuous", 18, 384, 6, False),  # HalfCheetah-like
          ShapeSet("discrete", 10, 384, 40, True))   # CLEVR-Robot

REFERENCE_NET = NetConfig()  # tanh 256 × 2 language encoder, ReLU 256×256 head
CQL_NET = NetConfig(hidden=(256, 256, 256))


@dataclasses.dataclass(frozen=True)
class Setting:
    """Reference settings of one (algorithm, action space) pair.

    Attributes:
      batch_size: the reference's batch size.
      net: static network shapes passed to ``algos.make``.
      d3rlpy: the d3rlpy class compared against, or None (no counterpart).
      d3rlpy_nets: role -> network shapes on the d3rlpy side (roles as in ``_d3rlpy_worker.py``).
      note: what the reader needs to know about the comparison.
    """

    batch_size: int
    net: NetConfig = REFERENCE_NET
    d3rlpy: str | None = None
    d3rlpy_nets: dict[str, NetConfig] = dataclasses.field(default_factory=dict)
    note: str = ""


SETTINGS: dict[tuple[str, bool], Setting] = {
    ("bc", False): Setting(256, d3rlpy="BC (deterministic)", d3rlpy_nets={"actor": REFERENCE_NET}),
    ("bc", True): Setting(256, d3rlpy="DiscreteBC", d3rlpy_nets={"actor": REFERENCE_NET},
                          note="d3rlpy's logit penalty set to 0 (β = 0), as our BC has none"),
    ("td3bc", False): Setting(256, d3rlpy="TD3PlusBC",
                              d3rlpy_nets={"actor": REFERENCE_NET, "critic": REFERENCE_NET},
                              note="our actor loss and gradient run every update and are masked on "
                                   "odd updates (vmappable); d3rlpy computes them every 2nd update only"),
    ("td3bc", True): Setting(256, note="our extension (categorical actor); d3rlpy has no discrete TD3+BC: "
                                       "no comparison"),
    ("cql", False): Setting(256, net=CQL_NET, d3rlpy="CQL",
                            d3rlpy_nets={"actor": CQL_NET, "critic": CQL_NET},
                            note="SAC backbone, 3×256 heads, 10 action samples per source"),
    ("cql", True): Setting(32, d3rlpy="DiscreteCQL", d3rlpy_nets={"q": REFERENCE_NET},
                           note="reference batch 32"),
    ("bcq", False): Setting(100, d3rlpy="BCQ",
                            d3rlpy_nets={"actor": NetConfig(hidden=(400, 300)),
                                         "critic": NetConfig(hidden=(400, 300)),
                                         "imitator": NetConfig(hidden=(750, 750))},
                            note="reference batch 100; 10 action samples in the target"),
    ("bcq", True): Setting(32, d3rlpy="DiscreteBCQ", d3rlpy_nets={"q": REFERENCE_NET},
                           note="reference batch 32; d3rlpy shares the whole trunk (encoder + ReLU head) "
                                "between the Q and imitation outputs, ours only the language encoder, so "
                                "ours runs one more 256×256 head"),
    ("prdc", False): Setting(256, d3rlpy="PRDC", d3rlpy_nets={"actor": REFERENCE_NET, "critic": REFERENCE_NET},
                             note="d3rlpy 2.8 ships PRDC: TD3 + an sklearn NearestNeighbors query on the CPU "
                                  "at every actor step, as the reference; cost grows with --dataset-size"),
    ("prdc", True): Setting(256, note="our discrete PRDC (on discrete TD3+BC); d3rlpy's PRDC is continuous only: "
                                      "no comparison"),
    ("combo", False): Setting(256, net=CQL_NET, note="d3rlpy has no COMBO: no comparison"),
    ("combo", True): Setting(256, note="d3rlpy has no COMBO: no comparison"),
}
DEFAULT_SETTING = Setting(256, note="not in algo_updates.SETTINGS: default networks, batch 256, no comparison")


# ---------------------------------------------------------------------------------------------------
# JAX side
# ---------------------------------------------------------------------------------------------------
def random_transitions(key: jax.Array, shapes: ShapeSet, size: int) -> Transitions:
    """``size`` random transitions with ``NUM_INSTRUCTIONS`` random instruction embeddings.

    Returns Transitions with state / next_state (K, S), action (K,) int32 over all n actions or
    (K, A) uniform in [-1, 1], reward (K,), terminal (K,) (10% true terminations), instruction (K,),
    goal (K, 1) zeros, embeddings (64, E).
    """
    if size < 1:
        raise ValueError(f"--dataset-size must be >= 1, got {size}")
    k = jax.random.split(key, 7)
    s, e = shapes.state_dim, shapes.embed_dim
    if shapes.discrete:
        action = jax.random.randint(k[0], (size,), 0, shapes.action_dim, jnp.int32)
    else:
        action = jax.random.uniform(k[0], (size, shapes.action_dim), jnp.float32, -1.0, 1.0)
    return Transitions(
        state=jax.random.normal(k[1], (size, s), jnp.float32),
        action=action,
        reward=jax.random.normal(k[2], (size,), jnp.float32),
        next_state=jax.random.normal(k[3], (size, s), jnp.float32),
        terminal=(jax.random.uniform(k[4], (size,)) < 0.1).astype(jnp.float32),
        instruction=jax.random.randint(k[5], (size,), 0, NUM_INSTRUCTIONS, jnp.int32),
        goal=jnp.zeros((size, 1), jnp.float32),
        embeddings=jax.random.normal(k[6], (NUM_INSTRUCTIONS, e), jnp.float32))


def engine_step(algo: Algorithm, batch_size: int) -> Callable:
    """One update of one run as the engine's inner loop does it.

    (state, key, hp, real, imag) -> (state, key, metrics): the key is split into (next key, batch key,
    update key); the batch is ``sample_mixed(real, imag)`` at ratio 0 (``imag`` a one-row placeholder, as
    the engine passes for real-only training); the update receives both as its ``data``, as in the engine.
    """
    def step(state: Any, key: jax.Array, hp: Any, real: Transitions, imag: Transitions):
        key, batch_key, update_key = jax.random.split(key, 3)
        batch = sample_mixed(batch_key, real, imag, batch_size, jnp.float32(0.0))
        state, metrics = algo.update(state, batch, update_key, hp, Datasets.of(real, imag))
        return state, key, metrics

    return step


def scan_updates(algo: Algorithm, batch_size: int, updates: int) -> Callable:
    """All runs' N updates in one call: (carry, hp, data) -> (carry, metrics).

    carry = (state, keys) with a leading run axis R; hp too; data = (real, imag) is shared. Each run is a
    ``lax.scan`` of ``updates`` engine steps, vmapped over R; metrics are interval means (R,), as in the
    engine.
    """
    step = engine_step(algo, batch_size)

    def one_run(state: Any, key: jax.Array, hp: Any, data: tuple[Transitions, Transitions]):
        def body(carry, _):
            state, key = carry
            state, key, metrics = step(state, key, hp, *data)
            return (state, key), metrics

        (state, key), metrics = jax.lax.scan(body, (state, key), None, length=updates)
        return (state, key), jax.tree.map(lambda m: m.mean(0), metrics)

    def run(carry: tuple[Any, jax.Array], hp: Any, data: tuple[Transitions, Transitions]):
        state, keys = carry
        return jax.vmap(one_run, in_axes=(0, 0, 0, None))(state, keys, hp, data)

    return run


def trainable_params(state: Any) -> int:
    """Parameters of the online networks in a (one-run) algorithm state.

    A leaf counts when a name on its path ends in ``params`` (``params``, ``actor_params``, ...) and no
    name on it mentions a target copy or an optimiser state (``target``, ``opt``), at any depth (COMBO
    nests its agent and dynamics states).
    """
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        names = [str(getattr(k, "name", getattr(k, "key", ""))) for k in path]
        if any(n.endswith("params") for n in names) and not any("target" in n or "opt" in n for n in names):
            total += int(np.prod(np.shape(leaf)))
    return total


@dataclasses.dataclass
class JaxBench:
    """A compiled N-update call for R runs and its carried state.

    ``xla_flops``: XLA's cost analysis of the call, which counts the scan body once, i.e. one update of
    the R runs (loops inside an update are undercounted the same way; the jaxpr count is exact).
    """

    name: str
    shapes: ShapeSet
    seeds: int
    updates: int
    run: Callable
    carry: Any
    hp: Any
    data: tuple[Transitions, Transitions]
    compile_seconds: float
    xla_flops: float = float("nan")
    devices: int = 1

    def time_call(self) -> float:
        """Seconds of one call (N updates of every run); the state is carried to the next call."""
        start = time.perf_counter()
        self.carry, metrics = self.run(self.carry, self.hp, self.data)
        jax.block_until_ready((self.carry, metrics))
        return time.perf_counter() - start


def update_flops(algo: Algorithm, shapes: ShapeSet, batch_size: int, data: Transitions) -> dict[str, Any]:
    """Matmul FLOPs of one update of one run (vmapped over R = 1, as the engine runs it), from shapes only.

    Nothing is compiled or computed (the state comes from ``jax.eval_shape``); XLA's own count comes
    with the compiled benchmark call (:attr:`JaxBench.xla_flops`).

    Returns:
      matmul: exact matmul FLOPs from the jaxpr; dots: dot_general count; while_loops: loops whose body
      counted once; params: trainable parameters of the online networks.
    """
    spec = shapes.spec
    hp = broadcast_runs(algo.default_hp(spec), 1)
    keys = jax.random.split(jax.random.PRNGKey(0), 1)
    stats = jax.eval_shape(DataStats.from_transitions, data)
    state = jax.eval_shape(jax.vmap(lambda k, h: algo.init(k, spec, stats, h)), keys, hp)
    step = jax.vmap(engine_step(algo, batch_size), in_axes=(0, 0, 0, None, None))
    count: FlopCount = matmul_flops(step, state, keys, hp, data, placeholder_like(data))
    one_run = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), state)
    return {"matmul": count.flops, "dots": count.dots, "while_loops": count.while_loops,
            "params": trainable_params(one_run)}


def build_jax(name: str, shapes: ShapeSet, setting: Setting, seeds: int, updates: int,
              data: Transitions) -> JaxBench:
    """Compiles the R-run, N-update call of ``name`` and runs it once (untimed warm-up)."""
    spec = shapes.spec
    algo = algos.make(name, spec, setting.net)
    stats = DataStats.from_transitions(data)
    data = (data, placeholder_like(data))
    hp = broadcast_runs(algo.default_hp(spec), seeds)
    init_keys, run_keys = jnp.split(jax.random.split(jax.random.PRNGKey(0), 2 * seeds), 2)
    state = jax.jit(jax.vmap(lambda k, h: algo.init(k, spec, stats, h)))(init_keys, hp)
    carry = (state, run_keys)
    devices = jax.devices()
    if len(devices) > 1 and seeds % len(devices) == 0:  # the engine's layout: runs over a 1-D mesh
        mesh = Mesh(np.asarray(devices), ("runs",))
        carry, hp = jax.device_put((carry, hp), NamedSharding(mesh, P("runs")))
        data = jax.device_put(data, NamedSharding(mesh, P()))
    start = time.perf_counter()
    run = jax.jit(scan_updates(algo, setting.batch_size, updates), donate_argnums=(0,))
    compiled = run.lower(carry, hp, data).compile()
    compile_seconds = time.perf_counter() - start
    # XLA counts a while (scan) body once: the cost analysis of the N-update call is one update of R runs.
    bench = JaxBench(name, shapes, seeds, updates, compiled, carry, hp, data, compile_seconds,
                     xla_flops=xla_flops(compiled),
                     devices=len(devices) if len(devices) > 1 and seeds % len(devices) == 0 else 1)
    bench.time_call()  # first execution: allocations, page faults
    return bench


def auto_updates(matmul_per_update: float, peak: float, target_seconds: float) -> int:
    """N such that one 1-seed call lasts ≈ ``target_seconds`` at 30% of ``peak``, within [1, 200]."""
    if matmul_per_update <= 0:
        return 50
    return int(min(200, max(1, round(target_seconds * 0.3 * peak / matmul_per_update))))


# ---------------------------------------------------------------------------------------------------
# d3rlpy side (subprocess in the reference interpreter)
# ---------------------------------------------------------------------------------------------------
def reference_python() -> Path:
    """``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref/bin/python`` (may not exist)."""
    configured = os.environ.get("IMAGINEJAX_REF_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".venv-ref" / "bin" / "python"


def d3rlpy_workers(python: Path, threads: list[int]) -> dict[int, Worker]:
    """One long-lived ``_d3rlpy_worker.py`` process per thread setting (passive OpenMP workers)."""
    workers: dict[int, Worker] = {}
    try:
        for t in threads:
            workers[t] = Worker([str(python), str(WORKER)], thread_env(t), quiet=True)
            workers[t].ask({"op": "hello"})
    except (RuntimeError, json.JSONDecodeError):
        for worker in workers.values():
            worker.close()
        raise
    return workers


def net_json(net: NetConfig) -> dict[str, Any]:
    return {"encoder_width": net.encoder_width, "encoder_layers": net.encoder_layers, "hidden": list(net.hidden)}


def d3rlpy_request(name: str, shapes: ShapeSet, setting: Setting, seeds: int, updates: int,
                   dataset_size: int, warmup: int, max_seconds: float | None) -> dict[str, Any]:
    """One ``measure`` request for the worker (protocol in ``_d3rlpy_worker.py``)."""
    return {"op": "measure", "algo": name, "discrete": shapes.discrete, "state_dim": shapes.state_dim,
            "embed_dim": shapes.embed_dim, "action_dim": shapes.action_dim, "batch_size": setting.batch_size,
            "max_seconds": max_seconds,
            "dataset_size": dataset_size, "seeds": seeds, "updates": updates, "warmup": warmup,
            "nets": {role: net_json(net) for role, net in setting.d3rlpy_nets.items()}}


# ---------------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------------
def measure_pair(name: str, shapes: ShapeSet, setting: Setting, args: argparse.Namespace, peak: float,
                 data: Transitions, workers: dict[int, Worker], log: Callable[[str], None]) -> dict[str, Any]:
    """All seed counts of one (algorithm, action space) pair, JAX and each d3rlpy thread setting alternating.

    A sample is seconds per update (all seeds' updates together), so d3rlpy's budget-shortened runs
    compare at their true rate; rates are 1 / sample.
    """
    algo = algos.make(name, shapes.spec, setting.net)
    flops = update_flops(algo, shapes, setting.batch_size, data)
    updates = args.updates or auto_updates(flops["matmul"], peak, args.target_seconds)
    log(f"{name} {shapes.name}: batch {setting.batch_size}, {flops['matmul'] / 1e6:,.1f} matmul MFLOP/update, "
        f"N = {updates}")
    compare = bool(workers) and setting.d3rlpy is not None
    rows = []
    for seeds in args.seeds:
        bench = build_jax(name, shapes, setting, seeds, updates, data)
        log(f"  JAX R={seeds}: compiled in {bench.compile_seconds:.1f}s")
        d3_runs: dict[int, list[dict[str, Any]]] = {t: [] for t in workers}

        def d3rlpy_sample(threads: int) -> Callable[[], float]:
            def measure() -> float:
                run = workers[threads].ask(d3rlpy_request(name, shapes, setting, seeds, updates, args.dataset_size,
                                                          args.warmup, args.d3rlpy_budget))
                d3_runs[threads].append(run)
                return run["seconds"] / run["updates"]
            return measure

        contenders = {"jax": lambda: bench.time_call() / (seeds * updates)}
        if compare:
            contenders.update({f"d3rlpy {t}": d3rlpy_sample(t) for t in workers})
        d3_note = ""
        try:
            samples = alternate(contenders, args.repeats)
        except RuntimeError as exc:  # d3rlpy failed: time JAX alone
            d3_note = f"d3rlpy failed: {exc}"
            log(f"  {d3_note}")
            samples = alternate({"jax": contenders["jax"]}, args.repeats)
        jax_spread = Spread.of(samples["jax"])
        jax_best, jax_ups = jax_spread.rates(1.0)
        row: dict[str, Any] = {
            "algorithm": name, "action_space": shapes.name, "seeds": seeds, "batch_size": setting.batch_size,
            "updates_per_call": updates, "jax_updates_per_s": jax_ups, "jax_best_updates_per_s": jax_best,
            "jax_seconds": [s * seeds * updates for s in samples["jax"]],
            "jax_compile_seconds": bench.compile_seconds, "jax_devices": bench.devices,
            "matmul_flops_per_update": flops["matmul"],
            # a partitioned program's cost analysis is per device
            "xla_flops_per_update": bench.xla_flops * bench.devices / seeds,
            "dots_per_update": flops["dots"], "while_loops": flops["while_loops"],
            "jax_params": flops["params"],
            "gflops_per_s": flops["matmul"] * jax_best / 1e9,
            "percent_of_peak": 100.0 * flops["matmul"] * jax_best / peak,
            "d3rlpy_class": setting.d3rlpy, "d3rlpy_updates_per_s": None, "d3rlpy_best_updates_per_s": None,
            "d3rlpy_threads": None, "d3rlpy_update_only_per_s": None, "d3rlpy_params": None,
            "ratio": None, "ratio_best": None,
            "note": d3_note or setting.note,
        }
        if flops["while_loops"]:
            row["note"] += (f"{'; ' if row['note'] else ''}{flops['while_loops']} while loop(s) per update counted "
                            "once: its FLOPs are a lower bound")
        if compare and not d3_note:
            spreads = {t: Spread.of(samples[f"d3rlpy {t}"]) for t in workers}
            threads = fastest(spreads)
            runs = d3_runs[threads]
            d3_best, d3_ups = spreads[threads].rates(1.0)
            row.update(d3rlpy_updates_per_s=d3_ups, d3rlpy_best_updates_per_s=d3_best, d3rlpy_threads=threads,
                       d3rlpy_updates_per_s_by_threads={t: 1.0 / sp.median for t, sp in spreads.items()},
                       d3rlpy_update_only_per_s=statistics.median(r["updates"] / r["update_seconds"] for r in runs),
                       d3rlpy_seconds=[r["seconds"] for r in runs], d3rlpy_params=runs[0]["params"],
                       d3rlpy_updates_done=[r["updates"] for r in runs],
                       d3rlpy_updates_requested=runs[0]["requested"],
                       ratio=jax_ups / d3_ups, ratio_best=jax_best / d3_best)
        elif setting.d3rlpy is not None and not workers:
            row["note"] = "d3rlpy side not run (--no-d3rlpy or no reference interpreter)"
        rows.append(row)
        log(f"  R={seeds}: JAX {jax_best:,.1f} / {jax_ups:,.1f} updates/s (best / median, "
            f"{row['percent_of_peak']:.0f}% of peak)"
            + (f", d3rlpy ({row['d3rlpy_threads']} thr) {d3_best:,.1f} / {d3_ups:,.1f}, ratio "
               f"{row['ratio_best']:.2f} / {row['ratio']:.2f}" if row["ratio"] is not None else ""))
        del bench
    return {"rows": rows}


def peak_probes(size: int, best: dict[str, float] | None = None, repeats: int = 7) -> dict[str, float]:
    """FLOP/s of the matmul probes (squares of ``size`` and ``size // 2``, chained batch-256 products),
    each the maximum of this measurement and ``best`` (earlier ones): the peak is what the CPU delivered
    at its least disturbed moment, so probing again between algorithms only helps on a busy machine."""
    now = {f"square_{size}": matmul_peak(size, repeats), f"square_{size // 2}": matmul_peak(size // 2, 2 * repeats),
           "chained_256x408x408": chained_product_rate(repeats=repeats)}
    return {k: max(v, (best or {}).get(k, 0.0)) for k, v in now.items()}


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def render(rows: list[dict[str, Any]], skipped: list[str], meta: dict[str, Any]) -> str:
    """The markdown report: main table, network/FLOP table, notes, machine."""
    head = ("| algorithm | action space | seeds | batch | JAX updates/s (best / median) | d3rlpy updates/s "
            "(best / median) | d3rlpy threads | ratio (best / median) | GFLOP/s | % of peak |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    pair = lambda a, b, digits=1: "–" if a is None else f"{fmt(a, digits)} / {fmt(b, digits)}"  # noqa: E731
    table = head + "\n".join(
        f"| {r['algorithm']} | {r['action_space']} | {r['seeds']} | {r['batch_size']} | "
        f"{pair(r['jax_best_updates_per_s'], r['jax_updates_per_s'])} | "
        f"{pair(r['d3rlpy_best_updates_per_s'], r['d3rlpy_updates_per_s'])} | {r['d3rlpy_threads'] or '–'} | "
        f"{pair(r['ratio_best'], r['ratio'], 2)} | "
        f"{fmt(r['gflops_per_s'])} | {fmt(r['percent_of_peak'], 0)} |" for r in rows)
    per_pair = {(r["algorithm"], r["action_space"]): r for r in rows}
    detail = ("| algorithm | action space | d3rlpy class | params JAX / d3rlpy | matmul MFLOP/update | "
              "XLA MFLOP/update | N per call | d3rlpy update-only updates/s (1st seed count) | note |\n"
              "|---|---|---|---|---:|---:|---:|---:|---|\n") + "\n".join(
        f"| {a} | {s} | {r['d3rlpy_class'] or 'none'} | {r['jax_params']:,} / "
        f"{'–' if r['d3rlpy_params'] is None else format(r['d3rlpy_params'], ',')} | "
        f"{r['matmul_flops_per_update'] / 1e6:,.1f} | {fmt(r['xla_flops_per_update'] / 1e6)} | "
        f"{r['updates_per_call']} | {fmt(r['d3rlpy_update_only_per_s'])} | {r['note']} |"
        for (a, s), r in per_pair.items())
    probes = ", ".join(f"{k} {v:.0f}" for k, v in meta["peak_probes_gflops"].items())
    d3 = meta.get("d3rlpy") or {}
    lines = [table, "", detail, "",
             f"Peak: {meta['peak_gflops']:.0f} GFLOP/s float32, measured in this run (best of the probes, "
             f"GFLOP/s: {probes}). GFLOP/s and % of peak count matmul FLOPs only (exact, from the jaxpr) at "
             "JAX's best rate.", "",
             f"Best and median of {meta['args']['repeats']} alternating samples per side (JAX, then d3rlpy at "
             f"each thread setting, {', '.join(map(str, meta['args']['torch_threads']))}, OMP_WAIT_POLICY=PASSIVE; "
             "the faster by median is shown). "
             f"d3rlpy: {d3.get('d3rlpy', 'not run')}, torch {d3.get('torch', '–')}; several seeds = sequential "
             f"runs, updates/s summed. JAX {meta['jax']} on {meta['cpu']} ({meta['cores']} cores, "
             f"{len(meta['devices'])} JAX device(s)), XLA_FLAGS={meta['xla_flags'] or '(none)'}; "
             f"{load_note(meta['load_before'][0], meta['load_after'][0], meta['cores'])}; {meta['date']}."]
    if any(r["percent_of_peak"] > 100 for r in rows):
        lines += ["", "**Warning**: some rows exceed 100% of the measured peak, so the peak probes were slowed "
                      "down by other load on this machine: re-run on a quiet machine."]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(skipped) + "."]
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=None, help="default: every registered algorithm")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--updates", type=int, default=None, help="N per call (default: from the FLOPs)")
    parser.add_argument("--target-seconds", type=float, default=0.4, help="1-seed call length for automatic N")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed d3rlpy updates per built algorithm")
    parser.add_argument("--dataset-size", type=int, default=50_000)
    parser.add_argument("--peak-size", type=int, default=2048)
    parser.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2],
                        help="d3rlpy thread settings timed side by side (OMP_WAIT_POLICY=PASSIVE); the faster counts")
    parser.add_argument("--d3rlpy-budget", type=float, default=20.0,
                        help="seconds after which one d3rlpy measurement stops early (its rate stays exact)")
    parser.add_argument("--cpu-devices", type=int, default=1,
                        help="split the CPU into this many JAX devices and shard the seeds over them, as the "
                             "engine does on a multi-device machine (seed counts not divisible stay on one)")
    parser.add_argument("--no-d3rlpy", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "benchmarks")
    add_load_arguments(parser)
    args = parser.parse_args()
    if (any(s < 1 for s in args.seeds) or args.repeats < 1 or (args.updates is not None and args.updates < 1)
            or any(t < 1 for t in args.torch_threads)):
        parser.error("--seeds, --repeats, --updates and --torch-threads must be >= 1")
    check_load(args.allow_busy)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.cpu_devices > 1:  # before the backend starts (nothing has touched a device yet)
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)

    known = algos.registered()
    names = list(args.algos) if args.algos else list(known)
    skipped = [f"{n}: not registered (registered: {', '.join(known)})" for n in names if n not in known]
    names = [n for n in names if n in known]

    load_before = os.getloadavg()
    probes = peak_probes(args.peak_size)
    workers: dict[int, Worker] = {}
    d3_info: dict[str, Any] = {}
    if not args.no_d3rlpy:
        python = reference_python()
        if not python.exists():
            skipped.append(f"d3rlpy side: no reference interpreter at {python} (make setup-bench)")
        else:
            try:
                workers = d3rlpy_workers(python, args.torch_threads)
                d3_info = {t: w.ask({"op": "hello"}) for t, w in workers.items()}
                d3_info = {"d3rlpy": d3_info[args.torch_threads[0]]["d3rlpy"],
                           "torch": d3_info[args.torch_threads[0]]["torch"],
                           "torch_threads": {t: info["torch_threads"] for t, info in d3_info.items()}}
                log(f"d3rlpy {d3_info['d3rlpy']}, torch {d3_info['torch']}, threads {d3_info['torch_threads']}")
            except (RuntimeError, json.JSONDecodeError) as exc:
                skipped.append(f"d3rlpy side: worker failed to start ({exc}); install it with "
                               "`.venv-ref/bin/pip install \"d3rlpy==2.8.1\" \"torch==2.13.0\"`")
                for worker in workers.values():
                    worker.close()
                workers = {}
    peak = max(probes.values())
    rows: list[dict[str, Any]] = []
    key = jax.random.PRNGKey(0)
    try:
        for shapes in SHAPES:
            data = random_transitions(jax.random.fold_in(key, int(shapes.discrete)), shapes, args.dataset_size)
            for name in names:
                if name not in algos.registered(shapes.discrete):
                    skipped.append(f"{name} {shapes.name}: no {shapes.name}-action variant registered")
                    continue
                setting = SETTINGS.get((name, shapes.discrete), DEFAULT_SETTING)
                try:
                    rows += measure_pair(name, shapes, setting, args, peak, data, workers, log)["rows"]
                except Exception as exc:  # one broken algorithm must not lose the others' numbers
                    skipped.append(f"{name} {shapes.name}: failed ({type(exc).__name__}: {exc})")
                    log(f"{name} {shapes.name} failed: {exc!r}")
                probes = peak_probes(args.peak_size, probes, repeats=3)
                peak = max(probes.values())
    finally:
        for worker in workers.values():
            worker.close()
    probes = peak_probes(args.peak_size, probes)
    peak_final = max(probes.values())
    for r in rows:  # the best peak seen over the whole run
        r["percent_of_peak"] = 100.0 * r["gflops_per_s"] * 1e9 / peak_final
    load_after = os.getloadavg()
    meta = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()], "cpu": cpu_name(),
            "cores": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "peak_gflops": peak_final / 1e9,
            "peak_probes_gflops": {k: v / 1e9 for k, v in probes.items()}, "d3rlpy": d3_info,
            "load_before": load_before, "load_after": load_after,
            "busy": is_busy(load_before[0], load_after[0]),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    report = render(rows, skipped, meta)
    print("\n" + report)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "algo_updates.md", report + "\n")
    write_text(args.out / "algo_updates.json",
               json.dumps({"meta": meta, "rows": rows, "skipped": skipped}, indent=2, default=float))


if __name__ == "__main__":
    main()
