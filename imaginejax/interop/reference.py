"""The reference benchmark's dataset files: read them safely into ours, and write ours in their layout.

The reference (BENCHMARK.md §3) ships, per level, a pair (real, imaginary) of dicts of trajectory-major
padded arrays::

    observations       (N, T, D) float    state ⊕ instruction embedding (D = S + E), or the bare state (D = S)
    actions            (N, T) int | (N, T, 1) int-valued | (N, T, A) float
    rewards            (N, T, 1) or (N, T)
    masks              (N, T, 1) or (N, T)   1 on valid steps (a prefix of each row)
    next_observations  (N, T, D)           optional
    terminals          (N, T, 1) or (N, T)   optional
    timeouts           (N, T, 1) or (N, T)   optional (written by :func:`export_reference`; D4RL's name
                                             for truncations; ``truncations`` is read too)
    instructions       (N,) / (N, k) / (N, T) strings   optional (side file for the HDF5 files)
    goals              (N, G) or (N, T, G)   optional

in three containers: **HDF5** (top-level datasets), **parquet** (one row per trajectory, nested list
columns) and **pickled ``.npy`` dicts** (``np.save(path, dict)``).

Reading (:func:`import_reference`):

* **No unpickling by default.** A ``.npy`` file's header is parsed with NumPy's header reader; an object
  payload (the pickled dict) is read by :func:`~imaginejax.data.safe_pickle.read_pickle`, which interprets
  the opcodes itself and builds only NumPy arrays of bool / numeric / string dtypes (from their raw
  bytes), strings and plain containers; anything else — another global, a structured or object dtype
  over raw bytes, an unknown opcode — is refused with a :class:`DatasetError` naming the dict key, and
  nothing of the file's choosing runs. ``trust_pickle=True`` is the explicit opt-in to :mod:`pickle`.
* **Nothing outside the file is read.** HDF5: only top-level datasets reached through hard links, stored
  in the file (no external raw storage, no virtual datasets), of bool / numeric / string dtypes (no
  compound, object, reference or variable-length non-string types), read in a child process with a
  time limit (:mod:`imaginejax.data.hdf5_reader`: the HDF5 library can loop or crash on malformed
  files; that is then our error naming the file). Parquet: column chunks stored in the
  file, columns of numbers / bools / strings and (fixed-size) lists of them; every decoding step, the
  ``imaginejax`` metadata record included, names the file and field on failure.
* **Instruction embeddings** are split from the observations at the environment's state width ``S``
  (asked from the registry, :func:`imaginejax.envs.make`). They must be constant along each row; the
  distinct (instruction text, embedding) pairs form the instruction table. A file with bare states gets
  embeddings from the sentence encoder (``embed=True``) or none (E = 0).
* ``masks`` becomes the valid-step mask. Without ``next_observations`` the state after a row's last
  valid step is unknown: that step is dropped (the row keeps L - 1 transitions and ends in a truncation;
  rows left empty are dropped), and the counts go into the provenance.
* **Terminals are not taken on faith.** The reference marks every trajectory end terminal, time limits
  included (BENCHMARK.md §3). ``terminals="auto"`` (default) uses the file's flags only when the file
  also says which ends were time limits (``timeouts`` / ``truncations``) or when the flags do not have
  that defect's signature (every row's end flagged); otherwise terminals are inferred (``"infer"``):
  with goal vectors in our encoding, a row's last valid step is terminal iff the environment's success
  predicate ``env.success(s, a, s', goal)`` holds on it (or, for environments whose success depends on
  the episode so far, ``env.trajectory_success_and_reward``); without goals, iff the row ended before the
  level's step cap (episodes end only on success or at the cap; a success on the very last allowed step
  is then counted as a truncation — conservative: its value is bootstrapped). Flags set on the first
  padding step (the reference's misaligned ``done``) are moved to the last valid step.
* **Goals** come from ``goals=`` (ours), else the file's ``goals`` if their width is the environment's
  goal width, else from instruction strings that belong to our level's instruction table; otherwise the
  dataset has G = 0 (the file's goals in another encoding are not kept; the provenance says so).
* Non-finite values, wrong ranks or widths, non-prefix masks, out-of-range discrete actions are refused
  with the **file's** field named. The result is validated against the environment
  (:func:`~imaginejax.data.validate.validate_for_env`: action range, state width and plausibility,
  goal width, finiteness) and keeps its provenance: source file path, SHA-256 and format (plus a side
  file's). With ``out=`` it is written with :func:`save_dataset` (atomic); on any error nothing is written.

Writing (:func:`export_reference`): ours → HDF5, ``.npy`` dict of plain arrays (only NumPy arrays and
strings inside, so our own reader reads it without ``trust_pickle``) or parquet, atomically. It adds
``timeouts``, the instruction table (``instruction_table``, ``instruction_embeddings``,
``instruction_ids``) and an ``imaginejax`` JSON metadata record, so ours → reference layout → ours is
bit-exact (padding is zeros, as everywhere in ImagineJAX).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from imaginejax.core.files import atomic_path, file_sha256
from imaginejax.data.budget import DecodeBudget
from imaginejax.data.errors import DatasetError
from imaginejax.data.safe_pickle import read_pickle
from imaginejax.data.types import LEVELS, SOURCES, TrajectoryDataset
from imaginejax.data.validate import EnvFacts, validate_dataset, validate_for_env

__all__ = [
    "REFERENCE_FORMATS",
    "check_hdf5_file",
    "export_reference",
    "import_reference",
    "load_npy",
    "read_reference_file",
    "reference_arrays",
]

ReferenceFormat = Literal["hdf5", "npy", "parquet"]
REFERENCE_FORMATS: tuple[str, ...] = ("hdf5", "npy", "parquet")
TerminalsMode = Literal["auto", "infer", "file"]
METADATA_KEY = "imaginejax"
EXPORT_VERSION = 1
_SUFFIXES = {".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5", ".npy": "npy", ".parquet": "parquet",
             ".pq": "parquet"}


# ------------------------------------------------------------------------------------------- .npy files


def _plain_dtype(dtype: np.dtype) -> bool:
    """A bool / integer / float / complex / fixed-width string dtype (no fields, subarrays or metadata)."""
    return dtype.kind in "biufcUS" and dtype.names is None and dtype.subdtype is None and dtype.metadata is None


def load_npy(path: str | os.PathLike[str], *, trust_pickle: bool = False,
             max_decoded_bytes: int | None = None) -> Any:
    """Reads a ``.npy`` file without running code from it.

    A ``.npy`` of a bool / numeric / string dtype is read after checking that the file holds exactly
    shape × itemsize bytes after its header. An object ``.npy`` (what ``np.save(path, a_dict)`` writes) or
    a raw pickle stream saved under a ``.npy`` name is read by :func:`~imaginejax.data.safe_pickle.read_pickle`
    (arrays, strings and plain containers only); a 0-d object array is unwrapped (``.item()``). Structured,
    void, datetime and other dtypes are refused.

    Args:
      path: the file.
      trust_pickle: read any pickle with :mod:`pickle` — runs whatever code the file holds; only for files
        whose origin you trust.
      max_decoded_bytes: the most bytes the file may decode to (default: :mod:`imaginejax.data.budget`).

    Returns:
      The array, or the object a 0-d object array holds (typically a dict of arrays).

    Raises:
      DatasetError: naming the dict key (or the file) for a refused value or one that decodes past the
        budget, and the file for a malformed header, a refused dtype or a truncated payload.
    """
    return _load_npy(Path(path), trust_pickle, DecodeBudget(path, max_decoded_bytes))


def _load_npy(path: Path, trust_pickle: bool, budget: DecodeBudget) -> Any:
    field = path.name
    corrupt = "the file is corrupted or truncated; re-download or re-export it"
    with open(path, "rb") as f:
        head = f.read(6)
        f.seek(0)
        if head != b"\x93NUMPY":
            if head[:1] != b"\x80":
                raise DatasetError(field, "neither a .npy file (no \\x93NUMPY magic) nor a pickle stream",
                                   "pass a file written by np.save", path)
            value = pickle.load(f) if trust_pickle else read_pickle(f.read(), field=field, path=path,  # noqa: S301
                                                                    budget=budget)
        else:
            try:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            except Exception as err:
                raise DatasetError(field, f"malformed .npy header ({type(err).__name__}: {err})", corrupt,
                                   path) from err
            if dtype.hasobject and dtype != np.dtype(object):
                raise DatasetError(field, f"the header's dtype {dtype} mixes object fields with others (a "
                                   "structured dtype over pointers)", "store plain numeric arrays", path)
            if not dtype.hasobject:
                if not _plain_dtype(dtype):
                    raise DatasetError(field, f"the header's dtype {dtype} is not a bool / numeric / string dtype",
                                       "store plain numeric arrays (no structured, void or datetime dtypes)", path)
                count = int(np.prod(shape, dtype=object))
                left = os.fstat(f.fileno()).st_size - f.tell()
                if left != count * dtype.itemsize:
                    raise DatasetError(field, f"the header promises {count * dtype.itemsize} bytes of "
                                       f"{dtype}{list(shape)}, the file holds {left}", corrupt, path)
                budget.charge(left, field, f"{dtype}{list(shape)} decodes to {left} bytes")
                try:
                    array = np.fromfile(f, dtype=dtype, count=count)
                    return array.reshape(shape, order="F" if fortran else "C")
                except Exception as err:
                    raise DatasetError(field, f"unreadable array payload ({type(err).__name__}: {err})", corrupt,
                                       path) from err
            if trust_pickle:
                value = pickle.load(f)  # noqa: S301 — explicit opt-in
            else:
                value = read_pickle(f.read(), field=field, path=path, budget=budget)
            if isinstance(value, np.ndarray) and value.shape != tuple(shape):
                raise DatasetError(field, f"the pickled array has shape {value.shape}, the header says {shape}",
                                   corrupt, path)
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 0:
        return value.item()
    return value


# ----------------------------------------------------------------------------------------- file reading


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in REFERENCE_FORMATS:
            raise ValueError(f"format must be one of {REFERENCE_FORMATS}, got {fmt!r}")
        return fmt
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ValueError(f"cannot tell the format of {path.name} from its suffix; pass format= one of "
                         f"{REFERENCE_FORMATS}")
    return _SUFFIXES[suffix]


HDF5_SECONDS = (60.0, 1e-8)
"""Time limit of reading one HDF5 file in the child process: (base, seconds per byte) — 60 s + 10 s/GB."""
HDF5_READER = Path(importlib.util.find_spec("imaginejax.data.hdf5_reader").origin)
"""The script the child process runs (:mod:`imaginejax.data.hdf5_reader`)."""


def _hdf5_child(mode: str, path: Path, out_dir: Path, budget: DecodeBudget) -> dict[str, Any]:
    """Runs :mod:`imaginejax.data.hdf5_reader` on ``path`` in a child process (with what is left of
    ``budget``, charged with what it decoded); returns its result record.

    Raises:
      DatasetError: the child refused the file (its field) or found it decoding past ``budget``, or crashed
        or ran past the time limit (the file).
    """
    import subprocess
    import sys

    limit = HDF5_SECONDS[0] + HDF5_SECONDS[1] * path.stat().st_size
    corrupt = "the file is corrupted or malformed; re-download or re-export it"
    try:
        done = subprocess.run([sys.executable, "-I", str(HDF5_READER), mode, str(path), str(out_dir), str(budget.left)],
                              capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        raise DatasetError(path.name, f"the HDF5 library did not finish reading it within {limit:.0f} s (malformed "
                           "files can make it loop)", corrupt, path) from None
    result_file = out_dir / "result.json"
    if done.returncode != 0 or not result_file.is_file():
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        raise DatasetError(path.name, f"the HDF5 library crashed reading it ({how}; {done.stderr.strip()[-300:]})",
                           corrupt, path)
    result = json.loads(result_file.read_text())
    if "what" in result:
        budget.charge(result["decoded"], result["field"], result["what"])
    if "field" in result:
        raise DatasetError(result["field"], result["problem"], result["fix"], path)
    budget.charge(result.get("decoded", 0), path.name, "its datasets")
    return result


def check_hdf5_file(path: str | os.PathLike[str], *, max_decoded_bytes: int | None = None) -> None:
    """Refuses an HDF5 file with links or datasets that read outside it, with non-plain datasets, or whose
    datasets would decode to more than ``max_decoded_bytes`` in all (the rules of
    :mod:`imaginejax.data.hdf5_reader`), checked in a child process. Only variable-length strings are read.

    Raises:
      DatasetError: naming the object (or the file, when the HDF5 library cannot read it).
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="imaginejax-hdf5-") as tmp:
        _hdf5_child("check", Path(path), Path(tmp), DecodeBudget(path, max_decoded_bytes))


