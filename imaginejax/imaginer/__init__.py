"""The imaginer: a Flax Llama that writes imaginary rollouts (BENCHMARK.md §5, KALM design).

This package holds the model (:mod:`~imaginejax.imaginer.llama`), its loaders for Hugging Face
directories and GGUF files (:mod:`~imaginejax.imaginer.loading`) and jitted greedy generation with a
KV cache (:mod:`~imaginejax.imaginer.generate`); the KALM adapters and tasks
(:mod:`~imaginejax.imaginer.kalm`), fine-tuning (:mod:`~imaginejax.imaginer.finetune`,
:mod:`~imaginejax.imaginer.lora`) with validation on a held-out split (:mod:`~imaginejax.imaginer.validation`),
imaginary-rollout generation (:mod:`~imaginejax.imaginer.imagine`),
the automatic quality report and filter (:mod:`~imaginejax.imaginer.quality`) and the quality study
for any environment with an expert and quality rules (``python -m imaginejax.imaginer.study``).
"""

from imaginejax.imaginer.generate import GenerationOutput, greedy_generate, prefill
from imaginejax.imaginer.llama import (
    KVCache,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaOutput,
    RopeScaling,
    compute_setting,
    embed,
    forward,
    init_cache,
    init_params,
    lm_logits,
)
from imaginejax.imaginer.loading import (
    load_gguf,
    load_gguf_config,
    load_gguf_tokenizer,
    load_hf_checkpoint,
    load_hf_config,
    load_hf_tokenizer,
    smollm2_gguf_path,
)
from imaginejax.imaginer.quality import (
    QualityReport,
    filter_dataset,
    quality_report,
    score_dataset,
)

__all__ = [
    "GenerationOutput", "greedy_generate", "prefill",
    "KVCache", "LlamaConfig", "LlamaForCausalLM", "LlamaOutput", "RopeScaling", "compute_setting", "embed", "forward",
    "init_cache", "init_params", "lm_logits",
    "load_gguf", "load_gguf_config", "load_gguf_tokenizer", "load_hf_checkpoint", "load_hf_config",
    "load_hf_tokenizer", "smollm2_gguf_path",
    "QualityReport", "filter_dataset", "quality_report", "score_dataset",
]
