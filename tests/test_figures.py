"""Figures and tables of sweeps (imaginejax.bench.figures, report, results) on hand-written run directories: learning-curve and
bar-chart data against hand-computed IQMs and means, non-finite runs left out, PNGs that decode to
images, CSVs that hold exactly the plotted numbers, workspace discovery."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from imaginejax.bench import figures
from imaginejax.bench.report import table
from imaginejax.bench.results import find_sweeps, load_sweep
from imaginejax.bench.stats import iqm, stratified_bootstrap_ci
from imaginejax.core.runlog import MetricsLog

LEVELS = ("train", "hard")
STEPS = (100, 200)
# Success of each run at each interval, per level. Runs 0-3: config 0 (ratio 0), runs 4-7: config 1
# (ratio 0.5). Run 7 goes non-finite in interval 2 and must be left out of every number.
TRAIN = {1: [0.1, 0.2, 0.3, 0.9, 0.0, 0.0, 0.5, 0.5],
         2: [0.2, 0.4, 0.6, 1.0, 0.3, 0.6, 0.9, 0.0]}
HARD = {1: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        2: [0.0, 0.1, 0.0, 0.1, 0.2, 0.2, 0.2, 0.0]}
FINITE = {1: [True] * 8, 2: [True] * 7 + [False]}


def write_sweep(run_dir: Path, algo: str = "bc", lr_values=(1e-3,)) -> None:
    """A sweep directory as imaginejax.training.sweep.run_sweep and the engine leave it (table + metrics)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    table = []
    for run in range(8):
        config = run // 4
        table.append({"run": run, "config": config, "seed": run % 4, "ratio": 0.5 * config,
                      "hp": {"learning_rate": lr_values[config % len(lr_values)], "alpha": 2.5}})
    (run_dir / "sweep.json").write_text(json.dumps({"runs": table, "algo": algo}))
    log = MetricsLog(run_dir)
    runs = np.arange(8)
    for interval, step in zip((1, 2), STEPS):
        log.write_interval(0, interval, step, 1.0, runs, np.asarray(FINITE[interval]),
                           {"loss": np.ones(8)},
                           {"train": np.asarray(TRAIN[interval]), "hard": np.asarray(HARD[interval])},
                           {"train": np.zeros(8), "hard": np.zeros(8)})


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_curves_by_hand(tmp_path):
    write_sweep(tmp_path / "sweep")
    results = load_sweep(tmp_path / "sweep")
    groups, levels = results.groups(), list(results.levels)
    assert levels == list(LEVELS)
    # Constant hyperparameters (learning_rate, alpha) are not in the labels; the ratio is.
    assert [g.label for g in groups] == ["bc, ratio 0", "bc, ratio 0.5"]
    np.testing.assert_array_equal(groups[0].steps, STEPS)
    np.testing.assert_array_equal(groups[0].success["train"], [TRAIN[1][:4], TRAIN[2][:4]])
    assert groups[1].success["train"].shape == (2, 3)  # run 7 (non-finite at the end) is left out

    rows = figures.curve_rows(groups, levels, reps=500)
    point = {(r["group"], r["level"], r["step"]): r for r in rows}
    # 4 seeds: the IQM drops one score at each end. Interval 1: (0.2 + 0.3) / 2; interval 2: (0.4 + 0.6) / 2.
    assert point["bc, ratio 0", "train", 100]["point"] == pytest.approx(0.25)
    assert point["bc, ratio 0", "train", 200]["point"] == pytest.approx(0.5)
    assert point["bc, ratio 0", "train", 200]["mean"] == pytest.approx(0.55)
    # 3 seeds: floor(3/4) = 0 dropped, the IQM is the mean: (0.3 + 0.6 + 0.9) / 3.
    assert point["bc, ratio 0.5", "train", 200]["point"] == pytest.approx(0.6)
    assert point["bc, ratio 0.5", "train", 200]["n"] == 3
    assert point["bc, ratio 0.5", "hard", 200]["point"] == pytest.approx(0.2)
    assert (point["bc, ratio 0.5", "hard", 200]["low"], point["bc, ratio 0.5", "hard", 200]["high"]) == \
        pytest.approx((0.2, 0.2))  # every seed scored 0.2: the interval collapses
    for r in rows:  # a bootstrap of an interquartile mean never leaves the data's range
        scores = next(g for g in groups if g.label == r["group"]).success[r["level"]][STEPS.index(r["step"])]
        assert scores.min() - 1e-12 <= r["low"] <= r["point"] <= r["high"] <= scores.max() + 1e-12
        assert r["n"] == scores.size

    mean_rows = figures.curve_rows(groups, levels, statistic="mean", reps=100)
    assert mean_rows[1]["point"] == pytest.approx(0.55)


