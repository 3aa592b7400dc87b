"""CLEVR-Robot: five balls pushed by a point-mass robot, language-conditioned goals (BENCHMARK §2.1).

Modules: :mod:`physics` (batched plain-JAX dynamics), :mod:`tasks` (goals, goal encoding, success /
reward / legality predicates), :mod:`instructions` (phrasings per level), :mod:`env` (the pure
environment), :mod:`expert` (scripted model-predictive expert).
"""

from imaginejax.envs.clevr.env import CLEVRRobot, EnvParams, EnvState, make_params
from imaginejax.envs.clevr.expert import ExpertConfig, expert_actions, make_policy

__all__ = ["CLEVRRobot", "EnvParams", "EnvState", "ExpertConfig", "expert_actions", "make_params", "make_policy"]
