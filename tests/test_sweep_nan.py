"""NaN isolation: a run that blows up is frozen and reported; the others are untouched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

from imaginejax.algos.base import Spec
from imaginejax.algos.bc import BCHyperparams, make_bc
from imaginejax.algos.networks import NetConfig
from imaginejax.data.transitions import to_transitions
from imaginejax.training.kernel import EngineConfig
from imaginejax.training.loop import make_train
from imaginejax.training.sweep import Sweep, run_sweep

SPEC = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
NET = NetConfig(encoder_width=16, hidden=(16,))


def test_nan_run_is_frozen_and_others_unaffected():
    real = to_transitions(expert_dataset(64))
    env = ToyEnv()
    cfg = EngineConfig(batch_size=16, updates_per_interval=20, num_intervals=3, eval_episodes=16)
    trainer = make_train(make_bc(SPEC, NET), SPEC, cfg, {"train": (env, env.default_params())})
    base = BCHyperparams(learning_rate=jnp.float32(1e-3))
    sweep = Sweep.grid(seeds=[0], hp={"learning_rate": [1e-3, 1e30, 2e-3]})  # run 1: a huge step size
    lines: list[str] = []
    out = run_sweep(trainer, sweep, base, real, memory_budget=1 << 40, log=lines.append).result

    np.testing.assert_array_equal(out.finite, [True, False, True])
    np.testing.assert_array_equal(out.frozen_at, [0, 1, 0])
    assert any("run 1 went non-finite in interval 1" in line for line in lines)
    assert np.isnan(out.metrics["loss"][:, 1]).all() and np.isfinite(out.metrics["loss"][:, [0, 2]]).all()
    # The frozen run is rolled back to its state before the bad interval (here: its initial state)
    # and stays there, finite; it is still evaluated.
    arrays = sweep.build(base)
    init = trainer.init(arrays.keys, arrays.hp, real)
    for a, b in zip(jax.tree.leaves(init.algo), jax.tree.leaves(out.state.algo)):
        np.testing.assert_array_equal(np.asarray(a)[1], np.asarray(b)[1])
    np.testing.assert_array_equal(np.asarray(init.key)[1], np.asarray(out.state.key)[1])
    assert ((out.success["train"][:, 1] >= 0) & (out.success["train"][:, 1] <= 1)).all()
    # The other runs are bit for bit what they are with a healthy run beside them (same compiled call).
    healthy = Sweep.grid(seeds=[0], hp={"learning_rate": [1e-3, 1e-3, 2e-3]})
    ref = run_sweep(trainer, healthy, base, real, memory_budget=1 << 40, log=lambda s: None).result
    assert ref.finite.all()
    for name in ("loss", "accuracy"):
        np.testing.assert_array_equal(ref.metrics[name][:, [0, 2]], out.metrics[name][:, [0, 2]])
    np.testing.assert_array_equal(ref.success["train"][:, [0, 2]], out.success["train"][:, [0, 2]])
    for a, b in zip(jax.tree.leaves(ref.state.algo), jax.tree.leaves(out.state.algo)):
        np.testing.assert_array_equal(np.asarray(a)[[0, 2]], np.asarray(b)[[0, 2]])
