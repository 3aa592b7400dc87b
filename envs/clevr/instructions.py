"""Natural-language instructions for the CLEVR-Robot goals, per level (written for this project;
per-level counts: docs/envs.md): an instruction table per level and each task's phrasing ids into it."""

from __future__ import annotations

from typing import Final

import numpy as np

from imaginejax.envs.base import level_instruction_functions

from imaginejax.envs.clevr import physics
from imaginejax.envs.clevr import tasks

COLOUR_WORDS: Final[tuple[str, ...]] = tuple(physics.COLOURS)

# Direction words, indexed like tasks.RELATIONS = (behind, left, front, right).
_REL = ("behind", "to the left of", "in front of", "to the right of")
_REL_SIDE = ("on the far side of", "on the left side of", "on the near side of", "on the right side of")
_REL_SHORT = ("behind", "left of", "in front of", "right of")
_REL_HAND = ("at the back of", "on the left-hand side of", "at the front of", "on the right-hand side of")
_REL_CLAUSE = ("behind", "left of", "in front of", "right of")
_PUSH = ("backward", "to the left", "forward", "to the right")
_PUSH_ALT = ("away from the camera", "leftwards", "towards the camera", "rightwards")

# ---------------------------------------------------------------------------------------------------
# Templates. Fields: {a} / {b} colour words, {rel}, {side}, {short}, {hand} relation phrases,
# {push}, {push2} push directions, {clauses} joined clause list, {c0}..{c4} colours in order,
# {centre} the gather centre's colour, {others} the other colours.
# ---------------------------------------------------------------------------------------------------
TRAIN_TEMPLATES: Final[tuple[str, ...]] = (
    "Move the {a} ball {rel} the {b} ball.",
    "Push the {a} ball {rel} the {b} ball.",
    "Put the {a} ball {rel} the {b} ball.",
    "Place the {a} ball {rel} the {b} ball.",
    "Can you move the {a} ball {rel} the {b} ball?",
    "Get the {a} ball {rel} the {b} ball.",
    "The {a} ball should end up {rel} the {b} ball.",
    "Make the {a} ball sit {rel} the {b} ball.",
    "Move the {a} sphere {rel} the {b} sphere.",
    "Push the {a} sphere {rel} the {b} sphere.",
    "I want the {a} ball {rel} the {b} ball.",
    "Bring the {a} ball {rel} the {b} ball.",
    "Relocate the {a} ball so that it is {rel} the {b} ball.",
    "Keep pushing the {a} ball until it is {rel} the {b} ball.",
    "Could you put the {a} ball {rel} the {b} one?",
    "move {a} ball {short} {b} ball",
    "Please push the {a} ball {side} the {b} ball.",
    "Position the {a} ball {side} the {b} ball.",
)

