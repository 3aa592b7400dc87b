"""Natural-language instructions for the BabyAI goals, per level (written for this project; per-level
counts: docs/envs.md): an instruction table per level and each task's phrasing ids into it."""

from __future__ import annotations

from typing import Final

import numpy as np

from imaginejax.envs.base import level_instruction_functions

from imaginejax.envs.babyai import grid as G
from imaginejax.envs.babyai import tasks

# Fields: {x} = "<colour> <object>" of X, {y} = the same for Y, {o} / {c} = X's object / colour word,
# {door} = "<colour> door" (or "door"), {wall} = "the west wall" ... or "a wall".
GO_TO_TRAIN: Final[tuple[str, ...]] = (
    "Go to the {x}.",
    "Walk to the {x}.",
    "Move to the {x}.",
    "Head to the {x}.",
    "Go over to the {x}.",
    "Make your way to the {x}.",
    "Get close to the {x}.",
    "Approach the {x}.",
    "Navigate to the {x}.",
    "Find the {x} and stand next to it.",
    "Go and stand by the {x}.",
    "Reach the {x}.",
    "Travel to the {x}.",
    "Move next to the {x}.",
    "Please go to the {x}.",
    "Can you go to the {x}?",
    "Your goal is to reach the {x}.",
    "Head over to where the {x} is.",
    "Walk up to the {x}.",
    "Go towards the {x} until you are beside it.",
    "Stand beside the {x}.",
    "Position yourself next to the {x}.",
    "Get to the {x}.",
    "go to {x}",
    "Find your way to the {x}.",
    "Step over to the {x}.",
    "Move yourself to the {x}.",
    "Locate the {x} and go to it.",
    "Walk over to the {x}.",
    "I want you next to the {x}.",
    "Go near the {x}.",
    "Come to the {x}.",
    "Move until you reach the {x}.",
    "Go up to the {x}.",
    "Head for the {x}.",
    "Make it to the {x}.",
    "Proceed to the {x}.",
    "Go find the {x}.",
    "Navigate your way over to the {x}.",
    "Stand right by the {x}.",
)

OPEN_TRAIN: Final[tuple[str, ...]] = (
    "Open the {door}.",
    "Go and open the {door}.",
    "Please open the {door}.",
    "Get the {door} open.",
    "Walk to the {door} and open it.",
    "Swing the {door} open.",
    "Can you open the {door}?",
    "Make the {door} open.",
    "Find the {door} and open it.",
    "Your task is to open the {door}.",
    "Pull the {door} open.",
    "Push open the {door}.",
    "Go over to the {door} and open it up.",
    "Open up the {door}.",
    "Head to the {door} and open it.",
    "open {door}",
    "Set the {door} open.",
    "Leave the {door} open.",
    "Throw open the {door}.",
    "Make sure the {door} is open.",
    "Get that {door} opened.",
    "Approach the {door} and open it.",
    "The {door} should be opened.",
    "Go open the {door}.",
    "I need the {door} open.",
    "Navigate to the {door} and open it.",
    "Reach the {door}, then open it.",
    "Move to the {door} and swing it open.",
    "Have the {door} opened.",
    "Go to the {door} and open it.",
    "Could you open the {door}, please?",
    "Open the door that is {c}.",
    "Walk up to the {door} and pull it open.",
    "Step up to the {door} and open it.",
    "Your goal: the {door}, open.",
    "See that the {door} gets opened.",
    "Open the {c} coloured door.",
    "Head over and open the {door}.",
    "Travel to the {door} and open it.",
    "Make your way to the {door} and open it.",
)

