"""Atomic, checksummed checkpoints of a sweep's state (run states, interval index, history so far).

Layout: ``<directory>/step-<interval:08d>/`` holding ``arrays.npz`` (every array, uncompressed NumPy,
no pickle) and ``manifest.json`` (format version, interval, sweep fingerprint, SHA-256 of the array
file, name / shape / dtype of every array). A checkpoint is written into a hidden temporary directory
next to its final place, flushed to disk, then renamed into place (one ``rename`` is atomic on POSIX),
so a reader never sees a half-written checkpoint; a crash leaves at most a ``.tmp-*`` directory, which
is ignored and removed by the next save. The last ``keep`` checkpoints are kept.

Why not orbax: orbax's ``CheckpointManager`` is asynchronous by default and writes a tensorstore tree
of many files whose damage surfaces as tensorstore decode errors; this writer is synchronous (the
engine saves between compiled intervals, where everything is already on the host for logging), exact
(bitwise, NumPy's own format), and checks a checksum so a truncated or corrupted file is reported by
name with the way out. Arrays are named by their pytree path (``jax.tree_util.keystr``), so a
checkpoint restores into the structure the engine builds for the same sweep.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

PyTree = Any
FORMAT_VERSION = 1
_PREFIX = "step-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flatten_named(tree: PyTree, prefix: str) -> dict[str, np.ndarray]:
    """Pytree -> {prefix + keystr(path): host array} (raw uint32 PRNG keys stay uint32)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {prefix + jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def unflatten_named(arrays: dict[str, np.ndarray], target: PyTree, prefix: str, source: Path) -> PyTree:
    """Inverse of :func:`flatten_named` onto the structure (and shapes, dtypes) of ``target``."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    out = []
    for path, leaf in leaves:
        name = prefix + jax.tree_util.keystr(path)
        if name not in arrays:
            raise CheckpointError(f"{source} has no array {name!r}: it was written by a different algorithm "
                                  "or engine version; resume with the same sweep or start a new checkpoint_dir")
        value = arrays[name]
        if value.shape != tuple(leaf.shape) or value.dtype != leaf.dtype:
            raise CheckpointError(f"{source}: array {name!r} is {value.dtype}{list(value.shape)} but this sweep "
                                  f"needs {leaf.dtype}{list(leaf.shape)}; resume with the same sweep settings "
                                  "or start a new checkpoint_dir")
        out.append(value)
    return jax.tree_util.tree_unflatten(treedef, out)


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(interval, path) of every complete-looking checkpoint in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        if child.is_dir() and child.name.startswith(_PREFIX) and child.name[len(_PREFIX):].isdigit():
            found.append((int(child.name[len(_PREFIX):]), child))
    return sorted(found)


def save_checkpoint(directory: str | os.PathLike[str], interval: int, arrays: dict[str, np.ndarray],
                    meta: dict[str, Any], keep: int = 2) -> Path:
    """Writes ``arrays`` (name -> array) and ``meta`` (JSON-serialisable) as checkpoint ``interval``.

    Args:
      directory: the checkpoint directory (created if missing).
      interval: intervals completed; the checkpoint is ``step-<interval:08d>``.
      arrays: every array to store, by unique name.
      meta: sweep fingerprint and settings, stored in the manifest.
      keep: number of most recent checkpoints kept (>= 1); older ones are deleted after the write.

    Returns:
      The path of the new checkpoint.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = directory / f"{_PREFIX}{interval:08d}"
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=directory))
    try:
        array_file = staging / "arrays.npz"
        with open(array_file, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        manifest = {
            "format_version": FORMAT_VERSION,
            "interval": interval,
            "meta": meta,
            "files": {"arrays.npz": {"sha256": _sha256(array_file), "bytes": array_file.stat().st_size}},
            "arrays": {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in arrays.items()},
        }
        manifest_file = staging / "manifest.json"
        with open(manifest_file, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync(staging)
        if final.exists():  # re-saving the same interval (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.rename(staging, final)
        _fsync(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for _, old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads and verifies one checkpoint directory.

    Returns:
      (manifest, arrays): the parsed manifest and name -> array.

    Raises:
      CheckpointError: missing / unreadable manifest, checksum mismatch (truncated or corrupted array
        file), or an unreadable archive; the message names the file and the way out.
    """
    path = Path(path)
    fix = (f"delete {path} to resume from the previous checkpoint in {path.parent} (if any), "
           "or start again without resume")
    manifest_file, array_file = path / "manifest.json", path / "arrays.npz"
    try:
        manifest = json.loads(manifest_file.read_text())
        expected = manifest["files"]["arrays.npz"]
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{manifest_file} has format version {manifest.get('format_version')}, "
                                  f"this code reads {FORMAT_VERSION}: {fix}")
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint manifest {manifest_file} is missing or corrupted ({err}): {fix}") from err
    if not array_file.exists():
        raise CheckpointError(f"checkpoint file {array_file} is missing: {fix}")
    size, digest = array_file.stat().st_size, _sha256(array_file)
    if size != expected["bytes"] or digest != expected["sha256"]:
        raise CheckpointError(f"checkpoint file {array_file} is truncated or corrupted ({size} bytes, expected "
                              f"{expected['bytes']}; checksum mismatch): {fix}")
    try:
        with np.load(array_file, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"checkpoint file {array_file} cannot be read ({err}): {fix}") from err
    return manifest, arrays
