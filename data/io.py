"""The on-disk dataset format: a directory with a JSON manifest and one array file per field.

Layout of a dataset directory::

    manifest.json            format, schema version, metadata, instruction table, provenance, and per
                             array: file name, shape, dtype and the SHA-256 of the file's bytes
    states.npz               one file per array field of TrajectoryDataset, holding one array named
    actions.npz              after the field (``<field>.npz`` written by ``np.savez``, or
    ...                      ``<field>.safetensors``)

Choices:

* **Never pickle.** Arrays are read with ``np.load(..., allow_pickle=False)`` (or safetensors, which
  cannot hold Python objects), and written with ``allow_pickle=False``; strings (the instruction table)
  and provenance live in the JSON manifest. An ``object`` array in a file is refused with its field named.
* **npz by default**: it needs nothing beyond NumPy and any NumPy user can open the files.
  ``array_format="safetensors"`` writes the same arrays as safetensors files (the Hugging Face ecosystem's
  format, zero-copy readable); :func:`load_dataset` reads both, per the manifest.
* **One file per field**, each with its own checksum, so corruption (a flipped bit, a truncated
  download) is reported with the field named, before the file is parsed.
* **Atomic writes.** :func:`save_dataset` validates first, then writes everything into a hidden sibling
  directory and moves it onto the target in one rename (:func:`imaginejax.core.files.staged_dir`): readers see
  the old dataset or the new one, never a mix; any exception leaves an existing dataset untouched.
* :func:`load_dataset` checks the manifest and schema version, the bytes the manifest's shapes add up to
  (against the decode budget, :mod:`imaginejax.data.budget`), every file's checksum, and each array's
  shape and dtype as its file's header declares them before the array is read; then runs :func:`~imaginejax.data.validate.validate_dataset` — or, given the environment (``env=``),
  :func:`~imaginejax.data.validate.validate_for_env`.

``provenance`` round-trips through JSON: tuples come back as lists.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from imaginejax.core.files import file_sha256, staged_dir
from imaginejax.data.budget import DecodeBudget
from imaginejax.data.errors import DatasetError
from imaginejax.data.types import TrajectoryDataset
from imaginejax.data.validate import ARRAY_FIELDS, DatasetDims, EnvFacts, validate_dataset, validate_for_env

__all__ = [
    "ARRAY_FORMATS",
    "FORMAT_NAME",
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "ArrayFormat",
    "load_dataset",
    "read_manifest",
    "save_dataset",
]

FORMAT_NAME = "imaginejax-dataset"
SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
ArrayFormat = Literal["npz", "safetensors"]
ARRAY_FORMATS: tuple[str, ...] = ("npz", "safetensors")
_ALLOWED_DTYPES = ("float32", "int32", "bool")


# ----------------------------------------------------------------------------------------------- writing


def _imaginejax_version() -> str:
    try:
        return importlib.metadata.version("imaginejax")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _write_array(directory: Path, name: str, value: np.ndarray, array_format: ArrayFormat) -> dict[str, Any]:
    """Writes one field's array to ``directory/<name>.<ext>``; returns its manifest entry."""
    file = directory / f"{name}.{array_format}"
    value = np.ascontiguousarray(value)
    with open(file, "xb") as f:
        if array_format == "npz":
            np.savez(f, allow_pickle=False, **{name: value})
        else:
            import safetensors.numpy

            f.write(safetensors.numpy.save({name: value}))
        f.flush()
        os.fsync(f.fileno())
    return {"file": file.name, "shape": list(value.shape), "dtype": value.dtype.name, "sha256": file_sha256(file)}


def _manifest(ds: TrajectoryDataset, dims: DatasetDims, arrays: dict[str, dict[str, Any]],
              array_format: ArrayFormat) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "imaginejax_version": _imaginejax_version(),
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env": ds.env,
        "level": ds.level,
        "source": ds.source,
        "discrete": bool(ds.discrete),
        "num_trajectories": dims.N,
        "num_transitions": dims.K,
        "dims": dims._asdict(),
        "array_format": array_format,
        "arrays": arrays,
        "instructions": list(ds.instructions),
        "provenance": ds.provenance,
    }


