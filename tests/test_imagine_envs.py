"""The imaginer on every environment that has one (BabyAI, HalfCheetah, Meta-World, LIBERO; CLEVR is in
test_imagine.py): generation with tiny hand-built models stops each row when the environment's own
success predicate holds — HalfCheetah's and LIBERO's through the running quantities (Σ dx; the
episode's start and sub-goal stage, carried per row) —
with the environment's rewards, writes valid datasets and drops non-finite rows; the quality
adapters score real trajectories as the environment saw them (goal consistency = the episodes'
own success, HalfCheetah's re-simulated transitions ≈ 0 error) and hand-edited states with the
errors and illegal-state categories computed by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data.collect import collect
from imaginejax.data.types import TrajectoryDataset
from imaginejax.data.validate import validate_dataset
from imaginejax.envs import make
from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai.env import BabyAI
from imaginejax.envs.cheetah import tasks as ct
from imaginejax.envs.libero import model as lm
from imaginejax.envs.libero import tasks as lt
from imaginejax.envs.metaworld import tasks as mt
from imaginejax.imaginer.imagine import (
    ImaginationError,
    episode_rules,
    generate_rollouts,
    imagine,
    rollouts_to_dataset,
)
from imaginejax.imaginer.kalm import rollout_prompts
from imaginejax.envs import quality_rules
from imaginejax.envs.babyai.tasks import violations as babyai_violations
from imaginejax.envs.cheetah.quality import CHEETAH_ERROR_SCALE, cheetah_violations
from imaginejax.envs.libero.quality import libero_violations, project_libero
from imaginejax.envs.metaworld.quality import metaworld_violations, project_metaworld
from imaginejax.imaginer.quality import (
    quality_report,
    score_dataset,
    summarize,
)
from test_imagine import FMT, make_imaginer

# A legal HalfCheetah state moving forward by 0.05 m per step, torso 0.03 m above its rest height.
CHEETAH_STATE = np.zeros(18, np.float32)
CHEETAH_STATE[[ct.DX, ct.ROOTZ, ct.VX]] = [0.05, -0.1, 1.0]
CHEETAH_ACTION = np.full(6, 0.5, np.float32)
JUMP_FORWARD, JUMP_BACKWARD = 2, 3  # rows of the train goal table
FORWARD_BACKWARD, JUMP_IN_PLACE = 0, 2  # rows of the hard goal table


def metaworld_state() -> np.ndarray:
    """A legal 91-d state: the target object on the target location (push / pick-place succeed),
    the door handle 0.35 m from it in x (door-open does not)."""
    state = np.zeros(mt.STATE_DIM, np.float32)
    state[0:4] = [0.0, 0.6, 0.2, 0.5]
    state[4:7] = [0.05, 0.8, 0.02]
    obj = mt.SLOT_START + mt.SLOT_DIM * mt.ENTITIES.index("target_object")
    handle = mt.SLOT_START + mt.SLOT_DIM * mt.ENTITIES.index("handle")
    state[obj:obj + 7] = [0.05, 0.8, 0.02, 1.0, 0.0, 0.0, 0.0]
    state[handle:handle + 7] = [-0.3, 0.8, 0.15, 1.0, 0.0, 0.0, 0.0]
    return state


PUSH, DOOR_OPEN = mt.TASK_INDEX["push"], mt.TASK_INDEX["door-open"]  # == their train rows


def env_imaginer(env_name: str, **kwargs: Any):
    """A 1-layer random imaginer shaped for ``env_name``."""
    env, _ = make(env_name, "train", embed=False)
    width = env.num_actions if env.discrete else env.action_dim
    return make_imaginer(state_dim=env.state_dim, num_actions=width, discrete=bool(env.discrete),
                         fixed_action=1, **kwargs)


def check_categories_partition_legal(violations: Any, legal: Any, states: np.ndarray, min_legal: float
                                     ) -> dict[str, np.ndarray]:
    """``violations(states)`` names a cause for exactly the states that ``legal(states)`` rejects, every
    category occurs, and the legal fraction lies in (``min_legal``, 0.95); returns the categories (N,) bool."""
    categories = {name: np.asarray(v) for name, v in violations(jnp.asarray(states)).items()}
    any_category = np.any(np.stack(list(categories.values())), axis=0)
    legal_rows = np.asarray(legal(jnp.asarray(states)))
    np.testing.assert_array_equal(any_category, ~legal_rows)
    for name, values in categories.items():
        assert values.any(), name  # every category occurs
    assert min_legal < legal_rows.mean() < 0.95
    return categories


def check_successful_expert_scores(ds: TrajectoryDataset, no_simulator: str) -> None:
    """Expert trajectories that all succeed, of an environment without a simulator check: the
    report's step-by-step success is the environment's own terminals, every state is legal, goal
    consistency is 1 and the transition columns say why they are missing (``no_simulator``)."""
    assert ds.terminals.any(axis=1).all()
    scores = score_dataset(ds)
    np.testing.assert_array_equal(scores.step_success, ds.terminals)
    assert scores.legal_next[ds.mask].all() and scores.legal_initial.all()
    assert not scores.simulated and np.isnan(scores.transition_error).all()
    summary = summarize(scores)
    assert summary["goal_consistency"] == 1.0 and summary["exceeds_dynamics_rate"] is None
    assert f"Transitions were not checked: {no_simulator}" in quality_report(ds).to_markdown()


# --------------------------------------------------------------------------------------- generation


# Shapes shared by the tests of one environment, so its generation compiles once (rows, horizon).
SHAPES = {"babyai": (2, 4), "cheetah": (2, 16), "metaworld": (2, 5), "libero": (2, 4)}


def check_rewards_and_stops(env_name: str, ds: TrajectoryDataset, max_steps: int) -> None:
    """Rewards, terminals and row ends recomputed with the environment's own functions on the
    written states and actions, independently of the generation loop."""
    env, _ = make(env_name, ds.level, embed=False)
    states, actions, goals = (jnp.asarray(x) for x in (ds.states, ds.actions, ds.goals))
    horizon = ds.mask.shape[1]
    if env_name == "cheetah":
        success, want = ct.trajectory_success_and_reward(states, actions, goals)
    elif env_name == "metaworld":
        want = mt.reward(states[:, :-1], actions, states[:, 1:], goals[:, None],
                         first_state=states[:, :1])
        success = mt.success(states[:, 1:], goals[:, None])
    elif env_name == "libero":  # the progress updated after every state, as step_batch does
        progress, rewards, flags = lt.Progress.initial(states[:, 0]), [], []
        for t in range(horizon):
            after = lt.update_progress(progress, states[:, t + 1], goals)
            flags.append(lt.success(states[:, t + 1], goals, after))
            rewards.append(lt.reward(states[:, t], states[:, t + 1], goals, progress, after))
            progress = after
        want, success = jnp.stack(rewards, 1), jnp.stack(flags, 1)
    else:
        want = env.reward(states[:, :-1], actions, states[:, 1:], goals[:, None],
                          np.arange(1, horizon + 1), max_steps)
        success = env.success(states[:, :-1], actions, states[:, 1:], goals[:, None])
    np.testing.assert_allclose(ds.rewards, np.where(ds.mask, np.asarray(want), 0.0), rtol=1e-5,
                               atol=1e-5)
    success = np.asarray(success) & ds.mask
    np.testing.assert_array_equal(ds.terminals, success)
    first = np.where(success.any(axis=1), np.argmax(success, axis=1) + 1, horizon)
    np.testing.assert_array_equal(ds.mask.sum(axis=1), first)  # a row stops at its first success
    quality = ds.provenance["quality"]
    assert quality["num_rollouts"] == ds.num_trajectories
    assert quality["goal_consistency"] == pytest.approx(ds.terminals.any(axis=1).mean())
    assert quality["simulated"] == (env_name not in ("metaworld", "libero"))


@pytest.mark.parametrize("env_name", ["babyai", "cheetah"])
def test_random_model_generation_is_a_valid_dataset_with_the_envs_rewards(env_name: str) -> None:
    env, params = make(env_name, "train", embed=False)
    rows, horizon = SHAPES[env_name]
    result = imagine(env_imaginer(env_name, seed=3), env, params, jax.random.key(1), rows,
                     horizon=horizon, progress=False)
    ds = result.dataset
    assert result.num_dropped_nonfinite == 0 and ds.env == env_name and ds.level == "train"
    assert ds.states.shape == (rows, horizon + 1, env.state_dim)
    assert ds.actions.shape == ((rows, horizon) if env.discrete else (rows, horizon, env.action_dim))
    validate_dataset(ds, num_actions=env.num_actions if env.discrete else None)
    check_rewards_and_stops(env_name, ds, params.max_steps)


def test_cheetah_generation_stops_on_the_running_displacement() -> None:
    """Every generated state moves 0.05 m forward: Σ = 0.05 t. "jump forward" (t >= 5, Σ > 0)
    stops at step 5; "jump backward" never; "jump in place" (t >= 15, |Σ| < 1.05) at step 15;
    forward-then-backward never. Reward of a jump step: clip(v, -1, 1) + 10 · 0.03 - 0.1 · 6 · 0.25."""
    imaginer = env_imaginer("cheetah", fixed_heads=True, state_bias=CHEETAH_STATE,
                            action_bias=CHEETAH_ACTION)
    horizon = SHAPES["cheetah"][1]
    for level, rows, lengths in (("train", [JUMP_FORWARD, JUMP_BACKWARD], [5, horizon]),
                                 ("hard", [JUMP_IN_PLACE, FORWARD_BACKWARD], [15, horizon])):
        env, params = make("cheetah", level, embed=False)
        ds = imagine(imaginer, env, params, jax.random.key(2), 2, task_indices=np.array(rows),
                     horizon=horizon, progress=False).dataset
        np.testing.assert_array_equal(ds.mask.sum(axis=1), lengths)
        np.testing.assert_array_equal(ds.terminals.any(axis=1), [True, False])
        assert ds.terminals[0, lengths[0] - 1] and ds.truncations[1, horizon - 1]
        np.testing.assert_allclose(ds.states[0, 1:lengths[0] + 1],
                                   np.tile(CHEETAH_STATE, (lengths[0], 1)), atol=1e-6)
        np.testing.assert_allclose(ds.actions[0, :lengths[0]], np.tile(CHEETAH_ACTION, (lengths[0], 1)),
                                   atol=1e-6)
        if level == "train":
            np.testing.assert_allclose(ds.rewards[0, :5], 1.0 + 0.3 - 0.15, rtol=1e-4)
            np.testing.assert_allclose(ds.rewards[1], -1.0 + 0.3 - 0.15, rtol=1e-4)
        check_rewards_and_stops("cheetah", ds, params.max_steps)
        summary = ds.provenance["quality"]
        assert summary["goal_consistency"] == 0.5 and summary["illegal_state_rate"] == 0.0


def test_continuous_actions_outside_the_box_are_clipped_as_the_simulator_would() -> None:
    """A regression head may predict an action outside the box; the simulator executes it clipped, so the
    rollout is generated (fed back, scored, written) with the clipped action: the same rollouts as a model
    predicting the clipped action itself, every written action inside the box (what ``train`` accepts),
    and the provenance says how often it happened."""
    from imaginejax.data.validate import EnvFacts, validate_for_env

    env, params = make("cheetah", "train", embed=False)
    outside = np.array([1.5, -2.0, 0.3, 1.0, -1.0, 4.0], np.float32)
    runs = {}
    for name, bias in (("outside", outside), ("clipped", np.clip(outside, -1.0, 1.0))):
        imaginer = env_imaginer("cheetah", fixed_heads=True, action_bias=bias)
        state_head = make_imaginer(seed=5, state_dim=18, num_actions=6, discrete=False).params["kalm"]["state_out"]
        imaginer = dataclasses.replace(imaginer, params={"llama": imaginer.params["llama"],
                                                         "kalm": {**imaginer.params["kalm"], "state_out": state_head}})
        runs[name] = imagine(imaginer, env, params, jax.random.key(3), 4, horizon=12, progress=False).dataset
    a, b = runs["outside"], runs["clipped"]
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.states, b.states)  # the fed-back action is the clipped one
    assert np.abs(a.actions[a.mask]).max() == 1.0
    validate_for_env(a, EnvFacts.of(env, legality=False))
    assert a.provenance["action_box"] == [-1.0, 1.0]
    assert a.provenance["clipped_action_rate"] == 1.0 and b.provenance["clipped_action_rate"] == 0.0


def test_metaworld_generation_stops_on_the_task_predicate() -> None:
    """The generated state has the object on the target: push succeeds at step 1 (reward 10);
    door-open's handle stays 0.35 m off (never; reward 0 once the state stops changing)."""
    env, params = make("metaworld", "train", embed=False)
    imaginer = env_imaginer("metaworld", fixed_heads=True, state_bias=metaworld_state(),
                            action_bias=np.array([0.1, 0.0, -0.1, 0.5], np.float32))
    rows, horizon = SHAPES["metaworld"]
    ds = imagine(imaginer, env, params, jax.random.key(5), rows,
                 task_indices=np.array([PUSH, DOOR_OPEN]), horizon=horizon, progress=False).dataset
    validate_dataset(ds)
    assert ds.states.shape == (2, horizon + 1, 91) and ds.actions.shape == (2, horizon, 4)
    np.testing.assert_array_equal(ds.mask.sum(axis=1), [1, horizon])
    assert ds.terminals[0, 0] and ds.rewards[0, 0] == pytest.approx(10.0)
    np.testing.assert_allclose(ds.rewards[1, 1:], 0.0, atol=1e-6)
    np.testing.assert_allclose(ds.states[1, 1:], np.tile(metaworld_state(), (5, 1)), atol=1e-6)
    assert np.asarray(mt.legal(jnp.asarray(ds.states[:, 0]))).all()  # s0 from the real reset
    check_rewards_and_stops("metaworld", ds, params.max_steps)
    summary = ds.provenance["quality"]
    assert summary["goal_consistency"] == 0.5 and summary["transition_error"] is None
    # A model that writes NaN states: every row dropped, nothing written (same shapes: no compile).
    with pytest.raises(ImaginationError, match="non-finite"):
        imagine(env_imaginer("metaworld", nan_states=True), env, params, jax.random.key(0), rows,
                horizon=horizon, progress=False)


