"""Meta-World (Sawyer arm) on MuJoCo C or MJX: scenes from the metaworld package, the 91-d entity-slot
state, Meta-World's success predicates and dense rewards in JAX. See :mod:`imaginejax.envs.metaworld.env`."""

from imaginejax.envs.metaworld import quality, render, tasks
from imaginejax.envs.metaworld.env import MetaWorld, make_params
from imaginejax.envs.metaworld.expert import expert_policy
from imaginejax.envs.registry import EnvEntry

ENTRY = EnvEntry(name="metaworld", levels=tasks.LEVELS, env_class=MetaWorld, make_params=make_params,
                 expert=expert_policy, quality=quality.quality_rules, renderer=render.renderer)

__all__ = ["ENTRY", "MetaWorld", "expert_policy", "make_params"]