def test_varying_hyperparameters_are_labelled(tmp_path):
    write_sweep(tmp_path / "sweep", algo="cql", lr_values=(1e-3, 3e-4))
    groups = load_sweep(tmp_path / "sweep").groups()
    assert [g.label for g in groups] == ["cql, ratio 0, learning_rate 0.001", "cql, ratio 0.5, learning_rate 0.0003"]


def test_figures_and_csv_written(tmp_path):
    import matplotlib.image

    for algo in ("bc", "cql"):
        write_sweep(tmp_path / "ws" / "runs" / algo)
    sweeps = find_sweeps(tmp_path / "ws")
    assert [p.name for p in sweeps] == ["bc", "cql"]
    results = load_sweep(tmp_path / "ws")
    groups = results.groups()
    # In a workspace the algorithm is the directory name (the registry name).
    assert [g.label for g in groups] == ["bc, ratio 0", "bc, ratio 0.5", "cql, ratio 0", "cql, ratio 0.5"]
    written = figures.write_figures(results, tmp_path / "fig", reps=300, seed=3, env="clevr",
                                    floor={"train": 0.2, "hard": 0.01})
    # One curves figure: a panel row per algorithm (bc, cql), a column per level; taller than wide per row.
    curves_image = matplotlib.image.imread(written["curves"])
    assert curves_image.ndim == 3 and curves_image.shape[0] > 300 and curves_image.shape[1] > 300
    assert curves_image[..., :3].std() > 0.01  # not a blank canvas
    assert matplotlib.image.imread(written["bars"]).shape[1] > 100

    curves = read_csv(written["curves_csv"])
    assert len(curves) == 4 * len(LEVELS) * len(STEPS)
    first = curves[0]
    assert (first["group"], first["algo"], first["level"], first["step"], first["n"]) == ("bc, ratio 0", "bc", "train", "100", "4")
    scores = np.asarray(TRAIN[1][:4])
    ci = stratified_bootstrap_ci(scores, iqm, reps=300, seed=3)
    # CSVs hold percent, like the tables, in columns named so.
    assert {"point", "low", "high", "mean"}.isdisjoint(first)
    assert float(first["point_pct"]) == pytest.approx(25.0)
    assert float(first["mean_pct"]) == pytest.approx(100 * np.mean(TRAIN[1][:4]))
    assert (float(first["low_pct"]), float(first["high_pct"])) == pytest.approx((100 * ci.low, 100 * ci.high))

    bars = read_csv(written["bars_csv"])
    assert len(bars) == 4 * len(LEVELS) and {r["step"] for r in bars} == {"200"}  # last evaluation only
    by_key = {(r["group"], r["level"]): float(r["point_pct"]) for r in bars}
    assert by_key["cql, ratio 0.5", "train"] == pytest.approx(60.0)
    assert by_key["bc, ratio 0", "hard"] == pytest.approx(5.0)  # IQM of (0, 0.1, 0, 0.1): (0 + 0.1) / 2

    text = written["results"].read_text()
    assert text.strip() == table(results, reps=300, seed=3, three_way=False)
    assert "| cql, ratio 0.5 | 60.0 [" in text and "(200 updates)" in text


