"""Checkpoints on orbax-checkpoint: synchronous, atomic, integrity-checked, last N kept.

Every checkpoint of the project (sweep state in :mod:`imaginejax.training.loop`, the HalfCheetah expert's
training state in ``experiments/experts/cheetah_sac.py``, the KALM imaginer's fine-tuning state in
:mod:`imaginejax.imaginer.finetune`) goes through :func:`save_checkpoint` / :func:`load_checkpoint`.
Storage is orbax's: an ``orbax.checkpoint.CheckpointManager`` (``enable_async_checkpointing=False``,
``max_to_keep=keep``) with one item written by :class:`ArraysHandler`. Layout::

    <directory>/step-<interval:08d>/       one orbax step directory (finalized: renamed into place)
        _CHECKPOINT_METADATA               orbax's step metadata
        arrays/                            the item of ArraysHandler
            tree/                          orbax PyTree checkpoint of {name: array} (OCDBT, tensorstore)
            manifest.json                  format version, interval, meta, name / shape / dtype of every
                                           array, SHA-256 and size of every file under tree/
            manifest.sha256                the seal: SHA-256 of manifest.json (``sha256sum -c`` format),
                                           written last

Guarantees:

* **Atomic.** Orbax writes a step into ``step-<n>.orbax-checkpoint-tmp-*`` and renames it into place
  after ``ArraysHandler.finalize``; a process killed mid-save leaves only that temporary directory,
  which :func:`list_checkpoints` ignores and the next save removes. The manifest is written in
  ``finalize`` — after every array file, before the rename — so a listed checkpoint always has one.
  Checkpoints beyond the last ``keep`` are deleted the same way round: orbax renames them into
  ``.deleted/`` (its ``todelete_subdir``) and the directory is removed after the save, so a process
  killed mid-deletion never leaves a half-deleted ``step-*`` directory that is listed.
* **Verified.** Orbax/tensorstore do not checksum the stored chunks (measured with orbax 0.12.8: one
  flipped bit in the middle of a 200 KB float32 chunk file restores without error as ~8,000 wrong
  values). :func:`load_checkpoint` first checks the seal (the manifest is unchanged; format-2
  checkpoints, written before seals existed, have none), then that the manifest is well-formed and
  agrees with the checkpoint's name (its ``interval``), that ``tree/`` holds exactly the manifest's files
  with their sizes and SHA-256, and only then lets orbax read; any inconsistency raises
  :class:`CheckpointError` naming the checkpoint and the way out (delete it to fall back to the previous
  one, which the message names). A checkpoint that passes these checks but cannot be read here (another
  format version, an orbax that cannot decode it) is intact: the message says to keep it, never to
  delete it; the manifest's ``written_by`` names the orbax-checkpoint and jax versions that wrote it.
  The seal and the per-file SHA-256 are unkeyed digests: they detect damage (a torn write, a flipped
  bit, an edit that did not recompute them), not tampering — whoever can edit a checkpoint can
  recompute them, so a checkpoint is as trustworthy as the place it came from.
* **Exact.** NumPy arrays are stored and restored as NumPy arrays by orbax (bitwise: float32/64,
  int32/64, uint32 PRNG key data, bool). Zero-size arrays, which orbax refuses to store, are kept in
  the manifest only (their shape and dtype are their whole content).

Several processes (:mod:`imaginejax.core.distributed`): every process calls :func:`save_checkpoint` with the
same arrays and takes part in orbax's multi-host save, whose barriers keep them in step; the primary
host (process 0) alone writes the tree, finalizes (the manifest, the seal) and renames, and alone
clears what a killed process left. Every process reads with :func:`load_checkpoint`, so the directory
must be on storage all processes see.

Arrays are named by their pytree path (:func:`flatten_named`, ``jax.tree_util.keystr``), so a
checkpoint restores into the structure the caller builds for the same run (:func:`unflatten_named`),
and ``orbax.checkpoint.PyTreeCheckpointer().restore(step / "arrays" / "tree")`` reads the same
``{name: array}`` dict without this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from imaginejax.core.files import file_sha256
from imaginejax.core.paths import absolute

PyTree = Any
FORMAT = "imaginejax-checkpoint"
FORMAT_VERSION = 3  # 3: manifest.sha256 seals the manifest
LEGACY_VERSIONS = (2,)  # read without a seal (written before seals existed); every other check applies
ITEM = "arrays"  # the item (sub-directory) of ArraysHandler inside a step directory
TREE = "tree"  # orbax PyTree checkpoint inside the item
MANIFEST = "manifest.json"
SEAL = "manifest.sha256"
_PREFIX = "step-"
_TMP_MARK = ".orbax-checkpoint-tmp"
_TRASH = ".deleted"  # orbax's todelete_subdir: old checkpoints are renamed here (atomic), then removed


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during checkpointed work; the message says how far the checkpoints got (still a
    ``KeyboardInterrupt``, so callers that stop on one stop on it)."""


