"""LIBERO-style tabletop (Panda arm, soup can, cream-cheese box, salad-dressing bottle, basket) on MuJoCo C: our own
primitive-geom MJCF (:mod:`.model`), the 44-d state, 31 tasks with predicates and shaped rewards (:mod:`.tasks`),
instructions (:mod:`.instructions`), scripted experts (:mod:`.expert`). See :mod:`imaginejax.envs.libero.env`."""

from imaginejax.envs.libero.env import Libero, make_params

__all__ = ["Libero", "make_params"]
