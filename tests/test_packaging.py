"""The packaging configuration (pyproject.toml): an SPDX license and a build backend that reads it, and
package data that names every data file of the packages, so that a wheel installs them all and the build
prints no warning about our configuration."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
# What the code loads from the installed package: the trained imaginer, the cheetah expert's actor, the
# presets and the CLEVR scene.
ASSETS = {"imaginejax.imaginer": ["assets/*.safetensors", "assets/*.json"],
          "imaginejax.envs.cheetah": ["assets/*.npz"], "imaginejax.presets": ["*.toml"],
          "imaginejax.envs.clevr": ["*.xml"]}


def source_dir(package: str) -> Path:
    """The folder a package installs from: its longest prefix in ``package-dir``, then the rest of its name."""
    mapping = SETUPTOOLS["package-dir"]
    prefix = max((p for p in mapping if package == p or package.startswith(p + ".")), key=len)
    rest = package[len(prefix):].lstrip(".")
    return ROOT / mapping[prefix] / Path(*rest.split(".")) if rest else ROOT / mapping[prefix]


def tracked_files(folder: Path) -> list[PurePosixPath]:
    """The files git tracks under ``folder``, relative to it (untracked scratch files are not the package's)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout")
    out = subprocess.run(["git", "ls-files", "-z", "--", str(folder)], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [PurePosixPath(f).relative_to(folder.relative_to(ROOT).as_posix()) for f in out.split("\0") if f]


def data_files(package: str) -> list[PurePosixPath]:
    """A package's tracked files that are not Python modules, in its folder and in folders below it that
    are not packages themselves (asset folders), relative to its folder."""
    folder = source_dir(package)
    inner = [source_dir(p) for p in SETUPTOOLS["packages"] if p != package and source_dir(p) != folder]
    return [f for f in tracked_files(folder)
            if f.suffix != ".py" and not any((folder / f).is_relative_to(d) for d in inner if d.is_relative_to(folder))]


def matches(file: PurePosixPath, globs: list[str]) -> bool:
    return any(fnmatch.fnmatch(str(file), glob) for glob in globs)


def test_license_is_an_spdx_expression_the_build_backend_reads() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    backend = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]
    setuptools = next(r for r in backend if r.name == "setuptools")
    # PEP 639's license string needs setuptools 77; an older one rejects or warns about it.
    assert Version("76.9") not in setuptools.specifier and Version("77.0") in setuptools.specifier


def test_every_package_exists_and_every_folder_with_modules_is_a_package() -> None:
    packages = SETUPTOOLS["packages"]
    for package in packages:
        assert (source_dir(package) / "__init__.py").is_file(), package
    folders = {source_dir(p) for p in packages}
    for package in packages:
        for init in tracked_files(source_dir(package)):
            if init.name == "__init__.py":
                assert source_dir(package) / init.parent in folders, f"{package}/{init.parent} is not in packages"


def test_package_data_names_every_data_file_and_every_glob_matches() -> None:
    """With include-package-data off, package-data is the whole list: every glob matches a file, every data
    file (the asset folders included) matches a glob, and the assets the code loads are among them."""
    assert SETUPTOOLS["include-package-data"] is False
    package_data = SETUPTOOLS["package-data"]
    for package, globs in package_data.items():
        assert package in SETUPTOOLS["packages"], package
        files = data_files(package)
        for glob in globs:
            assert any(fnmatch.fnmatch(str(f), glob) for f in files), f"{package}: {glob} matches no file"
    for package in SETUPTOOLS["packages"]:
        left_out = [f for f in data_files(package) if not matches(f, package_data.get(package, []))]
        assert not left_out, f"{package}: {left_out} would not be installed; add them to package-data"
    for package, globs in ASSETS.items():
        assert set(globs) <= set(package_data[package]), package


def test_the_wheel_builds_without_warnings_and_holds_the_assets(tmp_path: Path) -> None:
    """A non-editable build (pip, isolated: it fetches setuptools; slow tier, tests/conftest.py) prints no
    warning on stderr and installs every data file of package-data."""
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-cache-dir",
                            "-w", str(tmp_path)], capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr
    noise = [line for line in build.stderr.splitlines() if "Warning" in line or "!!" in line]
    assert not noise, build.stderr
    [wheel] = tmp_path.glob("imaginejax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in SETUPTOOLS["packages"]:
        installed = PurePosixPath(*package.split("."))
        for file in data_files(package):
            if matches(file, SETUPTOOLS["package-data"].get(package, [])):
                assert str(installed / file) in names, installed / file
    for package, globs in ASSETS.items():
        folder = PurePosixPath(*package.split("."))
        for glob in globs:
            assert any(fnmatch.fnmatch(name, f"{folder}/{glob}") for name in names), (package, glob)
