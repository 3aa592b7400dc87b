"""Instruction-encoder throughput: Flax all-MiniLM-L6-v2 (cold, compiled, cached) vs PyTorch.

    python experiments/benchmarks/lang_encoder_throughput.py [--count 4000] [--repeats 3] [--torch-threads 1 2]
                                                              [--allow-busy]

Encodes ``count`` distinct short instructions (10-16 tokens) and prints sentences/s for:
cold (fresh encoder object, includes XLA compilation, no cache), compiled (same shapes again, cache
off), memory-cached, disk-cached (a fresh cache reading the chunk files), and, when a reference
interpreter is available (``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref``), transformers' PyTorch BertModel
on the same texts in batches of 64 (tokenising + forward + pooling, model load excluded; one fresh
process per sample, at each ``--torch-threads`` setting with ``OMP_WAIT_POLICY=PASSIVE``). After the
cold call, every case is sampled in alternation (compiled, memory, disk, PyTorch at 1 thread, at 2,
compiled, …) ``--repeats`` times; each row gives the best and the median, PyTorch at its faster thread
setting (by median). The run refuses to start at a load average above the core count unless
``--allow-busy`` (the output then says busy). The table is also saved as JSON under
``cache_root() / "benchmarks"``.
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
from imaginejax.core.paths import cache_root

from _common import (REPO_ROOT, ALTERNATIVE_THREADS, Spread, add_load_arguments, alternate, check_load, fastest,
                     is_busy, load_note, thread_env, timed)


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


def reference_python() -> Path | None:
    """``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref/bin/python``; None if it does not exist."""
    configured = os.environ.get("IMAGINEJAX_REF_PYTHON")
    python = Path(configured) if configured else REPO_ROOT / ".venv-ref" / "bin" / "python"
    return python if python.exists() else None


def torch_seconds(python: Path, texts: list[str], model_dir: Path, threads: int) -> tuple[float, str]:
    """(seconds, versions) of the PyTorch reference on ``texts`` (batches of 64) in a fresh process with
    ``threads`` passive OpenMP threads."""
    with tempfile.TemporaryDirectory() as work:
        texts_path, out_path = Path(work) / "texts.json", Path(work) / "ref.npz"
        texts_path.write_text(json.dumps(texts), encoding="utf-8")
        subprocess.run([str(python), str(REPO_ROOT / "tests" / "reference" / "minilm_reference.py"),
                        "--texts", str(texts_path), "--out", str(out_path), "--model-dir",
                        str(model_dir), "--batch-size", "64"], check=True, capture_output=True,
                       env=thread_env(threads))
        with np.load(out_path, allow_pickle=False) as archive:
            return float(archive["seconds"]), str(archive["versions"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, nargs="+", default=list(ALTERNATIVE_THREADS))
    add_load_arguments(parser)
    args = parser.parse_args()
    load_before = check_load(args.allow_busy)
    texts = make_instructions(args.count)
    python = reference_python()
    versions = {}

    with tempfile.TemporaryDirectory() as cache_dir:
        start = time.perf_counter()
        encoder = InstructionEncoder(cache_dir=cache_dir)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        first = encoder.encode(texts)  # compiles, computes, writes the disk cache
        cold_s = time.perf_counter() - start

        def torch_sample(threads: int):
            def measure() -> float:
                seconds, versions[threads] = torch_seconds(python, texts, encoder.model_dir, threads)
                return seconds
            return measure

        contenders = {"compiled": timed(lambda: encoder.encode(texts, use_cache=False)),
                      "memory": timed(lambda: encoder.encode(texts)),
                      "disk": timed(lambda: encoder.with_cache(cache_dir).encode(texts))}
        if python is not None:
            contenders.update({t: torch_sample(t) for t in args.torch_threads})
        spreads = {name: Spread.of(seconds) for name, seconds in alternate(contenders, args.repeats).items()}
        assert np.array_equal(encoder.with_cache(cache_dir).encode(texts), first)
    load_after = os.getloadavg()[0]

    rows = [("flax: load weights + tokenizer (s)", Spread(load_s, load_s), False),
            ("flax cold: compile + encode + write cache", Spread(cold_s, cold_s), True),
            ("flax compiled, cache off", spreads["compiled"], True),
            ("flax memory cache", spreads["memory"], True),
            ("flax disk cache (fresh cache object)", spreads["disk"], True)]
    if python is not None:
        threads = fastest({t: spreads[t] for t in args.torch_threads})
        rows.append((f"pytorch reference, batch 64, {threads} thread(s) ({versions[threads]})", spreads[threads], True))
    print(f"{len(texts)} instructions, tokens per text "
          f"{min(map(len, encoder.tokenize(texts)))}-{max(map(len, encoder.tokenize(texts)))}, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
          f"{load_note(load_before, load_after)}; best / median of {args.repeats} alternating samples")
    print(f"{'case':<90} {'seconds':>17} {'sentences/s':>17}")
    for name, spread, is_rate in rows:
        rates = spread.rates(len(texts))
        print(f"{name:<90} {spread.min:>8.3f}/{spread.median:<8.3f} "
              + (f"{rates[0]:>8.0f}/{rates[1]:<8.0f}" if is_rate else ""))
    out = cache_root() / "benchmarks" / "lang_encoder_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "load_before": load_before, "load_after": load_after, "busy": is_busy(load_before, load_after),
        "rows": [{"case": name, "seconds_best": spread.min, "seconds_median": spread.median,
                  "sentences_per_s_best": len(texts) / spread.min if is_rate else None,
                  "sentences_per_s_median": len(texts) / spread.median if is_rate else None}
                 for name, spread, is_rate in rows]}, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
