"""The imaginer's quality report and filter (imaginejax.imaginer.quality) on hand-built rollouts with
known answers: a rollout stepped by the simulator has zero transition error, a teleported ball has
exactly its jump as error, a ball off the table and two overlapping balls are illegal (by category),
a rollout ending in the goal is consistent; the summary rates and the filter's choices are counted by
hand. Also: the CLEVR categories partition ``env.legal``, the projection lands on legal states, BabyAI
is scored from its 17-d vector (illegal states by cause), and a new environment's rules are scored as given
(one illegal-states column when they have no causes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data.io import load_dataset, save_dataset
from imaginejax.data.types import TrajectoryDataset
from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks as babyai_tasks
from imaginejax.envs.clevr import physics
from imaginejax.envs.babyai.quality import project_babyai
from imaginejax.envs.clevr import tasks as clevr_tasks
from imaginejax.envs.clevr.quality import clevr_violations, project_clevr
from imaginejax.envs.registry import ILLEGAL, QualityRules
from imaginejax.imaginer.quality import (
    QualityError,
    filter_dataset,
    quality_report,
    score_dataset,
    summarize,
)

R = clevr_tasks.BALL_RADIUS
# Five balls far apart: red, blue, green, purple, cyan.
SPREAD = np.array([[-0.7, 0.5], [0.0, 0.0], [0.7, 0.5], [-0.7, -0.5], [0.7, -0.5]], np.float32)
RED_BEHIND_BLUE = clevr_tasks.encode_goal(clevr_tasks.KIND_RELATIONAL, ((0, 1, clevr_tasks.BEHIND),))
PUSH_RED_RIGHT, PUSH_RED_FRONT, PUSH_CYAN_BEHIND = 0 * 8 + 0, 0 * 8 + 3, 4 * 8 + 1
HORIZON = 3


def simulate(balls: np.ndarray, action: int) -> np.ndarray:
    """The simulator's next layout (5, 2) from a layout and an action."""
    ball, direction = divmod(action, 8)
    return np.asarray(physics.push(jnp.asarray(balls)[None], jnp.array([ball]),
                                   jnp.array([direction])))[0]


def clevr_dataset(rollouts: list[tuple[list[np.ndarray], list[int], bool]]) -> TrajectoryDataset:
    """Rollouts given as (layouts s0..sL (each (5, 2)), actions, success on the last step)."""
    n = len(rollouts)
    states = np.zeros((n, HORIZON + 1, 10), np.float32)
    actions = np.zeros((n, HORIZON), np.int32)
    mask = np.zeros((n, HORIZON), bool)
    terminals = np.zeros((n, HORIZON), bool)
    truncations = np.zeros((n, HORIZON), bool)
    for i, (layouts, acts, success) in enumerate(rollouts):
        length = len(acts)
        states[i, : length + 1] = np.stack(layouts).reshape(length + 1, 10)
        actions[i, :length] = acts
        mask[i, :length] = True
        (terminals if success else truncations)[i, length - 1] = True
    return TrajectoryDataset(
        states=states, actions=actions, rewards=np.zeros((n, HORIZON), np.float32), mask=mask,
        terminals=terminals, truncations=truncations, instruction_ids=np.zeros(n, np.int32),
        goals=np.tile(RED_BEHIND_BLUE, (n, 1)), instructions=("Move the red ball behind the blue ball.",),
        instruction_embeddings=np.zeros((1, 0), np.float32), env="clevr", level="rephrase",
        source="imaginary", discrete=True, provenance={"model": "hand-built"})


def take_rows(ds: TrajectoryDataset, rows: list[int]) -> TrajectoryDataset:
    return dataclasses.replace(ds, states=ds.states[rows], actions=ds.actions[rows],
                               rewards=ds.rewards[rows], mask=ds.mask[rows], terminals=ds.terminals[rows],
                               truncations=ds.truncations[rows], instruction_ids=ds.instruction_ids[rows],
                               goals=ds.goals[rows])


def with_ball(layout: np.ndarray, ball: int, xy: tuple[float, float]) -> np.ndarray:
    out = layout.copy()
    out[ball] = xy
    return out


