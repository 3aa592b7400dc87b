"""The HalfCheetah expert trained by brax's SAC (``brax.training.agents.sac``) through the brax interface.

    python experiments/experts/brax_sac.py --timesteps 540000   # the budget of cheetah_sac.py
    python experiments/experts/brax_sac.py --timesteps 5400     # a timed run: warm-up and 2 × 25 vector steps

The environment is :func:`imaginejax.interop.as_brax` on the nine goals of the expert's task table
(``cheetah_sac.expert_params``), its observation replaced by the expert's features (state, running
quantities, step, goal; ``expert.state_features``) scaled as ``cheetah_sac.py`` scales them, so that an
actor trained here has the shipped actor's inputs. The hyperparameters are ``cheetah_sac.py``'s: 36
environments (4 per goal), 8 updates of 128 transitions per vector step, Adam 3e-4, γ = 0.99, τ = 0.005,
100 vector steps of warm-up. brax's agents need pure-JAX physics, so the environments run on MJX; on a
CPU that is what decides whether this replaces ``cheetah_sac.py`` (MuJoCo C). Training runs in two
epochs after the warm-up; the second one's rate is free of compilation and is extrapolated to
``cheetah_sac.py``'s budget (docs/interop.md records the measurement). The actor is brax's own network,
not the shipped actor's architecture; exporting it is left until training here is affordable.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from brax.envs.base import State
from brax.training.agents.sac import train as sac

from imaginejax.envs.cheetah.env import HalfCheetah
from imaginejax.envs.cheetah.expert import FEATURE_SCALE, state_features
from imaginejax.interop.brax_env import BraxEnv

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cheetah_sac import ExpertConfig, expert_params  # noqa: E402  (the sibling script's task table)


def _device_put_replicated(tree: object, devices: list) -> object:
    """``jax.device_put_replicated``: each leaf stacked once per device, the stack sharded over them."""
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(devices), ("d",)),
                                          jax.sharding.PartitionSpec("d"))
    return jax.tree.map(lambda x: jax.device_put(jnp.stack([x] * len(devices)), sharding), tree)


# brax's agents replicate their training state with jax.device_put_replicated, which jax no longer has.
if "device_put_replicated" not in vars(jax):
    jax.device_put_replicated = _device_put_replicated


class ExpertFeatureEnv(BraxEnv):
    """HalfCheetah on the expert's nine goals, observing the expert's scaled features (FEATURE_DIM,)."""

    def _features(self, state: State) -> State:
        batch = jax.tree.map(lambda x: x[None], state.pipeline_state)
        features = state_features(batch, self.params)[0] / jnp.asarray(FEATURE_SCALE)
        return state.replace(obs=features.astype(jnp.float32))

    def reset(self, rng: jax.Array) -> State:
        return self._features(super().reset(rng))

    def step(self, state: State, action: jax.Array) -> State:
        return self._features(super().step(state, action))

    @property
    def observation_size(self) -> int:
        return len(FEATURE_SCALE)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train the HalfCheetah expert with brax's SAC on MJX.")
    parser.add_argument("--timesteps", type=int, default=540_000, help="environment steps (cheetah_sac.py: "
                        "60 chunks × 250 vector steps × 36 environments)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = ExpertConfig()
    env = ExpertFeatureEnv(HalfCheetah(backend="mjx"), expert_params())
    epochs: list[tuple[float, dict]] = []

    def progress(step: int, metrics: dict) -> None:
        epochs.append((time.perf_counter(), dict(metrics)))
        sps = metrics.get("training/sps")
        print(f"{step} env steps: " + (f"{float(sps):.1f} env steps/s this epoch, " if sps is not None else "")
              + f"eval return {float(metrics.get('eval/episode_reward', float('nan'))):.1f}", flush=True)

    start = time.perf_counter()
    sac.train(environment=env, num_timesteps=args.timesteps, episode_length=200, num_envs=config.num_envs,
              num_eval_envs=9, learning_rate=config.actor_lr, discounting=config.gamma,
              seed=args.seed, batch_size=config.batch_size, num_evals=3, tau=config.tau,
              min_replay_size=config.warmup_steps * config.num_envs, max_replay_size=config.buffer_size,
              grad_updates_per_step=config.updates_per_step, progress_fn=progress)
    total = time.perf_counter() - start
    rates = [float(m["training/sps"]) for _, m in epochs if "training/sps" in m]
    print(f"total {total:.0f} s for {args.timesteps} env steps (compile and evaluations included)")
    if rates:
        steady = rates[-1]
        print(f"compile-free rate {steady:.1f} env steps/s ({steady / config.num_envs * config.updates_per_step:.1f} "
              f"updates/s): 540000 env steps (cheetah_sac.py's budget) ≈ {540_000 / steady / 3600:.1f} h")


if __name__ == "__main__":
    main()