def _check_target(target: Path, overwrite: bool) -> None:
    """Refuses to write over anything but a dataset directory (or an empty one) with overwrite=True."""
    if not os.path.lexists(target):
        return
    if not overwrite:
        raise FileExistsError(f"{target} already exists; pass overwrite=True to replace the dataset there")
    if not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory; refusing to replace it")
    if not (target / MANIFEST_NAME).is_file() and any(target.iterdir()):
        raise FileExistsError(f"{target} is a non-empty directory without {MANIFEST_NAME}, not an ImagineJAX "
                              "dataset; refusing to replace it (choose another path or delete it yourself)")


def save_dataset(ds: TrajectoryDataset, path: str | os.PathLike[str], *, overwrite: bool = False,
                 array_format: ArrayFormat = "npz") -> Path:
    """Validates ``ds`` and writes it atomically as a dataset directory at ``path``.

    Args:
      ds: the dataset; checked with :func:`validate_dataset` before anything is written.
      path: the dataset directory to create (parents are created). Symlinks are resolved.
      overwrite: replace an existing dataset directory (or an empty directory) at ``path``. Anything
        else at ``path`` is never replaced.
      array_format: ``"npz"`` (default) or ``"safetensors"``.

    Returns:
      The absolute path of the written dataset directory.

    Raises:
      DatasetError: ``ds`` is invalid (nothing is written).
      FileExistsError: ``path`` exists and ``overwrite`` is False, or it is not a dataset directory.
      OSError: the write failed; no temporary files remain and an existing dataset is untouched.
    """
    if array_format not in ARRAY_FORMATS:
        raise ValueError(f"array_format must be one of {ARRAY_FORMATS}, got {array_format!r}")
    dims = validate_dataset(ds)
    target = Path(path).expanduser().resolve()
    _check_target(target, overwrite)
    with staged_dir(target, overwrite) as staged:
        arrays = {name: _write_array(staged, name, getattr(ds, name), array_format) for name in ARRAY_FIELDS}
        text = json.dumps(_manifest(ds, dims, arrays, array_format), indent=2, allow_nan=False)
        with open(staged / MANIFEST_NAME, "x", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
    return target


# ----------------------------------------------------------------------------------------------- reading


def _require(manifest: dict[str, Any], key: str, kind: type, path: Path) -> Any:
    """Returns ``manifest[key]`` after checking it is present and of type ``kind``."""
    if key not in manifest:
        raise DatasetError(key, f"missing from {MANIFEST_NAME}",
                           "the manifest is incomplete or hand-edited; re-save the dataset", path)
    value = manifest[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DatasetError(key, f"{MANIFEST_NAME} holds a {type(value).__name__}, expected {kind.__name__}",
                           "the manifest is corrupted or hand-edited; re-save the dataset", path)
    return value


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads and checks a dataset's ``manifest.json`` without reading any array.

    Useful to list datasets (env, level, source, sizes, provenance) cheaply.

    Raises:
      FileNotFoundError: ``path`` is not a directory.
      DatasetError: the manifest is missing, not JSON, of another format, of an unsupported schema
        version, or lacks a key.
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(f"no dataset directory at {directory}")
    file = directory / MANIFEST_NAME
    if not file.is_file():
        raise DatasetError(MANIFEST_NAME, "missing", "this is not an ImagineJAX dataset directory; write "
                           "datasets with imaginejax.data.save_dataset (or an importer)", directory)
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(MANIFEST_NAME, f"not valid JSON ({err})",
                           "the manifest is corrupted; re-save or re-download the dataset", directory) from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise DatasetError("format", f"{MANIFEST_NAME} does not declare format {FORMAT_NAME!r}",
                           "this is not an ImagineJAX dataset; convert it with an importer", directory)
    version = _require(manifest, "schema_version", int, directory)
    if version != SCHEMA_VERSION:
        newer = version > SCHEMA_VERSION
        raise DatasetError("schema_version",
                           f"schema version {version}, this imaginejax reads version {SCHEMA_VERSION}",
                           "upgrade imaginejax" if newer else "re-save the dataset with this imaginejax",
                           directory)
    for key, kind in (("env", str), ("level", str), ("source", str), ("discrete", bool),
                      ("num_trajectories", int), ("num_transitions", int), ("array_format", str),
                      ("arrays", dict), ("instructions", list), ("provenance", dict)):
        _require(manifest, key, kind, directory)
    if manifest["array_format"] not in ARRAY_FORMATS:
        raise DatasetError("array_format", f"unknown array format {manifest['array_format']!r}",
                           f"use one of {ARRAY_FORMATS}; upgrade imaginejax if the dataset is newer", directory)
    return manifest


def _header_mismatch(name: str, file: str, dtype: np.dtype, shape: Any, entry: dict[str, Any]) -> str | None:
    if dtype != np.dtype(entry["dtype"]) or list(shape) != entry["shape"]:
        return f"{file} holds {dtype}{list(shape)}, the manifest says {entry['dtype']}{entry['shape']}"
    return None


def _read_npz_member(file: Path, name: str, entry: dict[str, Any], directory: Path) -> np.ndarray:
    """The one array of an ``np.savez`` archive, its ``.npy`` header checked against the manifest entry
    (dtype, shape, the member's size) before the array is allocated."""
    import zipfile

    fix_corrupt = "the file is corrupted or truncated; re-save or re-download the dataset"
    with zipfile.ZipFile(file) as archive:
        if archive.namelist() != [f"{name}.npy"]:
            raise DatasetError(name, f"{file.name} must hold exactly one array named {name!r}", fix_corrupt, directory)
        info = archive.getinfo(f"{name}.npy")
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, _, dtype = read_header(member)
            if dtype.hasobject:
                raise ValueError("Object arrays cannot be loaded when allow_pickle=False (pickle)")
            mismatch = _header_mismatch(name, file.name, dtype, shape, entry)
            if mismatch:
                raise DatasetError(name, mismatch, fix_corrupt, directory)
            nbytes = math.prod(shape) * dtype.itemsize
            if info.file_size != member.tell() + nbytes:
                raise DatasetError(name, f"{file.name} declares {info.file_size} bytes for {dtype}{list(shape)} "
                                   f"({member.tell() + nbytes} with its header)", fix_corrupt, directory)
            member.seek(0)
            return np.lib.format.read_array(member, allow_pickle=False)


def _read_array(directory: Path, name: str, entry: Any, array_format: str) -> np.ndarray:
    """Reads one field's array file after checking its manifest entry and checksum, and its header's dtype
    and shape against the entry before the array is read."""
    fix_corrupt = "the file is corrupted or truncated; re-save or re-download the dataset"
    expected_file = f"{name}.{array_format}"
    if (not isinstance(entry, dict) or entry.get("file") != expected_file
            or not isinstance(entry.get("sha256"), str) or entry.get("dtype") not in _ALLOWED_DTYPES
            or not isinstance(entry.get("shape"), list)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry["shape"])):
        raise DatasetError(name, f"malformed manifest entry {entry!r} (expected file {expected_file!r}, a "
                           f"sha256, a dtype in {_ALLOWED_DTYPES} and a shape)",
                           "the manifest is corrupted or hand-edited; re-save the dataset", directory)
    file = directory / expected_file
    if not file.is_file():
        raise DatasetError(name, f"array file {expected_file} is missing", fix_corrupt, directory)
    digest = file_sha256(file)
    if digest != entry["sha256"]:
        raise DatasetError(name, f"checksum mismatch for {expected_file} (sha256 {digest[:12]}…, manifest "
                           f"{entry['sha256'][:12]}…)", fix_corrupt, directory)
    try:
        if array_format == "npz":
            value = _read_npz_member(file, name, entry, directory)
        else:
            import safetensors.numpy

            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size)) if size <= min(100 << 20, file.stat().st_size) else None
            declared = header.get(name) if isinstance(header, dict) else None
            if isinstance(declared, dict) and isinstance(declared.get("shape"), list):
                dtypes = {"F32": "float32", "I32": "int32", "BOOL": "bool"}
                kind = dtypes.get(declared.get("dtype"), str(declared.get("dtype")))
                if kind != entry["dtype"] or declared["shape"] != entry["shape"]:
                    raise DatasetError(name, f"{expected_file} holds {kind}{declared['shape']}, the manifest says "
                                       f"{entry['dtype']}{entry['shape']}", fix_corrupt, directory)
            tensors = safetensors.numpy.load_file(file)
            if list(tensors) != [name]:
                raise DatasetError(name, f"{expected_file} must hold exactly one array named {name!r}",
                                   fix_corrupt, directory)
            value = tensors[name]
    except DatasetError:
        raise
    except ValueError as err:
        if "pickle" in str(err):
            raise DatasetError(name, f"{expected_file} holds a pickled object array, refused (unpickling "
                               "runs arbitrary code)", f"re-export {name} with a numeric dtype", directory) from err
        raise DatasetError(name, f"unreadable {expected_file} ({err})", fix_corrupt, directory) from err
    except Exception as err:  # zipfile.BadZipFile, EOFError, OSError, safetensors' own error type, ...
        raise DatasetError(name, f"unreadable {expected_file} ({type(err).__name__}: {err})", fix_corrupt,
                           directory) from err
    if value.dtype != np.dtype(entry["dtype"]) or list(value.shape) != entry["shape"]:
        raise DatasetError(name, f"{expected_file} holds {value.dtype}{list(value.shape)}, the manifest says "
                           f"{entry['dtype']}{entry['shape']}", fix_corrupt, directory)
    return value