@pytest.fixture(scope="module")
def rollouts() -> TrajectoryDataset:
    s1 = simulate(SPREAD, PUSH_RED_RIGHT)
    s2 = simulate(s1, PUSH_CYAN_BEHIND)
    near = with_ball(SPREAD, 0, (0.0, 0.55))  # red straight behind blue, 0.55 away: not yet the goal
    return clevr_dataset([
        # R0 physical: both steps are the simulator's; the goal is not reached.
        ([SPREAD, s1, s2], [PUSH_RED_RIGHT, PUSH_CYAN_BEHIND], False),
        # R1 teleport: at step 1 purple jumps 0.5 along +x (the push moves cyan, far away).
        ([SPREAD, s1, with_ball(s2, 3, (-0.2, -0.5))], [PUSH_RED_RIGHT, PUSH_CYAN_BEHIND], False),
        # R2 off the table: red at x = -1.2, outside the workbench [-0.9, 0.9].
        ([SPREAD, with_ball(s1, 0, (-1.2, 0.5))], [PUSH_RED_RIGHT], False),
        # R3 overlap: red put 0.05 from blue's centre.
        ([SPREAD, with_ball(SPREAD, 0, (0.05, 0.0))], [PUSH_RED_RIGHT], False),
        # R4 consistent but impossible: red appears 0.3 straight behind blue.
        ([SPREAD, with_ball(SPREAD, 0, (0.0, 0.3))], [PUSH_RED_RIGHT], True),
        # R5 consistent and physical: red pushed 0.19 towards blue ends 0.356 straight behind it.
        ([near, simulate(near, PUSH_RED_FRONT)], [PUSH_RED_FRONT], True),
    ])


def test_hand_built_rollouts_have_the_known_scores(rollouts: TrajectoryDataset) -> None:
    final_red = rollouts.states[5, 1, :2]
    assert abs(final_red[0]) < 1e-6 and 0.26 < final_red[1] < 0.39  # R5 really reaches the goal
    scores = score_dataset(rollouts)
    # (a) goal consistency: R4 and R5.
    np.testing.assert_array_equal(scores.goal_reached, [False, False, False, False, True, True])
    # (b) the simulator's own steps have no error; the teleported purple ball is off by its jump.
    error = scores.transition_error
    assert error[0, 0] < 1e-4 and error[0, 1] < 1e-4 and error[1, 0] < 1e-4 and error[5, 0] < 1e-4
    np.testing.assert_allclose(error[1, 1], 0.5 / R, rtol=1e-4)
    np.testing.assert_allclose(scores.per_dimension_error[1, 1, 6], 0.5 / R, rtol=1e-4)  # purple x
    assert scores.per_dimension_error[1, 1, [0, 1, 2, 3, 4, 5, 7, 8, 9]].max() < 1e-4
    red_after_push = simulate(SPREAD, PUSH_RED_RIGHT)[0]
    np.testing.assert_allclose(error[2, 0], abs(-1.2 - red_after_push[0]) / R, rtol=1e-4)
    np.testing.assert_allclose(error[4, 0], np.linalg.norm(red_after_push - [0.0, 0.3]) / R, rtol=1e-4)
    np.testing.assert_array_equal(scores.exceeds_dynamics,
                                  [[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]])
    # (c) illegal states, by category.
    np.testing.assert_array_equal(scores.legal_next.all(axis=1), [1, 1, 0, 0, 1, 1])
    assert scores.violations["out of workbench"][2, 0] and not scores.violations["overlapping balls"][2, 0]
    assert scores.violations["overlapping balls"][3, 0] and not scores.violations["out of workbench"][3, 0]
    assert scores.legal_initial.all()

    s = summarize(scores)
    assert s["num_rollouts"] == 6 and s["num_transitions"] == 8
    assert s["goal_consistency"] == pytest.approx(2 / 6)
    assert s["legal_rollout_rate"] == pytest.approx(4 / 6)
    assert s["consistent_and_legal_rate"] == pytest.approx(2 / 6)
    assert s["illegal_state_rate"] == pytest.approx(2 / 8)
    assert s["illegal_states_by_category"] == pytest.approx(
        {"non-finite": 0.0, "out of workbench": 1 / 8, "overlapping balls": 1 / 8})
    assert s["exceeds_dynamics_rate"] == pytest.approx(4 / 8)
    assert s["realistic_rollout_rate"] == pytest.approx(2 / 6)  # R0 and R5
    assert s["consistent_and_realistic_rate"] == pytest.approx(1 / 6)  # R5
    assert s["transition_error"]["max"] == pytest.approx(float(error[scores.mask].max()))
    assert len(s["per_dimension_error"]) == 10
    json.dumps(s)  # JSON-able as it goes into the manifest