PICK_UP_TRAIN: Final[tuple[str, ...]] = (
    "Pick up the {x}.",
    "Grab the {x}.",
    "Take the {x}.",
    "Pick the {x} up.",
    "Go and pick up the {x}.",
    "Collect the {x}.",
    "Get the {x}.",
    "Fetch the {x}.",
    "Lift the {x}.",
    "Please pick up the {x}.",
    "Can you pick up the {x}?",
    "Find the {x} and pick it up.",
    "Walk to the {x} and grab it.",
    "Your task is to pick up the {x}.",
    "Hold the {x}.",
    "pick up {x}",
    "Retrieve the {x}.",
    "Go get the {x}.",
    "Take hold of the {x}.",
    "Grab hold of the {x}.",
    "Pick up the {o} that is {c}.",
    "Head to the {x} and take it.",
    "Obtain the {x}.",
    "Get your hands on the {x}.",
    "Go over to the {x} and pick it up.",
    "Carry the {x}.",
    "Scoop up the {x}.",
    "I want you holding the {x}.",
    "Make sure you are carrying the {x}.",
    "Locate the {x} and take it.",
    "Reach the {x} and lift it.",
    "Pick up that {x}.",
    "Go fetch the {x}.",
    "Navigate to the {x} and pick it up.",
    "Take the {x} into your hands.",
    "Collect the {c}-coloured {o}.",
    "Lift up the {x}.",
    "Snatch the {x}.",
    "Could you grab the {x}?",
    "Go to the {x} and pick it up.",
)

PUT_NEXT_TRAIN: Final[tuple[str, ...]] = (
    "Put the {x} next to the {y}.",
    "Place the {x} next to the {y}.",
    "Move the {x} next to the {y}.",
    "Put the {x} beside the {y}.",
    "Set the {x} down next to the {y}.",
    "Bring the {x} next to the {y}.",
    "Carry the {x} over to the {y}.",
    "Drop the {x} beside the {y}.",
    "Place the {x} by the {y}.",
    "Put the {x} by the {y}.",
    "Move the {x} so it is next to the {y}.",
    "Pick up the {x} and put it next to the {y}.",
    "Take the {x} to the {y}.",
    "Put the {x} close to the {y}.",
    "Leave the {x} next to the {y}.",
    "put {x} next to {y}",
    "Can you put the {x} next to the {y}?",
    "Please place the {x} beside the {y}.",
    "The {x} should end up next to the {y}.",
    "Grab the {x} and set it beside the {y}.",
    "Move the {x} over beside the {y}.",
    "Position the {x} next to the {y}.",
    "Relocate the {x} next to the {y}.",
    "Get the {x} next to the {y}.",
    "Put down the {x} next to the {y}.",
    "Bring the {x} over and drop it by the {y}.",
    "Set the {x} beside the {y}.",
    "Make the {x} sit next to the {y}.",
    "Put the {x} adjacent to the {y}.",
    "Place the {x} right next to the {y}.",
    "Fetch the {x} and leave it by the {y}.",
    "Take the {x} and put it beside the {y}.",
    "Your task: the {x} next to the {y}.",
    "Carry the {x} and drop it next to the {y}.",
    "Move the {x} beside the {y}.",
    "Lay the {x} down by the {y}.",
    "Shift the {x} next to the {y}.",
    "Put the {x} alongside the {y}.",
    "I want the {x} next to the {y}.",
    "Deliver the {x} to a spot next to the {y}.",
)

GO_TO_REPHRASE: Final[tuple[str, ...]] = (
    "Wander over to the {x} and stop there.",
    "Your destination is the {x}.",
    "Track down the {x}.",
    "Pay a visit to the {x}.",
    "End up right beside the {x}.",
    "Seek out the {x}.",
    "Journey across the room to the {x}.",
    "Stroll over to the {x}.",
    "Go stand adjacent to the {x}.",
    "Close the distance between you and the {x}.",
)

OPEN_REPHRASE: Final[tuple[str, ...]] = (
    "Crack open the {door}.",
    "Ensure the {door} ends up open.",
    "Let some air in by opening the {door}.",
    "The {door} is shut; change that.",
    "Give the {door} a pull so it opens.",
    "Work the {door} until it stands open.",
    "Visit the {door} and leave it ajar.",
    "Open the doorway painted {c}.",
    "Use the handle of the {door} to open it.",
    "The {door} needs opening.",
)

