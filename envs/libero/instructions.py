"""Natural-language instructions for the LIBERO-style tasks, per level (written for this project): 40
phrasings per train task, 20 (other templates and object names) per rephrase, easy and hard task;
counts and framings: docs/envs.md."""

from __future__ import annotations

import functools
from typing import Final

import numpy as np

from imaginejax.envs.base import instruction_table
from imaginejax.envs.libero import tasks

NAMES: Final[tuple[tuple[str, ...], ...]] = (
    ("soup can", "can of soup", "tomato soup can", "tin of soup"),
    ("cream cheese box", "box of cream cheese", "cream cheese", "cheese package"),
    ("salad dressing bottle", "bottle of salad dressing", "dressing bottle", "salad dressing"),
)
TRAIN_NAMES: Final[tuple[int, int]] = (0, 1)
REPHRASE_NAMES: Final[tuple[int, int]] = (2, 3)

TEMPLATES: Final[dict[int, tuple[str, ...]]] = {
    tasks.PICK: ("pick up the {o}", "lift the {o}", "grab the {o} and lift it", "take the {o} off the floor",
                 "raise the {o} with the gripper", "grasp the {o} and pick it up", "get the {o} into the air",
                 "hold the {o} up", "pick the {o} up from the floor", "lift up the {o} with the robot hand"),
    tasks.PLACE_BASKET: ("put the {o} in the basket", "place the {o} into the basket", "drop the {o} in the basket",
                         "set the {o} down inside the basket", "put the {o} you are holding into the basket",
                         "place the {o} in the basket", "bring the {o} to the basket and put it in",
                         "store the {o} in the basket", "lower the {o} into the basket", "load the {o} into the basket"),
}
REPHRASE_TEMPLATES: Final[dict[int, tuple[str, ...]]] = {
    tasks.PICK: ("hoist the {o}", "raise up the {o}", "scoop up the {o}", "seize the {o} and lift it off the ground",
                 "elevate the {o}", "collect the {o} from the ground", "clutch the {o} and raise it",
                 "pluck the {o} off the floor", "get a hold of the {o} and lift it", "snatch up the {o}"),
    tasks.PLACE_BASKET: ("deposit the {o} in the basket", "stow the {o} in the basket", "pop the {o} into the basket",
                         "release the {o} inside the basket", "tuck the {o} into the basket",
                         "leave the {o} in the basket", "transfer the {o} to the basket", "stash the {o} in the basket",
                         "let the {o} go inside the basket", "pack the {o} into the basket"),
}
EASY_TEMPLATES: Final[dict[int, tuple[str, ...]]] = {
    tasks.PLACE_BASKET: ("pick up the {o} and put it in the basket", "lift the {o} and place it into the basket",
                         "grab the {o} from the floor and drop it in the basket", "move the {o} into the basket",
                         "take the {o} and set it in the basket", "put the {o} from the floor into the basket",
                         "carry the {o} over to the basket and put it inside", "get the {o} into the basket",
                         "pick the {o} up and store it in the basket", "place the {o} inside the basket"),
    tasks.PLACE_ON: ("put the {o} on the {p}", "place the {o} on top of the {p}", "stack the {o} on the {p}",
                     "set the {o} onto the {p}", "pick up the {o} and put it on the {p}", "move the {o} onto the {p}",
                     "rest the {o} on top of the {p}", "lift the {o} and place it on the {p}",
                     "put the {o} down on the {p}", "stack the {o} on top of the {p}"),
    tasks.REACH: ("reach for the {o}", "move the gripper to the {o}", "touch the {o}", "go to the {o}",
                  "put the hand at the {o}", "reach the {o} with the gripper", "bring the gripper to the {o}",
                  "move the robot hand to the {o}", "get the gripper to the {o}", "approach the {o}"),
}
HARD_TEMPLATES: Final[dict[int, tuple[str, ...]]] = {
    tasks.SEQ_BASKET: ("put the {o} in the basket, then the {p}", "first place the {o} in the basket and then the {p}",
                       "put the {o} into the basket and after that the {p}", "load the {o} and then the {p} into the basket",
                       "move the {o} into the basket first, then the {p}", "basket the {o} first and the {p} second",
                       "drop the {o} in the basket, followed by the {p}", "put the {o} and then the {p} in the basket",
                       "start with the {o}: put it in the basket, then add the {p}",
                       "place the {o} in the basket before the {p}"),
    tasks.ASIDE: ("move the {o} aside", "push the {o} out of the way", "shift the {o} to the side",
                  "move the {o} away from where it is", "clear the {o} out of the way", "slide the {o} aside",
                  "relocate the {o} a little to the side", "put the {o} somewhere else nearby", "nudge the {o} aside",
                  "get the {o} out of its spot"),
    tasks.ALL_BASKET: ("put all three items in the basket one by one", "put everything into the basket",
                       "place every object in the basket", "load all the groceries into the basket",
                       "put the {o}, the {p} and the {q} in the basket", "clear the floor into the basket",
                       "one at a time, put all the objects in the basket", "move all three objects into the basket",
                       "fill the basket with all of the items", "pack every item into the basket"),
    tasks.OUT_OF_BASKET: ("the basket is on fire: take the {o} out of it", "the basket is burning, get the {o} out",
                          "rescue the {o} from the burning basket", "fire! take the {o} out of the basket",
                          "quickly remove the {o} from the basket, it is on fire",
                          "the basket caught fire: move the {o} far away from it", "save the {o} from the basket fire",
                          "get the {o} out of the basket and away from the flames",
                          "the basket is on fire, pull the {o} out", "take the {o} out of the burning basket"),
}
FRAMES: Final[tuple[str, ...]] = ("{cap}.", "Please {low}.")
REPHRASE_FRAMES: Final[tuple[str, ...]] = ("Could you {low}?",)
ONE_FRAME: Final[tuple[str, ...]] = ("{cap}.",)


