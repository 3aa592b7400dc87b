"""Instruction-encoder throughput: Flax all-MiniLM-L6-v2 (cold, compiled, cached) vs PyTorch.

    python experiments/benchmarks/lang_encoder_throughput.py [--count 4000] [--repeats 3]

Encodes ``count`` distinct short instructions (10-16 tokens) and prints sentences/s for:
cold (fresh encoder object, includes XLA compilation, no cache), compiled (same shapes again, cache
off), memory-cached, disk-cached (a fresh cache reading the chunk files), and, when a reference
interpreter is available (``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref``), transformers' PyTorch BertModel
on the same texts in batches of 64 (tokenising + forward + pooling, model load excluded). The table is
also saved as JSON under ``cache_root() / "benchmarks"``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from imaginejax.lang import InstructionEncoder
from imaginejax.paths import cache_root

from _common import REPO_ROOT, best_seconds


def make_instructions(count: int) -> list[str]:
    """``count`` distinct CLEVR-style instructions (raises if the templates cannot supply that many)."""
    verbs = ["Push", "Move", "Put", "Can you push", "Please move", "Go push", "Try to move",
             "Could you put", "I want you to push", "Slide"]
    colors = ["red", "blue", "green", "purple", "cyan", "yellow", "grey", "brown"]
    relations = ["in front of", "behind", "to the left of", "to the right of", "next to"]
    shapes = ["ball", "cube"]
    texts = [f"{verb} the {a} {shape} {relation} the {b} ball"
             for verb, a, relation, b, shape in itertools.product(verbs, colors, relations, colors, shapes)
             if a != b]
    if count > len(texts):
        raise ValueError(f"--count {count} exceeds the {len(texts)} distinct template instructions")
    return texts[:count]


def torch_seconds(texts: list[str], model_dir: Path) -> tuple[float, str] | None:
    """Seconds the PyTorch reference takes on ``texts`` (batches of 64), or None without one."""
    configured = os.environ.get("IMAGINEJAX_REF_PYTHON")
    python = Path(configured) if configured else REPO_ROOT / ".venv-ref" / "bin" / "python"
    if not python.exists():
        return None
    with tempfile.TemporaryDirectory() as work:
        texts_path, out_path = Path(work) / "texts.json", Path(work) / "ref.npz"
        texts_path.write_text(json.dumps(texts), encoding="utf-8")
        subprocess.run([str(python), str(REPO_ROOT / "tests" / "reference" / "minilm_reference.py"),
                        "--texts", str(texts_path), "--out", str(out_path), "--model-dir",
                        str(model_dir), "--batch-size", "64"], check=True, capture_output=True)
        with np.load(out_path, allow_pickle=False) as archive:
            return float(archive["seconds"]), str(archive["versions"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    texts = make_instructions(args.count)

    with tempfile.TemporaryDirectory() as cache_dir:
        start = time.perf_counter()
        encoder = InstructionEncoder(cache_dir=cache_dir)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        first = encoder.encode(texts)  # compiles, computes, writes the disk cache
        cold_s = time.perf_counter() - start
        compiled_s = best_seconds(lambda: encoder.encode(texts, use_cache=False), args.repeats)
        memory_s = best_seconds(lambda: encoder.encode(texts), args.repeats)
        disk_s = best_seconds(lambda: encoder.with_cache(cache_dir).encode(texts), args.repeats)
        assert np.array_equal(encoder.with_cache(cache_dir).encode(texts), first)

    rows = [("flax: load weights + tokenizer (s)", load_s, None),
            ("flax cold: compile + encode + write cache", cold_s, len(texts) / cold_s),
            ("flax compiled, cache off", compiled_s, len(texts) / compiled_s),
            ("flax memory cache", memory_s, len(texts) / memory_s),
            ("flax disk cache (fresh cache object)", disk_s, len(texts) / disk_s)]
    reference = torch_seconds(texts, encoder.model_dir)
    if reference is not None:
        rows.append((f"pytorch reference, batch 64 ({reference[1]})", reference[0],
                     len(texts) / reference[0]))
    print(f"{len(texts)} instructions, tokens per text "
          f"{min(map(len, encoder.tokenize(texts)))}-{max(map(len, encoder.tokenize(texts)))}, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs")
    print(f"{'case':<80} {'seconds':>9} {'sentences/s':>12}")
    for name, seconds, rate in rows:
        print(f"{name:<80} {seconds:>9.3f} {'' if rate is None else f'{rate:>12.0f}'}")
    out = cache_root() / "benchmarks" / "lang_encoder_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{"case": name, "seconds": seconds, "sentences_per_s": rate}
                               for name, seconds, rate in rows], indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