def test_report_names_its_files_by_statistic(tmp_path):
    """The mean report goes to results-mean.md and figures-mean/, next to the IQM's, which it leaves alone."""
    from imaginejax.bench import protocol
    from imaginejax.bench.config import ReportConfig

    write_sweep(tmp_path / "sweep")
    results = load_sweep(tmp_path / "sweep")
    iqm_text = protocol.report(results, tmp_path / "sweep", ReportConfig(statistic="iqm", reps=50),
                            log=lambda _: None)
    iqm_files = {p.name: p.read_bytes() for p in (tmp_path / "sweep" / "figures").iterdir()}
    mean_text = protocol.report(results, tmp_path / "sweep", ReportConfig(statistic="mean", reps=50),
                             log=lambda _: None)
    assert (tmp_path / "sweep" / "results.md").read_text().strip() == iqm_text
    assert (tmp_path / "sweep" / "results-mean.md").read_text().strip() == mean_text
    assert {p.name: p.read_bytes() for p in (tmp_path / "sweep" / "figures").iterdir()} == iqm_files
    assert "curves.png" in iqm_files and (tmp_path / "sweep" / "figures-mean" / "curves.png").stat().st_size > 0
    # bc, ratio 0 on train at the last evaluation: IQM (0.4 + 0.6) / 2 = 50.0, mean (0.2+0.4+0.6+1.0) / 4 = 55.0.
    assert "| bc, ratio 0 | 50.0 [" in iqm_text and "| bc, ratio 0 | 55.0 [" in mean_text
    mean_bars = read_csv(tmp_path / "sweep" / "figures-mean" / "bars.csv")
    assert float(next(r for r in mean_bars if r["group"] == "bc, ratio 0" and r["level"] == "train")["point_pct"]) \
        == pytest.approx(55.0)


def test_missing_sweep_and_empty_metrics_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="sweep.json"):
        load_sweep(tmp_path)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.json").write_text(json.dumps({"runs": [], "algo": "bc"}))
    with pytest.raises(ValueError, match="no records yet"):
        load_sweep(tmp_path / "s")


def test_a_workspace_reports_its_finished_algorithms_and_names_the_unfinished(tmp_path):
    """An algorithm stopped (or still compiling) before its first evaluation does not hide the others."""
    write_sweep(tmp_path / "ws" / "runs" / "bc")
    (tmp_path / "ws" / "runs" / "prdc").mkdir()
    (tmp_path / "ws" / "runs" / "prdc" / "sweep.json").write_text(json.dumps({"runs": [], "algo": "prdc"}))
    with pytest.warns(RuntimeWarning, match=r"left out, not finished: .*prdc.*no records yet"):
        results = load_sweep(tmp_path / "ws")
    assert results == load_sweep(tmp_path / "ws" / "runs" / "bc")
    (tmp_path / "ws" / "runs" / "bc" / "metrics.jsonl").unlink()
    with pytest.raises(ValueError, match="no records yet"):  # nothing finished: nothing to report
        load_sweep(tmp_path / "ws")


def test_missing_matplotlib_names_the_install(tmp_path, monkeypatch):
    from imaginejax.training.progress import MissingDependency

    write_sweep(tmp_path / "sweep")
    results = load_sweep(tmp_path / "sweep")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail like a missing package
    with pytest.raises(MissingDependency, match=r"pip install 'imaginejax\[figures\]'.*report\.figures=false"):
        figures.write_figures(results, tmp_path / "fig", reps=10)