def _read_hdf5(path: Path, budget: DecodeBudget) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="imaginejax-hdf5-") as tmp:
        result = _hdf5_child("read", path, Path(tmp), budget)
        with np.load(Path(tmp) / "fields.npz", allow_pickle=False) as archive:
            out: dict[str, Any] = {name: archive[f"arr_{i}"] for i, name in enumerate(result["fields"])}
    if result["metadata"] is not None:
        out[METADATA_KEY] = result["metadata"]
    return out


def _arrow_to_numpy(column: Any, name: str, path: Path, budget: DecodeBudget) -> np.ndarray:
    """A (nested) list column of equal-length lists of numbers, bools or strings (plain or dictionary-encoded)
    → an (N, ...) array; strings are charged to ``budget`` at their decoded size before they are expanded."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    shape = [len(arr)]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            raise DatasetError(name, f"{arr.null_count} null entries", "fill every row", path)
        lengths = np.asarray(pc.list_value_length(arr).to_numpy(zero_copy_only=False))
        width = int(lengths[0]) if len(lengths) else 0
        if len(lengths) and (lengths != width).any():
            row = int(np.argmax(lengths != width))
            raise DatasetError(name, f"ragged nested lists (entry {row} has {int(lengths[row])} items, "
                               f"entry 0 has {width})", "pad every trajectory to the same length T", path)
        shape.append(width)
        arr = arr.flatten()
    if arr.null_count:
        raise DatasetError(name, f"{arr.null_count} null values", "fill every value", path)
    if pa.types.is_dictionary(arr.type) and (pa.types.is_string(arr.type.value_type)
                                             or pa.types.is_large_string(arr.type.value_type)):
        lengths = np.asarray(pc.binary_length(arr.dictionary).to_numpy(zero_copy_only=False), np.int64)
        nbytes = int(lengths[np.asarray(arr.indices.to_numpy(zero_copy_only=False))].sum()) + 4 * len(arr)
        budget.charge(nbytes, name, f"{len(arr)} strings drawn from a dictionary of {len(lengths)} would decode to "
                      f"{nbytes} bytes")
        arr = arr.dictionary_decode()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        width = int(pc.max(pc.utf8_length(arr)).as_py() or 0) if len(arr) else 0
        budget.charge(4 * width * len(arr), name, f"{len(arr)} strings of up to {width} characters would decode to "
                      f"{4 * width * len(arr)} bytes as an array")
        return np.asarray(arr.to_pylist(), dtype=f"U{max(width, 1)}").reshape(shape)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)):
        raise DatasetError(name, f"column of {column.type}: its values are not numbers, bools or strings",
                           "store numeric / string columns (lists of them for per-step fields)", path)
    return np.asarray(arr.to_numpy(zero_copy_only=False)).reshape(shape)


def _npy_bytes(data: bytes, name: str, path: Path) -> np.ndarray:
    """A ``.npy`` image of a bool / numeric / string array (never pickle) → the array."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f)
    if not _plain_dtype(dtype):
        raise DatasetError(name, f"an array of dtype {dtype} in the parquet metadata", "re-export the file", path)
    count = int(np.prod(shape, dtype=object))
    if len(data) - f.tell() != count * dtype.itemsize:
        raise DatasetError(name, f"the array in the parquet metadata holds {len(data) - f.tell()} bytes, its header "
                           f"says {count * dtype.itemsize}", "re-export the file", path)
    return np.frombuffer(data, dtype, count, f.tell()).reshape(shape, order="F" if fortran else "C").copy()


