"""The HalfCheetah expert: one task-conditioned soft actor-critic policy for all nine tasks, and its shipped
weights (``assets/cheetah_sac_actor.npz``, checked against :data:`PACKAGED_SHA256`; re-made by
``experiments/experts/cheetah_sac.py --write-asset FILE``). It acts with ``tanh(mean)`` of the actor on
the state, the goal and the episode's running quantities; the two-leg tasks are composed from the jump
and run skills (:func:`skill_inputs`; docs/envs.md).
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Final

import jax
import jax.numpy as jnp
import numpy as np

from imaginejax.envs.base import EnvParams
from imaginejax.envs.cheetah import tasks
from imaginejax.envs.cheetah.env import EnvState, HalfCheetah

ALL_GOALS: Final[np.ndarray] = np.concatenate(
    [tasks.level_goals("train"), tasks.level_goals("easy"), tasks.level_goals("hard")])
NUM_KINDS: Final[int] = len(tasks.KIND_NAMES)
FEATURE_DIM: Final[int] = tasks.STATE_DIM + NUM_KINDS + 5
# Fixed input scales (≈ the spread of each entry under a running policy): dx, rootz, pitch, 6 angles,
# vx, vz, pitch rate, 6 joint speeds, then the task features (already O(1)).
FEATURE_SCALE: Final[np.ndarray] = np.concatenate([
    [0.3, 0.2, 1.0], np.full(6, 0.5), [5.0, 2.0, 5.0], np.full(6, 10.0), np.ones(NUM_KINDS + 5)]).astype(np.float32)
# The shipped actor's shape: tanh encoder layers of this width, then the ReLU hidden layers.
ENCODER_WIDTH: Final[int] = 64
ENCODER_LAYERS: Final[int] = 2
HIDDEN: Final[tuple[int, ...]] = (128, 128)

PACKAGED_ACTOR: Final[Path] = Path(__file__).resolve().parent / "assets" / "cheetah_sac_actor.npz"
# SHA-256 of PACKAGED_ACTOR: checkpoint 60 of experiments/experts/cheetah_sac.py (seed 0, its default
# configuration), exported with --export-from.
PACKAGED_SHA256: Final[str] = "7a77aaea13b174b8626360c61125ead8057ebf96cb04ed6399ef9a459d639cb4"
RETRAIN_COMMAND: Final[str] = ("python experiments/experts/cheetah_sac.py --out DIR --write-asset FILE "
                               "(then pass weights=FILE)")
ACTOR_PREFIX: Final[str] = "actor"


class ExpertWeightsError(RuntimeError):
    """Expert weights that cannot be used; the message names the file and the command that re-makes it."""


def expert_features(state_vec: jax.Array, progress: tasks.Progress, t: jax.Array, goal: jax.Array) -> jax.Array:
    """The expert's input: (B, 18) state, progress fields (B,), t (B,), goal (B, 2) → (B, 28).

    Layout: state (18) ⊕ one-hot goal kind (5) ⊕ [direction, t/200, forward leg done, backward leg done,
    clip(Σ/10, −3, 3)].
    """
    kind = jax.nn.one_hot(goal[:, 0], NUM_KINDS, dtype=jnp.float32)
    extra = jnp.stack([goal[:, 1].astype(jnp.float32), t.astype(jnp.float32) / tasks.MAX_STEPS,
                       (progress.forward_done_at > 0).astype(jnp.float32),
                       (progress.backward_done_at > 0).astype(jnp.float32),
                       jnp.clip(progress.sigma / 10.0, -3.0, 3.0)], axis=-1)
    return jnp.concatenate([state_vec.astype(jnp.float32), kind, extra], axis=-1)


def state_features(state: EnvState, params: EnvParams) -> jax.Array:
    """:func:`expert_features` of a batched environment state."""
    return expert_features(HalfCheetah.state_vector(state), state.progress, state.t, params.goals[state.task])


def skill_inputs(progress: tasks.Progress, t: jax.Array, goal: jax.Array
                 ) -> tuple[tasks.Progress, jax.Array, jax.Array]:
    """The learned skill that acts for each goal, and the running quantities it sees.

    Single-skill goals pass through. A two-leg goal ``(FORWARD_BACKWARD, d)``: the first leg (direction d,
    not yet done) with ``(JUMP, d)`` seeing the episode's t and Σ; from the step t₁ the first leg got done,
    ``(RUN, −d)`` seeing t − t₁ and the sum of the displacements in direction −d; neither sees a leg done.

    Args:
      progress: :class:`tasks.Progress` of the episode so far, fields (B,).
      t: (B,) int, steps taken.
      goal: (B, 2) int32 task goals.
    Returns: ``(progress', t', goal')``, the same shapes: the inputs of :func:`expert_features`.
    """
    kind, direction = goal[:, 0], goal[:, 1]
    two_legs = kind == tasks.KIND_FORWARD_BACKWARD
    first_done_at = jnp.where(direction >= 0, progress.forward_done_at, progress.backward_done_at)
    second_leg = first_done_at > 0
    leg_kind = jnp.where(second_leg, tasks.KIND_RUN, tasks.KIND_JUMP)
    leg_direction = jnp.where(second_leg, -direction, direction)
    leg_goal = jnp.stack([leg_kind, leg_direction], axis=-1).astype(goal.dtype)
    leg_t = jnp.where(second_leg, t - first_done_at.astype(t.dtype), t)
    second_sum = jnp.where(direction >= 0, progress.backward_sum, progress.forward_sum)
    none = jnp.zeros_like(progress.sigma)
    leg_progress = progress.replace(sigma=jnp.where(second_leg, second_sum, progress.sigma),
                                    forward_done_at=none, backward_done_at=none)

    def pick(composed: jax.Array, given: jax.Array) -> jax.Array:
        return jnp.where(two_legs.reshape(two_legs.shape + (1,) * (given.ndim - 1)), composed, given)

    return jax.tree.map(pick, leg_progress, progress), pick(leg_t, t), pick(leg_goal, goal)


def actor_mean(actor_params: Any, features: jax.Array) -> jax.Array:
    """The actor's pre-tanh mean: features (B, 28) -> (B, 6).

    ``actor_params`` is the Flax tree ``{"params": {"EncodedMLP_0": {"LanguageEncoder_0": {"encoder_i"},
    "MLP_0": {"hidden_i", "out"}}}}``; x ← tanh(x W + b) per encoder layer, x ← relu(x W + b) per hidden
    layer, then out = x W + b = [mean, log_std].
    """
    net = actor_params["params"]["EncodedMLP_0"]
    x = features / jnp.asarray(FEATURE_SCALE)
    for i in range(len(net["LanguageEncoder_0"])):
        layer = net["LanguageEncoder_0"][f"encoder_{i}"]
        x = jnp.tanh(x @ layer["kernel"] + layer["bias"])
    head = net["MLP_0"]
    for i in range(len(head) - 1):
        x = jax.nn.relu(x @ head[f"hidden_{i}"]["kernel"] + head[f"hidden_{i}"]["bias"])
    out = x @ head["out"]["kernel"] + head["out"]["bias"]
    return out[..., : tasks.ACTION_DIM]


def expert_action(actor_params: Any, state_vec: jax.Array, progress: tasks.Progress, t: jax.Array,
                  goal: jax.Array, key: jax.Array, noise: float = 0.0) -> jax.Array:
    """The expert's actions for any of the nine tasks: tanh(μ) of the composed skill, plus noise.

    Args:
      actor_params: the actor's parameters (:func:`actor_mean`).
      state_vec: (B, 18) state vectors.
      progress: :class:`tasks.Progress` of each episode, fields (B,).
      t: (B,) int steps taken.
      goal: (B, 2) int32 goals.
      key: PRNG key of the noise.
      noise: standard deviation of Gaussian noise added to the action (then clipped to [-1, 1]).
    Returns: (B, 6) actions in [-1, 1].
    """
    leg_progress, leg_t, leg_goal = skill_inputs(progress, t, goal)
    action = jnp.tanh(actor_mean(actor_params, expert_features(state_vec, leg_progress, leg_t, leg_goal)))
    if noise > 0.0:
        action = jnp.clip(action + noise * jax.random.normal(key, action.shape), -1.0, 1.0)
    return action


def make_policy(actor_params: Any, noise: float = 0.0
                ) -> Callable[[jax.Array, jax.Array, EnvState, EnvParams], jax.Array]:
    """A collection policy ``policy(key, obs, state, params) -> (B, 6)``: :func:`expert_action` on the
    privileged quantities read from ``state`` (state vector, progress, t, the task's goal)."""
    if not noise >= 0.0:
        raise ValueError(f"noise must be >= 0 (a standard deviation), got {noise}")

    def policy(key: jax.Array, obs: jax.Array, state: EnvState, params: EnvParams) -> jax.Array:
        del obs
        return expert_action(actor_params, HalfCheetah.state_vector(state), state.progress, state.t,
                             params.goals[state.task], key, noise)

    return policy


def expert_policy(noise: float = 0.0, weights: str | Path | None = None
                  ) -> Callable[[jax.Array, jax.Array, EnvState, EnvParams], jax.Array]:
    """The HalfCheetah expert as a collection policy for every task of every level (its registry entry).

    Args:
      noise: standard deviation of Gaussian noise added to the action (clipped to [-1, 1]).
      weights: None for the shipped actor (:data:`PACKAGED_ACTOR`), or an actor file written by
        ``experiments/experts/cheetah_sac.py --write-asset FILE``.
    """
    return make_policy(load_actor(weights), noise=noise)


def _nested(arrays: dict[str, np.ndarray], path: Path, fix: str) -> dict[str, Any]:
    """{"actor['params']['EncodedMLP_0']...['kernel']": array} -> the nested Flax tree."""
    tree: dict[str, Any] = {}
    for name, value in arrays.items():
        keys = re.findall(r"\['([^']+)'\]", name)
        if not keys or name != ACTOR_PREFIX + "".join(f"['{k}']" for k in keys):
            raise ExpertWeightsError(f"HalfCheetah expert weights {path}: unexpected array {name!r}: {fix}")
        node = tree
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ExpertWeightsError(f"HalfCheetah expert weights {path}: array {name!r} lies inside another "
                                         f"array: {fix}")
        node[keys[-1]] = value
    return tree


def _check_actor(tree: dict[str, Any], path: Path, fix: str) -> None:
    """Raises ExpertWeightsError unless ``tree`` is an actor from FEATURE_DIM features to 2 × 6 outputs."""
    try:
        net = tree["params"]["EncodedMLP_0"]
        layers = [net["LanguageEncoder_0"][f"encoder_{i}"] for i in range(len(net["LanguageEncoder_0"]))]
        layers += [net["MLP_0"][f"hidden_{i}"] for i in range(len(net["MLP_0"]) - 1)] + [net["MLP_0"]["out"]]
        width = FEATURE_DIM
        for layer in layers:
            kernel, bias = layer["kernel"], layer["bias"]
            if kernel.ndim != 2 or kernel.shape[0] != width or bias.shape != kernel.shape[1:]:
                raise ValueError(f"a layer of shape {kernel.shape} after width {width}")
            if kernel.dtype != np.float32 or bias.dtype != np.float32:
                raise ValueError(f"{kernel.dtype} arrays (float32 expected)")
            if not (np.all(np.isfinite(kernel)) and np.all(np.isfinite(bias))):
                raise ValueError("non-finite values")
            width = kernel.shape[1]
        if width != 2 * tasks.ACTION_DIM:
            raise ValueError(f"{width} outputs ({2 * tasks.ACTION_DIM} expected)")
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise ExpertWeightsError(f"HalfCheetah expert weights {path} hold another network ({err}): {fix}") from err


def load_actor_file(path: str | Path, sha256: str | None = None) -> Any:
    """Reads an actor file (one uncompressed ``.npz`` of float32 arrays named by their Flax path), checking
    its SHA-256 when ``sha256`` is given.

    Raises:
      ExpertWeightsError: the file is missing, truncated or corrupted (checksum mismatch, unreadable
        archive) or holds another network; the message names the file and the command that re-makes it.
    """
    path = Path(path)
    fix = f"re-make the HalfCheetah expert with `{RETRAIN_COMMAND}` or reinstall imaginejax"
    if not path.is_file():
        raise ExpertWeightsError(f"HalfCheetah expert weights {path} are missing: {fix}")
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ExpertWeightsError(f"HalfCheetah expert weights {path} are truncated or corrupted ({len(data)} "
                                 f"bytes, SHA-256 mismatch, expected {sha256}): {fix}")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ExpertWeightsError(f"HalfCheetah expert weights {path} cannot be read ({err}): {fix}") from err
    tree = _nested(arrays, path, fix)
    _check_actor(tree, path, fix)
    return jax.tree.map(jnp.asarray, tree)


def load_actor(weights: str | Path | None = None) -> Any:
    """The expert actor's parameters: the shipped file (default, checksum-verified) or an actor file.

    Raises:
      ExpertWeightsError: missing, damaged or incompatible weights (the message names the file and the fix).
    """
    if weights is None:
        return load_actor_file(PACKAGED_ACTOR, PACKAGED_SHA256)
    path = Path(weights)
    if not path.is_file():
        raise ExpertWeightsError(f"HalfCheetah expert weights {path}: not an actor file; a training checkpoint "
                                 "is exported with `python experiments/experts/cheetah_sac.py --export-from "
                                 "CHECKPOINT --write-asset FILE`")
    return load_actor_file(path)
