"""The Gymnasium adapter (imaginejax.interop.gym_adapter): gymnasium's env checker passes for every
registered environment, the adapter replays the JAX environment's own single-environment API exactly,
the vector environment equals independent single environments and auto-resets in NEXT_STEP mode, and
``get_dataset`` serves the reference API."""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium
import jax
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from imaginejax import envs
from imaginejax.data import save_dataset
from imaginejax.data.collect import collect, random_policy
from imaginejax.interop import gym_adapter


@pytest.mark.parametrize("name", envs.registered())
@pytest.mark.parametrize("instruction", ["id", "text"])
def test_check_env_passes(name: str, instruction: str) -> None:
    env = gym_adapter.ImagineEnv(name, "hard", embed=False, instruction=instruction)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's checker reports problems as warnings: none allowed
        check_env(env, skip_render_check=True)


def test_check_env_passes_with_embeddings_through_gymnasium_make() -> None:
    env = gymnasium.make(gym_adapter.env_id("babyai", "hard"))
    assert "embedding" in env.observation_space.spaces
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=1)
    table = env.unwrapped.params.instruction_embeddings
    np.testing.assert_array_equal(obs["embedding"], np.asarray(table)[obs["instruction"]])
    assert info["instruction_text"] == env.unwrapped.instruction_table[obs["instruction"]]


@pytest.mark.parametrize("name", envs.registered())
def test_adapter_replays_the_jax_environment(name: str) -> None:
    """Same keys (PRNGKey(seed), then split before every reset/step) → the same episode as env.reset/step."""
    adapter = gym_adapter.make(name, "train", embed=False)
    jenv, params = envs.make(name, "train", embed=False)
    reset, step = jax.jit(jenv.reset), jax.jit(jenv.step)
    seed = 11
    adapter.action_space.seed(0)
    obs, _ = adapter.reset(seed=seed)
    chain, sub = jax.random.split(jax.random.PRNGKey(seed))
    ref_obs, state = reset(sub, params)
    np.testing.assert_array_equal(obs["state"], np.asarray(ref_obs))
    assert obs["instruction"] == int(state.instruction)
    for _ in range(12):
        action = adapter.action_space.sample()  # an index or a vector: generic over the contract
        obs, reward, terminated, truncated, info = adapter.step(action)
        chain, sub = jax.random.split(chain)
        ref_obs, state, ref_reward, _, ref_info = step(sub, state, jax.numpy.asarray(action), params)
        np.testing.assert_array_equal(obs["state"], np.asarray(ref_obs))
        assert reward == float(ref_reward)
        assert (terminated, truncated) == (bool(ref_info["success"]), bool(ref_info["truncated"]))
        assert info["task"] == int(state.task)
        if terminated or truncated:
            break


def test_vector_env_equals_single_envs_and_autoresets_next_step() -> None:
    """CLEVR easy episodes last one step, so every other step is an auto-reset."""
    n, seed = 5, 3
    vec = gym_adapter.make_vec("clevr", "easy", n, embed=False)
    singles = [gym_adapter.make("clevr", "easy", embed=False) for _ in range(n)]
    obs, infos = vec.reset(seed=seed)
    for i, env in enumerate(singles):
        single, info = env.reset(seed=seed + i)
        np.testing.assert_array_equal(obs["state"][i], single["state"])
        assert obs["instruction"][i] == single["instruction"] and infos["task"][i] == info["task"]
    actions = np.arange(n) * 7 % 40
    obs, reward, terminated, truncated, _ = vec.step(actions)
    for i, env in enumerate(singles):
        single, r, te, tr, _ = env.step(int(actions[i]))
        # one batched physics kernel at batch 5 vs 1: XLA may vectorise differently (last-ulp differences)
        np.testing.assert_allclose(obs["state"][i], single["state"], rtol=1e-6, atol=1e-7)
        assert (terminated[i], truncated[i]) == (te, tr)
        assert reward[i] == pytest.approx(r, abs=1e-5)
    assert (terminated | truncated).all()  # one-step episodes
    before = obs["state"].copy()
    obs, reward, terminated, truncated, infos = vec.step(actions)  # the auto-reset step: action ignored
    assert not terminated.any() and not truncated.any() and (reward == 0).all()
    assert not np.array_equal(obs["state"], before)
    obs, reward, terminated, truncated, _ = vec.step(actions)
    assert (terminated | truncated).all()
    assert vec.observation_space.contains(obs)


def test_reset_options_and_bad_input() -> None:
    env = gym_adapter.make("babyai", "easy", embed=False)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    _, info = env.reset(seed=0, options={"task": 5, "phrasing": 2})
    ids = np.asarray(env.params.phrasing_ids)[5]
    assert info["task"] == 5 and env.instruction_table.index(info["instruction_text"]) == ids[2]
    np.testing.assert_array_equal(info["goal"], np.asarray(env.params.goals)[5])
    with pytest.raises(ValueError, match="task"):
        env.reset(options={"task": 10_000})
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"level": "hard"})
    with pytest.raises(ValueError, match="action space"):
        env.step(99)
    vec = gym_adapter.make_vec("babyai", "easy", 3, embed=False)
    _, infos = vec.reset(seed=0, options={"task": [1, 2, 3]})
    np.testing.assert_array_equal(infos["task"], [1, 2, 3])


def test_get_dataset_serves_the_reference_layout(tmp_path: Path) -> None:
    env, params = envs.make("babyai", "train", embed=False)
    real = collect(env, params, random_policy(env.num_actions), jax.random.PRNGKey(0), 4, chunk_size=4,
                   progress=False)
    save_dataset(real, tmp_path / "babyai-train-real")
    adapter = gym_adapter.make("babyai", "easy", embed=False)
    with pytest.raises(FileNotFoundError, match="write_imaginary_datasets"):
        adapter.get_dataset(data_dir=tmp_path)
    ref_real, imaginary = adapter.get_dataset("real", data_dir=tmp_path)
    assert imaginary is None
    assert ref_real["observations"].shape == (4, 128, 17) and ref_real["masks"].shape == (4, 128, 1)
    np.testing.assert_array_equal(ref_real["terminals"][..., 0], real.terminals.astype(np.float32))
    ours, _ = adapter.get_dataset("train", data_dir=tmp_path, layout="imaginejax")
    np.testing.assert_array_equal(ours.states, real.states)
    with pytest.raises(FileNotFoundError):
        gym_adapter.get_dataset("clevr", "train", data_dir=tmp_path, collect_missing=False)


def test_expert_policy_registry_names_the_environments_with_experts():
    from imaginejax import envs

    for name in ("clevr", "babyai", "cheetah", "metaworld", "libero"):
        assert callable(envs.expert_policy(name, 0.1))
    with pytest.raises(ValueError, match="unknown environment 'nope'.*valid names: babyai"):
        envs.expert_policy("nope")
    with pytest.raises(ValueError, match="noise must be >= 0"):
        envs.expert_policy("clevr", -0.5)
