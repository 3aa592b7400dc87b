"""KALM fine-tuning (imaginejax.imaginer.finetune): the ``tiny`` preset (shrunk to 2 layers of
width 64 to fit the test budget, SmolLM2's tokenizer) overfits a handful of trajectories on all four
tasks and then regenerates them greedily; a resumed run equals an uninterrupted one; a run directory
loads back to the same imaginer.

The trajectories are synthetic and CLEVR-shaped: a point moved by 0.2 along one of the 8 CLEVR push
directions per step, two directions alternating per trajectory (so no intermediate state is near the
final one), a distinct CLEVR-style instruction per trajectory, the final state as goal vector.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data.types import TrajectoryDataset
from imaginejax.imaginer.finetune import (
    TINY_ARCHITECTURE,
    FinetuneResult,
    evaluate,
    finetune,
    load_imaginer,
    params_fingerprint,
)
from imaginejax.imaginer.imagine import generate_rollouts
from imaginejax.imaginer.kalm import rollout_prompts, tokenize_instructions

DIRECTIONS = np.array([(1, 0), (0, 1), (-1, 0), (0, -1), (.8, .8), (-.8, .8), (.8, -.8), (-.8, -.8)],
                      np.float32)
PAIRS = ((0, 4), (1, 5), (2, 7), (3, 6), (4, 1), (5, 2))  # both directions progress along one axis
INSTRUCTIONS = ("Move the red ball behind the blue ball.",
                "Push the green ball to the left of the cyan ball.",
                "Put the purple ball in front of the red ball.",
                "Place the blue ball to the right of the green ball.",
                "Get the cyan ball behind the purple ball.",
                "Bring the red ball to the left of the blue ball.")
NUM_ACTIONS = 8
HORIZON = 6
GOAL_TOLERANCE = 0.08  # intermediate states are >= 0.16 from the goal along one axis
TEST_ARCHITECTURE = dict(TINY_ARCHITECTURE, num_hidden_layers=2, hidden_size=64,
                         intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
OVERRIDES: dict[str, Any] = dict(
    architecture=TEST_ARCHITECTURE, num_steps=120, learning_rate=3e-3, warmup_steps=10,
    log_every=20, checkpoint_every=1000, num_actions=NUM_ACTIONS, progress=False,
    batch_sizes={"rollout": 8, "dynamics": 8, "consequence": 8, "explanation": 4})


def synthetic_dataset() -> TrajectoryDataset:
    rng = np.random.default_rng(0)
    n, state_dim = len(INSTRUCTIONS), 4
    states = np.zeros((n, HORIZON + 1, state_dim), np.float32)
    actions = np.zeros((n, HORIZON), np.int32)
    mask = np.zeros((n, HORIZON), bool)
    goals = np.zeros((n, state_dim), np.float32)
    for i in range(n):
        length = 2 + i % 3
        state = np.concatenate([rng.uniform(-0.5, 0.5, 2), rng.uniform(-1, 1, 2)]).astype(np.float32)
        states[i, 0] = state
        for t in range(length):
            action = PAIRS[i][t % 2]
            state = state.copy()
            state[:2] += 0.2 * DIRECTIONS[action]
            actions[i, t], states[i, t + 1] = action, state
        mask[i, :length] = True
        goals[i] = state
    terminals = mask & ~np.concatenate([mask[:, 1:], np.zeros((n, 1), bool)], axis=1)
    return TrajectoryDataset(
        states=states, actions=actions, rewards=np.zeros((n, HORIZON), np.float32), mask=mask,
        terminals=terminals, truncations=np.zeros((n, HORIZON), bool),
        instruction_ids=np.arange(n, dtype=np.int32), goals=goals, instructions=INSTRUCTIONS,
        instruction_embeddings=np.zeros((n, 0), np.float32), env="synthetic", level="train",
        source="real", discrete=True)


def reached_goal(prev: jax.Array, action: jax.Array, following: jax.Array, goal: jax.Array
                 ) -> jax.Array:
    del prev, action
    return jnp.all(jnp.abs(following - goal) < GOAL_TOLERANCE, axis=-1)


def distance_reward(prev: jax.Array, action: jax.Array, following: jax.Array, goal: jax.Array
                    ) -> jax.Array:
    del action
    return jnp.linalg.norm(prev - goal, axis=-1) - jnp.linalg.norm(following - goal, axis=-1)


@pytest.fixture(scope="module")
def dataset() -> TrajectoryDataset:
    return synthetic_dataset()


@pytest.fixture(scope="module")
def overfit(dataset: TrajectoryDataset, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[dict[str, float], dict[str, float], FinetuneResult]:
    """(metrics at initialisation, metrics after training, the trained run)."""
    run_dir = tmp_path_factory.mktemp("overfit")
    initial = finetune("tiny", dataset, run_dir, stop_at_step=0, **OVERRIDES)
    before = evaluate(initial.imaginer, dataset, batch_size=8)
    trained = finetune("tiny", dataset, run_dir, **OVERRIDES)
    after = evaluate(trained.imaginer, dataset, batch_size=8)
    return before, after, trained


def test_tiny_preset_overfits_all_four_tasks(overfit: Any) -> None:
    before, after, trained = overfit
    assert after["loss"] < before["loss"] / 20, (before["loss"], after["loss"])
    for task in ("rollout", "dynamics", "consequence"):
        assert after[f"{task}/state_mse"] < 0.05 * before[f"{task}/state_mse"], task
    assert after["rollout/action_acc"] == 1.0 > before["rollout/action_acc"]
    assert after["explanation/text_acc"] > 0.8 > before["explanation/text_acc"]
    history = trained.history
    assert [row["step"] for row in history] == list(range(20, 121, 20))
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(np.isfinite(row["grad_norm"]) and row["tokens_per_s"] > 0 for row in history)


def test_overfit_model_regenerates_its_trajectories(overfit: Any, dataset: TrajectoryDataset) -> None:
    imaginer = overfit[2].imaginer
    table = tokenize_instructions(imaginer.tokenizer, dataset.instructions)
    tokens, attention, state_inputs = rollout_prompts(
        imaginer.text_format, imaginer.config, [table[int(i)] for i in dataset.instruction_ids],
        dataset.states[:, 0])
    out = jax.device_get(generate_rollouts(
        imaginer.params, imaginer.config, imaginer.normalizer, tokens, attention, state_inputs,
        dataset.states[:, 0], dataset.goals, horizon=HORIZON, success_fn=reached_goal,
        reward_fn=distance_reward))
    lengths = dataset.mask.sum(axis=1)
    np.testing.assert_array_equal(out.lengths, lengths)
    np.testing.assert_array_equal(np.where(dataset.mask, out.actions, -1),
                                  np.where(dataset.mask, dataset.actions, -1))
    valid_states = np.arange(HORIZON + 1)[None, :] <= lengths[:, None]
    error = np.abs(out.states - dataset.states).max(axis=-1)
    assert error[valid_states].max() < GOAL_TOLERANCE, error
    assert np.all(out.success[np.arange(len(lengths)), lengths - 1])
    assert out.finite.all()


def test_resume_from_checkpoint_equals_uninterrupted(dataset: TrajectoryDataset,
                                                     tmp_path: Path) -> None:
    straight = finetune("tiny", dataset, tmp_path / "straight", stop_at_step=6, **OVERRIDES)
    first = finetune("tiny", dataset, tmp_path / "resumed", stop_at_step=3, **OVERRIDES)
    assert int(first.state.step) == 3
    resumed = finetune("tiny", dataset, tmp_path / "resumed", stop_at_step=6, **OVERRIDES)
    assert int(resumed.state.step) == 6
    jax.tree.map(np.testing.assert_array_equal, resumed.state.trainable, straight.state.trainable)
    jax.tree.map(np.testing.assert_array_equal, resumed.state.opt_state, straight.state.opt_state)
    assert resumed.imaginer.checkpoint_hash == straight.imaginer.checkpoint_hash
    with pytest.raises(ValueError, match="differs"):
        finetune("tiny", dataset, tmp_path / "resumed", stop_at_step=8,
                 **dict(OVERRIDES, learning_rate=1e-3))
    with pytest.raises(FileExistsError):
        finetune("tiny", dataset, tmp_path / "resumed", resume=False, **OVERRIDES)


def test_run_directory_loads_back(overfit: Any) -> None:
    trained = overfit[2]
    loaded = load_imaginer(trained.run_dir)
    assert loaded.step == trained.imaginer.step == OVERRIDES["num_steps"]
    assert loaded.checkpoint_hash == trained.imaginer.checkpoint_hash
    assert loaded.config == trained.imaginer.config
    assert loaded.layout == trained.imaginer.layout
    assert params_fingerprint(loaded.params) == params_fingerprint(trained.imaginer.params)
    np.testing.assert_array_equal(loaded.normalizer.std, trained.imaginer.normalizer.std)
    text = INSTRUCTIONS[0]
    assert loaded.tokenizer.encode(text).ids == trained.imaginer.tokenizer.encode(text).ids