def load_dataset(path: str | os.PathLike[str], *, env: EnvFacts | None = None,
                 embed_dim: int | None = None, max_decoded_bytes: int | None = None) -> TrajectoryDataset:
    """Reads a dataset directory written by :func:`save_dataset` and validates it.

    Args:
      path: the dataset directory.
      env: the environment the dataset is for (``EnvFacts.of(env_object)``): then validated with
        :func:`~imaginejax.data.validate.validate_for_env` (action range, state width and plausibility,
        goal width) instead of :func:`validate_dataset` alone.
      embed_dim: with ``env``, the encoder's embedding width the dataset must have.
      max_decoded_bytes: the most bytes the arrays may take in all (default: :mod:`imaginejax.data.budget`).

    Returns:
      The dataset, bit-exact with what was saved (``instructions`` as a tuple).

    Raises:
      FileNotFoundError: ``path`` is not a directory.
      DatasetError: naming the field, for a bad manifest or schema version, a missing, corrupted or
        truncated array file (checksum mismatch), a pickled array, or any rule of
        :func:`validate_dataset` (and of :func:`validate_for_env` with ``env``).
    """
    directory = Path(path).expanduser()
    manifest = read_manifest(directory)
    entries: dict[str, Any] = manifest["arrays"]
    unknown = sorted(set(entries) - set(ARRAY_FIELDS))
    if unknown:
        raise DatasetError(unknown[0], "unknown array in the manifest",
                           "this dataset is not of this schema; re-save it", directory)
    budget = DecodeBudget(directory, max_decoded_bytes)
    arrays = {}
    for name in ARRAY_FIELDS:
        if name not in entries:
            raise DatasetError(name, "missing from the manifest's arrays", "re-save the dataset", directory)
        entry = entries[name]
        if isinstance(entry, dict) and entry.get("dtype") in _ALLOWED_DTYPES and isinstance(entry.get("shape"), list) \
                and all(isinstance(d, int) and d >= 0 for d in entry["shape"]):
            nbytes = math.prod(entry["shape"]) * np.dtype(entry["dtype"]).itemsize
            budget.charge(nbytes, name, f"the manifest's {entry['dtype']}{entry['shape']} would decode to {nbytes} bytes")
        arrays[name] = _read_array(directory, name, entry, manifest["array_format"])
    instructions = manifest["instructions"]
    if not all(isinstance(text, str) for text in instructions):
        raise DatasetError("instructions", "the manifest's instruction table holds non-strings",
                           "re-save the dataset", directory)
    ds = TrajectoryDataset(**arrays, instructions=tuple(instructions), env=manifest["env"],
                           level=manifest["level"], source=manifest["source"], discrete=manifest["discrete"],
                           provenance=manifest["provenance"])
    try:
        dims = validate_dataset(ds) if env is None else validate_for_env(ds, env, embed_dim=embed_dim)
    except DatasetError as err:
        raise DatasetError(err.field, err.problem, err.fix, directory) from err
    for key, value in (("num_trajectories", dims.N), ("num_transitions", dims.K)):
        if manifest[key] != value:
            raise DatasetError(key, f"the manifest says {manifest[key]}, the arrays hold {value}",
                               "the manifest is inconsistent with the arrays; re-save the dataset", directory)
    return ds