@pytest.mark.parametrize("env_name", ["babyai", "cheetah"])
def test_non_finite_rows_are_dropped_and_an_all_nan_model_writes_nothing(env_name: str) -> None:
    env, params = make(env_name, "train", embed=False)
    imaginer = env_imaginer(env_name, seed=4)
    keys = jax.random.split(jax.random.key(0), 2)
    _, state = env.reset_to_task_batch(keys, params, jnp.zeros(2, jnp.int32))
    s0 = np.array(env.state_vector(state), np.float32)
    s0[1, 2] = np.nan  # this row's generated states become NaN
    goals = np.asarray(env.goal_of(state, params))
    ids = np.asarray(state.instruction)
    instructions = env.instructions("train")
    tokens, attention, state_inputs = rollout_prompts(
        FMT, imaginer.config, [imaginer.tokenizer.encode(instructions[i]).ids for i in ids], s0)
    out = generate_rollouts(imaginer.params, imaginer.config, imaginer.normalizer, tokens, attention,
                            state_inputs, s0, goals, horizon=SHAPES[env_name][1],
                            rules=episode_rules(env, params.max_steps))
    assert np.asarray(out.finite).tolist() == [True, False] and int(out.lengths[1]) == 1
    ds, dropped = rollouts_to_dataset(
        out, instruction_ids=ids, goals=goals, instructions=instructions,
        instruction_embeddings=np.zeros((len(instructions), 0), np.float32), env=env_name,
        level="train", discrete=bool(env.discrete), provenance={},
        num_actions=getattr(env, "num_actions", None))
    assert dropped == 1 and ds.num_trajectories == 1 and np.isfinite(ds.states).all()
    with pytest.raises(ImaginationError, match="non-finite"):
        imagine(env_imaginer(env_name, nan_states=True), env, params, jax.random.key(0),
                SHAPES[env_name][0], horizon=SHAPES[env_name][1], progress=False)


