"""A one-step continuous instruction-following task with the batched environment API, for algorithm tests.

K = 4 tasks; the instruction embedding of task k is the one-hot e_k (E = K) and its goal a fixed point
g_k ∈ [-0.5, 0.5]². The state s ~ U[-1, 1]² is observed; the best action is a known function of
state ⊕ instruction,

    a*(s, k) = g_k + 0.3 · s   ∈ [-0.8, 0.8]²,

the reward is r = −‖a − a*‖², and the episode ends after one step (a true termination). Success iff
‖a − a*‖ < 0.15: a uniform random action in [-1, 1]² succeeds with probability π·0.15²/4 ≈ 1.8 %.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.data.types import TrajectoryDataset

NUM_TASKS = 4
STATE_DIM = 2
ACTION_DIM = 2
STATE_GAIN = 0.3
SUCCESS_RADIUS = 0.15
GOALS = np.asarray([[0.5, 0.5], [-0.5, 0.5], [-0.5, -0.5], [0.5, -0.5]], np.float32)


@struct.dataclass
class ReachParams:
    goals: jax.Array  # (K, 2) float32 goal points g_k
    instruction_embeddings: jax.Array  # (K, K)
    max_steps: int = struct.field(pytree_node=False, default=1)


@struct.dataclass
class ReachState:
    state: jax.Array  # (B, 2)
    task: jax.Array  # (B,)


def best_action(state: jax.Array, goal: jax.Array) -> jax.Array:
    """a*(s, k) = g_k + 0.3 · s: state (B, 2), goal (B, 2) -> (B, 2)."""
    return goal + STATE_GAIN * state


class ContinuousReachEnv:
    def default_params(self) -> ReachParams:
        return ReachParams(goals=jnp.asarray(GOALS),
                           instruction_embeddings=jnp.eye(NUM_TASKS, dtype=jnp.float32))

    def _obs(self, state: ReachState, params: ReachParams) -> jax.Array:
        return jnp.concatenate([state.state, params.instruction_embeddings[state.task]], -1)

    def reset_to_task_batch(self, keys, params, tasks):
        s = jax.vmap(lambda k: jax.random.uniform(k, (STATE_DIM,), minval=-1.0, maxval=1.0))(keys)
        state = ReachState(state=s, task=tasks)
        return self._obs(state, params), state

    def step_batch(self, keys, state, action, params):
        error = action - best_action(state.state, params.goals[state.task])
        distance = jnp.linalg.norm(error, axis=-1)
        success = distance < SUCCESS_RADIUS
        reward = -jnp.square(distance)
        done = jnp.ones_like(success)
        return self._obs(state, params), state, reward, done, {"success": success,
                                                               "truncated": jnp.zeros_like(success)}


def noisy_expert_dataset(num: int, noise: float = 0.4, seed: int = 0) -> TrajectoryDataset:
    """One-step trajectories with actions clip(a* + N(0, noise²), −1, 1) for ``num`` random tasks.

    With noise 0.4 the data's own success rate is about 1 − exp(−0.15² / (2·0.4²)) ≈ 7 %.
    """
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, NUM_TASKS, num)
    s0 = rng.uniform(-1.0, 1.0, size=(num, STATE_DIM)).astype(np.float32)
    optimal = GOALS[tasks] + STATE_GAIN * s0
    actions = np.clip(optimal + noise * rng.normal(size=optimal.shape), -1.0, 1.0).astype(np.float32)
    rewards = -np.sum(np.square(actions - optimal), axis=-1, keepdims=True).astype(np.float32)
    states = np.stack([s0, s0], axis=1)
    ones = np.ones((num, 1), bool)
    return TrajectoryDataset(
        states=states, actions=actions[:, None], rewards=rewards, mask=ones, terminals=ones,
        truncations=~ones, instruction_ids=tasks.astype(np.int32), goals=GOALS[tasks],
        instructions=tuple(f"reach {k}" for k in range(NUM_TASKS)),
        instruction_embeddings=np.eye(NUM_TASKS, dtype=np.float32), env="toy_reach", level="train",
        source="real", discrete=False, provenance={"collector": "noisy toy expert"})