_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def _parquet_estimate(parquet: Any, name: str) -> int:
    """Bytes column ``name`` takes once read, from the footer: values × width (fixed-width), the pages'
    uncompressed size (strings; dictionary-encoded strings are read as dictionaries), 8 per value of
    offsets."""
    meta = parquet.metadata
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema == name or chunk.path_in_schema.startswith(f"{name}."):
                width = _WIDTHS.get(chunk.physical_type)
                if chunk.physical_type == "FIXED_LEN_BYTE_ARRAY":
                    width = parquet.schema.column(c).length
                values = max(chunk.num_values, 0)
                total += 8 * values + (values * width if width is not None else max(chunk.total_uncompressed_size, 0))
    return total


def _string_leaves(parquet: Any) -> list[str]:
    schema = parquet.schema
    return [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "BYTE_ARRAY"]


def _read_parquet(path: Path, budget: DecodeBudget) -> dict[str, Any]:
    """The columns the file's schema shows, one at a time, each charged to ``budget`` before it is read
    (footer sizes) and after (strings at their decoded size); from the schema metadata only the
    ``imaginejax`` record and the instruction table (``array:instruction_table``,
    ``array:instruction_embeddings``), never an array in place of or beside a column."""
    import pyarrow.parquet as pq

    corrupt = "the file is corrupted or truncated; re-download or re-export it"
    try:
        parquet = pq.ParquetFile(path)
        meta = parquet.metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.file_path:
                    raise DatasetError(chunk.path_in_schema, f"its data is stored in another file "
                                       f"({chunk.file_path!r}): reading it would read files outside this one",
                                       "store every column inside the file", path)
        names = parquet.schema_arrow.names
        metadata = parquet.schema_arrow.metadata or {}
        parquet = pq.ParquetFile(path, read_dictionary=_string_leaves(parquet))  # strings as dictionaries
    except DatasetError:
        raise
    except Exception as err:
        raise DatasetError(path.name, f"unreadable parquet file ({type(err).__name__}: {err})", corrupt,
                           path) from err
    out: dict[str, Any] = {}
    for raw_key, value in metadata.items():
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            raise DatasetError(path.name, f"a schema metadata key {raw_key[:40]!r}... is not UTF-8 text",
                               "re-export the file", path) from None
        if key == METADATA_KEY:
            if key in names:
                raise DatasetError(key, "is both a column and the schema metadata record; refused (pyarrow and "
                                   "pandas show the column, the record would replace it)",
                                   "rename the column", path)
            try:
                out[key] = value.decode("utf-8")
            except UnicodeDecodeError:
                kind = " (it looks like a pickle)" if value[:1] == b"\x80" else ""
                raise DatasetError(METADATA_KEY, f"the schema metadata record is not UTF-8 JSON text{kind}; "
                                   "refused", "re-export the file (the record is written as JSON)", path) from None
        elif key.startswith("array:"):
            field = key[len("array:"):]
            shown = field[:60] + ("..." if len(field) > 60 else "")
            if field in names:
                raise DatasetError(shown, f"the schema metadata key {key[:66]!r} holds an array in place of the column "
                                   f"{shown!r}; refused (pyarrow and pandas show the column, the metadata would "
                                   "replace it)", "store the data in the column only", path)
            if field not in _TABLE_FIELDS:
                raise DatasetError(shown, f"the schema metadata key {key[:66]!r} holds an array no column shows; only "
                                   f"{', '.join(_TABLE_FIELDS)} may come from metadata",
                                   "store the field as a column", path)
            budget.charge(len(value), field, f"an array of {len(value)} bytes in the schema metadata")
            try:
                out[field] = _npy_bytes(value, field, path)
            except DatasetError:
                raise
            except Exception as err:
                raise DatasetError(field, f"unreadable array in the parquet metadata ({type(err).__name__}: {err})",
                                   "re-export the file", path) from err
    for name in names:
        try:
            estimate = _parquet_estimate(parquet, name)
            budget.charge(estimate, name, f"the column would take {estimate} bytes once read (its footer sizes)")
            column = parquet.read(columns=[name]).column(0)
            out[name] = _arrow_to_numpy(column, name, path, budget)
        except DatasetError:
            raise
        except Exception as err:
            raise DatasetError(name, f"unreadable parquet column ({type(err).__name__}: {err})", corrupt,
                               path) from err
    return out


