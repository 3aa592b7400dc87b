"""A pickle reader that cannot be steered by the file: NumPy arrays, strings and plain containers only.

:func:`read_pickle` never calls :mod:`pickle`. It walks the stream's opcodes (:func:`pickletools.genops`)
on its own stack and builds each value itself. Accepted: protocols 2–5; ``None``, bools, ints, floats,
str, bytes; dicts (``collections.OrderedDict`` read as a dict), lists, tuples; NumPy arrays and scalars of
a bool, integer, float, complex or fixed-width string (``U`` / ``S``) dtype, rebuilt from their raw bytes
(``np.frombuffer``, the byte count checked against shape × itemsize first); object arrays only as
containers of accepted values, rebuilt element by element (never from raw bytes: an object dtype over
file bytes is a pointer forged by the file).

The globals a NumPy pickle names are recognised, not imported: ``numpy.ndarray``, ``numpy.dtype``,
``numpy[._]core.multiarray._reconstruct`` / ``scalar``, ``numpy[._]core.numeric._frombuffer``,
``_codecs.encode`` and ``bytes()`` (protocol 2 spells bytes with them; latin-1 only, no arguments) and
``collections.OrderedDict``. A
dtype's pickled state is read, never applied: structured, subarray, void, datetime and metadata-carrying
dtypes are refused. Any other global, opcode (``INST``, ``OBJ``, ``NEWOBJ``, extension registry,
persistent ids, out-of-band buffers, sets) or a malformed stream raises :class:`DatasetError` naming the
dict key under which it sits (or the file), and nothing of the file's choosing runs.

Memory and time stay linear in what the file decodes to: every array built from the stream, every value
used again by reference (memo) — counted once per use, as it would be stacked — and every number inside a
container are charged to the file's :class:`~imaginejax.data.budget.DecodeBudget` before they are built,
and a value's key path is put together only when an error names it.
"""

from __future__ import annotations

import io
import itertools
import math
import pickletools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from imaginejax.data.budget import DecodeBudget
from imaginejax.data.errors import DatasetError

__all__ = ["read_pickle"]

_MULTIARRAY = ("numpy._core.multiarray", "numpy.core.multiarray")
_NUMERIC = ("numpy._core.numeric", "numpy.core.numeric")
_DESCR = re.compile(r"[<>|=]?(b1|[iu][1248]|f[248]|c(8|16)|[US]\d{1,9}|O[48])")
_MAX_DEPTH = 100
_MAX_RANK = 32
_FIX_REEXPORT = ("re-export it as HDF5 / parquet, or as np.save of a dict of numeric / string arrays "
                 "(pass trust_pickle=True only if you trust the file's origin: that runs arbitrary code)")
_FIX_CORRUPT = "the file is corrupted or truncated; re-download or re-export it"


class _Global:
    """A recognised global, by name (never the object itself)."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Refused:
    """A value the reader refuses; raised (with the key it sits under) when the result is assembled."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _DType:
    """``numpy.dtype(descr, ...)`` awaiting its pickled state."""

    def __init__(self, descr: str) -> None:
        self.descr = descr
        self.value: np.dtype | None = None


class _Array:
    """``_reconstruct(ndarray, ...)`` awaiting its pickled state; ``value`` once built."""

    def __init__(self) -> None:
        self.value: Any = None


class _ObjectArray:
    """An object array: its shape and the stream's list whose first ``math.prod(shape)`` elements it holds
    (never copied: the stream may only append to a list later), assembled at the end."""

    def __init__(self, shape: tuple[int, ...], items: list[Any]) -> None:
        self.shape = shape
        self.items = items
        self.count = math.prod(shape)


Charge = Callable[[int, str], None]
"""``charge(nbytes, what)``: adds bytes about to be built to the file's budget (raises past its limit)."""


class _Unsupported(ValueError):
    """A well-formed stream that uses something this reader refuses (an opcode, a protocol, a key type)."""


