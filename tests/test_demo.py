"""`make demo` end to end on a tiny budget: data → imaginer → BC over seeds × conditions in one call → table."""

from __future__ import annotations

import pytest

from imaginejax import demo


@pytest.mark.slow
def test_demo_runs_the_three_conditions_end_to_end_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path))
    # The tiny imaginer fine-tuned for a few steps stands in for the shipped one (its own test loads it).
    sets = ["data.episodes=24", 'imagine.preset="tiny"', "imagine.episodes=6", "imagine.chunk_size=8",
            "imagine.finetune={num_steps = 4, warmup_steps = 1, log_every = 2, checkpoint_every = 4}",
            "train.seeds=2", "train.updates=20", "train.intervals=2", "train.eval_episodes=8",
            "train.batch_size=32", "train.encoder_width=16", "train.hidden=[16]", "report.reps=50"]
    args = [arg for s in sets for arg in ("--set", s)]
    table = demo.main(args)
    out = capsys.readouterr().out
    for level in ("train", "rephrase", "easy", "hard"):
        assert f"| bc | {level} |" in table
    assert "real + imaginary" in table and "real + oracle" in table
    assert "Random policy (the floor)" in out and "Imaginary data (automatic quality report)" in out
    assert (tmp_path / "demo-workspace" / "results.md").is_file()
    # A second run reads the cached data and the finished sweep instead of doing them again.
    assert demo.main(args) == table
    err = capsys.readouterr().err
    assert "reading" in err and "(2/2 intervals done)" in err
