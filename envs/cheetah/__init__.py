"""HalfCheetah: nine language-conditioned locomotion tasks on Gymnasium's HalfCheetah-v5 (BENCHMARK §2.5).

Modules: :mod:`model` (loads Gymnasium's MJCF; model constants), :mod:`backends` (one functional
physics step, MuJoCo C on the host through ``pure_callback`` or MJX inside ``jit``), :mod:`tasks` (goals,
running quantities, success / reward / legality predicates), :mod:`instructions` (phrasings per level),
:mod:`env` (the pure environment), :mod:`expert` (the shipped SAC expert's acting), :mod:`quality` (what
the quality report of generated rollouts checks), :mod:`render` (its MuJoCo scene).
"""

from imaginejax.envs.cheetah import quality, render, tasks
from imaginejax.envs.cheetah.env import EnvParams, EnvState, HalfCheetah, make_params
from imaginejax.envs.cheetah.expert import expert_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="cheetah", levels=tasks.LEVELS, env_class=HalfCheetah, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["ENTRY", "EnvParams", "EnvState", "HalfCheetah", "expert_policy", "make_params"]
