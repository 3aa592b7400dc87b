"""Atomic writes of imaginejax.core.files: whole content or the old content, never a temp file left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from imaginejax.core import files


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


def test_logs_are_never_appended_through_a_link(tmp_path: Path) -> None:
    """train.log / metrics.jsonl planted as a symbolic link, a hard link, a FIFO or a directory: refused,
    naming the file and the fix, and the file outside the workspace keeps its bytes."""
    from imaginejax.core.runlog import MetricsLog
    from imaginejax.training.progress import IntervalProgress

    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    run_dir = tmp_path / "ws" / "runs" / "bc"
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").symlink_to(outside)
    progress = IntervalProgress("bc", 2, 2, 10, 10, mode="off", log_file=run_dir / "train.log")
    with pytest.raises(files.UnsafeFileError, match=r"train\.log is a symbolic link \(to .*outside\.txt\): .*rm "):
        progress("resumed chunk 0")
    os.link(outside, run_dir / "metrics.jsonl")
    with pytest.raises(files.UnsafeFileError, match=r"metrics\.jsonl is a hard link \(2 names\)"):
        MetricsLog(run_dir).write_interval(0, 1, 10, 1.0, np.arange(1), np.ones(1, bool), {}, {}, {})
    assert outside.read_text() == "secret\n"
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for path in (tmp_path / "fifo", tmp_path / "dir"):
        with pytest.raises(files.UnsafeFileError, match="not a regular file"):
            files.append_text(path, "x\n")
    files.append_text(tmp_path / "log", "a\n")
    files.append_text(tmp_path / "log", "b\n", fsync=True)
    assert (tmp_path / "log").read_text() == "a\nb\n"