def test_threshold_changes_only_the_exceeds_rate(rollouts: TrajectoryDataset) -> None:
    loose = summarize(score_dataset(rollouts, threshold=0.5 / R + 0.01))  # above the teleport
    assert loose["exceeds_dynamics_rate"] == pytest.approx(3 / 8)
    assert loose["goal_consistency"] == pytest.approx(2 / 6)


def test_report_markdown_and_levels(rollouts: TrajectoryDataset) -> None:
    report = quality_report({"rephrase": rollouts, "hard": dataclasses.replace(rollouts, level="hard")})
    assert list(report.levels) == ["rephrase", "hard"]
    table = report.to_markdown()
    assert "| rephrase | 6 | 33.3 % | 66.7 % | 33.3 % | 25.0 % |" in table
    assert "out of workbench (states)" in table and "ball radii (0.13)" in table
    assert json.loads(json.dumps(report.to_dict()))["levels"]["hard"]["num_rollouts"] == 6
    with pytest.raises(QualityError, match="same level"):
        quality_report([rollouts, rollouts])


def test_categories_partition_env_legal_and_projection_is_legal() -> None:
    rng = np.random.default_rng(0)
    states = rng.uniform(-1.1, 1.1, size=(4000, 10)).astype(np.float32)
    states[:5, 0] = np.nan
    categories = clevr_violations(jnp.asarray(states))
    any_category = np.any(np.stack([np.asarray(v) for v in categories.values()]), axis=0)
    legal = np.asarray(clevr_tasks.legal(jnp.asarray(states)))
    np.testing.assert_array_equal(any_category, ~legal)
    assert 0 < legal.mean() < 1  # both kinds occur
    finite = np.isfinite(states).all(axis=1)
    projected = np.asarray(project_clevr(jnp.asarray(states[finite])))
    assert np.asarray(clevr_tasks.legal(jnp.asarray(projected))).all()
    was_legal = legal[finite]
    np.testing.assert_allclose(projected[was_legal], states[finite][was_legal], atol=1e-6)
    assert np.isnan(np.asarray(project_clevr(jnp.asarray(states[:5])))).any(axis=1).all()


def test_filter_whole_trajectories(rollouts: TrajectoryDataset, tmp_path: Path) -> None:
    report = quality_report(rollouts)
    strict = filter_dataset(rollouts, report, max_transition_error=1.0)
    np.testing.assert_array_equal(strict.states, rollouts.states[[0, 5]])  # R0, R5 unchanged
    np.testing.assert_array_equal(strict.terminals, rollouts.terminals[[0, 5]])
    record = strict.provenance["filters"][-1]
    assert record["rollouts_in"] == 6 and record["rollouts_kept"] == 2
    assert record["transitions_kept"] == 3 and record["mode"] == "trajectory"
    assert record["quality_before"]["goal_consistency"] == pytest.approx(2 / 6)
    assert strict.provenance["quality"]["realistic_rollout_rate"] == 1.0
    assert strict.provenance["model"] == "hand-built"
    legal_only = filter_dataset(rollouts, report)  # require_legal only
    np.testing.assert_array_equal(legal_only.states, rollouts.states[[0, 1, 4, 5]])
    goal = filter_dataset(rollouts, report, require_goal=True)
    np.testing.assert_array_equal(goal.states, rollouts.states[[4, 5]])
    assert goal.provenance["quality"]["goal_consistency"] == 1.0
    # Filters stack in the provenance and survive a save/load.
    twice = filter_dataset(goal, quality_report(goal), max_transition_error=1.0)
    assert [f["rollouts_kept"] for f in twice.provenance["filters"]] == [2, 1]
    loaded = load_dataset(save_dataset(twice, tmp_path / "filtered"))
    assert loaded.provenance["filters"][1]["max_transition_error"] == 1.0