# ------------------------------------------------------------------------- HalfCheetah rules


@pytest.fixture(scope="module")
def cheetah_real() -> dict[str, TrajectoryDataset]:
    """Uniform random actions in the real environment, every task of the train and hard levels."""
    out = {}
    for level in ("train", "hard"):
        env, params = make("cheetah", level, embed=False)
        policy = lambda key, obs, state, params: jax.random.uniform(  # noqa: E731
            key, (obs.shape[0], 6), minval=-1.0, maxval=1.0)
        out[level] = collect(env, params, policy, jax.random.key(0), params.num_tasks,
                             task_indices=np.arange(params.num_tasks), progress=False)
    return out


def test_cheetah_real_trajectories_are_consistent_and_re_simulate_exactly(
        cheetah_real: dict[str, TrajectoryDataset]) -> None:
    report = quality_report(cheetah_real)
    for level, ds in cheetah_real.items():
        scores = report.scores[level]
        # The progress scan over the states gives the environment's own success, step by step.
        np.testing.assert_array_equal(scores.step_success, ds.terminals)
        np.testing.assert_array_equal(scores.goal_reached, ds.terminals.any(axis=1))
        assert 0 < ds.terminals.any(axis=1).sum() < ds.num_trajectories  # both outcomes occur
        assert scores.transition_error[ds.mask].max() < 5e-3  # float32 states, float64 physics
        assert report.levels[level]["illegal_state_rate"] == 0.0
        assert report.levels[level]["exceeds_dynamics_rate"] == 0.0
    # A joint-speed change of 1 rad/s at s_3 is an error of 1 / 0.1 on that transition only; the
    # next transition starts from the edited state and is re-simulated from it.
    ds = cheetah_real["train"]
    states = ds.states.copy()
    states[0, 3, 12] += 1.0
    edited = score_dataset(dataclasses.replace(ds, states=states))
    assert CHEETAH_ERROR_SCALE[12] == 0.1
    np.testing.assert_allclose(edited.transition_error[0, 2], 10.0, rtol=1e-3)
    np.testing.assert_allclose(edited.per_dimension_error[0, 2, 12], 10.0, rtol=1e-3)
    assert edited.per_dimension_error[0, 2, np.arange(18) != 12].max() < 5e-3
    assert edited.transition_error[0, 3] > 1.0  # s_4 is no longer what the physics makes of s_3
    np.testing.assert_array_equal(edited.exceeds_dynamics[0, :5], [0, 0, 1, 1, 0])


