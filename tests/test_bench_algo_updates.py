"""The JAX side of experiments/benchmarks/algo_updates.py: FLOP counting and a tiny smoke run.

The FLOP counts are checked against hand-computed dense-layer counts: a layer y = x W (+ b) of
shape (d_in, d_out) at batch B costs 2·B·d_in·d_out FLOPs forward, the same again for its weight
gradient xᵀ·δ and, unless x is the network input (which needs no gradient), once more for the input
gradient δ·Wᵀ. No timing is asserted (performance lives in the benchmark script).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax import algos
from imaginejax.algos.networks import NetConfig

BENCH_DIR = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"


def _load(name: str):
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


matmul_peak = _load("matmul_peak")
algo_updates = _load("algo_updates")


def hand_mlp_update_flops(dims: list[int], batch: int) -> int:
    """Forward + backward matmul FLOPs of an MLP with layer widths ``dims`` (input first), params-only grad."""
    layers = list(zip(dims[:-1], dims[1:]))
    forward = sum(2 * batch * i * o for i, o in layers)
    weight_grads = forward
    input_grads = sum(2 * batch * i * o for i, o in layers[1:])  # the first layer's input needs none
    return forward + weight_grads + input_grads


class _MLP(nn.Module):
    widths: tuple[int, ...]

    @nn.compact
    def __call__(self, x):
        for w in self.widths[:-1]:
            x = jnp.tanh(nn.Dense(w)(x))
        return nn.Dense(self.widths[-1])(x)


def test_matmul_flops_of_an_mlp_gradient_match_the_hand_count():
    dims, batch = [402, 256, 128, 6], 64
    model = _MLP(tuple(dims[1:]))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, dims[0])))
    x, y = jnp.ones((batch, dims[0])), jnp.ones((batch, dims[-1]))
    grad = jax.grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))

    count = matmul_peak.matmul_flops(grad, params)
    expected = hand_mlp_update_flops(dims, batch)
    assert count.flops == expected
    assert count.dots == 3 * 3 - 1  # forward, weight and input gradients; no input gradient for layer 1
    assert count.while_loops == 0
    # The forward alone is a third less than "3 × forward" would say for a wide first layer.
    forward = matmul_peak.matmul_flops(lambda p: model.apply(p, x), params)
    assert forward.flops == sum(2 * batch * i * o for i, o in zip(dims[:-1], dims[1:]))

    # XLA's cost analysis counts the same dots plus elementwise work (bias, tanh, loss): a little more.
    compiled = jax.jit(grad).lower(params).compile()
    xla = matmul_peak.xla_flops(compiled)
    assert expected <= xla <= 1.05 * expected


def test_matmul_flops_multiply_scan_bodies_and_vmapped_runs():
    b, d, length, runs = 8, 16, 5, 3
    w = jnp.ones((d, d))

    def chain(x):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=length)[0]

    single = matmul_peak.matmul_flops(chain, jnp.ones((b, d)))
    assert single.flops == length * 2 * b * d * d and single.dots == length
    batched = matmul_peak.matmul_flops(jax.vmap(chain), jnp.ones((runs, b, d)))
    assert batched.flops == runs * single.flops

    def loop(x):
        return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] @ w, c[1] + 1), (x, 0))[0]

    looped = matmul_peak.matmul_flops(loop, jnp.ones((b, d)))
    assert looped.while_loops == 1 and looped.flops == 2 * b * d * d  # body once, flagged


def test_xla_cost_analysis_counts_a_scan_body_once():
    """algo_updates reads one update's XLA cost from the compiled N-update scan; this pins that behaviour."""
    b, d, length = 64, 128, 7
    w = jnp.full((d, d), 0.01)

    def chain(x):
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=length)[0]

    xla = matmul_peak.xla_flops(jax.jit(chain).lower(jnp.ones((b, d))).compile())
    one_body = 2 * b * d * d
    assert one_body <= xla < 2 * one_body


def test_matmul_peak_is_a_positive_rate():
    rate = matmul_peak.matmul_peak(size=128, repeats=2)
    assert np.isfinite(rate) and rate > 0


