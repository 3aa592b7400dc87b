"""A file too large for one transfer, split into checked parts and joined again on the other side.

    python experiments/accelerator/parts.py split FILE --out DIR [--part-mib 48]
    python experiments/accelerator/parts.py join DIR/NAME.parts.json --out DIR

``split`` writes ``NAME.part-1`` … ``NAME.part-k`` (each at most ``--part-mib`` MiB) and ``NAME.parts.json``:
the file's name, size and SHA-256, and each part's. The parts travel in separate calls to the same warm
machine (each call carries one part; the parts already there stay). ``join`` checks every part's size and
SHA-256, concatenates them into a temporary file beside the target, checks the whole file's SHA-256 and
only then renames it into place, so a missing or damaged part never leaves a half-written file. Its
errors name the part and the command that rebuilds the parts (``rebuild`` in the manifest).

Standard library only: ``run.sh`` joins before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from pathlib import Path

CHUNK = 1 << 20
MANIFEST_SUFFIX = ".parts.json"


class PartError(RuntimeError):
    """A part is missing, of another size, or damaged; or the joined file is not the one split."""


def sha256(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(file: Path, out: Path, part_bytes: int, rebuild: str = "") -> Path:
    """Splits ``file`` into parts of at most ``part_bytes`` in ``out``; returns the manifest's path.

    ``rebuild``: the command that writes these parts again (named in :func:`join`'s errors).
    """
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(file, "rb") as source:
        index = 1
        while block := source.read(part_bytes):
            part = out / f"{file.name}.part-{index}"
            part.write_bytes(block)
            parts.append({"file": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
            index += 1
    manifest = {"name": file.name, "bytes": file.stat().st_size, "sha256": sha256(file), "parts": parts,
                "rebuild": rebuild or f"python experiments/accelerator/parts.py split {file} --out {out}"}
    path = out / f"{file.name}{MANIFEST_SUFFIX}"
    path.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return path


def missing_parts(manifest_path: Path) -> list[str]:
    """The parts of a manifest not (yet) beside it."""
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    return [p["file"] for p in manifest["parts"] if not (manifest_path.parent / p["file"]).is_file()]


def join(manifest_path: Path, out: Path) -> Path:
    """Checks every part of the manifest, joins them into ``out/NAME`` and checks the result.

    Raises:
      PartError: a part missing, of another size or SHA-256, or the joined file's SHA-256 not the
        manifest's; nothing is left in ``out`` then.
    """
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    folder, rebuild = manifest_path.parent, manifest.get("rebuild", "the split command")
    for number, part in enumerate(manifest["parts"], 1):
        path = folder / part["file"]
        where = f"part {number} of {len(manifest['parts'])} of {manifest['name']} ({path})"
        if not path.is_file():
            raise PartError(f"{where} is missing: carry it with the next call to the same machine")
        size, digest = path.stat().st_size, sha256(path)
        if size != part["bytes"] or digest != part["sha256"]:
            raise PartError(f"{where} is damaged ({size} bytes, SHA-256 {digest[:16]}…; the manifest says "
                            f"{part['bytes']} bytes, {part['sha256'][:16]}…): rebuild the parts with `{rebuild}` "
                            "and carry them again")
    out.mkdir(parents=True, exist_ok=True)
    target = out / manifest["name"]
    handle, temporary = tempfile.mkstemp(prefix=f".{manifest['name']}.", dir=out)
    try:
        with os.fdopen(handle, "wb") as joined:
            for part in manifest["parts"]:
                with open(folder / part["file"], "rb") as source:
                    while block := source.read(CHUNK):
                        joined.write(block)
        if sha256(Path(temporary)) != manifest["sha256"]:
            raise PartError(f"the parts of {manifest['name']} joined to a file whose SHA-256 is not the "
                            f"manifest's: rebuild the parts with `{rebuild}`")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="split FILE into checked parts")
    cut.add_argument("file", type=Path)
    cut.add_argument("--out", type=Path, required=True)
    cut.add_argument("--part-mib", type=float, default=48.0)
    glue = commands.add_parser("join", help="check the parts of a manifest and join them")
    glue.add_argument("manifest", type=Path)
    glue.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        if args.command == "split":
            print(split(args.file, args.out, int(args.part_mib * 2**20)))
        else:
            print(join(args.manifest, args.out))
    except PartError as error:
        raise SystemExit(str(error)) from None


if __name__ == "__main__":
    main()
