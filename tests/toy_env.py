"""A tiny instruction-following task with the batched environment API, for engine tests.

K tasks; the instruction embedding of task k is the one-hot e_k (E = K). The state is 2-d noise. One
step per episode; success (reward 1, terminal) iff the discrete action equals the task index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.data.types import TrajectoryDataset

NUM_TASKS = 4
STATE_DIM = 2


@struct.dataclass
class ToyParams:
    goals: jax.Array  # (K, 1) int32 task ids
    instruction_embeddings: jax.Array  # (K, K)
    max_steps: int = struct.field(pytree_node=False, default=1)


@struct.dataclass
class ToyState:
    state: jax.Array  # (B, 2)
    task: jax.Array  # (B,)


class ToyEnv:
    def default_params(self) -> ToyParams:
        return ToyParams(goals=jnp.arange(NUM_TASKS, dtype=jnp.int32)[:, None],
                         instruction_embeddings=jnp.eye(NUM_TASKS, dtype=jnp.float32))

    def _obs(self, state: ToyState, params: ToyParams) -> jax.Array:
        return jnp.concatenate([state.state, params.instruction_embeddings[state.task]], -1)

    def reset_to_task_batch(self, keys, params, tasks):
        s = jax.vmap(lambda k: jax.random.normal(k, (STATE_DIM,)))(keys)
        state = ToyState(state=s, task=tasks)
        return self._obs(state, params), state

    def step_batch(self, keys, state, action, params):
        success = action == params.goals[state.task, 0]
        reward = success.astype(jnp.float32)
        done = jnp.ones_like(success)
        return self._obs(state, params), state, reward, done, {"success": success,
                                                               "truncated": ~success}


def expert_dataset(num: int, seed: int = 0) -> TrajectoryDataset:
    """One-step expert trajectories (action = task) for ``num`` random tasks."""
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, NUM_TASKS, num)
    states = np.zeros((num, 2, STATE_DIM), np.float32)
    states[:, 0] = rng.normal(size=(num, STATE_DIM))
    states[:, 1] = states[:, 0]
    ones = np.ones((num, 1), bool)
    return TrajectoryDataset(
        states=states, actions=tasks[:, None].astype(np.int32), rewards=ones.astype(np.float32),
        mask=ones, terminals=ones, truncations=~ones, instruction_ids=tasks.astype(np.int32),
        goals=tasks[:, None].astype(np.int32), instructions=tuple(f"do {k}" for k in range(NUM_TASKS)),
        instruction_embeddings=np.eye(NUM_TASKS, dtype=np.float32), env="toy", level="train",
        source="real", discrete=True, provenance={"collector": "toy expert"})
