"""BabyAI: one room with a door, a ball, a box and a key; language-conditioned goals (BENCHMARK §2.3).

Modules: :mod:`grid` (the world, the 17-d state encoding, action semantics), :mod:`tasks` (goals, goal
encoding, success / reward / legality predicates), :mod:`instructions` (phrasings per level), :mod:`env`
(the pure environment), :mod:`expert` (scripted BFS-planning expert).
"""

from imaginejax.envs.babyai.env import BabyAI, EnvParams, EnvState, make_params
from imaginejax.envs.babyai.expert import ExpertConfig, expert_actions, make_policy

__all__ = ["BabyAI", "EnvParams", "EnvState", "ExpertConfig", "expert_actions", "make_params", "make_policy"]
