"""LoRA fine-tuning leaves the backbone bit-identical; LoRA merge math; gradient accumulation with
optax.MultiSteps; presets."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.imaginer import lora as lora_lib
from imaginejax.imaginer.finetune import (
    LLAMA2_DIR_ENV,
    PRESETS,
    build_base_model,
    finetune,
    get_preset,
    load_imaginer,
    make_optimizer,
    params_fingerprint,
)
from imaginejax.imaginer.llama import LlamaConfig, init_params
from test_kalm_finetune import NUM_ACTIONS, TEST_ARCHITECTURE, synthetic_dataset

LORA_OVERRIDES = dict(architecture=TEST_ARCHITECTURE, lora_rank=4, lora_alpha=8.0, num_steps=4,
                      learning_rate=1e-2, warmup_steps=0, log_every=2, checkpoint_every=1000,
                      num_actions=NUM_ACTIONS, progress=False,
                      batch_sizes={"rollout": 4, "dynamics": 4})


def test_lora_trains_adapters_and_leaves_the_backbone_bit_identical(tmp_path: Path) -> None:
    preset = get_preset("tiny", **{k: v for k, v in LORA_OVERRIDES.items()
                                   if k not in ("num_actions", "progress")})
    reference = build_base_model(preset, jax.random.split(jax.random.key(preset.seed))[0]).params
    result = finetune("tiny", synthetic_dataset(), tmp_path / "lora", **LORA_OVERRIDES)
    assert set(result.state.trainable) == {"lora", "kalm"}
    frozen = result.frozen["llama"]
    jax.tree.map(np.testing.assert_array_equal, frozen, reference)  # bit-identical backbone
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    merged = result.imaginer.params["llama"]
    for layer in range(TEST_ARCHITECTURE["num_hidden_layers"]):
        name = f"layers_{layer}"
        for target in lora_lib.ATTENTION_TARGETS:  # the default targets
            factors = result.state.trainable["lora"][name][target]
            assert np.abs(np.asarray(factors["b"])).max() > 0, (name, target)
            assert not np.array_equal(merged[name]["self_attn"][target]["kernel"],
                                      frozen[name]["self_attn"][target]["kernel"])
        jax.tree.map(np.testing.assert_array_equal, merged[name]["mlp"], frozen[name]["mlp"])
    np.testing.assert_array_equal(merged["embed_tokens"]["embedding"],
                                  frozen["embed_tokens"]["embedding"])
    # The run directory loads back (the backbone is rebuilt from the preset and checked).
    loaded = load_imaginer(result.run_dir)
    assert params_fingerprint(loaded.params) == params_fingerprint(result.imaginer.params)
    assert loaded.checkpoint_hash == result.imaginer.checkpoint_hash


def test_merge_lora_adds_the_scaled_low_rank_product() -> None:
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    base = init_params(config, jax.random.key(0))
    lora = lora_lib.init_lora(jax.random.key(1), base, config, rank=2)
    unchanged = lora_lib.merge_lora(base, lora, 4.0)  # b = 0 at init: the base model
    jax.tree.map(np.testing.assert_array_equal, unchanged, base)
    lora["layers_0"]["k_proj"]["b"] = jnp.ones((2, 4))
    merged = lora_lib.merge_lora(base, lora, 4.0)
    a = np.asarray(lora["layers_0"]["k_proj"]["a"])
    want = np.asarray(base["layers_0"]["self_attn"]["k_proj"]["kernel"]) + 4.0 * a @ np.ones((2, 4))
    np.testing.assert_allclose(merged["layers_0"]["self_attn"]["k_proj"]["kernel"], want, rtol=1e-6)
    assert lora_lib.lora_scale(4, 8.0) == 2.0
    with pytest.raises(ValueError, match="rank"):
        lora_lib.init_lora(jax.random.key(1), base, config, rank=0)


def test_attached_lora_computes_the_merged_model_and_its_gradients_without_the_kernels_gradient() -> None:
    from imaginejax.imaginer.llama import forward

    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    base = init_params(config, jax.random.key(0))
    lora = lora_lib.init_lora(jax.random.key(1), base, config, rank=2, targets=lora_lib.LORA_TARGETS)
    lora = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(x.size), x.shape), lora)
    ids = jnp.array([[1, 5, 3, 7, 2, 9]])

    def logits(adapters: dict, combine) -> jax.Array:
        return forward(combine(base, adapters, 0.5), config, ids).logits

    merged, attached = logits(lora, lora_lib.merge_lora), logits(lora, lora_lib.attach_lora)
    np.testing.assert_allclose(attached, merged, rtol=1e-5, atol=1e-5)
    # Without adapters the projection is nn.Dense exactly (the base model, bit for bit).
    np.testing.assert_array_equal(logits({}, lora_lib.attach_lora), forward(base, config, ids).logits)
    grads = [jax.grad(lambda t, c=combine: logits(t, c)[0, -1, 3])(lora)
             for combine in (lora_lib.merge_lora, lora_lib.attach_lora)]
    jax.tree.map(lambda g, h: np.testing.assert_allclose(h, g, rtol=1e-4, atol=1e-6), *grads)
    # The attached step never forms a kernel-sized gradient: XLA counts fewer FLOPs (here 2 layers, 7 targets).
    counted = []
    for combine in (lora_lib.merge_lora, lora_lib.attach_lora):
        compiled = jax.jit(jax.grad(lambda t, c=combine: logits(t, c).sum())).lower(lora).compile()
        cost = compiled.cost_analysis()
        counted.append((cost[0] if isinstance(cost, list) else cost)["flops"])
    assert counted[1] < counted[0]


def test_a_run_with_attached_lora_trains_as_the_merged_one_and_records_its_form(tmp_path: Path) -> None:
    import json

    runs = {form: finetune("tiny", synthetic_dataset(), tmp_path / form, **LORA_OVERRIDES, lora_form=form)
            for form in ("merged", "attached")}
    losses = {form: [row["loss"] for row in run.history] for form, run in runs.items()}
    np.testing.assert_allclose(losses["attached"], losses["merged"], rtol=1e-4)
    presets = {form: json.loads((run.run_dir / "run.json").read_text())["preset"] for form, run in runs.items()}
    assert "lora_form" not in presets["merged"] and presets["attached"]["lora_form"] == "attached"
    loaded = load_imaginer(runs["attached"].run_dir)  # generation uses the merged kernels either way
    assert params_fingerprint(loaded.params) == params_fingerprint(runs["attached"].imaginer.params)
    with pytest.raises(ValueError, match="lora_form = 'fused' is not one of merged, attached"):
        get_preset("tiny", lora_form="fused")


def test_mlp_targets_merge_into_the_mlp_and_round_trip_through_a_run(tmp_path: Path) -> None:
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    base = init_params(config, jax.random.key(0))
    lora = lora_lib.init_lora(jax.random.key(1), base, config, rank=2, targets=lora_lib.LORA_TARGETS)
    assert set(lora["layers_0"]) == set(lora_lib.LORA_TARGETS)
    assert lora["layers_0"]["down_proj"]["a"].shape == (16, 2) and lora["layers_0"]["down_proj"]["b"].shape == (2, 8)
    lora["layers_0"]["down_proj"]["b"] = jnp.ones((2, 8))
    merged = lora_lib.merge_lora(base, lora, 0.5)
    a = np.asarray(lora["layers_0"]["down_proj"]["a"])
    want = np.asarray(base["layers_0"]["mlp"]["down_proj"]["kernel"]) + 0.5 * a @ np.ones((2, 8))
    np.testing.assert_allclose(merged["layers_0"]["mlp"]["down_proj"]["kernel"], want, rtol=1e-6)
    np.testing.assert_array_equal(merged["layers_0"]["mlp"]["up_proj"]["kernel"],
                                  base["layers_0"]["mlp"]["up_proj"]["kernel"])  # its b is still zero
    # A run with MLP targets trains them, records them, and loads back with the same parameters.
    overrides = dict(LORA_OVERRIDES, lora_targets=["q_proj", "gate_proj", "down_proj"])
    result = finetune("tiny", synthetic_dataset(), tmp_path / "mlp", **overrides)
    adapters = result.state.trainable["lora"]["layers_0"]
    assert set(adapters) == {"q_proj", "gate_proj", "down_proj"}
    assert np.abs(np.asarray(adapters["gate_proj"]["b"])).max() > 0
    loaded = load_imaginer(result.run_dir)
    assert params_fingerprint(loaded.params) == params_fingerprint(result.imaginer.params)
    with pytest.raises(ValueError, match="unknown lora_targets.*lm_head"):
        get_preset("tiny", lora_targets=("q_proj", "lm_head"))
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        lora_lib.init_lora(jax.random.key(1), base, config, rank=2, targets=("embed",))


def test_gradient_accumulation_updates_every_k_micro_batches() -> None:
    preset = get_preset("tiny", grad_accum=2, learning_rate=0.1, warmup_steps=0, weight_decay=0.0)
    optimizer = make_optimizer(preset, num_steps=8)
    inner = make_optimizer(preset.replace(grad_accum=1), num_steps=4)
    params = {"w": jnp.array([[1.0, -2.0], [0.5, 3.0]])}
    grads = [{"w": jnp.array([[1.0, 0.0], [2.0, -1.0]])}, {"w": jnp.array([[3.0, 2.0], [0.0, 1.0]])}]
    state = optimizer.init(params)
    first, state = optimizer.update(grads[0], state, params)
    np.testing.assert_array_equal(first["w"], np.zeros((2, 2)))  # accumulating
    second, state = optimizer.update(grads[1], state, params)
    mean = jax.tree.map(lambda x, y: (x + y) / 2, grads[0], grads[1])
    want, _ = inner.update(mean, inner.init(params), params)
    np.testing.assert_allclose(second["w"], want["w"], rtol=1e-6)


def test_presets() -> None:
    assert set(PRESETS) == {"tiny", "smollm2-135m", "smollm2-lora", "smollm2-lora-all", "llama2-7b"}
    assert PRESETS["smollm2-lora"].lora_targets == lora_lib.ATTENTION_TARGETS
    assert PRESETS["smollm2-lora-all"].lora_targets == lora_lib.LORA_TARGETS
    lora = PRESETS["smollm2-lora"]
    assert lora.source == "gguf" and lora.lora_rank == 16 and lora.state_prediction == "delta"
    tiny = PRESETS["tiny"]
    assert tiny.source == "random" and tiny.tokenizer == "smollm2" and tiny.lora_rank == 0
    assert 2 <= tiny.architecture["num_hidden_layers"] <= 4
    assert 128 <= tiny.architecture["hidden_size"] <= 256
    assert PRESETS["smollm2-135m"].source == "gguf"
    llama2 = PRESETS["llama2-7b"]
    assert llama2.source == "hf" and llama2.dtype == "bfloat16" and llama2.grad_accum > 1
    assert get_preset("tiny", lora_rank=8).lora_rank == 8
    with pytest.raises(ValueError, match="unknown imaginer preset"):
        get_preset("gpt-5")


def test_llama2_preset_without_a_checkpoint_says_where_to_put_it(monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.delenv(LLAMA2_DIR_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=LLAMA2_DIR_ENV):
        build_base_model(PRESETS["llama2-7b"], jax.random.key(0))
