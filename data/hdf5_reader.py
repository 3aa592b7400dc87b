"""Reads an untrusted HDF5 file in a child process (run as a script; imports only NumPy and h5py).

The HDF5 library is not robust against malformed files: a few flipped bytes can make it loop forever or
crash. :func:`imaginejax.interop.reference.read_hdf5` therefore runs this script with a time limit and
takes back only plain arrays. Usage::

    python hdf5_reader.py read|check FILE OUT_DIR

``read`` writes ``OUT_DIR/fields.npz`` (every top-level dataset as ``arr_<i>``; strings as ``U`` arrays;
never pickle) and ``OUT_DIR/result.json`` (``{"fields": [names], "metadata": <the "imaginejax"
attribute or null>}``, or
``{"field", "problem", "fix"}`` for a refused or unreadable file); ``check`` walks every link and dataset
of the file and writes only ``result.json``.

Refused, naming the object: soft, external and user-defined links; datasets with external raw storage
or virtual (both read other files); compound, object, reference, opaque, array and variable-length
non-string dtypes; datasets that would decode to more than 1032 × the file's size (deflate's limit;
only unwritten chunks and a fill value get there).
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


def decoded_limit(path: Path) -> int:
    """Bytes one dataset of ``path`` may decode to."""
    return max(256 << 20, 1032 * path.stat().st_size)


def check_link(name: str, link: Any) -> None:
    import h5py

    if link is None:
        raise Refused(name, "its link cannot be read", _FIX_CORRUPT)
    if not isinstance(link, h5py.HardLink):
        raise Refused(name, f"is a {type(link).__name__} to another object or file; refused", _FIX_INSIDE)


def check_dataset(name: str, item: Any, limit: int) -> None:
    """Refuses a dataset that reads outside its file, is not a plain array, or decodes beyond ``limit``."""
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
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > limit:
        raise Refused(name, f"{list(shape)} {dtype} would decode to {nbytes} bytes, more than the file's contents "
                      "can hold", "store the data itself, not a shape to fill")


def check_file(path: Path) -> None:
    """Every link and dataset of the file (nothing is read)."""
    import h5py

    limit = decoded_limit(path)
    links: list[tuple[str, Any]] = []
    with h5py.File(path, "r") as f:
        f.visititems_links(lambda name, link: links.append((name, link)))  # h5py swallows raises in callbacks
        for name, link in links:
            check_link(name, link)
            item = f[name]
            if isinstance(item, h5py.Dataset):
                check_dataset(name, item, limit)


def read_file(path: Path) -> tuple[dict[str, np.ndarray], str | None]:
    """Top-level datasets (hard links only) as arrays, and the ``imaginejax`` attribute."""
    import h5py

    out: dict[str, np.ndarray] = {}
    limit = decoded_limit(path)
    with h5py.File(path, "r") as f:
        for key in f.keys():
            check_link(key, f.get(key, getlink=True))
            item = f[key]
            if not isinstance(item, h5py.Dataset):
                continue
            check_dataset(key, item, limit)
            try:
                if h5py.check_string_dtype(item.dtype) is not None:
                    out[key] = np.asarray(item.asstr()[()], dtype=str)
                else:
                    out[key] = np.asarray(item[()])
            except Exception as err:
                raise Refused(key, f"unreadable HDF5 dataset ({type(err).__name__}: {err})", _FIX_CORRUPT) from err
        meta = f.attrs[METADATA_KEY] if METADATA_KEY in f.attrs else None
        if isinstance(meta, bytes):
            meta = meta.decode("utf-8")
        if meta is not None and not isinstance(meta, str):
            raise Refused(METADATA_KEY, f"the file attribute is a {type(meta).__name__}, not JSON text",
                          "re-export the file")
    return out, meta


def main(mode: str, file: str, out_dir: str) -> None:
    path, out = Path(file), Path(out_dir)
    try:
        if mode == "check":
            check_file(path)
            result: dict[str, Any] = {"metadata": None}
        else:
            arrays, meta = read_file(path)
            with open(out / "fields.npz", "wb") as f:
                np.savez(f, *arrays.values(), allow_pickle=False)  # arr_0, arr_1, ... (any dataset name)
            result = {"metadata": meta, "fields": list(arrays)}
    except Refused as err:
        result = {"field": err.field, "problem": err.problem, "fix": err.fix}
    except Exception as err:  # OSError for truncated / not-HDF5 files, decode errors, ...
        result = {"field": path.name, "problem": f"unreadable HDF5 file ({type(err).__name__}: {err})",
                  "fix": _FIX_CORRUPT}
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
