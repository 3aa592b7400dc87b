"""Oversampled imagination (``imagine(..., oversample=k)``, ``imagine.oversample``): the ranking of
rollouts on hand-built scores, the per-task selection, generation with a small random imaginer
(oversample = 1 is the plain generation bitwise; k keeps N with the task mix of oversample = 1, each
task's kept rollouts rank above its dropped ones and reach their goal at least as often as
oversample = 1's), the filter applied after the selection, the dataset cache and workspace keys, the
plan text and the configuration's checks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import numpy as np
import pytest

from imaginejax.bench.config import ConfigError, load_config
from imaginejax.bench.datasets import filter_imaginary, reusable
from imaginejax.bench.workspace import open_workspace
from imaginejax.data.types import TrajectoryDataset
from imaginejax.envs import make
from imaginejax.imaginer.imagine import imagine, write_imaginary_datasets
from imaginejax.imaginer.quality import (RANKING_RULE, QualityError, RolloutScores, best_rows, rank_rollouts,
                                         score_dataset)
from test_imagine import make_imaginer

ROW_FIELDS = ("states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids", "goals")


def hand_scores(steps: list[list[float]], goal: list[bool], illegal_step: list[bool],
                legal_initial: list[bool] | None = None, simulated: bool = True) -> RolloutScores:
    """Scores of rollouts with the given per-step transition errors (padding filled with 99 to show it
    is ignored), goal reached, one illegal generated state, illegal s_0."""
    n, horizon = len(steps), max(len(s) for s in steps)
    mask = np.zeros((n, horizon), bool)
    error = np.full((n, horizon), 99.0, np.float32)
    legal_next = np.ones((n, horizon), bool)
    for i, row in enumerate(steps):
        mask[i, : len(row)] = True
        error[i, : len(row)] = row
        legal_next[i, len(row) - 1] = not illegal_step[i]
    if not simulated:
        error[:] = np.nan
    return RolloutScores(
        env="clevr", level="rephrase", fingerprint="", mask=mask, transition_error=error,
        per_dimension_error=np.zeros((n, horizon, 1), np.float32), exceeds_dynamics=np.zeros((n, horizon), bool),
        legal_next=legal_next, violations={}, legal_initial=np.array(legal_initial or [True] * n),
        step_success=np.zeros((n, horizon), bool), goal_reached=np.array(goal), threshold=1.0,
        error_unit="test", simulated=simulated)


# Row: mean error, goal, illegal step, legal s0 -> class.
#   0: 0.5, no goal, legal -> 2        1: (1 + 3) / 2 = 2, goal, legal -> 0
#   2: 0.1, goal, illegal step -> 1    3: 1, goal, legal -> 0
#   4: 0, no goal, illegal -> 3        5: 0.5, no goal, legal -> 2 (ties with row 0)
#   6: 0.05, goal, illegal s0 -> 1     7: (0.5 + 1.5 + 1 + 1) / 4 = 1, goal, legal -> 0 (ties with row 3;
#                                         its error sum 4 equals row 1's: the mean, not the sum, decides)
SCORES = hand_scores(steps=[[0.5], [1.0, 3.0], [0.1], [1.0], [0.0], [0.25, 0.75], [0.05], [0.5, 1.5, 1.0, 1.0]],
                     goal=[False, True, True, True, False, False, True, True],
                     illegal_step=[False, False, True, False, True, False, False, False],
                     legal_initial=[True] * 6 + [False, True])


def test_ranking_is_class_then_mean_error_then_generation_order() -> None:
    np.testing.assert_array_equal(rank_rollouts(SCORES), [3, 7, 1, 6, 2, 0, 5, 4])
    # Without a simulator the errors tie: the class, then the row decides.
    no_sim = hand_scores(steps=[[0.5], [1.0, 3.0], [0.1], [1.0], [0.0]], goal=[False, True, True, True, False],
                         illegal_step=[False, False, True, False, True], simulated=False)
    np.testing.assert_array_equal(rank_rollouts(no_sim), [1, 3, 2, 0, 4])
    assert RANKING_RULE.startswith("goal reached with every state legal, then goal reached, then every state legal")


def test_best_rows_keeps_each_groups_quota_and_fills_a_short_group() -> None:
    np.testing.assert_array_equal(best_rows(SCORES, 3), [1, 3, 7])
    np.testing.assert_array_equal(best_rows(SCORES, 20), np.arange(8))
    groups = np.array([0, 0, 1, 1, 1, 0, 1, 0])  # ranked: 3(g1) 7(g0) 1(g0) 6(g1) 2(g1) 0(g0) 5(g0) 4(g1)
    np.testing.assert_array_equal(best_rows(SCORES, 3, groups=groups, quotas={0: 1, 1: 2}), [3, 6, 7])
    np.testing.assert_array_equal(best_rows(SCORES, 4, groups=groups, quotas={0: 3, 1: 1}), [0, 1, 3, 7])
    # Group 2 has no rollout: its 2 places go to the best of the others not yet kept (1, then 6).
    np.testing.assert_array_equal(best_rows(SCORES, 4, groups=groups, quotas={0: 1, 1: 1, 2: 2}), [1, 3, 6, 7])
    with pytest.raises(QualityError, match="quotas sum to 5, more than count = 4"):
        best_rows(SCORES, 4, groups=groups, quotas={0: 3, 1: 2})


# --------------------------------------------------------------- generation with a random imaginer

N, K, HORIZON = 8, 3, 10
TASKS = np.array([0, 0, 0, 1, 1, 2, 3, 3])  # a few rephrase tasks, several rows each


def rows_of(ds: TrajectoryDataset) -> list[bytes]:
    """Each rollout as bytes (its states, actions and goal), to find it in another dataset."""
    return [ds.states[i].tobytes() + ds.actions[i].tobytes() + ds.goals[i].tobytes()
            for i in range(ds.num_trajectories)]


@pytest.fixture(scope="module")
def generated() -> dict[str, Any]:
    env, params = make("clevr", "rephrase", embed=False)
    imaginer = make_imaginer(seed=3)
    key = jax.random.key(11)
    run = lambda n, **kw: imagine(imaginer, env, params, key, n, horizon=HORIZON, progress=False,  # noqa: E731
                                  **kw).dataset
    # Chunks of min(chunk_size, N) rows whatever k is: the candidates are the chunks k·N plain rows make.
    return {"plain": run(N, task_indices=TASKS, chunk_size=64),
            "one": run(N, task_indices=TASKS, chunk_size=64, oversample=1),
            "kept": run(N, task_indices=TASKS, chunk_size=64, oversample=K),
            "pool": run(K * N, task_indices=np.tile(TASKS, K), chunk_size=N)}


def test_oversample_one_is_the_plain_generation_bitwise(generated: dict[str, Any]) -> None:
    plain, one = generated["plain"], generated["one"]
    for field in ROW_FIELDS:
        assert getattr(plain, field).tobytes() == getattr(one, field).tobytes(), field
    drop = lambda p: {k: v for k, v in p.items() if k != "seconds"}  # noqa: E731
    assert json.dumps(drop(plain.provenance)) == json.dumps(drop(one.provenance))
    assert "oversample" not in one.provenance
    # The k·N candidates begin with exactly the rollouts oversample = 1 writes.
    assert rows_of(generated["pool"])[:N] == rows_of(plain)


def test_oversample_keeps_n_per_task_and_better_rollouts(generated: dict[str, Any]) -> None:
    plain, kept, pool = generated["plain"], generated["kept"], generated["pool"]
    assert kept.num_trajectories == N
    pool_rows = rows_of(pool)
    index = [pool_rows.index(r) for r in rows_of(kept)]  # every kept rollout is one of the candidates
    assert index == sorted(index)  # in generation order
    tasks = np.tile(TASKS, K)
    np.testing.assert_array_equal(np.sort(tasks[index]), TASKS)  # the task mix of oversample = 1
    scores = score_dataset(pool)
    position = np.argsort(rank_rollouts(scores))  # each candidate's place in the ranking
    goal = scores.goal_reached
    dropped = np.setdiff1d(np.arange(K * N), index)
    for task in np.unique(TASKS):
        mine, others = [i for i in index if tasks[i] == task], [i for i in dropped if tasks[i] == task]
        assert position[mine].max() < position[others].min()
        assert goal[mine].mean() >= goal[others].mean()
        assert goal[mine].sum() >= score_dataset(plain).goal_reached[TASKS == task].sum()
    assert 0 < goal.mean() < 1 and goal[index].mean() > score_dataset(plain).goal_reached.mean()
    record = kept.provenance["oversample"]
    assert {k: record[k] for k in ("k", "generated", "kept")} == {"k": K, "generated": K * N, "kept": N}
    assert record["rule"] == RANKING_RULE and "first 8 generated rows" in record["per_task"]
    assert record["quality_generated"]["num_rollouts"] == K * N
    assert kept.provenance["quality"]["num_rollouts"] == N and kept.provenance["num_requested"] == N
    assert kept.provenance["num_rollouts"] == N
    assert kept.provenance["success_rate"] == pytest.approx(kept.terminals.any(axis=1).mean())


def test_the_filter_applies_to_the_kept_rollouts(generated: dict[str, Any]) -> None:
    """'consistent-legal' after the selection = the best passing candidates of each task (at most its quota)."""
    kept, pool = generated["kept"], generated["pool"]
    lines: list[str] = []
    run = SimpleNamespace(imagine=SimpleNamespace(filter="consistent-legal"))
    [filtered] = filter_imaginary(run, [kept], lines.append)
    scores = score_dataset(pool)
    passes = scores.goal_reached & scores.legal_initial & scores.legal_next.all(axis=1)
    tasks = np.tile(TASKS, K)
    want = []
    for task, quota in zip(*np.unique(TASKS, return_counts=True)):
        want += [i for i in rank_rollouts(scores) if passes[i] and tasks[i] == task][:quota]
    pool_rows = rows_of(pool)
    assert sorted(pool_rows.index(r) for r in rows_of(filtered)) == sorted(want) and want
    assert lines == [f"  clevr/rephrase: filter 'consistent-legal' kept {len(want)} of {N} imaginary rollouts, "
                     f"{len(want)} of {K * N} generated (imagine.oversample = {K})"]


def test_a_level_the_filter_empties_is_refused_naming_the_ways_out(generated: dict[str, Any]) -> None:
    import dataclasses

    kept = generated["kept"]
    off_the_table = dataclasses.replace(kept, states=np.full_like(kept.states, 50.0))  # every state illegal
    run = SimpleNamespace(imagine=SimpleNamespace(filter="legal"), imagined=("rephrase", "easy", "hard"))
    with pytest.raises(QualityError, match=r"imagine.filter = 'legal' keeps no rollout of clevr/rephrase \(0 of "
                                           rf"{N}\).*oversample.*--set 'imagine.levels=\[\"easy\", \"hard\"\]'"):
        filter_imaginary(run, [off_the_table], lambda line: None)


def test_written_quality_report_shows_kept_of_generated(tmp_path: Path) -> None:
    write_imaginary_datasets(make_imaginer(seed=3), "clevr", tmp_path, 4, jax.random.key(3), levels=("easy",),
                             embed=False, progress=False, oversample=2)
    report = json.loads((tmp_path / "clevr-imaginary-quality.json").read_text())
    assert report["datasets"]["easy"]["oversample"] == {"k": 2, "generated": 8, "kept": 4}
    table = (tmp_path / "clevr-imaginary-quality.md").read_text()
    assert "| easy | 4 of 8 |" in table and "the best n of m generated (imagine.oversample)" in table


def test_bad_oversample_values_are_refused() -> None:
    env, params = make("clevr", "easy", embed=False)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="oversample must be an integer >= 1"):
            imagine(make_imaginer(), env, params, jax.random.key(0), 2, oversample=bad, progress=False)
    with pytest.raises(ConfigError, match=r"imagine\.oversample must be an integer >= 1 .* got 0: e\.g\. --set "
                                          r"imagine\.oversample=4"):
        load_config("clevr-quick", ["imagine.oversample=0"])
    with pytest.raises(ConfigError, match=r"config field imagine\.oversample: expected an integer, got 2\.5 .*--set "
                                          r"imagine\.oversample=<an integer>"):
        load_config("clevr-quick", ["imagine.oversample=2.5"])


# --------------------------------------------------------------- caches, workspaces, plan


def test_oversampled_and_plain_datasets_never_stand_in_for_each_other() -> None:
    plain = {"checkpoint_hash": "h", "num_requested": 128, "key": [0, 1]}
    oversampled = {**plain, "oversample": {"k": 4, "generated": 512, "kept": 128}}
    assert reusable(plain, "h", 128, [0, 1], 1) and not reusable(plain, "h", 128, [0, 1], 4)
    assert reusable(oversampled, "h", 128, [0, 1], 4) and not reusable(oversampled, "h", 128, [0, 1], 1)
    assert not reusable(oversampled, "h", 128, [0, 1], 2) and not reusable({**plain, "oversample": 4}, "h", 128,
                                                                              [0, 1], 4)


def test_a_workspace_keeps_its_oversampling(tmp_path: Path) -> None:
    open_workspace(tmp_path / "ws", load_config("clevr-quick"))
    key = json.loads((tmp_path / "ws" / "workspace.json").read_text())["key"]
    assert "oversample" not in key["imagine"]  # = the key of a workspace made before the field existed
    with pytest.raises(ConfigError, match=r"imagine\.oversample: null -> 4"):
        open_workspace(tmp_path / "ws", load_config("clevr-quick", ["imagine.oversample=4"]))
    open_workspace(tmp_path / "ws4", load_config("clevr-quick", ["imagine.oversample=4"]))
    with pytest.raises(ConfigError, match=r"imagine\.oversample: 4 -> null"):
        open_workspace(tmp_path / "ws4", load_config("clevr-quick"))


def test_the_plan_says_how_many_are_generated_and_kept(tmp_path: Path) -> None:
    from imaginejax.bench.protocol import plan

    sets = ['train.algos=["bc"]', "train.seeds=1", "imagine.episodes=1024", "imagine.preset=shipped"]
    text = plan(load_config("clevr-quick", sets + ["imagine.oversample=4", "imagine.filter=consistent-legal"]),
                tmp_path)
    assert ("then 4 × 1024 imaginary rollouts generated for each of rephrase, easy, hard, best 1024 kept "
            "(imagine.oversample" in text and "imagine.filter 'consistent-legal' then drops the kept rollouts that fail it" in text), text
    assert "then 3072 imaginary rollouts for rephrase, easy, hard\n" in plan(load_config("clevr-quick", sets), tmp_path)
