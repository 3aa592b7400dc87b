"""Imaginer throughput on the accelerator: fine-tuning and generation tokens/s, ours against transformers.

Fine-tuning: ``experiments/benchmarks/imaginer_finetune.py``'s ``measure_case`` (ours: the causal-LM step
and the KALM step our fine-tuning runs; PyTorch: ``LlamaForCausalLM`` + AdamW, LoRA as unmerged adapters, in
its worker process on the same device) on one batch of ``ft_batch`` × ``ft_length`` tokens, full and LoRA
rank 16, the three steps alternating. Generation: greedy decoding of
``gen_new`` tokens after ``gen_prompt`` prompt tokens, EOS off, ours (:func:`imaginejax.imaginer.greedy_generate`,
one jitted call) against ``model.generate``. Weights are random with the exact architecture (the speed of a
step does not depend on their values; SmolLM2-135M's architecture comes from ``.accel/`` where its GGUF is
absent). PyTorch runs in this process on the same device. Both sides compute in full float32: our Llama's
matmuls at ``Precision.HIGHEST`` (its default, for logit parity), PyTorch at its default float32 matmul
precision ("highest", no TF32). Generation alternates ours and PyTorch call by call in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import imaginer_finetune as ift  # noqa: E402

from _common import Spread, Worker, alternate, timed  # noqa: E402
from budget import Budget  # noqa: E402

SMOLLM2_VOCABULARY = 49152


def full_config(model: str) -> Any:
    """The :class:`LlamaConfig` of ``tiny`` (with SmolLM2's vocabulary) or of SmolLM2-135M
    (``imaginer_finetune.smollm2_config``: without its GGUF where ``$IMAGINEJAX_SMOLLM2_ARCHITECTURE`` is set)."""
    from imaginejax.imaginer.finetune import TINY_ARCHITECTURE
    from imaginejax.imaginer.llama import LlamaConfig

    return LlamaConfig(**TINY_ARCHITECTURE, vocab_size=SMOLLM2_VOCABULARY) if model == "tiny" else ift.smollm2_config()


def finetune_rows(sizes: Any, budget: Budget, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Fine-tuning tokens/s per (model, mode): ``imaginer_finetune.measure_case`` (ours' LM and KALM steps and
    PyTorch's LM step, alternating) with its PyTorch worker on ``sizes.torch_device``."""
    env = dict(os.environ, IMAGINEJAX_TORCH_DEVICE=sizes.torch_device)
    workers = {0: Worker([sys.executable, ift.__file__, "--torch-worker"], env)}
    args = argparse.Namespace(batch=sizes.ft_batch, length=sizes.ft_length, steps=sizes.repeats)
    rows = []
    try:
        for model in sizes.imaginer_models:
            for mode in ("full", "lora"):
                if budget.expired(reserve=sizes.generation_reserve):
                    rows.append({"model": model, "mode": mode, "note": "skipped: budget"})
                    continue
                row = dict(ift.measure_case(model, mode, args, workers), model=model, mode=mode,
                           batch=sizes.ft_batch, length=sizes.ft_length)
                rows.append(row)
                log(f"  fine-tune {model} {mode}: ours {row['ours_lm_tokens_per_s']:,.0f} tokens/s, "
                    f"PyTorch {row['torch_lm_tokens_per_s'] or 0:,.0f}")
    finally:
        for worker in workers.values():
            worker.close()
    return rows


def generation_rows(sizes: Any, budget: Budget, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Greedy generation tokens/s per (model, batch), ours against ``model.generate``, alternated."""
    import torch
    import transformers

    from imaginejax.imaginer import greedy_generate
    from imaginejax.imaginer.llama import init_params

    rows = []
    for model in sizes.imaginer_models:
        config = full_config(model)
        params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf())).float() \
            .to(sizes.torch_device).eval()
        hf.generation_config.eos_token_id = None
        hf.generation_config.bos_token_id = None
        generation = transformers.GenerationConfig(do_sample=False, use_cache=True, max_new_tokens=sizes.gen_new,
                                                   min_new_tokens=sizes.gen_new, eos_token_id=None, pad_token_id=0)
        for batch in sizes.gen_batches:
            if budget.expired(reserve=2.0):
                rows.append({"model": model, "batch": batch, "note": "skipped: budget"})
                continue
            ids = np.random.default_rng(batch).integers(3, config.vocab_size, (batch, sizes.gen_prompt)).astype(np.int32)
            input_ids = jnp.asarray(ids)
            torch_ids = torch.as_tensor(ids, dtype=torch.long, device=sizes.torch_device)

            def ours() -> Any:
                return jax.block_until_ready(greedy_generate(params, config, input_ids,
                                                             max_new_tokens=sizes.gen_new, eos_token_ids=()))

            def theirs() -> Any:
                with torch.no_grad():
                    out = hf.generate(input_ids=torch_ids, attention_mask=torch.ones_like(torch_ids),
                                      generation_config=generation)
                if sizes.torch_device.startswith("cuda"):
                    torch.cuda.synchronize()
                return out

            first_ours, first_theirs = timed(ours)(), timed(theirs)()  # compilation / warm-up
            t = alternate({"ours": timed(ours), "torch": timed(theirs)}, sizes.repeats)
            tokens = batch * sizes.gen_new
            row = {"model": model, "batch": batch, "prompt": sizes.gen_prompt, "new_tokens": sizes.gen_new,
                   "ours_seconds": t["ours"], "torch_seconds": t["torch"],
                   "ours_tokens_per_s": Spread.of(t["ours"]).rates(tokens)[1], "ours_first_call_seconds": first_ours,
                   "torch_tokens_per_s": Spread.of(t["torch"]).rates(tokens)[1],
                   "torch_first_call_seconds": first_theirs}
            row["ratio"] = row["ours_tokens_per_s"] / row["torch_tokens_per_s"]
            rows.append(row)
            log(f"  generate {model} B={batch}: ours {row['ours_tokens_per_s']:,.0f} tokens/s, "
                f"PyTorch {row['torch_tokens_per_s']:,.0f} ({row['ratio']:.2f}×)")
        del hf, params
    return rows


def run(sizes: Any, budget: Budget, log: Callable[[str], None]) -> dict[str, Any]:
    return {"finetune": finetune_rows(sizes, budget, log), "generation": generation_rows(sizes, budget, log),
            "precision": "float32 on both sides: ours Precision.HIGHEST, PyTorch's default (no TF32)"}
