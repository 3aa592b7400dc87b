"""Instruction encoder: a Flax BERT (all-MiniLM-L6-v2) with mean pooling, loaded from local files.

Public API::

    encode_instructions(texts, *, normalize=True, use_cache=True) -> np.ndarray  # (M, 384) float32
    InstructionEncoder(model_dir=None, ...).encode(texts) -> np.ndarray          # (M, E); .dim
    EMBED_DIM = 384
    export_embedding_table(path, texts) / EmbeddingTable(path)  # precomputed, for machines without the model
"""

from imaginejax.lang.bert import BertConfig, BertEncoder
from imaginejax.lang.encoder import (
    EMBED_DIM,
    EmbeddingCache,
    EmbeddingTable,
    EmbeddingTableError,
    InstructionEncoder,
    ModelFilesNotFoundError,
    WeightLoadError,
    default_encoder,
    default_model_dir,
    encode_instructions,
    export_embedding_table,
    load_bert_config,
    load_bert_params,
)

__all__ = [
    "EMBED_DIM",
    "BertConfig",
    "BertEncoder",
    "EmbeddingCache",
    "EmbeddingTable",
    "EmbeddingTableError",
    "InstructionEncoder",
    "ModelFilesNotFoundError",
    "WeightLoadError",
    "default_encoder",
    "default_model_dir",
    "encode_instructions",
    "export_embedding_table",
    "load_bert_config",
    "load_bert_params",
]
