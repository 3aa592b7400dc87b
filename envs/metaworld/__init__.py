"""Meta-World (Sawyer arm) on MuJoCo C or MJX: scenes from the metaworld package, the 91-d entity-slot
state, Meta-World's success predicates and dense rewards in JAX. See :mod:`imaginejax.envs.metaworld.env`."""

from imaginejax.envs.metaworld.env import MetaWorld, make_params

__all__ = ["MetaWorld", "make_params"]
