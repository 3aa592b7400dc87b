"""Mixed precision of the imaginer (``compute_dtype="bfloat16"``): bfloat16 matmuls, float32 everything
else, against the float32 path.

Tolerances. bfloat16 keeps 8 significant bits (unit roundoff 2^-9 ≈ 0.2 %); every matmul rounds its
inputs once, and the errors of the layers add up like a random walk, so the logits of an L-layer model
differ from float32 by roughly 0.2-0.5 % × sqrt(L) in relative L2 norm per position. Measured here:
the ``tiny`` architecture (4 layers, random weights) 0.57 % mean / 0.72 % worst position, argmax equal
everywhere; SmolLM2-135M (30 layers, its real weights) 1.4 % mean / 4.7 % worst, argmax equal on 47 of
48 positions; the KALM heads of ``tiny`` 0.7 % mean / 3.2 % worst. The bounds below leave about 2-3×
margin over these.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.imaginer.finetune import (TINY_ARCHITECTURE, _initial_trainable, _kalm_setup, finetune, get_preset,
                                          load_imaginer, with_compute_dtype)
from imaginejax.imaginer.generate import prefill
from imaginejax.imaginer.kalm import (TASK_TARGETS, TASKS, adapter_apply, embedding_std, kalm_hidden,
                                      sample_task_batches, task_loss)
from imaginejax.imaginer.llama import LlamaConfig, compute_setting, forward, init_params
from imaginejax.imaginer.records import Preset, RunRecordError, check_run_record

from test_kalm_finetune import OVERRIDES, synthetic_dataset  # tests/ is on sys.path (conftest)

TINY_LOGITS_MEAN, TINY_LOGITS_WORST, TINY_ARGMAX = 0.02, 0.03, 0.95
SMOLLM2_LOGITS_MEAN, SMOLLM2_LOGITS_WORST, SMOLLM2_ARGMAX = 0.04, 0.12, 0.9
HEADS_MEAN, HEADS_WORST = 0.025, 0.1

_forward = jax.jit(forward, static_argnames=("config", "dtype", "precision"))
DOT = re.compile(r"stablehlo\.dot_general .*precision = \[(\w+), \w+\] : \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)")


def dots(text: str) -> list[tuple[str, str, str]]:
    """(precision, lhs dtype, rhs dtype) of every dot_general of a lowered StableHLO module."""
    return DOT.findall(text)


def relative_errors(full: np.ndarray, half: np.ndarray) -> np.ndarray:
    """|half - full| / |full| per position (L2 over the last axis)."""
    return np.linalg.norm(half - full, axis=-1) / np.linalg.norm(full, axis=-1)


def tiny_llama() -> tuple[LlamaConfig, Any, jax.Array]:
    config = LlamaConfig(vocab_size=49152, **TINY_ARCHITECTURE)
    return config, init_params(config, jax.random.key(0)), jax.random.randint(jax.random.key(1), (4, 64), 0, 49152)


@pytest.fixture(scope="module")
def kalm() -> tuple[Any, ...]:
    """(config, params, batches, normalizer) of the ``tiny`` preset at initialisation on synthetic data."""
    preset = get_preset("tiny")
    base, config, corpus, layout, normalizer, key = _kalm_setup(preset, [synthetic_dataset()], 8)
    params, _ = _initial_trainable(preset, base.params, config, key, embedding_std(base.params))
    batches = sample_task_batches(corpus, base.text_format, layout, config, {t: 6 for t in TASKS},
                                  np.random.default_rng(0))
    return config, params, batches, normalizer


def test_compute_setting_names() -> None:
    assert compute_setting("float32") == (None, jax.lax.Precision.HIGHEST)
    assert compute_setting("bfloat16") == (jnp.bfloat16, None)
    with pytest.raises(ValueError, match="'float16' is not supported; use one of"):
        compute_setting("float16")


def test_float32_compute_dtype_is_the_default_path_bit_for_bit(kalm: tuple[Any, ...]) -> None:
    config, params, batches, normalizer = kalm
    assert config.compute_dtype == "float32" and "compute_dtype" not in config.to_json()
    llama, ids = config.llama, batches["explanation"].tokens
    default = _forward(params["llama"], llama, ids)
    explicit = _forward(params["llama"], llama, ids, dtype=None, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_array_equal(np.asarray(default.logits), np.asarray(explicit.logits))
    text = jax.jit(forward, static_argnames="config").lower(params["llama"], llama, ids).as_text()
    assert "bf16" not in text and {p for p, _, _ in dots(text)} == {"HIGHEST"}
    # The KALM loss of a config naming float32 equals the default config's, bit for bit.
    named = dataclasses.replace(config, compute_dtype="float32")
    loss = jax.jit(task_loss, static_argnums=(1, 4))
    for task in TASKS:
        ours = loss(params, named, batches[task], normalizer, TASK_TARGETS[task])[1]
        default_metrics = loss(params, config, batches[task], normalizer, TASK_TARGETS[task])[1]
        for name, value in default_metrics.items():
            np.testing.assert_array_equal(np.asarray(ours[name]), np.asarray(value), err_msg=f"{task}/{name}")


def test_bfloat16_forward_runs_every_matmul_in_bfloat16() -> None:
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    params = init_params(config, jax.random.key(0))
    ids = jnp.zeros((2, 5), jnp.int32)
    dtype, precision = compute_setting("bfloat16")
    text = jax.jit(forward, static_argnames=("config", "dtype", "precision")).lower(
        params, config, ids, dtype=dtype, precision=precision).as_text()
    found = dots(text)
    # q, k, v, o, scores, context, gate, up, down per layer; the LM head.
    assert len(found) == 9 * config.num_hidden_layers + 1
    assert set(found) == {("DEFAULT", "bf16", "bf16")}
    out = _forward(params, config, ids, dtype=dtype, precision=precision)
    assert out.logits.dtype == jnp.float32 and out.hidden_states.dtype == jnp.float32  # the residual stream
    assert jax.tree.leaves(params)[0].dtype == jnp.float32
    _, cache = prefill(params, config, input_ids=ids, max_length=8, dtype=dtype, precision=precision)
    assert {k.dtype for k in cache.keys + cache.values} == {jnp.dtype(jnp.bfloat16)}


def test_bfloat16_logits_of_tiny_are_close_to_float32() -> None:
    config, params, ids = tiny_llama()
    dtype, precision = compute_setting("bfloat16")
    full = np.asarray(_forward(params, config, ids).logits)
    half = np.asarray(_forward(params, config, ids, dtype=dtype, precision=precision).logits)
    errors = relative_errors(full, half)
    assert errors.mean() < TINY_LOGITS_MEAN and errors.max() < TINY_LOGITS_WORST, errors
    assert np.mean(full.argmax(-1) == half.argmax(-1)) >= TINY_ARGMAX


def test_bfloat16_kalm_heads_are_close_to_float32_and_return_float32(kalm: tuple[Any, ...]) -> None:
    config, params, batches, normalizer = kalm
    half = dataclasses.replace(config, compute_dtype="bfloat16")
    hidden = jax.jit(kalm_hidden, static_argnums=1)
    for task in ("rollout", "explanation"):
        batch = batches[task]
        h_full, h_half = hidden(params, config, batch, normalizer), hidden(params, half, batch, normalizer)
        mask = np.asarray(batch.attention_mask)
        for method in ("predict_state", "predict_action"):
            full = np.asarray(adapter_apply(params, config, method, h_full))
            out = adapter_apply(params, half, method, h_half)
            assert out.dtype == jnp.float32
            errors = relative_errors(full[mask], np.asarray(out)[mask])
            assert errors.mean() < HEADS_MEAN and errors.max() < HEADS_WORST, (task, method, errors)
        losses = [jax.jit(task_loss, static_argnums=(1, 4))(params, c, batch, normalizer, TASK_TARGETS[task])[0]
                  for c in (config, half)]
        assert losses[1].dtype == jnp.float32
        assert abs(float(losses[1]) - float(losses[0])) < 0.01 * float(losses[0])


def bf16_finetune(run_dir: Path, **extra: Any) -> Any:
    """12 bfloat16 steps of the test's shrunken ``tiny`` on the synthetic trajectories."""
    return finetune("tiny", synthetic_dataset(), run_dir, **dict(OVERRIDES, num_steps=12, log_every=4, warmup_steps=2,
                                                                   compute_dtype="bfloat16", **extra))


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A bfloat16 full fine-tuning run (FinetuneResult)."""
    return bf16_finetune(tmp_path_factory.mktemp("bf16") / "run")


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_bfloat16_finetuning_learns_and_keeps_float32_state(mode: str, bf16_run: Any, tmp_path: Path) -> None:
    result = bf16_run if mode == "full" else bf16_finetune(tmp_path / "run", lora_rank=4, learning_rate=1e-2)
    losses = [row["loss"] for row in result.history]
    # LoRA starts exactly at the random backbone and moves it through rank-4 updates: slower, still down.
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < (0.95 if mode == "lora" else 0.8) * losses[0], losses
    dtypes = {leaf.dtype for leaf in jax.tree.leaves((result.state.trainable, result.state.opt_state))}
    assert dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}, dtypes  # master weights, Adam moments, counts
    assert set(result.state.trainable) == ({"lora", "kalm"} if mode == "lora" else {"llama", "kalm"})
    record = json.loads((result.run_dir / "run.json").read_text(encoding="utf-8"))
    assert record["preset"]["compute_dtype"] == record["kalm_config"]["compute_dtype"] == "bfloat16"
    assert result.imaginer.config.compute_dtype == "bfloat16"


def test_compute_dtype_is_recorded_only_when_not_float32() -> None:
    assert "compute_dtype" not in Preset(name="x", source="random").to_json()
    preset = Preset(name="x", source="random", compute_dtype="bfloat16")
    assert preset.to_json()["compute_dtype"] == "bfloat16" and Preset.from_json(preset.to_json()) == preset
    with pytest.raises(ValueError, match="compute_dtype = 'float16' is not one of float32, bfloat16"):
        Preset(name="x", source="random", compute_dtype="float16")


def test_a_precision_mismatch_is_refused_naming_both(bf16_run: Any) -> None:
    run_dir = bf16_run.run_dir
    assert load_imaginer(run_dir).config.compute_dtype == "bfloat16"
    assert load_imaginer(run_dir, compute_dtype="bfloat16").config.compute_dtype == "bfloat16"
    with pytest.raises(ValueError, match="fine-tuned with compute_dtype 'bfloat16', but compute_dtype 'float32' "
                                         "was asked for") as error:
        load_imaginer(run_dir, compute_dtype="float32")
    assert "with_compute_dtype" in str(error.value)
    # Resuming the run in another precision names the field and both values.
    with pytest.raises(ValueError, match="compute_dtype 'bfloat16' in the run, 'float32' now"):
        finetune("tiny", synthetic_dataset(), run_dir, **dict(OVERRIDES, num_steps=12, log_every=4, warmup_steps=2))
    # A record whose KALM config disagrees with its preset is refused.
    record = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    check_run_record(record, run_dir / "run.json")
    record["kalm_config"]["compute_dtype"] = "float32"
    with pytest.raises(RunRecordError, match="kalm_config.compute_dtype is 'float32': not the preset's "
                                             "compute_dtype 'bfloat16'"):
        check_run_record(record, run_dir / "run.json")
    # The explicit override: the same weights computing in float32, its training dtype kept.
    imaginer = with_compute_dtype(load_imaginer(run_dir), "float32")
    assert (imaginer.config.compute_dtype, imaginer.trained_compute_dtype) == ("float32", "bfloat16")
    back = with_compute_dtype(imaginer, "bfloat16")
    assert (back.config.compute_dtype, back.trained_compute_dtype) == ("bfloat16", None)


def test_shipped_imaginer_refuses_another_compute_dtype() -> None:
    from imaginejax.imaginer.shipped import ShippedImaginerError, load_shipped

    with pytest.raises(ShippedImaginerError, match="clevr-smollm2-lora-all was fine-tuned with compute_dtype "
                                                   "'float32', but compute_dtype 'bfloat16' was asked for"):
        load_shipped("clevr", compute_dtype="bfloat16")


def test_bfloat16_logits_of_smollm2_are_close_to_float32() -> None:
    from imaginejax.imaginer import load_gguf, load_gguf_tokenizer, smollm2_gguf_path

    config, params = load_gguf(smollm2_gguf_path())
    tokenizer = load_gguf_tokenizer(smollm2_gguf_path())
    texts = ["Push the red ball to the left of the blue ball. Then move the green ball behind the red one, "
             "and stop when done.",
             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nThe capital "
             "of France is Paris, a city"]
    ids = jnp.asarray([tokenizer.encode(text).ids[:24] for text in texts])
    dtype, precision = compute_setting("bfloat16")
    full = np.asarray(_forward(params, config, ids).logits)
    half = np.asarray(_forward(params, config, ids, dtype=dtype, precision=precision).logits)
    errors = relative_errors(full, half)
    print(f"SmolLM2-135M bfloat16 vs float32 logits: relative error mean {errors.mean():.4f}, worst "
          f"{errors.max():.4f}; argmax agreement {np.mean(full.argmax(-1) == half.argmax(-1)):.3f}")
    assert errors.mean() < SMOLLM2_LOGITS_MEAN and errors.max() < SMOLLM2_LOGITS_WORST, errors
    assert np.mean(full.argmax(-1) == half.argmax(-1)) >= SMOLLM2_ARGMAX


def test_rollouts_generated_in_bfloat16_say_so() -> None:
    """Generation in the imaginer's compute dtype, recorded in the provenance; with fixed heads (states and
    actions that do not depend on the hidden states) a bfloat16 backbone writes the float32 rollouts."""
    from imaginejax.envs import make
    from imaginejax.imaginer.imagine import imagine

    from test_imagine import RED_BEHIND_BLUE, RED_IN_FRONT_OF_BLUE, make_imaginer

    env, params = make("clevr", "rephrase", embed=False)
    imaginer = make_imaginer(fixed_heads=True)
    tasks = np.array([RED_BEHIND_BLUE, RED_IN_FRONT_OF_BLUE] * 2)
    run = lambda im: imagine(im, env, params, jax.random.key(4), 4, task_indices=tasks, horizon=6,  # noqa: E731
                             progress=False, quality=False).dataset
    full, half = run(imaginer), run(with_compute_dtype(imaginer, "bfloat16"))
    assert full.provenance["compute_dtype"] == "float32" and "trained_compute_dtype" not in full.provenance
    assert (half.provenance["compute_dtype"], half.provenance["trained_compute_dtype"]) == ("bfloat16", "float32")
    assert half.states.dtype == np.float32
    for field in ("states", "actions", "rewards", "mask"):
        np.testing.assert_array_equal(getattr(half, field), getattr(full, field), err_msg=field)
