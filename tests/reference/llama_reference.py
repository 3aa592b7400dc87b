"""Reference Llama outputs from PyTorch + transformers, for the Flax Llama's parity tests.

Run with the test-only reference interpreter (``$IMAGINEJAX_REF_PYTHON``, made by ``make test``)::

    python llama_reference.py tiny --spec spec.json --out-dir DIR
    python llama_reference.py gguf --spec spec.json --gguf FILE --out ref.npz

``tiny``: for every variant in the spec (``name``, Hugging Face ``config`` dict, ``seed``,
``max_shard_size`` or null, token ids chosen by the test), builds ``transformers.LlamaForCausalLM``
(eager attention, float32) with ``torch.manual_seed(seed)``, perturbs every norm weight and bias
(which Hugging Face initialises to ones/zeros, so a loader mixing them up would go unnoticed),
saves it with ``save_pretrained`` to ``DIR/<name>`` and writes ``DIR/<name>/reference.npz``:

* ``logits_full`` (B, L, V): ``input_ids`` unpadded;
* ``logits_left`` / ``logits_right`` (B, W, V): the padded batches with their attention masks and the
  positions ``generate`` uses (``cumsum(mask) - 1``);
* ``generated_noeos`` (G, N): ``generate(do_sample=False)`` on the left-padded prompts with EOS
  disabled; ``eos_id``: the 4th token of row 0 of that; ``generated_eos`` (G, N): the same prompts
  stopping at ``eos_id`` (rows padded with ``pad_token_id`` to N); ``min_top2_gap``: the smallest
  top-1 minus top-2 logit along the greedy paths (how robust the token comparison is);
  ``config_json``: ``transformers.LlamaConfig.to_json_string(use_diff=False)`` (every field).

``gguf``: loads tokenizer and model from the GGUF file the way transformers does
(``from_pretrained(dir, gguf_file=...)``, dequantised to float32, eager attention) and writes the
token ids of ``texts`` (concatenated ``text_ids`` with ``text_offsets``), the chat prompt rendered by
the GGUF's chat template (``chat_texts``, ``chat_ids``/``chat_offsets``), the logits of the first
chat prompt (``chat_logits`` (L, V)), greedy continuations of each chat prompt alone
(``chat_generated`` (C, N), padded with -1 after EOS), and layer-0 projection weights
(``q_proj``, ``k_proj``, ``v_proj``) plus the first rows of the embedding to check the loader.
Both write ``seconds`` and ``versions``; no pickled objects.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()


def versions(model: Any) -> np.ndarray:
    """A one-line description of the reference software, as a NumPy string."""
    return np.array(f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
                    f"transformers {transformers.__version__}, model class {type(model).__name__}, "
                    f"attention {model.config._attn_implementation}")


def generation_positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions as ``generate`` derives them from an attention mask: real tokens before each one."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 1)


def greedy(model: Any, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int,
           eos_id: int | None, pad_id: int) -> tuple[np.ndarray, float]:
    """``generate(do_sample=False)`` new tokens (G, max_new_tokens) padded with ``pad_id``, and the
    smallest top-1 minus top-2 logit gap along the way."""
    config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_id, pad_token_id=pad_id,
        bos_token_id=None, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    new = out.sequences[:, ids.shape[1]:].numpy()
    gaps = []
    for scores in out.scores:
        top = torch.topk(scores.float(), 2, dim=-1).values
        gaps.append((top[:, 0] - top[:, 1]).numpy())
    # Rows that already finished keep emitting pad with forced scores; only count live rows.
    gap_matrix = np.stack(gaps, axis=1)
    live = np.ones_like(gap_matrix, dtype=bool)
    if eos_id is not None:
        for row in range(new.shape[0]):
            hits = np.flatnonzero(new[row] == eos_id)
            if hits.size:
                live[row, hits[0] + 1:] = False
    result = np.full((ids.shape[0], max_new_tokens), pad_id, np.int64)
    result[:, :new.shape[1]] = new
    return result, float(gap_matrix[live].min())


def run_tiny(spec: dict[str, Any], out_dir: Path) -> None:
    """The ``tiny`` command (see the module docstring)."""
    for variant in spec["variants"]:
        start = time.perf_counter()
        torch.manual_seed(int(variant["seed"]))
        config = transformers.LlamaConfig(**variant["config"])
        config._attn_implementation = "eager"
        model = transformers.LlamaForCausalLM(config).eval()
        # Only the GenerationConfig passed to generate decides EOS/BOS (no model defaults merged in).
        model.generation_config.eos_token_id = None
        model.generation_config.bos_token_id = None
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "norm" in name or name.endswith(".bias"):
                    parameter.add_(0.2 * torch.randn_like(parameter))
        target = out_dir / variant["name"]
        if variant.get("max_shard_size"):
            model.save_pretrained(target, max_shard_size=variant["max_shard_size"])
        else:
            model.save_pretrained(target)

        def logits(ids: list[list[int]], mask: list[list[int]] | None) -> np.ndarray:
            ids_t = torch.tensor(ids)
            with torch.no_grad():
                if mask is None:
                    return model(input_ids=ids_t).logits.float().numpy()
                mask_t = torch.tensor(mask)
                return model(input_ids=ids_t, attention_mask=mask_t,
                             position_ids=generation_positions(mask_t)).logits.float().numpy()

        arrays: dict[str, np.ndarray] = {
            "logits_full": logits(variant["input_ids"], None),
            "logits_left": logits(variant["left_ids"], variant["left_mask"]),
            "logits_right": logits(variant["right_ids"], variant["right_mask"]),
        }
        prompt_ids, prompt_mask = torch.tensor(variant["gen_ids"]), torch.tensor(variant["gen_mask"])
        steps, pad = int(variant["max_new_tokens"]), int(variant["pad_token_id"])
        noeos, gap_noeos = greedy(model, prompt_ids, prompt_mask, steps, None, pad)
        eos_id = int(noeos[0, 3])
        with_eos, gap_eos = greedy(model, prompt_ids, prompt_mask, steps, eos_id, pad)
        arrays.update(generated_noeos=noeos, generated_eos=with_eos, eos_id=np.int64(eos_id),
                      min_top2_gap=np.float64(min(gap_noeos, gap_eos)),
                      config_json=np.array(config.to_json_string(use_diff=False)),
                      seconds=np.float64(time.perf_counter() - start), versions=versions(model))
        np.savez(target / "reference.npz", **arrays)


def ragged(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ids and (n + 1,) offsets of a list of id lists."""
    offsets = np.cumsum([0] + [len(row) for row in rows]).astype(np.int64)
    flat = np.asarray([token for row in rows for token in row], np.int64)
    return flat, offsets


