"""The packaged CLEVR imaginer: loads on a fresh machine (SmolLM2 backbone + shipped LoRA adapters) and
generates legal rollouts; damaged, missing or foreign files are refused with the command that re-makes them."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

from imaginejax import envs
from imaginejax.imaginer.imagine import imagine
from imaginejax.imaginer.shipped import ASSETS, SHIPPED, ShippedImaginerError, load_shipped, shipped_for


@pytest.fixture(scope="module")
def imaginer():
    return load_shipped("clevr")


def test_shipped_imaginer_generates_rollouts_scored_against_the_simulator(imaginer):
    assert imaginer.step == 1000 and imaginer.config.llama.num_hidden_layers == 30  # SmolLM2-135M
    env, params = envs.make("clevr", "easy", embed=False)
    result = imagine(imaginer, env, params, jax.random.PRNGKey(0), 8, progress=False)
    ds = result.dataset
    assert ds.num_trajectories == 8 and ds.level == "easy" and ds.source == "imaginary"
    quality = ds.provenance["quality"]
    assert quality["legal_rollout_rate"] == 1.0  # projected onto legal states
    assert 0.0 <= quality["goal_consistency"] <= 1.0 and np.isfinite(ds.states).all()


def test_damaged_missing_or_foreign_files_are_refused(tmp_path):
    item = SHIPPED["clevr-smollm2-lora-all"]
    for suffix in (".safetensors", ".json"):
        shutil.copy(ASSETS / f"{item.name}{suffix}", tmp_path / f"{item.name}{suffix}")
    weights = tmp_path / f"{item.name}.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedImaginerError, match="damaged or replaced.*imaginer.shipped export"):
        load_shipped("clevr", assets=tmp_path)
    weights.unlink()
    with pytest.raises(ShippedImaginerError, match="missing"):
        load_shipped("clevr", assets=tmp_path)
    with pytest.raises(ShippedImaginerError, match="no trained imaginer ships for 'babyai'.*clevr-smollm2-lora-all"):
        shipped_for("babyai")
    # The clevr files asked for as another environment's imaginer: refused, naming both.
    shutil.copy(ASSETS / f"{item.name}.safetensors", weights)
    foreign = type(item)(item.name, "babyai", item.sha256, item.command)
    with pytest.raises(ShippedImaginerError, match="'clevr'.*'babyai'"):
        load_shipped("babyai", assets=tmp_path, expected=foreign)


def test_study_scores_the_shipped_imaginer(tmp_path, monkeypatch, capsys):
    import json

    from imaginejax.imaginer import study

    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path))
    study.main(["evaluate", "shipped:clevr", "--num", "2", "--levels", "easy", "--project"])
    written = tmp_path / "imaginer-study" / "shipped-clevr" / "quality-projected"
    assert f"written: {written}.json, {written}.md" in capsys.readouterr().out  # says where its report went
    record = json.loads((tmp_path / "imaginer-study" / "shipped-clevr" / "quality-projected.json").read_text())
    assert record["env"] == "clevr" and record["step"] == 1000 and record["project"]
    assert record["levels"]["easy"]["legal_rollout_rate"] == 1.0
    with pytest.raises(SystemExit, match="--step picks a checkpoint of a study run"):
        study.main(["evaluate", "shipped:clevr", "--step", "500"])