def test_jax_smoke_run_of_discrete_bc_counts_its_network():
    shapes = algo_updates.ShapeSet("tiny", state_dim=5, embed_dim=11, action_dim=4, discrete=True)
    net = NetConfig(encoder_width=32, encoder_layers=2, hidden=(24,))
    setting = algo_updates.Setting(batch_size=16, net=net)
    data = algo_updates.random_transitions(jax.random.PRNGKey(1), shapes, 200)
    assert data.state.shape == (200, 5) and data.embeddings.shape == (algo_updates.NUM_INSTRUCTIONS, 11)
    assert int(data.action.min()) >= 0 and int(data.action.max()) < 4

    algo = algos.make("bc", shapes.spec, net)
    flops = algo_updates.update_flops(algo, shapes, setting.batch_size, data)
    dims = [16, 32, 32, 24, 4]  # obs S+E, two tanh encoder layers, one ReLU layer, logits
    assert flops["matmul"] == hand_mlp_update_flops(dims, 16)
    assert flops["params"] == sum(i * o + o for i, o in zip(dims[:-1], dims[1:]))
    assert flops["while_loops"] == 0

    bench = algo_updates.build_jax("bc", shapes, setting, seeds=2, updates=3, data=data)
    # XLA's count of the 3-update call is one update of both runs: the matmuls plus elementwise work.
    assert 2 * flops["matmul"] <= bench.xla_flops <= 2 * 1.5 * flops["matmul"]
    steps_before = np.asarray(bench.carry[0].step)
    seconds = bench.time_call()
    assert seconds > 0
    # The carried state advanced by N updates in every run, and the runs are distinct seeds.
    np.testing.assert_array_equal(np.asarray(bench.carry[0].step), steps_before + 3)
    kernels = jax.tree.leaves(bench.carry[0].params)[0]
    assert kernels.shape[0] == 2 and not np.allclose(kernels[0], kernels[1])


def test_unknown_settings_fall_back_and_missing_pairs_are_named():
    assert algo_updates.SETTINGS.get(("no-such-algo", True), algo_updates.DEFAULT_SETTING).d3rlpy is None
    for (name, discrete), setting in algo_updates.SETTINGS.items():
        assert setting.batch_size >= 1
        if setting.d3rlpy is None:
            assert "no comparison" in setting.note, name
    with pytest.raises(ValueError, match="dataset-size"):
        algo_updates.random_transitions(jax.random.PRNGKey(0), algo_updates.SHAPES[0], 0)


class _ScriptedWorker:
    """A d3rlpy worker stand-in answering ``measure`` with scripted wall seconds, logging its thread count."""

    def __init__(self, threads: int, seconds: list[float], calls: list):
        self.threads, self.seconds, self.calls = threads, iter(seconds), calls

    def ask(self, request):
        self.calls.append(("d3rlpy", self.threads))
        done = request["seeds"] * request["updates"]
        seconds = next(self.seconds)
        return {"ok": True, "updates": done, "requested": done, "seconds": seconds, "update_seconds": seconds,
                "params": 7}


class _ScriptedBench:
    def __init__(self, seconds: list[float], calls: list):
        self.seconds, self.calls = iter(seconds), calls
        self.compile_seconds, self.xla_flops, self.devices = 0.5, 1.0, 1

    def time_call(self) -> float:
        self.calls.append(("jax", None))
        return next(self.seconds)


def test_measure_pair_alternates_jax_with_each_thread_setting_and_reports_the_faster(monkeypatch):
    """3 updates per call, one seed. JAX: 0.3 s per call → 10 updates/s. d3rlpy at 1 thread: 3, 6, 3 s →
    1 s/update at the median (1 update/s); at 2 threads: 1.5, 1.5, 3 s → 0.5 s/update (2 updates/s), the
    faster: ratio 10 / 2 = 5 (best: 10 / 2 as well)."""
    calls: list = []
    monkeypatch.setattr(algo_updates, "build_jax", lambda *a, **k: _ScriptedBench([0.3, 0.3, 0.3], calls))
    workers = {1: _ScriptedWorker(1, [3.0, 6.0, 3.0], calls), 2: _ScriptedWorker(2, [1.5, 1.5, 3.0], calls)}
    shapes = algo_updates.ShapeSet("tiny", state_dim=5, embed_dim=11, action_dim=4, discrete=True)
    setting = algo_updates.Setting(batch_size=16, net=NetConfig(encoder_width=32, encoder_layers=2, hidden=(24,)),
                                   d3rlpy="DiscreteBC")
    data = algo_updates.random_transitions(jax.random.PRNGKey(1), shapes, 50)
    args = argparse.Namespace(updates=3, seeds=[1], repeats=3, dataset_size=50, warmup=0, d3rlpy_budget=None,
                              target_seconds=0.1)
    (row,) = algo_updates.measure_pair("bc", shapes, setting, args, 1e9, data, workers, lambda s: None)["rows"]

    assert calls == [("jax", None), ("d3rlpy", 1), ("d3rlpy", 2)] * 3
    assert row["jax_updates_per_s"] == pytest.approx(10.0) and row["jax_best_updates_per_s"] == pytest.approx(10.0)
    assert row["d3rlpy_threads"] == 2
    assert row["d3rlpy_updates_per_s_by_threads"] == {1: pytest.approx(1.0), 2: pytest.approx(2.0)}
    assert row["d3rlpy_updates_per_s"] == pytest.approx(2.0) and row["d3rlpy_best_updates_per_s"] == pytest.approx(2.0)
    assert row["ratio"] == pytest.approx(5.0) and row["ratio_best"] == pytest.approx(5.0)
    assert row["d3rlpy_seconds"] == [1.5, 1.5, 3.0]
