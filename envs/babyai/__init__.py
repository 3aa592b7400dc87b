"""BabyAI: one room with a door, a ball, a box and a key; language-conditioned goals (BENCHMARK §2.3).

Modules: :mod:`grid` (the world, the 17-d state encoding, action semantics), :mod:`tasks` (goals, goal
encoding, success / reward / legality predicates), :mod:`instructions` (phrasings per level), :mod:`env`
(the pure environment), :mod:`expert` (scripted BFS-planning expert), :mod:`quality` (what the quality
report of generated rollouts checks), :mod:`render` (pictures of its states).
"""

from imaginejax.envs.babyai import quality, render, tasks
from imaginejax.envs.babyai.env import BabyAI, EnvParams, EnvState, make_params
from imaginejax.envs.babyai.expert import ExpertConfig, expert_actions, expert_policy, make_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="babyai", levels=tasks.LEVELS, env_class=BabyAI, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["BabyAI", "ENTRY", "EnvParams", "EnvState", "ExpertConfig", "expert_actions", "expert_policy",
           "make_params", "make_policy"]
