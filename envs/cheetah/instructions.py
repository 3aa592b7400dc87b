"""Natural-language instructions for the HalfCheetah tasks, per level (written for this project; per-level
counts: docs/envs.md): an instruction table per level and each task's phrasing ids into it."""

from __future__ import annotations

from typing import Final

import numpy as np

from imaginejax.envs.base import level_instruction_functions

from imaginejax.envs.cheetah import tasks

# Direction words, indexed by direction: FORWARD (+1) → 0, BACKWARD (-1) → 1.
_DIR = ("forward", "backward")
_DIRS = ("forwards", "backwards")
_WAY = ("ahead", "in reverse")
_FACING = ("the way your head points", "the way your tail points")
_END = ("head first", "tail first")
_OPPOSITE = ("backward", "forward")
# Words that may appear in an instruction of each direction (used by tests: a forward instruction
# contains a forward word and no backward word, and vice versa).
FORWARD_WORDS: Final[tuple[str, ...]] = ("forward", "ahead", "head first", "head points")
BACKWARD_WORDS: Final[tuple[str, ...]] = ("backward", "in reverse", "tail first", "tail points")

# ---------------------------------------------------------------------------------------------------
# Templates. Fields: {dir}, {dirs}, {way}, {facing}, {end} (see above); hard: {first}, {second}.
# ---------------------------------------------------------------------------------------------------
TRAIN_RUN_TEMPLATES: Final[tuple[str, ...]] = (
    "Run {dir}.",
    "Run {dirs}.",
    "Run {way}.",
    "Sprint {dir}.",
    "Dash {dir}.",
    "Gallop {dir}.",
    "Race {dir}.",
    "Bolt {dir}.",
    "Hurry {dir}.",
    "Charge {dir}.",
    "Keep running {dir}.",
    "Run {dir} for a while.",
    "Please run {dir}.",
    "Can you run {dir}?",
    "I want you to run {dir}.",
    "Go {dir} at a run.",
    "Move {dir} quickly.",
    "Head {dir} as fast as you can.",
    "Start running {dir} and keep going.",
    "Cover some ground {dir}.",
    "Travel {dir} at a steady run.",
    "Get moving {dir}.",
    "Run {facing}.",
    "Run {end}.",
    "Make your way {dir} at speed.",
    "Pick up the pace and go {dir}.",
    "Take off running {dir}.",
    "Jog {dir} briskly.",
    "Run a long way {dir}.",
    "Go {way} at full stride.",
    "Run {dirs} without stopping.",
    "Propel yourself {dir} by running.",
    "Keep your legs moving and head {dir}.",
    "Stride out {dir}.",
    "Let's see you run {dir}.",
    "Your task: run {dir}.",
    "Run {dir} across the floor.",
    "Run {dir} and don't stop.",
    "Put some distance behind you running {dir}.",
    "Sprint {way}.",
    "Dash {end}.",
    "Move {facing} at a run.",
)

TRAIN_JUMP_TEMPLATES: Final[tuple[str, ...]] = (
    "Jump {dir}.",
    "Jump a step {dir}.",
    "Jump {dirs}.",
    "Jump {way}.",
    "Hop {dir}.",
    "Hop a step {dir}.",
    "Leap {dir}.",
    "Leap a step {dir}.",
    "Spring {dir}.",
    "Bound {dir}.",
    "Take a hop {dir}.",
    "Take a small jump {dir}.",
    "Make a short leap {dir}.",
    "Do a little hop {dir}.",
    "Jump once {dir}.",
    "Hop a short way {dir}.",
    "Leap a short distance {dir}.",
    "Jump {facing}.",
    "Hop {end}.",
    "Please jump {dir}.",
    "Can you hop {dir}?",
    "I want you to jump {dir}.",
    "Your task: jump {dir}.",
    "Jump a little {dir}.",
    "Hop {way}.",
    "Leap {way}.",
    "Spring a step {dir}.",
    "Bound a step {dir}.",
    "Jump up and land a bit {dir}.",
    "Push off the ground and hop {dir}.",
    "Make a hop {facing}.",
    "Jump {end}.",
    "Hop {dirs} a little.",
    "Take one jump {dir}.",
    "Hop {dir} off the floor.",
    "Jump a short hop {dir}.",
    "Leap {facing}.",
    "Spring {way}.",
    "Do a small leap {dir}.",
    "Get airborne and move {dir}.",
    "Jump lightly {dir}.",
    "Let's see you hop {dir}.",
)

REPHRASE_RUN_TEMPLATES: Final[tuple[str, ...]] = (
    "Scamper {dir}.",
    "Zoom {dir}.",
    "Lope {dir}.",
    "Hightail it {dir}.",
    "Scoot {dir} rapidly.",
    "Make tracks {dir}.",
    "Barrel {dir}.",
    "Speed off {way}.",
    "Rush {facing}.",
    "Tear off {end}.",
)