def test_cheetah_goal_consistency_by_hand() -> None:
    """dx = +0.1 for 5 steps then -0.3: Σ = 0.1 t, then 0.5 - 0.3 (t - 5). Jump forward (t >= 5,
    Σ > 0) holds from step 5 on; jump backward (Σ < 0) from step 7 (Σ = -0.1); a 6-step rollout
    therefore reaches jump forward, not jump backward."""
    horizon = 8
    dx = np.array([0.1] * 5 + [-0.3] * 3, np.float32)
    states = np.tile(CHEETAH_STATE, (2, horizon + 1, 1))
    states[:, 0, ct.DX] = 0.0
    states[:, 1:, ct.DX] = dx
    goals = np.asarray(ct.level_goals("train"))[[JUMP_FORWARD, JUMP_BACKWARD]]
    mask = np.ones((2, horizon), bool)
    ds = TrajectoryDataset(
        states=states, actions=np.zeros((2, horizon, 6), np.float32),
        rewards=np.zeros((2, horizon), np.float32), mask=mask, terminals=np.zeros_like(mask),
        truncations=np.eye(horizon, dtype=bool)[[-1, -1]],
        instruction_ids=np.zeros(2, np.int32), goals=goals, instructions=("jump",),
        instruction_embeddings=np.zeros((1, 0), np.float32), env="cheetah", level="train",
        source="imaginary", discrete=False)
    scores = score_dataset(ds)
    np.testing.assert_array_equal(scores.step_success[0], [0, 0, 0, 0, 1, 1, 0, 0])  # Σ 0.2 at t=7
    np.testing.assert_array_equal(scores.step_success[1], [0, 0, 0, 0, 0, 0, 1, 1])
    six = dataclasses.replace(ds, mask=np.tile(np.arange(horizon) < 6, (2, 1)),
                              truncations=np.eye(horizon, dtype=bool)[[5, 5]])
    np.testing.assert_array_equal(score_dataset(six).goal_reached, [True, False])


def test_cheetah_categories_partition_env_legal() -> None:
    rng = np.random.default_rng(1)
    states = rng.normal(0.0, [0.8, 1.0, 3.0] + [1.0] * 6 + [20.0] * 3 + [60.0] * 6, (4000, 18))
    states = states.astype(np.float32)
    states[:5, 4] = np.nan
    categories = check_categories_partition_legal(cheetah_violations, ct.legal, states, min_legal=0.05)
    assert categories["non-finite"][:5].all()
    # The simulator leaves non-finite rows non-finite (they score as infinitely wrong).
    rules = quality_rules("cheetah")
    out = np.asarray(rules.simulate(jnp.asarray(states[:8]), jnp.zeros((8, 6))))
    assert np.isnan(out[:5]).any(axis=1).all() and np.isfinite(out[5:]).all()


# -------------------------------------------------------------------------- Meta-World rules


