"""The reference protocol's pieces: every task evaluated equally often, runs that each mix in their own
imaginary source (sampler, engine, PRDC's search), the sweep table, the three-way table."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

from imaginejax import envs
from imaginejax.algos.base import Spec
from imaginejax.algos.bc import BCHyperparams, make_bc
from imaginejax.algos.common import Datasets, DataStats
from imaginejax.algos.neighbors import nearest_neighbor
from imaginejax.algos.networks import NetConfig
from imaginejax.bench.config import available_presets, data_conditions, load_config
from imaginejax.bench.report import protocol_rows, protocol_table
from imaginejax.bench.results import Group
from imaginejax.data.sampling import sample_mixed
from imaginejax.data.transitions import concat_transitions, to_transitions
from imaginejax.training.evaluation import episodes_per_level, evaluate
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train
from imaginejax.training.sweep import Sweep

SPEC = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)


# ----------------------------------------------------------------------------------------- evaluation
def test_episodes_round_up_to_whole_rounds_of_tasks():
    assert [episodes_per_level(n, 4) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 12]
    with pytest.raises(ValueError):
        episodes_per_level(0, 4)


@pytest.mark.parametrize("preset", available_presets())
def test_every_task_of_every_level_is_evaluated_at_the_presets_settings(preset):
    config = load_config(preset)
    for level in envs.ENV_LEVELS[config.data.env]:
        _, params = envs.make(config.data.env, level, embed=False)
        k = int(params.goals.shape[0])
        n = episodes_per_level(config.train.eval_episodes, k)
        tasks = np.arange(n) % k
        counts = np.bincount(tasks, minlength=k)
        assert counts.min() == counts.max() >= 1, (preset, level)


def test_level_success_is_the_mean_of_its_tasks():
    """5 requested episodes of 4 tasks run 8 (each task twice); a policy right on tasks 0 and 2 only
    scores 1, 0, 1, 0 per task and 0.5 on the level."""
    env = ToyEnv()
    params = env.default_params()

    def policy(obs, key):
        task = jnp.argmax(obs[:, STATE_DIM:], -1)
        return jnp.where(task % 2 == 0, task, (task + 1) % NUM_TASKS)

    result = jax.jit(lambda k: evaluate(policy, env, params, k, 5))(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(result.task_success, [1.0, 0.0, 1.0, 0.0])
    assert float(result.success_rate) == 0.5


# ------------------------------------------------------------------------------- sources per run
def _buffers():
    real = to_transitions(expert_dataset(64, seed=0))
    a, b = to_transitions(expert_dataset(40, seed=1)), to_transitions(expert_dataset(24, seed=2))
    return real, a, b


def test_sampler_draws_a_sources_rows_exactly_as_from_that_source_alone():
    real, a, b = _buffers()
    both = concat_transitions([a, b])
    key = jax.random.PRNGKey(3)
    alone = sample_mixed(key, real, b, 32, 0.5)
    shared = sample_mixed(key, real, both, 32, 0.5, jnp.asarray([40, 24], jnp.int32))
    for name in ("state", "embedding", "action", "reward", "next_state", "terminal", "imaginary"):
        np.testing.assert_array_equal(getattr(alone, name), getattr(shared, name), err_msg=name)


def test_runs_with_their_own_sources_equal_runs_trained_on_each_source_alone():
    """One call over two imaginary sources == each run alone with its source as the only buffer
    (bitwise: run_block 1 fixes the vmapped size)."""
    real, a, b = _buffers()
    env = ToyEnv()
    cfg = EngineConfig(batch_size=16, updates_per_interval=20, num_intervals=2, eval_episodes=8, run_block=1)
    trainer = make_train(make_bc(SPEC, NetConfig(encoder_width=16, hidden=(16,))), SPEC, cfg,
                         {"train": (env, env.default_params())})
    keys = jax.random.split(jax.random.PRNGKey(4), 2)
    hp = broadcast_runs(BCHyperparams(learning_rate=jnp.float32(1e-3)), 2)
    together = trainer.train(keys, hp, real, [a, b], ratio=0.5, source=np.asarray([1, 0]), log=None, mesh=None)
    for r, own in ((0, b), (1, a)):
        alone = trainer.train(keys[r:r + 1], jax.tree.map(lambda x: x[r:r + 1], hp), real, own, ratio=0.5,
                              log=None, mesh=None)
        for x, y in zip(jax.tree.leaves(alone.state.algo), jax.tree.leaves(together.state.algo)):
            np.testing.assert_array_equal(np.asarray(x)[0], np.asarray(y)[r])
        np.testing.assert_array_equal(alone.metrics["loss"][:, 0], together.metrics["loss"][:, r])
    with pytest.raises(ValueError, match="source"):
        trainer.train(keys, hp, real, [a, b], ratio=0.5, source=np.asarray([0, 2]), log=None, mesh=None)


def test_prdc_search_within_a_window_equals_the_search_of_that_source():
    rng = np.random.default_rng(5)
    real, a, b = _buffers()
    both = concat_transitions([a, b])
    norm = DataStats(mean=jnp.zeros(STATE_DIM), std=jnp.ones(STATE_DIM))
    qs = jnp.asarray(rng.normal(size=(9, STATE_DIM)), jnp.float32)
    qe = jnp.asarray(np.eye(NUM_TASKS)[rng.integers(0, NUM_TASKS, 9)], jnp.float32)
    qa = jnp.asarray(rng.dirichlet(np.ones(NUM_TASKS), 9), jnp.float32)
    search = lambda data: nearest_neighbor(qs, qe, qa, data, norm, 2.0, chunk=16, num_actions=NUM_TASKS,
                                           use_real=False)
    alone = search(Datasets.of(real, b))
    windowed = search(Datasets.of(real, both, jnp.asarray([40, 24], jnp.int32)))
    np.testing.assert_array_equal(windowed.index, alone.index + 40)
    np.testing.assert_allclose(windowed.distance, alone.distance, rtol=1e-6)
    np.testing.assert_array_equal(windowed.action, alone.action)


# ------------------------------------------------------------------------------------------- sweeps
def test_grid_over_data_sources_gives_real_only_runs_ratio_zero():
    sweep = Sweep.grid(seeds=2, ratios=[0.0, 0.5], data=["", "imaginary/easy", "oracle/easy"])
    rows = [(s.data, s.ratio, s.seed) for s in sweep.table]
    assert rows == [("", 0.0, 0), ("", 0.0, 1), ("imaginary/easy", 0.5, 0), ("imaginary/easy", 0.5, 1),
                    ("oracle/easy", 0.5, 0), ("oracle/easy", 0.5, 1)]
    assert sweep.data_names == ("imaginary/easy", "oracle/easy")
    np.testing.assert_array_equal(sweep.build(BCHyperparams(learning_rate=jnp.float32(1e-3))).sources,
                                  [0, 0, 0, 0, 1, 1])
    # Without sources every ratio is swept over one buffer, as before.
    assert [s.ratio for s in Sweep.grid(seeds=1, ratios=[0.0, 0.5]).table] == [0.0, 0.5]


def test_conditions_follow_the_configuration():
    assert data_conditions(load_config("clevr-quick")) == ("real", "imaginary", "oracle")
    assert data_conditions(load_config("clevr-quick", ['imagine.source="oracle"'])) == ("real", "oracle")
    assert data_conditions(load_config("clevr-quick", ["train.ratios=[0.0]"])) == ("real",)


# ------------------------------------------------------------------------------------ the table
def _group(data: str, success: list[list[float]], ratio: float = 0.5) -> Group:
    values = np.asarray(success, np.float64)  # (I, n)
    return Group(label=f"bc, {data or 'real only'}", algo="bc", steps=np.arange(1, len(values) + 1) * 10,
                       success={"train": values, "easy": values}, data=data, ratio=0.0 if not data else ratio)


def test_three_way_rows_average_the_last_evaluations_and_pair_each_level_with_its_own_data():
    groups = [_group("", [[0.0, 0.0, 0.0], [0.2, 0.2, 0.2], [0.4, 0.4, 0.4]]),
              _group("imaginary/easy", [[0.9] * 3, [0.5] * 3, [0.7] * 3]),
              _group("oracle/easy", [[1.0] * 3] * 3),
              _group("imaginary/hard", [[0.0] * 3] * 3)]
    rows = protocol_rows(groups, ["train", "easy"], statistic="mean", reps=50, last=2)
    cells = {(r["level"], r["condition"]): r for r in rows}
    assert set(cells) == {("train", "real"), ("easy", "real"), ("easy", "imaginary"), ("easy", "oracle")}
    assert cells[("easy", "real")]["point"] == pytest.approx(0.3)  # mean of the last 2 evaluations
    assert cells[("easy", "imaginary")]["point"] == pytest.approx(0.6)
    assert cells[("easy", "oracle")]["evaluations"] == 2
    text = protocol_table(rows, "mean", {"easy": {"goal_consistency": 0.5, "consistent_and_legal_rate": 0.25,
                                                  "exceeds_dynamics_rate": 0.01}}, reps=50)
    easy = next(line for line in text.splitlines() if line.startswith("| bc | easy |"))
    assert "30.0 [30.0, 30.0]" in easy and "60.0 [60.0, 60.0] ↑" in easy and "100.0" in easy
    assert "50.0 / 25.0 / 1.0" in easy


def test_a_checkpoint_whose_history_is_shorter_than_its_interval_is_refused():
    from imaginejax.core.checkpoint import CheckpointError
    from imaginejax.training.loop import History

    history = History(steps=[10], seconds=[1.0], metrics=[{"loss": np.zeros(2)}], success=[{"train": np.zeros(2)}],
                      returns=[{"train": np.zeros(2)}], frozen_at=np.zeros(2, np.int64),
                      task_success={"train": np.zeros((2, 4))})
    arrays = history.to_arrays()
    meta = {"metrics": ["loss"], "levels": ["train"]}
    assert History.from_arrays(arrays, meta, 1).steps == [10]
    with pytest.raises(CheckpointError, match="interval 2 lacks history"):
        History.from_arrays(arrays, meta, 2)


# ------------------------------------------------------------------------------------------- memory
def test_dataset_memory_is_estimated_and_a_configuration_too_big_is_refused_before_collecting(tmp_path, monkeypatch):
    from imaginejax.bench import protocol
    from imaginejax.bench.config import ConfigError, resolve

    config = load_config("clevr-demo", ["data.episodes=100", "imagine.episodes=8", "imagine.oversample=3"])
    estimate = protocol.data_memory(resolve(config))
    # By hand, CLEVR: T = 50 steps, S = 10, one action index: per step 4·(10 + 1 + 1) + 3 bytes of padded
    # trajectory and 4·(2·10 + 1 + 3) of transitions = 147; per trajectory 4·10 + 50·147 = 7,390 bytes.
    # Each novel level keeps 8 imaginary rollouts of 3 × 8 generated; the oracle 8.
    novel = ("rephrase", "easy", "hard")
    steps = {lv: int(envs.make("clevr", lv)[1].max_steps) for lv in novel}
    per = {lv: 40 + steps[lv] * 147 for lv in novel}
    assert estimate == {"real": 100 * 7390, "imaginary": sum(24 * per[lv] for lv in novel),
                        "oracle": sum(8 * per[lv] for lv in novel)}
    assert protocol.data_memory(resolve(config), real_given=True, oracle_given=True)["real"] == 0
    with pytest.raises(ConfigError, match=r"up to 1\.\d MiB of host memory .* but 1\.0 MiB are available: lower "
                                          r"data\.episodes or imagine\.episodes"):
        protocol.check_data_memory(resolve(config), estimate, available=2**20)
    protocol.check_data_memory(resolve(config), estimate, available=2**30)
    # train refuses before it opens a workspace or collects anything.
    monkeypatch.setattr(protocol, "available_memory", lambda: 2**20)
    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match="nothing was collected"):
        protocol.train(config, tmp_path / "ws")
    assert not (tmp_path / "ws").exists() and not (tmp_path / "home" / "data").exists()
