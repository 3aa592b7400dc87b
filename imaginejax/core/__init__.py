"""The floor every layer stands on: atomic files, paths, pinned weights, checkpoints, multi-process
coordination and message/metrics logs. Imports nothing of the project above ``imaginejax.core``."""

__version__ = "0.1.0"  # the package's version (pyproject.toml), recorded in what it writes