def _plain(value: Any, name: str, path: Path, budget: DecodeBudget) -> Any:
    """Turns a value of a (safely) unpickled dict into an array: lists / object arrays of equal-shape arrays
    are stacked, lists / object arrays of strings become str arrays; strings stay strings. Each stacked
    result is charged to the file's ``budget`` before it is built (entries shared by reference must not
    multiply into a huge array)."""
    if isinstance(value, (str, bytes)):
        return value.decode() if isinstance(value, bytes) else value
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.dtype == object):
        items = list(value.ravel()) if isinstance(value, np.ndarray) else list(value)
        outer = value.shape if isinstance(value, np.ndarray) else (len(items),)
        if items and all(isinstance(x, (str, np.str_)) for x in items):
            width = max(len(x) for x in items)
            budget.charge(4 * len(items) * width, name, f"{len(items)} strings of up to {width} characters would "
                          f"expand to {4 * len(items) * width} bytes as an array")
            return np.asarray(items, dtype=str).reshape(outer)
        if any(isinstance(x, (dict, str, bytes, type(None))) for x in items):
            raise DatasetError(name, "mixes strings, dicts or None with numbers / arrays",
                               "store a numeric (N, T, ...) array or an array of strings", path)
        try:
            arrays = [np.asarray(x) for x in items]
        except ValueError as err:  # ragged nested lists
            raise DatasetError(name, f"ragged nested lists ({err})",
                               "pad every trajectory to the same length T (masks mark the valid steps)", path) from None
        if any(a.dtype == object for a in arrays):
            raise DatasetError(name, "holds nested Python objects, not arrays or strings",
                               "store a numeric (N, T, ...) array or an array of strings", path)
        if arrays and any(a.shape != arrays[0].shape for a in arrays):
            shapes = sorted({a.shape for a in arrays})[:3]
            raise DatasetError(name, f"ragged entries (shapes {shapes} ...)",
                               "pad every trajectory to the same length T (masks mark the valid steps)", path)
        if not arrays:
            return np.zeros(outer)
        budget.charge(len(arrays) * arrays[0].nbytes, name, f"{len(arrays)} entries of {arrays[0].dtype}"
                      f"{list(arrays[0].shape)} would expand to {len(arrays) * arrays[0].nbytes} bytes stacked")
        return np.stack(arrays).reshape(outer + arrays[0].shape)
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (int, float, bool, np.generic)):
        return np.asarray(value)
    raise DatasetError(name, f"holds a {type(value).__name__}", "store arrays or strings", path)


def _read_npy(path: Path, trust_pickle: bool, budget: DecodeBudget) -> dict[str, Any]:
    value = _load_npy(path, trust_pickle, budget)
    if not isinstance(value, Mapping):
        raise DatasetError(path.name, f"holds a {type(value).__name__}, not a dict of arrays",
                           "pass a file written by np.save(path, {'observations': ..., ...})", path)
    cut = lambda key: key if len(key) <= 60 else f"{key[:60]}... ({len(key)} characters)"  # noqa: E731
    return {str(k): _plain(v, cut(str(k)), path, budget) for k, v in value.items()}


