"""``fit()`` on CLEVR-Robot: a small sweep trained from Python, its table and curves, and policies whose
actions are bitwise the engine's own ``act`` on the trained state, in memory, after save/load and when
read back from the workspace's final checkpoint."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import imaginejax
from imaginejax import Policy, algos, fit
from imaginejax.bench.config import ConfigError
from imaginejax.bench.results import load_sweep
from imaginejax.data.experts import expert_dataset
from imaginejax.training.sweep import RunSpec, Sweep

SMALL = ["train.encoder_width=32", "train.hidden=[32, 32]"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit")
    real = expert_dataset("clevr", "train", 16, 0, 0.1, root / "real", log=lambda s: None)
    results = fit(["bc", "td3bc"], env="clevr", real=[real], seeds=2, updates=100, intervals=2, batch_size=32,
                  eval_levels=["train"], eval_episodes=1, overrides=SMALL, out=root / "ws", log=lambda s: None)
    obs = np.concatenate([real.states[:, 0], real.instruction_embeddings[real.instruction_ids]], axis=1)
    return {"results": results, "workspace": root / "ws", "obs": obs.astype(np.float32), "root": root}


def _engine_actions(results, algo: str, run: int, obs: np.ndarray) -> np.ndarray:
    """The algorithm's own act (jitted) on the trained state of ``run`` with its sweep hyperparameters."""
    trained = results.trained[algo]
    record = algos.make(algo, trained.spec, trained.net, **trained.options)
    state = jax.tree.map(lambda x: np.asarray(x)[trained.row(run)], trained.states)
    row = next(r for r in results.runs if r.algo == algo and r.run == run)
    hp = Sweep((RunSpec(0, 0, row.seed, row.ratio, row.hp, row.data),)).build(record.default_hp(trained.spec)).hp
    hp = jax.tree.map(lambda x: x[0], hp)
    act = jax.jit(lambda s, o, h: record.act(s, o, jax.random.PRNGKey(0), h, True))
    return np.asarray(act(state, obs, hp))


def test_fit_gives_a_table_curves_and_every_run(trained):
    results = trained["results"]
    assert load_sweep(trained["workspace"]) == results  # the one results path: in memory == read back
    assert [(r.algo, r.seed) for r in results.runs] == [("bc", 0), ("bc", 1), ("td3bc", 0), ("td3bc", 1)]
    assert results.levels == ("train",)
    text = imaginejax.table(results)
    assert "bc, ratio 0" in text and "td3bc, ratio 0" in text
    curves = imaginejax.curves(results)
    assert {(c["group"], c["step"]) for c in curves} == {(g, s) for g in ("bc, ratio 0", "td3bc, ratio 0")
                                                         for s in (50, 100)}
    assert all(0.0 <= c["point"] <= 1.0 for c in curves)


@pytest.mark.parametrize("algo", ["bc", "td3bc"])
def test_policy_saved_and_loaded_acts_bitwise_like_the_engine(trained, algo, tmp_path):
    results, obs = trained["results"], trained["obs"]
    policy = imaginejax.Policy.from_results(results, algo=algo, seed=1)
    expected = _engine_actions(results, algo, policy.provenance["run"], obs)
    np.testing.assert_array_equal(policy.predict(obs), expected)
    policy.save(tmp_path / "policy")
    loaded = Policy.load(tmp_path / "policy")
    actions = loaded.predict(obs)
    assert actions.dtype == expected.dtype == np.int32
    np.testing.assert_array_equal(actions, expected)
    # Only what act reads is stored: the acting network (and TD3+BC's state normaliser), never the critics
    # or the optimiser.
    names = set(loaded.tensors)
    assert not any("opt" in n or "critic" in n for n in names)
    assert any(n.startswith("state.stats") for n in names) == (algo == "td3bc")
    # The runs of another seed act differently: the policy is that run's, not any run's.
    other = _engine_actions(results, algo, imaginejax.Policy.from_results(results, algo=algo, seed=0).provenance["run"], obs)
    assert not np.array_equal(other, expected)


def test_workspace_policy_from_the_final_checkpoint_equals_the_in_memory_one(trained):
    from_disk = imaginejax.Policy.from_results(load_sweep(trained["workspace"]), algo="td3bc", seed=0)
    in_memory = imaginejax.Policy.from_results(trained["results"], algo="td3bc", seed=0)
    assert "step-00000002" in from_disk.provenance["source"] and in_memory.provenance["source"] == "memory"
    assert sorted(from_disk.tensors) == sorted(in_memory.tensors)
    for name, value in in_memory.tensors.items():
        np.testing.assert_array_equal(from_disk.tensors[name], value, err_msg=name)


def test_act_embeds_the_instruction_with_the_recorded_encoder(trained):
    policy = imaginejax.Policy.from_results(trained["results"], algo="bc", seed=0)
    real_dir = trained["root"] / "real"
    from imaginejax.data import load_dataset

    real = load_dataset(real_dir)
    texts = [real.instructions[int(i)] for i in real.instruction_ids[:4]]
    states = real.states[:4, 0]
    np.testing.assert_array_equal(policy.act(states, texts), policy.predict(trained["obs"][:4]))
    assert policy.act(states[0], texts[0]) == policy.predict(trained["obs"][:1])[0]


def test_a_run_must_be_named_when_several_match(trained):
    with pytest.raises(ValueError, match=r"2 runs match \(algo='bc'\).*seed=0.*seed=1"):
        imaginejax.Policy.from_results(trained["results"], algo="bc")
    with pytest.raises(ValueError, match=r"0 runs match \(algo='bc', seed=7\)"):
        imaginejax.Policy.from_results(trained["results"], algo="bc", seed=7)


@pytest.mark.parametrize("kwargs,match", [
    ({"algo": "nope"}, r"fit\(\): algo \(train\.algos\): unknown algorithm 'nope'; registered: .*bc"),
    ({"env": "nowhere"}, r"fit\(\): env \(data\.env\): unknown environment 'nowhere'; valid: .*clevr"),
    ({"updates": 10, "intervals": 4}, r"updates \(train\.updates\) \(10\) must be a multiple of intervals"),
    ({"eval_levels": ["hardest"]}, r"eval_levels \(train\.eval_levels\): 'hardest' is not a level of clevr"),
    ({"seeds": 0}, r"seeds \(train\.seeds\) must be >= 1"),
    ({"real": ["/no/such/dataset"]}, r"real: /no/such/dataset is not a dataset directory"),
    ({"hp": {"cql": {"alpha": 2}}}, r"fit\(\): hp has tables for 'cql', which algo=\['bc'\] does not train"),
    ({"hp": {"cqll": {"alpha": 2}}}, r"hp\['cqll'\] is a table but 'cqll' is not an algorithm; did you mean 'cql'\?"),
    ({"algo": "cql", "hp": {"alpah": 2}}, r"fit\(\): hp of cql: 'alpah' is not a hyperparameter of this algorithm; "
                                          r"did you mean 'alpha'\?"),
    ({"algo": ["bc", "cql"], "hp": {"cql": {"alpha": 2}, "learning_rate": 1e-3}}, r"hp mixes algorithm tables"),
    ({"overrides": "train.updates=8"}, r"overrides is one string 'train\.updates=8': give a list"),
    ({"overrides": {"train.hidden": [0]}}, r"train\.hidden widths must be >= 1"),
])
def test_fit_errors_name_the_argument_and_the_fix(kwargs, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        fit(**{"real": [], **kwargs, "out": tmp_path / "ws"})
