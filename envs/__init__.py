"""Environments and their registry.

``env, params = make(name, level, embed=True)`` returns a stateless environment object and the pytree of
the level's task table (see ARCHITECTURE.md, "Contracts: Environment").
"""

from __future__ import annotations

from typing import Any, Callable

ENV_LEVELS: dict[str, tuple[str, ...]] = {
    "clevr": ("train", "rephrase", "easy", "hard"),
    "babyai": ("train", "rephrase", "easy", "hard"),
    "cheetah": ("train", "rephrase", "easy", "hard"),
    "metaworld": ("train", "rephrase", "easy", "hard"),
    "libero": ("train", "rephrase", "easy", "hard"),
}


def _make_clevr(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.clevr.env import CLEVRRobot, make_params

    return CLEVRRobot(**options), make_params(level, embed=embed)


def _make_babyai(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.babyai.env import BabyAI, make_params

    return BabyAI(**options), make_params(level, embed=embed)


def _make_cheetah(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.cheetah.env import HalfCheetah, make_params

    return HalfCheetah(**options), make_params(level, embed=embed)


def _make_metaworld(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.metaworld.env import MetaWorld, make_params

    return MetaWorld(**options), make_params(level, embed=embed)


def _make_libero(level: str, embed: bool, **options: Any) -> tuple[Any, Any]:
    from imaginejax.envs.libero.env import Libero, make_params

    return Libero(**options), make_params(level, embed=embed)


_FACTORIES: dict[str, Callable[..., tuple[Any, Any]]] = {
    "clevr": _make_clevr, "babyai": _make_babyai, "cheetah": _make_cheetah, "metaworld": _make_metaworld,
    "libero": _make_libero}


def registered() -> tuple[str, ...]:
    """Names accepted by :func:`make`."""
    return tuple(sorted(_FACTORIES))


def make(name: str, level: str, *, embed: bool = True, **options: Any) -> tuple[Any, Any]:
    """Builds an environment and the parameters of one task level.

    Args:
      name: registry key, e.g. ``"clevr"``.
      level: ``"train"``, ``"rephrase"``, ``"easy"`` or ``"hard"``.
      embed: embed the instruction table with the sentence encoder (E = 384); with False, E = 0 and the
        observation is the bare state.
      **options: passed to the environment's constructor, e.g. ``backend="mujoco"`` or ``"mjx"`` for
        MuJoCo-based environments (default ``"auto"``: MJX on an accelerator, MuJoCo C on a CPU).
    Returns: ``(env, params)``.
    Raises: ValueError naming the valid choices for an unknown name or level.
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(registered())}")
    levels = ENV_LEVELS[name]
    if level not in levels:
        raise ValueError(f"unknown level {level!r} for environment {name!r}; valid levels: {', '.join(levels)}")
    return _FACTORIES[name](level, embed, **options)


def _clevr_expert(noise: float) -> Callable:
    from imaginejax.envs.clevr.expert import ExpertConfig, make_policy

    return make_policy(ExpertConfig(epsilon=noise))


def _babyai_expert(noise: float) -> Callable:
    from imaginejax.envs.babyai.expert import ExpertConfig, make_policy

    return make_policy(ExpertConfig(epsilon=noise))


def _cheetah_expert(noise: float) -> Callable:
    from imaginejax.envs.cheetah.expert import expert_policy as cheetah_expert

    return cheetah_expert(noise)


def _metaworld_expert(noise: float) -> Callable:
    from imaginejax.envs.metaworld.expert import expert_policy as metaworld_expert

    return metaworld_expert(noise)


def _libero_expert(noise: float) -> Callable:
    from imaginejax.envs.libero.expert import expert_policy as libero_expert

    return libero_expert(noise)


# name -> factory(noise) of the environment's expert collection policy.
_EXPERTS: dict[str, Callable[[float], Callable]] = {
    "clevr": _clevr_expert, "babyai": _babyai_expert, "cheetah": _cheetah_expert, "metaworld": _metaworld_expert,
    "libero": _libero_expert}


def expert_policy(name: str, noise: float = 0.0) -> Callable:
    """The environment's expert as a collection policy ``policy(key, obs, state, params) -> actions``
    (:data:`imaginejax.data.collect.Policy`), for every task of every level.

    Args:
      name: registry key.
      noise: data diversity. Discrete environments: ε, the probability of replacing the expert's action
        by a uniformly random one. Continuous environments: the standard deviation of Gaussian noise
        added to the expert's action (clipped to the action box).

    Raises:
      ValueError: an unknown environment, or one without an expert (naming those that have one).
    """
    if name not in _FACTORIES:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(registered())}")
    if name not in _EXPERTS:
        raise ValueError(f"environment {name!r} has no expert policy (experts: {', '.join(sorted(_EXPERTS))}); "
                         "collect data with your own policy (imaginejax.data.collect)")
    if not noise >= 0.0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    return _EXPERTS[name](float(noise))


__all__ = ["ENV_LEVELS", "expert_policy", "make", "registered"]
