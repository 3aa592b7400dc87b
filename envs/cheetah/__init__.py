"""HalfCheetah: nine language-conditioned locomotion tasks on Gymnasium's HalfCheetah-v5 (BENCHMARK §2.5).

Modules: :mod:`model`, :mod:`backends` (one physics step, MuJoCo C through ``pure_callback`` or MJX),
:mod:`tasks`, :mod:`instructions`, :mod:`env`, :mod:`expert` (the shipped SAC expert), :mod:`quality`,
:mod:`render`.
"""

from imaginejax.envs.cheetah import quality, render, tasks
from imaginejax.envs.cheetah.env import EnvParams, EnvState, HalfCheetah, make_params
from imaginejax.envs.cheetah.expert import expert_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="cheetah", levels=tasks.LEVELS, env_class=HalfCheetah, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["ENTRY", "EnvParams", "EnvState", "HalfCheetah", "expert_policy", "make_params"]
