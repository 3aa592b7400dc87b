"""HalfCheetah: nine language-conditioned locomotion tasks on Gymnasium's HalfCheetah-v5 (BENCHMARK §2.5).

Modules: :mod:`model` (loads Gymnasium's MJCF; model constants), :mod:`backends` (one functional
physics step, MuJoCo C on the host through ``pure_callback`` or MJX inside ``jit``), :mod:`tasks` (goals,
running quantities, success / reward / legality predicates), :mod:`instructions` (phrasings per level),
:mod:`env` (the pure environment).
"""

from imaginejax.envs.cheetah.env import EnvParams, EnvState, HalfCheetah, make_params

__all__ = ["EnvParams", "EnvState", "HalfCheetah", "make_params"]
