"""The memory budget of reading one untrusted file: what it decodes to is counted before it is built.

Every reader of an untrusted file (pickled ``.npy``, HDF5, parquet, a dataset directory's ``.npz``, a
Minari dataset) charges one :class:`DecodeBudget` per file with the bytes it is about to build — declared
shape × item size, the real lengths of variable-length contents (strings), and a value a pickle repeats by
reference once per use — and stops with a :class:`DatasetError` naming the file, the field and the sizes
once the sum passes the limit. A small file that decodes to gigabytes is refused before a library
allocates them.

The limit: the reader's ``max_decoded_bytes=`` argument, else ``$IMAGINEJAX_MAX_DECODED_BYTES`` (bytes),
else half of the memory available now (``MemAvailable``, bounded by the process's ``RLIMIT_AS`` and a
cgroup v2 limit), and never below 256 MiB.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from imaginejax.data.errors import DatasetError

__all__ = ["ENV_VAR", "DecodeBudget", "available_memory", "decoded_limit"]

ENV_VAR = "IMAGINEJAX_MAX_DECODED_BYTES"
FLOOR = 256 << 20


def _read_int(file: str) -> int | None:
    try:
        text = Path(file).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _mem_available() -> int:
    """The host's MemAvailable (psutil, else /proc/meminfo, else the free pages)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def available_memory() -> int:
    """Bytes this process can still allocate: the least of MemAvailable, the address-space limit left and
    the cgroup's limit left."""
    free = _mem_available()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            pages = int(Path("/proc/self/statm").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pages = 0
        free = min(free, soft - pages * os.sysconf("SC_PAGE_SIZE"))
    high, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if high is not None and used is not None:
        free = min(free, high - used)
    return max(free, 0)


def decoded_limit(max_decoded_bytes: int | None = None) -> int:
    """The limit in bytes: the argument, else ``$IMAGINEJAX_MAX_DECODED_BYTES``, else half the available
    memory (at least 256 MiB)."""
    if max_decoded_bytes is None:
        text = os.environ.get(ENV_VAR, "").strip()
        if not text:
            return max(FLOOR, available_memory() // 2)
        try:
            max_decoded_bytes = int(float(text))
        except ValueError:
            raise ValueError(f"${ENV_VAR}={text!r} is not a number of bytes; set it to e.g. 8e9 or unset it") from None
    if isinstance(max_decoded_bytes, bool) or not isinstance(max_decoded_bytes, int) or max_decoded_bytes <= 0:
        raise ValueError(f"max_decoded_bytes must be a positive number of bytes, got {max_decoded_bytes!r}")
    return max_decoded_bytes


class DecodeBudget:
    """The bytes decoded so far from one file, against a limit (module docstring)."""

    def __init__(self, path: str | Path | None, max_decoded_bytes: int | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.limit = decoded_limit(max_decoded_bytes)
        self.used = 0

    @property
    def left(self) -> int:
        return max(self.limit - self.used, 0)

    def charge(self, nbytes: int, field: str, what: str) -> None:
        """Adds ``nbytes`` about to be built for ``field``; ``what`` says what they are (``"[1000, 4096]
        float64 would decode to 32768000 bytes"``).

        Raises:
          DatasetError: the file's total passes the limit (nothing of ``nbytes`` is built yet).
        """
        self.used += int(nbytes)
        if self.used > self.limit:
            source = "file"
            if self.path is not None and self.path.is_file():
                source = f"{self.path.stat().st_size}-byte file"
            elif self.path is not None and self.path.is_dir():
                source = "dataset"
            raise DatasetError(field, f"{what}: {self.used} bytes decoded from this {source} in all, above the "
                               f"limit of {self.limit} bytes",
                               f"if the file is legitimate, raise the limit (${ENV_VAR}, or max_decoded_bytes=) on "
                               "a machine with that much memory; otherwise it is a decompression bomb: store the "
                               "data itself", self.path)
