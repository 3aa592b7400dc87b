"""Validation while the imaginer is fine-tuned (imaginejax.imaginer.validation, Preset.validation): the
held-out split of CLEVR's training level is deterministic and leaves the fine-tuning corpus; data holding
the caller's own held-out phrasings is refused; rows are written at the validation steps; the best
checkpoint survives rotation and loads as ``step="best"``; a resumed run ends with the rows and best step
of an uninterrupted one; without validation the run record is unchanged.

The data are CLEVR-shaped trajectories over the training level's task table (each row a task and a
phrasing, random short state sequences): fine-tuning reads nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers

from imaginejax import envs
from imaginejax.core.checkpoint import checkpoint_path, list_checkpoints, load_checkpoint
from imaginejax.data.types import TrajectoryDataset
from imaginejax.imaginer import validation
from imaginejax.imaginer.finetune import TINY_ARCHITECTURE, finetune, get_preset, load_imaginer
from imaginejax.imaginer.kalm import build_corpus
from imaginejax.imaginer.records import Preset, RunRecordError, check_run_record

ARCHITECTURE = dict(TINY_ARCHITECTURE, num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                    num_attention_heads=4, num_key_value_heads=2)
SMALL: dict[str, Any] = dict(architecture=ARCHITECTURE, warmup_steps=1, log_every=1, progress=False,
                             batch_sizes={"rollout": 4, "dynamics": 4, "consequence": 4, "explanation": 2})
SETTINGS = {"every": 100, "phrasings_per_goal": 2, "goals": 8, "seed": 0, "rollouts": 64, "levels": None,
            "instructions": ()}
HORIZON = 4


def clevr_like(rows: np.ndarray) -> TrajectoryDataset:
    """One trajectory per (task, phrasing position) row of ``rows`` (R, 2), states random, 1-3 steps."""
    env, params = envs.make("clevr", "train", embed=False)
    ids = np.asarray(params.phrasing_ids)
    rng = np.random.default_rng(0)
    n = len(rows)
    lengths = 1 + np.arange(n) % 3
    mask = np.arange(HORIZON)[None] < lengths[:, None]
    states = rng.uniform(-0.5, 0.5, (n, HORIZON + 1, 10)).astype(np.float32)
    states *= (np.arange(HORIZON + 1)[None] <= lengths[:, None])[..., None]
    terminals = mask & (np.arange(HORIZON)[None] == lengths[:, None] - 1)
    return TrajectoryDataset(
        states=states, actions=np.where(mask, rng.integers(0, 40, (n, HORIZON)), 0).astype(np.int32),
        rewards=np.zeros((n, HORIZON), np.float32), mask=mask, terminals=terminals,
        truncations=np.zeros((n, HORIZON), bool), instruction_ids=ids[rows[:, 0], rows[:, 1]].astype(np.int32),
        goals=np.asarray(params.goals)[rows[:, 0]], instructions=tuple(env.instructions("train")),
        instruction_embeddings=np.zeros((len(env.instructions("train")), 0), np.float32), env="clevr",
        level="train", source="real", discrete=True)


# Every task with 3 phrasings (positions 0, 7, 17): 240 trajectories.
ROWS = np.array([(k, j) for k in range(80) for j in (0, 7, 17)])


@pytest.fixture(scope="module")
def data() -> TrajectoryDataset:
    return clevr_like(ROWS)


def test_split_is_deterministic_and_holds_out_whole_goals_and_phrasings_of_the_rest() -> None:
    split = validation.validation_split("clevr", SETTINGS)
    again = validation.validation_split("clevr", SETTINGS)
    other = validation.validation_split("clevr", dict(SETTINGS, seed=1))
    assert (split.held_out_goals, split.held_out) == (again.held_out_goals, again.held_out)
    assert split.held_out_goals != other.held_out_goals
    _, params = envs.make("clevr", "train", embed=False)
    strings, ids = envs.make("clevr", "train")[0].instructions("train"), np.asarray(params.phrasing_ids)
    goals = np.asarray(params.goals)
    held = split.held_out_goals
    assert len(set(held)) == 8 and all(0 <= k < 80 for k in held)
    assert list(split.sets) == ["held_out_phrasings", "held_out_goals", "rephrase", "easy", "hard"]
    phrasings, whole = split.sets["held_out_phrasings"], split.sets["held_out_goals"]
    np.testing.assert_array_equal(np.asarray(whole.goals), goals[list(held)])
    np.testing.assert_array_equal(np.asarray(whole.phrasing_ids), ids[list(held)])
    kept = [k for k in range(80) if k not in held]
    np.testing.assert_array_equal(np.asarray(phrasings.goals), goals[kept])
    assert np.asarray(phrasings.phrasing_ids).shape == (72, 2) and set(np.asarray(phrasings.phrasing_counts)) == {2}
    for row, k in enumerate(kept):  # two distinct phrasings of the goal itself
        chosen = np.asarray(phrasings.phrasing_ids)[row]
        assert len(set(chosen)) == 2 and set(chosen) <= set(ids[k])
    # 72 goals x 2 phrasings + 8 goals x all 18 phrasings; every kept goal keeps 16 to train on
    assert len(split.held_out) == 72 * 2 + 8 * 18
    assert all(sum(strings[m] not in split.held_out for m in ids[k]) == 16 for k in kept)


def test_hold_out_removes_every_held_out_trajectory_and_nothing_else(data: TrajectoryDataset) -> None:
    split = validation.validation_split("clevr", SETTINGS)
    [kept] = validation.hold_out([data], split)
    strings = data.instructions
    assert not {strings[i] for i in kept.instruction_ids} & split.held_out
    held_goals = np.asarray(split.sets["held_out_goals"].goals)
    assert not (kept.goals[:, None] == held_goals[None]).all(-1).any()
    # by hand from the rows' (task, position): a row stays unless its goal or its phrasing is held out
    _, params = envs.make("clevr", "train", embed=False)
    chosen = {(k, int(m)) for k, row in zip([k for k in range(80) if k not in split.held_out_goals],
                                            np.asarray(split.sets["held_out_phrasings"].phrasing_ids)) for m in row}
    ids = np.asarray(params.phrasing_ids)
    stays = [i for i, (k, j) in enumerate(ROWS) if k not in split.held_out_goals and (k, int(ids[k, j])) not in chosen]
    np.testing.assert_array_equal(kept.instruction_ids, data.instruction_ids[stays])
    np.testing.assert_array_equal(kept.states, data.states[stays])


def test_data_holding_a_given_held_out_instruction_is_refused_naming_it(data: TrajectoryDataset,
                                                                       tmp_path: Path) -> None:
    inside, outside = data.instructions[data.instruction_ids[3]], data.instructions[data.instruction_ids[3] + 1]
    settings = dict(SETTINGS, phrasings_per_goal=0, goals=0, instructions=(inside, outside))
    with pytest.raises(ValueError, match=f"holds trajectories of {inside!r}.*remove those trajectories"):
        validation.hold_out([data], validation.validation_split("clevr", settings))
    with pytest.raises(ValueError, match="holds trajectories of"):  # before anything is built or written
        finetune("tiny", data, tmp_path / "run", stop_at_step=0, validation={"instructions": [inside], "goals": 0},
                 **SMALL)
    assert not (tmp_path / "run" / "run.json").exists()
    split = validation.validation_split("clevr", dict(settings, instructions=(outside,)))
    assert list(split.sets)[:1] == ["held_out_phrasings"] and "held_out_goals" not in split.sets
    assert [len(d.instruction_ids) for d in validation.hold_out([data], split)] == [len(ROWS)]  # nothing removed
    with pytest.raises(ValueError, match="'Paint it red' is not a phrasing of clevr's training level"):
        validation.validation_split("clevr", dict(settings, instructions=("Paint it red",)))


@pytest.mark.parametrize("settings, match", [
    ({"every": 0}, r"validation\.every = 0: not an integer >= 1"),
    ({"evry": 5}, r"unknown key\(s\) \['evry'\]; valid: every"),
    ({"instructions": ["a"], "phrasings_per_goal": 2}, "either instructions .* or phrasings_per_goal = 2"),
    ({"phrasings_per_goal": 0, "goals": 0}, "holds nothing out"),
    ({"levels": "easy"}, r"validation\.levels = 'easy': not a list of strings"),
])
def test_bad_settings_are_refused_naming_the_key(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_preset("tiny", validation=settings)
    with pytest.raises(ValueError, match=r"validation\.goals = 80 holds out every one of the 80 goals"):
        validation.validation_split("clevr", dict(SETTINGS, goals=80))
    with pytest.raises(ValueError, match=r"validation\.levels: \['train'\] is not a novel level of clevr"):
        validation.validation_split("clevr", dict(SETTINGS, levels=("train",)))


def test_without_validation_presets_and_records_are_unchanged() -> None:
    """The shipped imaginer's record (written before validation existed) reads back and writes out the
    same preset, and no preset without validation names the field."""
    record = json.loads((Path(validation.__file__).parent / "assets" / "clevr-smollm2-lora-all.json").read_text())
    assert Preset.from_json(record["preset"]).to_json() == record["preset"]
    check_run_record(record, Path("clevr.json"), shipped=True)
    assert not any("validation" in preset.to_json() for preset in map(get_preset, ("tiny", "smollm2-lora")))
    on = get_preset("tiny", validation={"every": 50})
    assert on.to_json()["validation"] == dict(SETTINGS, every=50, instructions=[])
    assert Preset.from_json(json.loads(json.dumps(on.to_json()))) == on
    broken = dict(record, preset=dict(record["preset"], validation={"every": 0}))
    with pytest.raises(RunRecordError, match=r"field preset\.validation .*not an integer >= 1"):
        check_run_record(broken, Path("clevr.json"), shipped=True)


SCORES = {2: 0.1, 4: 0.5, 6: 0.2, 7: 0.5}  # step 7 ties step 4: the earlier stays best


def scripted(imaginer: Any, split: Any) -> dict[str, Any]:
    """A validation whose score is :data:`SCORES` of the imaginer's step."""
    return {"step": imaginer.step, "score": SCORES[imaginer.step],
            "sets": {name: {"goal_consistency": SCORES[imaginer.step]} for name in split.sets}}