def run_gguf(spec: dict[str, Any], gguf_path: Path, out: Path) -> None:
    """The ``gguf`` command (see the module docstring)."""
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent),
                                                           gguf_file=gguf_path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
        attn_implementation="eager").eval()
    load_seconds = time.perf_counter() - start

    text_ids = [tokenizer(text, add_special_tokens=True)["input_ids"] for text in spec["texts"]]
    chat_texts = [tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
                  for messages in spec["chats"]]
    chat_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in chat_texts]
    with torch.no_grad():
        chat_logits = model(input_ids=torch.tensor([chat_ids[0]])).logits[0].float().numpy()
    steps = int(spec["max_new_tokens"])
    eos = tokenizer.eos_token_id
    generated = np.full((len(chat_ids), steps), -1, np.int64)
    gaps = []
    for row, ids in enumerate(chat_ids):
        config = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=steps, eos_token_id=eos, pad_token_id=eos,
            output_scores=True, return_dict_in_generate=True)
        with torch.no_grad():
            out_ids = model.generate(input_ids=torch.tensor([ids]), generation_config=config)
        new = out_ids.sequences[0, len(ids):].numpy()
        generated[row, :new.size] = new
        for scores in out_ids.scores:
            top = torch.topk(scores[0].float(), 2).values
            gaps.append(float(top[0] - top[1]))
    layer = model.model.layers[0].self_attn
    flat_text, text_offsets = ragged(text_ids)
    flat_chat, chat_offsets = ragged(chat_ids)
    np.savez(
        out, text_ids=flat_text, text_offsets=text_offsets, chat_ids=flat_chat,
        chat_offsets=chat_offsets, chat_texts=np.array(chat_texts), chat_logits=chat_logits,
        chat_generated=generated, eos_id=np.int64(eos), min_top2_gap=np.float64(min(gaps)),
        q_proj=layer.q_proj.weight.detach().float().numpy(),
        k_proj=layer.k_proj.weight.detach().float().numpy(),
        v_proj=layer.v_proj.weight.detach().float().numpy(),
        embed_rows=model.model.embed_tokens.weight[:64].detach().float().numpy(),
        load_seconds=np.float64(load_seconds), seconds=np.float64(time.perf_counter() - start),
        versions=versions(model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tiny = commands.add_parser("tiny", help="random tiny configs: save checkpoints + outputs")
    tiny.add_argument("--spec", type=Path, required=True)
    tiny.add_argument("--out-dir", type=Path, required=True)
    gguf = commands.add_parser("gguf", help="a GGUF file loaded through transformers")
    gguf.add_argument("--spec", type=Path, required=True)
    gguf.add_argument("--gguf", type=Path, required=True)
    gguf.add_argument("--out", type=Path, required=True)
    gguf.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    if args.command == "tiny":
        torch.set_num_threads(1)
        run_tiny(spec, args.out_dir)
    else:
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        run_gguf(spec, args.gguf, args.out)


if __name__ == "__main__":
    main()
