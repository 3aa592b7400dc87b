"""CLEVR-Robot drawn from above with matplotlib: the five balls on the table plane in their colours, the
push about to happen as an arrow."""

from __future__ import annotations

from typing import Any

import numpy as np

from imaginejax.envs.clevr import physics
from imaginejax.envs.registry import Renderer


def draw(ax: Any, state: np.ndarray, action: Any = None, limits: np.ndarray | None = None) -> None:
    """State (10,) = five ball centres (x, y) in colour order, drawn as discs of the ball radius; ``action``
    (ball · 8 + direction) as an arrow from the ball it pushes; ``limits`` (2, 2) the view's
    [[x0, y0], [x1, y1]]."""
    from matplotlib.patches import Circle

    balls = np.asarray(state, np.float64).reshape(physics.N_BALLS, 2)
    ax.set_facecolor("0.86")
    for xy, colour in zip(balls, physics.COLOURS):
        ax.add_patch(Circle(xy, physics.BALL_RADIUS, facecolor=colour, edgecolor="black", linewidth=0.6))
    if action is not None:
        ball, direction = divmod(int(action), 8)
        push = physics.DIRECTIONS[direction] / np.linalg.norm(physics.DIRECTIONS[direction]) * 0.2
        ax.arrow(*balls[ball], *push, width=0.012, color="black", length_includes_head=True)
    if limits is None:
        limits = np.stack([balls.min(0), balls.max(0)])
    ax.set_xlim(limits[0, 0], limits[1, 0])
    ax.set_ylim(limits[0, 1], limits[1, 1])
    ax.set_aspect("equal")


def limits(states: np.ndarray, margin: float = 0.25) -> np.ndarray:
    """(2, 2) square view [[x0, y0], [x1, y1]] holding every ball of states (..., 10) with ``margin`` around."""
    balls = np.asarray(states, np.float64).reshape(-1, 2)
    centre, half = (balls.min(0) + balls.max(0)) / 2, (balls.max(0) - balls.min(0)).max() / 2 + margin
    return np.stack([centre - half, centre + half])


def renderer() -> Renderer:
    """One view per episode, so the panels of an episode share their scale."""
    return Renderer(draw=draw, view=limits)
