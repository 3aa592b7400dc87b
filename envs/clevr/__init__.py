"""CLEVR-Robot: five balls pushed by a point-mass robot, language-conditioned goals (BENCHMARK §2.1).

Modules: :mod:`physics` (batched plain-JAX dynamics), :mod:`tasks` (goals, goal encoding, success /
reward / legality predicates), :mod:`instructions` (phrasings per level), :mod:`env` (the pure
environment), :mod:`expert` (scripted model-predictive expert), :mod:`quality` (what the quality report
of generated rollouts checks), :mod:`render` (pictures of its states).
"""

from imaginejax.envs.clevr import quality, render, tasks
from imaginejax.envs.clevr.env import CLEVRRobot, EnvParams, EnvState, make_params
from imaginejax.envs.clevr.expert import ExpertConfig, expert_actions, expert_policy, make_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="clevr", levels=tasks.LEVELS, env_class=CLEVRRobot, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["CLEVRRobot", "ENTRY", "EnvParams", "EnvState", "ExpertConfig", "expert_actions", "expert_policy",
           "make_params", "make_policy"]
