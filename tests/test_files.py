"""Atomic writes of imaginejax.files: whole content or the old content, never a temp file left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from imaginejax import files


def test_write_text_json_bytes_replace_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    files.write_text(path, "old\n")
    files.write_json(path, {"x": [1, 2]})
    assert json.loads(path.read_text()) == {"x": [1, 2]} and path.read_text().endswith("\n")
    files.write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.bin"]


def test_failed_writer_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "figure.png"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"):
        with files.atomic_path(path) as tmp:
            assert tmp.suffix == ".png" and files.is_temp(tmp) and tmp.parent == tmp_path
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_path_writers_keep_the_suffix(tmp_path: Path) -> None:
    import numpy as np

    with files.atomic_path(tmp_path / "arrays.npz") as tmp:
        np.savez(tmp, x=np.arange(3))  # np.savez appends .npz to any other suffix
    with np.load(tmp_path / "arrays.npz") as archive:
        assert archive["x"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["arrays.npz"]


@pytest.mark.parametrize("renameat2", [True, False])
def test_staged_dir_replaces_only_with_overwrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 renameat2: bool) -> None:
    if not renameat2:
        monkeypatch.setattr(files, "_renameat2", lambda src, dst, flags: False)
    target = tmp_path / "ds"
    with files.staged_dir(target) as staged:
        (staged / "one").write_text("1")
    with pytest.raises(FileExistsError):
        with files.staged_dir(target) as staged:
            (staged / "two").write_text("2")
    with files.staged_dir(target, overwrite=True) as staged:
        (staged / "two").write_text("2")
    assert [p.name for p in target.iterdir()] == ["two"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]
    assert not files.is_temp(target) and not os.path.lexists(tmp_path / ".ds.old")
