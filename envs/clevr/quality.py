"""What the quality report of generated CLEVR rollouts checks: legality by cause, projection onto the
legal set, and the push simulator set to a generated state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.clevr import physics, tasks
from imaginejax.envs.clevr.env import CLEVRRobot
from imaginejax.envs.registry import QualityRules


def clevr_violations(states: jax.Array) -> dict[str, jax.Array]:
    """Why CLEVR states are illegal: (..., 10) -> {``"non-finite"``, ``"out of workbench"``,
    ``"overlapping balls"``: (...) bool}.

    The same rules and constants as :func:`imaginejax.envs.clevr.tasks.legal` (a ball outside
    ``[WORKBENCH_LOW, WORKBENCH_HIGH]``; two centres closer than ``2R - PENETRATION_TOLERANCE``),
    split by cause; a non-finite state is only counted as non-finite.
    """
    finite = jnp.all(jnp.isfinite(states), axis=-1)
    balls = tasks.balls_of(jnp.where(jnp.isfinite(states), states, 0.0))
    low, high = jnp.asarray(tasks.WORKBENCH_LOW), jnp.asarray(tasks.WORKBENCH_HIGH)
    inside = jnp.all((balls >= low) & (balls <= high), axis=(-2, -1))
    gaps = jnp.linalg.norm(balls[..., :, None, :] - balls[..., None, :, :], axis=-1)
    gaps = gaps + jnp.eye(tasks.N_BALLS) * 1e3
    overlapping = jnp.any(gaps < 2 * tasks.BALL_RADIUS - tasks.PENETRATION_TOLERANCE, axis=(-2, -1))
    return {"non-finite": ~finite, "out of workbench": finite & ~inside,
            "overlapping balls": finite & overlapping}


def project_clevr(states: jax.Array, iterations: int = 32) -> jax.Array:
    """Moves CLEVR states onto the legal set: (..., 10) -> (..., 10).

    Balls are clipped into the workbench, then ``iterations`` Jacobi sweeps push every pair that
    overlaps illegally (centre distance below ``2R - PENETRATION_TOLERANCE``) apart along the line of
    centres, each ball by half of what separates the pair to ``2R - PENETRATION_TOLERANCE / 2`` (inside
    the legal set with a margin), clipping again after each sweep. Two coincident balls separate
    along a fixed pair-specific direction. Legal states are returned unchanged; non-finite entries
    stay non-finite. The result is legal whenever the sweeps resolve every overlap (how many sweeps
    that takes: docs/quality_rules.md); the quality report measures it on generated data anyway.
    """
    n = tasks.N_BALLS
    low, high = jnp.asarray(tasks.WORKBENCH_LOW), jnp.asarray(tasks.WORKBENCH_HIGH)
    balls = jnp.clip(tasks.balls_of(states), low, high)
    index = np.arange(n)
    angle = 2.0 * np.pi * (index[:, None] * n + index[None, :]) / (n * n)
    fallback = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # (5, 5, 2) pair i<j direction
    fallback = np.where((index[:, None] < index[None, :])[..., None], fallback, -fallback.swapaxes(0, 1))
    off_diagonal = jnp.asarray(~np.eye(n, dtype=bool))
    limit = 2.0 * tasks.BALL_RADIUS - tasks.PENETRATION_TOLERANCE
    target = 2.0 * tasks.BALL_RADIUS - 0.5 * tasks.PENETRATION_TOLERANCE

    def sweep(_: int, balls: jax.Array) -> jax.Array:
        diff = balls[..., :, None, :] - balls[..., None, :, :]  # (..., i, j, 2): i - j
        dist = jnp.linalg.norm(diff, axis=-1)
        unit = jnp.where((dist > 1e-9)[..., None], diff / jnp.maximum(dist, 1e-9)[..., None],
                         jnp.asarray(fallback, balls.dtype))
        overlap = jnp.where(off_diagonal & (dist < limit), target - dist, 0.0)
        moved = balls + 0.5 * jnp.sum(overlap[..., None] * unit, axis=-2)
        return jnp.clip(moved, low, high)

    balls = jax.lax.fori_loop(0, iterations, sweep, balls)
    return balls.reshape(states.shape).astype(states.dtype)


def _clevr_simulate(states: jax.Array, actions: jax.Array) -> jax.Array:
    ball, direction = physics.decode_action(actions.astype(jnp.int32))
    pushed = physics.push(tasks.balls_of(states), ball, direction)
    return pushed.reshape(states.shape)


def quality_rules() -> QualityRules:
    """CLEVR's :class:`~imaginejax.envs.registry.QualityRules` (its registry entry's ``quality``)."""
    return QualityRules(
        name="clevr", state_dim=tasks.STATE_DIM, success=CLEVRRobot.success, legal=CLEVRRobot.legal,
        simulate=_clevr_simulate, entity_size=2, error_scale=tasks.BALL_RADIUS,
        error_unit=f"ball radii ({tasks.BALL_RADIUS:g})", threshold=1.0,
        violations=clevr_violations, project=project_clevr,
        project_name="clip to the workbench + separate overlapping balls")