def test_filter_truncating_at_the_first_bad_step(rollouts: TrajectoryDataset) -> None:
    cut = filter_dataset(rollouts, quality_report(rollouts), max_transition_error=1.0, mode="truncate")
    # R0 whole, R1 cut before its teleport (1 step), R2-R4 bad from step 0, R5 whole.
    np.testing.assert_array_equal(cut.mask.sum(axis=1), [2, 1, 1])
    np.testing.assert_array_equal(cut.states[1, :2], rollouts.states[1, :2])
    assert not cut.states[1, 2:].any()
    assert cut.truncations[1, 0] and not cut.terminals[1].any()
    assert cut.terminals[2, 0]  # R5 keeps its terminal
    assert cut.provenance["filters"][-1]["transitions_kept"] == 4


def test_filter_refuses_a_foreign_report_and_an_empty_result(rollouts: TrajectoryDataset) -> None:
    other = dataclasses.replace(rollouts, states=rollouts.states + np.float32(0.01))
    with pytest.raises(QualityError, match="fingerprint"):
        filter_dataset(other, quality_report(rollouts))
    with pytest.raises(QualityError, match="no level"):
        filter_dataset(dataclasses.replace(rollouts, level="easy"), quality_report(rollouts))
    illegal_only = take_rows(rollouts, [2, 3])
    with pytest.raises(QualityError, match="passes the filter"):
        filter_dataset(illegal_only, quality_report(illegal_only))


def test_babyai_is_scored_from_its_state_vector() -> None:
    start = G.to_vector(G.make_grid(ball=(0, 2, 2), box=(1, 4, 4), key=(2, 5, 1), door=(3, 3, 1),
                                    agent=(3, 3)))
    east = G.step_vector(start, jnp.asarray(1))  # agent to (4, 3)
    teleport = east.at[G.AGENT_X].set(1.0)  # 3 cells west of where the step leads
    wall = east.at[G.AGENT_X].set(0.0)  # inside the west wall: illegal
    n = 3
    states = np.zeros((n, 2, 17), np.float32)
    states[:, 0] = np.asarray(start)
    states[:, 1] = np.stack([np.asarray(east), np.asarray(teleport), np.asarray(wall)])
    goal = babyai_tasks.level_goals("train")[0]
    ds = TrajectoryDataset(
        states=states, actions=np.ones((n, 1), np.int32), rewards=np.zeros((n, 1), np.float32),
        mask=np.ones((n, 1), bool), terminals=np.zeros((n, 1), bool),
        truncations=np.ones((n, 1), bool), instruction_ids=np.zeros(n, np.int32),
        goals=np.tile(goal, (n, 1)), instructions=("go",), instruction_embeddings=np.zeros((1, 0), np.float32),
        env="babyai", level="train", source="imaginary", discrete=True)
    scores = score_dataset(ds)
    np.testing.assert_allclose(scores.transition_error[:, 0], [0.0, 3.0, 4.0])
    np.testing.assert_array_equal(scores.exceeds_dynamics[:, 0], [False, True, True])
    np.testing.assert_array_equal(scores.legal_next[:, 0], [True, True, False])
    broken = {name for name, v in scores.violations.items() if v[2, 0]}
    assert broken == {"agent or door off its cells"} and not any(v[:2].any() for v in scores.violations.values())
    head, _, row = quality_report(ds).to_markdown().splitlines()[:3]
    cells = dict(zip(head.strip("| ").split(" | "), row.strip("| ").split(" | ")))
    by_cause = {name[:-len(" (states)")]: v for name, v in cells.items() if name.endswith(" (states)")}
    assert cells["illegal states"] == "33.3 %" and set(by_cause) == set(scores.violations)
    assert by_cause.pop("agent or door off its cells") == "33.3 %" and set(by_cause.values()) == {"0.0 %"}
    # The projection rounds and clips every field: noise disappears, the agent returns to x = 6.
    noisy = east + jnp.asarray(np.random.default_rng(0).uniform(-0.3, 0.3, 17), jnp.float32)
    projected = np.asarray(project_babyai(noisy.at[G.AGENT_X].set(9.6)))
    np.testing.assert_array_equal(projected, np.asarray(east.at[G.AGENT_X].set(6.0)))


