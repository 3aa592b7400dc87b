"""Flax Llama (imaginejax.imaginer): parity with PyTorch transformers on tiny random configs, the KV
cache, greedy generation, configs and loader errors.

The reference runs in the test-only interpreter ``$IMAGINEJAX_REF_PYTHON`` (made by ``make test``;
fallback ``.venv-ref/bin/python``): it builds random ``transformers.LlamaForCausalLM`` models, saves
them with ``save_pretrained`` (one variant sharded) and records their logits and ``generate``
outputs; we load the saved directories with our loader. Without a reference interpreter the parity
tests fail on purpose.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.imaginer import (
    LlamaConfig,
    RopeScaling,
    embed,
    forward,
    greedy_generate,
    init_cache,
    init_params,
    load_hf_checkpoint,
    load_hf_config,
)
from imaginejax.imaginer.llama import rope_inverse_frequencies
from imaginejax.imaginer.loading import (
    ModelFilesNotFoundError,
    WeightLoadError,
    hf_state_dict,
    llama_params_from_state_dict,
    permute_rotary_rows,
    unpermute_rotary_rows,
)

from reference_env import reference_python  # tests/ is on sys.path (conftest)

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_SCRIPT = REPO_ROOT / "tests" / "reference" / "llama_reference.py"
MAX_LOGIT_DIFF = 1e-4  # float32, the bound

PAD = 0
BASE_CONFIG: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=256,
    initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=PAD)
# Hugging Face constructor arguments (the older rope_theta/rope_scaling spelling, which transformers 5
# saves as rope_parameters: so loading also exercises that layout).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": dict(BASE_CONFIG, rope_theta=10000.0, tie_word_embeddings=False),
    "llama3": dict(BASE_CONFIG, rope_theta=500000.0, tie_word_embeddings=True, attention_bias=True,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "linear": dict(BASE_CONFIG, rope_theta=10000.0, head_dim=32, num_key_value_heads=1,
                   mlp_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}
SHARDED = {"llama3": "40KB"}

SEQ_LEN = 12
PADDED_LENGTHS = (12, 7, 3)
PROMPT_LENGTHS = (6, 4, 2)
MAX_NEW_TOKENS = 10


def _token_ids(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Token ids in [3, 128) (not PAD/BOS/EOS) from a fixed seed."""
    return np.random.default_rng(seed).integers(3, 128, size=shape)


