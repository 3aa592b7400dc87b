"""Atomic writes: a reader of a path sees its old content or its new content, never a part.

Every writer puts its bytes into a hidden sibling (``.<stem>.tmp-<random><suffix>``, same directory,
so the same file system), flushes them to disk, then moves the sibling onto the target in one rename;
any exception removes the sibling. A hard crash (power loss, SIGKILL) can leave a sibling behind:
:func:`is_temp` names such files so readers skip them and caches can delete them.

* :func:`write_bytes`, :func:`write_text`, :func:`write_json` — a whole file from memory;
* :func:`atomic_path` — a context manager yielding the sibling's path, for writers that want a path
  (``savefig``, ``np.savez``, ``safetensors.numpy.save_file``); the suffix is kept so such writers
  infer the right format;
* :func:`staged_dir` — the same for a directory: written into a sibling directory, then moved onto the
  target with ``renameat2(RENAME_NOREPLACE)`` (new target) or ``renameat2(RENAME_EXCHANGE)`` (replacing
  one), so readers see the old directory or the new one; without ``renameat2`` the old directory is
  renamed aside, the new one renamed in, the old one deleted (restored if the second rename fails).

Logs grow by appending instead: :func:`append_text` opens with ``O_NOFOLLOW`` and writes only to a regular
file of one link, so a symbolic or hard link planted in a workspace cannot make a log write elsewhere.

And :func:`file_sha256`, the digest by which manifests and provenance name a file's content;
:func:`read_json` and :func:`fields_of`, by which a record this package wrote (``workspace.json``,
``sweep.json``, ...) that was truncated or edited names itself and the way to recover.

Standard library only: every layer may import it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

TEMP_MARK = ".tmp-"

# renameat2(2) flags (linux/fs.h) and the "relative to the working directory" descriptor.
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file's bytes, read in 1 MiB blocks (memory bounded for any size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def temp_sibling(path: str | os.PathLike[str]) -> Path:
    """A fresh hidden name beside ``path`` that keeps its suffix: ``dir/.<stem>.tmp-<hex><suffix>``."""
    path = Path(path)
    return path.with_name(f".{path.stem}{TEMP_MARK}{uuid.uuid4().hex}{path.suffix}")


def is_temp(path: str | os.PathLike[str]) -> bool:
    """True for a sibling of :func:`temp_sibling` (a write in progress, or left by a crash)."""
    name = Path(path).name
    return name.startswith(".") and TEMP_MARK in name


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Makes renames and creations inside ``directory`` durable (POSIX; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yields a temporary sibling of ``path`` to write; on a clean exit it is fsynced and renamed onto
    ``path``, on an exception removed (``path`` untouched). The parent directory must exist."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """``path`` holds exactly ``data`` (atomically)."""
    with atomic_path(path) as tmp:
        with open(tmp, "xb") as f:
            f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``path`` holds ``text`` in UTF-8 (atomically)."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], value: Any, indent: int | None = 1) -> Path:
    """``path`` holds ``json.dumps(value, indent=indent)`` and a newline (atomically)."""
    return write_text(path, json.dumps(value, indent=indent) + "\n")


# The fix for a damaged record of a training workspace (sweep.json, task_success.json, sources.json).
RETRAIN = ("re-run the imaginejax train / bench command that trained it: it rewrites this file and resumes from "
           "the checkpoints")


def field_problem(path: str | os.PathLike[str], field: str, value: Any, problem: str, fix: str) -> str:
    """``"<path>: field <field> is <value>: <problem>; <fix>"``, a long value shown by both ends (a path
    keeps its file name)."""
    shown = repr(value)
    shown = shown[:40] + "…" + shown[-40:] if len(shown) > 81 else shown
    return f"{path}: field {field} is {shown}: {problem}; {fix}"


class DamagedFile(ValueError):
    """A record this package wrote does not parse or lacks a field it writes (truncated, edited)."""


def read_json(path: str | os.PathLike[str], fix: str) -> dict[str, Any]:
    """The JSON object in ``path``.

    Raises:
      DamagedFile: ``path`` is not UTF-8 JSON or holds no object; the message names it and ``fix``.
    """
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise DamagedFile(f"{path} is damaged ({type(error).__name__}: {error}): {fix}") from None
    if not isinstance(value, dict):
        raise DamagedFile(f"{path} is damaged (a JSON {type(value).__name__}, not an object): {fix}")
    return value


@contextlib.contextmanager
def fields_of(path: str | os.PathLike[str], fix: str) -> Iterator[None]:
    """Turns a missing field or a value of the wrong kind, met while reading ``path``'s record inside the
    block (KeyError, TypeError, IndexError, AttributeError, ValueError), into :class:`DamagedFile` naming
    ``path`` and ``fix``; keep the block to the reading of that record."""
    try:
        yield
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as error:
        raise DamagedFile(f"{path} is damaged ({type(error).__name__}: {error}): it lacks a field this package "
                          f"writes; {fix}") from None


class UnsafeFileError(ValueError):
    """A path this package appends to is not a plain file of its own (a link, a device, a directory)."""


def append_text(path: str | os.PathLike[str], text: str, *, fsync: bool = False) -> None:
    """Appends ``text`` (UTF-8) to ``path``, created if missing (mode 0644 before the umask), never through a
    link: the last component must not be a symbolic link (``O_NOFOLLOW``) and the file must be a regular
    file with one hard link. ``fsync``: flushed to disk before returning.

    Raises:
      UnsafeFileError: ``path`` is a symbolic link, a hard link, or not a regular file (named, with the fix).
    """
    path = Path(path)
    fix = f"remove it (rm {path}) and run again: a new log starts there"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NONBLOCK", 0)  # a FIFO planted there must not block the open
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        if path.is_symlink():
            raise UnsafeFileError(f"{path} is a symbolic link (to {os.readlink(path)}): a log is never written "
                                  f"through a link; {fix}") from None
        if path.exists() and not path.is_file():
            raise UnsafeFileError(f"{path} is not a regular file: a log is appended only to a plain file of its "
                                  f"own; {fix}") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            what = "not a regular file" if not stat.S_ISREG(info.st_mode) else f"a hard link ({info.st_nlink} names)"
            raise UnsafeFileError(f"{path} is {what}: a log is appended only to a plain file of its own; {fix}")
        os.set_blocking(fd, True)
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux ``renameat2``; True on success, False when unsupported here, OSError on other failures."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2: Callable[..., int] = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def _commit_dir(staged: Path, target: Path, overwrite: bool) -> None:
    """Moves the fully written ``staged`` directory onto ``target`` (module docstring)."""
    appeared = FileExistsError(f"{target} appeared while it was being written; pass overwrite=True to replace it")
    if not os.path.lexists(target):
        if not _renameat2(staged, target, _RENAME_NOREPLACE):
            if os.path.lexists(target):
                raise appeared
            os.rename(staged, target)
    elif not overwrite:
        raise appeared
    elif _renameat2(staged, target, _RENAME_EXCHANGE):
        shutil.rmtree(staged, ignore_errors=True)  # ``staged`` now holds the previous directory
    else:
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex}")
        os.rename(target, old)
        try:
            os.rename(staged, target)
        except BaseException:
            os.rename(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)


@contextlib.contextmanager
def staged_dir(target: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yields an empty hidden sibling directory of ``target``; on a clean exit it is fsynced and moved
    onto ``target`` (replacing a directory there only with ``overwrite``), on an exception removed.
    Files written inside must be fsynced by their writer.

    Raises:
      FileExistsError: ``target`` exists (or appeared meanwhile) and ``overwrite`` is False.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}{TEMP_MARK}{uuid.uuid4().hex}")
    staged.mkdir()
    try:
        yield staged
        fsync_dir(staged)
        _commit_dir(staged, target, overwrite)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
