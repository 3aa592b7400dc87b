"""Natural-language instructions for the Meta-World tasks, per level (written for this project): ten core
phrases per task and level, each in two framings, 20 phrasings; train and rephrase share no string."""

from __future__ import annotations

import functools
from typing import Final

import numpy as np

from imaginejax.envs.base import instruction_table
from imaginejax.envs.metaworld import tasks

FRAMES: Final[tuple[str, ...]] = ("{cap}.", "Please {low}.")
REPHRASE_FRAMES: Final[tuple[str, ...]] = ("{cap}.", "Could you {low}?")

TRAIN_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "reach": (
        "move the gripper to the goal position", "reach for the target point with the gripper",
        "bring the gripper to the target location", "put the gripper at the goal",
        "send the end effector to the target spot", "move the hand to the marked point",
        "reach the goal location with the robot hand", "get the gripper over to the target",
        "position the end effector at the goal", "carry the empty gripper to the target point"),
    "push": (
        "push the puck to the goal", "slide the puck over to the target location",
        "shove the puck until it reaches the goal", "move the puck to the target by pushing it",
        "nudge the puck onto the goal spot", "push the small disc to the marked position",
        "drive the puck across the table to the target", "use the gripper to push the puck to the goal",
        "get the puck to the goal without lifting it", "slide the disc to the target position"),
    "pick-place": (
        "pick up the puck and place it at the goal", "grasp the puck and put it down at the target",
        "lift the puck and carry it to the goal position", "take the puck and set it at the target spot",
        "grab the puck and move it through the air to the goal", "pick the puck up and drop it off at the target",
        "hold the puck and bring it to the goal location", "lift the disc and place it at the marked point",
        "pick up the object and put it at the goal", "carry the puck in the gripper to the target"),
    "button-press": (
        "press the button", "push the button in", "press the button on the box",
        "push the button all the way down", "hit the button with the gripper", "press in the button on the front of the box",
        "push the red button", "activate the button by pressing it", "poke the button until it clicks in",
        "press the box's button"),
    "door-unlock": (
        "unlock the door", "turn the lock to unlock the door", "rotate the door lock open",
        "release the lock on the door", "twist the lock knob to the unlocked position",
        "unlock the door by turning its lock", "open the lock of the door", "flip the door lock to unlocked",
        "turn the latch so the door is unlocked", "disengage the door's lock"),
    "door-open": (
        "open the door", "pull the door open", "swing the door open by its handle",
        "grab the handle and open the door", "pull on the door handle until the door is open",
        "open the door all the way", "swing the door outwards", "use the handle to pull the door open",
        "get the door open", "draw the door open by the handle"),
    "window-open": (
        "open the window", "slide the window open", "push the window sideways to open it",
        "move the window pane to the open position", "slide the window along its rail to open it",
        "open the sliding window", "push the window handle to open the window", "get the window open",
        "slide the pane open", "open the window by sliding it"),
    "faucet-open": (
        "turn the faucet on", "open the faucet", "rotate the faucet handle to open it",
        "turn the tap on", "twist the faucet handle open", "swing the faucet handle to turn the water on",
        "open the tap", "turn on the water at the faucet", "rotate the tap handle to the open position",
        "switch the faucet on"),
    "coffee-push": (
        "push the mug under the coffee machine", "slide the cup below the coffee spout",
        "move the mug to the coffee machine", "push the cup under the nozzle",
        "put the mug in place under the coffee maker", "slide the mug to the coffee machine's spout",
        "shove the cup beneath the coffee machine", "move the mug below the coffee nozzle",
        "push the coffee cup into the machine", "bring the mug under the coffee spout by pushing it"),
    "coffee-button": (
        "press the coffee machine button", "push the button on the coffee machine",
        "turn on the coffee machine with its button", "press the button of the coffee maker",
        "hit the coffee machine's button", "push in the coffee maker's button", "start the coffee machine",
        "press the start button on the coffee machine", "activate the coffee machine by pressing its button",
        "push the coffee button"),
}

