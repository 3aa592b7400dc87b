"""HalfCheetah tasks: success predicates on hand-built displacement sequences, rewards by hand,
legality, goal tables and instructions (pure functions; no physics)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.envs.cheetah import instructions as I
from imaginejax.envs.cheetah import tasks as T

RUN_F = (T.KIND_RUN, T.FORWARD)
RUN_B = (T.KIND_RUN, T.BACKWARD)
JUMP_F = (T.KIND_JUMP, T.FORWARD)
JUMP_B = (T.KIND_JUMP, T.BACKWARD)
FAST_F = (T.KIND_RUN_FAST, T.FORWARD)
FAST_B = (T.KIND_RUN_FAST, T.BACKWARD)
FB = (T.KIND_FORWARD_BACKWARD, T.FORWARD)
BF = (T.KIND_FORWARD_BACKWARD, T.BACKWARD)
IN_PLACE = (T.KIND_JUMP_IN_PLACE, T.IN_PLACE)
ALL_GOALS = (RUN_F, RUN_B, JUMP_F, JUMP_B, FAST_F, FAST_B, FB, BF, IN_PLACE)


def states_from_dx(dx: np.ndarray) -> np.ndarray:
    """(…, T) displacements → (…, T+1, 18) states with those dx (s_0 has dx 0), other slots 0."""
    dx = np.asarray(dx, np.float32)
    states = np.zeros(dx.shape[:-1] + (dx.shape[-1] + 1, T.STATE_DIM), np.float32)
    states[..., 1:, T.DX] = dx
    return states


def success_steps(dx: np.ndarray, goal: tuple[int, int]) -> np.ndarray:
    """Step numbers t (1-based) after which the predicate holds, for a (T,) dx sequence."""
    states = jnp.asarray(states_from_dx(dx))
    progress = T.trajectory_progress(states)
    t = jnp.arange(1, len(dx) + 1)
    ok = T.success(progress, t, jnp.broadcast_to(jnp.asarray(goal, jnp.int32), (len(dx), 2)))
    return np.flatnonzero(np.asarray(ok)) + 1


def first_success(dx: np.ndarray, goal: tuple[int, int]) -> int | None:
    steps = success_steps(dx, goal)
    return int(steps[0]) if steps.size else None


# ---------------------------------------------------------------------------------------------------
# Success predicates on hand-built Σ sequences (t = steps taken, Σ = Σ dx)
# ---------------------------------------------------------------------------------------------------
def test_run_forward_and_backward():
    steady = np.full(200, 0.08)  # Σ after k steps = 0.08 k: 7.92 at t = 99
    assert first_success(steady, RUN_F) == 99
    assert first_success(-steady, RUN_B) == 99
    assert first_success(steady, RUN_B) is None and first_success(-steady, RUN_F) is None
    fast_start = np.concatenate([np.full(20, 0.5), np.zeros(180)])  # Σ = 10 already at t = 20
    assert first_success(fast_start, RUN_F) == 99  # ... but not before t = 99
    slow = np.full(200, 0.034)  # Σ(200) = 6.8: never
    assert first_success(slow, RUN_F) is None
    late = np.full(200, 0.036)  # Σ(t) = 0.036 t > 7 from t = 195
    assert first_success(late, RUN_F) == 195


def test_run_fast_threshold_is_8_5():
    dx = np.full(200, 0.08)  # Σ(99) = 7.92: enough to run, not to run fast; Σ > 8.5 from t = 107
    assert first_success(dx, FAST_F) == 107
    assert first_success(-dx, FAST_B) == 107
    assert first_success(np.full(200, 0.09), FAST_F) == 99  # Σ(99) = 8.91


def test_jump_forward_is_forward_and_needs_five_steps():
    dx = np.full(10, 0.01)
    assert first_success(dx, JUMP_F) == 5
    assert first_success(-dx, JUMP_B) == 5
    assert first_success(dx, JUMP_B) is None  # the reference's swapped labels would pass this
    assert first_success(-dx, JUMP_F) is None
    back_then_forth = np.array([-0.1, -0.1, 0.05, 0.05, 0.05, 0.06, 0.0])  # Σ: -.1 -.2 -.15 -.1 -.05 .01 .01
    assert success_steps(back_then_forth, JUMP_F).tolist() == [6, 7]


def test_jump_in_place():
    still = np.zeros(30)
    assert first_success(still, IN_PLACE) == 15
    drift = np.full(30, 0.071)  # Σ(15) = 1.065
    assert first_success(drift, IN_PLACE) is None
    assert first_success(np.full(30, 0.069), IN_PLACE) == 15
    wander = np.concatenate([np.full(10, 0.3), np.full(20, -0.3)])  # Σ: 3.0 at 10, back to 0.0 at 20
    assert first_success(wander, IN_PLACE) == 17  # |Σ(17)| = 0.9, |Σ(16)| = 1.2


def test_forward_then_backward_order_counts():
    fwd_bwd = np.concatenate([np.full(100, 0.048), np.full(100, -0.048)])
    # forward leg done at t = 63 (63 steps > 30, 3.024 > 3; 2.976 at 62); backward leg at t = 163
    progress = T.trajectory_progress(jnp.asarray(states_from_dx(fwd_bwd)))
    assert float(progress.forward_done_at[-1]) == 63 and float(progress.backward_done_at[-1]) == 163
    assert success_steps(fwd_bwd, FB).tolist() == [199, 200]
    assert first_success(fwd_bwd, BF) is None  # wrong order
    bwd_fwd = -fwd_bwd
    assert success_steps(bwd_fwd, BF).tolist() == [199, 200]
    assert first_success(bwd_fwd, FB) is None


def test_forward_then_backward_needs_both_legs():
    # only 30 backward steps (the count must exceed 30)
    short = np.concatenate([np.full(170, 0.05), np.full(30, -0.2)])
    assert first_success(short, FB) is None
    enough = np.concatenate([np.full(169, 0.05), np.full(31, -0.2)])
    assert first_success(enough, FB) == 200  # backward leg done at t = 200
    # 100 backward steps summing to only -2.0
    weak = np.concatenate([np.full(100, 0.05), np.full(100, -0.02)])  # backward sum -2.0
    assert first_success(weak, FB) is None
    # both legs done by t = 199 but success is only checked from t = 199 on
    early = np.concatenate([np.full(40, 0.1), np.full(40, -0.1), np.zeros(120)])
    assert success_steps(early, FB).tolist() == [199, 200]
    assert first_success(early, BF) is None


def test_predicates_against_a_direct_reading_of_the_spec():
    """Random dx sequences: the scan-based predicates equal Σ/count formulas evaluated with numpy."""
    rng = np.random.default_rng(0)
    dx = rng.normal(0.0, 0.08, (64, 200)) + rng.uniform(-0.06, 0.06, (64, 1))
    dx[:8, :] = np.abs(dx[:8, :])
    dx[8:16, :] = -np.abs(dx[8:16, :])
    dx[16:24, :100], dx[16:24, 100:] = np.abs(dx[16:24, :100]), -np.abs(dx[16:24, 100:])  # there and back
    dx[24:32, :100], dx[24:32, 100:] = -np.abs(dx[24:32, :100]), np.abs(dx[24:32, 100:])
    dx = dx.astype(np.float32)
    sigma = np.cumsum(dx.astype(np.float64), axis=1)
    t = np.arange(1, 201)
    npos, nneg = np.cumsum(dx > 0, 1), np.cumsum(dx < 0, 1)
    spos, sneg = np.cumsum(np.where(dx > 0, dx, 0), 1), np.cumsum(np.where(dx < 0, dx, 0), 1)
    fwd_leg, bwd_leg = (npos > 30) & (spos > 3), (nneg > 30) & (sneg < -3)
    first_f = np.where(fwd_leg.any(1), fwd_leg.argmax(1) + 1, 10**6)
    first_b = np.where(bwd_leg.any(1), bwd_leg.argmax(1) + 1, 10**6)
    expected = {
        RUN_F: (t >= 99) & (sigma > 7), RUN_B: (t >= 99) & (sigma < -7),
        FAST_F: (t >= 99) & (sigma > 8.5), FAST_B: (t >= 99) & (sigma < -8.5),
        JUMP_F: (t >= 5) & (sigma > 0), JUMP_B: (t >= 5) & (sigma < 0),
        IN_PLACE: (t >= 15) & (np.abs(sigma) < 1.05),
        FB: (t >= 199) & fwd_leg & bwd_leg & (first_f < first_b)[:, None],
        BF: (t >= 199) & fwd_leg & bwd_leg & (first_b < first_f)[:, None],
    }
    progress = T.trajectory_progress(jnp.asarray(states_from_dx(dx)))
    for goal, want in expected.items():
        got = np.asarray(T.success(progress, jnp.asarray(t), jnp.broadcast_to(jnp.asarray(goal), (64, 200, 2))))
        near = np.abs(np.abs(sigma) - np.array([7, 8.5, 1.05, 0])[:, None, None]).min(0) < 1e-4  # float32 ties
        np.testing.assert_array_equal(got[~near], want[~near], err_msg=T.describe_goal(np.array(goal)))
        assert want.any() and not want.all(), goal  # the sample exercises every predicate both ways


def test_progress_update_step_by_step_equals_trajectory_scan():
    rng = np.random.default_rng(1)
    dx = rng.normal(0.02, 0.1, (3, 80)).astype(np.float32)
    states = jnp.asarray(states_from_dx(dx))
    scanned = T.trajectory_progress(states)
    progress = T.Progress.zeros((3,))
    for t in range(80):
        progress = T.update_progress(progress, states[:, t + 1], jnp.full((3,), t + 1))
    for a, b in zip(jax.tree.leaves(progress), jax.tree.leaves(jax.tree.map(lambda x: x[:, -1], scanned))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(progress.sigma), dx.sum(1), rtol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Rewards by hand
# ---------------------------------------------------------------------------------------------------
def one_state(dx: float = 0.0, rootz: float = 0.0, pitch: float = 0.0) -> jnp.ndarray:
    s = np.zeros(T.STATE_DIM, np.float32)
    s[T.DX], s[T.ROOTZ], s[T.ROOTY] = dx, rootz, pitch
    return jnp.asarray(s)


def reward_of(goal, dx=0.1, rootz=-0.13, pitch=0.0, action=0.5, progress=None) -> float:
    progress = T.Progress.zeros() if progress is None else progress
    a = jnp.full((6,), action, jnp.float32)
    return float(T.reward(one_state(), a, one_state(dx, rootz, pitch), jnp.asarray(goal, jnp.int32), progress))


def test_rewards_by_hand():
    # v = 0.1 / 0.05 = 2 m/s; control cost = 0.1 · 6 · 0.25 = 0.15
    assert reward_of(RUN_F) == pytest.approx(2.0 - 0.15, abs=1e-5)
    assert reward_of(RUN_B) == pytest.approx(-2.0 - 0.15, abs=1e-5)
    assert reward_of(FAST_F) == pytest.approx(1.85, abs=1e-5) and reward_of(FAST_B) == pytest.approx(-2.15, abs=1e-5)
    # jump: speed capped at 1 m/s, hop = 10 · (rootz - (-0.13)) · cos(pitch)
    assert reward_of(JUMP_F, rootz=0.07) == pytest.approx(1.0 + 10 * 0.2 - 0.15, abs=1e-5)
    assert reward_of(JUMP_B, rootz=0.07) == pytest.approx(-1.0 + 2.0 - 0.15, abs=1e-5)
    assert reward_of(JUMP_F, rootz=0.07, pitch=math.pi / 3) == pytest.approx(1.0 + 1.0 - 0.15, abs=1e-5)
    assert reward_of(JUMP_F, rootz=0.07, pitch=math.pi) == pytest.approx(1.0 - 0.15, abs=1e-5)  # flipped
    assert reward_of(JUMP_F, dx=0.01, rootz=-0.3) == pytest.approx(0.2 - 0.15, abs=1e-5)  # below rest: no hop
    assert reward_of(IN_PLACE, rootz=0.07) == pytest.approx(-2.0 + 2.0 - 0.15, abs=1e-5)
    assert reward_of(IN_PLACE, dx=-0.1, rootz=0.07) == pytest.approx(-0.15, abs=1e-5)
    # the control cost sees the unclamped action: a = 2 → 0.1 · 6 · 4
    assert reward_of(RUN_F, action=2.0) == pytest.approx(2.0 - 2.4, abs=1e-5)


def test_forward_backward_reward_follows_the_current_leg():
    fresh = T.Progress.zeros()
    forward_done = fresh.replace(forward_done_at=jnp.float32(61))
    backward_done = fresh.replace(backward_done_at=jnp.float32(61))
    assert reward_of(FB, progress=fresh) == pytest.approx(1.85, abs=1e-5)  # first leg: forward
    assert reward_of(FB, progress=forward_done) == pytest.approx(-2.15, abs=1e-5)  # then backward
    assert reward_of(FB, progress=backward_done) == pytest.approx(1.85, abs=1e-5)  # wrong leg does not count
    assert reward_of(BF, progress=fresh) == pytest.approx(-2.15, abs=1e-5)
    assert reward_of(BF, progress=backward_done) == pytest.approx(1.85, abs=1e-5)


def test_trajectory_success_and_reward_matches_stepwise():
    fwd_bwd = np.concatenate([np.full(100, 0.048), np.full(100, -0.048)]).astype(np.float32)
    states = jnp.asarray(states_from_dx(fwd_bwd))
    actions = jnp.zeros((200, 6))
    ok, rew = T.trajectory_success_and_reward(states, actions, jnp.asarray(FB, jnp.int32))
    assert np.flatnonzero(np.asarray(ok)).tolist() == [198, 199]  # after steps 199 and 200
    rew = np.asarray(rew)
    # v = ±0.96 m/s. Reward +v while the forward leg is not done (steps 1..63; done after step 63),
    # then −v: −0.96 for steps 64..100 (still moving forward), +0.96 once moving backward.
    np.testing.assert_allclose(rew[:63], 0.96, atol=1e-5)
    np.testing.assert_allclose(rew[63:100], -0.96, atol=1e-5)
    np.testing.assert_allclose(rew[100:], 0.96, atol=1e-5)


# ---------------------------------------------------------------------------------------------------
# Legality
# ---------------------------------------------------------------------------------------------------
def test_legal():
    rest = np.zeros(T.STATE_DIM, np.float32)
    rest[T.ROOTZ] = T.REST_HEIGHT
    assert bool(T.legal(jnp.asarray(rest)))
    flipped = rest.copy()
    flipped[T.ROOTY] = 7.0  # the pitch may wind up
    assert bool(T.legal(jnp.asarray(flipped)))
    bad = {"nan": (T.VX, np.nan), "inf": (5, np.inf), "teleport": (T.DX, 2.0), "under floor": (T.ROOTZ, -0.8),
           "flying": (T.ROOTZ, 3.0), "bthigh beyond limit": (3, 1.6), "ffoot beyond limit": (8, -1.1),
           "vx": (T.VX, 40.0), "pitch rate": (T.PITCH_RATE, -70.0), "joint speed": (15, 120.0)}
    rows = []
    for name, (i, v) in bad.items():
        s = rest.copy()
        s[i] = v
        rows.append(s)
        assert not bool(T.legal(jnp.asarray(s))), name
    batch = np.stack([rest] + rows)
    assert np.asarray(T.legal(jnp.asarray(batch))).tolist() == [True] + [False] * len(rows)


# ---------------------------------------------------------------------------------------------------
# Goals and instructions
# ---------------------------------------------------------------------------------------------------
def test_goal_tables():
    assert [T.describe_goal(g) for g in T.level_goals("train")] == [
        "run forward", "run backward", "jump forward", "jump backward"]
    np.testing.assert_array_equal(T.level_goals("rephrase"), T.level_goals("train"))
    assert [T.describe_goal(g) for g in T.level_goals("easy")] == ["run forward fast", "run backward fast"]
    assert [T.describe_goal(g) for g in T.level_goals("hard")] == [
        "forward then backward", "backward then forward", "jump in place"]
    assert all(T.level_max_steps(level) == 200 for level in T.LEVELS)
    with pytest.raises(ValueError, match="valid levels"):
        T.level_goals("medium")
    with pytest.raises(ValueError, match="not a HalfCheetah goal"):
        T.describe_goal(np.array([7, 1]))


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    return any(w in text.lower() for w in words)


def test_instruction_counts_and_disjoint_levels():
    train = {T.describe_goal(g): I.goal_instructions(g, "train") for g in T.level_goals("train")}
    rephrase = {T.describe_goal(g): I.goal_instructions(g, "rephrase") for g in T.level_goals("rephrase")}
    for name in train:
        assert len(set(train[name])) == len(train[name]) >= 40, name
        assert len(set(rephrase[name])) == len(rephrase[name]) == 10, name
    all_train = {s for v in train.values() for s in v}
    all_rephrase = {s for v in rephrase.values() for s in v}
    assert not all_train & all_rephrase
    for level in T.LEVELS:
        table, ids, counts = I.level_instruction_table(level)
        assert len(set(table)) == len(table)
        for k in range(len(counts)):
            assert (ids[k, : counts[k]] >= 0).all() and (ids[k, counts[k]:] == -1).all()
    assert [len(I.goal_instructions(g, "hard")) for g in T.level_goals("hard")] == [10, 10, 10]
    assert [len(I.goal_instructions(g, "easy")) for g in T.level_goals("easy")] == [10, 10]


@pytest.mark.parametrize("level", ["train", "rephrase", "easy"])
def test_instructions_name_their_direction(level):
    """Every forward instruction says forward (and never backward), and vice versa — in particular the
    jump tasks, whose instructions the reference had swapped."""
    for goal in T.level_goals(level):
        forward = int(goal[1]) == T.FORWARD
        for text in I.goal_instructions(goal, level):
            assert _mentions(text, I.FORWARD_WORDS if forward else I.BACKWARD_WORDS), text
            assert not _mentions(text, I.BACKWARD_WORDS if forward else I.FORWARD_WORDS), text
            is_jump = int(goal[0]) == T.KIND_JUMP
            jump_words = ("jump", "hop", "leap", "spring", "bound", "vault", "pounce", "skip", "bounce",
                          "launch", "hurdle", "airborne")
            assert _mentions(text, jump_words) == is_jump, text


def test_hard_instructions_name_the_legs_in_order():
    fb, bf, in_place = T.level_goals("hard")
    for text in I.goal_instructions(fb, "hard"):
        assert text.index("forward") < text.index("backward"), text
    for text in I.goal_instructions(bf, "hard"):
        assert text.index("backward") < text.index("forward"), text
    for text in I.goal_instructions(in_place, "hard"):
        assert _mentions(text, ("place", "position", "spot", "stand", "stay", "put", "without")), text
    with pytest.raises(ValueError, match="run and jump goals only"):
        I.goal_instructions(fb, "train")
