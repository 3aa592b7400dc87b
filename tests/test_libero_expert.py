"""Scripted LIBERO experts: success rate of every one of the 31 tasks within the 500-step cap (all tasks mixed in
one batch, one compiled rollout that stops when every episode has ended), and expert data collected into the
dataset format with :func:`imaginejax.data.collect.collect`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.libero import tasks
from imaginejax.envs.libero.env import Libero, make_params
from imaginejax.envs.libero.expert import expert_action, expert_policy, success_rates

EPISODES = 32  # per task, all 31 tasks in one batch (~25 s)
ALL = tuple(t.name for t in tasks.TASKS)
TARGET = 0.85
# Measured with the pyramidal-cone MJCF (``python -m imaginejax.envs.libero.expert 64 SEED``): over 64 episodes
# per task, seeds 3 and 7, every task >= 0.95 except all-in-basket (0.89, 0.86: the third object sometimes tips
# against a wall or a neighbour in the crowded basket); this test's 32 episodes of seed 2026 (deterministic):
# all-in-basket 0.91, five two-object basket tasks 0.94-0.97, the other 25 tasks 1.00.


@pytest.fixture(scope="module")
def rates() -> dict[str, float]:
    out = success_rates(EPISODES, jax.random.key(2026))
    print("\n" + "\n".join(f"{n:42s} {r:.2f}" for n, r in out.items()))
    return out


@pytest.mark.parametrize("name", ALL)
def test_expert_success_at_least_85_percent(rates: dict[str, float], name: str) -> None:
    assert rates[name] >= TARGET, f"{name}: expert success {rates[name]:.2f} over {EPISODES} episodes"


def test_expert_actions_are_bounded_and_task_specific() -> None:
    env = Libero(backend="mujoco")
    params = make_params("easy", embed=False)
    batch = params.num_tasks
    _, state = env.reset_to_task_batch(jax.random.split(jax.random.key(5), batch), params, jnp.arange(batch))
    goal = params.goals[state.task]
    action = np.asarray(expert_action(state.vec, goal, state.progress))
    assert action.shape == (batch, 7) and np.isfinite(action).all() and (np.abs(action) <= 1.0).all()
    # the same state under the 12 easy goals: reaching different objects moves the hand differently
    same = jax.tree.map(lambda x: jnp.repeat(x[:1], batch, axis=0), state)
    moves = np.asarray(expert_action(same.vec, goal, same.progress))[:, :3]
    reach = [i for i, g in enumerate(np.asarray(goal)) if g[1] == tasks.REACH]
    assert len({tuple(np.round(moves[i], 3)) for i in reach}) == 3


def test_collect_train_level_with_the_expert() -> None:
    from imaginejax.data.collect import collect

    env = Libero(backend="mujoco")
    params = make_params("train", embed=False)
    ds = collect(env, params, expert_policy(), jax.random.key(0), 6, task_indices=np.arange(6), chunk_size=6,
                 policy_name="libero-expert", progress=False)
    assert ds.states.shape[-1] == tasks.STATE_DIM and ds.actions.shape[-1] == 7
    assert ds.terminals.any(axis=1).all()  # every task succeeded
    lengths = ds.mask.sum(axis=1)
    assert (lengths < 100).all()