def test_metaworld_expert_trajectories_and_hand_edited_states() -> None:
    env, params = make("metaworld", "train", embed=False)
    from imaginejax.envs.metaworld.expert import expert_policy

    rows = np.array([PUSH, DOOR_OPEN, mt.TASK_INDEX["button-press"]])
    ds = collect(env, params, expert_policy(), jax.random.key(0), len(rows), task_indices=rows,
                 progress=False)
    check_successful_expert_scores(ds, "the 91-d Meta-World state")
    valid = ds.states[:, :-1][ds.mask]
    np.testing.assert_allclose(np.asarray(project_metaworld(jnp.asarray(valid))), valid, atol=1e-6)
    # Hand edits of generated states, one category each (3 of the valid next states).
    states = ds.states.copy()
    states[0, 1, 2] = 1.5  # the hand 0.5 m above the workspace
    states[1, 1, 3] = 1.4  # gripper opening beyond 1
    states[2, 1, mt.SLOT_START + mt.SLOT_DIM * mt.ENTITIES.index("button") + 3:][:4] *= 2.0  # |q| = 2
    edited = summarize(score_dataset(dataclasses.replace(ds, states=states)))
    n = int(ds.mask.sum())
    assert edited["illegal_state_rate"] == pytest.approx(3 / n)
    assert edited["illegal_states_by_category"] == pytest.approx(
        {"non-finite": 0.0, "out of workspace": 1 / n, "gripper opening": 1 / n,
         "implausible pose": 1 / n})
    assert edited["legal_rollout_rate"] == 0.0


def test_metaworld_categories_partition_env_legal() -> None:
    rng = np.random.default_rng(2)
    states = np.zeros((4000, mt.STATE_DIM), np.float32)
    states[:, 0:3] = rng.uniform([-1.0, 0.0, -0.4], [1.0, 1.5, 1.2], (4000, 3))
    states[:, 3] = rng.uniform(-0.2, 1.2, 4000)
    for slot in (0, 5):  # two filled slots
        start = mt.SLOT_START + mt.SLOT_DIM * slot
        states[:, start:start + 3] = rng.uniform([-1.0, 0.0, -0.4], [1.0, 1.5, 1.2], (4000, 3))
        quat = rng.normal(size=(4000, 4))
        quat /= np.linalg.norm(quat, axis=1, keepdims=True)
        states[:, start + 3:start + 7] = quat * rng.choice([1.0, 1.2], (4000, 1), p=[0.9, 0.1])
    states[:5, 40] = np.nan
    check_categories_partition_legal(metaworld_violations, mt.legal, states, min_legal=0.02)


def test_metaworld_projection_repairs_each_field() -> None:
    """A generated state's faults, one per field: the hand and a filled slot outside the workspace,
    the gripper beyond 1, a scaled quaternion, small values in an empty slot (what makes every state of
    a delta-head imaginer illegal: "filled" with a zero quaternion at the origin)."""
    state = metaworld_state()
    obj = mt.SLOT_START + mt.SLOT_DIM * mt.ENTITIES.index("target_object")
    handle = mt.SLOT_START + mt.SLOT_DIM * mt.ENTITIES.index("handle")
    empty = next(mt.SLOT_START + mt.SLOT_DIM * k for k in range(mt.NUM_SLOTS)
                 if not state[mt.SLOT_START + mt.SLOT_DIM * k:][:mt.SLOT_DIM].any())
    bad = state.copy()
    bad[0:4] = [1.0, 0.1, 0.2, 1.4]
    bad[obj + 3:obj + 7] *= 2.0
    bad[handle:handle + 3] = [-0.3, 0.8, 1.5]
    bad[empty:empty + 7] = [1e-3, -2e-3, 1e-3, 0.01, -0.02, 0.0, 0.01]
    assert not bool(mt.legal(jnp.asarray(bad)))
    want = state.copy()
    want[0:4] = [0.8, 0.2, 0.2, 1.0]
    want[handle + 2] = mt.WORKSPACE_HIGH[2]
    out = np.asarray(project_metaworld(jnp.asarray(bad)))
    np.testing.assert_allclose(out, want, atol=1e-6)
    assert bool(mt.legal(jnp.asarray(out)))
    np.testing.assert_allclose(np.asarray(project_metaworld(jnp.asarray(state))), state, atol=1e-7)
    nan = state.copy()
    nan[obj] = np.nan
    assert np.isnan(np.asarray(project_metaworld(jnp.asarray(nan)))[obj])


# ------------------------------------------------------------------------------ BabyAI rules


def test_babyai_expert_trajectories_score_perfectly() -> None:
    from imaginejax.envs.babyai.expert import make_policy

    report = {}
    for level in ("hard",):  # key-door, line and gather: multi-stage goals
        env, params = make("babyai", level, embed=False)
        ds = collect(env, params, make_policy(), jax.random.key(1), 2 * params.num_tasks,
                     task_indices=np.arange(2 * params.num_tasks) % params.num_tasks, progress=False)
        scores = score_dataset(ds)
        np.testing.assert_array_equal(scores.goal_reached, ds.terminals.any(axis=1))
        np.testing.assert_array_equal(scores.step_success, ds.terminals)
        assert scores.transition_error[ds.mask].max() == 0.0
        report[level] = summarize(scores)
        assert report[level]["illegal_state_rate"] == 0.0
        assert report[level]["goal_consistency"] == pytest.approx(ds.terminals.any(axis=1).mean())
        # Every real state (carried objects, opened doors included) is legal and breaks no rule.
        states = ds.states[np.arange(ds.states.shape[1])[None] <= ds.mask.sum(axis=1)[:, None]]
        assert np.asarray(BabyAI.legal(jnp.asarray(states))).all()
        assert not any(np.asarray(v).any() for v in babyai_violations(jnp.asarray(states)).values())


