"""Environments and their one registry.

``env, params = make(name, level)`` returns a stateless environment object and the pytree of the level's
task table (see ARCHITECTURE.md, "Contracts: Environment"). Each environment is a package
``imaginejax.envs.<name>`` whose ``ENTRY`` (:class:`~imaginejax.envs.registry.EnvEntry`) says how to build
it, its expert, its quality rules and how its episodes are drawn; :data:`PACKAGES` lists them. Adding an environment is one package
and one name there.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Callable

from imaginejax.envs.base import Encoder
from imaginejax.envs.registry import EnvEntry, QualityRules, Renderer

# One name per environment: the package under imaginejax.envs that holds its ENTRY (imported on first use).
PACKAGES: tuple[str, ...] = ("clevr", "babyai", "cheetah", "metaworld", "libero")


def registered() -> tuple[str, ...]:
    """Names accepted by :func:`make`."""
    return tuple(sorted(PACKAGES))


@functools.lru_cache(maxsize=None)
def entry(name: str) -> EnvEntry:
    """The registry entry of environment ``name``.

    Raises: ValueError naming the valid names for an unknown one.
    """
    if name not in PACKAGES:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(registered())}")
    found = importlib.import_module(f"{__name__}.{name}").ENTRY
    if found.name != name:
        raise ValueError(f"imaginejax.envs.{name}.ENTRY names itself {found.name!r}")
    return found


def make(name: str, level: str, *, embed: Encoder | None = None, **options: Any) -> tuple[Any, Any]:
    """Builds an environment and the parameters of one task level.

    Args:
      name: registry key, e.g. ``"clevr"``.
      level: ``"train"``, ``"rephrase"``, ``"easy"`` or ``"hard"``.
      embed: the sentence encoder of the instruction table, strings -> (M, E), e.g.
        :func:`imaginejax.lang.encode_instructions` (E = 384); None: E = 0 and the observation is the
        bare state.
      **options: passed to the environment's constructor, e.g. ``backend="mujoco"`` or ``"mjx"`` for
        MuJoCo-based environments (default ``"auto"``: MJX on an accelerator, MuJoCo C on a CPU).
    Returns: ``(env, params)``.
    Raises: ValueError naming the valid choices for an unknown name or level.
    """
    found = entry(name)
    if level not in found.levels:
        raise ValueError(f"unknown level {level!r} for environment {name!r}; valid levels: "
                         f"{', '.join(found.levels)}")
    return found.env_class(**options), found.make_params(level, embed=embed)


def expert_policy(name: str, noise: float = 0.0) -> Callable:
    """The environment's expert as a collection policy ``policy(key, obs, state, params) -> actions``
    (:data:`imaginejax.data.collect.Policy`), for every task of every level.

    Args:
      name: registry key.
      noise: data diversity. Discrete environments: ε, the probability of replacing the expert's action
        by a uniformly random one. Continuous environments: the standard deviation of Gaussian noise
        added to the expert's action (clipped to the action box).

    Raises:
      ValueError: an unknown environment, or one without an expert.
    """
    found = entry(name)
    if found.expert is None:
        raise ValueError(f"environment {name!r} has no expert policy; collect data with your own policy "
                         "(imaginejax.data.collect)")
    if not noise >= 0.0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    return found.expert(float(noise))


@functools.lru_cache(maxsize=None)
def quality_rules(name: str) -> QualityRules | None:
    """What the quality report checks in environment ``name`` (built once), or None when it has no rules.

    Raises: ValueError for an unknown environment.
    """
    found = entry(name)
    return None if found.quality is None else found.quality()


@functools.lru_cache(maxsize=None)
def renderer(name: str) -> Renderer:
    """How pictures of environment ``name``'s episodes are made (built once).

    Raises: ValueError naming the environments with pictures, for an unknown one or one without.
    """
    if name not in PACKAGES or entry(name).renderer is None:
        drawn = [known for known in registered() if entry(known).renderer is not None]
        raise ValueError(f"no frames for environment {name!r}; environments with frames: {', '.join(drawn)}")
    return entry(name).renderer()


class _Levels(Mapping[str, tuple[str, ...]]):
    """name -> its levels, read from the entry (importing only the environment asked for)."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        if name not in PACKAGES:
            raise KeyError(name)
        return entry(name).levels

    def __iter__(self) -> Iterator[str]:
        return iter(registered())

    def __len__(self) -> int:
        return len(PACKAGES)


ENV_LEVELS: Mapping[str, tuple[str, ...]] = _Levels()


__all__ = ["ENV_LEVELS", "PACKAGES", "entry", "expert_policy", "make", "quality_rules", "registered",
           "renderer"]
