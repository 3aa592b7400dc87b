"""A policy taken away: ``imaginejax export`` / ``evaluate`` from the command line, the same episodes
in the Gymnasium adapter and in the jitted evaluation, and damaged or mismatched files refused."""

from __future__ import annotations

import hashlib
import json
import shutil

import jax
import numpy as np
import pytest
import safetensors.numpy

from imaginejax import Policy, envs, fit
from imaginejax.bench.policy import PolicyError, evaluate_gym
from imaginejax.cli import main
from imaginejax.data.experts import expert_dataset
from imaginejax.training.evaluation import evaluate


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A BC workspace trained by fit() and its seed-0 run exported by the command line."""
    root = tmp_path_factory.mktemp("policy")
    real = expert_dataset("clevr", "train", 16, 0, 0.1, root / "real", log=lambda s: None)
    fit("bc", env="clevr", real=[real], seeds=2, updates=100, intervals=1, batch_size=32, eval_levels=["train"],
        eval_episodes=1, overrides=["train.encoder_width=32", "train.hidden=[32, 32]"], out=root / "ws",
        log=lambda s: None)
    status = main(["export", str(root / "ws"), "--algo", "bc", "--seed", "0", "--out", str(root / "policy")])
    assert status == 0
    return root


def test_export_and_evaluate_round_trip(exported, capsys):
    policy = Policy.load(exported / "policy")
    assert policy.algo == "bc" and policy.env == "clevr" and policy.provenance["seed"] == 0
    assert policy.spec.obs_dim == 10 + 384 and policy.encoder["model"] == "all-MiniLM-L6-v2"
    capsys.readouterr()
    assert main(["evaluate", str(exported / "policy"), "--env", "clevr", "--level", "easy", "--episodes", "20"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    env, params = envs.make("clevr", "easy")
    assert len(lines) == int(params.num_tasks) + 1  # one line per task, then the level
    per_task = np.asarray([float(line.rsplit(None, 1)[1].rstrip("%")) for line in lines[:-1]])
    result = policy.evaluate("easy", 20)
    np.testing.assert_allclose(per_task, 100 * np.asarray(result.task_success), atol=0.05)
    assert lines[-1].startswith(f"clevr/easy: success {100 * float(result.success_rate):.1f}% over 20 episodes")
    # Another environment or level is refused with the fix.
    assert main(["evaluate", str(exported / "policy"), "--env", "babyai"]) == 2
    assert "trained on clevr; evaluate it with --env clevr" in capsys.readouterr().err
    assert main(["evaluate", str(exported / "policy"), "--level", "hardest"]) == 2
    assert "unknown level 'hardest'" in capsys.readouterr().err


def test_evaluate_writes_frames_of_a_few_episodes(exported, capsys):
    out = exported / "frames"
    assert main(["evaluate", str(exported / "policy"), "--level", "easy", "--episodes", "20", "--frames", str(out),
                 "--frame-episodes", "3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"{out}: frames.png (3 episodes, ") and (out / "frames.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.iterdir()) == ["frames.png"]  # CLEVR is drawn, no video
    assert main(["evaluate", str(exported / "policy"), "--frames", str(out), "--frame-episodes", "0"]) == 2
    assert "--frame-episodes must be >= 1, got 0" in capsys.readouterr().err


class _AdapterResets:
    """The JAX environment with the initial states of the Gymnasium vector environment reset with
    ``seed``: row i's reset key there is split(PRNGKey(seed + i))[1] (its documented key chain), while
    :func:`evaluate` splits one key. CLEVR's step ignores its key, so the episodes are then the same."""

    def __init__(self, env, seed: int, episodes: int):
        self.env = env
        keys = jax.vmap(jax.random.PRNGKey)(seed + np.arange(episodes, dtype=np.uint32))
        self.keys = jax.vmap(jax.random.split)(keys)[:, 1]

    def reset_to_task_batch(self, keys, params, tasks):
        return self.env.reset_to_task_batch(self.keys, params, tasks)

    def step_batch(self, keys, state, action, params):
        return self.env.step_batch(keys, state, action, params)


def test_gymnasium_episodes_succeed_exactly_as_in_the_jitted_evaluation(exported):
    policy = Policy.load(exported / "policy")
    seed, level = 5, "easy"
    gym = evaluate_gym(policy, level, 20, seed=seed)
    env, params = policy.environment(level)
    same = _AdapterResets(env, seed, len(gym.success))
    result = jax.jit(lambda k: evaluate(policy.policy_fn(), same, params, k, 20))(jax.random.PRNGKey(0))
    np.testing.assert_array_equal(gym.task_success, np.asarray(result.task_success))
    assert gym.success_rate == pytest.approx(float(result.success_rate))
    assert 0 < gym.success.sum() < len(gym.success)  # neither all nor nothing: a comparison that can fail