# ---------------------------------------------------------------------------------------------------
# Named arrays <-> pytrees


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


# ---------------------------------------------------------------------------------------------------
# Orbax pieces: step names, the item handler


class _StepNames(ocp.step.NameFormat):
    """Orbax step naming ``step-<n:08d>`` (orbax's standard format would put an underscore there);
    only finalized directories count."""

    def build_name(self, step: int) -> str:
        return f"{_PREFIX}{step:08d}"

    def _metadata(self, path: Path) -> ocp.step.Metadata | None:
        digits = path.name[len(_PREFIX):]
        if path.is_dir() and path.name.startswith(_PREFIX) and digits.isdigit():
            return ocp.step.Metadata(step=int(digits), path=epath.Path(path))
        return None  # includes orbax's unfinalized "<name>.orbax-checkpoint-tmp-*" directories

    def find_all(self, base_path: epath.PathLike) -> Iterator[ocp.step.Metadata]:
        base = Path(base_path)
        found = [self._metadata(p) for p in base.iterdir()] if base.is_dir() else []
        return iter([m for m in found if m is not None])

    def find_step(self, base_path: epath.PathLike, step: int) -> ocp.step.Metadata:
        found = self._metadata(Path(base_path) / self.build_name(step))
        if found is None:
            raise ValueError(f"no finalized checkpoint {self.build_name(step)} in {base_path}")
        return found