def _frame(frame: str, phrase: str) -> str:
    return frame.format(cap=phrase[0].upper() + phrase[1:], low=phrase)


def task_instructions(name: str, level: str) -> tuple[str, ...]:
    """The phrasings of task ``name`` at ``level`` (see the module docstring for the counts)."""
    if level not in tasks.LEVELS:
        raise ValueError(f"unknown LIBERO level {level!r}; valid levels: {', '.join(tasks.LEVELS)}")
    if name not in tasks.TASK_INDEX:
        raise ValueError(f"unknown LIBERO task {name!r}; valid tasks: {', '.join(tasks.TASK_INDEX)}")
    spec = tasks.TASKS[tasks.TASK_INDEX[name]]
    if level == "train":
        table, names, frames = TEMPLATES, TRAIN_NAMES, FRAMES
    elif level == "rephrase":
        table, names, frames = REPHRASE_TEMPLATES, REPHRASE_NAMES, REPHRASE_FRAMES
    elif level == "easy":
        table, names, frames = EASY_TEMPLATES, TRAIN_NAMES, ONE_FRAME
    else:
        table, names, frames = HARD_TEMPLATES, TRAIN_NAMES, ONE_FRAME
    others = [k for k in range(3) if k not in (spec.a, spec.b)]
    out: list[str] = []
    if spec.kind == tasks.ALL_BASKET:  # most of its templates name no object: both framings (22 phrasings)
        frames = FRAMES
    for template in table[spec.kind]:
        for n in names:
            if spec.kind == tasks.ALL_BASKET:
                text = template.format(o=NAMES[0][n], p=NAMES[1][n], q=NAMES[2][n])
            else:
                text = template.format(o=NAMES[spec.a][n], p=NAMES[spec.b][0] if spec.b >= 0 else "",
                                       q=NAMES[others[0]][0])
            for f in frames:
                phrased = _frame(f, text)
                if phrased not in out:
                    out.append(phrased)
    return tuple(out)


@functools.lru_cache(maxsize=None)
def level_instruction_table(level: str) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(strings, phrasing ids (K, P), counts (K,)) of a level (:func:`imaginejax.envs.base.instruction_table`)."""
    return instruction_table([task_instructions(n, level) for n in tasks.LEVEL_TASKS[level]])


def level_instructions(level: str) -> tuple[str, ...]:
    """The instruction table (M strings) of a level."""
    return level_instruction_table(level)[0]