def write_protocol_sweep(run_dir: Path, algo: str, data: tuple[str, ...]) -> None:
    """A sweep over data sources, 4 seeds per source: real only (ratio 0) and the named ones (ratio 0.5)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    n = 4 * len(data)
    table = [{"run": run, "config": run // 4, "seed": run % 4, "ratio": 0.5 if data[run // 4] else 0.0,
              "hp": {"learning_rate": 1e-3}, "data": data[run // 4]} for run in range(n)]
    (run_dir / "sweep.json").write_text(json.dumps({"runs": table, "algo": algo}))
    log = MetricsLog(run_dir)
    success = np.linspace(0.1, 0.9, n)
    for interval, step in zip((1, 2), STEPS):
        log.write_interval(0, interval, step, 1.0, np.arange(n), np.ones(n, bool), {"loss": np.ones(n)},
                           {"train": success, "hard": success[::-1]}, {"train": np.zeros(n), "hard": np.zeros(n)})


def test_figures_are_saved_sharp_with_legible_legends(tmp_path):
    from PIL import Image

    write_protocol_sweep(tmp_path / "ws" / "runs" / "bc", "bc", ("", "imaginary/hard", "oracle/hard"))
    results = load_sweep(tmp_path / "ws")
    written = figures.write_figures(results, tmp_path / "fig", reps=50, env="clevr")
    assert figures.DPI >= 150 and figures.FONT >= 9
    for name in ("curves", "bars", "protocol"):
        dpi = Image.open(written[name]).info["dpi"]  # from the PNG's pHYs chunk
        assert dpi == pytest.approx((figures.DPI, figures.DPI), abs=0.5), name

    groups, levels = results.groups(), results.levels
    built = [figures.curves_figure(figures.curve_rows(groups, levels, reps=20), groups, levels, "t", "IQM"),
             figures.bars_figure(figures.final_rows(groups, levels, reps=20), groups, levels, "t", "IQM", None),
             figures.protocol_figure(figures.protocol_rows(groups, levels, reps=20), levels, "clevr", "IQM")]
    protocol = built[-1]
    protocol.canvas.draw()
    # Bars are equally wide on the page in every panel (train holds one per tick, hard three).
    widths = [ax.patches[0].get_width() * ax.get_position().width / np.ptp(ax.get_xlim()) for ax in protocol.axes]
    assert [len(ax.patches) for ax in protocol.axes] == [1, 3] and widths == pytest.approx([widths[0]] * 2)
    for fig in built:
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + fig.legends
        assert legends and all(t.get_fontsize() >= 9 for lg in legends for t in lg.get_texts())
        fig.canvas.draw()
        labels = [t for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
        assert labels and all(t.get_fontsize() >= 9 for t in labels)
    import matplotlib.pyplot as plt

    for fig in built:
        plt.close(fig)


def test_protocol_figure_draws_the_conditions_present_centred_on_their_ticks(tmp_path):
    """No oracle runs, and the train level with real only: no empty slots, each group of bars centred on
    its tick, the title naming the environment, the conditions and the statistic."""
    import matplotlib.pyplot as plt

    for algo in ("bc", "cql"):
        write_protocol_sweep(tmp_path / "ws" / "runs" / algo, algo, ("", "imaginary/hard"))
    results = load_sweep(tmp_path / "ws")
    groups, levels = results.groups(), results.levels
    rows = figures.protocol_rows(groups, levels, reps=20)
    fig = figures.protocol_figure(rows, levels, "clevr", "IQM")
    assert [ax.get_title() for ax in fig.axes] == ["train", "hard"]
    for ax, present in zip(fig.axes, (1, 2)):  # train: real only; hard: real only, + imaginary
        ticks = list(ax.get_xticks())
        assert [t.get_text() for t in ax.get_xticklabels()] == ["bc", "cql"]
        centres = sorted(p.get_x() + p.get_width() / 2 for p in ax.patches)
        assert len(centres) == present * len(ticks)
        for i, tick in enumerate(ticks):
            assert np.mean(centres[i * present:(i + 1) * present]) == pytest.approx(tick)
        assert ax.get_xlim() == pytest.approx((ticks[0] - 0.5, ticks[-1] + 0.5))
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["real only", "real + imaginary"]
    title = fig.get_suptitle()
    assert title.startswith("clevr: success per level, real only / real + imaginary (IQM, 95 % CI)")
    assert "oracle" not in title and "4 seeds" in title
    plt.close(fig)