REPHRASE_TEMPLATES: Final[tuple[str, ...]] = (
    "Roll the {a} ball {rel} the {b} ball.",
    "Slide the {a} ball {rel} the {b} ball.",
    "Shift the {a} ball {rel} the {b} ball.",
    "Nudge the {a} ball {rel} the {b} ball.",
    "Shove the {a} ball {rel} the {b} ball.",
    "Steer the {a} ball {rel} the {b} ball.",
    "Guide the {a} ball {rel} the {b} ball.",
    "Send the {a} ball {rel} the {b} ball.",
    "Transfer the {a} ball to a spot {rel} the {b} ball.",
    "Drive the {a} ball {rel} the {b} ball.",
    "Roll the {a} sphere {hand} the {b} sphere.",
    "Slide the {a} orb {hand} the {b} orb.",
    "Set the {a} ball down {hand} the {b} ball.",
    "The {a} ball belongs {hand} the {b} ball; move it there.",
    "Have the {a} ball rest {hand} the {b} ball.",
    "Arrange it so the {a} ball is {hand} the {b} ball.",
    "Your job: the {a} ball goes {rel} the {b} ball.",
    "Go ahead and roll the {a} marble {rel} the {b} marble.",
    "Maneuver the {a} ball until it lies {rel} the {b} ball.",
    "Reposition the {a} ball {rel} the {b} ball.",
    "Would you shift the {a} ball {short} the {b} ball?",
    "Take the {a} ball and leave it {rel} the {b} ball.",
    "The {b} ball needs the {a} ball {rel} it.",
    "With a few pushes, bring the {a} ball {rel} the {b} ball.",
    "Tap the {a} ball along until it is {hand} the {b} ball.",
    "Work the {a} ball over {rel} the {b} ball.",
    "Gently roll the {a} ball {side} the {b} ball.",
    "Try to get the {a} object {rel} the {b} object.",
    "Locate the {a} ball and push it {rel} the {b} ball.",
    "Find the {b} ball, then move the {a} ball {rel} it.",
    "Using the robot, place the {a} ball {side} the {b} ball.",
    "Let the {a} ball come to rest {short} the {b} ball.",
    "Adjust the scene: {a} ball {short} {b} ball.",
    "Target: the {a} ball {short} the {b} ball.",
    "Carry the {a} ball over to {hand_bare} the {b} ball.",
    "Push on the {a} ball till it is close to and {rel} the {b} ball.",
    "Move the {a} ball near the {b} ball, {rel} it.",
    "Next to the {b} ball, {rel} it, is where the {a} ball should go.",
    "Could the {a} ball be rolled {side} the {b} ball?",
    "Make sure the {a} ball ends {hand} the {b} ball.",
)

EASY_TEMPLATES: Final[tuple[str, ...]] = (
    "Push the {a} ball {push}.",
    "Give the {a} ball a push {push}.",
    "Nudge the {a} ball {push}.",
    "Move the {a} ball one step {push}.",
    "Shove the {a} ball {push}.",
    "Tap the {a} ball so it rolls {push}.",
    "Roll the {a} ball {push} a little.",
    "Send the {a} ball {push} with one push.",
    "Push the {a} sphere {push2}.",
    "Make the {a} ball move {push2}.",
)

CONJUNCTION_TEMPLATES: Final[tuple[str, ...]] = (
    "Arrange the balls so that {clauses}.",
    "Make sure that {clauses}.",
    "Push the balls until {clauses}.",
    "Rearrange the scene: {clauses}.",
    "I need a layout where {clauses}.",
    "Set up the table so that {clauses}.",
    "Move things around until {clauses}.",
    "Achieve all of these at once: {clauses}.",
    "Get to a state in which {clauses}.",
    "Organise the balls such that {clauses}.",
)

LINE_TEMPLATES: Final[tuple[str, ...]] = (
    "Line up the balls from left to right in the order {c0}, {c1}, {c2}, {c3}, {c4}.",
    "Arrange all five balls in a horizontal row: {c0}, {c1}, {c2}, {c3}, then {c4}.",
    "Put the balls in a line running left to right, starting with {c0} and ending with {c4}, in colour order.",
    "Make a left-to-right line of balls in the order {c0}, {c1}, {c2}, {c3}, {c4}.",
    "Order the balls along a row, {c0} on the far left and {c4} on the far right, with {c1}, {c2} and {c3} in between.",
    "Form a straight row of balls from left to right: {c0}, {c1}, {c2}, {c3}, {c4}.",
    "Lay out the balls side by side, left to right, as {c0}, {c1}, {c2}, {c3} and {c4}.",
    "Build a line of the five balls going rightwards in the order {c0}, {c1}, {c2}, {c3}, {c4}.",
    "Place the balls in a row so that each one lies to the right of the previous: {c0}, {c1}, {c2}, {c3}, {c4}.",
    "Sort the balls into a horizontal line from left to right: {c0} first, then {c1}, {c2}, {c3}, and {c4} last.",
)

