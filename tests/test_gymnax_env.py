"""The registry's environments as gymnax environments (imaginejax.interop.gymnax_env): gymnax's base class,
spaces, auto-reset and wrappers on our kernels, the default MiniLM observation, the install route of gymnax
(its pin, the extra, the error without it), and a purejaxrl-style PPO loop through them
(experiments/experts/ppo_gymnax.py)."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import environment, spaces
from gymnax.wrappers import FlattenObservationWrapper, LogWrapper
from packaging.requirements import Requirement

from imaginejax import envs
from imaginejax.interop import as_gymnax
from imaginejax.interop.gymnax_env import GYMNAX_VERSION, INSTALL_GYMNAX
from imaginejax.lang import EMBED_DIM, encode_instructions
from imaginejax.training.progress import MissingDependency

ROOT = Path(__file__).resolve().parents[1]
PPO_FILE = ROOT / "experiments" / "experts" / "ppo_gymnax.py"


@functools.lru_cache(maxsize=None)
def _ppo():
    spec = importlib.util.spec_from_file_location("ppo_gymnax", PPO_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # flax dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _one_hot(strings: list[str]) -> np.ndarray:
    return np.eye(len(strings), dtype=np.float32)


@pytest.mark.parametrize("name", ["clevr", "babyai"])
def test_a_gymnax_environment_with_gymnax_spaces(name: str) -> None:
    env, params = as_gymnax(name, "train", embed=_one_hot)
    ours, table = envs.make(name, "train", embed=_one_hot)
    assert isinstance(env, environment.Environment)
    assert isinstance(params, environment.EnvParams) and params.max_steps_in_episode == table.max_steps
    action_space, obs_space = env.action_space(params), env.observation_space(params)
    assert isinstance(action_space, spaces.Discrete) and action_space.n == ours.num_actions == env.num_actions
    assert isinstance(obs_space, spaces.Box) and obs_space.shape == (ours.state_dim + table.embed_dim,)
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    assert obs_space.contains(obs)
    # The embedding part of the observation is the one-hot row of the state's instruction.
    np.testing.assert_array_equal(obs[ours.state_dim:], np.eye(table.embed_dim)[int(state.instruction)])


@pytest.fixture(scope="module")
def clevr_default() -> tuple:
    """CLEVR's train level as a user gets it, with as_gymnax's default instruction embedding."""
    return as_gymnax("clevr", "train")


def test_default_observation_is_the_state_and_the_minilm_embedding_of_its_instruction(clevr_default) -> None:
    """The observation our datasets and policies use: (S + 384,), what envs.make with the MiniLM encoder gives;
    embed=None is the bare state."""
    env, params = clevr_default
    ours, table = envs.make("clevr", "train", embed=encode_instructions)
    assert env.observation_space(params).shape == (ours.state_dim + EMBED_DIM,)
    np.testing.assert_array_equal(params.table.instruction_embeddings, table.instruction_embeddings)
    key = jax.random.PRNGKey(0)
    obs, state = env.reset(key, params)
    assert obs.shape == (ours.state_dim + EMBED_DIM,)
    np.testing.assert_array_equal(obs, jax.jit(ours.reset)(key, table)[0])
    np.testing.assert_array_equal(obs[ours.state_dim:], table.instruction_embeddings[int(state.instruction)])
    bare, bare_params = as_gymnax("clevr", "train", embed=None)
    assert bare.observation_space(bare_params).shape == (ours.state_dim,)


@pytest.mark.parametrize("missing", ["gymnax", "seaborn"])
def test_without_gymnax_as_gymnax_names_the_two_step_install(monkeypatch: pytest.MonkeyPatch, missing: str) -> None:
    """gymnax, or a package it imports, not installed (a finder in front of the others answers for it as an
    absent package does): importing or reaching as_gymnax raises MissingDependency with the command and
    why gymnax goes without its dependencies."""

    class Uninstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: object, target: object = None) -> None:
            if fullname == missing:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None

    for name in [m for m in sys.modules if m.partition(".")[0] in ("gymnax", missing)]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "imaginejax.interop.gymnax_env")
    monkeypatch.setattr(sys, "meta_path", [Uninstalled(), *sys.meta_path])
    with pytest.raises(MissingDependency) as error:
        importlib.import_module("imaginejax.interop.gymnax_env")
    message = str(error.value)
    assert f"missing: {missing!r}" in message and INSTALL_GYMNAX in message
    assert "--no-deps because" in message and "caps jax below 0.12" in message
    assert INSTALL_GYMNAX == f'pip install "imaginejax[gymnax]" && pip install --no-deps gymnax=={GYMNAX_VERSION}'
    with pytest.raises(MissingDependency, match=re.escape(INSTALL_GYMNAX)):
        importlib.import_module("imaginejax.interop").as_gymnax


def test_the_gymnax_pin_is_one_version() -> None:
    """The module's pin (its error names it), the Makefile's --no-deps install, the docs' commands and the
    gymnax these tests run on agree."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.findall(r"pip install .*--no-deps gymnax==(\S+)", makefile) == [GYMNAX_VERSION]
    for doc in ("README.md", "docs/install.md", "docs/interop.md"):
        pins = set(re.findall(r"gymnax==([0-9][0-9.]*[0-9])", (ROOT / doc).read_text()))
        assert pins == {GYMNAX_VERSION}, (doc, pins)
    assert importlib.metadata.version("gymnax") == GYMNAX_VERSION


