"""The dataset layer: types, validation, on-disk format, flattening and the mixing sampler.

Host side (NumPy): :class:`TrajectoryDataset` — :func:`validate_dataset` (and, against an environment's
:class:`EnvFacts`, :func:`validate_for_env`), :func:`save_dataset`, :func:`load_dataset`,
:func:`read_manifest`. Device side (JAX pytrees): :func:`to_transitions` turns a dataset into
:class:`Transitions`; :func:`sample_mixed` / :func:`sample_uniform` draw a :class:`Batch`.
"""

from imaginejax.data.errors import DatasetError
from imaginejax.data.io import SCHEMA_VERSION, load_dataset, read_manifest, save_dataset
from imaginejax.data.sampling import num_imaginary, sample_mixed, sample_uniform
from imaginejax.data.transitions import check_transitions, concat_transitions, placeholder_like, to_transitions
from imaginejax.data.types import LEVELS, SOURCES, Batch, TrajectoryDataset, Transitions
from imaginejax.data.validate import DatasetDims, EnvFacts, validate_dataset, validate_for_env

__all__ = [
    "LEVELS",
    "SCHEMA_VERSION",
    "SOURCES",
    "Batch",
    "DatasetDims",
    "DatasetError",
    "EnvFacts",
    "TrajectoryDataset",
    "Transitions",
    "check_transitions",
    "concat_transitions",
    "load_dataset",
    "num_imaginary",
    "placeholder_like",
    "read_manifest",
    "sample_mixed",
    "sample_uniform",
    "save_dataset",
    "to_transitions",
    "validate_dataset",
    "validate_for_env",
]
