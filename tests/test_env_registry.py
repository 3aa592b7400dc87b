"""The one environment registry: every package's ENTRY is consistent with its environment, the lookups
answer from it, and instruction embeddings come from the caller's encoder (environments load none)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from imaginejax import envs
from imaginejax.envs.registry import EnvEntry, QualityRules, Renderer


@pytest.mark.parametrize("name", envs.PACKAGES)
def test_entry_agrees_with_its_environment(name):
    entry = envs.entry(name)
    assert isinstance(entry, EnvEntry) and entry.name == name
    assert entry.levels == envs.ENV_LEVELS[name] == entry.env_class.levels
    rules = envs.quality_rules(name)
    assert isinstance(rules, QualityRules) and rules.name == name
    assert rules.state_dim == entry.env_class.state_dim
    assert callable(envs.expert_policy(name, 0.0))
    assert isinstance(envs.renderer(name), Renderer)


def test_lookups_name_the_valid_choices():
    assert envs.registered() == tuple(sorted(envs.PACKAGES)) and set(envs.ENV_LEVELS) == set(envs.PACKAGES)
    for lookup in (envs.entry, envs.quality_rules, envs.expert_policy):
        with pytest.raises(ValueError, match="valid names: babyai, cheetah, clevr, libero, metaworld"):
            lookup("clevr-robot")
    with pytest.raises(ValueError, match="no frames for environment 'clevr-robot'; environments with frames: "
                                         "babyai, cheetah, clevr, libero, metaworld"):
        envs.renderer("clevr-robot")
    with pytest.raises(ValueError, match="exactly one of draw"):
        Renderer()
    with pytest.raises(ValueError, match="valid levels: train, rephrase, easy, hard"):
        envs.make("clevr", "real")
    with pytest.raises(ValueError, match="noise must be >= 0"):
        envs.expert_policy("clevr", -0.1)


def test_embeddings_come_from_the_callers_encoder():
    calls = []

    def encoder(strings):
        calls.append(list(strings))
        return np.arange(3 * len(strings), dtype=np.float32).reshape(len(strings), 3)

    env, params = envs.make("clevr", "easy", embed=encoder)
    table = list(env.instructions("easy"))
    assert calls == [table]
    np.testing.assert_array_equal(params.instruction_embeddings, np.arange(3 * len(table)).reshape(-1, 3))
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    assert obs.shape == (env.state_dim + 3,)
    np.testing.assert_array_equal(obs[env.state_dim:], params.instruction_embeddings[state.instruction])
    assert envs.make("clevr", "easy")[1].instruction_embeddings.shape == (len(table), 0)
    with pytest.raises(TypeError, match="embed=imaginejax.lang.encode_instructions"):
        envs.make("clevr", "easy", embed=True)
