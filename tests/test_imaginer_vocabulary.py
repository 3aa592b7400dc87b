"""A corpus vocabulary (Preset.vocabulary = "corpus"): the tokenizer restricted to the tokens of the
fine-tuning instructions tokenizes those exactly as SmolLM2's full tokenizer does and any other text in
kept pieces (decoding back to it); a tiny imaginer trained with it records the kept ids, reloads from its
run directory, and ships whole (export / load_shipped give the same weights and the same rollouts);
records and presets that misuse it are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from test_imaginer_validation import ROWS, SMALL, clevr_like

from imaginejax import envs
from imaginejax.imaginer import shipped as shipped_lib
from imaginejax.imaginer.finetune import _smollm2_tokenizer, finetune, load_imaginer
from imaginejax.imaginer.imagine import imagine
from imaginejax.imaginer.kalm import TASK_TAGS
from imaginejax.imaginer.loading import _byte_to_unicode, corpus_vocabulary, restrict_vocabulary
from imaginejax.imaginer.records import Preset, RunRecordError, check_run_record


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("env_name", ["clevr", "babyai"])
def test_training_instructions_tokenize_as_before_and_other_text_in_kept_pieces(env_name: str) -> None:
    full = _smollm2_tokenizer()
    env, _ = envs.make(env_name, "train", embed=False)
    train = list(env.instructions("train"))
    kept = corpus_vocabulary(full, train, ("<|im_start|>", "<|im_end|>"))
    small = restrict_vocabulary(full, kept)
    assert small.get_vocab_size() == len(kept) < 1_000 < full.get_vocab_size()
    for text in train:  # the same tokens, renumbered
        assert [kept[i] for i in _ids(small, text)] == _ids(full, text)
    for name in ("<|im_start|>", "<|im_end|>"):
        assert kept[small.token_to_id(name)] == full.token_to_id(name)
    novel = [text for level in ("rephrase", "easy", "hard") for text in env.instructions(level)]
    novel += ["Ünïcödé and 12 digits ✓", "\n"]
    longer = 0
    for text in novel:
        pieces = _ids(small, text)
        assert small.decode(pieces) == text
        longer += len(pieces) > len(_ids(full, text))
    assert longer > len(novel) // 2  # most novel words are not kept whole
    byte_tokens = {full.token_to_id(token) for token in _byte_to_unicode().values()} - {None}
    assert len(byte_tokens) > 200 and byte_tokens <= set(kept)


def test_restricting_to_ids_without_their_merges_or_out_of_order_is_refused() -> None:
    full = _smollm2_tokenizer()
    word = _ids(full, " behind")
    assert len(word) == 1  # one token made by merges whose parts are not kept below
    with pytest.raises(ValueError, match="a part of its merge is not"):
        restrict_vocabulary(full, sorted({*word, *range(17)}))
    with pytest.raises(ValueError, match="strictly increasing"):
        restrict_vocabulary(full, [5, 3])
    with pytest.raises(ValueError, match="strictly increasing"):
        restrict_vocabulary(full, [0, full.get_vocab_size()])


def test_a_tiny_imaginer_with_a_corpus_vocabulary_reloads_and_ships_whole(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data = clevr_like(ROWS)
    run = finetune("tiny", data, tmp_path / "run", num_steps=2, checkpoint_every=2, vocabulary="corpus",
                   **SMALL).run_dir
    record = json.loads((run / "run.json").read_text())
    kept = record["vocabulary"]
    assert record["preset"]["vocabulary"] == "corpus"
    assert record["kalm_config"]["llama"]["vocab_size"] == len(kept) + 2 < 1_000
    used = [data.instructions[i] for i in sorted(set(data.instruction_ids.tolist()))]
    assert kept == list(corpus_vocabulary(_smollm2_tokenizer(), [*used, "\n", *TASK_TAGS.values()],
                                          ("<|im_start|>", "<|im_end|>")))
    imaginer = load_imaginer(run)
    assert imaginer.tokenizer.get_vocab_size() == len(kept)
    assert imaginer.params["llama"]["embed_tokens"]["embedding"].shape[0] == len(kept) + 2

    assets = tmp_path / "assets"
    shipped_lib.export(run, "clevr", "clevr-tiny-test", assets)
    item = shipped_lib.ShippedImaginer("clevr-tiny-test", "clevr", shipped_lib.shipped_digest(
        assets / "clevr-tiny-test.safetensors", assets / "clevr-tiny-test.json"), "test")
    packaged = shipped_lib.load_shipped("clevr", assets=assets, expected=item)
    assert jax.tree.all(jax.tree.map(np.array_equal, packaged.params, imaginer.params))
    env, params = envs.make("clevr", "rephrase")  # instructions the corpus never held
    ours, theirs = (imagine(im, env, params, jax.random.key(3), 4, progress=False).dataset
                    for im in (imaginer, packaged))
    np.testing.assert_array_equal(ours.states, theirs.states)
    np.testing.assert_array_equal(ours.actions, theirs.actions)

    monkeypatch.setattr(shipped_lib, "MAX_FULL_BYTES", 1024)
    with pytest.raises(ValueError, match="fine-tuned whole and its weights are"):
        shipped_lib.export(run, "clevr", "too-big", assets)
    assert not (assets / "too-big.safetensors").exists()

    broken = dict(record, vocabulary=kept[:-1])
    with pytest.raises(RunRecordError, match="vocabulary.*strictly increasing"):
        check_run_record(broken, run / "run.json")
    without = {k: v for k, v in record.items() if k != "vocabulary"}
    with pytest.raises(RunRecordError, match="present exactly when preset.vocabulary is 'corpus'"):
        check_run_record(without, run / "run.json")


def test_a_corpus_vocabulary_needs_a_random_model_and_is_left_out_of_other_records() -> None:
    with pytest.raises(ValueError, match="vocabulary = 'corpus' needs source = 'random'"):
        Preset(name="x", source="gguf", vocabulary="corpus")
    with pytest.raises(ValueError, match="vocabulary = 'words' is not one of tokenizer, corpus"):
        Preset(name="x", source="random", vocabulary="words")
    assert "vocabulary" not in Preset(name="x", source="random").to_json()