REPHRASE_JUMP_TEMPLATES: Final[tuple[str, ...]] = (
    "Vault {dir}.",
    "Pounce {dir}.",
    "Skip a step {dir}.",
    "Bounce {dir} a little.",
    "Launch yourself slightly {dir}.",
    "Make a quick bunny hop {dir}.",
    "Hurdle {way}.",
    "Lunge {dir} with a hop.",
    "Spring up and come down {facing}.",
    "Kangaroo-hop {end}.",
)

EASY_TEMPLATES: Final[tuple[str, ...]] = (
    "Run {dir} faster.",
    "Run {dir} even faster than usual.",
    "Sprint {dir} at top speed.",
    "Run {dir} as fast as you possibly can.",
    "Go {dir} at a higher speed.",
    "Speed up and run {dir}.",
    "Run {dir} at maximum speed.",
    "Race {dir} at full tilt.",
    "Run {dir} very fast.",
    "Move {dir} faster than a normal run.",
)

FORWARD_BACKWARD_TEMPLATES: Final[tuple[str, ...]] = (
    "Move {first}, ease off, then move {second}.",
    "Run {first} first, then turn back and run {second}.",
    "Go {first} for a while, then go {second}.",
    "First head {first}, afterwards head {second}.",
    "Run {first}, stop, and run {second}.",
    "Travel {first} and then come back {second}.",
    "Begin by running {first}; finish by running {second}.",
    "Move {first} for the first half and {second} for the second half.",
    "Go {first}, then reverse and go {second}.",
    "Head {first} a good distance before heading {second}.",
)

JUMP_IN_PLACE_TEMPLATES: Final[tuple[str, ...]] = (
    "Jump in place.",
    "Hop on the spot.",
    "Jump in the same position.",
    "Jump up and down without going anywhere.",
    "Hop where you stand.",
    "Bounce in place without moving forward or backward.",
    "Leap straight up and stay where you are.",
    "Jump on the spot, staying put.",
    "Keep hopping without travelling.",
    "Do jumps in place.",
)

LEVEL_TEMPLATE_COUNTS: Final[dict[str, int]] = {
    "train": min(len(TRAIN_RUN_TEMPLATES), len(TRAIN_JUMP_TEMPLATES)),
    "rephrase": min(len(REPHRASE_RUN_TEMPLATES), len(REPHRASE_JUMP_TEMPLATES)),
    "easy": len(EASY_TEMPLATES),
    "hard": min(len(FORWARD_BACKWARD_TEMPLATES), len(JUMP_IN_PLACE_TEMPLATES)),
}


def _direction_fields(direction: int) -> dict[str, str]:
    i = 0 if direction == tasks.FORWARD else 1
    return {"dir": _DIR[i], "dirs": _DIRS[i], "way": _WAY[i], "facing": _FACING[i], "end": _END[i]}


def goal_instructions(goal: np.ndarray, level: str) -> tuple[str, ...]:
    """The phrasings of one goal at a level, in template order.

    Args:
      goal: (2,) goal vector ``[kind, direction]`` (see :mod:`tasks`).
      level: "train", "rephrase", "easy" or "hard".
    Raises: ValueError when the goal does not belong to the level.
    """
    kind, direction = int(goal[0]), int(goal[1])
    name = tasks.describe_goal(goal)
    if level in ("train", "rephrase"):
        run = TRAIN_RUN_TEMPLATES if level == "train" else REPHRASE_RUN_TEMPLATES
        jump = TRAIN_JUMP_TEMPLATES if level == "train" else REPHRASE_JUMP_TEMPLATES
        if kind == tasks.KIND_RUN:
            return tuple(t.format(**_direction_fields(direction)) for t in run)
        if kind == tasks.KIND_JUMP:
            return tuple(t.format(**_direction_fields(direction)) for t in jump)
        raise ValueError(f"level {level!r} has run and jump goals only, got {name!r}")
    if level == "easy":
        if kind != tasks.KIND_RUN_FAST:
            raise ValueError(f"level 'easy' has run-fast goals only, got {name!r}")
        return tuple(t.format(**_direction_fields(direction)) for t in EASY_TEMPLATES)
    if level == "hard":
        if kind == tasks.KIND_FORWARD_BACKWARD:
            i = 0 if direction == tasks.FORWARD else 1
            return tuple(t.format(first=_DIR[i], second=_OPPOSITE[i]) for t in FORWARD_BACKWARD_TEMPLATES)
        if kind == tasks.KIND_JUMP_IN_PLACE:
            return JUMP_IN_PLACE_TEMPLATES
        raise ValueError(f"level 'hard' has forward-backward and jump-in-place goals, got {name!r}")
    raise ValueError(f"unknown HalfCheetah level {level!r}; valid levels: {', '.join(tasks.LEVELS)}")


# level_instruction_table(level) -> (strings (M,), phrasing ids (K, P) int32 padded with -1, counts (K,)),
# cached; level_instructions(level) -> the M strings. Task k is phrased by goal_instructions(goals[k], level).
level_instruction_table, level_instructions = level_instruction_functions(goal_instructions, tasks.level_goals)
