"""KALM adapters and task batches (imaginejax.imaginer.kalm): the placeholder splice on hand-built
prompts, the four tasks' layouts on a hand-built trajectory, loss masking, causality, placeholders
appended to the vocabulary. No training here (see test_kalm_finetune.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.data.types import TrajectoryDataset
from imaginejax.imaginer.kalm import (
    KalmConfig,
    StateNormalizer,
    TextFormat,
    add_placeholder_tokens,
    build_corpus,
    build_task_batch,
    decode_states,
    init_adapter_params,
    kalm_hidden,
    make_layout,
    rollout_prompts,
    sample_task_batches,
    splice_embeddings,
    state_head_targets,
    task_loss,
)
from imaginejax.imaginer.llama import LlamaConfig, embed, forward, init_params

V = 32  # text vocabulary; placeholders are 32 (state) and 33 (action)
S_ID, A_ID = V, V + 1
STATE_DIM = 3
NUM_ACTIONS = 5
LLAMA = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    initializer_range=0.2, bos_token_id=1, eos_token_ids=(2,))
# Hand-made text format: start 1, end 2, separator (3,), tags 10..13.
FMT = TextFormat(start_id=1, end_id=2, separator=(3,), prefixes=((10,), (11,), (12,), (13,)))
INSTRUCTION = "push it"
INSTRUCTION_IDS = (20, 21)


class StubTokenizer:
    """Maps whole known strings to fixed ids (what build_corpus needs: ``encode(...).ids``)."""

    class _Encoding:
        def __init__(self, ids: tuple[int, ...]) -> None:
            self.ids = list(ids)

    def __init__(self, table: dict[str, tuple[int, ...]]) -> None:
        self.table = table

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        return self._Encoding(self.table[text])


def make_model(discrete: bool = True, tie: bool = False, seed: int = 0,
               state_prediction: str = "absolute") -> tuple[KalmConfig, dict[str, Any]]:
    llama = dataclasses.replace(LLAMA, tie_word_embeddings=tie)
    base = init_params(llama, jax.random.key(seed))
    base, llama, ids = add_placeholder_tokens(base, llama, 2)
    assert ids == (S_ID, A_ID)
    config = KalmConfig(llama=llama, state_dim=STATE_DIM, discrete=discrete,
                        num_actions=NUM_ACTIONS if discrete else 2, state_token_id=S_ID,
                        action_token_id=A_ID, state_prediction=state_prediction)
    adapter = init_adapter_params(jax.random.key(seed + 1), config, 0.3)
    return config, {"llama": base, "kalm": adapter}


def hand_dataset() -> TrajectoryDataset:
    """One trajectory of 2 steps (states 1..3 scaled, actions 3 then 1) padded to T = 4, and one of 1
    step."""
    states = np.zeros((2, 5, STATE_DIM), np.float32)
    states[0, :3] = [[0.1, 0.2, 0.3], [1.1, 1.2, 1.3], [2.1, 2.2, 2.3]]
    states[1, :2] = [[-1.0, 0.0, 1.0], [-2.0, 0.5, 2.0]]
    actions = np.array([[3, 1, 0, 0], [4, 0, 0, 0]], np.int32)
    mask = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], bool)
    terminals = np.array([[0, 1, 0, 0], [0, 0, 0, 0]], bool)
    truncations = np.array([[0, 0, 0, 0], [1, 0, 0, 0]], bool)
    return TrajectoryDataset(
        states=states, actions=actions, rewards=np.zeros((2, 4), np.float32), mask=mask,
        terminals=terminals, truncations=truncations, instruction_ids=np.array([0, 1], np.int32),
        goals=np.zeros((2, 1), np.int32), instructions=(INSTRUCTION, "go"),
        instruction_embeddings=np.zeros((2, 0), np.float32), env="toy", level="train",
        source="real", discrete=True)


@pytest.fixture(scope="module")
def corpus() -> Any:
    return build_corpus([hand_dataset()], StubTokenizer({INSTRUCTION: INSTRUCTION_IDS, "go": (22,)}))


# --------------------------------------------------------------------------------------- splice


@pytest.mark.parametrize("discrete", [True, False])
def test_splice_replaces_exactly_the_placeholder_rows(discrete: bool) -> None:
    config, params = make_model(discrete)
    tokens = np.array([[5, S_ID, 7, A_ID, S_ID, 0],
                       [A_ID, 9, 9, S_ID, 4, 4]], np.int32)
    rng = np.random.default_rng(0)
    state_inputs = rng.normal(size=(2, 6, STATE_DIM)).astype(np.float32)  # garbage off-placeholder
    if discrete:
        action_inputs = rng.integers(0, NUM_ACTIONS, size=(2, 6)).astype(np.int32)
    else:
        action_inputs = rng.normal(size=(2, 6, 2)).astype(np.float32)
    normalizer = StateNormalizer(jnp.array([0.5, -1.0, 2.0]), jnp.array([2.0, 0.5, 4.0]))
    spliced = np.asarray(splice_embeddings(params, config, jnp.asarray(tokens),
                                           jnp.asarray(state_inputs), jnp.asarray(action_inputs),
                                           normalizer))
    table = np.asarray(params["llama"]["embed_tokens"]["embedding"])
    adapter = jax.tree.map(np.asarray, params["kalm"])
    for b in range(2):
        for p in range(6):
            token = tokens[b, p]
            if token == S_ID:
                z = (state_inputs[b, p] - np.array([0.5, -1.0, 2.0])) / np.array([2.0, 0.5, 4.0])
                want = z @ adapter["state_in"]["kernel"] + adapter["state_in"]["bias"]
            elif token == A_ID:
                if discrete:
                    want = adapter["action_in"]["embedding"][action_inputs[b, p]]
                else:
                    want = action_inputs[b, p] @ adapter["action_in"]["kernel"] + \
                        adapter["action_in"]["bias"]
            else:
                want = table[token]
                np.testing.assert_array_equal(spliced[b, p], want)  # bit-exact token rows
                continue
            np.testing.assert_allclose(spliced[b, p], want, rtol=1e-5, atol=1e-6)
            assert not np.allclose(spliced[b, p], table[token])


def test_add_placeholder_tokens_keeps_the_model_and_appends_mean_rows() -> None:
    llama = LLAMA
    base = init_params(llama, jax.random.key(3))
    extended, new_config, ids = add_placeholder_tokens(base, llama, 2)
    assert ids == (V, V + 1) and new_config.vocab_size == V + 2
    table, new_table = base["embed_tokens"]["embedding"], extended["embed_tokens"]["embedding"]
    np.testing.assert_array_equal(new_table[:V], table)
    np.testing.assert_allclose(new_table[V:], np.broadcast_to(np.mean(table, 0), (2, 16)), rtol=1e-6)
    # The rows are numpy's float64-accumulated mean, bit for bit, whatever device holds the table:
    # the frozen backbone's hash covers them, so a run trained on a GPU loads on a CPU.
    host_mean = np.mean(np.asarray(table, np.float32), axis=0, dtype=np.float64).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(new_table[V:]), np.broadcast_to(host_mean, (2, 16)))
    np.testing.assert_array_equal(extended["lm_head"]["kernel"][:, :V], base["lm_head"]["kernel"])
    tokens = jnp.array([[1, 5, 9, 30]])
    old = forward(base, llama, tokens)
    new = forward(extended, new_config, tokens)
    np.testing.assert_array_equal(new.hidden_states, old.hidden_states)
    np.testing.assert_array_equal(new.logits[..., :V], old.logits)


# --------------------------------------------------------------------------------------- layouts


def test_layout_lengths_are_padded_to_multiples_of_8() -> None:
    layout = make_layout(FMT, max_instruction_tokens=2, max_steps=2)
    # rollout 2+2+1+5 = 10, dynamics 2+3 = 5, consequence 2+2+1+2 = 7, explanation 2+5+1+2+1 = 11
    assert layout.lengths == (16, 8, 8, 16)
    assert layout.text_length == 3


def _real(batch: Any, row: int = 0) -> dict[str, np.ndarray]:
    n = int(batch.attention_mask[row].sum())
    assert batch.attention_mask[row, :n].all() and not batch.attention_mask[row, n:].any()
    return {"tokens": batch.tokens[row, :n].tolist(), "n": n}


def test_rollout_batch_layout(corpus: Any) -> None:
    config, _ = make_model()
    layout = make_layout(FMT, 2, 2)
    batch = build_task_batch("rollout", corpus, np.array([0]), FMT, layout, config)
    assert batch.tokens.shape == (1, 16)
    assert _real(batch)["tokens"] == [1, 10, 20, 21, 3, S_ID, A_ID, S_ID, A_ID, S_ID]
    s = corpus.states[0]
    np.testing.assert_array_equal(batch.state_inputs[0, [5, 7, 9]], s[:3])
    np.testing.assert_array_equal(batch.action_inputs[0, [6, 8]], [3, 1])
    # Each item is predicted from the previous position: s0 <- separator, a_t <- s_t, s_t+1 <- a_t.
    assert np.flatnonzero(batch.state_target_mask[0]).tolist() == [4, 6, 8]
    np.testing.assert_array_equal(batch.state_targets[0, [4, 6, 8]], s[:3])
    assert np.flatnonzero(batch.action_target_mask[0]).tolist() == [5, 7]
    np.testing.assert_array_equal(batch.action_targets[0, [5, 7]], [3, 1])
    assert batch.text_positions.shape == (1, 0)
    # Without predict_initial_state s0 is only an input.
    no_s0 = build_task_batch("rollout", corpus, np.array([0]), FMT,
                             make_layout(FMT, 2, 2, predict_initial_state=False), config)
    assert np.flatnonzero(no_s0.state_target_mask[0]).tolist() == [6, 8]


def test_dynamics_batch_layout(corpus: Any) -> None:
    config, _ = make_model()
    layout = make_layout(FMT, 2, 2)
    # transitions: (0, 0), (0, 1), (1, 0)
    assert corpus.transitions.tolist() == [[0, 0], [0, 1], [1, 0]]
    batch = build_task_batch("dynamics", corpus, np.array([1, 2]), FMT, layout, config)
    assert batch.tokens.shape == (2, 8)
    assert _real(batch, 0)["tokens"] == [1, 11, S_ID, A_ID, S_ID]
    np.testing.assert_array_equal(batch.state_inputs[0, [2, 4]], corpus.states[0, [1, 2]])
    assert batch.action_inputs[0, 3] == 1 and batch.action_inputs[1, 3] == 4
    assert np.flatnonzero(batch.state_target_mask[0]).tolist() == [3]
    np.testing.assert_array_equal(batch.state_targets[0, 3], corpus.states[0, 2])
    np.testing.assert_array_equal(batch.state_targets[1, 3], corpus.states[1, 1])
    assert not batch.action_target_mask.any()


def test_consequence_batch_layout(corpus: Any) -> None:
    config, _ = make_model()
    batch = build_task_batch("consequence", corpus, np.array([0, 1]), FMT, make_layout(FMT, 2, 2),
                             config)
    assert _real(batch, 0)["tokens"] == [1, 12, 20, 21, 3, S_ID, S_ID]
    assert _real(batch, 1)["tokens"] == [1, 12, 22, 3, S_ID, S_ID]
    np.testing.assert_array_equal(batch.state_inputs[0, 5], corpus.states[0, 0])
    # the final state s_L (L = 2 for row 0, 1 for row 1), predicted from s0's position
    assert np.flatnonzero(batch.state_target_mask[0]).tolist() == [5]
    np.testing.assert_array_equal(batch.state_targets[0, 5], corpus.states[0, 2])
    np.testing.assert_array_equal(batch.state_targets[1, 4], corpus.states[1, 1])


def test_explanation_batch_layout(corpus: Any) -> None:
    config, _ = make_model()
    batch = build_task_batch("explanation", corpus, np.array([0]), FMT, make_layout(FMT, 2, 2),
                             config)
    assert _real(batch)["tokens"] == [1, 13, S_ID, A_ID, S_ID, A_ID, S_ID, 3, 20, 21, 2]
    np.testing.assert_array_equal(batch.state_inputs[0, [2, 4, 6]], corpus.states[0, :3])
    # text targets: the instruction then the end token, each from the previous position
    assert batch.text_positions[0].tolist() == [7, 8, 9]
    assert batch.text_targets[0].tolist() == [20, 21, 2]
    assert batch.text_mask[0].tolist() == [True, True, True]
    assert not batch.state_target_mask.any() and not batch.action_target_mask.any()


def test_rollout_prompt_is_the_training_prefix(corpus: Any) -> None:
    config, _ = make_model()
    batch = build_task_batch("rollout", corpus, np.array([0, 1]), FMT, make_layout(FMT, 2, 2), config)
    tokens, attention, states = rollout_prompts(FMT, config, [INSTRUCTION_IDS, (22,)],
                                                corpus.states[[0, 1], 0], width=8)
    assert tokens[0].tolist() == [1, 10, 20, 21, 3, S_ID, 0, 0]
    assert tokens[1].tolist() == [1, 10, 22, 3, S_ID, 0, 0, 0]
    for row, n in ((0, 6), (1, 5)):
        np.testing.assert_array_equal(tokens[row, :n], batch.tokens[row, :n])
        np.testing.assert_array_equal(states[row, :n], batch.state_inputs[row, :n])
        assert attention[row].sum() == n


def test_sample_task_batches_is_deterministic_and_skips_empty_tasks(corpus: Any) -> None:
    config, _ = make_model()
    layout = make_layout(FMT, 2, 2)
    sizes = {"rollout": 3, "dynamics": 4, "consequence": 0, "explanation": 2}
    first = sample_task_batches(corpus, FMT, layout, config, sizes, np.random.default_rng([7, 3]))
    again = sample_task_batches(corpus, FMT, layout, config, sizes, np.random.default_rng([7, 3]))
    assert set(first) == {"rollout", "dynamics", "explanation"}
    assert first["dynamics"].tokens.shape == (4, 8)
    for task in first:
        jax.tree.map(np.testing.assert_array_equal, first[task], again[task])


def test_too_long_instruction_is_refused(corpus: Any) -> None:
    config, _ = make_model()
    with pytest.raises(ValueError, match="max_instruction_tokens"):
        build_task_batch("rollout", corpus, np.array([0]), FMT, make_layout(FMT, 1, 2), config)


# --------------------------------------------------------------------------------------- losses


def test_normalizer_uses_valid_states_only() -> None:
    ds = hand_dataset()
    norm = StateNormalizer.from_datasets([ds])
    valid = np.concatenate([ds.states[0, :3], ds.states[1, :2]])
    np.testing.assert_allclose(norm.mean, valid.mean(0), rtol=1e-6)
    np.testing.assert_allclose(norm.std, valid.std(0), rtol=1e-5)


def test_losses_read_only_target_positions(corpus: Any) -> None:
    config, params = make_model()
    layout = make_layout(FMT, 2, 2)
    norm = StateNormalizer.from_datasets([hand_dataset()])
    batch = build_task_batch("rollout", corpus, np.array([0, 1]), FMT, layout, config)
    loss, metrics = task_loss(params, config, batch, norm, ("state", "action"))
    np.testing.assert_allclose(loss, 0.5 * metrics["state_mse"] + 0.5 * metrics["action_ce"],
                               rtol=1e-6)
    # Hand check of the state term from the heads' outputs at the target positions.
    hidden = np.asarray(kalm_hidden(params, config, batch, norm))
    head = jax.tree.map(np.asarray, params["kalm"]["state_out"])
    errors = []
    for row, pos in zip(*np.nonzero(batch.state_target_mask)):
        predicted = hidden[row, pos] @ head["kernel"] + head["bias"]
        target = (batch.state_targets[row, pos] - np.asarray(norm.mean)) / np.asarray(norm.std)
        errors.append(np.mean((predicted - target) ** 2))
    np.testing.assert_allclose(metrics["state_mse"], np.mean(errors), rtol=1e-4)
    # Values off the target positions do not matter.
    poked = batch.replace(state_targets=np.where(batch.state_target_mask[..., None],
                                                 batch.state_targets, 99.0),
                          action_targets=np.where(batch.action_target_mask, batch.action_targets, 4))
    poked_loss, _ = task_loss(params, config, poked, norm, ("state", "action"))
    np.testing.assert_allclose(poked_loss, loss, rtol=1e-6)


def test_text_loss_matches_a_full_logit_cross_entropy(corpus: Any) -> None:
    config, params = make_model(tie=True)
    norm = StateNormalizer.identity(STATE_DIM)
    batch = build_task_batch("explanation", corpus, np.array([0, 1]), FMT, make_layout(FMT, 2, 2),
                             config)
    _, metrics = task_loss(params, config, batch, norm, ("text",))
    embeds = splice_embeddings(params, config, batch.tokens, batch.state_inputs,
                               batch.action_inputs, norm)
    logits = np.asarray(forward(params["llama"], config.llama, inputs_embeds=embeds,
                                attention_mask=batch.attention_mask).logits)
    nll = []
    for row in range(2):
        for slot in np.flatnonzero(batch.text_mask[row]):
            pos, target = batch.text_positions[row, slot], batch.text_targets[row, slot]
            z = logits[row, pos]
            nll.append(np.log(np.exp(z - z.max()).sum()) + z.max() - z[target])
    np.testing.assert_allclose(metrics["text_ce"], np.mean(nll), rtol=1e-5)


def test_targets_cannot_see_the_item_they_predict(corpus: Any) -> None:
    """Changing s1 leaves every prediction made before its position unchanged (causal splice)."""
    config, params = make_model()
    norm = StateNormalizer.identity(STATE_DIM)
    batch = build_task_batch("rollout", corpus, np.array([0]), FMT, make_layout(FMT, 2, 2), config)
    changed = batch.replace(state_inputs=batch.state_inputs.copy())
    changed.state_inputs[0, 7] += 5.0  # s1 sits at position 7, predicted from position 6
    before = np.asarray(kalm_hidden(params, config, batch, norm))
    after = np.asarray(kalm_hidden(params, config, changed, norm))
    np.testing.assert_array_equal(after[0, :7], before[0, :7])
    assert not np.allclose(after[0, 7], before[0, 7])


def test_config_rejects_placeholders_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="add_placeholder_tokens"):
        KalmConfig(llama=LLAMA, state_dim=3, discrete=True, num_actions=5, state_token_id=V,
                   action_token_id=V + 1)
    config, _ = make_model()
    assert KalmConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="KalmConfig: compute_dtype = 'float16' is not one of float32, bfloat16"):
        dataclasses.replace(config, compute_dtype="float16")
    with pytest.raises(ValueError, match="KalmConfig: state_prediction = 'next' is not one of absolute, delta"):
        dataclasses.replace(config, state_prediction="next")
    # embed() of the extended table reaches the placeholder rows (they exist, even if replaced).
    _, params = make_model()
    assert embed(params["llama"], config.llama, jnp.array([[S_ID, A_ID]])).shape == (1, 2, 16)


# --------------------------------------------------------------------------------- delta head


def test_batches_carry_the_state_each_target_follows(corpus: Any) -> None:
    config, _ = make_model()
    s = corpus.states[0]
    rollout = build_task_batch("rollout", corpus, np.array([0]), FMT, make_layout(FMT, 2, 2), config)
    # targets at 4 (s0: nothing before it), 6 (s1 follows s0), 8 (s2 follows s1)
    assert np.flatnonzero(rollout.state_base_mask[0]).tolist() == [6, 8]
    np.testing.assert_array_equal(rollout.state_bases[0, [6, 8]], s[:2])
    dynamics = build_task_batch("dynamics", corpus, np.array([1]), FMT, make_layout(FMT, 2, 2), config)
    assert np.flatnonzero(dynamics.state_base_mask[0]).tolist() == [3]
    np.testing.assert_array_equal(dynamics.state_bases[0, 3], s[1])  # transition (0, 1): s1 -> s2
    consequence = build_task_batch("consequence", corpus, np.array([0]), FMT, make_layout(FMT, 2, 2),
                                   config)
    np.testing.assert_array_equal(consequence.state_bases[0, 5], s[0])  # s_L follows s0
    explanation = build_task_batch("explanation", corpus, np.array([0]), FMT, make_layout(FMT, 2, 2),
                                   config)
    assert not explanation.state_base_mask.any()


@pytest.mark.parametrize("mode", ["absolute", "delta"])
def test_head_targets_and_decoding_are_inverse(mode: str) -> None:
    config, _ = make_model(state_prediction=mode)
    norm = StateNormalizer(jnp.array([0.5, -1.0, 2.0]), jnp.array([2.0, 0.5, 4.0]))
    rng = np.random.default_rng(1)
    targets = rng.normal(size=(4, 6, STATE_DIM)).astype(np.float32)
    bases = rng.normal(size=(4, 6, STATE_DIM)).astype(np.float32)
    has_base = rng.random((4, 6)) < 0.7
    head = np.asarray(state_head_targets(config, norm, targets, bases, has_base))
    z = lambda x: (x - np.array([0.5, -1.0, 2.0])) / np.array([2.0, 0.5, 4.0])  # noqa: E731
    if mode == "absolute":
        np.testing.assert_allclose(head, z(targets), rtol=1e-5, atol=1e-6)
    else:  # the change normalised by the state scale; absolute where there is no base
        want = np.where(has_base[..., None], (targets - bases) / np.array([2.0, 0.5, 4.0]), z(targets))
        np.testing.assert_allclose(head, want, rtol=1e-5, atol=1e-5)
    decoded = np.asarray(decode_states(config, norm, jnp.asarray(head), bases, has_base))
    np.testing.assert_allclose(decoded, targets, rtol=1e-5, atol=1e-5)


def test_delta_loss_is_the_error_of_the_decoded_state(corpus: Any) -> None:
    config, params = make_model(state_prediction="delta")
    norm = StateNormalizer.from_datasets([hand_dataset()])
    batch = build_task_batch("rollout", corpus, np.array([0, 1]), FMT, make_layout(FMT, 2, 2), config)
    _, metrics = task_loss(params, config, batch, norm, ("state", "action"))
    hidden = np.asarray(kalm_hidden(params, config, batch, norm))
    head = jax.tree.map(np.asarray, params["kalm"]["state_out"])
    mean, std = np.asarray(norm.mean), np.asarray(norm.std)
    errors = []
    for row, pos in zip(*np.nonzero(batch.state_target_mask)):
        output = hidden[row, pos] @ head["kernel"] + head["bias"]
        base = (batch.state_bases[row, pos] - mean) / std if batch.state_base_mask[row, pos] else 0.0
        decoded = (output + base) * std + mean  # the absolute state the model predicts
        errors.append(np.mean(((decoded - batch.state_targets[row, pos]) / std) ** 2))
    np.testing.assert_allclose(metrics["state_mse"], np.mean(errors), rtol=1e-4)


def test_config_rejects_an_unknown_state_prediction() -> None:
    with pytest.raises(ValueError, match="state_prediction"):
        make_model(state_prediction="relative")