def babyai_state(**fields: Any) -> np.ndarray:
    """A (17,) legal BabyAI state (ball (red, 2, 2), box (green, 5, 5), key (blue, 2, 5), closed yellow
    door at y = 3, agent (3, 3), hands empty) with ``fields`` given to ``make_grid`` instead."""
    grid = dict(ball=(0, 2, 2), box=(1, 5, 5), key=(2, 2, 5), door=(4, 3, G.CLOSED), agent=(3, 3),
                carried=(G.NOTHING, 0)) | fields
    return np.asarray(G.to_vector(G.make_grid(**grid)))


def reference_legal(state: jax.Array) -> jax.Array:
    """BabyAI's legality written as one conjunction of its rules, independently of ``tasks.violations``'
    causes (whose union ``tasks.legal`` is): (..., 17) -> (...) bool."""
    state = jnp.asarray(state)
    if jnp.issubdtype(state.dtype, jnp.floating):
        finite = jnp.all(jnp.isfinite(state), axis=-1)
        integral = jnp.all(jnp.abs(state - jnp.round(state)) < 1e-4, axis=-1)
        safe = jnp.where(jnp.isfinite(state), state, 0.0)
    else:
        finite = integral = jnp.ones(state.shape[:-1], bool)
        safe = state
    g = G.from_vector(jnp.clip(safe, -1e6, 1e6))
    colour_ok = lambda c: (c >= 0) & (c < G.NUM_COLOURS)  # noqa: E731
    ok = finite & integral & colour_ok(g.door_colour)
    ok &= (g.carried >= G.NOTHING) & (g.carried <= G.KEY)
    for s, obj in enumerate(G.OBJECTS):
        held = g.carried == obj
        at_origin = (g.x[s] == 0) & (g.y[s] == 0)
        ok &= colour_ok(g.colour[s])
        ok &= jnp.where(held, at_origin & (g.carried_colour == g.colour[s]), G.in_room(g.x[s], g.y[s]))
    ok &= jnp.where(g.carried == G.NOTHING, g.carried_colour == 0, True)
    for i in range(G.NUM_OBJECTS):
        for j in range(i + 1, G.NUM_OBJECTS):
            both_floor = (g.carried != G.OBJECTS[i]) & (g.carried != G.OBJECTS[j])
            ok &= ~(both_floor & (g.x[i] == g.x[j]) & (g.y[i] == g.y[j]))
    ok &= (g.door_x == G.DOOR_X) & (g.door_y >= G.ROOM_MIN) & (g.door_y <= G.ROOM_MAX)
    ok &= (g.door_state >= G.OPEN) & (g.door_state <= G.LOCKED)
    ok &= G.in_room(g.agent_x, g.agent_y)
    return ok


def test_babyai_violations_name_the_broken_rule() -> None:
    base = babyai_state()
    half, nan, door_x = base.copy(), base.copy(), base.copy()
    half[G.AGENT_X], nan[G.BALL_X], door_x[G.DOOR_X_INDEX] = 2.5, np.nan, G.DOOR_X - 1
    one_per_cause = {
        "non-finite or non-integer": [half, nan],
        "colour, carried type or door state out of range": [
            babyai_state(ball=(G.NUM_COLOURS, 2, 2)), babyai_state(carried=(G.KEY + 1, 0)),
            babyai_state(door=(4, 3, G.LOCKED + 1))],
        "carried object not at (0, 0)": [babyai_state(carried=(G.BALL, 0))],
        "carried colour not the carried object's": [babyai_state(ball=(0, 0, 0), carried=(G.BALL, 1))],
        "floor object outside the interior": [babyai_state(ball=(0, 0, 0)), babyai_state(key=(2, 7, 4))],
        "two floor objects on one cell": [babyai_state(ball=(0, 5, 5))],
        "nothing carried, colour not 0": [babyai_state(carried=(G.NOTHING, 1))],
        "agent or door off its cells": [babyai_state(agent=(0, 3)), babyai_state(door=(4, 0, G.OPEN)), door_x],
    }
    carrying = babyai_state(ball=(0, 0, 0), carried=(G.BALL, 0))
    assert np.asarray(BabyAI.legal(jnp.asarray(np.stack([base, carrying])))).all()
    causes = babyai_violations(jnp.asarray(np.stack([base, carrying])))
    assert not any(np.asarray(v).any() for v in causes.values())
    assert list(babyai_violations(jnp.asarray(base))) == list(one_per_cause)
    for cause, states in one_per_cause.items():
        flagged = {name: np.asarray(v) for name, v in babyai_violations(jnp.asarray(np.stack(states))).items()}
        assert flagged.pop(cause).all(), cause
        assert not any(v.any() for v in flagged.values()), cause
    # Random edits of one or two fields (integers from -1 to 8, a few halves and NaNs): the causes
    # flag exactly the states legal() rejects.
    rng = np.random.default_rng(0)
    states = np.tile(np.stack([base, carrying]), (1000, 1))
    for _ in range(2):
        fields = rng.integers(0, G.STATE_DIM, len(states))
        states[np.arange(len(states)), fields] = rng.integers(-1, 9, len(states))
    states[::50, G.AGENT_Y] += 0.5
    states[1::97, G.KEY_X] = np.nan
    categories = jax.jit(babyai_violations)(jnp.asarray(states))
    check_categories_partition_legal(lambda s: categories, reference_legal, states, min_legal=0.05)
    np.testing.assert_array_equal(np.asarray(BabyAI.legal(jnp.asarray(states))), np.asarray(reference_legal(states)))