def test_the_gymnax_extra_holds_what_gymnax_imports_and_nothing_caps_jax() -> None:
    """pip install "imaginejax[gymnax]" cannot downgrade jax: no extra holds gymnax itself (whose metadata
    caps jax), the gymnax extra and our dependencies cover gymnax's own runtime requirements, and no
    requirement of ours puts an upper bound on jax."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = [Requirement(r) for r in project["dependencies"]]
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}
    assert all(r.name != "gymnax" for reqs in extras.values() for r in reqs)
    gymnax_extra = {r.name for r in extras["gymnax"]}
    declared = [Requirement(r) for r in importlib.metadata.requires("gymnax")]
    runtime = {r.name for r in declared if r.marker is None or r.marker.evaluate({"extra": ""})}
    assert runtime - {r.name for r in ours} <= gymnax_extra, runtime
    assert "six" in gymnax_extra  # imported when gymnax loads (gymnax.utils), not declared by gymnax
    for requirement in [*ours, *(r for reqs in extras.values() for r in reqs)]:
        if requirement.name in ("jax", "jaxlib"):
            caps = [s for s in requirement.specifier if s.operator in ("<", "<=", "==", "===", "~=")]
            assert not caps, requirement


def test_docs_gymnax_and_brax_snippet_runs_as_written() -> None:
    """The example of docs/interop.md's "Both in one example" section (the README's quickstart links it),
    executed verbatim."""
    doc = (ROOT / "docs" / "interop.md").read_text()
    section = doc[doc.index("## Both in one example"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "docs/interop.md (Both in one example)", "exec"), scope)
    assert scope["obs"].shape == (scope["env"].env.state_dim + EMBED_DIM,)


def test_step_is_the_environments_step_until_an_episode_ends_then_a_fresh_one() -> None:
    """On BabyAI (the auto-reset is the same code for every environment; CLEVR's episodes are checked
    through LogWrapper below)."""
    name = "babyai"
    env, params = as_gymnax(name, "train", embed=None)
    ours, table = envs.make(name, "train")
    reset, step = jax.jit(ours.reset), jax.jit(ours.step)
    key = jax.random.PRNGKey(3)
    obs, state = env.reset(key, params)
    np.testing.assert_array_equal(obs, reset(key, table)[0])
    # gymnax splits the step key into (step, reset) keys; the step is ours with the first.
    step_key, reset_key = jax.random.split(jax.random.PRNGKey(4))
    want_obs, want_state, want_reward, _, _ = step(step_key, state, 1, table)
    got_obs, got_state, reward, terminated, truncated, info = env.step(jax.random.PRNGKey(4), state, 1, params)
    np.testing.assert_array_equal(got_obs, want_obs)
    assert float(reward) == float(want_reward) and int(got_state.t) == 1
    assert not bool(terminated) and not bool(truncated)
    # One step before the cap: the step truncates, the episode is replaced by reset_env(reset key) and the
    # observation that ended it is info["final_observation"].
    last = state.replace(t=jnp.asarray(table.max_steps - 1, jnp.int32))
    final_obs, final_state, _, _, _ = step(step_key, last, 1, table)
    got_obs, got_state, _, terminated, truncated, info = env.step(jax.random.PRNGKey(4), last, 1, params)
    succeeded = bool(final_state.success)
    assert bool(truncated) == (not succeeded) and bool(terminated) == succeeded
    np.testing.assert_array_equal(info["final_observation"], final_obs)
    np.testing.assert_array_equal(got_obs, reset(reset_key, table)[0])
    assert int(got_state.t) == 0 and not bool(got_state.done)


def test_continuous_cheetah_under_vmap_is_the_batched_kernel() -> None:
    """A continuous environment on MuJoCo C (a host callback, vmappable): gymnax's Box action space, and
    the vmapped reset and step equal the environment's batched kernels on the same keys."""
    env, params = as_gymnax("cheetah", "train", embed=None, backend="mujoco")
    ours, table = envs.make("cheetah", "train", backend="mujoco")
    space = env.action_space(params)
    assert isinstance(space, spaces.Box) and space.shape == (6,) and (space.low, space.high) == (-1.0, 1.0)
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    obs, state = jax.vmap(env.reset, (0, None))(keys, params)
    want_obs, want_state = ours.reset_batch(keys, table)
    np.testing.assert_array_equal(obs, want_obs)
    action = jnp.full((2, 6), 0.3)
    obs, state, reward, _, _, _ = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))(keys, state, action, params)
    step_keys = jax.vmap(lambda k: jax.random.split(k)[0])(keys)
    want_obs, _, want_reward, _, _ = ours.step_batch(step_keys, want_state, action, table)
    np.testing.assert_allclose(obs, want_obs, atol=1e-6)
    np.testing.assert_allclose(reward, want_reward, atol=1e-6)