EASY_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "reach-wall": (
        "reach over the wall to the goal position", "move the gripper past the wall to the target",
        "get the gripper to the goal on the far side of the wall", "bring the hand around the wall to the target point",
        "go over the low wall and touch the goal", "send the end effector beyond the wall to the goal",
        "reach the target behind the wall", "move the gripper to the goal without hitting the wall",
        "put the gripper at the target past the barrier", "lift the hand over the wall and reach the goal"),
    "push-wall": (
        "push the puck around the wall to the goal", "slide the puck past the wall to the target",
        "get the puck to the goal on the other side of the wall", "push the puck around the barrier to the target",
        "move the puck past the wall by pushing it", "steer the puck around the wall onto the goal",
        "push the disc past the little wall to the target", "shove the puck around the obstacle to the goal",
        "push the puck to the target, going around the wall", "nudge the puck past the wall onto the goal spot"),
    "pick-place-wall": (
        "pick up the puck and place it at the goal behind the wall", "lift the puck over the wall to the target",
        "carry the puck over the wall and set it down at the goal", "grasp the puck and put it past the barrier",
        "pick the puck up, clear the wall, and place it at the target", "lift the disc over the obstacle to the goal",
        "take the puck over the wall to the target spot", "hoist the puck across the wall onto the goal",
        "move the puck over the wall by lifting it", "bring the puck over the wall and drop it at the target"),
    "button-press-wall": (
        "press the button behind the wall", "reach past the wall and push the button",
        "push the button on the box behind the barrier", "get around the wall and press the button",
        "press in the button that sits behind the wall", "hit the button past the little wall",
        "reach over the wall to press the button", "press the blocked button",
        "push the button, avoiding the wall", "go around the obstacle and press the button"),
    "door-lock": (
        "lock the door", "turn the lock to lock the door", "rotate the door lock closed",
        "engage the lock on the door", "twist the lock knob to the locked position",
        "lock the door by turning its lock down", "secure the door with its lock", "flip the door lock to locked",
        "turn the latch so the door is locked", "push the door's lock down"),
    "door-close": (
        "close the door", "push the door shut", "swing the door closed", "shut the open door",
        "push on the door until it closes", "close the door all the way", "swing the door back into its frame",
        "get the door closed", "push the door closed with the gripper", "shut the door"),
    "window-close": (
        "close the window", "slide the window shut", "push the window sideways to close it",
        "move the window pane to the closed position", "slide the window along its rail to close it",
        "close the sliding window", "push the window handle to close the window", "get the window closed",
        "slide the pane closed", "shut the window by sliding it"),
    "faucet-close": (
        "turn the faucet off", "close the faucet", "rotate the faucet handle to close it",
        "turn the tap off", "twist the faucet handle closed", "swing the faucet handle to turn the water off",
        "close the tap", "turn off the water at the faucet", "rotate the tap handle to the closed position",
        "switch the faucet off"),
}

REPHRASE_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "reach": (
        "go to the goal point with the arm", "extend the arm to the target", "touch the goal location",
        "guide the claw to the destination point", "steer the arm's hand to the objective",
        "travel with the gripper to where the goal is", "move your hand onto the target mark",
        "place the claw at the destination", "head for the goal with the end effector",
        "aim the robot hand at the target and go there"),
    "push": (
        "shift the puck along the table to its destination", "roll the puck over to the goal region",
        "propel the puck toward the target area", "scoot the puck to the destination",
        "bump the puck until it rests at the goal", "shunt the puck onto the target",
        "sweep the puck to where the goal is", "edge the puck over to its target",
        "budge the puck to the goal zone", "glide the puck to its destination"),
    "pick-place": (
        "lift the puck off the table and deliver it to the goal", "raise the puck and set it at the destination",
        "collect the puck and deposit it at the target", "hoist the puck and lower it onto the goal",
        "seize the puck and relocate it to the target", "pluck the puck from the table and put it at the goal",
        "fetch the puck and drop it at its destination", "clasp the puck and transfer it to the target",
        "scoop up the puck and leave it at the goal", "take hold of the puck and deliver it to the target"),
    "button-press": (
        "depress the button", "jab the button", "push down on the switch of the box",
        "punch the button in", "engage the button", "tap the button firmly", "sink the button into the box",
        "squeeze the button in", "click the button", "mash the button"),
    "door-unlock": (
        "unbolt the door", "undo the door's lock", "free the door from its lock",
        "spin the lock dial to open the lock", "unlatch the door", "twist the door's bolt open",
        "knock the lock lever to unlocked", "make the door unlocked", "rotate the bolt to release the door",
        "unfasten the door lock"),
    "door-open": (
        "yank the door open", "haul the door open by its handle", "tug the door until it swings open",
        "draw the door toward you to open it", "pry the door open using the handle",
        "wrench the door open", "swing the door wide", "fling the door open with the handle",
        "make the door open", "crack the door open fully"),
    "window-open": (
        "shift the window pane aside to open it", "glide the window open", "move the window so it opens",
        "drag the window to the open side", "let some air in by sliding the window",
        "push the pane along to open the window", "slide open the glass", "unclose the window by sliding",
        "shove the window open", "nudge the window into the open position"),
    "faucet-open": (
        "get the water running", "twist the tap to start the flow", "crank the faucet open",
        "swivel the faucet handle to on", "start the faucet", "rotate the spigot to let water out",
        "open up the water tap", "turn the faucet lever to on", "let the water flow from the faucet",
        "swing the tap lever open"),
    "coffee-push": (
        "position the cup beneath the coffee dispenser", "scoot the mug into the coffee maker",
        "slide the mug into position under the dispenser", "guide the cup under the coffee machine's nozzle",
        "push the cup so coffee would pour into it", "ease the mug under the brewer",
        "get the mug below the coffee outlet", "move the cup in front of the machine under the spout",
        "nudge the mug into the coffee machine", "line the mug up under the coffee nozzle"),
    "coffee-button": (
        "switch on the coffee maker", "push the brew button", "press the machine's switch to make coffee",
        "hit the brew button on the coffee maker", "tap the coffee maker's switch", "engage the coffee machine",
        "click the coffee machine on", "depress the brew switch", "activate the brewer",
        "trigger the coffee maker"),
}


