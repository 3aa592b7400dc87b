"""Engine invariants: vmapped runs equal sequential runs; hyperparameters vmap; BC learns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

from imaginejax.algos.base import Spec
from imaginejax.algos.bc import BCHyperparams, make_bc
from imaginejax.algos.networks import NetConfig
from imaginejax.data.transitions import to_transitions
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train

SPEC = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
NET = NetConfig(encoder_width=32, hidden=(32,))


def _trainer(intervals: int = 2, updates: int = 50):
    env = ToyEnv()
    cfg = EngineConfig(batch_size=32, updates_per_interval=updates, num_intervals=intervals,
                       eval_episodes=64)
    return make_train(make_bc(SPEC, NET), SPEC, cfg, {"train": (env, env.default_params())})


@pytest.fixture(scope="module")
def real():
    return to_transitions(expert_dataset(256))


def test_bc_learns_toy_task(real):
    trainer = _trainer(intervals=2, updates=150)
    hp = broadcast_runs(BCHyperparams(learning_rate=jnp.float32(3e-3)), 2)
    result = trainer.train(jax.random.split(jax.random.PRNGKey(0), 2), hp, real, log=None)
    assert result.success["train"].shape == (2, 2)
    np.testing.assert_array_equal(result.success["train"][-1], 1.0)
    assert result.metrics["loss"][-1].max() < 0.1 < result.metrics["loss"][0].min()


def test_vmapped_seeds_equal_sequential_runs(real):
    trainer = _trainer()
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    hp = broadcast_runs(BCHyperparams(learning_rate=jnp.float32(1e-3)), 3)
    together = trainer.train(keys, hp, real, log=None)
    for r in range(3):
        alone = trainer.train(keys[r:r + 1], jax.tree.map(lambda x: x[r:r + 1], hp), real, log=None)
        for a, b in zip(jax.tree.leaves(alone.state.algo.params),
                        jax.tree.leaves(together.state.algo.params)):
            np.testing.assert_allclose(np.asarray(a)[0], np.asarray(b)[r], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(alone.metrics["loss"][:, 0], together.metrics["loss"][:, r],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(alone.success["train"][:, 0], together.success["train"][:, r])


def test_hyperparameters_vmap_in_one_call(real):
    trainer = _trainer(intervals=1)
    lrs = jnp.asarray([0.0, 1e-3, 1e-2], jnp.float32)
    keys = jnp.stack([jax.random.PRNGKey(2)] * 3)
    result = trainer.train(keys, BCHyperparams(learning_rate=lrs), real, log=None)
    params0 = trainer.init(keys[:1], BCHyperparams(learning_rate=lrs[:1]), real).algo.params
    first = lambda tree: np.asarray(jax.tree.leaves(tree)[0])
    # lr 0 leaves parameters untouched; larger learning rates move them further, all in one call.
    np.testing.assert_array_equal(first(result.state.algo.params)[0], first(params0)[0])
    moved = [np.abs(first(result.state.algo.params)[r] - first(params0)[0]).sum() for r in (1, 2)]
    assert 0 < moved[0] < moved[1]


def test_ratio_without_imaginary_data_is_refused(real):
    trainer = _trainer(intervals=1)
    hp = broadcast_runs(BCHyperparams(learning_rate=jnp.float32(1e-3)), 1)
    with pytest.raises(ValueError, match="imaginary"):
        trainer.train(jax.random.split(jax.random.PRNGKey(0), 1), hp, real, ratio=0.5, log=None)


def test_continuous_bc_recovers_the_mean_expert_action():
    """MSE-BC on zero-mean noisy demonstrations (data success ≈ 7 %) learns the conditional mean a*,
    which succeeds far more often than the data itself."""
    import toy_continuous_env as reach

    spec = Spec(state_dim=reach.STATE_DIM, embed_dim=reach.NUM_TASKS, discrete=False,
                action_dim=reach.ACTION_DIM)
    env = reach.ContinuousReachEnv()
    cfg = EngineConfig(batch_size=128, updates_per_interval=300, num_intervals=2, eval_episodes=128)
    trainer = make_train(make_bc(spec, NET), spec, cfg, {"train": (env, env.default_params())})
    real = to_transitions(reach.noisy_expert_dataset(2048))
    hp = broadcast_runs(BCHyperparams(learning_rate=jnp.float32(3e-3)), 2)
    result = trainer.train(jax.random.split(jax.random.PRNGKey(5), 2), hp, real, log=None)
    assert result.success["train"][-1].min() > 0.5, result.success["train"]


def test_algorithm_registry_builds_by_name_and_refuses_unknown_or_unsupported():
    from imaginejax import algos
    from imaginejax.algos import _REGISTRY

    assert algos.make("bc", SPEC, NET).name == "bc"
    continuous = Spec(state_dim=2, embed_dim=4, discrete=False, action_dim=2)
    with pytest.raises(ValueError, match="valid names: .*cql"):
        algos.make("sac-n", SPEC, NET)
    for name in algos.registered():
        for spec in (SPEC, continuous):
            if spec.discrete in _REGISTRY[name]:
                assert callable(algos.make(name, spec, NET).update)
            else:
                with pytest.raises(ValueError, match="action version; for .* actions use: .*bc"):
                    algos.make(name, spec, NET)
    assert "td3bc" in algos.registered(True) and "td3bc" in algos.registered(False)

def test_the_runner_only_loops_the_builders_plan(real, tmp_path):
    """train() = plan() then run_chunk() per chunk with callbacks: the plan alone, run without any callback
    (no files, no log), gives bitwise what train() gives with metrics and checkpoints; train()'s callbacks
    see every interval once."""
    trainer = _trainer(intervals=2, updates=20)
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    hp = broadcast_runs(BCHyperparams(learning_rate=jnp.float32(1e-3)), 3)
    lines = []
    full = trainer.train(keys, hp, real, log=lines.append, runs_per_chunk=2, run_dir=tmp_path,
                         checkpoint_dir=tmp_path / "ckpt")
    plan = trainer.plan(keys, hp, real, runs_per_chunk=2, mesh=None)
    assert [c.runs.tolist() for c in plan.chunks] == [[0, 1], [2]] and [c.padded for c in plan.chunks] == [2, 1]
    parts = [trainer.run_chunk(plan, chunk) for chunk in plan.chunks]
    np.testing.assert_array_equal(np.concatenate([p.success["train"] for p in parts], 1), full.success["train"])
    np.testing.assert_array_equal(np.concatenate([p.metrics["loss"] for p in parts], 1), full.metrics["loss"])
    for leaf_full, *leaf_parts in zip(*(jax.tree.leaves(s.state.algo.params) for s in [full] + parts)):
        np.testing.assert_array_equal(np.asarray(leaf_full), np.concatenate([np.asarray(x) for x in leaf_parts]))
    assert sum("] step " in line for line in lines) == 2 * 2  # 2 chunks × 2 intervals
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3 * 2
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["chunk-000", "chunk-001"]