def _files(root: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"sha256", "bytes"}} of every file under ``root``."""
    return {p.relative_to(root).as_posix(): {"sha256": file_sha256(p), "bytes": p.stat().st_size}
            for p in sorted(root.rglob("*")) if p.is_file()}


class ArraysHandler(ocp.CheckpointHandler):
    """Orbax handler of one item: named NumPy arrays plus a JSON manifest with file checksums.

    ``save`` stores the non-empty arrays with orbax's ``PyTreeCheckpointHandler`` under ``tree/``;
    ``finalize`` (called by orbax after the write, before the atomic rename) hashes every file under
    ``tree/`` and writes ``manifest.json``; ``restore`` verifies the hashes, then restores.
    """

    def __init__(self) -> None:
        self._tree = ocp.PyTreeCheckpointHandler()
        self._pending: dict[str, dict[str, Any]] = {}

    def save(self, directory: epath.Path, args: ArraysSave) -> None:
        directory = Path(directory)
        stored = {name: a for name, a in args.arrays.items() if a.size > 0}
        tree_dir = directory / TREE
        tree_dir.mkdir(parents=True, exist_ok=True)
        if stored:
            self._tree.save(epath.Path(tree_dir), args=ocp.args.PyTreeSave(stored))
        self._pending[str(directory)] = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "interval": args.interval, "meta": args.meta,
            "written_by": {"orbax-checkpoint": ocp.__version__, "jax": jax.__version__},
            "arrays": {name: {"shape": list(a.shape), "dtype": str(a.dtype), "stored": name in stored}
                       for name, a in args.arrays.items()},
        }

    def finalize(self, directory: epath.Path) -> None:
        directory = Path(directory)
        manifest = self._pending.pop(str(directory))
        if any(spec["stored"] for spec in manifest["arrays"].values()):
            self._tree.finalize(epath.Path(directory / TREE))  # merges orbax's per-process OCDBT data
        manifest["files"] = _files(directory / TREE)
        text = json.dumps(manifest, indent=1).encode()
        for name, content in ((MANIFEST, text), (SEAL, f"{hashlib.sha256(text).hexdigest()}  {MANIFEST}\n".encode())):
            with open(directory / name, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())

    def restore(self, directory: epath.Path, args: ArraysRestore | None = None
                ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        del args
        return _read_item(Path(directory))

    def metadata(self, directory: epath.Path) -> dict[str, Any]:
        return _read_manifest(Path(directory), _fix(Path(directory).parent))

    def close(self) -> None:
        self._tree.close()


@ocp.args.register_with_handler(ArraysHandler, for_save=True)
@dataclasses.dataclass
class ArraysSave(ocp.args.CheckpointArgs):
    """Save arguments of :class:`ArraysHandler`: arrays by name, the interval, JSON metadata."""

    arrays: dict[str, np.ndarray]
    interval: int
    meta: dict[str, Any]


@ocp.args.register_with_handler(ArraysHandler, for_restore=True)
@dataclasses.dataclass
class ArraysRestore(ocp.args.CheckpointArgs):
    """Restore arguments of :class:`ArraysHandler` (none: the arrays come back as stored)."""


def _fix(step_dir: Path) -> str:
    """The way out of a checkpoint proven damaged (a seal, size or SHA-256 that does not match what was
    written): delete it, and resume from the previous one (named) or restart."""
    earlier = [p for _, p in list_checkpoints(step_dir.parent) if p.name < step_dir.name]
    previous = (f"to resume from the previous checkpoint {earlier[-1]}" if earlier
                else "(there is no earlier checkpoint: start again without resume)")
    return f"delete {step_dir} {previous}"


def _keep(step_dir: Path) -> str:
    """The way out of a checkpoint that is not proven damaged but cannot be read here: keep it."""
    return (f"{step_dir} is not damaged, so keep it: read it with the ImagineJAX, orbax-checkpoint and jax "
            "versions that wrote it (the manifest's 'written_by'), or move it aside (do not delete it) to start "
            "again without resume")


def _manifest_problem(manifest: Any, step_dir: Path) -> str | None:
    """What is inconsistent in a parsed manifest (None: nothing)."""
    if not isinstance(manifest, dict):
        return "it is not a JSON object"
    interval, files, specs = manifest.get("interval"), manifest.get("files"), manifest.get("arrays")
    if type(interval) is not int or interval < 0:
        return f"its interval {interval!r} is not a non-negative integer"
    if step_dir.name.startswith(_PREFIX) and step_dir.name[len(_PREFIX):].isdigit() \
            and interval != int(step_dir.name[len(_PREFIX):]):
        return f"its interval {interval} is not the checkpoint's ({step_dir.name})"
    if not isinstance(manifest.get("meta"), dict):
        return "its meta is not a JSON object"
    if not isinstance(files, dict) or not all(
            isinstance(name, str) and isinstance(e, dict) and isinstance(e.get("sha256"), str)
            and type(e.get("bytes")) is int for name, e in files.items()):
        return "its file list is malformed"
    if not isinstance(specs, dict) or not all(
            isinstance(spec, dict) and isinstance(spec.get("stored"), bool) and isinstance(spec.get("dtype"), str)
            and isinstance(spec.get("shape"), list) and all(type(d) is int and d >= 0 for d in spec["shape"])
            for spec in specs.values()):
        return "its array list is malformed"
    for name, spec in specs.items():
        try:
            dtype = np.dtype(spec["dtype"])
        except TypeError:
            return f"array {name!r} has an unknown dtype {spec['dtype']!r}"
        if dtype.hasobject or dtype.names is not None:
            return f"array {name!r} has dtype {spec['dtype']!r} (checkpoints hold numeric arrays only)"
        if not spec["stored"] and int(np.prod(spec["shape"], dtype=object)) != 0:
            return f"array {name!r} is not stored but not empty"
    return None


def _read_manifest(item: Path, fix: str) -> dict[str, Any]:
    """The manifest of an item, after its seal and its consistency are checked (a format-2 manifest,
    written before seals existed, has no seal; every other check applies to it)."""
    manifest_file, seal_file, step_dir = item / MANIFEST, item / SEAL, item.parent
    try:
        text = manifest_file.read_bytes()
        manifest = json.loads(text)
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"checkpoint manifest {manifest_file} is missing or corrupted ({err}): {fix}") from err
    got = manifest.get("format") if isinstance(manifest, dict) else manifest
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    legacy = version in LEGACY_VERSIONS and not seal_file.exists()
    if not legacy:
        try:
            seal = seal_file.read_text().split()[0] if seal_file.is_file() else None
        except (OSError, UnicodeDecodeError, IndexError):
            seal = ""
        if seal != hashlib.sha256(text).hexdigest():
            what = "has no seal" if seal is None else "does not match its seal"
            raise CheckpointError(f"checkpoint manifest {manifest_file} is missing or corrupted: it {what} ({SEAL}: "
                                  "the SHA-256 of the manifest as written), so it was edited or damaged after the "
                                  f"checkpoint was written and cannot be trusted: {fix}")
    if got != FORMAT or version not in (FORMAT_VERSION, *LEGACY_VERSIONS):
        raise CheckpointError(f"{manifest_file} is format {got!r} version {version}, this code "
                              f"reads {FORMAT!r} version {FORMAT_VERSION}: {_keep(step_dir)}")
    problem = _manifest_problem(manifest, step_dir)
    if problem is not None:
        raise CheckpointError(f"checkpoint manifest {manifest_file} is inconsistent: {problem}: {fix}")
    return manifest


def _read_item(item: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    fix = _fix(item.parent)
    manifest = _read_manifest(item, fix)
    tree_dir = item / TREE
    on_disk = sorted(p.relative_to(tree_dir).as_posix() for p in tree_dir.rglob("*") if p.is_file()) \
        if tree_dir.is_dir() else []
    extra = sorted(set(on_disk) - set(manifest["files"]))
    if extra:
        raise CheckpointError(f"checkpoint {tree_dir} holds files its manifest does not list ({', '.join(extra[:3])}): "
                              f"{fix}")
    for name, expected in manifest["files"].items():
        file = tree_dir / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {file} is missing: {fix}")
        size = file.stat().st_size
        if size != expected["bytes"] or file_sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint file {file} is truncated or corrupted ({size} bytes, expected "
                                  f"{expected['bytes']}; SHA-256 mismatch): {fix}")
    specs = manifest["arrays"]
    arrays: dict[str, np.ndarray] = {}
    if any(spec["stored"] for spec in specs.values()):
        handler = ocp.PyTreeCheckpointHandler()
        try:
            arrays = dict(handler.restore(epath.Path(tree_dir)))
        except Exception as err:  # every file matched its SHA-256: the installation, not the checkpoint
            raise CheckpointError(f"checkpoint {tree_dir} cannot be read by orbax-checkpoint {ocp.__version__} "
                                  f"({type(err).__name__}: {err}), although every file matches the SHA-256 "
                                  f"recorded when it was written: {_keep(item.parent)}") from err
        finally:
            handler.close()
    out = {}
    for name, spec in specs.items():
        value = np.asarray(arrays[name]) if spec["stored"] and name in arrays else None
        if not spec["stored"]:
            value = np.zeros(spec["shape"], np.dtype(spec["dtype"]))
        if value is None or list(value.shape) != spec["shape"] or str(value.dtype) != spec["dtype"]:
            got = "nothing" if value is None else f"{value.dtype}{list(value.shape)}"
            raise CheckpointError(f"checkpoint {tree_dir}: array {name!r} restored as {got}, the manifest says "
                                  f"{spec['dtype']}{spec['shape']}: {fix}")
        out[name] = value
    return manifest, out


# ---------------------------------------------------------------------------------------------------
# Public API


def _manager(directory: Path, keep: int | None, preserve: tuple[int, ...] = ()) -> ocp.CheckpointManager:
    policy = None
    if preserve:  # the last `keep` and the preserved ones (orbax's policy, exclusive with max_to_keep)
        policies = ocp.checkpoint_managers
        policy = policies.AnyPreservationPolicy([policies.LatestN(keep), policies.CustomSteps(preserve)])
        keep = None
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True, enable_async_checkpointing=False, step_name_format=_StepNames(),
        cleanup_tmp_directories=True, todelete_subdir=_TRASH, preservation_policy=policy)
    return ocp.CheckpointManager(epath.Path(directory), options=options,
                                 item_handlers={ITEM: ArraysHandler()})


def checkpoint_path(directory: str | os.PathLike[str], interval: int) -> Path:
    """The path of checkpoint ``interval`` in ``directory`` (``directory/step-<interval:08d>``)."""
    return Path(directory) / _StepNames().build_name(interval)


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is one checkpoint (a finalized ``step-*`` directory with its manifest), as
    opposed to a directory of checkpoints."""
    path = Path(path)
    return _StepNames()._metadata(path) is not None and (path / ITEM / MANIFEST).is_file()


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(interval, path) of every finalized checkpoint in ``directory``, oldest first (orbax's
    temporary directories of unfinished saves are not listed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((m.step, Path(m.path)) for m in _StepNames().find_all(directory))


def save_checkpoint(directory: str | os.PathLike[str], interval: int, arrays: dict[str, np.ndarray],
                    meta: dict[str, Any], keep: int = 2, preserve: tuple[int, ...] = ()) -> Path:
    """Writes ``arrays`` (name -> array) and ``meta`` (JSON-serialisable) as checkpoint ``interval``.

    Synchronous: when it returns, the checkpoint is finalized on disk.

    Args:
      directory: the checkpoint directory (created if missing).
      interval: intervals (or steps) completed, >= 0; the checkpoint is ``step-<interval:08d>``. An
        existing checkpoint of the same interval is replaced.
      arrays: every array to store, by unique name (host arrays; any NumPy dtype but object).
      meta: sweep fingerprint and settings (JSON-serialisable), stored in the manifest.
      keep: number of most recent checkpoints kept (>= 1); older ones are deleted after the write.
      preserve: intervals never deleted by that rotation (e.g. the best checkpoint of a run).

    Returns:
      The path of the new checkpoint.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if interval < 0:
        raise ValueError(f"interval must be >= 0, got {interval}")
    arrays = {str(name): np.asarray(a) for name, a in arrays.items()}
    for name, a in arrays.items():
        if a.dtype == object:
            raise ValueError(f"array {name!r} has dtype object; checkpoints store numeric / bool arrays only")
    meta = json.loads(json.dumps(meta))  # fail here, not in orbax's finalize, on non-JSON metadata
    directory = absolute(directory)  # orbax's OCDBT store refuses relative paths
    directory.mkdir(parents=True, exist_ok=True)
    primary = jax.process_index() == 0  # orbax's primary host; the others wait at its barriers
    # Before orbax's first barrier, so no process has begun writing this save's temporary directory.
    for stale in [*directory.glob(f"*{_TMP_MARK}*"), directory / _TRASH] if primary else []:
        shutil.rmtree(stale, ignore_errors=True)
    manager = _manager(directory, keep, tuple(sorted(set(preserve))))
    try:
        if interval in manager.all_steps():  # re-saving the same interval (e.g. after a resume)
            manager.delete(interval)
        manager.save(interval, args=ocp.args.Composite(**{ITEM: ArraysSave(arrays, interval, meta)}), force=True)
        manager.wait_until_finished()
    finally:
        manager.close()
    if primary:
        shutil.rmtree(directory / _TRASH, ignore_errors=True)
    return checkpoint_path(directory, interval)


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Reads and verifies one checkpoint directory (``step-*``, as listed by :func:`list_checkpoints`).

    Returns:
      (manifest, arrays): the parsed manifest (``interval``, ``meta``, ``arrays``, ``files``) and
      name -> NumPy array, bitwise as saved.

    Raises:
      CheckpointError: missing checkpoint or manifest, corrupted manifest, a missing, truncated or
        corrupted array file (SHA-256 mismatch), or data orbax cannot decode; the message names the
        file and the way out.
    """
    path = absolute(path)  # orbax refuses relative paths
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a directory): list the checkpoints "
                              f"of {path.parent} with imaginejax.core.checkpoint.list_checkpoints, or start again "
                              "without resume")
    if (path / "arrays.npz").is_file() and not (path / ITEM).exists():
        raise CheckpointError(f"checkpoint {path} is in the NumPy format of an older ImagineJAX (arrays.npz), "
                              f"this code reads orbax checkpoints: {_keep(path)}")
    return _read_item(path / ITEM)