def _pad(rows: list[np.ndarray], width: int, side: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) (B, width) with rows padded with PAD on ``side``."""
    ids = np.full((len(rows), width), PAD, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for index, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[index, span], mask[index, span] = row, 1
    return ids, mask


FULL_IDS = _token_ids(0, (len(PADDED_LENGTHS), SEQ_LEN))
PADDED_ROWS = [FULL_IDS[index, :length] for index, length in enumerate(PADDED_LENGTHS)]
LEFT_IDS, LEFT_MASK = _pad(PADDED_ROWS, SEQ_LEN, "left")
RIGHT_IDS, RIGHT_MASK = _pad(PADDED_ROWS, SEQ_LEN, "right")
PROMPT_ROWS = [_token_ids(1 + index, (length,)) for index, length in enumerate(PROMPT_LENGTHS)]
PROMPT_LEFT, PROMPT_LEFT_MASK = _pad(PROMPT_ROWS, max(PROMPT_LENGTHS), "left")
PROMPT_RIGHT, PROMPT_RIGHT_MASK = _pad(PROMPT_ROWS, max(PROMPT_LENGTHS), "right")


# ---------------------------------------------------------------------------------------------------
# Reference


def run_reference(work: Path) -> Path:
    """Run tests/reference/llama_reference.py ``tiny`` on VARIANTS; returns the output directory."""
    python = reference_python()
    spec = {"variants": [
        {"name": name, "config": config, "seed": 1234 + index,
         "max_shard_size": SHARDED.get(name), "input_ids": FULL_IDS.tolist(),
         "left_ids": LEFT_IDS.tolist(), "left_mask": LEFT_MASK.tolist(),
         "right_ids": RIGHT_IDS.tolist(), "right_mask": RIGHT_MASK.tolist(),
         "gen_ids": PROMPT_LEFT.tolist(), "gen_mask": PROMPT_LEFT_MASK.tolist(),
         "max_new_tokens": MAX_NEW_TOKENS, "pad_token_id": PAD}
        for index, (name, config) in enumerate(VARIANTS.items())]}
    spec_path, out_dir = work / "spec.json", work / "models"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    result = subprocess.run(
        [str(python), str(REFERENCE_SCRIPT), "tiny", "--spec", str(spec_path),
         "--out-dir", str(out_dir)],
        capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.fail(f"reference script failed (exit {result.returncode}) with {python}:\n"
                    f"{result.stderr[-3000:]}\nRun `make test` to (re)create .venv-ref.",
                    pytrace=False)
    return out_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory
              ) -> Callable[[str], tuple[Path, dict[str, np.ndarray]]]:
    """``get(variant)`` -> (saved model directory, reference arrays). The script runs once, on the
    first call from a test body (so a missing reference interpreter FAILS the parity tests)."""
    memo: dict[str, Any] = {}

    def get(variant: str) -> tuple[Path, dict[str, np.ndarray]]:
        if "failure" in memo:
            pytest.fail(memo["failure"], pytrace=False)
        if "out_dir" not in memo:
            try:
                memo["out_dir"] = run_reference(tmp_path_factory.mktemp("llama_reference"))
            except pytest.fail.Exception as failure:
                memo["failure"] = str(failure)
                raise
        model_dir = memo["out_dir"] / variant
        with np.load(model_dir / "reference.npz", allow_pickle=False) as archive:
            return model_dir, {name: archive[name] for name in archive.files}

    return get


@pytest.fixture(scope="module")
def loaded(reference: Callable[[str], tuple[Path, dict[str, np.ndarray]]]
           ) -> Callable[[str], tuple[LlamaConfig, Any, dict[str, np.ndarray]]]:
    """``get(variant)`` -> (config, params, reference arrays), loading each directory once."""
    memo: dict[str, tuple[LlamaConfig, Any, dict[str, np.ndarray]]] = {}

    def get(variant: str) -> tuple[LlamaConfig, Any, dict[str, np.ndarray]]:
        if variant not in memo:
            model_dir, arrays = reference(variant)
            config, params = load_hf_checkpoint(model_dir)
            memo[variant] = (config, params, arrays)
        return memo[variant]

    return get


_forward = jax.jit(forward, static_argnames=("config", "compute_logits", "precision"))


def _real_positions_diff(ours: np.ndarray, theirs: np.ndarray, mask: np.ndarray) -> float:
    """Max |ours - theirs| over real (mask == 1) token positions."""
    keep = mask.astype(bool)
    return float(np.max(np.abs(ours[keep] - theirs[keep])))


# ---------------------------------------------------------------------------------------------------
# Parity with transformers


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(variant: str, loaded: Callable[..., Any],
                                   record_property: pytest.RecordProperty) -> None:
    config, params, ref = loaded(variant)
    assert config == LlamaConfig.from_hf(dict(VARIANTS[variant]))
    # A transformers.LlamaConfig's full to_dict() (as JSON) reads the same as its config.json.
    assert LlamaConfig.from_hf(json.loads(str(ref["config_json"]))) == config
    full = np.asarray(_forward(params, config, jnp.asarray(FULL_IDS)).logits)
    left = np.asarray(_forward(params, config, jnp.asarray(LEFT_IDS),
                               attention_mask=jnp.asarray(LEFT_MASK)).logits)
    right = np.asarray(_forward(params, config, jnp.asarray(RIGHT_IDS),
                                attention_mask=jnp.asarray(RIGHT_MASK)).logits)
    diffs = {
        "full": float(np.max(np.abs(full - ref["logits_full"]))),
        "left": _real_positions_diff(left, ref["logits_left"], LEFT_MASK),
        "right": _real_positions_diff(right, ref["logits_right"], RIGHT_MASK),
    }
    summary = (f"{variant}: max |logit diff| " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
               + f" (logit scale {np.abs(ref['logits_full']).max():.2f}); {ref['versions']}")
    record_property(f"llama_parity_{variant}", summary)
    print(summary)
    assert max(diffs.values()) <= MAX_LOGIT_DIFF, summary
    # A padded row computes the same real-token logits as unpadded (up to rounding).
    assert _real_positions_diff(left, _shift_left(full), LEFT_MASK) <= MAX_LOGIT_DIFF
    if config.rope_scaling is not None:  # the comparison can tell whether the scaling is applied
        unscaled = dataclasses.replace(config, rope_scaling=None)
        wrong = np.asarray(_forward(params, unscaled, jnp.asarray(FULL_IDS)).logits)
        assert np.max(np.abs(wrong - ref["logits_full"])) > 100 * MAX_LOGIT_DIFF


def _shift_left(full: np.ndarray) -> np.ndarray:
    """``full`` logits of each PADDED_ROWS prefix laid out as LEFT_IDS is (left-aligned padding)."""
    out = np.zeros_like(full)
    for index, length in enumerate(PADDED_LENGTHS):
        out[index, SEQ_LEN - length:] = full[index, :length]
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_generation_matches_transformers(variant: str, loaded: Callable[..., Any],
                                                record_property: pytest.RecordProperty) -> None:
    config, params, ref = loaded(variant)
    # The smallest top-1/top-2 logit margin on transformers' greedy paths (~4e-3 here) is far above
    # the logit differences (~2e-6), so equal tokens are expected, not lucky.
    record_property(f"llama_generation_min_margin_{variant}", float(ref["min_top2_gap"]))
    left = greedy_generate(params, config, jnp.asarray(PROMPT_LEFT), jnp.asarray(PROMPT_LEFT_MASK),
                           max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), pad_token_id=PAD)
    np.testing.assert_array_equal(np.asarray(left.tokens), ref["generated_noeos"])
    assert not np.asarray(left.finished).any()
    np.testing.assert_array_equal(np.asarray(left.num_generated), MAX_NEW_TOKENS)

    right = greedy_generate(params, config, jnp.asarray(PROMPT_RIGHT),
                            jnp.asarray(PROMPT_RIGHT_MASK), max_new_tokens=MAX_NEW_TOKENS,
                            eos_token_ids=(), pad_token_id=PAD)
    np.testing.assert_array_equal(np.asarray(right.tokens), ref["generated_noeos"])

    eos_id = int(ref["eos_id"])
    stopped = greedy_generate(params, config, jnp.asarray(PROMPT_LEFT),
                              jnp.asarray(PROMPT_LEFT_MASK), max_new_tokens=MAX_NEW_TOKENS,
                              eos_token_ids=(eos_id,), pad_token_id=PAD)
    tokens = np.asarray(stopped.tokens)
    np.testing.assert_array_equal(tokens, ref["generated_eos"])
    for row in range(tokens.shape[0]):
        hits = np.flatnonzero(ref["generated_noeos"][row] == eos_id)
        expected = int(hits[0]) + 1 if hits.size else MAX_NEW_TOKENS
        assert int(stopped.num_generated[row]) == expected
        assert bool(stopped.finished[row]) == bool(hits.size)
        assert (tokens[row, expected:] == PAD).all()
    assert int(stopped.num_generated[0]) <= 4  # eos_id is row 0's 4th token


# ---------------------------------------------------------------------------------------------------
# KV cache and inputs


@pytest.mark.parametrize("variant", ["default", "llama3"])
def test_incremental_decoding_matches_full_forward(variant: str) -> None:
    config = LlamaConfig.from_hf(VARIANTS[variant])
    params = init_params(config, jax.random.key(0))
    full = np.asarray(_forward(params, config, jnp.asarray(LEFT_IDS),
                               attention_mask=jnp.asarray(LEFT_MASK)).logits)
    cache = init_cache(config, LEFT_IDS.shape[0], SEQ_LEN + 4)
    pieces, start = [], 0
    for size in (5, 1, 1, 3, 2):  # chunked prefill, then single tokens, then chunks
        chunk = slice(start, start + size)
        out = _forward(params, config, jnp.asarray(LEFT_IDS[:, chunk]),
                       attention_mask=jnp.asarray(LEFT_MASK[:, chunk]), cache=cache)
        cache, start = out.cache, start + size
        pieces.append(np.asarray(out.logits))
    assert start == SEQ_LEN
    incremental = np.concatenate(pieces, axis=1)
    assert _real_positions_diff(incremental, full, LEFT_MASK) <= 1e-5
    np.testing.assert_array_equal(np.asarray(cache.lengths), PADDED_LENGTHS)
    assert int(cache.index) == SEQ_LEN
    np.testing.assert_array_equal(np.asarray(cache.valid[:, :SEQ_LEN]), LEFT_MASK.astype(bool))


def test_inputs_embeds_equal_input_ids() -> None:
    config = LlamaConfig.from_hf(VARIANTS["llama3"])
    params = init_params(config, jax.random.key(1))
    ids = jnp.asarray(FULL_IDS)
    by_ids = _forward(params, config, ids)
    embeddings = embed(params, config, ids)
    assert embeddings.shape == (*FULL_IDS.shape, config.hidden_size)
    by_embeds = _forward(params, config, inputs_embeds=embeddings)
    np.testing.assert_array_equal(np.asarray(by_ids.logits), np.asarray(by_embeds.logits))
    np.testing.assert_array_equal(np.asarray(by_ids.hidden_states),
                                  np.asarray(by_embeds.hidden_states))
    # A spliced vector changes the outputs from its position on only (causality).
    spliced = embeddings.at[:, 5].set(jnp.linspace(-1.0, 1.0, config.hidden_size))
    changed = np.asarray(_forward(params, config, inputs_embeds=spliced).logits)
    np.testing.assert_array_equal(changed[:, :5], np.asarray(by_ids.logits)[:, :5])
    assert np.abs(changed[:, 5:] - np.asarray(by_ids.logits)[:, 5:]).min(axis=-1).max() > 0
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        forward(params, config, ids, inputs_embeds=embeddings)
    with pytest.raises(ValueError, match=r"inputs_embeds must be \(B, L, 64\)"):
        forward(params, config, inputs_embeds=embeddings[..., :10])


def test_bfloat16_parameters(tmp_path: Path) -> None:
    config = LlamaConfig.from_hf(VARIANTS["default"])
    params = init_params(config, jax.random.key(2))
    half = jax.tree_util.tree_map(lambda leaf: leaf.astype(jnp.bfloat16), params)
    full_logits = np.asarray(_forward(params, config, jnp.asarray(FULL_IDS)).logits)
    out = _forward(half, config, jnp.asarray(FULL_IDS))
    assert out.logits.dtype == jnp.float32 and out.hidden_states.dtype == jnp.bfloat16
    assert np.abs(np.asarray(out.logits) - full_logits).max() < 0.1 * np.abs(full_logits).max()
    generated = greedy_generate(half, config, jnp.asarray(PROMPT_LEFT),
                                jnp.asarray(PROMPT_LEFT_MASK), max_new_tokens=3)
    assert generated.tokens.shape == (len(PROMPT_LENGTHS), 3)


# ---------------------------------------------------------------------------------------------------
# Configs


def test_config_from_hf_layouts() -> None:
    legacy = dict(BASE_CONFIG, rope_theta=500000.0, rope_scaling={
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}, eos_token_id=[2, 3])
    modern = dict(BASE_CONFIG, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, eos_token_id=[2, 3])
    config = LlamaConfig.from_hf(legacy)
    assert config == LlamaConfig.from_hf(modern)
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 32)
    assert config.eos_token_ids == (2, 3) and config.head_dim == 16
    assert config.num_key_value_groups == 2
    assert LlamaConfig.from_hf(config.to_hf()) == config

    class FakeTransformersConfig:  # what transformers.LlamaConfig offers: to_dict()
        def to_dict(self) -> dict[str, Any]:
            return modern

    assert LlamaConfig.from_hf(FakeTransformersConfig()) == config
    plain = LlamaConfig.from_hf(dict(BASE_CONFIG, num_key_value_heads=None))
    assert plain.num_key_value_heads == 4 and plain.rope_scaling is None
    assert plain.rope_theta == 10000.0
    hash(config)  # static jit argument


def test_llama3_frequencies_follow_the_piecewise_rule() -> None:
    base = LlamaConfig.from_hf(dict(BASE_CONFIG, rope_theta=500000.0))
    scaled = LlamaConfig.from_hf(dict(VARIANTS["llama3"]))
    plain, rule = rope_inverse_frequencies(base), rope_inverse_frequencies(scaled)
    wavelength = 2 * np.pi / plain
    high = wavelength < 256 / 4  # short wavelengths kept
    low = wavelength > 256 / 1  # long wavelengths divided by the factor
    assert high.any() and low.any() and (~high & ~low).any()
    np.testing.assert_allclose(rule[high], plain[high], rtol=1e-7)
    np.testing.assert_allclose(rule[low], plain[low] / 8.0, rtol=1e-6)
    middle = ~high & ~low
    assert ((rule[middle] < plain[middle]) & (rule[middle] > plain[middle] / 8.0)).all()
    linear = LlamaConfig.from_hf(dict(BASE_CONFIG, rope_scaling={"type": "linear", "factor": 2.0}))
    np.testing.assert_allclose(rope_inverse_frequencies(linear),
                               rope_inverse_frequencies(LlamaConfig.from_hf(BASE_CONFIG)) / 2)


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"num_key_value_heads": 3}, "must be a multiple of num_key_value_heads"),
    ({"model_type": "bert"}, "is not a Llama model"),
    ({"vocab_size": None}, "missing required field 'vocab_size'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "missing 'low_freq_factor'"),
])
def test_config_rejects(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LlamaConfig.from_hf(dict(BASE_CONFIG, **change))


# ---------------------------------------------------------------------------------------------------
# Loader errors and GGUF permutation


def _save_tiny_checkpoint(directory: Path, config: LlamaConfig, params: Any) -> dict[str, np.ndarray]:
    """Write a Hugging Face-layout directory (config.json + model.safetensors) of our params."""
    from safetensors.numpy import save_file

    state: dict[str, np.ndarray] = {"model.embed_tokens.weight":
                                    np.asarray(params["embed_tokens"]["embedding"]),
                                    "model.norm.weight": np.asarray(params["norm"]["scale"])}
    for layer in range(config.num_hidden_layers):
        tree = params[f"layers_{layer}"]
        prefix = f"model.layers.{layer}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[f"{prefix}{norm}.weight"] = np.asarray(tree[norm]["scale"])
        for group, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                             ("mlp", ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                state[f"{prefix}{group}.{name}.weight"] = np.ascontiguousarray(
                    np.asarray(tree[group][name]["kernel"]).T)
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = np.ascontiguousarray(np.asarray(params["lm_head"]["kernel"]).T)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config.to_hf()))
    save_file(state, str(directory / "model.safetensors"))
    return state


def test_hf_roundtrip_and_errors_name_the_tensor(tmp_path: Path) -> None:
    config = LlamaConfig.from_hf(VARIANTS["default"])
    params = init_params(config, jax.random.key(3))
    state = _save_tiny_checkpoint(tmp_path / "model", config, params)
    loaded_config, loaded_params = load_hf_checkpoint(tmp_path / "model")
    assert loaded_config == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded_params, params)
    half_config, half = load_hf_checkpoint(tmp_path / "model", dtype=jnp.bfloat16)
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree_util.tree_leaves(half))

    missing = dict(state)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(WeightLoadError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj"):
        llama_params_from_state_dict(missing, config)
    misshaped = dict(state, **{"model.layers.0.self_attn.k_proj.weight": np.zeros((31, 64))})
    with pytest.raises(WeightLoadError,
                       match=r"k_proj\.weight' has shape \(31, 64\), expected \(32, 64\)"):
        llama_params_from_state_dict(misshaped, config)
    extra = dict(state, **{"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(8),
                           "model.extra.weight": np.zeros(2)})
    with pytest.warns(UserWarning, match=r"1 tensor\(s\) not used .*model\.extra\.weight"):
        llama_params_from_state_dict(extra, config)
    with pytest.raises(ValueError, match="dtype must be a floating type"):
        llama_params_from_state_dict(state, config, dtype=jnp.int32)

    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFilesNotFoundError, match="'config.json' not found"):
        load_hf_checkpoint(tmp_path / "empty")
    (tmp_path / "no_weights").mkdir()
    (tmp_path / "no_weights" / "config.json").write_text(json.dumps(config.to_hf()))
    with pytest.raises(ModelFilesNotFoundError, match="model.safetensors"):
        load_hf_checkpoint(tmp_path / "no_weights")


def test_sharded_checkpoint_and_missing_shard(reference: Callable[..., Any], tmp_path: Path) -> None:
    model_dir, _ = reference("llama3")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (model_dir / "model.safetensors").exists()
    assert len(hf_state_dict(model_dir)) == len(index["weight_map"])
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in model_dir.iterdir():
        if path.name != shards[-1]:
            (broken / path.name).symlink_to(path)
    with pytest.raises(ModelFilesNotFoundError, match=shards[-1]):
        load_hf_checkpoint(broken)
    assert load_hf_config(model_dir).tie_word_embeddings


def test_gguf_rotary_permutation_roundtrip() -> None:
    weight = np.arange(3 * 8 * 5, dtype=np.float32).reshape(3 * 8, 5)  # 3 heads of width 8
    permuted = permute_rotary_rows(weight, 3)
    # Head 0's rows 0..7 (halves [0,1,2,3] and [4,5,6,7]) become interleaved pairs.
    np.testing.assert_array_equal(permuted[:8, 0], weight[[0, 4, 1, 5, 2, 6, 3, 7], 0])
    np.testing.assert_array_equal(unpermute_rotary_rows(permuted, 3), weight)
    bias = np.arange(24.0)
    np.testing.assert_array_equal(unpermute_rotary_rows(permute_rotary_rows(bias, 3), 3), bias)
    with pytest.raises(WeightLoadError, match="cannot un-permute"):
        unpermute_rotary_rows(np.zeros((9, 2)), 3)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