# ------------------------------------------------------------------------------ LIBERO rules


def libero_qpos() -> np.ndarray:
    """(37,) a resting scene: the arm at home with the fingers half closed (0.02 m each), the soup can
    at the fingertip centre (lifted: home is far above the floor), the cheese, the bottle and the basket
    on the floor, all upright."""
    qpos = np.zeros(lm.NQ, np.float64)
    qpos[0:7] = lm.HOME_QPOS
    qpos[7:9] = 0.02
    tcp = np.asarray(lm.fk(jnp.asarray(lm.HOME_QPOS, jnp.float32))[0], np.float64)
    poses = [(tcp, 0.0), ((0.45, 0.25, lt.REST_Z[1]), 0.3), ((0.45, -0.25, lt.REST_Z[2]), 0.0),
             ((0.25, 0.45, 0.0), 0.0)]
    for k, (pos, yaw) in enumerate(poses):
        qpos[9 + 7 * k:12 + 7 * k] = pos
        qpos[12 + 7 * k:16 + 7 * k] = [np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]
    return qpos


def libero_state() -> np.ndarray:
    """(44,) the state of :func:`libero_qpos` (legal)."""
    return np.asarray(lt.state_from_qpos(jnp.asarray(libero_qpos(), jnp.float32)))


PICK_CAN, PICK_CHEESE = lt.TASK_INDEX["pick-soup_can"], lt.TASK_INDEX["pick-cream_cheese"]


def test_libero_generation_stops_on_the_task_predicate() -> None:
    """Every generated state holds the can at the fingertips, lifted: "pick the soup can" succeeds at
    step 1, "pick the cream cheese" never (the cheese stays on the floor 0.4 m away; reward 0 once the
    state stops changing). The state is legal, so the projection (on by default) leaves it alone."""
    env, params = make("libero", "train", embed=False)
    state = libero_state()
    assert bool(lt.legal(jnp.asarray(state)))
    goal_rows = [list(np.asarray(params.goals)[:, 0]).index(k) for k in (PICK_CAN, PICK_CHEESE)]
    imaginer = env_imaginer("libero", fixed_heads=True, state_bias=state,
                            action_bias=np.full(7, 0.1, np.float32))
    rows, horizon = SHAPES["libero"]
    result = imagine(imaginer, env, params, jax.random.key(6), rows, task_indices=np.array(goal_rows),
                     horizon=horizon, progress=False)
    ds = result.dataset
    validate_dataset(ds)
    assert ds.states.shape == (2, horizon + 1, 44) and ds.actions.shape == (2, horizon, 7)
    assert ds.provenance["projection"] is not None
    np.testing.assert_array_equal(ds.mask.sum(axis=1), [1, horizon])
    assert ds.terminals[0, 0] and ds.truncations[1, horizon - 1]
    np.testing.assert_allclose(ds.states[1, 1:], np.tile(state, (horizon, 1)), atol=1e-5)
    np.testing.assert_allclose(ds.rewards[1, 1:], 0.0, atol=1e-5)
    assert np.asarray(lt.legal(jnp.asarray(ds.states[:, 0]))).all()  # s0 from the real reset
    check_rewards_and_stops("libero", ds, params.max_steps)
    summary = ds.provenance["quality"]
    assert summary["goal_consistency"] == 0.5 and summary["transition_error"] is None
    assert summary["illegal_state_rate"] == 0.0
    with pytest.raises(ImaginationError, match="non-finite"):
        imagine(env_imaginer("libero", nan_states=True), env, params, jax.random.key(0), rows,
                horizon=horizon, progress=False)


def test_libero_expert_trajectories_score_as_the_env_saw_them_and_hand_edited_states() -> None:
    """The hard level's staged tasks ("a then b" carries its stage, "aside" the episode's start): the
    rules scanned over the recorded states give the environment's own terminals step by step."""
    from imaginejax.envs.libero.expert import expert_policy

    env, params = make("libero", "hard", embed=False)
    names = ("basket-soup_can-then-cream_cheese", "move-cream_cheese-aside", "fire-take-soup_can-out")
    goal_rows = list(np.asarray(params.goals)[:, 0])
    rows = np.array([goal_rows.index(lt.TASK_INDEX[n]) for n in names])
    ds = collect(env, params, expert_policy(), jax.random.key(3), len(rows), task_indices=rows,
                 progress=False)
    check_successful_expert_scores(ds, "the 44-d LIBERO state")
    # Hand edits of generated states, one category each.
    states = ds.states.copy()
    states[0, 1, 3] = lm.JOINT_HIGH[3] + 0.2     # joint 4 beyond its range (the eef follows it: 2 categories)
    states[1, 1, 14] = 0.08                       # a finger slide beyond its travel
    states[2, 1, lt.BASKET_START + 3:lt.BASKET_START + 7] *= 1.5  # |q| = 1.5
    states[2, 2, lt.OBJ_START + 2] = 2.0          # the can 2 m up
    edited = summarize(score_dataset(dataclasses.replace(ds, states=states)))
    n = int(ds.mask.sum())
    assert edited["illegal_state_rate"] == pytest.approx(4 / n)
    assert edited["illegal_states_by_category"] == pytest.approx(
        {"non-finite": 0.0, "joint limits": 1 / n, "end-effector off the arm": 1 / n,
         "gripper opening": 1 / n, "out of workspace": 1 / n, "implausible pose": 1 / n})
    assert edited["legal_rollout_rate"] == 0.0


