"""The ``imaginejax`` command (imaginejax.cli, config, bench, progress) end to end on tiny budgets.

BabyAI without instruction embeddings (``data.embed=false``: the encoder is not needed) keeps compilation
short: collect → train → report, an interrupted ``train`` resumed by re-running the same command (it must
end exactly like the uninterrupted run), ``bench`` over every registered discrete algorithm with oracle
imaginary data, ``--help`` of every subcommand, configuration errors that name the field and the fix, and
the optional metric sinks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import struct
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from imaginejax import algos, cli
from imaginejax.bench import config as config_lib
from imaginejax.bench.config import ConfigError, load_config, resolve
from imaginejax.core.checkpoint import list_checkpoints, load_checkpoint
from imaginejax.core.runlog import MetricsLog

INTERVALS = 2


def tiny(data_dir: Path) -> list[str]:
    """``--set`` overrides for a seconds-long protocol on BabyAI with oracle imaginary data."""
    sets = [f"data.dir={json.dumps(str(data_dir))}", "data.env=babyai", "data.embed=false", "data.episodes=24",
            "imagine.source=oracle", "imagine.episodes=6", "train.seeds=2", "train.ratios=[0.0, 0.5]",
            "train.updates=20", f"train.intervals={INTERVALS}", "train.eval_episodes=6", "train.batch_size=16",
            "train.encoder_width=16", "train.hidden=[16]", "report.reps=100", "logging.progress=lines"]
    return [arg for s in sets for arg in ("--set", s)]


def run(argv: list[str]) -> tuple[int, str, str]:
    """``imaginejax ARGV`` in this process -> (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


def records(run_dir: Path) -> list[dict]:
    """Metric records without the wall-clock field."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in MetricsLog(run_dir).records()]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> dict:
    """``collect`` (twice), then ``bench`` restricted to BC: the paths and outputs."""
    root = tmp_path_factory.mktemp("cli")
    real = root / "real"
    collect = ["collect", "--env", "babyai", "--level", "train", "--episodes", "24", "--out", str(real),
               "--no-embed", "--seed", "0"]
    first = run(collect)
    again = run(collect)
    bench = ["bench", "--env", "babyai", "--out", str(root / "ws")] + tiny(root / "data")
    bench += ["--set", 'train.algos=["bc"]']
    return {"root": root, "real": real, "collect": (first, again), "bench": run(bench), "bench_argv": bench}


def test_collect_writes_and_then_reads_a_dataset(bench_run):
    from imaginejax.data import load_dataset

    (status, out, _), (status2, out2, err2) = bench_run["collect"]
    assert status == status2 == 0
    ds = load_dataset(bench_run["real"])
    assert (ds.env, ds.level, ds.source, ds.num_trajectories) == ("babyai", "train", "real", 24)
    assert ds.instruction_embeddings.shape[1] == 0
    assert ds.terminals.any(1).mean() > 0.5  # the BFS expert with epsilon 0.1 mostly succeeds
    assert "reading 24 expert trajectories" in err2 and out2 == out
    # Other collection arguments for the same directory are refused, not silently mixed.
    status, _, err = run(["collect", "--env", "babyai", "--level", "easy", "--episodes", "5", "--out",
                          str(bench_run["real"]), "--no-embed"])
    assert status == 2 and "holds a different dataset" in err and "--overwrite" in err


def test_bench_trains_logs_reports_and_resumes(bench_run):
    status, out, err = bench_run["bench"]
    assert status == 0, err
    ws = bench_run["root"] / "ws"
    run_dir = ws / "runs" / "bc"
    recs = MetricsLog(run_dir).records()
    # The reference protocol: 2 seeds × (real only + the oracle data of each of the 3 novel levels).
    assert len(recs) == 8 * INTERVALS
    assert sorted({r["step"] for r in recs}) == [10, 20]
    for level in ("train", "rephrase", "easy", "hard"):
        assert all(0.0 <= r[f"success/{level}"] <= 1.0 for r in recs)
    sweep = json.loads((run_dir / "sweep.json").read_text())
    assert [(row["seed"], row["ratio"], row["data"]) for row in sweep["runs"]] == [
        (0, 0.0, ""), (1, 0.0, ""), (0, 0.5, "oracle/rephrase"), (1, 0.5, "oracle/rephrase"),
        (0, 0.5, "oracle/easy"), (1, 0.5, "oracle/easy"), (0, 0.5, "oracle/hard"), (1, 0.5, "oracle/hard")]
    # One progress line per interval, with both throughputs, and no carriage returns in a non-terminal.
    progress = [line for line in err.splitlines() if line.startswith("bc [")]
    assert len(progress) == INTERVALS and all("updates/s" in p and "env steps/s" in p for p in progress)
    assert f"{8 * INTERVALS}/{8 * INTERVALS} run-intervals" in progress[-1] and "\r" not in err
    assert (run_dir / "train.log").read_text().count("] step ") == INTERVALS
    assert list_checkpoints(run_dir / "checkpoints" / "chunk-000")[-1][0] == INTERVALS
    # Oracle data for every novel level was collected into the data cache; table and figures written.
    cached = sorted(p.name.split("-")[1] for p in (bench_run["root"] / "data").iterdir())
    assert cached == ["easy", "hard", "rephrase", "train"]
    assert "| bc, real only |" in out and "| bc, oracle/hard 0.5 |" in out
    # The three-way table: every level, real only beside real + oracle of that level's tasks.
    for level in ("train", "rephrase", "easy", "hard"):
        assert f"| bc | {level} |" in out
    task_success = json.loads((run_dir / "task_success.json").read_text())
    assert len(task_success["levels"]["hard"]["tasks"]) == 3  # BabyAI's three hard tasks
    assert np.asarray(task_success["levels"]["hard"]["success"]).shape == (8, 3)
    assert (ws / "results.md").read_text().strip() == out.split("\n\nworkspace:")[0].strip()
    for name in ("curves.png", "bars.png", "curves.csv", "bars.csv"):
        assert (ws / "figures" / name).stat().st_size > 0, name
    # Re-running continues: data read from the cache, the sweep resumed at its end, the same table.
    status, out2, err2 = run(bench_run["bench_argv"])
    assert status == 0 and out2 == out
    assert "(2/2 intervals done)" in err2 and "collected" not in err2


def test_results_in_memory_equal_the_results_read_back(bench_run, tmp_path):
    """The one results path: what training returns is exactly what load_sweep reads from its directory,
    and both give the printed table."""
    from imaginejax.bench import protocol
    from imaginejax.bench.report import table
    from imaginejax.bench.results import load_sweep

    sets = [s for s in bench_run["bench_argv"] if s.startswith(("data.", "imagine.", "train.", "report."))]
    config = load_config("clevr-quick", sets)
    out = tmp_path / "ws"
    outcome = protocol.train(config, out, log=lambda message: None)
    results = outcome.results
    assert len(results.runs) == 8 and results.levels == ("train", "rephrase", "easy", "hard")
    assert [(r.seed, r.data) for r in results.runs[:4]] == [(0, ""), (1, ""), (0, "oracle/rephrase"),
                                                            (1, "oracle/rephrase")]
    assert all(len(r.success["hard"]) == INTERVALS and len(r.task_success["hard"]) == 3 for r in results.runs)
    assert set(results.sources) == {"oracle/rephrase", "oracle/easy", "oracle/hard"}
    assert results.sweeps["bc"]["algo"] == "bc" and results.sweeps["bc"]["runs_per_chunk"] == 8
    assert load_sweep(out) == results
    # Bench's own workspace (same configuration, same data): the same numbers, and its table.
    assert load_sweep(bench_run["root"] / "ws").runs == results.runs
    r = config.report
    assert table(results, r.statistic, r.reps, r.seed, r.last) == (bench_run["root"] / "ws" / "results.md").read_text().strip()


def test_interrupted_train_resumes_to_the_uninterrupted_result(bench_run, monkeypatch):
    """``train`` on the collected real data (identical to bench's cached data), with relative paths from
    another working directory, stopped by Ctrl-C right after its first checkpoint: one line and exit
    status 130; then the same command again must end exactly where bench's run ended, a re-run of the
    finished command reads its checkpoints, and ``export`` with relative paths writes its policy."""
    from imaginejax.bench.policy import Policy
    from imaginejax.training import loop

    original = loop.save_checkpoint

    def save_then_interrupt(*args, **kwargs):
        original(*args, **kwargs)
        raise KeyboardInterrupt

    root = bench_run["root"]
    monkeypatch.chdir(root)  # relative paths below: orbax refuses them unless made absolute where they enter
    argv = ["train", "--algo", "bc", "--real", "real", "--out", "ws-resumed"] + tiny(Path("data"))
    monkeypatch.setattr(loop, "save_checkpoint", save_then_interrupt)
    status, _, err = run(argv)
    assert status == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("imaginejax train: bc interrupted after interval 1/2: re-run the same "
                                            "command to resume")
    monkeypatch.setattr(loop, "save_checkpoint", original)
    resumed_dir = root / "ws-resumed" / "runs" / "bc"
    assert [r["interval"] for r in MetricsLog(resumed_dir).records()] == [1] * 8

    status, out, err = run(argv)  # the same command again continues
    assert status == 0, err
    assert "resumed chunk 0" in err and "(1/2 intervals done)" in err
    straight_dir = root / "ws" / "runs" / "bc"
    assert records(resumed_dir) == records(straight_dir)
    (_, straight), (_, resumed) = (load_checkpoint(list_checkpoints(d / "checkpoints" / "chunk-000")[-1][1])
                                   for d in (straight_dir, resumed_dir))
    state_keys = sorted(k for k in straight if not k.startswith("history/"))
    assert state_keys and state_keys == sorted(k for k in resumed if not k.startswith("history/"))
    for key in state_keys:
        np.testing.assert_array_equal(resumed[key], straight[key], err_msg=key)
    assert "| bc, oracle/easy 0.5 |" in out
    status, again, err = run(argv)  # finished: a re-run reads the checkpoints and reports the same table
    assert status == 0 and "(2/2 intervals done)" in err and again == out

    status, out, err = run(["export", "ws-resumed", "--seed", "0", "--data", "", "--out", "policy-relative"])
    assert status == 0, err
    assert Policy.load(root / "policy-relative").provenance["seed"] == 0

    # A changed configuration in the same workspace is refused with the difference named.
    status, _, err = run(argv + ["--set", "train.updates=40"])
    assert status == 2 and "train.updates: 20 -> 40" in err


def test_imaginary_data_out_of_the_action_space_is_refused_before_training(bench_run):
    """A BabyAI 'imaginary' dataset with action 999 (BabyAI has 7): refused naming ``actions``, nothing trained."""
    from imaginejax.data import load_dataset, save_dataset

    ds = load_dataset(bench_run["real"])
    actions = ds.actions.copy()
    actions[0, 0] = 999
    bad = dataclasses.replace(ds, actions=actions, source="imaginary", level="easy")
    save_dataset(bad, bench_run["root"] / "bad-imaginary")
    argv = ["train", "--algo", "bc", "--real", str(bench_run["real"]), "--imaginary",
            str(bench_run["root"] / "bad-imaginary"), "--out", str(bench_run["root"] / "ws-bad")]
    status, _, err = run(argv + tiny(bench_run["root"] / "data"))
    assert status == 2 and "actions" in err and "imaginary data of babyai/easy" in err, err
    assert not (bench_run["root"] / "ws-bad" / "runs").exists()


def test_oracle_data_is_given_as_dataset_directories(bench_run):
    """``--oracle DIR``: the oracle condition takes the given real rollouts of the novel levels instead of
    collecting them: the same datasets the bench run collected and cached give the same sources; a dataset of
    the train level or an imaginary one is refused naming it, and so is oracle data for a sweep that trains no
    oracle condition, all before anything trains."""
    from imaginejax.bench import datasets, protocol, workspace
    from imaginejax.data import load_dataset, read_manifest, save_dataset

    root = bench_run["root"]
    sets = tiny(root / "data")[1::2]
    config = load_config(None, sets)
    cached = sorted(p for p in (root / "data").iterdir() if read_manifest(p)["level"] != "train")
    levels = sorted(read_manifest(p)["level"] for p in cached)
    assert levels == ["easy", "hard", "rephrase"]
    real = [load_dataset(bench_run["real"])]
    collected = datasets.mixed_sources(resolve(config), real, root / "unused")
    given = datasets.mixed_sources(resolve(config), real, root / "unused", oracle=cached)
    assert sorted(given) == sorted(collected) == [f"oracle/{level}" for level in levels]
    assert {k: workspace.fingerprint(v) for k, v in given.items()} == {k: workspace.fingerprint(v) for k, v in collected.items()}
    assert "oracle data: the given --oracle datasets (easy, hard, rephrase)" in protocol.plan(config, root / "ws-plan",
                                                                                 oracle=cached)

    base = ["train", "--algo", "bc", "--real", str(bench_run["real"]), "--out", str(root / "ws-oracle")] + tiny(root / "data")
    status, _, err = run(base + ["--oracle", str(bench_run["real"])])
    assert status == 2 and "oracle data of level 'train' cannot be mixed" in err, err
    imaginary = root / "oracle-as-imaginary"
    save_dataset(dataclasses.replace(load_dataset(cached[0]), source="imaginary"), imaginary)
    status, _, err = run(base + ["--oracle", str(imaginary)])
    assert status == 2 and f"{imaginary} holds imaginary data, expected real here" in err, err
    status, _, err = run(base + ["--oracle", str(cached[0]), "--set", 'train.conditions=["real"]'])
    assert status == 2 and "--oracle data is given but the oracle condition is not trained" in err, err
    assert not (root / "ws-oracle" / "runs").exists()


def test_dataset_options_take_one_or_more_directories_each_and_repeat():
    """``--imaginary WS/clevr-*-imaginary`` (a shell glob: several directories after one option) and the option
    repeated both collect every directory, in order, made absolute."""
    from imaginejax.cli import _build_parser

    args = _build_parser().parse_args(["train", "--imaginary", "a", "b", "--imaginary", "c", "--oracle", "o1", "o2",
                                       "--real", "r", "--out", "ws"])
    assert [Path(p).name for p in args.imaginary] == ["a", "b", "c"] and all(Path(p).is_absolute() for p in args.imaginary)
    assert [Path(p).name for p in args.oracle] == ["o1", "o2"] and [Path(p).name for p in args.real] == ["r"]
    args = _build_parser().parse_args(["imagine", "--real", "r1", "r2", "--out", "ws"])
    assert [Path(p).name for p in args.real] == ["r1", "r2"]


def test_report_of_a_workspace_and_of_a_sweep(bench_run):
    ws = bench_run["root"] / "ws"
    status, out, err = run(["report", str(ws), "--reps", "50", "--no-figures",
                            "--out", str(bench_run["root"] / "table.md")])
    assert status == 0, err
    assert "| bc, real only |" in out and "| bc | hard |" in out and "50 replicates" in out
    assert (bench_run["root"] / "table.md").read_text().strip() == out.strip()
    # A single sweep directory gets the same tables (no sources.json: no quality column values).
    status, out, _ = run(["report", str(ws / "runs" / "bc"), "--reps", "50"])
    assert status == 0 and "| bc, oracle/hard 0.5 |" in out and "| bc | hard |" in out and "(20 updates)" in out
    assert (ws / "runs" / "bc" / "figures" / "bars.png").stat().st_size > 0
    status, _, err = run(["report", str(bench_run["root"] / "nothing-here")])
    assert status == 2 and "sweep.json" in err
    # An algorithm stopped before its first evaluation is named in one line; the finished ones are reported.
    partial = bench_run["root"] / "ws-partial" / "runs"
    (partial / "prdc").mkdir(parents=True)
    (partial / "bc").symlink_to(ws / "runs" / "bc", target_is_directory=True)
    (partial / "prdc" / "sweep.json").write_text(json.dumps({"runs": [], "algo": "prdc"}))
    status, out, err = run(["report", str(partial.parent), "--reps", "50", "--no-figures"])
    assert status == 0 and "| bc, real only |" in out and "prdc" not in out
    assert err.strip().splitlines() == [f"imaginejax report: warning: left out, not finished: "
                                        f"{partial / 'prdc' / 'metrics.jsonl'} has no records yet: wait for the first interval"]


def test_a_workspace_reads_back_through_relative_paths_from_another_directory(bench_run, monkeypatch):
    """Relative paths from another working directory: export reads the final checkpoint (orbax refuses
    relative paths unless they are made absolute where they enter), report reads the sweep."""
    from imaginejax.bench.policy import Policy

    (bench_run["root"] / "elsewhere").mkdir()
    monkeypatch.chdir(bench_run["root"] / "elsewhere")
    status, out, err = run(["export", "../ws", "--seed", "1", "--data", "real", "--out", "../policy-relative"])
    assert status == 0, err
    assert Policy.load(bench_run["root"] / "policy-relative").provenance["seed"] == 1
    status, out, err = run(["report", "../ws/runs/bc", "--no-figures", "--reps", "50"])
    assert status == 0 and "| bc, real only |" in out


def test_bench_defaults_to_every_registered_algorithm_of_the_action_space():
    """bench trains ``train.algos`` or, when empty, every registered algorithm for the action space (the
    training path itself is exercised above with BC)."""
    from imaginejax.algos.base import Spec
    from imaginejax.bench.sweeps import algorithm_names

    discrete = Spec(state_dim=17, embed_dim=0, discrete=True, action_dim=7)
    continuous = Spec(state_dim=18, embed_dim=0, discrete=False, action_dim=6)
    cfg = load_config("babyai-quick")
    assert algorithm_names(cfg.train, discrete) == algos.registered(discrete=True)
    assert algorithm_names(cfg.train, continuous) == algos.registered(discrete=False)
    assert {"bc", "cql", "bcq", "td3bc"} <= set(algorithm_names(cfg.train, discrete))
    assert algorithm_names(load_config("babyai-quick", ['train.algos=["cql", "bc"]']).train, discrete) == ("cql", "bc")


def test_help_of_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out
    for command in ("demo", "collect", "imagine", "train", "bench", "report"):
        assert command in top
    keys = _config_keys(config_lib.Config)
    for command in ("collect", "imagine", "train", "bench", "report", "demo"):
        if command == "demo":  # the demo's own parser exits
            with pytest.raises(SystemExit) as exit_:
                cli.main([command, "--help"])
            assert exit_.value.code == 0
        else:
            assert cli.main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert text.startswith("usage:"), command
        if command in ("imagine", "train", "bench"):
            missing = [k for k in keys if k not in text]
            assert not missing, (command, missing)  # every configuration key is explained
            assert "clevr-quick" in text and "--set" in text
    assert cli.main([]) == 0
    assert cli.main(["train", "--no-such-option"]) == 2 and "unrecognized arguments" in capsys.readouterr().err


def _config_keys(cls, prefix: str = "") -> list[str]:
    out = []
    for field in dataclasses.fields(cls):
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if dataclasses.is_dataclass(default):
            out += _config_keys(type(default), f"{prefix}{field.name}.")
        else:
            out.append(f"{prefix}{field.name}")
    return out


@pytest.mark.parametrize("overrides, match", [
    (["train.updatez=5"], r"unknown field train\.updatez; valid fields of train: algos, seeds.*updates"),
    (["train.updates=abc"], r"config field train\.updates: expected an integer, got 'abc'.*--set train\.updates="),
    (["train.updates=10", "train.intervals=3"], r"train\.updates \(10\) must be a multiple of train\.intervals "
                                                r"\(3\): e\.g\. --set train\.updates=9"),
    (["data.env=nope"], r"data\.env: unknown environment 'nope'; valid: .*babyai.*clevr"),
    (["imagine.source=none"], r"imaginary data but imagine\.source is 'none': set imagine\.source to 'imaginer' "
                              r"or 'oracle', or train\.ratios to \[0\.0\]"),
    (["imagine.source=magic"], r"config field imagine\.source: expected one of 'imaginer', 'oracle', 'none'"),
    (["train.ratios=[0.5, 1.5]"], r"train\.ratios: 1\.5 is outside \[0, 1\]"),
    (['train.algos=["nope"]'], r"train\.algos: unknown algorithm 'nope'; registered: .*bc"),
    (["train.algo.bc.hpp={}"], r"unknown field train\.algo\.bc\.hpp; valid fields of train\.algo\.bc: "
                               r"batch_size, hp, sweep"),
    (["train.seeds=0"], r"train\.seeds must be >= 1, got 0"),
    (["imagine.finetune.num_stepz=3"], r"imagine\.finetune\.num_stepz is not a field of the imaginer preset; "
                                       r"valid: .*num_steps"),
    (["train.updates"], r"expected KEY=VALUE, e\.g\. --set train\.updates=2000"),
    (["data.episodes.x=1"], r"data\.episodes is a value, not a section"),
    # Numbers refused before anything is compiled (before: a NaN learning rate trained for minutes until "every
    # run is non-finite"; train.updates=10**12 compiled, then overflowed an int32 counter in a traceback).
    (["train.algo.bc.hp.learning_rate=nan"], r"config field train\.algo\.bc\.hp\.learning_rate: nan is not a finite "
                                             r"number; give a finite value \(--set train\.algo\.bc\.hp\.learning_rate="),
    (["train.algo.cql.sweep.alpha=[1, inf]"], r"train\.algo\.cql\.sweep\.alpha\[1\]: inf is not a finite number.*"
                                              r"--set train\.algo\.cql\.sweep\.alpha=\[<numbers>\]"),
    (["data.epsilon=-inf"], r"config field data\.epsilon: -inf is not a finite number"),
    (["imagine.finetune.learning_rate=nan"], r"imagine\.finetune\.learning_rate: nan is not a finite number"),
    (["train.algo.cql.hp.actor_lr=0"], r"train\.algo\.cql\.hp\.actor_lr = 0: a learning rate must be > 0"),
    (["train.algo.bc.sweep.learning_rate=[1e-3, -1e-3]"], r"train\.algo\.bc\.sweep\.learning_rate = -0\.001: a "
                                                          r"learning rate must be > 0"),
    (["imagine.finetune.learning_rate=0"], r"imagine\.finetune\.learning_rate = 0: a learning rate must be > 0"),
    (["imagine.finetune.validation={every = 0}"], r"imagine\.finetune: preset validation\.every = 0: not an integer "
                                                 r">= 1"),
    (["train.updates=1000000000000"], r"train\.updates = 1,000,000,000,000 is above 2,147,483,647 \(2\*\*31 - 1\), "
                                      r"the most the algorithms' int32 update counters hold.*--set train\.updates="),
    (["data.seed=4294967296"], r"data\.seed must be in \[0, 2147483647\] .*got 4294967296"),
    (["report.seed=-1"], r"report\.seed must be in \[0, 2147483647\]"),
])
def test_config_errors_name_the_field_and_the_fix(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("clevr-quick", overrides)


def test_algorithm_settings_are_checked_before_any_data_work(tmp_path):
    """A misspelled hyperparameter, of the algorithm trained or of another one the configuration names, a
    swept value of the wrong kind, and an unquoted list: refused in seconds, with nothing collected or created."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    base = ["train", "--out", str(ws), "--set", f"data.dir={json.dumps(str(data))}", "--set", 'train.algos=["bc"]']
    status, _, err = run(base + ["--set", "train.algo.cql.hp.alpah=2"])
    assert status == 2 and "train.algo.cql: 'alpah' is not a hyperparameter of this algorithm; did you mean 'alpha'?" in err
    status, _, err = run(base + ["--set", "train.algo.bc.sweep.learning_rate=[1e-3, 0.5]",
                                 "--set", "train.algo.bc.hp.learnig_rate=1e-3"])
    assert status == 2 and "did you mean 'learning_rate'?" in err
    status, _, err = run(base + ["--set", "train.algos=[bc,cql]"])
    assert status == 2 and """value '[bc,cql]' is not a TOML list: quote the strings inside it""" in err
    assert not data.exists() and not ws.exists()


def test_ctrl_c_ends_a_command_with_one_line_and_status_130(monkeypatch):
    from imaginejax.core.checkpoint import Interrupted

    def interrupted(args):
        raise Interrupted("bc interrupted after interval 2/4")

    monkeypatch.setitem(cli.COMMANDS, "train", interrupted)
    status, out, err = run(["train"])
    assert (status, out, err) == (130, "", "imaginejax train: bc interrupted after interval 2/4: re-run the same "
                                           "command to resume\n")
    monkeypatch.setitem(cli.COMMANDS, "report", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert run(["report", "ws"]) == (130, "", "imaginejax report: interrupted: re-run the same command to start again\n")


def test_the_plan_counts_the_runs_each_algorithm_trains(tmp_path):
    from imaginejax.bench import protocol

    config = load_config("clevr-quick", ['train.algos=["bc", "cql"]', "train.algo.cql.sweep.alpha=[1, 5, 10]",
                                         "train.seeds=1", 'imagine.levels=["easy"]', "train.intervals=1"])
    text = protocol.plan(config, tmp_path)
    assert ("runs: bc 3, cql 9 (1 seed × 3 data configurations × cql's 3 hyperparameter settings)" in text
            and "evaluation: once" in text and "192 imaginary rollouts" not in text), text


def test_config_errors_reach_the_command_line_as_exit_status_2(tmp_path):
    status, _, err = run(["train", "--out", str(tmp_path), "--set", "train.updates=abc"])
    assert status == 2 and "imaginejax train: error: config field train.updates" in err
    status, _, err = run(["bench", "--preset", "no-such-preset"])
    assert status == 2 and "unknown preset 'no-such-preset'; available presets:" in err and "clevr-quick" in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nupdates = 'many'\n")
    status, _, err = run(["train", "--config", str(bad), "--out", str(tmp_path)])
    assert status == 2 and "train.updates" in err
    bad.write_text("[train]\nupdatez = 3\n")
    status, _, err = run(["train", "--config", str(bad), "--out", str(tmp_path)])
    assert status == 2 and "unknown config field train.updatez; valid fields of [train]: algos" in err
    bad.write_text("[train\n")
    status, _, err = run(["train", "--config", str(bad), "--out", str(tmp_path)])
    assert status == 2 and "not valid TOML" in err


def test_values_presets_and_overrides():
    assert config_lib.parse_value("[0, 0.5]") == [0, 0.5]
    assert config_lib.parse_value("babyai") == "babyai" and config_lib.parse_value('"x y"') == "x y"
    assert config_lib.parse_value("true") is True and config_lib.parse_value("1e-3") == 1e-3
    assert set(config_lib.available_presets()) >= {"clevr-quick", "clevr-reference", "babyai-quick",
                                                  "clevr-ratio-study"}
    for name in config_lib.available_presets():
        cfg = load_config(name)  # every preset loads and validates
        assert cfg.name == name
    quick, study = load_config("clevr-quick"), load_config("clevr-ratio-study")
    assert study.train.ratios == (0.0, 0.25, 0.5, 0.75)
    assert dataclasses.replace(study.train, ratios=quick.train.ratios) == quick.train  # extends: only ratios differ
    reference = load_config("clevr-reference")
    assert reference.train.seeds == 5 and reference.data.episodes == 10000 and reference.data.rl_episodes == 6400
    assert reference.imagine.level_episodes == {"rephrase": 5600, "easy": 72400, "hard": 1680}
    # Every hyperparameter a preset names exists in that algorithm's hp pytree (CLEVR's interface).
    from imaginejax.algos.base import Spec
    from imaginejax.training.sweep import Sweep

    discrete = {"clevr": True, "babyai": True, "cheetah": False, "metaworld": False, "libero": False}
    for preset in config_lib.available_presets():
        cfg = load_config(preset)
        spec = Spec(state_dim=10, embed_dim=384, discrete=discrete[cfg.data.env], action_dim=4)
        for name, settings in cfg.train.algo.items():
            hp = algos.make(name, spec, **settings.options).default_hp(spec)
            grid = {k: [v] for k, v in settings.hp.items()} | {k: list(v) for k, v in settings.sweep.items()}
            Sweep.grid(seeds=1, hp=grid).build(hp)
    assert reference.train.algo["cql"].hp == {"learning_rate": 6.25e-5, "alpha": 10.0, "target_update_interval": 8000.0}
    babyai = load_config("babyai-quick")
    assert babyai.data.env == "babyai" and babyai.train.encoder_width == 64  # BENCHMARK §4: 64 for BabyAI
    cfg = load_config("clevr-quick", ["train.algo.cql.sweep.alpha=[1, 5]", "train.ratios=[0]", "data.env=babyai"])
    assert cfg.train.algo["cql"].sweep == {"alpha": (1.0, 5.0)} and cfg.train.ratios == (0.0,)
    assert cfg.train.algo["cql"].hp == quick.train.algo["cql"].hp  # deep merge keeps the preset's other keys
    assert cfg.data.env == "babyai"


def test_progress_bar_mode_counts_run_intervals_and_rates():
    from imaginejax.training import progress
    from imaginejax.training.loop import IntervalEvent

    stream = io.StringIO()
    bar = progress.IntervalProgress("cql", num_runs=4, num_intervals=3, updates_per_interval=100,
                                    eval_steps_per_run=500, mode="bar", stream=stream)
    bar("sweep: 4 runs on 1 device(s); ... -> 1 chunk(s) of <= 4 runs")
    # Interval 1 restored from a checkpoint, interval 2 trained: 4 runs × 100 updates in 2 s of wall
    # clock, 4 × 500 evaluation steps in 2 s.
    bar.interval(IntervalEvent(0, (0, 1, 2, 3), 1, 3, 100, 0.0, True, "[1/3] restored"))
    bar.interval(IntervalEvent(0, (0, 1, 2, 3), 2, 3, 200, 2.0, False, "[2/3] step 200 ..."))
    text = stream.getvalue()
    assert "8/12" in text and "200 updates/s" in text and "1,000 env steps/s" in text
    # Neither the restored interval nor the compiling one is in the rate: tqdm's count restarts at 8.
    assert "sweep: 4 runs" in text and bar.bar.initial == 8 and bar.eta is None
    bar.close()


def test_progress_lines_say_compiling_and_time_the_eta_without_compilation():
    from imaginejax.training import progress
    from imaginejax.training.loop import IntervalEvent

    stream = io.StringIO()
    lines = progress.IntervalProgress("bc", num_runs=2, num_intervals=4, updates_per_interval=10,
                                      eval_steps_per_run=100, mode="lines", stream=stream)
    lines.compiling()
    assert "bc: compiling" in stream.getvalue()
    # Interval 1 takes 60 s (compilation), intervals 2 and 3 take 2 s and 4 s: 3 s per interval of 2 runs,
    # 1 interval (2 run-intervals) left -> ETA 3 s, not (60 + 2 + 4) / 3 = 22 s.
    lines.interval(IntervalEvent(0, (0, 1), 1, 4, 10, 60.0, False, "[1/4]"))
    assert "(incl. compilation)" in stream.getvalue().splitlines()[-1] and lines.eta is None
    assert "ETA after the next interval" in stream.getvalue().splitlines()[-1]
    lines.interval(IntervalEvent(0, (0, 1), 2, 4, 20, 2.0, False, "[2/4]"))
    assert lines.eta == pytest.approx(2.0 / 2 * 4)
    lines.interval(IntervalEvent(0, (0, 1), 3, 4, 30, 4.0, False, "[3/4]"))
    assert lines.eta == pytest.approx(3.0)
    last = stream.getvalue().splitlines()[-1]
    assert "6/8 run-intervals" in last and "ETA 0:03" in last and "compilation" not in last
    assert "· 5 updates/s · 50 env steps/s" in last  # 2 runs × 10 updates, 2 × 100 steps in 4 s


def test_metric_sinks_tensorboard_and_missing_packages(tmp_path, monkeypatch):
    from imaginejax.training.progress import MetricSinks, MissingDependency

    MetricsLog(tmp_path).write_interval(0, 1, 50, 1.0, np.arange(2), np.ones(2, bool), {"loss": np.asarray([0.5, 0.25])},
                                        {"train": np.asarray([0.0, 1.0])}, {"train": np.zeros(2)})
    for module, flag in (("tensorboardX", "tensorboard"), ("wandb", "wandb")):
        monkeypatch.setitem(sys.modules, module, None)  # makes the import fail like a missing package
        with pytest.raises(MissingDependency, match=rf"pip install {module}.*logging\.{flag}=false"):
            MetricSinks(tmp_path, "bc", **{flag: True})
        monkeypatch.undo()

    pytest.importorskip("tensorboardX")
    # TensorBoard runs are named algorithm/seed/ratio[/data][/varying hyperparameters] from sweep.json.
    (tmp_path / "sweep.json").write_text(json.dumps({"algo": "bc", "runs": [
        {"run": 0, "config": 0, "seed": 0, "ratio": 0.0, "hp": {"lr": 0.001, "alpha": 2.5}, "data": ""},
        {"run": 1, "config": 1, "seed": 3, "ratio": 0.5, "hp": {"lr": 0.0003, "alpha": 2.5}, "data": "imaginary/easy"}]}))
    sinks = MetricSinks(tmp_path, "bc", tensorboard=True)
    assert sinks.sync() == 2 and sinks.sync() == 0  # each record is sent once
    sinks.close()
    first = _read_event_scalars(next((tmp_path / "tensorboard" / "bc" / "seed0" / "ratio0" / "lr=0.001")
                                     .glob("events.out.tfevents.*")))
    second = _read_event_scalars(next((tmp_path / "tensorboard" / "bc" / "seed3" / "ratio0.5" / "imaginary" / "easy"
                                       / "lr=0.0003").glob("events.out.tfevents.*")))
    assert first[("loss", 50)] == pytest.approx(0.5)
    assert second[("loss", 50)] == pytest.approx(0.25)
    assert second[("success/train", 50)] == pytest.approx(1.0)


def _read_event_scalars(path: Path) -> dict[tuple[str, int], float]:
    """Scalars of a TensorBoard event file, parsed from its TFRecord framing (length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    data, offset, out = path.read_bytes(), 0, {}
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
        offset += 12 + length + 4
        for value in event.summary.value:
            out[(value.tag, int(event.step))] = value.simple_value
    return out


@pytest.mark.slow
def test_imagine_writes_imaginary_datasets_and_reuses_them(bench_run):
    """``imagine`` on the collected BabyAI data with a 2-layer, 4-step imaginer; a re-run resumes the
    fine-tuning at its end and reads the datasets back instead of generating them again."""
    from imaginejax.data import load_dataset

    out = bench_run["root"] / "imagined"
    argv = ["imagine", "--real", str(bench_run["real"]), "--out", str(out)] + tiny(bench_run["root"] / "data")
    argv += ["--set", "imagine.source=imaginer",
            "--set", "imagine.levels=['easy', 'hard']", "--set", "imagine.episodes=4",
            "--set", "imagine.level_episodes={hard = 3}", "--set", "imagine.chunk_size=4",
            "--set", ("imagine.finetune={num_steps = 4, log_every = 2, checkpoint_every = 4, architecture = "
                      "{hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4, "
                      "num_key_value_heads = 2, max_position_embeddings = 2048, tie_word_embeddings = true}}")]
    status, stdout, err = run(argv)
    assert status == 0, err
    for level, count in (("easy", 4), ("hard", 3)):
        ds = load_dataset(out / f"babyai-{level}-imaginary")
        assert (ds.source, ds.level, ds.env) == ("imaginary", level, "babyai")
        assert ds.num_trajectories + ds.provenance["num_dropped_nonfinite"] == count
        assert ds.provenance["training_step"] == 4
    assert not (out / "babyai-rephrase-imaginary").exists()
    status, stdout2, err2 = run(argv)
    assert status == 0 and stdout2 == stdout
    assert err2.count("reading imaginary rollouts written by these weights") == 2


def test_static_algorithm_options_reach_the_factory_and_bad_ones_are_named():
    from imaginejax import algos
    from imaginejax.algos.base import Spec
    from imaginejax.algos.combo import ComboConfig
    from imaginejax.algos.common import DataStats

    spec = Spec(state_dim=6, embed_dim=0, discrete=True, action_dim=4)
    # COMBO's model buffer is a compiled shape: 2,000 start states per window × 5 windows kept.
    small = algos.make("combo", spec, config={"rollout_batch": 2000, "dynamics": {"ensemble_size": 6}})
    full = algos.make("combo", spec)
    stats = DataStats.identity(spec.state_dim)
    rows = lambda algo: jax.eval_shape(lambda k: algo.init(k, spec, stats, algo.default_hp(spec)),
                                       jax.random.PRNGKey(0)).buffer.valid.shape[0]
    assert rows(small) == 5 * 2000 and rows(full) == 5 * ComboConfig().rollout_batch
    with pytest.raises(ValueError, match=r"config\.rollout_bach does not exist; valid fields of ComboConfig"):
        algos.make("combo", spec, config={"rollout_bach": 1})
    with pytest.raises(ValueError, match="has no option nope; valid options: config, terminal_fn, double_q"):
        algos.make("combo", spec, nope=1)
    assert load_config("clevr-quick").train.algo["combo"].options == {"config": {"rollout_batch": 2000}}
    with pytest.raises(ConfigError, match=r"train\.algo\.bc\.options\.x: bc has no such static option"):
        load_config("clevr-quick", ["train.algo.bc.options={x=1}"])


def test_report_of_a_workspace_uses_its_report_settings_and_last_overrides_them(bench_run, tmp_path):
    """``report WS`` without flags writes the table bench wrote (the workspace's report.last and
    report.reps, not the defaults); ``--last N`` overrides report.last; ``--last 0`` is refused."""
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(bench_run["root"] / "ws", ws)
    # The workspace as created with --set report.last=1, its table written by bench (resumed at its end).
    record = json.loads((ws / "workspace.json").read_text())
    record["config"]["report"]["last"] = 1
    (ws / "workspace.json").write_text(json.dumps(record))
    argv = [str(ws) if arg == str(bench_run["root"] / "ws") else arg for arg in bench_run["bench_argv"]]
    status, _, err = run(argv + ["--set", "report.last=1", "--set", "report.figures=false"])
    assert status == 0, err
    written = (ws / "results.md").read_text()
    assert "over its last 1 evaluations" in written and "100 replicates" in written
    status, out, err = run(["report", str(ws), "--no-figures"])
    assert status == 0, err
    assert (ws / "results.md").read_text() == written and out.strip() == written.strip()
    # Both evaluations averaged: the table of the fixture's bench (report.last 5, of which there are 2).
    status, out, err = run(["report", str(ws), "--last", "2", "--no-figures"])
    assert status == 0, err
    assert "over its last 2 evaluations" in out and out.strip() != written.strip()
    assert out.strip() == bench_run["bench"][1].split("\n\nworkspace:")[0].strip()
    status, _, err = run(["report", str(ws), "--last", "0"])
    assert status == 2 and "--last must be >= 1, got 0" in err


def test_export_takes_real_only_by_its_table_name_and_a_choice_names_exactly_the_matching_runs(bench_run, tmp_path):
    ws = bench_run["root"] / "ws"
    for name in ("real", "real only", ""):
        status, out, err = run(["export", str(ws), "--seed", "1", "--data", name, "--out",
                                str(tmp_path / (name or "empty"))])
        assert status == 0, err
        assert "policy of run 1 (seed 1, ratio 0, data real only)" in out
    # Seed 0 holds 4 runs (real only and each novel level's oracle data): all of them, and no other.
    status, _, err = run(["export", str(ws), "--seed", "0", "--out", str(tmp_path / "none")])
    assert status == 2 and "seed=1" not in err
    assert ("4 runs match (seed=0), differing in ratio=0 or ratio=0.5; data='real' or data='oracle/rephrase' or "
            "data='oracle/easy' or data='oracle/hard': name one by adding data (imaginejax export: --data)") in err
    status, _, err = run(["export", str(ws), "--seed", "7", "--out", str(tmp_path / "none")])
    assert status == 2 and "0 runs match (seed=7); the runs have algo='bc'; seed=0 or seed=1;" in err
    assert not (tmp_path / "none").exists()


def test_damaged_workspace_files_name_themselves_and_the_fix(bench_run, tmp_path):
    """Every record of a workspace, truncated or stripped of a field: the command that reads it exits 2
    naming the file and how to recover (before, a bare JSONDecodeError / KeyError without the file)."""
    import shutil

    retrain = "re-run the imaginejax train / bench command that trained it"
    cases = [("workspace.json", "truncated", ["report", "export", "train"], "restore it, or train into a new --out"),
             ("workspace.json", '{"config": {}}', ["report", "train"], "restore it, or train into a new --out"),
             ("runs/bc/sweep.json", "truncated", ["report", "export"], retrain),
             ("runs/bc/sweep.json", '{"runs": [{"run": 0}]}', ["report"], retrain),
             ("runs/bc/task_success.json", "truncated", ["report"], retrain),
             ("sources.json", "[]", ["report"], retrain),
             ("random.json", "truncated", ["report"], "measures the random policy again")]
    for i, (name, damage, commands, fix) in enumerate(cases):
        ws = tmp_path / f"ws{i}"
        shutil.copytree(bench_run["root"] / "ws", ws, ignore=shutil.ignore_patterns("checkpoints", "figures"))
        if "export" in commands:
            (ws / "runs" / "bc" / "checkpoints").symlink_to(bench_run["root"] / "ws" / "runs" / "bc" / "checkpoints")
        path = ws / name
        path.write_text(path.read_text()[:40] if damage == "truncated" else damage)
        argv = {"report": ["report", str(ws), "--reps", "10"],
                "export": ["export", str(ws), "--seed", "1", "--data", "real", "--out", str(tmp_path / "policy")],
                "train": [str(ws) if arg == str(bench_run["root"] / "ws") else arg for arg in bench_run["bench_argv"]]}
        for command in commands:
            status, _, err = run(argv[command])
            assert status == 2 and f"error: {path} is damaged (" in err and fix in err, (name, damage, command, err)


def test_a_sweep_too_large_for_the_host_is_refused_with_its_estimate_before_any_work(tmp_path, monkeypatch):
    """train.seeds=1000000: refused by counting, naming train.seeds and the estimate, with nothing built,
    collected or created (before: the plan, then minutes of building a million keys and tables)."""
    from imaginejax.training import sweep

    monkeypatch.setattr(sweep, "available_memory", lambda: 1 << 30)
    data, ws = tmp_path / "data", tmp_path / "ws"
    status, _, err = run(["train", "--out", str(ws), "--set", f"data.dir={json.dumps(str(data))}",
                          "--set", 'train.algos=["bc"]', "--set", "train.seeds=1000000"])
    assert status == 2 and "error: bc with train.seeds = 1000000 × " in err, err
    assert "runs would hold ~" in err and ("more than half of the 1,024.0 MiB available (training takes the other half on a CPU): lower "
                                         "train.seeds") in err
    assert not data.exists() and not ws.exists()
