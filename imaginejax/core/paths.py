"""Where generated artefacts live: one cache root, never the source tree; every path absolute.

A path the user gives (``--out ws/x``, ``fit(out="ws/fit")``, ``$IMAGINEJAX_HOME``, ``data.dir``) is made
absolute once, where it enters (:func:`absolute`): orbax refuses relative checkpoint paths, and a path
recorded relative to one working directory means something else from another.
"""

from __future__ import annotations

import os
from pathlib import Path


def absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``~`` expanded, made absolute against the current directory and normalised (``a/../b``
    -> ``b``, as a shell's ``cd`` does; symlinks are kept, not resolved)."""
    return Path(os.path.abspath(os.path.expanduser(path)))


def cache_root() -> Path:
    """The cache root: ``$IMAGINEJAX_HOME`` if set, else ``~/.cache/imaginejax`` (created on demand)."""
    root = absolute(os.environ.get("IMAGINEJAX_HOME") or Path.home() / ".cache" / "imaginejax")
    root.mkdir(parents=True, exist_ok=True)
    return root
