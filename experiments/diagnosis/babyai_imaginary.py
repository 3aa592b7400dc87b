"""Why imaginary BabyAI rollouts are illegal or leave the simulator's dynamics, field by field.

    python experiments/diagnosis/babyai_imaginary.py DIR [DIR ...]

DIR: a BabyAI dataset directory (``imaginejax imagine`` output, one level; a real one for contrast). Each is
scored with the project's quality report (:func:`imaginejax.imaginer.quality.score_dataset`); three markdown
tables follow, one row per DIR, labelled ``<parent folder>/<level>``:

1. **Illegal states** s_1..s_L split by the rule of ``envs/babyai/tasks.legal`` they break: the report's own
   causes (:func:`imaginejax.envs.babyai.tasks.violations`; a state can break several).
2. **Wrong fields per action kind**: of the transitions (s, a, s') with that action, the share whose s' differs
   from the simulator's step of (s, a) in each field group. Generated states are projected to integers, so a
   transition exceeds dynamics (error > 0.5) exactly when some field differs.
3. **Pick-ups**: the share the simulator refuses (no-op: hands full, or no object on the agent's own cell;
   and of those with empty hands, an object one cell away), of the refused ones the share whose s' shows an
   object carried anyway, and of the accepted ones where s' puts the picked object: at (0, 0) as it should,
   left in place, or part of the way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from imaginejax.data.io import load_dataset
from imaginejax.envs.babyai import grid as G
from imaginejax.imaginer.quality import score_dataset

XS, YS = (G.BALL_X, G.BOX_X, G.KEY_X), (G.BALL_Y, G.BOX_Y, G.KEY_Y)
COLOURS = (G.BALL_COLOUR, G.BOX_COLOUR, G.KEY_COLOUR)
GROUPS: dict[str, tuple[int, ...]] = {
    "agent x, y": (G.AGENT_X, G.AGENT_Y),
    "object colours": COLOURS,
    "object cells": XS + YS,
    "door (colour, cell, state)": (G.DOOR_COLOUR, G.DOOR_X_INDEX, G.DOOR_Y, G.DOOR_STATE),
    "carried type, colour": (G.CARRIED_TYPE, G.CARRIED_COLOUR),
}
KINDS: dict[str, tuple[int, ...]] = {"move": G.MOVE_ACTIONS, "pick up": (G.PICKUP,), "drop": (G.DROP,),
                                     "toggle": (G.TOGGLE,)}


def _pct(values: np.ndarray) -> str:
    return f"{100 * values.mean():.1f}" if values.size else "—"


def diagnose(path: Path) -> tuple[list[str], str, list[str], str]:
    """One dataset's illegal-state causes and its rows of the three tables (illegal causes, wrong fields per
    action kind, pick-ups)."""
    ds = load_dataset(path)
    scores = score_dataset(ds)
    rows, steps = np.nonzero(scores.mask)
    s, a, following = ds.states[rows, steps], ds.actions[rows, steps], ds.states[rows, steps + 1]
    label = f"{path.parent.name}/{ds.level}"

    illegal = ~scores.legal_next[rows, steps]
    causes = {name: v[rows, steps] for name, v in scores.violations.items()}
    illegal_row = f"| {label} | {len(rows)} | {_pct(illegal)} | " + " | ".join(_pct(v) for v in causes.values()) + " |"

    wrong = scores.per_dimension_error[rows, steps] > scores.threshold
    exceeds = scores.exceeds_dynamics[rows, steps]
    kind_rows = []
    for kind, codes in KINDS.items():
        sel = np.isin(a, codes)
        if sel.any():
            groups = " | ".join(_pct(wrong[sel][:, list(idx)].any(axis=1)) for idx in GROUPS.values())
            kind_rows.append(f"| {label} | {kind} | {int(sel.sum())} | {_pct(exceeds[sel])} | {groups} |")

    pick = a == G.PICKUP
    before, after = s[pick], np.rint(following[pick])
    sim = np.asarray(G.step_vector(jnp.asarray(before, jnp.float32), jnp.asarray(a[pick], jnp.int32)))
    refused = np.all(sim == before, axis=1)
    empty = before[:, G.CARRIED_TYPE] == G.NOTHING
    distance = np.stack([np.abs(before[:, x] - before[:, G.AGENT_X]) + np.abs(before[:, y] - before[:, G.AGENT_Y])
                         for x, y in zip(XS, YS)], axis=1)
    on_floor = np.stack([(before[:, x] != 0) | (before[:, y] != 0) for x, y in zip(XS, YS)], axis=1)
    nearest = np.where(on_floor, distance, np.inf).min(axis=1)
    accepted = ~refused
    picked = np.clip(sim[accepted][:, G.CARRIED_TYPE].astype(int) - 1, 0, G.NUM_OBJECTS - 1)
    index = np.arange(int(accepted.sum()))
    x_before = before[accepted][index, np.asarray(XS)[picked]]
    x_after = after[accepted][index, np.asarray(XS)[picked]]
    pick_row = (f"| {label} | {int(pick.sum())} | {_pct(refused)} | {_pct(~empty[refused])} | "
                f"{_pct(empty[refused] & (nearest[refused] == 1))} | "
                f"{_pct(after[refused & empty][:, G.CARRIED_TYPE] != G.NOTHING)} | {int(accepted.sum())} | "
                f"{_pct(x_after == 0)} | {_pct(x_after == x_before)} | {_pct((x_after > 0) & (x_after != x_before))} |")
    return list(causes), illegal_row, kind_rows, pick_row


def main(paths: list[str]) -> None:
    results = [diagnose(Path(p).resolve()) for p in paths]
    names = results[0][0]
    print("| dataset | generated states | illegal | " + " | ".join(names) + " |")
    print("|---|---:|---:|" + "---:|" * len(names))
    print("\n".join(r[1] for r in results))
    print()
    print("| dataset | action | transitions | exceeds dynamics | " + " | ".join(GROUPS) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(GROUPS))
    print("\n".join(line for r in results for line in r[2]))
    print()
    print("| dataset | pick-ups | refused by the simulator | of those: hands full | empty hands, object 1 cell away "
          "| refused, empty hands, s' carries anyway | accepted | object at (0, 0) in s' | left in place | part way |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(r[3] for r in results))
    print("\nAll values in % except counts.")


if __name__ == "__main__":
    main(sys.argv[1:])