def test_babyai_projection_gives_legal_states_and_keeps_legal_ones() -> None:
    """Any vector projects to a state with no cause of illegality; a legal state (reset, and after
    random steps, carrying or not) is unchanged; hand cases: the carried type decides what is held,
    a clashing object takes the nearest free cell."""
    garbage = jnp.asarray(np.random.default_rng(1).uniform(-3.0, 10.0, (4096, 17)), jnp.float32)
    assert not any(bool(v.any()) for v in babyai_tasks.violations(project_babyai(garbage)).values())
    from imaginejax.envs.babyai.env import sample_grid

    goal = jnp.asarray(babyai_tasks.train_goals()[0])
    states = G.to_vector(jax.vmap(lambda k: sample_grid(k, goal))(jax.random.split(jax.random.key(0), 256)))
    visited = [states]
    for t in range(30):  # random walks with pick-ups and drops
        actions = jax.random.randint(jax.random.key(t + 1), (256,), 0, 7)
        states = G.step_vector(states, actions)
        visited.append(states)
    visited = jnp.concatenate(visited)
    assert bool(babyai_tasks.legal(visited).all()) and bool((visited[:, G.CARRIED_TYPE] > 0).any())
    np.testing.assert_array_equal(np.asarray(project_babyai(visited)), np.asarray(visited))
    #        ball        box         key         door          agent  carried
    state = [0, 3, 4,    2, 3, 4,    4, 5, 5,    1, 7, 3, 1,   2, 2,  3, 0]
    want = [0, 3, 4,     2, 3, 3,    4, 0, 0,    1, 7, 3, 1,   2, 2,  3, 4]
    np.testing.assert_array_equal(np.asarray(project_babyai(jnp.asarray(state, jnp.float32) + 0.2)), want)
    state = [0, 0, 0,    2, 1, 1,    4, 5, 5,    1, 7, 3, 1,   2, 2,  0, 5]
    want = [0, 1, 1,     2, 2, 1,    4, 5, 5,    1, 7, 3, 1,   2, 2,  0, 0]
    np.testing.assert_array_equal(np.asarray(project_babyai(jnp.asarray(state, jnp.float32))), want)


def test_quality_rules_of_a_new_environment() -> None:
    """A 2-d toy world (a point moved by ±0.1 per action) with and without a simulator, scored with the
    rules its registry entry would give."""
    legal = lambda s: jnp.all(jnp.abs(s) <= 1.0, axis=-1)  # noqa: E731
    success = lambda prev, a, nxt, goal: nxt[..., 0] > 0.5  # noqa: E731
    step = lambda s, a: s.at[..., 0].add(jnp.where(a == 0, 0.1, -0.1))  # noqa: E731
    sim_rules = QualityRules(
        name="toy-sim", state_dim=2, success=success, legal=legal, simulate=step, entity_size=1,
        error_scale=0.1, error_unit="steps of 0.1", threshold=0.5)
    nosim_rules = QualityRules(
        name="toy-nosim", state_dim=2, success=success, legal=legal, simulate=None, entity_size=1,
        error_scale=1.0, error_unit="-", threshold=1.0, no_simulator_reason="it is a toy")
    states = np.array([[[0.45, 0.0], [0.55, 0.0]], [[0.0, 0.0], [0.4, 2.0]]], np.float32)
    base = dict(states=states, actions=np.zeros((2, 1), np.int32), rewards=np.zeros((2, 1), np.float32),
                mask=np.ones((2, 1), bool), terminals=np.array([[True], [False]]),
                truncations=np.array([[False], [True]]), instruction_ids=np.zeros(2, np.int32),
                goals=np.zeros((2, 1), np.int32), instructions=("go right",),
                instruction_embeddings=np.zeros((1, 0), np.float32), level="train",
                source="imaginary", discrete=True)
    sim = summarize(score_dataset(TrajectoryDataset(env="toy-sim", **base), rules=sim_rules))
    assert sim["goal_consistency"] == 0.5 and sim["legal_rollout_rate"] == 0.5
    # row 1: x should be 0.1 (off by 0.3 = 3 steps), y should be 0 (off by 2 = 20 steps)
    assert sim["transition_error"]["max"] == pytest.approx(20.0, rel=1e-5)
    assert sim["exceeds_dynamics_rate"] == 0.5
    nosim = quality_report(TrajectoryDataset(env="toy-nosim", **base), rules=nosim_rules)
    assert nosim.levels["train"]["exceeds_dynamics_rate"] is None
    assert "not checked: it is a toy" in nosim.to_markdown()
    # Without causes the illegal-states column is the only one (not repeated as a category).
    assert list(nosim.levels["train"]["illegal_states_by_category"]) == [ILLEGAL]
    head = nosim.to_markdown().splitlines()[0]
    assert "| illegal states | transition error mean / p90 |" in head and f"{ILLEGAL} (states)" not in head
    with pytest.raises(QualityError, match="no simulator"):
        filter_dataset(TrajectoryDataset(env="toy-nosim", **base), nosim, max_transition_error=1.0)
    with pytest.raises(QualityError, match=r"give its registry entry \(imaginejax.envs.<name>.ENTRY\) a `quality`"):
        score_dataset(TrajectoryDataset(env="unknown-env", **base))


