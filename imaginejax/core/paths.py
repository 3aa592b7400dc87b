"""Where generated artefacts live: one cache root, never the source tree; every path absolute; compiled
programs cached there too.

A path the user gives (``--out ws/x``, ``fit(out="ws/fit")``, ``$IMAGINEJAX_HOME``, ``data.dir``) is made
absolute once, where it enters (:func:`absolute`): orbax refuses relative checkpoint paths, and a path
recorded relative to one working directory means something else from another.
"""

from __future__ import annotations

import importlib.util
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


COMPILATION_CACHE_ENV = "IMAGINEJAX_COMPILATION_CACHE"  # "0" turns the persistent compilation cache off
COMPILATION_CACHE_BYTES = 2 << 30  # least recently used programs are dropped beyond this


def enable_compilation_cache() -> Path | None:
    """Turns on JAX's persistent compilation cache in ``<cache root>/jax-cache``: a re-run, a resumed sweep or
    a second process then loads each compiled program (keyed by the program, its compile options, the
    devices and the jax/jaxlib versions) instead of compiling it again. Programs compiled in under
    ``jax_persistent_cache_min_compile_time_secs`` (1 s) are not stored; the directory is kept under
    :data:`COMPILATION_CACHE_BYTES`. A directory the user set (``jax_compilation_cache_dir``, e.g. by
    ``$JAX_COMPILATION_CACHE_DIR``) is left as it is; ``$IMAGINEJAX_COMPILATION_CACHE=0`` turns it off.

    Returns:
      The cache directory in use, or None when off.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if jax.config.jax_compilation_cache_dir:
        return Path(jax.config.jax_compilation_cache_dir)
    if os.environ.get(COMPILATION_CACHE_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return None
    directory = cache_root() / "jax-cache"
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if jax.config.jax_compilation_cache_max_size < 0 and importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)  # jax bounds it under a file lock
    compilation_cache.reset_cache()  # a process that compiled before this call decided "no cache" then
    return directory