def test_best_checkpoint_survives_rotation_loads_as_best_and_resumes(data: TrajectoryDataset, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "validate", scripted)
    settings = dict(num_steps=7, checkpoint_every=3, max_to_keep=1, validation={"every": 2, "levels": []}, **SMALL)
    straight = finetune("tiny", data, tmp_path / "straight", **settings)
    run = tmp_path / "straight"
    assert [row["step"] for row in straight.validation] == [2, 4, 6, 7]  # every 2 steps and the last
    assert straight.best_step == 4
    # saved: 2 (best), 3, 4 (best), 6, 7 (the last); kept: the last one and the best
    assert [step for step, _ in list_checkpoints(run / "checkpoints")] == [4, 7]
    assert json.loads((run / "best.json").read_text())["step"] == 4
    assert json.loads((run / "validation.json").read_text())["rows"] == straight.validation
    # the corpus is exactly the data without the held-out trajectories
    split = validation.validation_split("clevr", get_preset("tiny", validation=settings["validation"]).validation)
    [kept] = validation.hold_out([data], split)
    corpus = build_corpus([kept], tokenizers.Tokenizer.from_file(str(run / "tokenizer.json")))
    assert json.loads((run / "run.json").read_text())["data_fingerprint"] == corpus.fingerprint
    best = load_imaginer(run, step="best")
    assert best.step == 4 and best.selection["checkpoint"] == "best" and best.selection["score"] == 0.5
    assert best.checkpoint_hash == load_checkpoint(checkpoint_path(run / "checkpoints", 4))[0]["meta"]["checkpoint_hash"]
    stopped = finetune("tiny", data, tmp_path / "to-4", stop_at_step=4, **settings)  # the state at step 4
    assert best.checkpoint_hash == stopped.imaginer.checkpoint_hash != straight.imaginer.checkpoint_hash

    resumed = tmp_path / "resumed"
    finetune("tiny", data, resumed, stop_at_step=5, **settings)
    record = json.loads((resumed / "validation.json").read_text())
    record["rows"].append({"step": 6, "score": 0.9, "sets": {}})  # written past the checkpoint, then a crash
    (resumed / "validation.json").write_text(json.dumps(record))
    again = finetune("tiny", data, resumed, **settings)
    assert again.validation == straight.validation and again.best_step == 4
    assert again.imaginer.checkpoint_hash == straight.imaginer.checkpoint_hash
    assert (resumed / "best.json").read_text() == (run / "best.json").read_text()



