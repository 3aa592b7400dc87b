"""The three-way table over environments: cells against hand-computed statistics of the pooled
(seed, environment) scores and a direct stratified bootstrap with the environments as columns; missing
cells; cut seed counts; the ``imaginejax report WS_1 WS_2`` command and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from imaginejax.bench.report import aggregate, aggregate_rows, protocol_rows
from imaginejax.bench.results import Results, Run
from imaginejax.bench.stats import iqm, stratified_bootstrap_ci

LEVELS = ("train", "easy")
JUNK = 0.9  # the first of three evaluations: outside the last 2 that make a run's score


def _runs(algo: str, configs: list[tuple[str, list[float]]]) -> list[Run]:
    """One config per (data source, per-seed scores); every level evaluates to (JUNK, s, s) for seed score s."""
    runs = []
    for config, (data, scores) in enumerate(configs):
        for seed, score in enumerate(scores):
            curve = (JUNK, score, score)
            runs.append(Run(algo=algo, run=len(runs), config=config, seed=seed, ratio=0.5 if data else 0.0, hp={},
                            data=data, steps=(10, 20, 30), success={lv: curve for lv in LEVELS},
                            returns={lv: (0.0, 0.0, 0.0) for lv in LEVELS}, task_success={}, finite=True))
    return runs


def _results(*algos: tuple[str, list[tuple[str, list[float]]]]) -> Results:
    runs = [r for algo, configs in algos for r in _runs(algo, configs)]
    return Results(runs=tuple(runs), levels=LEVELS)


CLEVR = _results(("bc", [("", [0.0, 0.5, 1.0]), ("imaginary/easy", [1.0, 1.0, 1.0]), ("oracle/easy", [0.5] * 3)]),
                 ("cql", [("", [0.3] * 3), ("imaginary/easy", [0.3] * 3)]))
BABYAI = _results(("bc", [("", [0.2, 0.4, 0.6, 0.8]), ("imaginary/easy", [0.9, 1.0, 1.0])]))


def _cells(rows):
    return {(r["algo"], r["level"], r["condition"]): r for r in rows}


def test_a_cell_is_the_statistic_of_the_pooled_seed_by_environment_scores_with_environments_as_strata():
    cells = _cells(aggregate_rows({"clevr": CLEVR, "babyai": BABYAI}, "iqm", reps=300, seed=3, last=2))
    real = cells[("bc", "easy", "real")]
    # babyai ran 4 real-only seeds, clevr 3: the first 3 of each.
    scores = np.array([[0.0, 0.2], [0.5, 0.4], [1.0, 0.6]])
    # IQM of the 6 pooled scores: drop floor(6/4) = 1 from each end of 0, .2, .4, .5, .6, 1.
    assert real["point"] == pytest.approx((0.2 + 0.4 + 0.5 + 0.6) / 4)
    assert real["mean"] == pytest.approx(2.7 / 6)
    direct = stratified_bootstrap_ci(scores, iqm, reps=300, seed=3)
    assert (real["low"], real["high"]) == (direct.low, direct.high)
    assert real["low"] < real["point"] < real["high"]
    assert (real["n"], real["seeds"], real["evaluations"]) == (3, {"clevr": 3, "babyai": 4}, {"clevr": 2, "babyai": 2})
    mixed = cells[("bc", "easy", "imaginary")]
    assert mixed["point"] == pytest.approx(1.0)  # pooled 1, 1, 1, .9, 1, 1: IQM drops the .9
    mean_rows = _cells(aggregate_rows({"clevr": CLEVR, "babyai": BABYAI}, "mean", reps=300, seed=3, last=2))
    assert mean_rows[("bc", "easy", "imaginary")]["point"] == pytest.approx(5.9 / 6)
    # One environment: the aggregate's cell is protocol_rows' cell.
    alone = _cells(aggregate_rows({"clevr": CLEVR}, "iqm", reps=300, seed=3, last=2))
    per_env = _cells(protocol_rows(CLEVR.groups(), LEVELS, "iqm", reps=300, seed=3, last=2))
    for key, row in per_env.items():
        assert (alone[key]["point"], alone[key]["low"], alone[key]["high"]) == (row["point"], row["low"], row["high"])


def test_a_cell_missing_from_an_environment_is_a_dash_and_the_note_names_that_environment():
    text = aggregate({"clevr": CLEVR, "babyai": BABYAI}, {"clevr": "ws/clevr", "babyai": "ws/babyai"}, "iqm",
                     reps=100, seed=0, last=2)
    lines = text.splitlines()
    assert lines[0] == "| algorithm | level | real only | real + imaginary | real + oracle |"
    easy = next(line for line in lines if line.startswith("| bc | easy |"))
    assert easy.startswith("| bc | easy | 42.5 [") and easy.endswith("↑ | — |")
    assert "| cql | train | — | — | — |" in lines and "| cql | easy | — | — | — |" in lines
    assert "—: bc has no easy real + oracle in babyai; cql has no runs in babyai." in text
    assert "babyai 4 → 3" in text and "3 seeds per environment" in text
    assert "Environments: clevr (ws/clevr: last 2 evaluations up to 30 updates), babyai (ws/babyai: " in text


def test_an_environment_without_data_sources_is_refused():
    real_only = _results(("bc", [("", [0.5, 0.5])]))
    with pytest.raises(ValueError, match="no run of babyai names a data source"):
        aggregate_rows({"clevr": CLEVR, "babyai": real_only})


# ------------------------------------------------------------------------------------------ the command
def _workspace(root, env: str, scores: dict[str, list[float]]):
    """A workspace of ``env`` with a bc sweep: data source -> per-seed success on every evaluation."""
    ws = root / env
    sweep = ws / "runs" / "bc"
    sweep.mkdir(parents=True)
    (ws / "workspace.json").write_text(json.dumps({"key": {}, "config": {"data": {"env": env}}, "data": {}}))
    table, lines = [], []
    for config, (data, values) in enumerate(scores.items()):
        for seed, value in enumerate(values):
            run = len(table)
            table.append({"run": run, "config": config, "seed": seed, "ratio": 0.5 if data else 0.0, "hp": {},
                          "data": data})
            lines += [{"chunk": 0, "interval": i, "step": 10 * i, "run": run, "seconds": 1.0, "finite": True,
                       **{f"success/{lv}": value for lv in LEVELS}, **{f"return/{lv}": 0.0 for lv in LEVELS}}
                      for i in (1, 2)]
    (sweep / "sweep.json").write_text(json.dumps({"runs": table, "algo": "bc"}))
    (sweep / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return ws


def test_report_of_several_workspaces_prints_and_writes_the_aggregate(tmp_path, capsys):
    from imaginejax.cli import main

    a = _workspace(tmp_path, "clevr", {"": [0.0, 1.0], "imaginary/easy": [1.0, 1.0]})
    b = _workspace(tmp_path, "babyai", {"": [0.5, 0.5], "imaginary/easy": [0.5, 1.0]})
    out = tmp_path / "aggregate.md"
    assert main(["report", str(a), str(b / "runs" / "bc"), "--statistic", "mean", "--reps", "50",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| bc | easy | 50.0 [" in printed and "| 87.5 [" in printed  # means of (0, 1, .5, .5), (1, 1, .5, 1)
    assert f"clevr ({a}: last 2 evaluations up to 20 updates), babyai ({b / 'runs' / 'bc'}:" in printed
    assert out.read_text().strip() == printed.strip()
    assert not (a / "results.md").exists() and not (b / "results-mean.md").exists()


def test_report_refuses_two_workspaces_of_one_environment_and_a_path_outside_any(tmp_path, capsys):
    from imaginejax.cli import main

    a = _workspace(tmp_path / "one", "clevr", {"": [0.5], "imaginary/easy": [0.5]})
    b = _workspace(tmp_path / "two", "clevr", {"": [0.5], "imaginary/easy": [0.5]})
    assert main(["report", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"{a} and {b} are both workspaces of clevr" in err
    (tmp_path / "bare").mkdir()
    assert main(["report", str(a), str(tmp_path / "bare")]) == 2
    assert "is in no workspace" in capsys.readouterr().err


def _set_report_last(ws, last: int) -> None:
    record = json.loads((ws / "workspace.json").read_text())
    record["config"]["report"] = {"last": last}
    (ws / "workspace.json").write_text(json.dumps(record))


def test_report_takes_the_workspaces_report_last_when_they_agree_and_else_asks_for_it(tmp_path, capsys):
    from imaginejax.cli import main

    a = _workspace(tmp_path, "clevr", {"": [0.0, 1.0], "imaginary/easy": [1.0, 1.0]})
    b = _workspace(tmp_path, "babyai", {"": [0.5, 0.5], "imaginary/easy": [0.5, 1.0]})
    _set_report_last(a, 1)
    _set_report_last(b, 1)
    assert main(["report", str(a), str(b), "--reps", "50"]) == 0
    assert f"clevr ({a}: last 1 evaluations up to 20 updates), babyai ({b}: last 1 " in capsys.readouterr().out
    _set_report_last(b, 3)
    assert main(["report", str(a), str(b), "--reps", "50"]) == 2
    err = capsys.readouterr().err
    assert f"the workspaces differ in report.last (1 in {a}, 3 in {b}): choose one with --last" in err
    assert main(["report", str(a), str(b), "--reps", "50", "--last", "2"]) == 0
    assert f"clevr ({a}: last 2 evaluations up to 20 updates)" in capsys.readouterr().out
    # One sweep: its workspace's report.last; outside any workspace, the default (5: both evaluations here).
    assert main(["report", str(a / "runs" / "bc"), "--reps", "50", "--no-figures"]) == 0
    assert "over its last 1 evaluations" in capsys.readouterr().out
    (a / "workspace.json").unlink()
    assert main(["report", str(a / "runs" / "bc"), "--reps", "50", "--no-figures"]) == 0
    assert "over its last 2 evaluations" in capsys.readouterr().out