PICK_UP_REPHRASE: Final[tuple[str, ...]] = (
    "Pocket the {x}.",
    "Seize the {x}.",
    "Claim the {x} for yourself.",
    "Go collect the {x} off the floor.",
    "Hoist the {x}.",
    "Have the {x} in your hands.",
    "Gather up the {x}.",
    "Acquire the {x}.",
    "Reach down and take the {x}.",
    "The {x} is yours; pick it up.",
)

PUT_NEXT_REPHRASE: Final[tuple[str, ...]] = (
    "Arrange the {x} so that it touches the side of the {y}.",
    "Transport the {x} to the {y} and set it down beside it.",
    "Rest the {x} against the {y}.",
    "Team up the {x} with the {y} by placing them side by side.",
    "Drop off the {x} one step away from the {y}.",
    "Reunite the {x} with the {y}.",
    "Park the {x} beside the {y}.",
    "The {y} needs the {x} right beside it.",
    "Haul the {x} over to sit by the {y}.",
    "Make the {x} and the {y} neighbours by moving the {o}.",
)

OPEN_GO_TO_EASY: Final[tuple[str, ...]] = (
    "Open the door, then go to the {x}.",
    "First open the door and then walk to the {x}.",
    "Open the door and after that go to the {x}.",
    "Get the door open, then head to the {x}.",
    "Go open the door, then make your way to the {x}.",
    "After opening the door, go to the {x}.",
    "Open the door before going to the {x}.",
    "Swing the door open and then approach the {x}.",
    "Open the door first; then stand next to the {x}.",
    "Once the door is open, walk over to the {x}.",
)

OPEN_PICK_UP_EASY: Final[tuple[str, ...]] = (
    "Open the door, then pick up the {x}.",
    "First open the door and then grab the {x}.",
    "Open the door and after that pick up the {x}.",
    "Get the door open, then take the {x}.",
    "Go open the door, then collect the {x}.",
    "After opening the door, pick up the {x}.",
    "Open the door and also pick up the {x}.",
    "Swing the door open and then fetch the {x}.",
    "Open the door first; then get the {x}.",
    "Once the door is open, lift the {x}.",
)

GO_TO_WALL_EASY: Final[tuple[str, ...]] = (
    "Go to {wall}.",
    "Walk over to {wall}.",
    "Move until you are against {wall}.",
    "Stand next to {wall}.",
    "Head to {wall}.",
    "Make your way to {wall}.",
    "Get as close as you can to {wall}.",
    "Go and touch {wall}.",
    "Approach {wall}.",
    "Put yourself right beside {wall}.",
)

GO_TO_CENTRE_EASY: Final[tuple[str, ...]] = (
    "Go to the centre of the room.",
    "Walk to the middle of the room.",
    "Stand in the centre of the room.",
    "Move to the middle of the grid.",
    "Head for the centre of the room.",
    "Make your way to the room's centre.",
    "Go stand in the middle.",
    "Get to the central part of the room.",
    "Position yourself at the centre of the room.",
    "Find the middle of the room and stand there.",
)

UNLOCK_HARD: Final[tuple[str, ...]] = (
    "Pick up the key, then open the locked door.",
    "Get the key and use it to open the locked door.",
    "Grab the key first, then unlock and open the door.",
    "Take the key and open the locked door with it.",
    "Fetch the key, then go open the locked door.",
    "The door is locked: pick up the key and open it.",
    "Collect the key and then unlock the door.",
    "First take the key, then open the door that is locked.",
    "Use the key to get the locked door open; pick the key up first.",
    "Find the key, carry it to the locked door and open the door.",
)

LINE_HARD: Final[tuple[str, ...]] = (
    "Put the three items in a line.",
    "Line up the ball, the box and the key.",
    "Arrange the ball, box and key in a straight line.",
    "Place all three objects in one row or one column.",
    "Make a straight line out of the three objects.",
    "Move the objects so that they all share a row or a column.",
    "Line the three things up.",
    "Get the ball, the box and the key into a line.",
    "Put the objects in a single line, across or down.",
    "Set the three items out in a straight line.",
)

