"""BabyAI's room drawn with matplotlib in minigrid's coordinates (x east, y south)."""

from __future__ import annotations

from typing import Any

import numpy as np

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.registry import Renderer

PALETTE = {"red": "#e6194b", "green": "#3cb44b", "blue": "#4363d8", "purple": "#911eb4", "yellow": "#ffe119",
           "grey": "#808080"}


def draw(ax: Any, state: np.ndarray, action: Any = None, view: Any = None) -> None:
    """State (17,) (:mod:`~imaginejax.envs.babyai.grid` layout): walls dark, the door on the east wall in its
    colour (open: an outline, closed: filled, locked: filled and crossed), ball (disc), box (open square) and
    key (diamond) in their colours, the agent a black triangle holding a small copy of what it carries.
    ``action`` and ``view`` are unused."""
    from matplotlib.patches import Circle, Polygon, Rectangle

    del action, view
    s = np.rint(np.asarray(state)).astype(int)
    colour = lambda index: PALETTE[G.COLOURS[index]]

    def shape(kind: int, x: float, y: float, size: float, fill: str) -> Any:
        if kind == G.BALL:
            return Circle((x, y), 0.32 * size, facecolor=fill, edgecolor="black", linewidth=0.5)
        if kind == G.BOX:
            return Rectangle((x - 0.3 * size, y - 0.3 * size), 0.6 * size, 0.6 * size, facecolor="none",
                             edgecolor=fill, linewidth=2.5 * size)
        return Polygon([(x, y - 0.35 * size), (x + 0.25 * size, y), (x, y + 0.35 * size), (x - 0.25 * size, y)],
                       facecolor=fill, edgecolor="black", linewidth=0.5)

    ax.set_facecolor("white")
    for x in range(G.GRID_SIZE):
        for y in range(G.GRID_SIZE):
            inside = G.ROOM_MIN <= x <= G.ROOM_MAX and G.ROOM_MIN <= y <= G.ROOM_MAX
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor="white" if inside else "0.35", edgecolor="0.75",
                                   linewidth=0.3))
    door_y, door_state, door_colour = s[G.DOOR_Y], s[G.DOOR_STATE], colour(s[G.DOOR_COLOUR])
    ax.add_patch(Rectangle((G.DOOR_X + 0.1, door_y + 0.1), 0.8, 0.8, linewidth=1.5, edgecolor=door_colour,
                           facecolor="white" if door_state == G.OPEN else door_colour))
    if door_state == G.LOCKED:
        for ends in ((0.25, 0.75), (0.75, 0.25)):
            ax.plot([G.DOOR_X + 0.25, G.DOOR_X + 0.75], [door_y + ends[0], door_y + ends[1]], color="black",
                    linewidth=1.0)
    for slot, kind in enumerate(G.OBJECTS):
        if s[G.CARRIED_TYPE] != kind:
            x, y = s[G.BALL_X + 3 * slot] + 0.5, s[G.BALL_Y + 3 * slot] + 0.5
            ax.add_patch(shape(kind, x, y, 1.0, colour(s[G.BALL_COLOUR + 3 * slot])))
    x, y = s[G.AGENT_X] + 0.5, s[G.AGENT_Y] + 0.5
    ax.add_patch(Polygon([(x, y - 0.38), (x + 0.36, y + 0.34), (x - 0.36, y + 0.34)], facecolor="black"))
    if s[G.CARRIED_TYPE] != G.NOTHING:
        ax.add_patch(shape(s[G.CARRIED_TYPE], x, y + 0.1, 0.5, colour(s[G.CARRIED_COLOUR])))
    ax.set_xlim(0, G.GRID_SIZE)
    ax.set_ylim(G.GRID_SIZE, 0)  # y grows to the south
    ax.set_aspect("equal")


def renderer() -> Renderer:
    return Renderer(draw=draw)