def test_the_best_checkpoint_of_a_lora_run_is_what_export_ships(data: TrajectoryDataset, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from imaginejax.imaginer.shipped import export

    monkeypatch.setattr(validation, "validate", scripted)
    settings = dict(num_steps=7, checkpoint_every=3, max_to_keep=1, validation={"every": 2, "levels": []},
                    lora_rank=2, lora_alpha=4.0, **SMALL)
    run = finetune("tiny", data, tmp_path / "lora", **settings).run_dir
    assert export(run, "clevr", "best", tmp_path / "assets", step="best")["step"] == 4
    assert export(run, "clevr", "last", tmp_path / "assets")["step"] == 7

def test_a_run_without_validation_has_no_best_checkpoint(data: TrajectoryDataset, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from imaginejax.imaginer import study

    monkeypatch.setenv("IMAGINEJAX_HOME", str(tmp_path))
    run = study.run_dir("run")
    finetune("tiny", data, run, num_steps=7, stop_at_step=1, **SMALL)  # the step compiled above
    assert "validation" not in json.loads((run / "run.json").read_text())["preset"]
    assert not (run / "validation.json").exists()
    with pytest.raises(FileNotFoundError, match="fine-tuned without validation"):
        load_imaginer(run, step="best")
    with pytest.raises(FileNotFoundError, match="fine-tuned without validation"):
        study.main(["evaluate", "run", "--step", "best"])
    with pytest.raises(SystemExit):
        study.main(["evaluate", "run", "--step", "last"])  # a step or best


def test_study_train_passes_validate_every_with_the_other_settings(data: TrajectoryDataset,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from imaginejax.imaginer import finetune as finetune_module
    from imaginejax.imaginer import study

    seen: dict[str, Any] = {}

    def record(preset: str, datasets: Any, directory: Path, **overrides: Any) -> None:
        seen.update(overrides)
        raise RuntimeError("recorded")

    monkeypatch.setattr(finetune_module, "finetune", record)
    monkeypatch.setattr(study, "real_data", lambda num, env: data)
    with pytest.raises(RuntimeError, match="recorded"):
        study.main(["train", "run", "--validate-every", "50", "--set", "validation={'goals': 4}"])
    assert seen["validation"] == {"goals": 4, "every": 50}


def test_rows_of_real_validations_and_a_resumed_run_equal_an_uninterrupted_one(data: TrajectoryDataset,
                                                                              tmp_path: Path) -> None:
    """Real validations (4 rollouts per set, the easy level as the novel one): rows at steps 2, 4, 6, 7;
    rates in [0, 1]; a run stopped at step 3 and resumed ends with the same rows and best step; the
    checkpoint loaded as the best validates to its own row again."""
    settings = dict(num_steps=7, checkpoint_every=3, max_to_keep=1,
                    validation={"every": 2, "rollouts": 4, "levels": ["easy"]}, **SMALL)
    straight = finetune("tiny", data, tmp_path / "straight", **settings)
    assert [row["step"] for row in straight.validation] == [2, 4, 6, 7]
    for row in straight.validation:
        assert list(row["sets"]) == ["held_out_phrasings", "held_out_goals", "easy"]
        assert row["score"] == (row["sets"]["held_out_phrasings"]["goal_consistency"]
                                + row["sets"]["held_out_goals"]["goal_consistency"]) / 2
        for values in row["sets"].values():
            assert 0 <= values["goal_consistency"] <= 1 and 0 <= values["legal_rollout_rate"] <= 1
            assert values["transition_error"] >= 0 and 0 <= values["exceeds_dynamics_rate"] <= 1
    scores = [row["score"] for row in straight.validation]
    assert straight.best_step == straight.validation[scores.index(max(scores))]["step"]
    finetune("tiny", data, tmp_path / "resumed", stop_at_step=3, **settings)
    resumed = finetune("tiny", data, tmp_path / "resumed", **settings)
    assert resumed.validation == straight.validation and resumed.best_step == straight.best_step
    best = load_imaginer(tmp_path / "resumed", step="best")
    split = validation.validation_split("clevr", get_preset("tiny", validation=settings["validation"]).validation)
    assert validation.validate(best, split) == next(r for r in straight.validation if r["step"] == best.step)
