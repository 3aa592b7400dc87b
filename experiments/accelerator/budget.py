"""The wall-time budget of the accelerator run's stages."""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class Budget:
    """A deadline ``seconds`` after creation; stages check it between measurements and skip the rest."""

    seconds: float
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def expired(self, reserve: float = 0.0) -> bool:
        """Whether less than ``reserve`` seconds are left."""
        return self.left() < reserve
