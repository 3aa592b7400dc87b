"""Reads an untrusted HDF5 file in a child process (run as a script; imports only NumPy and h5py).

The HDF5 library is not robust against malformed files: a few flipped bytes can make it loop forever or
crash. :func:`imaginejax.interop.reference.read_hdf5` therefore runs this script with a time limit and
takes back only plain arrays. Usage::

    python hdf5_reader.py read|check FILE OUT_DIR MAX_BYTES

``read`` writes ``OUT_DIR/fields.npz`` (every top-level dataset as ``arr_<i>``; strings as ``U`` arrays;
never pickle) and ``OUT_DIR/result.json`` (``{"fields": [names], "metadata": <the "imaginejax"
attribute or null>, "decoded": bytes}``, or ``{"field", "problem", "fix"}`` for a refused or unreadable
file, or ``{"field", "what", "decoded"}`` past ``MAX_BYTES``, the caller's decode budget left); ``check``
walks every link and dataset of the file and writes only ``result.json``.

Refused, naming the object: soft, external and user-defined links; datasets with external raw storage
or virtual (both read other files); compound, object, reference, opaque, array and variable-length
non-string dtypes; an ``imaginejax`` attribute that is not one string. Every dataset's decoded size —
shape × item size, and for variable-length strings their real lengths, read in slices small enough that
a slice fits even if each string were as long as the file — is summed over the file before it is built;
refused past ``MAX_BYTES`` or past 1032 × the file's size (deflate's limit: only unwritten chunks
filled with a fill value, or many strings sharing one, get there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

METADATA_KEY = "imaginejax"
_FIX_INSIDE = "store every field as a plain numeric or string dataset inside the file"
_FIX_CORRUPT = "the file is corrupted or truncated; re-download or re-export it"


class Refused(Exception):
    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(field, problem, fix)
        self.field, self.problem, self.fix = field, problem, fix


class OverBudget(Exception):
    """The file decodes past the caller's budget; the caller words the error (its budget's message)."""

    def __init__(self, field: str, what: str, decoded: int) -> None:
        super().__init__(field, what, decoded)
        self.field, self.what, self.decoded = field, what, decoded


class Tally:
    """Bytes the file's datasets decode to, summed, against the caller's budget and deflate's ratio."""

    def __init__(self, path: Path, budget: int) -> None:
        self.size = path.stat().st_size
        self.ratio_limit = max(256 << 20, 1032 * self.size)
        self.budget = budget
        self.used = 0

    def left(self) -> int:
        return max(min(self.ratio_limit, self.budget) - self.used, 0)

    def add(self, name: str, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.ratio_limit:
            raise Refused(name, f"{what}: {self.used} bytes from this {self.size}-byte file in all, more than its "
                          "contents can hold (deflate's limit is 1032 x the file)",
                          "store the data itself, not a shape or a shared string to fill")
        if self.used > self.budget:
            raise OverBudget(name, what, self.used)


def check_link(name: str, link: Any) -> None:
    import h5py

    if link is None:
        raise Refused(name, "its link cannot be read", _FIX_CORRUPT)
    if not isinstance(link, h5py.HardLink):
        raise Refused(name, f"is a {type(link).__name__} to another object or file; refused", _FIX_INSIDE)


def check_dataset(name: str, item: Any, tally: Tally) -> list[Any] | None:
    """Refuses a dataset that reads outside its file or is not a plain array; adds its decoded size to
    ``tally``. Returns the blocks of a variable-length string dataset (read to measure them), else None."""
    import h5py

    if item.external:
        files = sorted({str(entry[0]) for entry in item.external})[:3]
        raise Refused(name, f"its raw data is stored in other files ({', '.join(files)}): reading it would read "
                      "files outside this one", _FIX_INSIDE)
    if item.is_virtual:
        raise Refused(name, "is a virtual dataset mapping other files: reading it would read files outside this "
                      "one", _FIX_INSIDE)
    dtype = item.dtype
    if h5py.check_string_dtype(dtype) is not None:
        if dtype.kind not in "OS":
            raise Refused(name, f"a string dtype {dtype} of an unknown layout", _FIX_INSIDE)
    elif dtype.kind not in "biuf" or dtype.names is not None or dtype.subdtype is not None:
        kind = ("compound" if dtype.names is not None else
                "variable-length" if h5py.check_vlen_dtype(dtype) is not None else
                "reference" if h5py.check_ref_dtype(dtype) is not None else
                "array" if dtype.subdtype is not None else f"{dtype}")
        raise Refused(name, f"has a {kind} dtype, not a bool / numeric / string one", _FIX_INSIDE)
    shape = item.shape or ()
    count = int(np.prod(shape, dtype=object))
    if dtype.kind != "O":
        tally.add(name, count * dtype.itemsize, f"{list(shape)} {dtype} would decode to {count * dtype.itemsize} bytes")
        return None
    return vlen_strings(name, item, tally)


def vlen_strings(name: str, item: Any, tally: Tally) -> list[Any]:
    """The variable-length strings of ``item`` as blocks of bytes objects, each block's real size added to
    ``tally`` as it is read: a block holds as many rows as fit in the budget left if every string were as
    long as the file (a string, or the fill value many share, is stored once in the file)."""
    shape = item.shape
    if shape is None:  # an empty dataspace
        return []
    if shape == ():
        blocks = [np.asarray([item[()]], dtype=object)]
    else:
        row = int(np.prod(shape[1:], dtype=object))
        step = max(1, tally.left() // max(1, row * tally.size))
        blocks = []
        for start in range(0, shape[0], step):
            block = np.asarray(item[start: start + step], dtype=object)
            nbytes = 8 * block.size + sum(len(b) for b in block.flat)
            tally.add(name, nbytes, f"{list(shape)} variable-length strings would decode to at least {tally.used + nbytes} "
                      "bytes (their real lengths, read so far)")
            blocks.append(block)
        return blocks
    tally.add(name, len(blocks[0][0]), f"a variable-length string of {len(blocks[0][0])} bytes")
    return blocks


def check_file(path: Path, budget: int) -> None:
    """Every link and dataset of the file (only variable-length strings are read, to measure them)."""
    import h5py

    tally = Tally(path, budget)
    links: list[tuple[str, Any]] = []
    with h5py.File(path, "r") as f:
        f.visititems_links(lambda name, link: links.append((name, link)))  # h5py swallows raises in callbacks
        for name, link in links:
            check_link(name, link)
            item = f[name]
            if isinstance(item, h5py.Dataset):
                check_dataset(name, item, tally)
        check_metadata(f)


def check_metadata(f: Any) -> None:
    """Refuses an ``imaginejax`` attribute that is not one string before it is read (an array attribute of
    strings sharing one stored value decodes to its length × their count)."""
    import h5py

    if METADATA_KEY in f.attrs:
        attr = f.attrs.get_id(METADATA_KEY)
        if attr.shape != () or h5py.check_string_dtype(attr.dtype) is None:
            raise Refused(METADATA_KEY, f"the file attribute is {attr.dtype}{list(attr.shape or ())}, not one JSON "
                          "string", "re-export the file")


def strings(name: str, item: Any, blocks: list[Any] | None, tally: Tally) -> np.ndarray:
    """A string dataset as a ``U`` array, its size (4 bytes per character of the longest) added first."""
    shape = item.shape or ()
    if blocks is None:  # fixed-length
        flat = np.asarray(item[()]).reshape(-1)
    else:
        flat = np.concatenate([b.reshape(-1) for b in blocks]) if blocks else np.zeros(0, object)
    encoding = "ascii" if (item.dtype.metadata or {}).get("h5py_encoding") == "ascii" else "utf-8"
    texts = [bytes(b).decode(encoding) for b in flat]
    width = max((len(t) for t in texts), default=0)
    tally.add(name, 4 * width * len(texts), f"{len(texts)} strings of up to {width} characters would decode to "
              f"{4 * width * len(texts)} bytes as an array")
    return np.asarray(texts, dtype=f"U{max(width, 1)}").reshape(shape)


def read_file(path: Path, budget: int) -> tuple[dict[str, np.ndarray], str | None, int]:
    """Top-level datasets (hard links only) as arrays, the ``imaginejax`` attribute, and the bytes decoded."""
    import h5py

    out: dict[str, np.ndarray] = {}
    tally = Tally(path, budget)
    with h5py.File(path, "r") as f:
        check_metadata(f)
        for key in f.keys():
            check_link(key, f.get(key, getlink=True))
            item = f[key]
            if not isinstance(item, h5py.Dataset):
                continue
            try:
                blocks = check_dataset(key, item, tally)
                if h5py.check_string_dtype(item.dtype) is not None:
                    out[key] = strings(key, item, blocks, tally)
                else:
                    out[key] = np.asarray(item[()])
            except (Refused, OverBudget):
                raise
            except Exception as err:
                raise Refused(key, f"unreadable HDF5 dataset ({type(err).__name__}: {err})", _FIX_CORRUPT) from err
        meta = f.attrs[METADATA_KEY] if METADATA_KEY in f.attrs else None
        if isinstance(meta, bytes):
            meta = meta.decode("utf-8")
        if meta is not None and not isinstance(meta, str):
            raise Refused(METADATA_KEY, f"the file attribute is a {type(meta).__name__}, not JSON text",
                          "re-export the file")
    return out, meta, tally.used


def main(mode: str, file: str, out_dir: str, budget: str) -> None:
    path, out = Path(file), Path(out_dir)
    try:
        if mode == "check":
            check_file(path, int(budget))
            result: dict[str, Any] = {"metadata": None}
        else:
            arrays, meta, decoded = read_file(path, int(budget))
            with open(out / "fields.npz", "wb") as f:
                np.savez(f, *arrays.values(), allow_pickle=False)  # arr_0, arr_1, ... (any dataset name)
            result = {"metadata": meta, "fields": list(arrays), "decoded": decoded}
    except Refused as err:
        result = {"field": err.field, "problem": err.problem, "fix": err.fix}
    except OverBudget as err:
        result = {"field": err.field, "what": err.what, "decoded": err.decoded}
    except Exception as err:  # OSError for truncated / not-HDF5 files, decode errors, ...
        result = {"field": path.name, "problem": f"unreadable HDF5 file ({type(err).__name__}: {err})",
                  "fix": _FIX_CORRUPT}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:5])