def read_reference_file(path: str | os.PathLike[str], *, format: str | None = None,
                        trust_pickle: bool = False, max_decoded_bytes: int | None = None) -> dict[str, Any]:
    """Reads a reference file into a dict of NumPy arrays (strings as ``str`` arrays), nothing converted.

    Args:
      path: an ``.h5`` / ``.hdf5``, ``.npy`` or ``.parquet`` file.
      format: ``"hdf5"``, ``"npy"`` or ``"parquet"``; default from the suffix.
      trust_pickle: see :func:`load_npy`.
      max_decoded_bytes: the most bytes the file may decode to, summed over its fields (default: half the
        available memory, or ``$IMAGINEJAX_MAX_DECODED_BYTES``; :mod:`imaginejax.data.budget`).

    Raises:
      DatasetError: naming the file or field, for unreadable, truncated or unsafe files, and files that
        would decode to more than ``max_decoded_bytes``.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no reference file at {path}")
    fmt = _format_of(path, format)
    budget = DecodeBudget(path, max_decoded_bytes)
    if fmt == "hdf5":
        return _read_hdf5(path, budget)
    if fmt == "parquet":
        return _read_parquet(path, budget)
    return _read_npy(path, trust_pickle, budget)


def _read_side_file(path: Path, trust_pickle: bool, max_decoded_bytes: int | None) -> dict[str, Any]:
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DatasetError(path.name, f"not valid JSON ({err})", "fix or re-export the side file", path) from err
        if not isinstance(data, dict):
            raise DatasetError(path.name, "the JSON side file is not an object", "write {\"instructions\": [...]}",
                               path)
        return {k: (np.asarray(v, dtype=str) if k == "instructions" else np.asarray(v)) for k, v in data.items()}
    return read_reference_file(path, trust_pickle=trust_pickle, max_decoded_bytes=max_decoded_bytes)


# -------------------------------------------------------------------------------------------- conversion


def _per_step(raw: Mapping[str, Any], name: str, n: int, t: int, path: Path) -> np.ndarray:
    """An (N, T) or (N, T, 1) field → (N, T)."""
    value = np.asarray(raw[name])
    if value.ndim == 3 and value.shape[2] == 1:
        value = value[..., 0]
    if value.shape != (n, t):
        raise DatasetError(name, f"shape {value.shape} but observations give (N, T) = ({n}, {t}); expected "
                           f"(N, T) or (N, T, 1)", "make every per-step field agree with observations", path)
    return value


def _flags(raw: Mapping[str, Any], name: str, n: int, t: int, path: Path) -> np.ndarray:
    value = _per_step(raw, name, n, t, path)
    if value.dtype.kind not in "biuf":
        raise DatasetError(name, f"dtype {value.dtype} is not numeric", "store 0/1 flags", path)
    bad = ~np.isin(value, (0, 1))
    if bad.any():
        i, s = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise DatasetError(name, f"{int(bad.sum())} values other than 0/1, first at trajectory {i} step {s} "
                           f"({value[i, s]!r})", "store 0/1 flags", path)
    return value.astype(bool)


def _check_finite(name: str, values: np.ndarray, valid: np.ndarray, path: Path) -> None:
    bad = ~np.isfinite(values)
    bad &= valid.reshape(valid.shape + (1,) * (values.ndim - valid.ndim))
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise DatasetError(name, f"{int(bad.sum())} non-finite values on valid steps, first at trajectory "
                           f"{first[0]} step {first[1]}",
                           "drop the offending trajectories (or cut them before the first non-finite step)",
                           path)


def _row_strings(raw: Mapping[str, Any], n: int, path: Path) -> list[str] | None:
    """Per-row instruction text: (N,), (N, 1), (N, k) (first phrasing) or (N, T) (first step)."""
    if "instructions" not in raw:
        return None
    value = raw["instructions"]
    value = np.asarray(value)
    if value.dtype.kind == "S":
        value = np.char.decode(value, "utf-8")
    if value.dtype.kind != "U" or value.ndim not in (1, 2) or value.shape[0] != n:
        raise DatasetError("instructions", f"{value.dtype}{list(value.shape)} is not N = {n} strings per row",
                           "store (N,) strings, or (N, k) phrasings (the first is used)", path)
    return [str(s) for s in (value if value.ndim == 1 else value[:, 0])]


def _discrete_actions(raw: Mapping[str, Any], n: int, t: int, num_actions: int | None, valid: np.ndarray,
                      path: Path) -> np.ndarray:
    actions = np.asarray(raw["actions"])
    if actions.ndim == 3 and num_actions is not None and actions.shape[2] == num_actions > 1:
        onehot = np.isin(actions, (0, 1)).all(axis=2) & (actions.sum(axis=2) == 1)
        if (onehot | ~valid).all():
            actions = np.argmax(actions, axis=2)
    if actions.ndim == 3 and actions.shape[2] == 1:
        actions = actions[..., 0]
    if actions.shape != (n, t):
        raise DatasetError("actions", f"shape {actions.shape} but a discrete environment needs (N, T) = ({n}, {t}) "
                           "indices, (N, T, 1) or one-hot (N, T, num_actions)",
                           "check the env name; store one action index per step", path)
    if actions.dtype.kind == "f":
        _check_finite("actions", actions, valid, path)
        fractional = (actions != np.round(actions)) & valid
        if fractional.any():
            i, s = np.unravel_index(int(np.argmax(fractional)), fractional.shape)
            raise DatasetError("actions", f"non-integer action {actions[i, s]} at trajectory {i} step {s} of a "
                               "discrete environment", "store integer action indices", path)
    elif actions.dtype.kind not in "biu":
        raise DatasetError("actions", f"dtype {actions.dtype} is not numeric", "store integer action indices", path)
    actions = np.where(valid, actions, 0)
    high = np.iinfo(np.int32).max if num_actions is None else num_actions
    bad = (actions < 0) | (actions >= high)
    if bad.any():
        i, s = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise DatasetError("actions", f"{int(bad.sum())} indices outside [0, {high}), first {actions[i, s]} at "
                           f"trajectory {i} step {s}", "check the env name and the action encoding", path)
    return actions.astype(np.int32)


def _continuous_actions(raw: Mapping[str, Any], n: int, t: int, action_dim: int | None, valid: np.ndarray,
                        path: Path) -> np.ndarray:
    actions = np.asarray(raw["actions"])
    if actions.ndim != 3 or actions.shape[:2] != (n, t) or (action_dim is not None and actions.shape[2] != action_dim):
        want = f"({n}, {t}, {action_dim if action_dim is not None else 'A'})"
        raise DatasetError("actions", f"shape {actions.shape} but a continuous environment needs {want}",
                           "check the env name; store one action vector per step", path)
    if actions.dtype.kind not in "biuf":
        raise DatasetError("actions", f"dtype {actions.dtype} is not numeric", "store float actions", path)
    _check_finite("actions", actions.astype(np.float64), valid, path)
    return np.where(valid[..., None], actions, 0).astype(np.float32)


def _goal_table(env: Any, params: Any, level: str) -> dict[str, np.ndarray]:
    """Instruction text → goal vector (ours) for every phrasing of the level."""
    table = env.instructions(level)
    ids = np.asarray(params.phrasing_ids)
    counts = np.asarray(params.phrasing_counts)
    goals = np.asarray(params.goals)
    return {table[int(ids[k, p])]: goals[k] for k in range(len(goals)) for p in range(int(counts[k]))}


def _infer_success(env: Any, states: np.ndarray, actions: np.ndarray, lengths: np.ndarray,
                   goals: np.ndarray) -> np.ndarray:
    """(N,) bool: the success predicate on each row's last valid step.

    Environments whose success depends on the whole episode (running sums, e.g. HalfCheetah) expose
    ``trajectory_success_and_reward(states (N, T+1, S), actions, goals) -> (success (N, T), reward)``;
    the others the transition predicate ``success(s_{L-1}, a_{L-1}, s_L, goal)``.
    """
    import jax.numpy as jnp

    rows = np.arange(len(lengths))
    last = lengths - 1
    if hasattr(env, "trajectory_success_and_reward"):
        success, _ = env.trajectory_success_and_reward(jnp.asarray(states), jnp.asarray(actions),
                                                       jnp.asarray(goals))
        return np.asarray(success, dtype=bool)[rows, last]
    held = env.success(jnp.asarray(states[rows, last]), jnp.asarray(actions[rows, last]),
                       jnp.asarray(states[rows, lengths]), jnp.asarray(goals))
    return np.asarray(held, dtype=bool).reshape(len(lengths))


def _embedding_table(raw: Mapping[str, Any], emb_rows: np.ndarray | None, texts: list[str] | None, n: int,
                     embed: bool, path: Path) -> tuple[np.ndarray, tuple[str, ...], np.ndarray, str]:
    """Builds (instruction_ids (N,), table strings, embeddings (M, E), how) for the rows."""
    if "instruction_ids" in raw and "instruction_table" in raw:
        ids = np.asarray(raw["instruction_ids"]).reshape(-1)
        table = np.asarray(raw["instruction_table"])
        if table.dtype.kind == "S":
            table = np.char.decode(table, "utf-8")
        if ids.shape != (n,) or ids.dtype.kind not in "iu" or table.ndim != 1 or table.dtype.kind != "U":
            raise DatasetError("instruction_ids", f"{ids.dtype}{list(ids.shape)} ids with a "
                               f"{table.dtype}{list(table.shape)} table", "store (N,) int ids and (M,) strings", path)
        m = len(table)
        if ((ids < 0) | (ids >= m)).any():
            raise DatasetError("instruction_ids", f"ids outside [0, {m})", "ids index instruction_table", path)
        if "instruction_embeddings" in raw:
            table_emb = np.asarray(raw["instruction_embeddings"])
            if table_emb.ndim != 2 or table_emb.shape[0] != m or table_emb.dtype.kind != "f":
                raise DatasetError("instruction_embeddings", f"{table_emb.dtype}{list(table_emb.shape)} but the "
                                   f"table has M = {m} strings", "store (M, E) floats", path)
            if emb_rows is not None and (emb_rows.shape[1] != table_emb.shape[1]
                                         or not np.array_equal(emb_rows, table_emb[ids].astype(emb_rows.dtype))):
                raise DatasetError("observations", "the embedding part of the observations differs from "
                                   "instruction_embeddings[instruction_ids]",
                                   "re-export the file; the two must agree", path)
            return ids.astype(np.int32), tuple(str(s) for s in table), table_emb.astype(np.float32), "table"
        if emb_rows is None or emb_rows.shape[1] == 0:
            return (ids.astype(np.int32), tuple(str(s) for s in table),
                    _encode(list(table)) if embed else np.zeros((m, 0), np.float32),
                    "encoder" if embed else "none")
        table_emb = np.zeros((m, emb_rows.shape[1]), np.float32)
        seen = np.zeros(m, bool)
        for i, j in enumerate(ids):
            if seen[j] and not np.array_equal(table_emb[j], emb_rows[i]):
                raise DatasetError("observations", f"rows with instruction id {j} carry different embeddings",
                                   "one embedding per instruction", path)
            table_emb[j], seen[j] = emb_rows[i], True
        if not seen.all():
            raise DatasetError("instruction_embeddings", f"{int((~seen).sum())} table entries have no embedding",
                               "store instruction_embeddings with the table", path)
        return ids.astype(np.int32), tuple(str(s) for s in table), table_emb, "observations"

    keys: dict[tuple[str, bytes], int] = {}
    strings: list[str] = []
    vectors: list[np.ndarray] = []
    ids = np.zeros(n, np.int32)
    width = 0 if emb_rows is None else emb_rows.shape[1]
    for i in range(n):
        vec = np.zeros(width, np.float32) if emb_rows is None else emb_rows[i].astype(np.float32)
        key = ("" if texts is None else texts[i], vec.tobytes())
        if key not in keys:
            keys[key] = len(strings)
            strings.append(texts[i] if texts is not None else f"<unlabelled instruction {len(strings)}>")
            vectors.append(vec)
        ids[i] = keys[key]
    table_emb = np.stack(vectors).astype(np.float32)
    how = "observations" if width else "none"
    if width == 0 and embed:
        if texts is None:
            raise DatasetError("instructions", "missing, and the observations carry no embedding",
                               "pass a side file with the instructions, or embed=False", path)
        table_emb, how = _encode(strings), "encoder"
    return ids, tuple(strings), table_emb, how


def _encode(texts: list[str]) -> np.ndarray:
    """(M,) strings → (M, 384) float32 with the project's sentence encoder."""
    from imaginejax.lang import encode_instructions

    return np.asarray(encode_instructions(texts), np.float32)