GATHER_TEMPLATES: Final[tuple[str, ...]] = (
    "Gather all the balls around the {centre} ball.",
    "Bring every other ball close to the {centre} ball.",
    "Cluster the balls together around the {centre} one.",
    "Move all the other balls next to the {centre} ball.",
    "Collect the balls into a tight group centred on the {centre} ball.",
    "Push every ball towards the {centre} ball until they all nearly touch it.",
    "Huddle the {others} balls around the {centre} ball.",
    "Make a pile of balls with the {centre} ball in the middle.",
    "Group all five balls together, surrounding the {centre} ball.",
    "Herd the other balls over to the {centre} ball.",
)

LEVEL_TEMPLATE_COUNTS: Final[dict[str, int]] = {
    "train": len(TRAIN_TEMPLATES),
    "rephrase": len(REPHRASE_TEMPLATES),
    "easy": len(EASY_TEMPLATES),
    "hard": len(CONJUNCTION_TEMPLATES),
}


def _join(parts: list[str]) -> str:
    """'x', 'x and y', 'x, y and z'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _relational_fields(a: int, b: int, d: int) -> dict[str, str]:
    hand = _REL_HAND[d]
    return {
        "a": COLOUR_WORDS[a],
        "b": COLOUR_WORDS[b],
        "rel": _REL[d],
        "side": _REL_SIDE[d],
        "short": _REL_SHORT[d],
        "hand": hand,
        "hand_bare": hand.removeprefix("at ").removeprefix("on "),
    }


def goal_instructions(goal: np.ndarray, level: str) -> tuple[str, ...]:
    """The phrasings of one goal at a level, in template order.

    Args:
      goal: (GOAL_DIM,) goal vector (see :mod:`tasks`).
      level: "train", "rephrase", "easy" or "hard".
    Raises: ValueError when the goal's kind does not belong to the level.
    """
    kind, n, clauses = tasks.decode_goal(goal)
    if level in ("train", "rephrase"):
        if kind != tasks.KIND_RELATIONAL or n != 1:
            raise ValueError(f"level {level!r} has single-clause relational goals only, got {tasks.describe_goal(goal)}")
        templates = TRAIN_TEMPLATES if level == "train" else REPHRASE_TEMPLATES
        fields = _relational_fields(*clauses[0])
        return tuple(t.format(**fields) for t in templates)
    if level == "easy":
        if kind != tasks.KIND_PUSH:
            raise ValueError(f"level 'easy' has push goals only, got {tasks.describe_goal(goal)}")
        a, _, d = clauses[0]
        return tuple(t.format(a=COLOUR_WORDS[a], push=_PUSH[d], push2=_PUSH_ALT[d]) for t in EASY_TEMPLATES)
    if level == "hard":
        if kind == tasks.KIND_RELATIONAL and n >= 2:
            parts = [f"the {COLOUR_WORDS[a]} ball is {_REL_CLAUSE[d]} the {COLOUR_WORDS[b]} ball" for a, b, d in clauses]
            return tuple(t.format(clauses=_join(parts)) for t in CONJUNCTION_TEMPLATES)
        if kind == tasks.KIND_LINE:
            return tuple(t.format(**{f"c{i}": c for i, c in enumerate(COLOUR_WORDS)}) for t in LINE_TEMPLATES)
        if kind == tasks.KIND_GATHER:
            centre = clauses[0][0]
            others = _join([c for i, c in enumerate(COLOUR_WORDS) if i != centre])
            return tuple(t.format(centre=COLOUR_WORDS[centre], others=others) for t in GATHER_TEMPLATES)
        raise ValueError(f"level 'hard' has conjunction, line and gather goals, got {tasks.describe_goal(goal)}")
    raise ValueError(f"unknown CLEVR-Robot level {level!r}; valid levels: {', '.join(tasks.LEVELS)}")


# level_instruction_table(level) -> (strings (M,), phrasing ids (K, P) int32 padded with -1, counts (K,)),
# cached; level_instructions(level) -> the M strings. Task k is phrased by goal_instructions(goals[k], level).
level_instruction_table, level_instructions = level_instruction_functions(goal_instructions, tasks.level_goals)
