"""The one error type of the dataset layer.

Every problem found in a dataset — in memory (:mod:`imaginejax.data.validate`) or on disk
(:mod:`imaginejax.data.io`) — is reported as a :class:`DatasetError` that names the offending field, says
what is wrong with it and how to fix it::

    field 'rewards': 3 non-finite values, first at trajectory 7 step 12; fix: ...
"""

from __future__ import annotations

from pathlib import Path


class DatasetError(ValueError):
    """A dataset field is malformed, inconsistent or corrupted.

    Subclasses :class:`ValueError`, so ``except ValueError`` keeps working for callers that do not care.

    Attributes:
      field: the offending field — a :class:`~imaginejax.data.types.TrajectoryDataset` attribute name
        (``"rewards"``), or a manifest key / file name for on-disk problems (``"manifest.json"``).
      problem: what is wrong, with the first offending location where there is one.
      fix: what to do about it.
      path: the dataset directory, for errors raised while reading or writing one; else ``None``.
    """

    def __init__(self, field: str, problem: str, fix: str, path: str | Path | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        self.path = None if path is None else str(path)
        where = "" if path is None else f" (dataset at {self.path})"
        super().__init__(f"field {field!r}: {problem}; fix: {fix}{where}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str | None]]:
        # Keep the error picklable (multiprocessing, pytest-xdist): the default reduce would replay the
        # formatted message as the only positional argument.
        return (type(self), (self.field, self.problem, self.fix, self.path))