def test_libero_categories_partition_env_legal() -> None:
    rng = np.random.default_rng(3)
    base = libero_state()
    states = np.tile(base, (4000, 1))
    which = rng.integers(0, 6, 4000)
    noise = rng.normal(size=(4000, 44)).astype(np.float32)
    states[which == 0, 0:7] += 0.3 * noise[which == 0, 0:7]          # joints (eef off the arm, limits)
    states[which == 1, 7:10] += 0.02 * noise[which == 1, 7:10]       # eef position
    states[which == 2, 14:16] += 0.03 * noise[which == 2, 14:16]     # fingers
    states[which == 3, 16:19] += 0.8 * noise[which == 3, 16:19]      # the can's position
    states[which == 4, 40:44] *= rng.choice([1.0, 1.1], (int((which == 4).sum()), 1))  # basket quaternion
    states[which == 5, 9] = np.nan
    check_categories_partition_legal(libero_violations, lt.legal, states, min_legal=0.05)


def test_libero_projection_repairs_each_field_and_keeps_legal_states() -> None:
    state = libero_state()
    np.testing.assert_allclose(np.asarray(project_libero(jnp.asarray(state))), state, atol=1e-6)
    bad = state.copy()
    bad[0] = lm.JOINT_HIGH[0] + 0.4            # joint 1 beyond its range
    bad[7:10] += 0.3                          # eef detached from the joints
    bad[10:14] = -bad[10:14]                  # the same rotation, w < 0
    bad[14:16] = [-0.02, 0.07]                # fingers beyond their travel
    bad[lt.OBJ_START:lt.OBJ_START + 3] = [5.0, 0.0, -1.0]   # the can outside the workspace
    bad[lt.BASKET_START + 3:lt.BASKET_START + 7] *= 3.0      # a scaled quaternion
    bad[lt.OBJ_START + 10:lt.OBJ_START + 14] = 0.0           # the cheese's quaternion zero
    out = np.asarray(project_libero(jnp.asarray(bad)))
    want_q = state[0:7].copy()
    want_q[0] = lm.JOINT_HIGH[0]
    np.testing.assert_allclose(out[0:7], want_q, atol=1e-6)
    tcp, quat, _, _ = lm.fk(jnp.asarray(want_q))
    quat = np.asarray(quat) * np.sign(np.asarray(quat)[0])
    np.testing.assert_allclose(out[7:10], np.asarray(tcp), atol=1e-6)
    np.testing.assert_allclose(out[10:14], quat, atol=1e-6)
    np.testing.assert_allclose(out[14:16], [0.0, lm.GRIPPER_OPEN], atol=1e-7)
    np.testing.assert_allclose(out[lt.OBJ_START:lt.OBJ_START + 3], [lt.WORKSPACE_HIGH[0], 0.0, lt.WORKSPACE_LOW[2]])
    np.testing.assert_allclose(out[lt.BASKET_START + 3:lt.BASKET_START + 7], state[lt.BASKET_START + 3:], atol=1e-6)
    np.testing.assert_allclose(out[lt.OBJ_START + 10:lt.OBJ_START + 14], [1.0, 0.0, 0.0, 0.0])
    assert bool(lt.legal(jnp.asarray(out))) and not bool(lt.legal(jnp.asarray(bad)))
    np.testing.assert_array_equal(np.isnan(np.asarray(project_libero(jnp.full(44, np.nan)))), True)


def test_libero_staged_goal_consistency_by_hand() -> None:
    """The cheese enters the basket at step 2, the can at step 4 (both stay): "the cheese, then the
    can" holds from step 4 on; "the can, then the cheese" never (the same final states, the wrong
    order: its stage never advanced). "Move the bottle aside" compares with the first state: the
    bottle is 0.05 m off at step 3 (not yet aside), 0.10 m off from step 5."""
    horizon = 6
    base = libero_state()
    basket = base[lt.BASKET_START:lt.BASKET_START + 3]
    states = np.tile(base, (horizon + 1, 1))
    can, cheese, bottle = (lt.OBJ_START + 7 * k for k in range(3))
    states[2:, cheese:cheese + 3] = basket + [-0.05, 0.0, lt.REST_Z[1]]
    states[4:, can:can + 3] = basket + [0.08, 0.0, lt.REST_Z[0]]
    states[3:5, bottle] += 0.05
    states[5:, bottle] += 0.10
    names = ("basket-cream_cheese-then-soup_can", "basket-soup_can-then-cream_cheese", "move-salad_dressing-aside")
    goals = np.asarray(lt.level_goals("hard"))[[list(np.asarray(lt.level_goals("hard"))[:, 0]).index(
        lt.TASK_INDEX[n]) for n in names]]
    mask = np.ones((3, horizon), bool)
    ds = TrajectoryDataset(
        states=np.tile(states, (3, 1, 1)), actions=np.zeros((3, horizon, 7), np.float32),
        rewards=np.zeros((3, horizon), np.float32), mask=mask, terminals=np.zeros_like(mask),
        truncations=np.eye(horizon, dtype=bool)[[-1, -1, -1]], instruction_ids=np.zeros(3, np.int32),
        goals=goals, instructions=("put things away",), instruction_embeddings=np.zeros((1, 0), np.float32),
        env="libero", level="hard", source="imaginary", discrete=False)
    scores = score_dataset(ds)
    np.testing.assert_array_equal(scores.step_success[0], [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(scores.step_success[1], [0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(scores.step_success[2], [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(scores.goal_reached, [True, False, True])