def _dtype(descr: str, state: Any) -> np.dtype | _Refused:
    """The dtype of ``numpy.dtype(descr)`` with pickled ``state``
    ``(3, byteorder, subarray, names, fields, elsize, alignment, flags)`` (version 4 adds metadata)."""
    if not isinstance(descr, str) or not _DESCR.fullmatch(descr):
        return _Refused(f"the dtype {_cut(descr)!r} is not a bool / integer / float / complex / string dtype")
    if not isinstance(state, tuple) or len(state) not in (8, 9) or state[0] not in (3, 4):
        return _Refused(f"a dtype {descr!r} with an unknown pickled state")
    byteorder, subarray, names, fields, elsize = state[1:6]
    metadata = state[8] if len(state) == 9 else None
    if subarray is not None or names is not None or fields is not None or metadata is not None:
        return _Refused(f"a structured / subarray / metadata-carrying dtype built on {descr!r} (its fields could "
                        "overlay object pointers on file bytes)")
    if byteorder not in ("<", ">", "|", "="):
        return _Refused(f"a dtype {descr!r} with byte order {byteorder!r}")
    base = np.dtype(descr)
    if base.kind in "US":
        width = 4 if base.kind == "U" else 1
        if not isinstance(elsize, int) or elsize < 0 or elsize % width or elsize // width > 10**9:
            return _Refused(f"a string dtype {descr!r} with item size {elsize!r}")
        base = np.dtype(f"{base.kind}{elsize // width}")
    elif elsize not in (-1, base.itemsize):
        return _Refused(f"a dtype {descr!r} with item size {elsize!r}")
    if base.itemsize > 1 and byteorder in "<>":
        base = base.newbyteorder(byteorder)
    return base


def _shape(value: Any) -> tuple[int, ...] | None:
    if (isinstance(value, tuple) and len(value) <= _MAX_RANK
            and all(type(d) is int and 0 <= d < 2**62 for d in value)):
        return value
    return None


def _cut(text: Any, width: int = 60) -> Any:
    """``text`` cut to ``width`` characters (names chosen by the file can be megabytes long)."""
    if isinstance(text, (str, bytes)) and len(text) > width:
        return text[:width] + (b"..." if isinstance(text, bytes) else "...")
    return text


def _from_bytes(raw: Any, dtype: Any, shape: Any, fortran: Any, charge: Charge) -> Any:
    """A numeric / string array from raw bytes, or an object array from a list of elements."""
    if isinstance(dtype, _Refused):
        return dtype
    shape = _shape(shape)
    if not isinstance(dtype, np.dtype) or shape is None or not isinstance(fortran, bool):
        return _Refused("an array whose shape, dtype or order is malformed")
    count = math.prod(shape)
    if dtype.kind == "O":
        if not isinstance(raw, list) or len(raw) != count:
            return _Refused("an object array whose elements are not a list of the shape's size (object arrays "
                            "are read only element by element, never from raw bytes)")
        if fortran and len(shape) > 1:
            return _Refused("a Fortran-ordered object array")
        return _ObjectArray(shape, raw)
    if isinstance(raw, bytearray):
        raw = bytes(raw)
    if not isinstance(raw, bytes) or len(raw) != count * dtype.itemsize:
        got = f"{len(raw)} bytes" if isinstance(raw, bytes) else type(raw).__name__
        return _Refused(f"an array of shape {shape} and dtype {dtype} with {got} of data "
                        f"(expected {count * dtype.itemsize})")
    charge(len(raw), f"an array {dtype}{list(shape)} built from the stream would decode to {len(raw)} bytes")
    array = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy(order="K")
    if dtype.kind == "b":
        array = array.view(np.uint8).astype(np.bool_)  # any non-zero byte is True (keeps 0-d arrays)
    elif dtype.kind == "U" and count:
        codes = np.frombuffer(raw, dtype=np.dtype(np.uint32).newbyteorder(dtype.byteorder))
        if (codes >= 0x110000).any():
            return _Refused("a string array with characters outside Unicode")
    return array


def _reduce(func: Any, args: Any, charge: Charge) -> Any:
    """The value of ``func(*args)`` for the recognised globals (never a call of the file's choosing)."""
    for part in (func, *(args if isinstance(args, tuple) else ())):
        if isinstance(part, _Refused):
            return part
    if not isinstance(func, _Global) or not isinstance(args, tuple):
        return _Refused("a call of something other than a recognised NumPy constructor")
    name = func.name
    if name == "numpy.dtype" and len(args) == 3 and isinstance(args[0], str):
        return _DType(args[0])
    if name == "_reconstruct" and len(args) == 3 and isinstance(args[0], _Global) and args[0].name == "numpy.ndarray":
        return _Array()
    if name == "_frombuffer" and len(args) == 4 and args[3] in ("C", "F"):
        dtype = args[1].value if isinstance(args[1], _DType) else args[1]
        if isinstance(dtype, np.dtype) and dtype.kind == "O":
            return _Refused("an object array from a raw buffer")
        return _from_bytes(args[0], dtype, args[2], args[3] == "F", charge)
    if name == "scalar" and len(args) == 2 and isinstance(args[0], _DType):
        dtype = args[0].value
        if isinstance(dtype, _Refused):
            return dtype
        if not isinstance(dtype, np.dtype) or dtype.kind == "O":
            return _Refused("a NumPy scalar of an object or malformed dtype")
        array = _from_bytes(args[1], dtype, (), False, charge)
        return array if isinstance(array, _Refused) else array[()]
    if name == "_codecs.encode" and len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        return args[0].encode("latin-1")
    if name == "bytes" and args == ():
        return b""
    if name == "collections.OrderedDict" and args == ():
        return {}
    return _Refused(f"a call of {name} with unexpected arguments")


