"""The notebooks under experiments/notebooks run end to end (nbclient, a fresh kernel each) and show what
they promise: the quick-start success table, the imaginer's generated rollouts checked for legality, the
ratio-study plot. They share one private cache root, so the expert data is collected once."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "experiments" / "notebooks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = pytest.mark.slow  # about 1 minute per notebook on a quiet 2-core CPU


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imaginejax-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IMAGINEJAX_HOME", str(root))  # the kernels inherit the test's environment
        yield root


def run(name: str) -> list[str]:
    """Executes a notebook; returns the text of every cell's outputs (one string per code cell)."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
                   ).execute()
    texts = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        parts = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output["text"])
            elif "data" in output:
                parts.append(output["data"].get("text/plain", ""))
                if "image/png" in output["data"]:
                    parts.append("<image/png>" + output["data"]["image/png"])
        texts.append("".join(parts))
    return texts


def test_quickstart(cache: Path) -> None:
    texts = run("quickstart")
    assert texts[0].startswith("imaginejax ") and "pip" not in texts[0]  # the install cell is skipped
    table = texts[-1].splitlines()
    assert table[:2] == ["| level | success (%) |", "|---|---:|"]
    assert [row.split("|")[1].strip() for row in table[2:]] == ["train", "rephrase", "easy", "hard"]


def test_imaginer(cache: Path) -> None:
    texts = run("imaginer")
    assert "fine-tuned 60 steps" in "".join(texts)
    last = texts[-1]
    assert "legal generated states:" in last and "goal consistency" in last  # the quality report's table


def test_sweeps(cache: Path) -> None:
    texts = run("sweeps")
    assert "10 runs in" in "".join(texts)
    figure = cache / "notebooks" / "ratio_study.png"
    assert figure.read_bytes().startswith(PNG_MAGIC)
    inline = texts[-1].split("<image/png>")[-1]
    assert base64.b64decode(inline).startswith(PNG_MAGIC)
