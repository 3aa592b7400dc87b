"""The test-only reference interpreter (PyTorch + transformers), shared by the parity tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def reference_python() -> Path:
    """The reference interpreter, or a test failure explaining how to create it."""
    configured = os.environ.get("IMAGINEJAX_REF_PYTHON")
    candidate = Path(configured) if configured else REPO_ROOT / ".venv-ref" / "bin" / "python"
    if not candidate.exists():
        source = "IMAGINEJAX_REF_PYTHON" if configured else "fallback .venv-ref/bin/python"
        pytest.fail(f"reference interpreter not found ({source}: {candidate}). Run `make test`, which "
                    "creates .venv-ref (torch CPU + transformers) and sets IMAGINEJAX_REF_PYTHON.",
                    pytrace=False)
    return candidate