PILE_HARD: Final[tuple[str, ...]] = (
    "Gather the three items into a pile.",
    "Put the ball, the box and the key together in a pile.",
    "Bring all three objects together.",
    "Pile up the three items.",
    "Collect the objects into one tight group.",
    "Make a heap of the ball, the box and the key.",
    "Cluster the three objects next to each other.",
    "Move the three items close together into a pile.",
    "Group the ball, box and key together.",
    "Assemble the three objects into a compact pile.",
)

TEMPLATES: Final[dict[str, dict[int, tuple[str, ...]]]] = {
    "train": {
        tasks.KIND_GO_TO: GO_TO_TRAIN,
        tasks.KIND_OPEN: OPEN_TRAIN,
        tasks.KIND_PICK_UP: PICK_UP_TRAIN,
        tasks.KIND_PUT_NEXT: PUT_NEXT_TRAIN,
    },
    "rephrase": {
        tasks.KIND_GO_TO: GO_TO_REPHRASE,
        tasks.KIND_OPEN: OPEN_REPHRASE,
        tasks.KIND_PICK_UP: PICK_UP_REPHRASE,
        tasks.KIND_PUT_NEXT: PUT_NEXT_REPHRASE,
    },
    "easy": {
        tasks.KIND_OPEN_GO_TO: OPEN_GO_TO_EASY,
        tasks.KIND_OPEN_PICK_UP: OPEN_PICK_UP_EASY,
        tasks.KIND_GO_TO_WALL: GO_TO_WALL_EASY,
        tasks.KIND_GO_TO_CENTRE: GO_TO_CENTRE_EASY,
    },
    "hard": {
        tasks.KIND_UNLOCK: UNLOCK_HARD,
        tasks.KIND_LINE: LINE_HARD,
        tasks.KIND_PILE: PILE_HARD,
    },
}

_WALL_PHRASES: Final[tuple[str, ...]] = ("the west wall", "the east wall", "the north wall", "the south wall", "a wall")


def _fields(goal: np.ndarray) -> dict[str, str]:
    """Template fields of a goal vector."""
    _, oa, ca, ob, cb, dc, side = (int(v) for v in np.asarray(goal))
    colour = lambda c: "" if c == tasks.ANY_COLOUR else G.COLOURS[c]  # noqa: E731
    named = lambda c, o: f"{colour(c)} {G.OBJECT_NAMES[o]}".strip()  # noqa: E731
    return {
        "x": named(ca, oa),
        "y": named(cb, ob),
        "o": G.OBJECT_NAMES[oa],
        "c": colour(ca) if oa else colour(dc),
        "door": f"{colour(dc)} door".strip(),
        "wall": _WALL_PHRASES[side] if 0 <= side < len(_WALL_PHRASES) else "",
    }


def goal_instructions(goal: np.ndarray, level: str) -> tuple[str, ...]:
    """The phrasings of one goal at a level, in template order.

    Args:
      goal: (GOAL_DIM,) goal vector (see :mod:`tasks`).
      level: "train", "rephrase", "easy" or "hard".
    Raises: ValueError when the level is unknown or the goal's kind does not belong to it.
    """
    if level not in TEMPLATES:
        raise ValueError(f"unknown BabyAI level {level!r}; valid levels: {', '.join(tasks.LEVELS)}")
    kind = int(np.asarray(goal)[tasks.SLOT_KIND])
    if kind not in TEMPLATES[level]:
        name = tasks.KIND_NAMES[kind] if 0 <= kind < tasks.NUM_KINDS else f"<invalid {kind}>"
        valid = ", ".join(tasks.KIND_NAMES[k] for k in TEMPLATES[level])
        raise ValueError(f"level {level!r} has no goal of kind {name}; its kinds are {valid}")
    fields = _fields(goal)
    return tuple(t.format(**fields) for t in TEMPLATES[level][kind])


# level_instruction_table(level) -> (strings (M,), phrasing ids (K, P) int32 padded with -1, counts (K,)),
# cached; level_instructions(level) -> the M strings. Task k is phrased by goal_instructions(goals[k], level).
level_instruction_table, level_instructions = level_instruction_functions(goal_instructions, tasks.level_goals)
