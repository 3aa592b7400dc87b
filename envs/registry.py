"""What one environment registers: :class:`EnvEntry`, and the rules it gives the imaginer's quality report.

Each environment package ``imaginejax.envs.<name>`` exposes one ``ENTRY``; ``imaginejax.envs`` lists the
packages once. An entry says how to build the environment, how its expert acts, what the quality
report checks on generated states (:class:`QualityRules`: legality by cause, projection onto the legal
set, the simulator set to a state, and the :class:`EpisodeRules` of success and reward) and how pictures
of its episodes are made (:class:`Renderer`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Final, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

StatesFn = Callable[[jax.Array], jax.Array]
SimulateFn = Callable[[jax.Array, jax.Array], jax.Array]
ViolationsFn = Callable[[jax.Array], dict[str, jax.Array]]
PredicateFn = Callable[..., jax.Array]

ILLEGAL: Final[str] = "illegal"
"""The category name used when an environment has no finer categories of illegal states."""


class EpisodeRules(NamedTuple):
    """Success and reward as functions of a per-row *carry* (running quantities of the episode).

    Attributes:
      init: ``(s0 (B, S), goal (B, G)) -> carry`` (a pytree with leading B; ``()`` when none).
      step: ``(carry, prev (B, S), action (B,) or (B, A), next (B, S), goal (B, G), t (B,) int32)
        -> (carry, success (B,) bool, reward (B,) float32)``, ``t`` = steps taken including this one.
    Both are pure and jittable, and the same objects for the same arguments: they are static arguments
    of jitted generation.
    """

    init: Callable[[jax.Array, jax.Array], Any]
    step: Callable[..., tuple[Any, jax.Array, jax.Array]]


def _no_carry(s0: jax.Array, goal: jax.Array) -> tuple[()]:
    del s0, goal
    return ()


@functools.lru_cache(maxsize=64)
def transition_rules(success: PredicateFn, reward: Callable[..., jax.Array] | None = None, *,
                     reward_uses_step: bool = False) -> EpisodeRules:
    """:class:`EpisodeRules` without carry, from ``success(prev, action, next, goal)`` and
    ``reward(prev, action, next, goal)`` (``reward_uses_step``: ``reward(..., goal, t)``; None: 0)."""

    def step(carry: tuple[()], prev: jax.Array, action: jax.Array, following: jax.Array,
             goal: jax.Array, t: jax.Array) -> tuple[tuple[()], jax.Array, jax.Array]:
        succeeded = success(prev, action, following, goal)
        if reward is None:
            value = jnp.zeros(following.shape[:-1], jnp.float32)
        elif reward_uses_step:
            value = reward(prev, action, following, goal, t)
        else:
            value = reward(prev, action, following, goal)
        return carry, succeeded, value

    return EpisodeRules(_no_carry, step)


@dataclasses.dataclass(frozen=True, eq=False)
class QualityRules:
    """What the quality report of generated rollouts checks in one environment.

    Attributes:
      name: the environment's registry name (``TrajectoryDataset.env``).
      state_dim: S.
      success: ``success(prev (..., S), action (...), next (..., S), goal (..., G)) -> (...) bool``;
        None when success needs running quantities (then ``episode`` is required).
      legal: ``legal(states (..., S)) -> (...) bool``.
      simulate: ``(states (K, S), actions (K,) or (K, A)) -> (K, S)``, the simulator set to each state
        and stepped once; None when a state vector does not determine the simulator's state (then
        ``no_simulator_reason`` says why).
      entity_size: consecutive state dimensions forming one entity (CLEVR: 2, a ball's x, y).
      error_scale: state units per 1.0 of transition error: one number or S numbers.
      error_unit: that unit in words (for tables).
      threshold: default "exceeds dynamics" threshold, in units of ``error_scale``.
      violations: ``states (..., S) -> {category: (...) bool}``, every illegal state in at least one
        category and a legal one in none; None: the one category :data:`ILLEGAL`.
      project: ``states (..., S) -> (..., S)`` onto (or towards) the legal set, used by generation.
      project_name: ``project`` in words (recorded in provenance).
      no_simulator_reason: why ``simulate`` is None.
      episode: ``max_steps -> EpisodeRules`` when success or reward need running quantities; None: the
        transition predicates.
    """

    name: str
    state_dim: int
    success: PredicateFn | None
    legal: StatesFn
    simulate: SimulateFn | None
    entity_size: int
    error_scale: float | tuple[float, ...]
    error_unit: str
    threshold: float
    violations: ViolationsFn | None = None
    project: StatesFn | None = None
    project_name: str | None = None
    no_simulator_reason: str | None = None
    episode: Callable[[int], EpisodeRules] | None = None

    def __post_init__(self) -> None:
        if self.state_dim % self.entity_size:
            raise ValueError(f"QualityRules {self.name!r}: state_dim {self.state_dim} is not a "
                             f"multiple of entity_size {self.entity_size}")
        scale = np.asarray(self.error_scale, np.float64)
        if scale.ndim > 1 or (scale.ndim == 1 and scale.shape != (self.state_dim,)):
            raise ValueError(f"QualityRules {self.name!r}: error_scale must be a number or "
                             f"{self.state_dim} numbers (one per state dimension), got shape {scale.shape}")
        if not np.all(scale > 0) or not self.threshold > 0:
            raise ValueError(f"QualityRules {self.name!r}: error_scale and threshold must be > 0")
        if self.success is None and self.episode is None:
            raise ValueError(f"QualityRules {self.name!r}: give a transition `success` predicate "
                             "or `episode` rules (success with running quantities)")
        if self.simulate is None and not self.no_simulator_reason:
            raise ValueError(f"QualityRules {self.name!r}: without simulate, give "
                             "no_simulator_reason (it is printed in the report)")

    def categories(self, states: jax.Array) -> dict[str, jax.Array]:
        """Illegal-state categories of ``states`` (..., S) -> {name: (...) bool}."""
        if self.violations is None:
            return {ILLEGAL: ~self.legal(states)}
        return self.violations(states)


@dataclasses.dataclass(frozen=True)
class Scene:
    """What MuJoCo renders for one task: the model, how a state is written into its data, the camera
    (``lookat``, distance, azimuth, elevation; ``track`` names a body the camera follows instead)."""

    model: Any
    load: Callable[[Any, Any], None]
    lookat: tuple[float, float, float] = (0.0, 0.0, 0.0)
    distance: float = 2.0
    azimuth: float = 90.0
    elevation: float = -25.0
    track: str | None = None
    seconds_per_step: float = 0.05


@dataclasses.dataclass(frozen=True)
class Renderer:
    """How pictures of an environment's episodes are made: drawn with matplotlib from state vectors
    (``draw``) or rendered by MuJoCo (``scene``); exactly one of the two is given.

    Attributes:
      draw: ``draw(ax, state (S,), action, view)`` draws one state on a matplotlib axes; ``action`` is the
        one taken from that state (None at an episode's last state).
      view: ``view(states (T+1, S)) -> view`` shared by the panels of one episode; None: ``view`` is None.
      scene: ``scene(env, params, task) -> Scene`` of one task.
    """

    draw: Callable[[Any, np.ndarray, Any, Any], None] | None = None
    view: Callable[[np.ndarray], Any] | None = None
    scene: Callable[[Any, Any, int], Scene] | None = None

    def __post_init__(self) -> None:
        if (self.draw is None) == (self.scene is None):
            raise ValueError("Renderer: give exactly one of draw (matplotlib) and scene (MuJoCo)")


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One environment of the registry (``ENTRY`` of its package).

    Attributes:
      name: registry key, e.g. ``"clevr"``.
      levels: its level names, ``tasks.LEVELS``.
      env_class: the environment's class; ``env_class(**options)`` builds it.
      make_params: ``make_params(level, *, embed) -> EnvParams`` of one level.
      expert: ``expert(noise) -> policy(key, obs, state, params) -> actions``; None without expert.
      quality: ``quality() -> QualityRules`` (built on first use); None without rules.
      renderer: ``renderer() -> Renderer`` (built on first use); None: no pictures of its episodes.
    """

    name: str
    levels: tuple[str, ...]
    env_class: Callable[..., Any]
    make_params: Callable[..., Any]
    expert: Callable[[float], Callable] | None = None
    quality: Callable[[], QualityRules] | None = None
    renderer: Callable[[], Renderer] | None = None