HARD_PHRASES: Final[dict[str, tuple[str, ...]]] = {
    "make-coffee": (
        "make a cup of coffee", "push the mug under the coffee machine and then press its button",
        "put the cup under the spout and start the coffee machine", "get the mug in place and brew some coffee",
        "slide the mug below the nozzle, then push the coffee button", "prepare coffee with the machine and the mug",
        "place the cup under the coffee maker and switch it on", "set up the mug and press start on the coffee machine",
        "move the mug to the machine and then turn the machine on", "brew coffee into the mug"),
    "locked-door-open": (
        "unlock the door and then open it", "turn the lock open and pull the door open",
        "open the locked door", "unlatch the door, then swing it open", "release the lock and open the door",
        "first unlock the door, then pull it open by the handle", "get through the locked door by unlocking and opening it",
        "twist the lock to unlocked and open the door wide", "unlock and open the door",
        "free the door from its lock and pull it open"),
    "hammer": (
        "hammer the nail in", "pick up the hammer and drive the nail into the box",
        "use the hammer to knock the nail in", "grab the hammer and hit the nail", "drive the nail home with the hammer",
        "take the hammer and pound the nail", "strike the nail with the hammer until it goes in",
        "hammer the nail into the wooden block", "lift the hammer and tap the nail in", "knock the nail in with the hammer"),
    "soccer": (
        "kick the ball into the goal", "push the soccer ball into the net", "score a goal with the ball",
        "get the ball into the goal", "shoot the soccer ball into the goal", "roll the ball into the net",
        "move the football into the goal", "put the ball in the back of the net", "drive the ball into the goal area",
        "push the ball between the goal posts"),
}


def _frame(frame: str, phrase: str) -> str:
    return frame.format(cap=phrase[0].upper() + phrase[1:], low=phrase)


def task_instructions(name: str, level: str) -> tuple[str, ...]:
    """The 20 phrasings of one task at a level (train, rephrase)."""
    if level == "train":
        table, frames = TRAIN_PHRASES, FRAMES
    elif level == "easy":
        table, frames = EASY_PHRASES, FRAMES
    elif level == "hard":
        table, frames = HARD_PHRASES, FRAMES
    elif level == "rephrase":
        table, frames = REPHRASE_PHRASES, REPHRASE_FRAMES
    else:
        raise ValueError(f"unknown Meta-World level {level!r}; valid levels: {', '.join(tasks.LEVELS)}")
    if name not in table:
        raise NotImplementedError(f"no instructions for Meta-World task {name!r} yet")
    return tuple(_frame(f, p) for f in frames for p in table[name])


@functools.lru_cache(maxsize=None)
def level_instruction_table(level: str) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(strings, phrasing ids (K, 20), counts (K,)) of a level (see :func:`imaginejax.envs.base.instruction_table`)."""
    names = [tasks.TASKS[int(g[0])].name for g in tasks.level_goals(level)]
    return instruction_table([task_instructions(n, level) for n in names])


def level_instructions(level: str) -> tuple[str, ...]:
    """The instruction table (M strings) of a level."""
    return level_instruction_table(level)[0]
