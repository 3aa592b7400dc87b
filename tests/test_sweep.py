"""Sweeps: table and engine inputs, memory estimate and chunking, metrics files."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

from imaginejax.algos.base import Spec
from imaginejax.algos.bc import BCHyperparams, make_bc
from imaginejax.algos.cql_discrete import make_cql_discrete
from imaginejax.algos.networks import NetConfig
from imaginejax.data.transitions import to_transitions
from imaginejax.training import sweep as sweep_lib
from imaginejax.training.kernel import EngineConfig, MemoryEstimate
from imaginejax.training.loop import make_train
from imaginejax.training.sweep import Sweep, SweepMemoryError, plan_chunks, run_sweep

SPEC = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
NET = NetConfig(encoder_width=16, hidden=(16,))


def _trainer(intervals: int = 2, updates: int = 20, run_block: int | None = None):
    env = ToyEnv()
    cfg = EngineConfig(batch_size=16, updates_per_interval=updates, num_intervals=intervals,
                       eval_episodes=16, run_block=run_block)
    return make_train(make_bc(SPEC, NET), SPEC, cfg, {"train": (env, env.default_params())})


@pytest.fixture(scope="module")
def real():
    return to_transitions(expert_dataset(64))


def test_grid_table_and_engine_inputs():
    sweep = Sweep.grid(seeds=[3, 4], ratios=[0.0, 0.5], hp={"learning_rate": [1e-3, 1e-2], "alpha": [1, 10]})
    assert sweep.num_runs == 2 * 2 * 2 * 2
    first, last = sweep.table[0], sweep.table[-1]
    assert (first.seed, first.ratio, first.hp, first.config) == (3, 0.0, {"learning_rate": 1e-3, "alpha": 1.0}, 0)
    assert (last.seed, last.ratio, last.hp, last.config) == (4, 0.5, {"learning_rate": 1e-2, "alpha": 10.0}, 7)
    assert [s.seed for s in sweep.table[:4]] == [3, 4, 3, 4]  # seed innermost, configs contiguous
    base = make_cql_discrete(SPEC, NET).default_hp(SPEC)
    arrays = sweep.build(base)
    assert arrays.keys.shape == (16, 2) and arrays.keys.dtype == np.uint32
    np.testing.assert_array_equal(arrays.keys[0], jax.random.PRNGKey(3))
    np.testing.assert_array_equal(arrays.keys[1], jax.random.PRNGKey(4))
    np.testing.assert_array_equal(arrays.ratios, np.repeat([0.0, 0.5], 8).astype(np.float32))
    np.testing.assert_allclose(arrays.hp.learning_rate, np.tile(np.repeat([1e-3, 1e-2], 4), 2).astype(np.float32))
    np.testing.assert_array_equal(arrays.hp.alpha, np.tile(np.repeat([1.0, 10.0], 2), 4))
    assert arrays.hp.alpha.dtype == np.float32
    # Unswept leaves are repeated with their dtype.
    np.testing.assert_array_equal(arrays.hp.target_update_interval, np.full(16, 8000, np.int32))
    assert arrays.hp.target_update_interval.dtype == np.int32


def test_list_sweep_and_bad_names():
    sweep = Sweep.from_runs([{"seed": 0, "ratio": 0.5, "learning_rate": 1e-3},
                             {"seed": 1, "ratio": 0.5, "learning_rate": 1e-3},
                             {"seed": 0, "learning_rate": 3e-3}])
    assert [s.config for s in sweep.table] == [0, 0, 1]
    base = BCHyperparams(learning_rate=jnp.float32(1e-3))
    np.testing.assert_allclose(sweep.build(base).hp.learning_rate, [1e-3, 1e-3, 3e-3])
    with pytest.raises(ValueError, match="'lr' is not a hyperparameter.*learning_rate"):
        Sweep.grid(1, hp={"lr": [1.0]}).build(base)
    with pytest.raises(ValueError, match="integer"):
        Sweep.grid(1, hp={"target_update_interval": [0.5]}).build(make_cql_discrete(SPEC, NET).default_hp(SPEC))
    with pytest.raises(ValueError, match="ratio"):
        Sweep.grid(1, ratios=[1.5])
    with pytest.raises(ValueError, match="seed"):
        Sweep.from_runs([{"learning_rate": 1.0}])


def test_memory_estimate_bounds_xla_and_plans_chunks(real):
    trainer = _trainer()
    base = BCHyperparams(learning_rate=jnp.float32(1e-3))
    est = trainer.memory_estimate(base, real)
    assert est.per_run > 0 and est.shared > 0
    # The shape-only estimate (no compilation) is an upper bound of XLA's own figure for 4 runs.
    arrays = Sweep.grid(4).build(base)
    compiled = trainer.compiled_memory(arrays.keys, arrays.hp, real)
    assert compiled <= est.total(4) <= 50 * compiled
    # Chunking: everything fits -> one chunk; a budget for 3 runs per device -> chunks of 3 (or 3·D).
    assert plan_chunks(10, est, 1 << 40, 1) == 10
    assert plan_chunks(10, est, est.shared + 3 * est.per_run, 1) == 3
    assert plan_chunks(10, est, est.shared + 3 * est.per_run, 2) == 6
    with pytest.raises(MemoryError, match="budget"):
        plan_chunks(10, MemoryEstimate(per_run=100, shared=50), 120, 1)


def test_host_memory_is_checked_by_counting_before_a_table_is_built(real, monkeypatch):
    """What chunking does not bound (every run's final state, row and results on the host) is refused
    before it is allocated: a million seeds once built 80,000 keys per 20 s, then every state."""
    for args in [(3, [0.0, 0.5], {"a": [1, 2]}, None), (2, [0.0, 0.5, 1.0], None, ["", "x", "y"]),
                 ([5, 7], [0.0], {"a": [1], "b": [1, 2, 3]}, ["", "x"]), (4, [0.25], None, ["x"])]:
        assert Sweep.grid_size(*args) == Sweep.grid(*args).num_runs
    seeds = [0, 1, 7, 2**31 - 1, 2**31, 2**32 + 3]  # vmapped PRNGKey for int32 seeds, one by one above
    expected = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in seeds])
    np.testing.assert_array_equal(Sweep.grid(seeds).build(BCHyperparams(jnp.float32(1e-3))).keys, expected)
    np.testing.assert_array_equal(Sweep.grid(seeds[:4]).build(BCHyperparams(jnp.float32(1e-3))).keys, expected[:4])
    trainer = _trainer()
    state = trainer.state_shape(trainer.algo.default_hp(SPEC), real)
    per_run = sweep_lib.host_bytes_per_run(state, 2, 1)
    assert per_run == sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) + 1024 + 96 * 2
    sweep_lib.check_host_memory(10, per_run, "x", "y", available=20 * per_run)
    with pytest.raises(SweepMemoryError, match=r"^the runs: 11 runs would hold ~.* MiB of host memory whatever the "
                                                r"chunking \(.* KiB per run.*more than half of the .* MiB available \(training "
                                                r"takes the other half on a CPU\): fix"):
        sweep_lib.check_host_memory(11, per_run, "the runs", "fix", available=20 * per_run)
    monkeypatch.setattr(sweep_lib, "available_memory", lambda: 10 * per_run)
    with pytest.raises(SweepMemoryError, match="the sweep: 6 runs"):
        run_sweep(trainer, Sweep.grid(6), trainer.algo.default_hp(SPEC), real, memory_budget=1 << 40)


def test_chunked_sweep_equals_one_chunk_bitwise(real, tmp_path):
    """With a fixed run_block every block computes the same program: chunking changes nothing."""
    trainer = _trainer(run_block=2)
    sweep = Sweep.grid(seeds=2, hp={"learning_rate": [1e-3, 3e-3]})  # R = 4
    base = BCHyperparams(learning_rate=jnp.float32(1e-3))
    whole = run_sweep(trainer, sweep, base, real, memory_budget=1 << 40, log=lambda s: None)
    est = trainer.memory_estimate(base, real)
    chunked = run_sweep(trainer, sweep, base, real, memory_budget=est.shared + 2 * est.per_run,
                        run_dir=tmp_path, log=lambda s: None)
    assert whole.runs_per_chunk == 4 and chunked.runs_per_chunk == 2  # two chunks of 2 runs
    for a, b in zip(jax.tree.leaves(whole.result.state), jax.tree.leaves(chunked.result.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(whole.result.metrics["loss"], chunked.result.metrics["loss"])
    np.testing.assert_array_equal(whole.result.success["train"], chunked.result.success["train"])
    # Metrics files: one record per (interval, run), in both formats.
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 4 and sorted({r["run"] for r in records}) == list(range(4))
    rec = next(r for r in records if r["run"] == 3 and r["interval"] == 2)
    assert rec["chunk"] == 1 and rec["step"] == 40 and rec["finite"] is True
    np.testing.assert_allclose(rec["loss"], chunked.result.metrics["loss"][1, 3], rtol=1e-6)
    np.testing.assert_allclose(rec["success/train"], chunked.result.success["train"][1, 3])
    csv_lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 8 and csv_lines[0].startswith("chunk,interval,step,run,seconds,finite,")
    assert {"loss", "accuracy", "success/train", "return/train"} <= set(csv_lines[0].split(","))
    table = json.loads((tmp_path / "sweep.json").read_text())
    assert table["runs_per_chunk"] == 2 and table["runs"][3]["hp"] == {"learning_rate": 3e-3}

