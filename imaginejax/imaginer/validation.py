"""Validation of the imaginer while it is fine-tuned: a split held out of the training level, and the
quality of the rollouts the imaginer writes for it (:attr:`~imaginejax.imaginer.records.Preset.validation`).

**The split** (:func:`validation_split`) is drawn from the environment's training level with
``numpy.random.default_rng(seed)``: first ``goals`` of its K goals, held out with all their phrasings;
then ``phrasings_per_goal`` phrasings of each remaining goal (or, instead, the caller's own
``instructions``). :func:`hold_out` removes from the fine-tuning data every trajectory whose
instruction was held out or whose goal is a held-out goal, and refuses data that holds one of the
caller's ``instructions`` (naming them). The split depends on the environment and the settings only,
never on the data.

**A validation** (:func:`validate`) lets the imaginer write ``rollouts`` rollouts per set with
:func:`~imaginejax.imaginer.imagine.imagine` (its default projection), with one fixed key per set — the
same tasks and initial states at every evaluation — and scores them with the quality summary
imagine computes (:mod:`~imaginejax.imaginer.quality`). The sets:

* ``held_out_phrasings`` — the training goals, asked with their held-out phrasings;
* ``held_out_goals`` — the held-out goals, asked with any of their phrasings;
* each novel level (``levels``; CLEVR: rephrase, easy, hard) — the test: reported, never selected on.

Per set a row holds the goal consistency and the legal-rollout rate over the rollouts asked for (a
rollout dropped for a non-finite state counts as a failure), the mean transition error and the
rate of transitions exceeding dynamics; and the score the best checkpoint is chosen by,

    score = mean goal consistency over held_out_phrasings and held_out_goals

(over the one of the two that holds something out, when only one does). The best row
(:func:`best_row`) has the highest score, the earliest on a tie.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax import envs
from imaginejax.data.types import TrajectoryDataset
from imaginejax.imaginer.finetune import Imaginer
from imaginejax.imaginer.imagine import ImaginationError, imagine
from imaginejax.imaginer.quality import quality_rules_of

__all__ = ["PHRASINGS", "GOALS", "ValidationSplit", "validation_split", "hold_out", "validate", "best_row",
           "rows_markdown"]

PHRASINGS: Final[str] = "held_out_phrasings"
GOALS: Final[str] = "held_out_goals"
SHOWN: Final[int] = 5  # instructions named in an error message


@dataclasses.dataclass(frozen=True)
class ValidationSplit:
    """What is held out of the training level, and the sets a validation scores.

    Attributes:
      env: the environment object (its training level's); ``env_name`` its registry name.
      held_out_goals: task rows of the training level held out with all their phrasings.
      held_out: the instructions removed from the fine-tuning data (chosen phrasings and every phrasing
        of the held-out goals).
      given: the caller's own held-out phrasings (the data must not hold them).
      sets: set name -> the level parameters it is imagined with (the held-out sets are the training
        level's task table cut to their tasks and phrasings), in evaluation order.
      rollouts: rollouts per set; seed: the split's and the rollouts' seed.
    """

    env: Any
    env_name: str
    held_out_goals: tuple[int, ...]
    held_out: frozenset[str]
    given: tuple[str, ...]
    sets: dict[str, Any]
    rollouts: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        """The split as recorded in ``validation.json``."""
        return {"env": self.env_name, "held_out_goals": list(self.held_out_goals),
                "held_out_instructions": sorted(self.held_out | set(self.given)),
                "sets": list(self.sets), "rollouts": self.rollouts, "seed": self.seed,
                "score": f"mean goal consistency over {' and '.join(s for s in (PHRASINGS, GOALS) if s in self.sets)}"}


def _cut(params: Any, rows: Sequence[int], ids: Sequence[Sequence[int]]) -> Any:
    """The level's params cut to task rows ``rows``, row i asked with the phrasing ids ``ids[i]``."""
    table = np.full((len(rows), max(len(i) for i in ids)), -1, np.int32)
    for r, row_ids in enumerate(ids):
        table[r, : len(row_ids)] = row_ids
    return params.replace(goals=params.goals[np.asarray(rows)], phrasing_ids=jnp.asarray(table),
                          phrasing_counts=jnp.asarray([len(i) for i in ids], jnp.int32))


def _named(strings: Sequence[str]) -> str:
    shown = ", ".join(repr(s) for s in list(strings)[:SHOWN])
    return shown + (f" and {len(strings) - SHOWN} more" if len(strings) > SHOWN else "")


def validation_split(env_name: str, settings: Mapping[str, Any]) -> ValidationSplit:
    """The held-out split of ``env_name``'s training level for ``settings`` (a filled-in
    :attr:`~imaginejax.imaginer.records.Preset.validation`); deterministic in ``settings["seed"]``.

    Raises:
      ValueError: the environment is not registered or has no quality rules, the split would leave no
        training goal or no training phrasing of a goal, an instruction given is not a phrasing of the
        training level, or a level is not one of the environment's novel levels.
    """
    if env_name not in envs.registered():
        raise ValueError(f"validation imagines rollouts in the data's environment, and {env_name!r} is not "
                         f"registered (environments: {', '.join(envs.registered())}); set validation=None")
    quality_rules_of(env_name)  # the rollouts are scored with them
    env, params = envs.make(env_name, "train", embed=False)
    strings = env.instructions("train")
    ids, counts = np.asarray(params.phrasing_ids), np.asarray(params.phrasing_counts)
    rng = np.random.default_rng(settings["seed"])
    if settings["goals"] >= len(counts):
        raise ValueError(f"validation.goals = {settings['goals']} holds out every one of the {len(counts)} goals of "
                         f"{env_name}'s training level; hold out fewer (e.g. {max(1, len(counts) // 10)})")
    held_goals = tuple(int(k) for k in np.sort(rng.choice(len(counts), settings["goals"], replace=False)))
    kept = [k for k in range(len(counts)) if k not in held_goals]
    given = tuple(dict.fromkeys(settings["instructions"]))
    phrasings: dict[int, list[int]] = {}
    if given:
        where = {}
        for k in range(len(counts)):
            for m in ids[k, : counts[k]]:
                where.setdefault(strings[m], (k, int(m)))
        unknown = [s for s in given if s not in where]
        if unknown:
            raise ValueError(f"validation.instructions: {_named(unknown)} {'is' if len(unknown) == 1 else 'are'} "
                             f"not a phrasing of {env_name}'s training level; give phrasings of its "
                             f"instruction table (env.instructions('train'))")
        for text in given:
            k, m = where[text]
            if k not in held_goals:
                phrasings.setdefault(k, []).append(m)
    elif settings["phrasings_per_goal"]:
        per_goal = settings["phrasings_per_goal"]
        fewest = min(int(counts[k]) for k in kept)
        if per_goal >= fewest:
            raise ValueError(f"validation.phrasings_per_goal = {per_goal} leaves a goal of {env_name}'s training "
                             f"level without a training phrasing (the fewest phrasings of a goal: {fewest}); "
                             f"hold out fewer (e.g. {max(1, fewest // 9)})")
        for k in kept:
            positions = np.sort(rng.choice(int(counts[k]), per_goal, replace=False))
            phrasings[k] = [int(m) for m in ids[k, positions]]
    held_out = {strings[m] for row in phrasings.values() for m in row} if not given else set()
    held_out |= {strings[m] for k in held_goals for m in ids[k, : counts[k]]}
    novel = tuple(lv for lv in envs.ENV_LEVELS[env_name] if lv != "train")
    levels = novel if settings["levels"] is None else tuple(settings["levels"])
    wrong = [lv for lv in levels if lv not in novel]
    if wrong:
        raise ValueError(f"validation.levels: {wrong} {'is' if len(wrong) == 1 else 'are'} not a novel level of "
                         f"{env_name}; valid: {', '.join(novel)} (or None for all)")
    sets: dict[str, Any] = {}
    if phrasings:
        rows = sorted(phrasings)
        sets[PHRASINGS] = _cut(params, rows, [phrasings[k] for k in rows])
    if held_goals:
        sets[GOALS] = _cut(params, held_goals, [list(ids[k, : counts[k]]) for k in held_goals])
    for level in levels:
        sets[level] = envs.make(env_name, level, embed=False)[1]
    return ValidationSplit(env, env_name, held_goals, frozenset(held_out), given, sets,
                           int(settings["rollouts"]), int(settings["seed"]))


def hold_out(datasets: Sequence[TrajectoryDataset], split: ValidationSplit) -> list[TrajectoryDataset]:
    """``datasets`` without the trajectories whose instruction is in ``split.held_out`` or whose goal
    is a held-out goal (a dataset left empty is dropped).

    Raises:
      ValueError: a kept trajectory's instruction is one of ``split.given`` (named, with the fix), or
        nothing is left to fine-tune on.
    """
    goals = np.asarray(split.sets[GOALS].goals) if GOALS in split.sets else None
    out, overlap = [], []
    for ds in datasets:
        removed = np.array([text in split.held_out for text in ds.instructions], bool)
        drop = removed[ds.instruction_ids]
        if goals is not None and ds.goals.shape[-1] == goals.shape[-1]:
            drop |= np.any(np.all(ds.goals[:, None, :] == goals[None].astype(ds.goals.dtype), axis=-1), axis=-1)
        keep = np.flatnonzero(~drop)
        given = {ds.instructions[i] for i in np.unique(ds.instruction_ids[keep])} & set(split.given)
        overlap += sorted(given - set(overlap))
        if len(keep):
            out.append(dataclasses.replace(
                ds, states=ds.states[keep], actions=ds.actions[keep], rewards=ds.rewards[keep], mask=ds.mask[keep],
                terminals=ds.terminals[keep], truncations=ds.truncations[keep],
                instruction_ids=ds.instruction_ids[keep], goals=ds.goals[keep]))
    if overlap:
        raise ValueError(f"validation.instructions: the fine-tuning data holds trajectories of {_named(overlap)}, so "
                         "they would be validated on what the imaginer was trained on; remove those trajectories "
                         "from the data, or let the split choose held-out phrasings and remove them itself "
                         "(validation={'phrasings_per_goal': 2, ...} without instructions)")
    if not out:
        raise ValueError("validation holds out every trajectory of the data; hold out fewer goals or phrasings")
    return out


def _set_row(imaginer: Imaginer, split: ValidationSplit, params: Any, key: jax.Array) -> dict[str, Any]:
    """The quality of ``split.rollouts`` rollouts of one set, rates over the rollouts asked for."""
    try:
        with warnings.catch_warnings():  # the row counts the rollouts dropped for non-finite states
            warnings.simplefilter("ignore", RuntimeWarning)
            result = imagine(imaginer, split.env, params, key, split.rollouts, progress=False)
    except ImaginationError:
        return {"goal_consistency": 0.0, "legal_rollout_rate": 0.0, "transition_error": None,
                "exceeds_dynamics_rate": None, "dropped": split.rollouts}
    quality = result.dataset.provenance["quality"]
    kept = quality["num_rollouts"] / result.num_requested
    error = quality["transition_error"]
    return {"goal_consistency": quality["goal_consistency"] * kept,
            "legal_rollout_rate": quality["legal_rollout_rate"] * kept,
            "transition_error": None if error is None else error["mean"],
            "exceeds_dynamics_rate": quality["exceeds_dynamics_rate"], "dropped": result.num_dropped_nonfinite}


def validate(imaginer: Imaginer, split: ValidationSplit) -> dict[str, Any]:
    """One validation row ``{"step", "score", "sets": {name: {goal_consistency, legal_rollout_rate,
    transition_error, exceeds_dynamics_rate, dropped}}}`` of ``imaginer`` (see the module docstring);
    set i is imagined with ``fold_in(key(split.seed), i)``."""
    key = jax.random.key(split.seed)
    sets = {name: _set_row(imaginer, split, params, jax.random.fold_in(key, index))
            for index, (name, params) in enumerate(split.sets.items())}
    held = [sets[name]["goal_consistency"] for name in (PHRASINGS, GOALS) if name in sets]
    return {"step": int(imaginer.step), "score": float(np.mean(held)), "sets": sets}


def best_row(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The row of the highest score (the earliest on a tie); None without rows."""
    best = None
    for row in rows:
        if best is None or row["score"] > best["score"]:
            best = row
    return best


def _pct(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f} %"


def rows_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of validation rows: step, score, then each set's goal consistency; the best
    row's step in bold."""
    best = best_row(rows)
    names = list(rows[0]["sets"]) if rows else []
    head = ["step", "score"] + [name.replace("_", " ") for name in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        step = f"**{row['step']}**" if row is best else str(row["step"])
        lines.append("| " + " | ".join([step, _pct(row["score"])]
                                       + [_pct(row["sets"][name]["goal_consistency"]) for name in names]) + " |")
    return "\n".join(lines) + "\n"
