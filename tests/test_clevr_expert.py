"""Scripted CLEVR-Robot expert: success per level, and the datasets it collects.

The fast tests use the greedy expert (``lookahead_width=0``) to keep compile time small; the slow test
measures the default expert (greedy + two-push lookahead when stuck) on every hard goal.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax import envs
from imaginejax.data.collect import collect, random_policy
from imaginejax.data.validate import validate_dataset
from imaginejax.envs.clevr import expert, tasks

GREEDY = expert.make_policy(expert.ExpertConfig(lookahead_width=0))
success_fn, reward_fn, legal_fn = jax.jit(tasks.success), jax.jit(tasks.reward), jax.jit(tasks.legal)
progress_fn, score_fn = jax.jit(expert.progress), jax.jit(expert.score)


@functools.lru_cache(maxsize=None)
def level(name: str):
    return envs.make("clevr", name, embed=False)


@functools.lru_cache(maxsize=None)
def expert_dataset(name: str, repeats: int = 1, seed: int = 0):
    """Every goal of the level ``repeats`` times with the greedy expert (epsilon 0)."""
    env, params = level(name)
    k = params.num_tasks
    return collect(env, params, GREEDY, jax.random.PRNGKey(seed), k * repeats, task_indices=np.arange(k * repeats) % k,
                   chunk_size=k * repeats, policy_name="clevr-greedy-expert", progress=False)


def success_rate(ds) -> float:
    return float(ds.terminals.any(axis=1).mean())


@pytest.mark.parametrize("name,repeats", [("train", 1), ("rephrase", 1), ("easy", 2)])
def test_expert_solves_train_rephrase_easy(name: str, repeats: int):
    ds = expert_dataset(name, repeats)
    rate = success_rate(ds)
    print(f"\nexpert success {name}: {rate:.3f} over {ds.num_trajectories} episodes (every goal x{repeats})")
    assert rate >= 0.95


def test_expert_hard_report():
    ds = expert_dataset("hard")
    rate = success_rate(ds)
    kinds = ds.goals[:, 0] * 10 + np.minimum(ds.goals[:, 1], 3)
    parts = {
        "2-clause": kinds == 2,
        "3-clause": kinds == 3,
        "line/gather": ds.goals[:, 0] >= tasks.KIND_LINE,
    }
    detail = ", ".join(f"{k} {ds.terminals[m].any(1).mean():.2f}" for k, m in parts.items())
    print(f"\nexpert (greedy) success hard: {rate:.3f} over {ds.num_trajectories} episodes ({detail})")
    assert rate >= 0.6  # regression guard only; the benchmark reports the hard rate


@pytest.mark.parametrize("name", ["train", "hard"])
def test_collected_dataset_is_consistent(name: str):
    env, params = level(name)
    ds = expert_dataset(name, 2 if name == "easy" else 1)
    dims = validate_dataset(ds, num_actions=40)
    n, t = ds.mask.shape
    assert t == params.max_steps and dims.S == 10 and dims.G == tasks.GOAL_DIM and dims.E == 0
    assert ds.env == "clevr" and ds.level == name and ds.source == "real" and ds.discrete
    assert ds.instructions == env.instructions(name)
    lengths = ds.mask.sum(1)
    rows = np.arange(n)
    last = lengths - 1
    solved = ds.terminals.any(1)
    # A row ends with a terminal iff the goal held; otherwise it was truncated at the cap.
    assert (ds.terminals[rows, last] == solved).all() and (ds.truncations[rows, last] == ~solved).all()
    assert (lengths[~solved] == params.max_steps).all()
    # The success predicate holds exactly on the terminal transition of every row.
    prev, nxt = ds.states[rows, last], ds.states[rows, last + 1]
    np.testing.assert_array_equal(np.asarray(success_fn(prev, ds.actions[rows, last], nxt, ds.goals)), solved)
    # Rewards are the task's reward of each valid transition; padding is zero.
    r = np.asarray(reward_fn(ds.states[:, :-1], ds.actions, ds.states[:, 1:], ds.goals[:, None, :]))
    np.testing.assert_allclose(ds.rewards[ds.mask], r[ds.mask], rtol=1e-5, atol=1e-5)
    assert (ds.rewards[~ds.mask] == 0).all() and (ds.actions[~ds.mask] == 0).all()
    pad = np.ones(ds.states.shape[:2], bool)
    pad[:, :-1] &= ~ds.mask
    pad[:, 1:] &= ~ds.mask
    assert (ds.states[pad] == 0).all()
    # Goals and instructions match the task table; every state of real data is legal.
    _, ids, counts = (None, np.asarray(params.phrasing_ids), np.asarray(params.phrasing_counts))
    task_of = np.asarray([np.flatnonzero((np.asarray(params.goals) == g).all(1))[0] for g in ds.goals])
    assert all(ds.instruction_ids[i] in ids[task_of[i], : counts[task_of[i]]] for i in range(n))
    valid_states = ~pad
    assert bool(np.asarray(legal_fn(ds.states[valid_states])).all())
    assert ds.provenance["success_rate"] == pytest.approx(float(solved.mean()))


def test_random_policy():
    actions = random_policy(40)(jax.random.PRNGKey(1), jnp.zeros((512, 10)), None, None)
    assert actions.shape == (512,) and actions.dtype == jnp.int32
    assert int(actions.min()) == 0 and int(actions.max()) == 39


def test_progress_potential_on_hand_built_states():
    goal = jnp.asarray(tasks.encode_goal(tasks.KIND_RELATIONAL, ((0, 1, tasks.RIGHT),)))
    park = np.array([[-0.8, -0.6], [0.0, 0.0], [-0.8, 0.8], [0.8, 0.8], [0.0, 0.85]], np.float32)

    def at(x: float, y: float) -> jnp.ndarray:
        balls = park.copy()
        balls[0] = (x, y)
        return jnp.asarray(balls.reshape(10))

    done, near, far = at(0.3, 0.0), at(0.6, 0.0), at(1.0, 0.0)
    assert float(progress_fn(done, goal)) == 0.0
    assert 0.0 > float(progress_fn(near, goal)) > float(progress_fn(far, goal))
    # Behind B the path goes around it: longer than the straight-line distance.
    behind = at(-0.3, 0.0)
    assert float(progress_fn(behind, goal)) < -(0.6 - 0.34) - 0.1
    # Push goals have no state potential; the success bonus decides.
    push = jnp.asarray(tasks.encode_goal(tasks.KIND_PUSH, ((0, 0, tasks.RIGHT),)))
    assert float(progress_fn(far, push)) == 0.0
    assert float(score_fn(far, jnp.asarray(0), far, push)) > float(score_fn(far, jnp.asarray(1), far, push))


def test_push_advances_goal_on_a_hand_built_layout():
    """Red (0) at the origin, blue (1) 0.5 to its right, the rest parked at the back; goal "red left of
    blue": red is on the correct side but 0.5 > 0.39 away. A push moves a ball ~0.19 along its direction
    (physics.DIRECTIONS: 0 = +x, 2 = -x, 4 = (+x, +y), 6 = (+x, -y), 1 = +y)."""
    balls = np.array([[0.0, 0.0], [0.5, 0.0], [-0.5, 0.45], [0.0, 0.45], [0.5, 0.45]], np.float32)
    goal = jnp.asarray(tasks.encode_goal(tasks.KIND_RELATIONAL, ((0, 1, tasks.LEFT),)))
    advances = np.asarray(expert.push_advances_goal(jnp.asarray(balls.reshape(10))[None], jnp.arange(40), goal[None]))
    # Red towards blue (+x, diagonals with +x), or blue towards red (-x, diagonals with -x): 8·ball + direction.
    assert set(np.flatnonzero(advances)) == {0, 4, 6, 8 + 2, 8 + 5, 8 + 7}
    # A push of a third ball never counts, and red pushed away from blue (-x) or sideways (+y) does not advance.
    assert not advances[16:].any() and not advances[2] and not advances[1]
    # Easy (push) goals: the push itself decides. Broadcasting: a (2,) batch of states against one goal.
    push = jnp.asarray(tasks.encode_goal(tasks.KIND_PUSH, ((0, 0, tasks.RIGHT),)))
    states = jnp.broadcast_to(jnp.asarray(balls.reshape(10)), (2, 10))
    assert np.asarray(expert.push_advances_goal(states, jnp.array([0, 8]), push)).tolist() == [True, False]


@pytest.mark.slow
def test_default_expert_on_every_hard_goal():
    env, params = level("hard")
    k = params.num_tasks
    ds = collect(env, params, expert.make_policy(), jax.random.PRNGKey(7), 2 * k, task_indices=np.arange(2 * k) % k,
                 chunk_size=2 * k, policy_name="clevr-expert", progress=False)
    rate = success_rate(ds)
    print(f"\nexpert (default, lookahead when stuck) success hard: {rate:.3f} over {ds.num_trajectories} episodes")
    assert rate >= 0.8


def test_active_mask_skips_finished_episodes_without_changing_actions():
    """``active``: the active environments get exactly the actions computed without the mask."""
    env, params = level("train")
    batch = 12
    balls = jax.random.uniform(jax.random.PRNGKey(2), (batch, 5, 2), minval=-0.5, maxval=0.5)
    goal = params.goals[np.arange(batch) % params.num_tasks]
    active = jnp.asarray(np.arange(batch) % 3 == 1)  # 4 active, scattered: one chunk of 4 planned
    config = expert.ExpertConfig(lookahead_width=0, chunk=4)
    run = jax.jit(lambda key, b, g, a: (expert.expert_actions(key, b, g, config),
                                        expert.expert_actions(key, b, g, config, active=a)))
    full, masked = run(jax.random.PRNGKey(3), balls, goal, active)
    np.testing.assert_array_equal(np.asarray(masked)[np.asarray(active)], np.asarray(full)[np.asarray(active)])
    assert (np.asarray(masked)[~np.asarray(active)] == 0).all()