def test_gymnax_wrappers_and_vmap_log_the_episodes_rewards(clevr_default) -> None:
    """LogWrapper's episode returns equal the rewards summed by hand between the episode ends."""
    env, params = clevr_default
    wrapped = LogWrapper(FlattenObservationWrapper(env))
    batch, steps = 4, 120
    _, state = jax.vmap(wrapped.reset, (0, None))(jax.random.split(jax.random.PRNGKey(0), batch), params)

    def body(state, key):
        act_key, step_key = jax.random.split(key)
        action = jax.random.randint(act_key, (batch,), 0, env.num_actions)
        _, state, reward, terminated, truncated, info = jax.vmap(wrapped.step, (0, 0, 0, None))(
            jax.random.split(step_key, batch), state, action, params)
        return state, (reward, terminated | truncated, info["returned_episode"], info["returned_episode_returns"])

    _, (reward, done, ended, returned) = jax.lax.scan(body, state, jax.random.split(jax.random.PRNGKey(1), steps))
    reward, done, ended, returned = map(np.asarray, (reward, done, ended, returned))
    np.testing.assert_array_equal(done, ended)
    assert done.sum() >= batch  # 120 steps hold at least two 50-step episodes per row
    for row in range(batch):
        start = 0
        for t in np.flatnonzero(done[:, row]):
            np.testing.assert_allclose(returned[t, row], reward[start:t + 1, row].sum(), rtol=1e-5, atol=1e-5)
            start = t + 1


def test_gae_matches_a_hand_computed_case() -> None:
    ppo = _ppo()
    # Two steps, one row: r = (1, 2), V = (0.5, 1.0), bootstrap V = 3, no episode end; γ = 0.5, λ = 0.5:
    # δ1 = 2 + 1.5 - 1 = 2.5, Â1 = 2.5; δ0 = 1 + 0.5 - 0.5 = 1, Â0 = 1 + 0.25 · 2.5 = 1.625.
    traj = ppo.Transition(done=jnp.zeros((2, 1)), action=jnp.zeros((2, 1), jnp.int32),
                          value=jnp.array([[0.5], [1.0]]), reward=jnp.array([[1.0], [2.0]]),
                          log_prob=jnp.zeros((2, 1)), obs=jnp.zeros((2, 1, 1)), info={})
    advantages, targets = ppo.gae(traj, jnp.array([3.0]), 0.5, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [1.625, 2.5])
    np.testing.assert_allclose(targets[:, 0], [2.125, 3.5])
    # An episode end at step 0 cuts the bootstrap: Â0 = δ0 = 1 - 0.5.
    advantages, _ = ppo.gae(traj._replace(done=jnp.array([[1.0], [0.0]])), jnp.array([3.0]), 0.5, 0.5)
    np.testing.assert_allclose(advantages[:, 0], [0.5, 2.5])


@pytest.mark.parametrize("name", ["clevr", "babyai"])
def test_ppo_loop_through_gymnax_runs_and_updates(name: str) -> None:
    ppo = _ppo()
    config = {**ppo.CONFIG, "ENV": name, "EMBED": None, "NUM_ENVS": 8, "NUM_STEPS": 64, "NUM_UPDATES": 2,
              "UPDATE_EPOCHS": 1, "NUM_MINIBATCHES": 2, "HIDDEN": 32}
    train, env, params = ppo.make_train(config)
    out = jax.jit(train)(jax.random.PRNGKey(0))
    metrics = jax.tree.map(np.asarray, out["metrics"])
    assert metrics["success"].shape == metrics["loss"].shape == (2,)
    assert np.isfinite(metrics["loss"]).all() and ((metrics["success"] >= 0) & (metrics["success"] <= 1)).all()
    # CLEVR's 50-step and BabyAI's 128-step caps: 2 × 64 steps of 8 rows end at least 8 episodes.
    assert metrics["episodes"].sum() >= 8
    trained = out["runner_state"][0]  # updates × epochs × minibatches gradient steps
    assert int(trained.step) == 2 * 1 * 2 and env.observation_space(params).shape == (env.env.state_dim,)


def test_ppo_learns_clevr_train_level_above_the_random_policy() -> None:
    """The learning run of docs/figures/ppo_gymnax_clevr.png, shortened: 60 updates of 64 × 64 steps."""
    ppo = _ppo()
    config = {**ppo.CONFIG, "NUM_UPDATES": 60}
    train, _, _ = ppo.make_train(config)
    out = jax.jit(train)(jax.random.PRNGKey(0))
    trained, random = ppo.success_rates(config, out["runner_state"][0].params, jax.random.PRNGKey(1), 800)
    assert trained > random + 0.1, (trained, random)