def import_reference(
    path: str | os.PathLike[str],
    env: str | None = None,
    level: str | None = None,
    source: Literal["real", "imaginary"] | None = None,
    *,
    side_file: str | os.PathLike[str] | None = None,
    format: str | None = None,
    trust_pickle: bool = False,
    terminals: TerminalsMode = "auto",
    goals: np.ndarray | None = None,
    embed: bool = False,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    max_decoded_bytes: int | None = None,
) -> TrajectoryDataset:
    """Reads a reference dataset file into a validated :class:`TrajectoryDataset` (module docstring).

    Args:
      path: the reference file (HDF5, parquet or ``.npy`` dict).
      env: registry name (``"clevr"``, ``"babyai"``, ...); default: the file's ``imaginejax`` record.
      level: ``train`` (the reference's ``real``), ``rephrase``, ``easy`` or ``hard``; default: the record.
      source: ``real`` or ``imaginary``; default: the record.
      side_file: a second file (``.npy`` / HDF5 / parquet / ``.json``) whose fields fill those missing from
        ``path`` (the reference keeps instructions and goals beside its HDF5 files).
      format: the container of ``path``; default from its suffix.
      trust_pickle: allow arbitrary pickles (see :func:`load_npy`).
      terminals: ``"auto"``, ``"infer"`` or ``"file"`` (module docstring).
      goals: (N, G) goal vectors in our environment's encoding, one per row of the file.
      embed: for files with bare-state observations, embed the instructions with the sentence encoder.
      out: also write the dataset there with :func:`save_dataset` (atomic; nothing is written on error).
      overwrite: passed to :func:`save_dataset`.
      max_decoded_bytes: the most bytes each file may decode to (see :func:`read_reference_file`).

    Returns:
      The dataset; ``provenance`` records the source file (path, SHA-256, format), the side file and every
      conversion choice (terminal source, dropped steps and rows, embedding source, goals source).

    Raises:
      DatasetError: naming the offending field of the file (or the file) and the fix.
      FileNotFoundError: ``path`` or ``side_file`` does not exist.
    """
    from imaginejax import envs as registry

    path = Path(path).expanduser().resolve()
    raw = read_reference_file(path, format=format, trust_pickle=trust_pickle, max_decoded_bytes=max_decoded_bytes)
    fmt = _format_of(path, format)
    provenance: dict[str, Any] = {"importer": "imaginejax.interop.reference", "source_file": str(path),
                                  "source_sha256": file_sha256(path), "source_format": fmt}
    if side_file is not None:
        side = Path(side_file).expanduser().resolve()
        if not side.is_file():
            raise FileNotFoundError(f"no side file at {side}")
        extra = _read_side_file(side, trust_pickle, max_decoded_bytes)
        provenance.update(side_file=str(side), side_file_sha256=file_sha256(side),
                          side_file_fields=sorted(k for k in extra if k not in raw))
        raw = {**extra, **raw}
    record: dict[str, Any] = {}
    if METADATA_KEY in raw:
        try:
            record = json.loads(str(raw[METADATA_KEY]))
        except (ValueError, RecursionError) as err:
            raise DatasetError(METADATA_KEY, f"not valid JSON ({type(err).__name__}: {err})", "re-export the file",
                               path) from None
        if not isinstance(record, dict):
            raise DatasetError(METADATA_KEY, "not a JSON object", "re-export the file", path)
    env = env if env is not None else record.get("env")
    level = level if level is not None else record.get("level")
    source = source if source is not None else record.get("source")
    if not isinstance(env, str) or env not in registry.registered():
        raise DatasetError("env", f"{env!r} is not a registered environment",
                           f"pass env= one of {', '.join(registry.registered())}", path)
    level = {"real": "train"}.get(level, level) if isinstance(level, str) else level
    if level not in LEVELS:
        raise DatasetError("level", f"{level!r} is not a level", f"pass level= one of {', '.join(LEVELS)} "
                           "(the reference's 'real' is 'train')", path)
    if source not in SOURCES:
        raise DatasetError("source", f"{source!r} is not a source", f"pass source= one of {', '.join(SOURCES)}",
                           path)
    if terminals not in ("auto", "infer", "file"):
        raise ValueError(f"terminals must be 'auto', 'infer' or 'file', got {terminals!r}")
    env_obj, params = registry.make(env, level, embed=False)
    s_dim = int(env_obj.state_dim)
    discrete = bool(env_obj.discrete)
    cap = int(params.max_steps)

    # ---- shapes, mask, finiteness (the file's field names in every error)
    for name in ("observations", "actions", "rewards", "masks"):
        if name not in raw:
            raise DatasetError(name, "missing from the file", "a reference dataset holds observations, actions, "
                               "rewards and masks", path)
    obs = np.asarray(raw["observations"])
    if obs.ndim != 3 or obs.dtype.kind not in "biuf":
        raise DatasetError("observations", f"{obs.dtype}{list(obs.shape)} but expected (N, T, D) floats",
                           "store trajectory-major padded arrays", path)
    n, t, d = obs.shape
    if n < 1 or t < 1:
        raise DatasetError("observations", f"shape {obs.shape} holds no steps", "the file holds no data", path)
    if d < s_dim:
        raise DatasetError("observations", f"width D = {d} is below the {env} state width S = {s_dim}",
                           "check env= (the observation is state ⊕ instruction embedding)", path)
    mask = _flags(raw, "masks", n, t, path)
    gap = mask[:, 1:] & ~mask[:, :-1]
    if gap.any():
        i, s = np.unravel_index(int(np.argmax(gap)), gap.shape)
        raise DatasetError("masks", f"not a prefix of valid steps: trajectory {i} has a valid step {s + 1} after "
                           f"an invalid step {s}", "left-align every trajectory and pad at the end", path)
    lengths = mask.sum(axis=1)
    if (lengths == 0).any():
        i = int(np.argmax(lengths == 0))
        raise DatasetError("masks", f"trajectory {i} has no valid step", "drop empty trajectories", path)
    _check_finite("observations", obs.astype(np.float64), mask, path)
    next_obs = None
    if "next_observations" in raw:
        next_obs = np.asarray(raw["next_observations"])
        if next_obs.shape != obs.shape or next_obs.dtype.kind not in "biuf":
            raise DatasetError("next_observations", f"{next_obs.dtype}{list(next_obs.shape)} but observations are "
                               f"{list(obs.shape)}", "store next_observations with the observations' shape", path)
        _check_finite("next_observations", next_obs.astype(np.float64), mask, path)
    rewards = _per_step(raw, "rewards", n, t, path)
    if rewards.dtype.kind not in "biuf":
        raise DatasetError("rewards", f"dtype {rewards.dtype} is not numeric", "store float rewards", path)
    _check_finite("rewards", rewards.astype(np.float64), mask, path)
    if discrete:
        actions = _discrete_actions(raw, n, t, getattr(env_obj, "num_actions", None), mask, path)
    else:
        actions = _continuous_actions(raw, n, t, getattr(env_obj, "action_dim", None), mask, path)

    # ---- states and the instruction-embedding split
    obs32 = obs.astype(np.float32)
    emb_all = obs32[:, :, s_dim:]
    emb_rows = emb_all[:, 0]
    changed = (emb_all != emb_rows[:, None]).any(axis=2) & mask
    if next_obs is not None:
        changed |= (next_obs.astype(np.float32)[:, :, s_dim:] != emb_rows[:, None]).any(axis=2) & mask
    if changed.any():
        i, s = np.unravel_index(int(np.argmax(changed)), changed.shape)
        raise DatasetError("observations", f"the instruction-embedding part (columns {s_dim}:{d}) changes within "
                           f"trajectory {i} at step {s}",
                           f"check env= (state width {s_dim}); one instruction per trajectory", path)
    steps = np.arange(t + 1)[None, :]
    states = np.zeros((n, t + 1, s_dim), np.float32)
    states[:, :t] = np.where(mask[..., None], obs32[:, :, :s_dim], 0.0)
    rows = np.arange(n)
    if next_obs is not None:
        nxt = next_obs.astype(np.float32)[:, :, :s_dim]
        inner = mask[:, 1:]
        mismatch = (nxt[:, :-1] != obs32[:, 1:, :s_dim]).any(axis=2) & inner
        if mismatch.any():
            i, s = np.unravel_index(int(np.argmax(mismatch)), mismatch.shape)
            raise DatasetError("next_observations", f"next_observations[{i}, {s}] differs from observations[{i}, "
                               f"{s + 1}] (the state part)", "the two must describe the same state", path)
        states[rows, lengths] = nxt[rows, lengths - 1]
        new_lengths = lengths
        provenance["last_step"] = "next_observations"
    else:
        new_lengths = lengths - 1
        provenance["last_step"] = "dropped (no next_observations: the state after it is unknown)"
    keep = new_lengths >= 1
    if not keep.any():
        raise DatasetError("next_observations", "missing, and every trajectory has a single step, so no "
                           "transition is complete", "export next_observations with the data", path)
    provenance["dropped_single_step_rows"] = int((~keep).sum())
    new_mask = np.arange(t)[None, :] < new_lengths[:, None]
    state_valid = steps <= new_lengths[:, None]
    states = np.where(state_valid[..., None], states, 0.0).astype(np.float32)

    # ---- instructions and goals
    texts = _row_strings(raw, n, path)
    ids, table, table_emb, how = _embedding_table(raw, emb_rows if d > s_dim else None, texts, n, embed, path)
    provenance["embeddings"] = how
    goal_source = "none"
    goal_dim = int(getattr(env_obj, "goal_dim", np.asarray(params.goals).shape[1]))
    goal_array: np.ndarray | None = None
    if goals is not None:
        goal_array = np.asarray(goals)
        if goal_array.shape != (n, goal_dim):
            raise DatasetError("goals", f"the goals= argument has shape {goal_array.shape}, expected (N, G) = "
                               f"({n}, {goal_dim})", f"pass one {env} goal vector per row of the file", path)
        goal_source = "argument"
    elif "goals" in raw:
        file_goals = np.asarray(raw["goals"])
        if file_goals.ndim == 3:
            file_goals = file_goals[:, 0]
        if file_goals.ndim == 2 and file_goals.shape[0] == n and file_goals.shape[1] == goal_dim \
                and file_goals.dtype.kind in "biuf":
            goal_array, goal_source = file_goals, "file"
        else:
            provenance["file_goals_ignored"] = (f"{file_goals.dtype}{list(file_goals.shape)}: not {env}'s "
                                                f"(N, {goal_dim}) goal encoding")
    if goal_array is None and texts is not None:
        lookup = _goal_table(env_obj, params, level)
        if all(text in lookup for text in texts):
            goal_array, goal_source = np.stack([lookup[text] for text in texts]), "instructions"
    if goal_array is not None:
        if goal_array.dtype.kind == "f":
            _check_finite("goals", goal_array, np.ones(n, bool), path)
        integral = goal_array.dtype.kind in "biu"
        goal_array = goal_array.astype(np.int32 if integral else np.float32)
    provenance["goals"] = goal_source

    # ---- episode ends
    last_row = np.zeros((n, t), bool)
    last_row[rows, lengths - 1] = True
    file_terms = None
    if "terminals" in raw:
        file_terms = _flags(raw, "terminals", n, t, path)
        misaligned = np.zeros(n, bool)
        inside = lengths < t
        misaligned[inside] = file_terms[rows[inside], lengths[inside]] & ~file_terms[rows[inside], lengths[inside] - 1]
        file_terms = file_terms & mask
        file_terms[rows[misaligned], lengths[misaligned] - 1] = True
        provenance["terminals_realigned"] = int(misaligned.sum())
    file_truncs = None
    for name in ("timeouts", "truncations"):
        if name in raw:
            file_truncs = _flags(raw, name, n, t, path) & mask
            break
    mode = terminals
    if mode == "auto":
        defect = file_terms is not None and file_truncs is None and bool(file_terms[last_row].all())
        mode = "file" if file_terms is not None and not defect else "infer"
        if defect:
            provenance["file_terminals_ignored"] = "every trajectory end is flagged (time limits included)"
    if mode == "file":
        if file_terms is None:
            raise DatasetError("terminals", "missing from the file", "use terminals='infer' or 'auto'", path)
        early = file_terms & ~last_row
        if early.any():
            i, s = np.unravel_index(int(np.argmax(early)), early.shape)
            raise DatasetError("terminals", f"set before the last valid step: trajectory {i} step {s} (its last "
                               f"valid step is {int(lengths[i]) - 1})",
                               "mask the steps after an episode's end, or use terminals='infer'", path)
        ended = file_terms[rows, lengths - 1]
        provenance["terminals"] = "file"
    elif goal_array is not None and goal_array.shape[1] == goal_dim and next_obs is not None:
        ended = _infer_success(env_obj, states, actions, lengths, goal_array)
        provenance["terminals"] = "success predicate"
    else:
        ended = lengths < cap
        provenance["terminals"] = f"step cap (row ended before {cap} steps)"
    if file_terms is not None:
        provenance["terminals_disagreeing_with_file"] = int((ended != file_terms[rows, lengths - 1]).sum())
    if next_obs is None:
        ended = np.zeros(n, bool)  # the kept last step is not where the episode ended
    new_last = np.zeros((n, t), bool)
    new_last[rows[keep], new_lengths[keep] - 1] = True
    term = new_last & ended[:, None]
    trunc = new_last & ~ended[:, None]

    if goal_array is None:
        goal_array = np.zeros((n, 0), np.int32)
    ds = TrajectoryDataset(
        states=states[keep],
        actions=(np.where(new_mask[..., None], actions, 0) if actions.ndim == 3
                 else np.where(new_mask, actions, 0)).astype(actions.dtype)[keep],
        rewards=np.where(new_mask, rewards, 0).astype(np.float32)[keep],
        mask=new_mask[keep],
        terminals=term[keep],
        truncations=trunc[keep],
        instruction_ids=ids[keep],
        goals=goal_array[keep],
        instructions=table,
        instruction_embeddings=table_emb,
        env=env, level=level, source=source, discrete=discrete,
        provenance={**provenance, **({"original_provenance": record["provenance"]}
                                     if isinstance(record.get("provenance"), dict) else {})},
    )
    try:
        validate_for_env(ds, EnvFacts.of(env_obj))
    except DatasetError as err:
        raise DatasetError(err.field, err.problem, err.fix, path) from err
    if out is not None:
        from imaginejax.data.io import save_dataset

        save_dataset(ds, out, overwrite=overwrite)
    return ds