def _build(obj: Any, state: Any, charge: Charge) -> Any:
    """``obj.__setstate__(state)`` for a pending dtype or array: the value it becomes."""
    for part in (obj, state):
        if isinstance(part, _Refused):
            return part
    if isinstance(obj, _DType) and obj.value is None:
        obj.value = _dtype(obj.descr, state)
        return obj
    if isinstance(obj, _Array) and obj.value is None:
        if isinstance(state, tuple) and len(state) == 5 and state[0] == 1:
            state = state[1:]
        if not isinstance(state, tuple) or len(state) != 4 or not isinstance(state[1], _DType):
            obj.value = _Refused("an array with a malformed pickled state")
        else:
            shape, dtype, fortran, raw = state
            obj.value = _from_bytes(raw, dtype.value, shape, fortran, charge)
        return obj
    return _Refused("a __setstate__ of something other than a NumPy array or dtype")


_GLOBALS = {
    **{(m, "_reconstruct"): "_reconstruct" for m in _MULTIARRAY},
    **{(m, "scalar"): "scalar" for m in _MULTIARRAY},
    **{(m, "_frombuffer"): "_frombuffer" for m in _NUMERIC},
    ("numpy", "ndarray"): "numpy.ndarray",
    ("numpy", "dtype"): "numpy.dtype",
    ("_codecs", "encode"): "_codecs.encode",
    ("collections", "OrderedDict"): "collections.OrderedDict",
    ("__builtin__", "bytes"): "bytes",  # protocol 2 spells b"" as bytes()
    ("builtins", "bytes"): "bytes",
}


def _global(module: Any, name: Any) -> _Global | _Refused:
    key = (module, name)
    if key in _GLOBALS:
        return _Global(_GLOBALS[key])
    return _Refused(f"the pickle stream imports the global {_cut(module)}.{_cut(name)}, which is not a NumPy array "
                    "reconstructor or a plain container; refused without importing it (loading it could run "
                    "arbitrary code)")