# --------------------------------------------------------------- generation: projection, exports


def test_projection_in_generation_writes_legal_states() -> None:
    from imaginejax.envs import make
    from imaginejax.imaginer.imagine import imagine
    from test_imagine import make_imaginer

    env, params = make("clevr", "easy", embed=False)  # one push per rollout
    illegal = np.array([2.0, 0.3, 0.0, 0.0, 0.05, 0.0, -0.6, -0.2, 0.3, 0.5], np.float32)  # off table,
    imaginer = make_imaginer(fixed_heads=True, state_bias=illegal)                 # blue/green overlap
    projected = imagine(imaginer, env, params, jax.random.key(0), 4, task_indices=np.arange(4),
                        project=True, progress=False)
    want = np.asarray(project_clevr(jnp.asarray(illegal)))
    assert not np.asarray(clevr_tasks.legal(jnp.asarray(illegal)))
    assert np.abs(want - illegal).max() > 0.1  # the projection moved balls
    np.testing.assert_allclose(projected.dataset.states[:, 1], np.tile(want, (4, 1)), atol=1e-6)
    assert projected.dataset.provenance["quality"]["illegal_state_rate"] == 0.0
    assert projected.dataset.provenance["projection"].startswith("clip to the workbench")
    assert projected.dataset.provenance["state_prediction"] == "absolute"


def test_written_datasets_carry_their_quality(tmp_path: Path) -> None:
    from imaginejax.imaginer.imagine import write_imaginary_datasets
    from test_imagine import make_imaginer

    written = write_imaginary_datasets(make_imaginer(fixed_heads=True), "clevr", tmp_path, 4,
                                       jax.random.key(3), levels=("easy",), embed=False,
                                       progress=False)
    loaded = load_dataset(written["easy"])
    stored = loaded.provenance["quality"]
    assert stored == json.loads(json.dumps(summarize(score_dataset(loaded))))  # recomputed: equal
    report = json.loads((tmp_path / "clevr-imaginary-quality.json").read_text())
    assert report["levels"]["easy"] == stored
    assert report["datasets"]["easy"] == {"dir": written["easy"].name, "checkpoint_hash": "0" * 64}
    assert "| easy | 4 |" in (tmp_path / "clevr-imaginary-quality.md").read_text()
    # A later call for another level into the same directory adds its row, keeps this one.
    path = tmp_path / "clevr-imaginary-quality.json"
    path.write_text(json.dumps({**report, "levels": {**report["levels"], "hard": stored},
                                "datasets": {**report["datasets"], "hard": {"dir": "x"}}}))
    again = write_imaginary_datasets(make_imaginer(fixed_heads=True), "clevr", tmp_path, 4,
                                     jax.random.key(4), levels=("easy",), embed=False, progress=False,
                                     overwrite=True)
    merged = json.loads(path.read_text())
    assert set(merged["levels"]) == {"easy", "hard"} and merged["datasets"]["hard"] == {"dir": "x"}
    assert merged["levels"]["easy"] == load_dataset(again["easy"]).provenance["quality"]
    assert "| hard | 4 |" in (tmp_path / "clevr-imaginary-quality.md").read_text()


