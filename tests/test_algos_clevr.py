"""Every discrete algorithm of the registry learns CLEVR-Robot's train level from expert data.

600 scripted-expert trajectories (ε = 0.1) of the 80 training goals; two seeds per algorithm in one
compiled call, 3,000 updates at batch 128 with a small network, evaluated on 200 episodes per seed.
A uniformly random policy succeeds on ≈ 18 % of the train goals (measured here with the same
evaluation); each algorithm must reach clearly more. The learning rates and target-update settings are
CI-sized (the reference's lr 6.25e-5 with a hard target copy every 8,000 updates needs far more
updates than a test can afford); the algorithms' defaults stay the reference's.

The test is parametrised over ``algos.registered(discrete=True)``: an algorithm added to the registry
is tested here without editing this file (give it CI-sized overrides below if its defaults are slow).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax import algos, envs
from imaginejax.algos.base import Spec
from imaginejax.algos.combo import ComboConfig
from imaginejax.algos.combo_discrete import make_combo_discrete
from imaginejax.algos.networks import NetConfig
from imaginejax.bench.workspace import random_policy_success
from imaginejax.data import to_transitions
from imaginejax.data.experts import cached_expert_data
from imaginejax.lang import encode_instructions
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train

NET = NetConfig(encoder_width=128, hidden=(128,))
SEEDS = 2
EPISODES = 200

# CI-sized overrides of the default hyperparameters (only fields an algorithm has are applied).
FAST = {"learning_rate": 1e-3, "critic_learning_rate": 1e-3, "actor_learning_rate": 1e-3,
        "target_update_interval": 1, "target_tau": 0.005}
PER_ALGORITHM = {"cql": {"alpha": 1.0}, "combo": {"beta": 0.5, "model_warmup": 1000}}
# COMBO's model buffer at the reference size (250k rows per run) is more than a test needs.
SMALL_COMBO = ComboConfig(rollout_batch=5000, rollout_interval=1000)


def _build(name: str, spec: Spec):
    if name == "combo":
        return make_combo_discrete(spec, NET, SMALL_COMBO)
    return algos.make(name, spec, NET)


@pytest.fixture(scope="module")
def clevr(tmp_path_factory):
    env, params = envs.make("clevr", "train", embed=encode_instructions)
    spec = Spec(state_dim=env.state_dim, embed_dim=int(params.instruction_embeddings.shape[1]),
                discrete=True, action_dim=env.num_actions)
    real = cached_expert_data("clevr", "train", 600, 0, 0.1, tmp_path_factory.mktemp("clevr-data"))
    random = random_policy_success({"train": (env, params)}, spec, {"train": SEEDS * EPISODES})["train"]
    return env, params, spec, to_transitions(real), random


def _ci_hyperparams(name: str, hp):
    overrides = {**FAST, **PER_ALGORITHM.get(name, {})}
    fields = {k: v for k, v in overrides.items() if hasattr(hp, k)}
    return hp.replace(**{k: jnp.asarray(v, jnp.asarray(getattr(hp, k)).dtype) for k, v in fields.items()})


@pytest.mark.parametrize("name", algos.registered(discrete=True))
def test_discrete_algorithm_learns_clevr_train_level(clevr, name):
    env, params, spec, real, random_rate = clevr
    assert 0.1 < random_rate < 0.25, random_rate  # the baseline itself is what we think it is
    algo = _build(name, spec)
    config = EngineConfig(batch_size=128, updates_per_interval=1500, num_intervals=2, eval_episodes=EPISODES)
    trainer = make_train(algo, spec, config, {"train": (env, params)})
    hp = broadcast_runs(_ci_hyperparams(name, algo.default_hp(spec)), SEEDS)
    result = trainer.train(jax.random.split(jax.random.PRNGKey(0), SEEDS), hp, real, log=None)
    final = np.asarray(result.success["train"][-1])
    assert final.mean() > random_rate + 0.12, (name, final, random_rate)