# -------------------------------------------------------------------------------------------- exporting


def reference_arrays(ds: TrajectoryDataset, *, next_observations: bool = True) -> dict[str, Any]:
    """Our dataset in the reference layout: a dict of plain NumPy arrays (padding zeros).

    Returns:
      ``observations`` (N, T, S+E) float32 (state ⊕ the row's instruction embedding), ``next_observations``
      (same, optional), ``actions`` (N, T) int32 or (N, T, A) float32, ``rewards`` / ``masks`` /
      ``terminals`` / ``timeouts`` (N, T, 1) float32 (true terminations and truncations apart),
      ``instructions`` (N,) str, ``instruction_ids`` (N,) int32, ``instruction_table`` (M,) str,
      ``instruction_embeddings`` (M, E) float32, ``goals`` (N, G), and ``imaginejax`` (a JSON string:
      env, level, source, discrete, state width, provenance).
    """
    dims = validate_dataset(ds)
    mask = ds.mask
    emb = ds.instruction_embeddings[ds.instruction_ids]  # (N, E)
    emb_steps = np.broadcast_to(emb[:, None, :], (dims.N, dims.T, dims.E))

    def observe(states: np.ndarray) -> np.ndarray:
        return np.where(mask[..., None], np.concatenate([states, emb_steps], axis=2), 0.0).astype(np.float32)

    flag = lambda x: x.astype(np.float32)[..., None]  # noqa: E731
    out: dict[str, Any] = {"observations": observe(ds.states[:, :-1])}
    if next_observations:
        out["next_observations"] = observe(ds.states[:, 1:])
    actions = ds.actions
    out["actions"] = np.where(mask if actions.ndim == 2 else mask[..., None], actions, 0).astype(actions.dtype)
    out["rewards"] = flag(np.where(mask, ds.rewards, 0.0))
    out["masks"] = flag(mask)
    out["terminals"] = flag(ds.terminals)
    out["timeouts"] = flag(ds.truncations)
    out["instructions"] = np.asarray([ds.instructions[i] for i in ds.instruction_ids], dtype=str).reshape(dims.N)
    out["instruction_ids"] = ds.instruction_ids.astype(np.int32)
    out["instruction_table"] = np.asarray(ds.instructions, dtype=str).reshape(dims.M)
    out["instruction_embeddings"] = ds.instruction_embeddings.astype(np.float32)
    out["goals"] = ds.goals
    out[METADATA_KEY] = json.dumps({"format_version": EXPORT_VERSION, "env": ds.env, "level": ds.level,
                                    "source": ds.source, "discrete": bool(ds.discrete), "state_dim": dims.S,
                                    "embed_dim": dims.E, "provenance": ds.provenance}, allow_nan=False)
    return out