def _interpret(data: bytes, charge: Charge) -> Any:
    """Runs the opcodes of one pickle in ``data`` on a private stack; returns the top value (unassembled).
    Every array built is charged first (``charge``).

    Raises:
      ValueError: a malformed stream or an opcode outside the accepted set (message without the field).
    """
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: dict[int, Any] = {}

    def pop_mark() -> list[Any]:
        nonlocal stack
        items = stack
        stack = metastack.pop()
        return items

    first = True
    for op, arg, pos in pickletools.genops(io.BytesIO(data)):
        name = op.name
        if first:
            if name != "PROTO" or not 2 <= arg <= 5:
                raise _Unsupported(f"pickle protocol {arg if name == 'PROTO' else '0 or 1'} (only 2-5 are read)")
            first = False
            continue
        if name == "FRAME":
            continue
        if name == "STOP":
            if len(stack) != 1 or metastack:
                raise ValueError("the stream ends with an unbalanced stack")
            return stack[0]
        if name in ("NONE", "NEWTRUE", "NEWFALSE"):
            stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
        elif name in ("BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINFLOAT", "SHORT_BINUNICODE",
                      "BINUNICODE", "BINUNICODE8", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"):
            stack.append(arg)
        elif name == "BYTEARRAY8":
            stack.append(bytearray(arg))
        elif name == "MARK":
            metastack.append(stack)
            stack = []
        elif name == "POP":
            stack.pop()
        elif name == "POP_MARK":
            pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name == "TUPLE":
            items = pop_mark()  # first: it replaces ``stack``
            stack.append(tuple(items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n:
                raise ValueError(f"{name} on a stack of {len(stack)}")
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name in ("APPEND", "APPENDS"):
            items = [stack.pop()] if name == "APPEND" else pop_mark()
            target = stack[-1]
            if not isinstance(target, list):
                raise ValueError(f"{name} to a {type(target).__name__}")
            target.extend(items)
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name in ("SETITEM", "SETITEMS"):
            if name == "SETITEM":
                items = stack[-2:]
                del stack[-2:]
            else:
                items = pop_mark()
            target = stack[-1]
            if not isinstance(target, dict) or len(items) % 2:
                raise ValueError(f"{name} to a {type(target).__name__} with {len(items)} items")
            for k in range(0, len(items), 2):
                key = items[k]
                if type(key) not in (str, int):
                    raise _Unsupported(f"a dict key of type {type(key).__name__} (only str / int keys are read)")
                target[key] = items[k + 1]
        elif name == "GLOBAL":
            module, _, attr = arg.partition(" ")
            stack.append(_global(module, attr))
        elif name == "STACK_GLOBAL":
            attr, module = stack.pop(), stack.pop()
            if not isinstance(module, str) or not isinstance(attr, str):
                raise ValueError("STACK_GLOBAL of non-strings")
            stack.append(_global(module, attr))
        elif name == "REDUCE":
            args = stack.pop()
            stack[-1] = _reduce(stack[-1], args, charge)
        elif name == "BUILD":
            state = stack.pop()
            stack[-1] = _build(stack[-1], state, charge)
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            memo[len(memo) if name == "MEMOIZE" else int(arg)] = stack[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            stack.append(memo[int(arg)])
        else:
            raise _Unsupported(f"opcode {name} at byte {pos} (not used by NumPy arrays, strings or plain "
                               "containers)")
    raise ValueError("the stream ends without STOP")


Path_ = tuple[Any, Any, bool] | None
"""Where a value sits, built only when an error names it: ``(parent, dict key or list index, is_index)``."""


def _render(where: Path_) -> str:
    """``("outer/inner", [2])`` path as text: dict keys joined by ``/``, list positions as ``[i]``."""
    parts: list[tuple[str, bool]] = []
    while where is not None:
        where, key, index = where
        text = str(key) if not isinstance(key, int) or key.bit_length() <= 64 else f"<{key.bit_length()}-bit int>"
        parts.append((str(_cut(text)), index))
    out = ""
    for text, index in reversed(parts):
        out += f"[{text}]" if index else (f"/{text}" if out else text)
    return out


def _leaf_size(value: Any) -> int:
    """Bytes a leaf decodes to when stacked: arrays their buffer, strings 4 per character (``U``)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return int(value.nbytes)
    if isinstance(value, str):
        return 4 * len(value)
    return len(value)


class _Assembler:
    """Turns interpreted values into plain ones: pending arrays resolved, object arrays filled, refused
    values raised with the dict key (or list index) under which they sit; shared values assembled once,
    cycles and nesting deeper than 100 refused.

    Each container, before it is built, charges the budget with what is new in it: 8 bytes per number and
    the whole size of every child used again by reference (a value the stream repeats decodes, once
    stacked, to one copy per use), and an object array its pointers. Every list is walked once, also when
    object arrays share it (running sums give each one's size), so time is linear in the stream."""

    def __init__(self, file_field: str, path: Path | None, budget: DecodeBudget) -> None:
        self.file_field = file_field
        self.path = path
        self.budget = budget
        self.done: dict[int, tuple[Any, int]] = {}  # id -> (assembled value, decoded bytes)
        self.open: set[int] = set()
        self.keep: list[Any] = []  # keeps assembled inputs alive so their ids stay unique
        self.shared: dict[int, tuple[list[Any], list[int], list[int]]] = {}  # id(list) -> (values, sizes, new)

    def fail(self, where: Path_, problem: str, fix: str = _FIX_REEXPORT) -> DatasetError:
        return DatasetError(_render(where) or self.file_field, problem, fix, self.path)

    def __call__(self, value: Any, where: Path_ = None, depth: int = 0) -> tuple[Any, int, bool]:
        """(assembled value, bytes it decodes to, whether it was seen before)."""
        if value is None or type(value) in (bool, int, float):
            return value, 8, True
        if isinstance(value, _Refused):
            raise self.fail(where, value.reason)
        if isinstance(value, _Array):
            if value.value is None:
                raise self.fail(where, "an array whose pickled state never came")
            return self(value.value, where, depth)
        if isinstance(value, (_Global, _DType)):
            raise self.fail(where, "a bare NumPy type or dtype where data belongs")
        key = id(value)
        if key in self.done:
            out, size = self.done[key]
            return out, size, True
        if type(value) in (str, bytes, bytearray) or isinstance(value, (np.ndarray, np.generic)):
            out = bytes(value) if isinstance(value, bytearray) else value
            self.keep.append(value)
            self.done[key] = (out, _leaf_size(value))
            return out, _leaf_size(value), False
        if depth > _MAX_DEPTH:
            raise self.fail(where, f"values nested deeper than {_MAX_DEPTH} levels")
        if key in self.open:
            raise self.fail(where, "a container that contains itself")
        self.open.add(key)
        self.keep.append(value)
        if isinstance(value, dict):
            parts = [(k, self(v, (where, k, False), depth + 1)) for k, v in value.items()]
            children = [part for _, part in parts]
        elif isinstance(value, (list, tuple)):
            children = [self(v, (where, i, True), depth + 1) for i, v in enumerate(value)]
        elif isinstance(value, _ObjectArray):
            out = self.object_array(value, where, depth)
            self.open.discard(key)
            return out, self.done[key][1], False
        else:
            raise self.fail(where, f"a {type(value).__name__}")
        size = sum(child[1] for child in children)
        new = sum(child[1] for child in children if child[2])
        if new:
            repeated = sum(1 for child in children if child[2] and type(child[0]) not in (bool, int, float)
                           and child[0] is not None)
            what = f"would expand to {size} bytes" + (f" ({repeated} entries repeated by reference)" if repeated else "")
            self.budget.charge(new, _render(where) or self.file_field, what)
        if isinstance(value, dict):
            out: Any = {k: part[0] for k, part in parts}
        else:
            out = type(value)(child[0] for child in children)
        self.open.discard(key)
        self.done[key] = (out, size)
        return out, size, False

    def object_array(self, value: _ObjectArray, where: Path_, depth: int) -> np.ndarray:
        """The object array of the first ``value.count`` elements of its list (walked once per list)."""
        if id(value.items) not in self.shared:
            self.keep.append(value.items)
            self.shared[id(value.items)] = ([], [0], [0])
        values, sizes, new = self.shared[id(value.items)]
        for i in range(len(values), value.count):
            item, size, seen = self(value.items[i], (where, i, True) if value.shape else where, depth + 1)
            values.append(item)
            sizes.append(sizes[-1] + size)
            new.append(new[-1] + (size if seen else 0))
        count = value.count
        self.budget.charge(new[count] + 8 * count, _render(where) or self.file_field,
                           f"an object array of {count} elements would expand to {sizes[count]} bytes")
        out = np.fromiter(itertools.islice(values, count), dtype=object, count=count).reshape(value.shape)
        self.done[id(value)] = (out, sizes[count])
        return out


def read_pickle(data: bytes, *, field: str, path: str | Path | None = None,
                budget: DecodeBudget | None = None) -> Any:
    """Reads one pickle (protocols 2–5) of NumPy arrays, strings and plain containers (module docstring).

    Args:
      data: the stream (bytes after it are ignored, as by :mod:`pickle`).
      field: names the stream in errors not tied to one dict key (usually the file's name).
      path: the file, for the error.
      budget: the file's decode budget (default: a new one, :func:`~imaginejax.data.budget.decoded_limit`).

    Returns:
      The value: dicts, lists, tuples, str, bytes, numbers, None, NumPy arrays and scalars.

    Raises:
      DatasetError: naming the dict key (``"outer/inner"``, list positions as ``[i]``) or ``field``, for
        anything refused or decoding past the budget, and ``field`` for a malformed or truncated stream.
    """
    path = None if path is None else Path(path)
    budget = DecodeBudget(path) if budget is None else budget
    try:
        value = _interpret(data, lambda nbytes, what: budget.charge(nbytes, field, what))
    except DatasetError:
        raise
    except _Unsupported as err:
        raise DatasetError(field, f"refused pickle stream: {err}", _FIX_REEXPORT, path) from None
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError, EOFError) as err:
        raise DatasetError(field, f"unreadable pickle stream ({type(err).__name__}: {err})", _FIX_CORRUPT,
                           path) from None
    try:
        return _Assembler(field, path, budget)(value)[0]
    except DatasetError:
        raise
    except (ValueError, TypeError, MemoryError) as err:
        raise DatasetError(field, f"unreadable pickle stream ({type(err).__name__}: {err})", _FIX_CORRUPT,
                           path) from None
