"""`make demo` end to end on a tiny budget: data → BC over seeds × mixes in one call → table."""

from __future__ import annotations

import numpy as np
import pytest

from imaginejax import demo
from imaginejax.data import LEVELS


@pytest.mark.slow
def test_demo_runs_end_to_end_and_resumes_from_cached_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path))
    args = ["--seeds", "2", "--train-trajectories", "24", "--oracle-trajectories", "6", "--updates", "20",
            "--intervals", "1", "--eval-episodes", "8", "--batch-size", "32"]
    summary = demo.main(args)
    out = capsys.readouterr().out
    for level in LEVELS:
        rates = np.asarray(summary["success"][level])
        assert rates.shape == (1, 4)  # one evaluation × (2 seeds × 2 data mixes)
        assert ((rates >= 0) & (rates <= 1)).all()
        assert level in out
    assert "random policy" in summary["table"]
    assert (tmp_path / "results" / "demo.json").exists()
    cached = sorted(p.name for p in (tmp_path / "demo").iterdir())
    assert len(cached) == 4 and not any(name.startswith(".") for name in cached)
    # A second run reads the cached datasets instead of collecting again.
    demo.main(args)
    assert "reading" in capsys.readouterr().err
