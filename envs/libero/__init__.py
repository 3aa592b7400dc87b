"""LIBERO-style tabletop (Panda arm, three objects, a basket) on MuJoCo C or MJX: :mod:`.model`,
:mod:`.tasks`, :mod:`.instructions`, :mod:`.expert`, :mod:`.quality`, :mod:`.render`; see :mod:`.env`."""

from imaginejax.envs.libero import quality, render, tasks
from imaginejax.envs.libero.env import Libero, make_params
from imaginejax.envs.libero.expert import expert_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="libero", levels=tasks.LEVELS, env_class=Libero, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["ENTRY", "Libero", "expert_policy", "make_params"]
