"""Why HalfCheetah's novel levels say little at our expert's skill: the measurements behind docs/results.md,
"HalfCheetah at CPU scale".

    python experiments/diagnosis/cheetah_hard.py margins TRAIN_DIR EASY_DIR     # do train skills already meet easy?
    python experiments/diagnosis/cheetah_hard.py memory HARD_DIR                # is a two-leg action a function of the state?
    python experiments/diagnosis/cheetah_hard.py tasks WS [WS ...]              # success per task at the last evaluation
    python experiments/diagnosis/cheetah_hard.py policy POLICY_DIR [--episodes 64]  # what a policy does on the two-leg tasks

``margins`` reads expert datasets (``imaginejax collect --env cheetah --level train|easy``, or the cache) and
prints, per task, the displacement Σ at the end of the episode against the thresholds of BENCHMARK §2.5.

``memory`` takes the hard level's expert rollouts and, for the two two-leg tasks ("forward then backward",
"backward then forward"), labels every step by phase: before or after the first leg is done
(``tasks.trajectory_progress``, the predicate's own running quantities). The policy sees the 18-d state and
the instruction, not the phase. For each step it finds the nearest other step of the same task in the
standardised state space (from another trajectory) and reports (i) how often that neighbour is in the other
phase, and (ii) the mean distance between the two steps' expert actions when the neighbour is in the same
phase and when it is in the other one. If the phase were readable from the state, neighbours would share it
(i ≈ 0) and their actions would agree alike in both cases; a Markov policy has to give one action to both
phases where they meet, and BC averages them.

``tasks`` reads ``runs/<algo>/task_success.json`` of each workspace and prints success per hard task, per
configuration (real only, + oracle / imaginary of each level), mean over seeds, last evaluation.

``policy`` runs an exported policy (``imaginejax export WS --algo A --seed K --data D --out DIR``) on each
two-leg task for 200 steps (MuJoCo C) and reports how many episodes got the first leg done, then the second,
and where Σ ended: whether the policy fails to start, fails to turn, or turns too early.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _episodes(directory: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """states (N, T+1, 18), actions (N, T, 6), goals (N, 2), mask (N, T) of a saved dataset."""
    from imaginejax.data.io import load_dataset

    ds = load_dataset(directory)
    return np.asarray(ds.states), np.asarray(ds.actions), np.asarray(ds.goals), np.asarray(ds.mask, bool)


def margins(train_dir: str, easy_dir: str) -> None:
    from imaginejax.envs.cheetah import tasks

    thresholds = {tasks.KIND_RUN: "> 7 at t ≥ 99", tasks.KIND_RUN_FAST: "> 8.5 at t ≥ 99",
                  tasks.KIND_JUMP: "> 0 at t ≥ 5"}
    print("| level | task | episodes | mean length | Σ at the end: min / mean / max | threshold (±Σ) |")
    print("|---|---|---:|---:|---:|---|")
    for level, directory in (("train", train_dir), ("easy", easy_dir)):
        states, _, goals, mask = _episodes(directory)
        sigma = (states[:, 1:, tasks.DX] * mask).sum(axis=1)
        for goal in np.unique(goals, axis=0):
            rows = np.all(goals == goal, axis=1)
            name = tasks.TASK_NAMES[(int(goal[0]), int(goal[1]))]
            s = sigma[rows]
            print(f"| {level} | {name} | {rows.sum()} | {mask[rows].sum(1).mean():.1f} | "
                  f"{s.min():.1f} / {s.mean():.1f} / {s.max():.1f} | {thresholds.get(int(goal[0]), '')} |")


def memory(hard_dir: str) -> None:
    import jax
    from scipy.spatial import cKDTree

    from imaginejax.envs.cheetah import tasks

    states, actions, goals, mask = _episodes(hard_dir)
    progress = jax.device_get(tasks.trajectory_progress(states))
    print("| task | episodes | steps | first leg done at (median step) | neighbour in the other phase "
          "| action distance, same phase | action distance, other phase |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for direction, name in ((tasks.FORWARD, "forward then backward"), (tasks.BACKWARD, "backward then forward")):
        rows = np.flatnonzero((goals[:, 0] == tasks.KIND_FORWARD_BACKWARD) & (goals[:, 1] == direction))
        first_done = np.asarray(progress.forward_done_at if direction == tasks.FORWARD
                                else progress.backward_done_at)[rows]  # (n, T): step the first leg got done, 0 before
        # Phase of the step *taken* from state t: after the first leg once it was done by step t (t ≥ 1).
        done_before = np.concatenate([np.zeros((len(rows), 1)), first_done[:, :-1]], axis=1) > 0
        valid = mask[rows]
        x = states[rows, :-1][valid]                                       # (K, 18) states acted on
        a = actions[rows][valid]                                           # (K, 6)
        phase = done_before[valid]                                         # (K,)
        episode = np.broadcast_to(np.arange(len(rows))[:, None], valid.shape)[valid]
        z = (x - x.mean(0)) / (x.std(0) + 1e-6)
        tree = cKDTree(z)
        _, index = tree.query(z, k=16)
        # The nearest step of another episode (steps of one episode are trivially close to each other).
        other = episode[index] != episode[:, None]
        first = np.argmax(other, axis=1)
        found = other[np.arange(len(z)), first]
        nn = index[np.arange(len(z)), first][found]
        cross = phase[found] != phase[nn]
        distance = np.linalg.norm(a[found] - a[nn], axis=1)
        done_at = first_done.max(axis=1)
        print(f"| {name} | {len(rows)} | {len(z)} | {np.median(done_at[done_at > 0]):.0f} | "
              f"{100 * cross.mean():.1f} % | {distance[~cross].mean():.3f} | {distance[cross].mean():.3f} |")


def policy_legs(directory: str, episodes: int) -> None:
    import jax
    import jax.numpy as jnp

    from imaginejax.bench.policy import Policy
    from imaginejax.envs import make
    from imaginejax.envs.cheetah import tasks
    from imaginejax.lang import encode_instructions

    policy = Policy.load(directory)
    env, params = make("cheetah", "hard", embed=encode_instructions)
    step = jax.jit(lambda state, action: env.step_batch(jnp.zeros((episodes, 2), jnp.uint32), state, action, params))
    print(f"{directory}: {episodes} episodes per task, 200 steps")
    print("| task | first leg done | second leg done (success) | first leg done at (median step) | Σ at the end: median |")
    print("|---|---:|---:|---:|---:|")
    goals = np.asarray(params.goals)
    for task in np.flatnonzero(goals[:, 0] == tasks.KIND_FORWARD_BACKWARD):
        keys = jax.random.split(jax.random.key(int(task)), episodes)
        obs, state = env.reset_to_task_batch(keys, params, jnp.full((episodes,), int(task), jnp.int32))
        for _ in range(tasks.MAX_STEPS):
            obs, state, _, _, _ = step(state, jnp.asarray(policy.predict(np.asarray(obs))))
        progress = jax.device_get(state.progress)
        direction = int(goals[task, 1])
        first = np.asarray(progress.forward_done_at if direction == tasks.FORWARD else progress.backward_done_at)
        second = np.asarray(progress.backward_done_at if direction == tasks.FORWARD else progress.forward_done_at)
        first_done = first > 0
        second_done = second > first
        total = np.asarray(progress.sigma)
        name = tasks.TASK_NAMES[(int(goals[task, 0]), direction)]
        at = f"{np.median(first[first_done]):.0f}" if first_done.any() else "—"
        print(f"| {name} | {100 * first_done.mean():.0f} % | {100 * (first_done & second_done).mean():.0f} % "
              f"({100 * np.asarray(state.success).mean():.0f} %) | {at} | {np.median(total):+.1f} |")


def task_table(workspaces: list[str]) -> None:
    for workspace in workspaces:
        for path in sorted(Path(workspace, "runs").glob("*/task_success.json")):
            record = json.loads(path.read_text(encoding="utf-8"))
            sweep = json.loads((path.parent / "sweep.json").read_text(encoding="utf-8"))
            labels = [f"+ {run['data']}" if run["data"] else "real only" for run in sweep["runs"]]
            hard = record["levels"]["hard"]
            success = np.asarray(hard["success"])  # (runs, tasks) at the last evaluation
            print(f"{path.parent.name} ({workspace}): {', '.join(hard['tasks'])}")
            for label in dict.fromkeys(labels):
                rows = [i for i, lab in enumerate(labels) if lab == label]
                print(f"  {label}: " + " / ".join(f"{100 * v:.0f} %" for v in success[rows].mean(0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("margins")
    p.add_argument("train_dir")
    p.add_argument("easy_dir")
    p = sub.add_parser("memory")
    p.add_argument("hard_dir")
    p = sub.add_parser("tasks")
    p.add_argument("workspaces", nargs="+")
    p = sub.add_parser("policy")
    p.add_argument("policy_dir")
    p.add_argument("--episodes", type=int, default=64)
    args = parser.parse_args()
    if args.command == "margins":
        margins(args.train_dir, args.easy_dir)
    elif args.command == "memory":
        memory(args.hard_dir)
    elif args.command == "policy":
        policy_legs(args.policy_dir, args.episodes)
    else:
        task_table(args.workspaces)


if __name__ == "__main__":
    main()