def _copy(exported, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(exported / "policy", target)
    return target


def _rewrite(directory, tensors=None, **record_changes):
    """New tensors and/or record fields, with a matching checksum (a consistent but wrong policy)."""
    record = json.loads((directory / "policy.json").read_text())
    if tensors is not None:
        data = safetensors.numpy.save(tensors)
        (directory / "policy.safetensors").write_bytes(data)
        record["sha256"] = hashlib.sha256(data).hexdigest()
        record["tensors"] = {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in tensors.items()}
    record.update(record_changes)
    (directory / "policy.json").write_text(json.dumps(record))


def test_damaged_or_mismatched_policies_are_refused(exported, tmp_path):
    good = Policy.load(exported / "policy")

    d = _copy(exported, tmp_path / "flip")
    data = bytearray((d / "policy.safetensors").read_bytes())
    data[-5] ^= 0x01
    (d / "policy.safetensors").write_bytes(bytes(data))
    with pytest.raises(PolicyError, match="does not match the SHA-256.*damaged or replaced"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "missing")
    (d / "policy.json").unlink()
    with pytest.raises(PolicyError, match="policy.json is missing"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "json")
    (d / "policy.json").write_text("{not json")
    with pytest.raises(PolicyError, match="is not valid JSON"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "format")
    _rewrite(d, version=99)
    with pytest.raises(PolicyError, match="version 99; this code reads version 1"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "shape")
    name = "state.params['params']['LanguageEncoder_0']['encoder_0']['kernel']"
    _rewrite(d, tensors={**good.tensors, name: np.zeros((394, 33), np.float32)})
    with pytest.raises(PolicyError, match=r"is float32\[394, 33\] but the recorded bc network needs float32\[394, 32\]"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "algo")
    _rewrite(d, algo="no-such-algorithm")
    with pytest.raises(PolicyError, match="field algo is 'no-such-algorithm': not a registered algorithm"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "extra")
    _rewrite(d, tensors={**good.tensors, "state.opt_state.mu": np.zeros(3, np.float32)})
    with pytest.raises(PolicyError, match=r"unexpected \['state.opt_state.mu'\]"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "nan")
    name = sorted(good.tensors)[0]
    _rewrite(d, tensors={**good.tensors, name: np.full_like(good.tensors[name], np.nan)})
    with pytest.raises(PolicyError, match="holds non-finite values"):
        Policy.load(d)

    d = _copy(exported, tmp_path / "header")
    (d / "policy.safetensors").write_bytes(b"\xff" * 16)
    _rewrite(d, sha256=hashlib.sha256(b"\xff" * 16).hexdigest())
    with pytest.raises(PolicyError, match="is not a readable safetensors file"):
        Policy.load(d)

    # The command line reports a refused policy as an error, not a traceback.
    assert main(["evaluate", str(d)]) == 2


def test_observations_of_the_wrong_width_are_refused(exported):
    policy = Policy.load(exported / "policy")
    with pytest.raises(ValueError, match=r"\(B, 394\) \(state 10 ⊕ embedding 384\), got \[2, 10\]"):
        policy.predict(np.zeros((2, 10), np.float32))
    with pytest.raises(PolicyError, match="conditioned on an instruction"):
        policy.act(np.zeros((2, 10), np.float32))


def test_repr_summarises_the_policy_instead_of_printing_its_tensors(exported):
    policy = Policy.load(exported / "policy")
    text = repr(policy)
    parameters = sum(a.size for a in policy.tensors.values())
    assert len(text) < 500, text
    for fact in ("algo='bc'", "env='clevr'", "obs_dim=394 (state 10 + embedding 384)", "actions=40 discrete",
                 "hidden=(32, 32)", "encoder='all-MiniLM-L6-v2'",
                 f"{len(policy.tensors)} tensors ({parameters:,} parameters)", "run=0, seed=0, ratio=0.0, data='', steps=100"):
        assert fact in text, fact


SPEC = {"state_dim": 10, "embed_dim": 384, "discrete": True, "action_dim": 40}
NET = {"encoder_width": 32, "encoder_layers": 2, "hidden": [32, 32]}
HOSTILE_RECORDS = {  # case: (record fields changed, what the error says)
    "env with path separators": ({"env": "../clevr"}, r"field env is '\.\./clevr': not a registered environment"),
    "env of another environment": ({"env": "babyai"}, r"field spec\.state_dim is 10: environment 'babyai' has 17"),
    "state width as a string": ({"spec": {**SPEC, "state_dim": "10"}}, r"field spec\.state_dim is '10': not an integer"),
    "huge state width": ({"spec": {**SPEC, "state_dim": 10**10}}, r"spec\.state_dim is 10000000000: outside \[1, 16384\]"),
    "huge action count": ({"spec": {**SPEC, "action_dim": 10**11}}, r"spec\.action_dim is 100000000000: outside"),
    "embedding of another encoder": ({"spec": {**SPEC, "embed_dim": 768}}, r"spec\.embed_dim is 768: the sentence"),
    "huge widths": ({"net": {**NET, "encoder_width": 10**6}}, r"net\.encoder_width is 1000000: outside \[1, 16384\]"),
    "width absent from the tensors": ({"net": {**NET, "encoder_width": 64}}, r"net\.encoder_width is 64: no tensor"),
    "huge layer count": ({"net": {**NET, "encoder_layers": 20000}}, r"net\.encoder_layers is 20000: outside \[1, 16\]"),
    "more layers than tensors": ({"net": {**NET, "encoder_layers": 16}}, r"an output layer holds 34 tensors; .* 10"),
    "hidden layers of another network": ({"net": {**NET, "hidden": [32] * 3}}, r"hidden_2.*: export it again"),
    "widths as text": ({"net": {**NET, "hidden": "ab"}}, r"field net\.hidden is 'ab': not a list"),
    "unknown option": ({"options": {"config": {"x": 1}}}, r"options\.config is .*bc \(discrete\) has no such option"),
    "variant of the other action space": ({"algo": "bc_continuous"},
                                          r"field algo is 'bc_continuous': .* is bc for continuous actions"),
    "unknown field": ({"model_path": "/etc/passwd"}, r"field model_path is '/etc/passwd': not a field of a policy"),
    "encoder of another width": ({"encoder": None}, r"field encoder is None: not a table"),
    "tensors table edited": ({"tensors": {"x": {"dtype": "float32", "shape": [10**12]}}},
                             r"field tensors is \{'x': .*: the table does not list"),
}


@pytest.mark.parametrize("case", list(HOSTILE_RECORDS))
def test_hostile_policy_records_are_refused_by_field_before_anything_is_built(exported, tmp_path, case):
    changes, message = HOSTILE_RECORDS[case]
    d = _copy(exported, tmp_path)
    record = json.loads((d / "policy.json").read_text())
    (d / "policy.json").write_text(json.dumps({**record, **changes}))
    with pytest.raises(PolicyError, match=message) as error:
        Policy.load(d)
    assert str(d) in str(error.value) and "export" in str(error.value)


def test_evaluate_refuses_a_policy_of_a_path_or_another_environment_in_one_line(exported, tmp_path, capsys):
    for env in ("../../clevr", "babyai"):
        d = _copy(exported, tmp_path / env.replace("/", "_"))
        _rewrite(d, env=env)
        capsys.readouterr()
        assert main(["evaluate", str(d), "--episodes", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"imaginejax evaluate: error: {d / 'policy.json'}: field "), err


def test_a_record_with_only_its_provenance_changed_loads_exactly(exported, tmp_path):
    d = _copy(exported, tmp_path)
    _rewrite(d, provenance={"note": "edited"})
    policy, good = Policy.load(d), Policy.load(exported / "policy")
    assert policy.provenance == {"note": "edited"} and (policy.algo, policy.env, policy.spec, policy.net) == (
        good.algo, good.env, good.spec, good.net)
    assert all(np.array_equal(policy.tensors[k], good.tensors[k]) for k in good.tensors)


def test_a_policy_with_a_scalar_leaf_round_trips(tmp_path):
    """Discrete BCQ acts with a 0-d threshold: saved as 0-d (np.ascontiguousarray alone made it 1-d)."""
    from imaginejax import algos
    from imaginejax.algos.base import Spec
    from imaginejax.algos.common import DataStats
    from imaginejax.algos.networks import NetConfig
    from imaginejax.bench.policy import template

    spec, net = Spec(10, 0, True, 40), NetConfig(16, 1, (16,))
    algo = algos.make("bcq", spec, net)
    hp = jax.tree.map(lambda x, t: np.asarray(x).reshape(t.shape), algo.default_hp(spec), template(algo, spec)[1])
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(10), hp)
    policy = Policy.from_state("bcq", spec, net, {}, "clevr", state, hp, {})
    assert policy.tensors["hp.threshold"].shape == ()
    loaded = Policy.load(policy.save(tmp_path / "bcq"))
    obs = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs), policy.predict(obs))


def test_a_record_naming_the_algorithm_by_its_variant_name_loads_as_the_algorithm(tmp_path):
    """policy.json may name the algorithm as ``Algorithm.name`` spells it ("bcq_discrete"): the same policy."""
    from imaginejax import algos
    from imaginejax.algos.base import Spec
    from imaginejax.algos.common import DataStats
    from imaginejax.algos.networks import NetConfig
    from imaginejax.bench.policy import template

    spec, net = Spec(10, 0, True, 40), NetConfig(16, 1, (16,))
    algo = algos.make("bcq", spec, net)
    hp = jax.tree.map(lambda x, t: np.asarray(x).reshape(t.shape), algo.default_hp(spec), template(algo, spec)[1])
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(10), hp)
    policy = Policy.from_state(algo.name, spec, net, {}, "clevr", state, hp, {})
    loaded = Policy.load(policy.save(tmp_path / "bcq"))
    assert algo.name == loaded.algo == "bcq_discrete" and loaded.algorithm.name == algo.name
    obs = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs), Policy.from_state("bcq", spec, net, {}, "clevr", state, hp,
                                                                           {}).predict(obs))
