"""Where generated artefacts live: one cache root, never the source tree."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache root: ``$IMAGINEJAX_HOME`` if set, else ``~/.cache/imaginejax`` (created on demand)."""
    root = Path(os.environ.get("IMAGINEJAX_HOME") or Path.home() / ".cache" / "imaginejax")
    root.mkdir(parents=True, exist_ok=True)
    return root
