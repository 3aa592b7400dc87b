"""Statistics against hand-computed cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from imaginejax.bench.stats import Interval, group_runs, iqm, mean, results_table, stratified_bootstrap_ci


def test_iqm_by_hand():
    # n = 4: drop 1 each end -> mean(2, 3) = 2.5; n = 8: drop 2 each end -> mean(2, 3, 4, 5) = 3.5.
    assert iqm(np.array([[4.0], [1.0], [3.0], [2.0]])) == pytest.approx(2.5)
    assert iqm(np.array([0, 1, 2, 3, 4, 100, 5, 6], float).reshape(4, 2)) == pytest.approx(3.5)
    # n = 5: drop 1 each end -> mean(2, 3, 4) = 3; n = 3: nothing dropped -> plain mean.
    assert iqm(np.array([[5.0], [1.0], [4.0], [2.0], [3.0]])) == pytest.approx(3.0)
    assert iqm(np.array([[1.0], [2.0], [9.0]])) == pytest.approx(4.0)
    # Leading axes are kept.
    np.testing.assert_allclose(iqm(np.arange(16.0).reshape(2, 4, 2)), [3.5, 11.5])
    assert mean(np.array([[1.0, 2.0], [3.0, 6.0]])) == pytest.approx(3.0)


def test_iqm_matches_scipy_trim_mean():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(0).normal(size=(7, 3))
    assert iqm(x) == pytest.approx(scipy_stats.trim_mean(x.ravel(), 0.25))


def test_bootstrap_degenerate_cases():
    # Every seed scored the same: every replicate is that value.
    ci = stratified_bootstrap_ci(np.full(5, 0.7), iqm, reps=200)
    assert (ci.point, ci.low, ci.high) == pytest.approx((0.7, 0.7, 0.7))
    # Two seeds {0, 1}, mean: a replicate's mean is 0, 0.5 or 1 w.p. 1/4, 1/2, 1/4 -> 95 % CI [0, 1].
    ci = stratified_bootstrap_ci(np.array([0.0, 1.0]), mean, reps=4000, seed=1)
    assert (ci.point, ci.low, ci.high) == (0.5, 0.0, 1.0)
    # Stratification: within each task all seeds agree, tasks differ. Resampling seeds inside each
    # task never changes the mean, so the interval collapses; pooling across tasks would not.
    scores = np.tile(np.array([0.0, 1.0, 0.5]), (6, 1))  # (6 seeds, 3 tasks)
    ci = stratified_bootstrap_ci(scores, mean, reps=500)
    assert (ci.low, ci.high) == pytest.approx((0.5, 0.5))
    # Reproducible with its seed; percentile interval contains the point estimate.
    x = np.random.default_rng(3).uniform(size=10)
    a, b = (stratified_bootstrap_ci(x, iqm, reps=300, seed=5) for _ in range(2))
    assert a == b and a.low <= a.point <= a.high
    with pytest.raises(ValueError, match="NaN"):
        stratified_bootstrap_ci(np.array([0.5, np.nan]))


def test_grouping_and_markdown_table():
    configs = [0, 0, 0, 1, 1, 1]
    success = {"train": np.array([1.0, 1.0, 1.0, 0.5, 0.5, 0.0]),
               "hard": np.array([0.5, 0.5, 0.5, 0.0, 0.0, 0.0])}
    groups = group_runs(configs, success, finite=np.array([True] * 5 + [False]),
                        names={0: "ratio 0", 1: "ratio 0.5"})
    np.testing.assert_array_equal(groups["ratio 0.5"]["train"], [0.5, 0.5])  # the frozen run is left out
    table = results_table(groups, ["train", "hard"], reps=100)
    lines = table.splitlines()
    assert lines[0] == "| group | train | hard | all levels |"
    assert lines[2] == ("| ratio 0 | 100.0 [100.0, 100.0] (mean 100.0, n=3) | 50.0 [50.0, 50.0] (mean 50.0, n=3) "
                        "| 75.0 [75.0, 75.0] (mean 75.0) |")
    assert lines[3].startswith("| ratio 0.5 | 50.0 [50.0, 50.0] (mean 50.0, n=2) | 0.0 [0.0, 0.0]")
    assert "stratified-bootstrap" in table
    assert Interval(0.725, 0.65, 0.8).format() == "72.5 [65.0, 80.0]"


def test_report_command_on_a_run_directory(tmp_path, capsys):
    from imaginejax.cli import main

    runs = [{"run": r, "config": r // 2, "seed": r % 2, "ratio": 0.5 * (r // 2), "hp": {"learning_rate": 1e-3}}
            for r in range(4)]
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": runs, "algo": "bc"}))
    success = [0.25, 0.75, 1.0, 1.0]
    lines = [{"chunk": 0, "interval": i, "step": 10 * i, "run": r, "seconds": 1.0, "finite": True, "loss": 0.1,
              "success/train": success[r] if i == 2 else 0.0, "return/train": 0.0}
             for i in (1, 2) for r in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["report", str(tmp_path), "--reps", "200", "--out", str(tmp_path / "table.md")]) == 0
    out = capsys.readouterr().out
    assert "| bc, ratio 0 | 50.0 [25.0, 75.0] (mean 50.0, n=2)" in out
    assert "| bc, ratio 0.5 | 100.0 [100.0, 100.0]" in out
    assert "(20 updates)" in out and (tmp_path / "table.md").read_text().strip() == out.strip()
    assert main(["nonsense"]) == 2


def test_scipy_bootstrap_is_the_stratified_bootstrap():
    # Reference: resample the seeds of each task column independently with NumPy, IQM of each replicate.
    scores = np.random.default_rng(11).uniform(size=(8, 3)) * np.array([1.0, 0.2, 0.05])
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 8, size=(20000, 8, 3))
    reference = iqm(np.take_along_axis(scores[None], idx, axis=1))
    ref_low, ref_high = np.percentile(reference, [2.5, 97.5])
    ci = stratified_bootstrap_ci(scores, iqm, reps=20000, seed=1)
    assert ci.point == pytest.approx(float(iqm(scores[None])[0]))
    assert ci.low == pytest.approx(ref_low, abs=0.01) and ci.high == pytest.approx(ref_high, abs=0.01)
    # Resampling whole rows (seeds shared across tasks) would be another bootstrap: with task B = 1 - task A
    # every row averages 0.5, so a row bootstrap of the mean has zero width; the stratified one does not.
    a = np.random.default_rng(4).uniform(size=8)
    ci = stratified_bootstrap_ci(np.stack([a, 1.0 - a], axis=1), mean, reps=2000)
    assert ci.point == pytest.approx(0.5) and ci.high - ci.low > 0.1
