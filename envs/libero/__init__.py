"""LIBERO-style tabletop (Panda arm, soup can, cream-cheese box, salad-dressing bottle, basket) on MuJoCo C: our own
primitive-geom MJCF (:mod:`.model`), the 44-d state, 31 tasks with predicates and shaped rewards (:mod:`.tasks`),
instructions (:mod:`.instructions`), scripted experts (:mod:`.expert`), what the quality report checks
(:mod:`.quality`), its MuJoCo scene (:mod:`.render`). See :mod:`imaginejax.envs.libero.env`."""

from imaginejax.envs.libero import quality, render, tasks
from imaginejax.envs.libero.env import Libero, make_params
from imaginejax.envs.libero.expert import expert_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="libero", levels=tasks.LEVELS, env_class=Libero, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["ENTRY", "Libero", "expert_policy", "make_params"]
