"""Why CLEVR-Robot's hard level is hard for a policy: the measurements behind docs/clevr-hard.md.

    python experiments/diagnosis/clevr_hard.py probe                 # can the instruction embeddings tell goals apart?
    python experiments/diagnosis/clevr_hard.py expert --episodes 2048 [--epsilon 0.1] [--data DIR]
    python experiments/diagnosis/clevr_hard.py families WS [WS ...]  # success per hard task family of every run

``probe`` embeds every phrasing of the train and hard levels with the policy's encoder (all-MiniLM-L6-v2,
mean pooling) and reports (i) the cosine of an instruction with its role-swapped twin ("A behind B" vs
"B behind A": opposite goals), (ii) nearest-centroid goal decoding, leave one phrasing out, and (iii) a
ridge probe from embedding to goal, trained on all but one template and tested on that template (mean
over templates). ``expert`` collects (or reads from the cache under ``--data``) expert rollouts of the
hard level and gives success and length per family. ``families`` reads the ``task_success.json`` of each
workspace (``runs/<algo>/task_success.json``) and prints success per family at the last evaluation.

Families of the hard level (``envs/clevr/tasks.hard_goals``): tasks 0-39 two-clause conjunctions,
40-79 three-clause, 80 line, 81 gather.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

FAMILIES = ("two-clause", "three-clause", "line", "gather")


def family_of_task() -> np.ndarray:
    """(82,) family name of each hard task, from the goal table itself."""
    from imaginejax.envs.clevr import tasks

    names = []
    for goal in tasks.level_goals("hard"):
        kind, n, _ = tasks.decode_goal(goal)
        names.append({tasks.KIND_LINE: "line", tasks.KIND_GATHER: "gather"}.get(kind, f"{'two' if n == 2 else 'three'}-clause"))
    return np.array(names)


def per_family(task_success: np.ndarray) -> dict[str, float]:
    """(82,) success per task -> family -> mean success (every task runs equally often)."""
    family = family_of_task()
    return {f: float(np.mean(task_success[family == f])) for f in FAMILIES}


def _labels(ids: np.ndarray, count: int) -> np.ndarray:
    labels = np.full(count, -1)
    for k, row in enumerate(ids):
        labels[row[row >= 0]] = k
    return labels


def probe() -> None:
    from imaginejax.envs.clevr import instructions, tasks
    from imaginejax.lang import encode_instructions

    for level in ("train", "hard"):
        strings, ids, _ = instructions.level_instruction_table(level)
        emb = encode_instructions(list(strings))
        labels = _labels(ids, len(strings))
        goals = len(ids)
        others = ~np.eye(len(strings), dtype=bool)
        hits = 0
        for t in range(len(strings)):
            keep = others[t]
            centroids = np.stack([emb[keep & (labels == k)].mean(0) for k in range(goals)])
            hits += int(np.argmax(centroids @ emb[t]) == labels[t])
        onehot = np.eye(goals)[labels]
        accuracy = []
        for j in range(ids.shape[1]):
            test = np.array([row[j] for row in ids if row[j] >= 0])
            train = np.setdiff1d(np.arange(len(strings)), test)
            w = np.linalg.solve(emb[train].T @ emb[train] + 1e-2 * np.eye(emb.shape[1]), emb[train].T @ onehot[train])
            accuracy.append(np.mean(np.argmax(emb[test] @ w, 1) == labels[test]))
        first = ids[:, 0]
        sim = emb @ emb.T
        same_goal = np.mean([sim[a, b] for row in ids for a in row[row >= 0] for b in row[row >= 0] if a < b])
        same_template = sim[np.ix_(first, first)][~np.eye(goals, dtype=bool)].mean()
        line = (f"{level}: {goals} goals, {len(strings)} phrasings; nearest centroid {hits / len(strings):.1%}; ridge probe "
                f"on an unseen template {np.mean(accuracy):.1%}; cosine same goal / other template {same_goal:.3f}, "
                f"other goal / same template {same_template:.3f}")
        if level == "train":
            index = {tasks.decode_goal(g)[2][0]: k for k, g in enumerate(tasks.level_goals(level))}
            swapped = [sim[first[k], first[index[(b, a, d)]]] for (a, b, d), k in index.items()]
            line += f"; role-swapped twin {np.mean(swapped):.4f}"
        print(line)


def expert(episodes: int, epsilon: float, seed: int, data: Path) -> None:
    from imaginejax.data import experts
    from imaginejax.envs.clevr import tasks

    ds = experts.cached_expert_data("clevr", "hard", episodes, seed, epsilon, data)
    goals = tasks.level_goals("hard")
    task = np.array([np.flatnonzero((goals == g).all(1))[0] for g in ds.goals])
    family = family_of_task()[task]
    success, length = ds.terminals.any(1), ds.mask.sum(1)
    print(f"expert (epsilon {epsilon:g}), {episodes} rollouts: success {success.mean():.1%}, mean length {length.mean():.1f}")
    for f in FAMILIES:
        m = family == f
        print(f"  {f:13s} {m.sum():5d} rollouts  success {success[m].mean():6.1%}  mean length {length[m].mean():5.1f}")


def families(workspaces: list[Path]) -> None:
    for ws in workspaces:
        for path in sorted(ws.glob("runs/*/task_success.json")) or sorted(ws.glob("task_success.json")):
            record = json.loads(path.read_text())
            sweep = json.loads((path.parent / "sweep.json").read_text())
            level = record["levels"].get("hard")
            if level is None:
                continue
            for row, run in zip(level["success"], sweep["runs"]):
                fam = per_family(np.asarray(row))
                label = {k: run[k] for k in ("seed", "ratio", "data") if k in run}
                print(f"{path.parent}: {label}  " + "  ".join(f"{f} {v:.1%}" for f, v in fam.items())
                      + f"  all {np.mean(row):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe")
    ex = sub.add_parser("expert")
    ex.add_argument("--episodes", type=int, default=2048)
    ex.add_argument("--epsilon", type=float, default=0.1)
    ex.add_argument("--seed", type=int, default=7)
    ex.add_argument("--data", type=Path, default=Path("data/diagnosis"))
    fa = sub.add_parser("families")
    fa.add_argument("workspaces", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "probe":
        probe()
    elif args.command == "expert":
        expert(args.episodes, args.epsilon, args.seed, args.data.absolute())
    else:
        families(args.workspaces)


if __name__ == "__main__":
    main()