def test_babyai_imagination_uses_the_step_indexed_reward() -> None:
    from imaginejax.envs import make
    from imaginejax.imaginer.imagine import imagine
    from test_imagine import make_imaginer

    env, params = make("babyai", "train", embed=False)
    fixed = np.asarray(G.to_vector(G.make_grid(ball=(0, 2, 2), box=(1, 4, 4), key=(2, 5, 1),
                                               door=(3, 3, G.OPEN), agent=(3, 3))))
    goals = np.asarray(params.goals)
    holds = np.asarray(env.success(jnp.asarray(fixed), 0, jnp.asarray(fixed), jnp.asarray(goals)))
    done_task, open_task = int(np.argmax(holds)), int(np.argmin(holds))
    assert holds[done_task] and not holds[open_task]
    imaginer = make_imaginer(fixed_heads=True, state_bias=fixed, state_dim=17, num_actions=7,
                             fixed_action=1)
    result = imagine(imaginer, env, params, jax.random.key(0), 2, horizon=3,
                     task_indices=np.array([done_task, open_task]), progress=False)
    ds = result.dataset
    np.testing.assert_array_equal(ds.mask.sum(axis=1), [1, 3])
    # success on the first step pays 1 - 0.9 t / T with t = 1, T = 128
    assert ds.rewards[0, 0] == pytest.approx(1.0 - 0.9 / 128)
    want = [float(env.reward(jnp.asarray(ds.states[1, t]), 1, jnp.asarray(ds.states[1, t + 1]),
                             jnp.asarray(ds.goals[1]), t + 1, 128)) for t in range(3)]
    np.testing.assert_allclose(ds.rewards[1], want, rtol=1e-6)
    assert ds.provenance["quality"]["num_rollouts"] == 2


def test_quality_rules_check_their_fields_and_per_dimension_scales() -> None:
    """A per-dimension error scale divides each dimension before the entity norm; malformed rules$
    are refused with the field named."""
    legal = lambda s: jnp.all(jnp.abs(s) <= 1.0, axis=-1)  # noqa: E731
    success = lambda prev, a, nxt, goal: nxt[..., 0] > 0.5  # noqa: E731
    step = lambda s, a: s.at[..., 0].add(0.1)  # noqa: E731
    common = dict(state_dim=2, legal=legal, simulate=step, entity_size=1, error_unit="-", threshold=1.0)
    with pytest.raises(ValueError, match="error_scale must be a number or 2 numbers"):
        QualityRules(name="bad", success=success, error_scale=(1.0, 1.0, 1.0), **common)
    with pytest.raises(ValueError, match="error_scale and threshold must be > 0"):
        QualityRules(name="bad", success=success, error_scale=(1.0, 0.0), **common)
    with pytest.raises(ValueError, match="`success` predicate or `episode` rules"):
        QualityRules(name="bad", success=None, error_scale=1.0, **common)
    scaled_rules = QualityRules(name="toy-scaled", success=success, error_scale=(0.1, 2.0), **common)
    # x should become 0.1 (off by 0.3 -> 3 units of 0.1), y should stay 0 (off by 0.5 -> 0.25 units)
    states = np.array([[[0.0, 0.0], [0.4, 0.5]]], np.float32)
    ds = TrajectoryDataset(
        states=states, actions=np.zeros((1, 1), np.int32), rewards=np.zeros((1, 1), np.float32),
        mask=np.ones((1, 1), bool), terminals=np.zeros((1, 1), bool), truncations=np.ones((1, 1), bool),
        instruction_ids=np.zeros(1, np.int32), goals=np.zeros((1, 1), np.int32), instructions=("go",),
        instruction_embeddings=np.zeros((1, 0), np.float32), env="toy-scaled", level="train",
        source="imaginary", discrete=True)
    scores = score_dataset(ds, rules=scaled_rules)
    np.testing.assert_allclose(scores.per_dimension_error[0, 0], [3.0, 0.25], rtol=1e-5)
    np.testing.assert_allclose(scores.transition_error[0, 0], 3.0, rtol=1e-5)