def _write_hdf5(arrays: Mapping[str, Any], file: Path) -> None:
    import h5py

    with h5py.File(file, "w") as f:
        for key, value in arrays.items():
            if key == METADATA_KEY:
                f.attrs[key] = value
            elif value.dtype.kind == "U":
                f.create_dataset(key, data=value.astype(object), dtype=h5py.string_dtype("utf-8"))
            else:
                f.create_dataset(key, data=value)


_TABLE_FIELDS = ("instruction_table", "instruction_embeddings")


def _write_parquet(arrays: Mapping[str, Any], file: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def column(value: np.ndarray) -> pa.Array:
        if value.dtype.kind == "U":
            flat: pa.Array = pa.array(value.reshape(-1).tolist(), type=pa.string())
        else:
            flat = pa.array(value.reshape(-1))
        for width in reversed(value.shape[1:]):
            flat = pa.FixedSizeListArray.from_arrays(flat, width)
        return flat

    columns = {k: column(v) for k, v in arrays.items() if k != METADATA_KEY and k not in _TABLE_FIELDS}
    meta: dict[bytes, bytes] = {METADATA_KEY.encode(): str(arrays[METADATA_KEY]).encode()}
    for key in _TABLE_FIELDS:
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(arrays[key]), allow_pickle=False)
        meta[f"array:{key}".encode()] = buffer.getvalue()
    table = pa.table(columns).replace_schema_metadata(meta)
    pq.write_table(table, file)


def export_reference(ds: TrajectoryDataset, path: str | os.PathLike[str], *, format: str | None = None,
                     next_observations: bool = True, overwrite: bool = False) -> Path:
    """Writes ``ds`` as a reference-layout file (:func:`reference_arrays`), atomically.

    Args:
      ds: a valid dataset.
      path: the file to write; its suffix gives the format unless ``format`` is passed.
      format: ``"hdf5"``, ``"npy"`` (``np.save`` of a dict of plain arrays and strings — what the
        reference scripts load with ``np.load(path, allow_pickle=True).item()``) or ``"parquet"``
        (one row per trajectory; the instruction table in the file's metadata).
      next_observations: include them (needed to read the last transition of each row back).
      overwrite: replace an existing file.

    Returns:
      The absolute path written. On any error nothing is left at ``path`` (an existing file is untouched).
    """
    target = Path(path).expanduser().resolve()
    fmt = _format_of(target, format)
    arrays = reference_arrays(ds, next_observations=next_observations)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass overwrite=True to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as staged:
        if fmt == "hdf5":
            _write_hdf5(arrays, staged)
        elif fmt == "parquet":
            _write_parquet(arrays, staged)
        else:
            with open(staged, "xb") as f:
                np.save(f, dict(arrays), allow_pickle=True)
    return target
