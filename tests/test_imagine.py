"""Imaginary rollouts (imaginejax.imaginer.imagine) on CLEVR-Robot levels with small hand-built
imaginers: generation stops per row when the environment's success predicate holds, rewards are the
environment's, the result is a valid dataset that round-trips through save/load, generation agrees
with the training layout (teacher forcing), and non-finite generated states are caught, counted and
never written."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data.io import load_dataset, save_dataset
from imaginejax.data.validate import validate_dataset
from imaginejax.envs import make
from imaginejax.envs.clevr import tasks as clevr_tasks
from imaginejax.imaginer.finetune import Imaginer
from imaginejax.imaginer.imagine import (
    ImaginationError,
    generate_rollouts,
    imagine,
    rollouts_to_dataset,
    write_imaginary_datasets,
)
from imaginejax.imaginer.kalm import (
    KalmConfig,
    StateNormalizer,
    TextFormat,
    add_placeholder_tokens,
    adapter_apply,
    build_corpus,
    build_task_batch,
    decode_states,
    init_adapter_params,
    kalm_hidden,
    make_layout,
    rollout_prompts,
)
from imaginejax.imaginer.llama import LlamaConfig, init_params

V = 64
FMT = TextFormat(start_id=1, end_id=2, separator=(3,), prefixes=((10,), (11,), (12,), (13,)))
# red (0, 0.3) directly behind blue (0, 0); the others far away.
FIXED_STATE = np.array([0.0, 0.3, 0.0, 0.0, 0.6, -0.2, -0.6, -0.2, 0.3, 0.5], np.float32)
FIXED_ACTION = 7
RED_BEHIND_BLUE, RED_IN_FRONT_OF_BLUE = 0, 2  # rows of the relational goal table (a, b, d order)


class WordTokenizer:
    """Deterministic word-level stand-in for a tokenizer: each word -> an id in [17, V)."""

    class _Encoding:
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        return self._Encoding([17 + int(hashlib.sha256(w.encode()).hexdigest(), 16) % (V - 17)
                               for w in text.split()])


def make_imaginer(seed: int = 0, *, fixed_heads: bool = False, nan_states: bool = False,
                  state_prediction: str = "absolute", state_bias: np.ndarray | None = None,
                  normalizer: StateNormalizer | None = None, state_dim: int = clevr_tasks.STATE_DIM,
                  num_actions: int = clevr_tasks.NUM_ACTIONS, fixed_action: int = FIXED_ACTION,
                  discrete: bool = True, action_bias: np.ndarray | None = None) -> Imaginer:
    """A 1-layer random imaginer. ``fixed_heads``: the state head outputs ``state_bias`` (default
    FIXED_STATE, identity normaliser) whatever the input, the action head ``fixed_action``
    (continuous, ``discrete=False`` with ``num_actions`` = the action width: ``action_bias``,
    default zeros)."""
    llama = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
                        max_position_embeddings=512)
    base = init_params(llama, jax.random.key(seed))
    base, llama, (s_id, a_id) = add_placeholder_tokens(base, llama, 2)
    config = KalmConfig(llama=llama, state_dim=state_dim, discrete=discrete, num_actions=num_actions,
                        state_token_id=s_id, action_token_id=a_id, state_prediction=state_prediction)
    adapter = init_adapter_params(jax.random.key(seed + 1), config, 0.1)
    if fixed_heads:
        bias = FIXED_STATE if state_bias is None else state_bias
        adapter["state_out"] = {"kernel": jnp.zeros((32, state_dim)), "bias": jnp.asarray(bias)}
        action = (jnp.zeros(num_actions).at[fixed_action].set(5.0) if discrete
                  else jnp.zeros(num_actions) if action_bias is None else jnp.asarray(action_bias))
        adapter["action_out"] = {"kernel": jnp.zeros((32, num_actions)), "bias": action}
    if nan_states:
        adapter["state_out"] = dict(adapter["state_out"],
                                    bias=jnp.full((state_dim,), jnp.nan, jnp.float32))
    return Imaginer(config=config, params={"llama": base, "kalm": adapter},
                    normalizer=normalizer or StateNormalizer.identity(state_dim),
                    tokenizer=WordTokenizer(),
                    text_format=FMT, layout=make_layout(FMT, 24, 4), preset="test-hand-built",
                    checkpoint_hash="0" * 64, step=0)


@pytest.fixture(scope="module")
def rephrase() -> tuple[Any, Any]:
    return make("clevr", "rephrase", embed=False)


def test_generation_stops_at_success_and_writes_a_valid_dataset(rephrase: Any, tmp_path: Path
                                                                ) -> None:
    env, params = rephrase
    imaginer = make_imaginer(fixed_heads=True)
    task_rows = np.array([RED_BEHIND_BLUE] * 3 + [RED_IN_FRONT_OF_BLUE] * 3)
    result = imagine(imaginer, env, params, jax.random.key(4), 6, task_indices=task_rows,
                     chunk_size=4, progress=False)
    ds = result.dataset
    assert result.num_requested == 6 and result.num_dropped_nonfinite == 0
    assert ds.source == "imaginary" and ds.level == "rephrase" and ds.env == "clevr"
    assert ds.states.shape == (6, params.max_steps + 1, 10) and params.max_steps == 50
    lengths = ds.mask.sum(axis=1)
    # The generated state satisfies "red behind blue" at once; "red in front of blue" never.
    np.testing.assert_array_equal(lengths, [1, 1, 1, 50, 50, 50])
    np.testing.assert_array_equal(ds.terminals.any(axis=1), [True] * 3 + [False] * 3)
    assert ds.terminals[:3, 0].all() and not ds.truncations[:3].any()
    assert ds.truncations[3:, 49].all() and ds.truncations.sum() == 3
    for row, length in enumerate(lengths):
        np.testing.assert_array_equal(ds.states[row, 1 : length + 1],
                                      np.broadcast_to(FIXED_STATE, (length, 10)))
        assert not ds.states[row, length + 1 :].any()
        assert (ds.actions[row, :length] == FIXED_ACTION).all()
    np.testing.assert_array_equal(ds.goals, np.asarray(params.goals)[task_rows])
    # Rewards are the environment's own, on the generated transitions.
    want = np.asarray(env.reward(jnp.asarray(ds.states[:, :-1]), jnp.asarray(ds.actions),
                                 jnp.asarray(ds.states[:, 1:]), jnp.asarray(ds.goals)[:, None, :]))
    np.testing.assert_allclose(ds.rewards, np.where(ds.mask, want, 0.0), rtol=1e-6, atol=1e-6)
    assert ds.rewards[3:, 1:].max() == 0.0  # nothing moves after the first step
    # Initial states come from the reset distribution: inside the layout box, goal not yet met.
    s0 = ds.states[:, 0].reshape(6, 5, 2)
    assert (s0 >= np.array(clevr_tasks.LAYOUT_LOW) - 1e-6).all()
    assert (s0 <= np.array(clevr_tasks.LAYOUT_HIGH) + 1e-6).all()
    assert not np.asarray(clevr_tasks.state_satisfied(jnp.asarray(ds.states[:, 0]),
                                                      jnp.asarray(ds.goals))).any()
    # The instruction of each row is one of its task's rephrasings.
    phrasings = np.asarray(params.phrasing_ids)
    for row, task in enumerate(task_rows):
        assert ds.instruction_ids[row] in phrasings[task]
    meta = ds.provenance
    assert meta["preset"] == "test-hand-built" and meta["checkpoint_hash"] == "0" * 64
    assert meta["model"].startswith("llama(") and meta["num_dropped_nonfinite"] == 0
    assert meta["success_rate"] == 0.5
    validate_dataset(ds, num_actions=40)
    path = save_dataset(ds, tmp_path / "clevr-rephrase-imaginary")
    loaded = load_dataset(path)
    np.testing.assert_array_equal(loaded.states, ds.states)
    assert loaded.provenance["checkpoint_hash"] == "0" * 64


@pytest.mark.parametrize("state_prediction", ["absolute", "delta"])
def test_generation_matches_the_training_layout(rephrase: Any, state_prediction: str) -> None:
    """Feeding a generated rollout back as a rollout-task batch reproduces every generated action
    and state from the heads at the previous positions (same prompt, positions and splice; for the
    delta head, the same base states)."""
    env, params = rephrase
    normalizer = StateNormalizer(jnp.linspace(-0.2, 0.2, 10), jnp.linspace(0.2, 0.4, 10))
    imaginer = make_imaginer(seed=5, state_prediction=state_prediction, normalizer=normalizer)
    config = imaginer.config
    instructions = env.instructions("rephrase")
    ids = np.array([0, 57, 410])
    tokens_table = [imaginer.tokenizer.encode(instructions[i]).ids for i in ids]
    rng = np.random.default_rng(0)
    s0 = rng.uniform(-0.4, 0.4, size=(3, 10)).astype(np.float32)
    goals = np.asarray(params.goals)[[0, 1, 2]]
    tokens, attention, state_inputs = rollout_prompts(FMT, config, tokens_table, s0)
    horizon = 4
    never = lambda prev, action, nxt, goal: jnp.zeros(nxt.shape[:-1], bool)  # noqa: E731
    out = generate_rollouts(imaginer.params, config, imaginer.normalizer, tokens, attention,
                            state_inputs, s0, goals, horizon=horizon, success_fn=never,
                            reward_fn=env.reward)
    ds, dropped = rollouts_to_dataset(
        out, instruction_ids=ids, goals=goals, instructions=instructions,
        instruction_embeddings=np.zeros((len(instructions), 0), np.float32), env="clevr",
        level="rephrase", discrete=True, provenance={}, num_actions=40)
    assert dropped == 0 and (ds.mask.sum(axis=1) == horizon).all() and ds.truncations[:, -1].all()
    corpus = build_corpus([ds], imaginer.tokenizer)
    layout = make_layout(FMT, max(len(t) for t in tokens_table), horizon)
    batch = build_task_batch("rollout", corpus, np.arange(3), FMT, layout, config)
    hidden = kalm_hidden(imaginer.params, config, batch, imaginer.normalizer)
    actions = np.asarray(jnp.argmax(adapter_apply(imaginer.params, config, "predict_action",
                                                  hidden), axis=-1))
    states = np.asarray(decode_states(config, imaginer.normalizer,
                                      adapter_apply(imaginer.params, config, "predict_state", hidden),
                                      batch.state_bases, batch.state_base_mask))
    for row in range(3):
        a_pos = np.flatnonzero(batch.action_target_mask[row])
        s_pos = np.flatnonzero(batch.state_target_mask[row])[1:]  # skip the s0 target
        np.testing.assert_array_equal(actions[row, a_pos], ds.actions[row])
        np.testing.assert_allclose(states[row, s_pos], ds.states[row, 1:], rtol=1e-4, atol=1e-4)
    assert len(set(ds.actions.ravel().tolist())) > 1  # a non-degenerate model


def test_non_finite_rows_are_dropped_and_counted(rephrase: Any) -> None:
    env, params = rephrase
    imaginer = make_imaginer(seed=2)
    instructions = env.instructions("rephrase")
    ids = np.array([0, 1, 2, 3])
    s0 = np.tile(FIXED_STATE, (4, 1))
    s0[2, 3] = np.nan  # this row's generated states become NaN
    tokens, attention, state_inputs = rollout_prompts(
        FMT, imaginer.config, [imaginer.tokenizer.encode(instructions[i]).ids for i in ids], s0)
    goals = np.asarray(params.goals)[[1, 1, 1, 1]]
    out = generate_rollouts(imaginer.params, imaginer.config, imaginer.normalizer, tokens,
                            attention, state_inputs, s0, goals, horizon=5, success_fn=env.success,
                            reward_fn=env.reward)
    assert np.asarray(out.finite).tolist() == [True, True, False, True]
    assert int(out.lengths[2]) == 1  # stopped at the first non-finite state
    ds, dropped = rollouts_to_dataset(
        out, instruction_ids=ids, goals=goals, instructions=instructions,
        instruction_embeddings=np.zeros((len(instructions), 0), np.float32), env="clevr",
        level="rephrase", discrete=True, provenance={"model": "test"}, num_actions=40)
    assert dropped == 1 and ds.num_trajectories == 3
    assert ds.provenance["num_dropped_nonfinite"] == 1
    np.testing.assert_array_equal(ds.instruction_ids, [0, 1, 3])
    assert np.isfinite(ds.states).all()


def test_all_non_finite_generation_raises_and_writes_nothing(tmp_path: Path) -> None:
    imaginer = make_imaginer(nan_states=True)
    with pytest.raises(ImaginationError, match="non-finite"):
        write_imaginary_datasets(imaginer, "clevr", tmp_path, 4, jax.random.key(0),
                                 levels=("easy",), embed=False, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_easy_level_is_one_step_with_push_success() -> None:
    env, params = make("clevr", "easy", embed=False)
    imaginer = make_imaginer(fixed_heads=True)
    # FIXED_ACTION 7 = ball 0 (red), direction 7 (-.8, -.8): compatible with "left" and "front".
    result = imagine(imaginer, env, params, jax.random.key(1), 4,
                     task_indices=np.array([1, 2, 0, 5]), progress=False)
    ds = result.dataset
    assert params.max_steps == 1 and (ds.mask.sum(axis=1) == 1).all()
    # push goals in (ball, direction) order: 1 = red left, 2 = red front, 0 = red behind, 5 = blue left
    np.testing.assert_array_equal(ds.terminals[:, 0], [True, True, False, False])
    np.testing.assert_array_equal(ds.rewards[:, 0], [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(ds.truncations[:, 0], [False, False, True, True])


def test_delta_head_round_trip() -> None:
    """A hand-set delta head that outputs n(FIXED) - n(s0) writes FIXED at the first step, as the
    absolute head that outputs n(FIXED) does; then it keeps adding the same change:
    s_t = s0 + t · (FIXED - s0)."""
    normalizer = StateNormalizer(jnp.linspace(-0.1, 0.1, 10), jnp.linspace(0.3, 0.5, 10))
    s0 = np.array([0.0, 0.6, 0.0, 0.0, 0.6, -0.2, -0.6, -0.2, 0.3, 0.5], np.float32)
    z = lambda x: np.asarray(normalizer.normalize(jnp.asarray(x)))  # noqa: E731
    absolute = make_imaginer(fixed_heads=True, normalizer=normalizer, state_bias=z(FIXED_STATE))
    delta = make_imaginer(fixed_heads=True, normalizer=normalizer, state_prediction="delta",
                          state_bias=z(FIXED_STATE) - z(s0))
    never = lambda prev, action, nxt, goal: jnp.zeros(nxt.shape[:-1], bool)  # noqa: E731
    reward = lambda prev, action, nxt, goal: jnp.zeros(nxt.shape[:-1])  # noqa: E731
    outputs = []
    for imaginer in (absolute, delta):
        tokens, attention, states = rollout_prompts(FMT, imaginer.config, [[20, 21]], s0[None])
        outputs.append(jax.device_get(generate_rollouts(
            imaginer.params, imaginer.config, normalizer, tokens, attention, states, s0[None],
            np.zeros((1, 11), np.int32), horizon=3, success_fn=never, reward_fn=reward)))
    np.testing.assert_allclose(outputs[0].states[0, 1:], np.tile(FIXED_STATE, (3, 1)), atol=1e-5)
    np.testing.assert_allclose(outputs[1].states[0, 1], outputs[0].states[0, 1], atol=1e-5)
    want = s0 + np.arange(4)[:, None] * (FIXED_STATE - s0)
    np.testing.assert_allclose(outputs[1].states[0], want, atol=1e-5)


def test_study_cli_runs_on_babyai(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Smoke test of ``python -m imaginejax.imaginer.study`` on BabyAI: train (2 steps of the tiny
    preset on 8 expert trajectories), evaluate (2 rollouts of the easy level), compare; the
    environment is recorded with the run and a run cannot be continued on another environment."""
    import json

    from imaginejax.imaginer import study

    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path))
    study.main(["train", "smoke", "--env", "babyai", "--steps", "2", "--trajectories", "8",
                "--set", "checkpoint_every=1", "--set", "max_to_keep=4"])
    directory = tmp_path / "imaginer-study" / "smoke"
    assert sorted(p.name for p in (directory / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    assert json.loads((directory / "study.json").read_text())["env"] == "babyai"
    assert (tmp_path / "imaginer-study" / "data").is_dir()  # the expert data is cached there
    study.main(["evaluate", "smoke", "--num", "2", "--levels", "easy"])
    record = json.loads((directory / "quality-n2.json").read_text())  # --num in the name: 256 is not overwritten
    assert record["env"] == "babyai" and record["step"] == 2 and list(record["levels"]) == ["easy"]
    level = record["levels"]["easy"]
    assert level["simulated"] and level["error_unit"].startswith("grid cells")
    assert 1 <= level["num_rollouts"] <= 2 and 0.0 <= level["goal_consistency"] <= 1.0
    assert "| easy |" in (directory / "quality-n2.md").read_text()
    study.main(["evaluate", "smoke", "--num", "2", "--levels", "easy", "--step", "1"])  # an earlier checkpoint
    assert json.loads((directory / "quality-step1-n2.json").read_text())["step"] == 1
    study.main(["evaluate", "smoke", "--num", "2", "--levels", "easy", "--oversample", "3"])  # best 2 of 6
    oversampled = json.loads((directory / "quality-n2-k3.json").read_text())
    assert oversampled["oversample"] == 3 and record["oversample"] == 1
    assert 1 <= oversampled["levels"]["easy"]["num_rollouts"] <= 2
    capsys.readouterr()
    study.main(["compare", "smoke@quality-n2:tiny"])
    assert "| tiny | easy |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="trained on 'babyai'"):
        study.main(["train", "smoke", "--env", "clevr", "--steps", "2"])
