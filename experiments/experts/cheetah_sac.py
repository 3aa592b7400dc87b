"""Trains the HalfCheetah expert of ``imaginejax.envs.cheetah.expert`` and writes its shipped weights.

    python experiments/experts/cheetah_sac.py --chunks 60 --out DIR --write-asset envs/cheetah/assets/cheetah_sac_actor.npz

then set ``PACKAGED_SHA256`` in ``envs/cheetah/expert.py`` to the printed checksum. ``--export-from
CHECKPOINT`` exports (and evaluates) the actor of an existing training checkpoint instead of training.

One task-conditioned soft actor-critic (Haarnoja et al. 2018) is trained online on the MuJoCo C backend
for all nine tasks. Everything (environment steps through the ``pure_callback`` physics, replay buffer,
gradient updates) runs inside one compiled ``lax.scan`` per chunk; a Python loop over chunks only logs and
saves. Training semantics differ from evaluation: every episode runs the full 200 steps (a task's success
does not end it, so the agent never learns to avoid succeeding in order to keep collecting reward) and a
time limit is a truncation (the TD target bootstraps). Rewards are the tasks' own (``tasks.reward``).

SAC from the shared pieces: tanh-Gaussian actor and twin critics (:mod:`imaginejax.algos.networks`), the
SAC actor and temperature losses (:mod:`imaginejax.algos.cql`), TD target, Adam and Polyak updates
(:mod:`imaginejax.algos.common`), and the parameter record of continuous CQL (whose Lagrange fields stay
unused). The update is CQL's with the conservative term removed and the entropy term kept in the target:

    y = r + γ [ min_i Q_θi'(o', a') − α log π(a'|o') ],  a' ~ π(·|o')
    L(θ) = Σ_i E[(Q_θi(o, a) − y)²],  L(φ) = E[α log π(ã|o) − min_i Q_θi(o, ã)],
    L(log α) = −log α · E[log π(ã|o) + H̄],  H̄ = −6.

Why the two-leg hard tasks are composed rather than learned: trained on "forward then backward"
directly, the policy settled in a local optimum (reared up, pitch ≈ 1.2 rad, shuffling forward ≈ 2.5 m
in 200 steps), so the forward leg was never done (0 % success). Switching the learned *run* skills at
the leg boundary gave ≈ 75–90 %: after a full-speed forward run, the run-backward skill landed in that
same reared-up pose. Jump first (its speed term capped at 1 m/s, so the cheetah is slow when the leg is
done), then run the other way, gave 98–100 % both ways in every measurement (50–200 episodes per task).

Training checkpoints are written with :mod:`imaginejax.core.checkpoint` (orbax, atomic, SHA-256-verified on
load, last two kept). The shipped asset is the actor only, one byte-reproducible ``.npz``
(:func:`save_actor`), read by :func:`imaginejax.envs.cheetah.expert.load_actor_file`.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from imaginejax.algos.base import Spec
from imaginejax.algos.common import DataStats, adam_step, polyak_update, td_target, twin_critic_loss
from imaginejax.algos.cql import (ContinuousCQLState, continuous_cql_default_hp, init_continuous_cql, sac_actor_loss,
                                  temperature_loss)
from imaginejax.algos.networks import NetConfig, TanhGaussianActor, TwinCritic, sample_tanh_gaussian
from imaginejax.core.checkpoint import (CheckpointError, flatten_named, is_checkpoint, list_checkpoints,
                                   load_checkpoint, save_checkpoint, unflatten_named)
from imaginejax.data.collect import collect
from imaginejax.data.types import Batch
from imaginejax.envs.base import EnvParams
from imaginejax.envs.cheetah import tasks
from imaginejax.envs.cheetah.env import EnvState, HalfCheetah, make_params
from imaginejax.envs.cheetah.expert import (ACTOR_PREFIX, ALL_GOALS, ENCODER_LAYERS, ENCODER_WIDTH, FEATURE_DIM,
                                            FEATURE_SCALE, HIDDEN, load_actor_file, make_policy, state_features)
from imaginejax.core.paths import cache_root


@dataclasses.dataclass(frozen=True)
class ExpertConfig:
    """Static training configuration (changing it recompiles).

    Attributes:
      envs_per_task: parallel environments per task (9 tasks).
      updates_per_step: gradient updates per vector environment step.
      batch_size: minibatch size.
      buffer_size: replay capacity (transitions).
      warmup_steps: vector steps of uniformly random actions before the first update.
      steps_per_chunk: vector steps per compiled call.
      net: actor and critic shapes (language-encoder tanh layers, then the ReLU head).
      actor_lr, critic_lr, temperature_lr, gamma, tau: SAC hyperparameters.
      backend: physics backend of the training environments.
    """

    envs_per_task: int = 4
    updates_per_step: int = 8
    batch_size: int = 128
    buffer_size: int = 400_000
    warmup_steps: int = 100
    steps_per_chunk: int = 250
    net: NetConfig = NetConfig(encoder_width=ENCODER_WIDTH, encoder_layers=ENCODER_LAYERS, hidden=HIDDEN)
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temperature_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    backend: str = "mujoco"

    @property
    def num_envs(self) -> int:
        return self.envs_per_task * len(ALL_GOALS)


def expert_params() -> EnvParams:
    """An :class:`EnvParams` holding all nine goals (no instructions): the training task table."""
    k = len(ALL_GOALS)
    return EnvParams(goals=jnp.asarray(ALL_GOALS), phrasing_ids=jnp.zeros((k, 1), jnp.int32),
                     phrasing_counts=jnp.ones((k,), jnp.int32), instruction_embeddings=jnp.zeros((1, 0)),
                     max_steps=tasks.MAX_STEPS, level="all", reset_tries=1)


def _modules(config: ExpertConfig) -> tuple[TanhGaussianActor, TwinCritic]:
    return TanhGaussianActor(config.net, tasks.ACTION_DIM), TwinCritic(config.net)


def _spec() -> Spec:
    return Spec(state_dim=FEATURE_DIM, embed_dim=0, discrete=False, action_dim=tasks.ACTION_DIM)


def _normalize(features: jax.Array) -> jax.Array:
    return features / jnp.asarray(FEATURE_SCALE)


def init_sac(key: jax.Array, config: ExpertConfig) -> ContinuousCQLState:
    """Fresh SAC parameters (actor, twin critics, targets, log α = 0) and Adam states."""
    actor, critic = _modules(config)
    hp = continuous_cql_default_hp(_spec()).replace(actor_lr=jnp.float32(config.actor_lr),
                                                    critic_lr=jnp.float32(config.critic_lr),
                                                    temperature_lr=jnp.float32(config.temperature_lr))
    return init_continuous_cql(actor, critic, key, _spec(), DataStats.identity(FEATURE_DIM), hp)


def sac_update(state: ContinuousCQLState, batch: Batch, key: jax.Array, config: ExpertConfig
               ) -> tuple[ContinuousCQLState, dict[str, jax.Array]]:
    """One SAC update (critics, actor, temperature; losses at the pre-update parameters).

    Args:
      state: SAC parameters.
      batch: B transitions; ``batch.state`` / ``next_state`` are (B, 28) expert features, no embedding.
      key: PRNG key of the target and actor samples.
      config: the static configuration.
    Returns: the new state and metrics (critic_loss, actor_loss, temperature, entropy, target_q).
    """
    actor, critic = _modules(config)
    obs, next_obs = _normalize(batch.state), _normalize(batch.next_state)
    k_target, k_actor = jax.random.split(key)
    temperature = jnp.exp(state.log_temperature)
    next_mean, next_log_std = actor.apply(state.actor_params, next_obs)
    next_action, next_log_prob = sample_tanh_gaussian(k_target, next_mean, next_log_std)
    next_value = jnp.min(critic.apply(state.critic_target, next_obs, next_action), axis=0)
    target = jax.lax.stop_gradient(td_target(batch.reward, batch.terminal, next_value - temperature * next_log_prob,
                                             config.gamma))
    c_loss, c_grads = jax.value_and_grad(
        lambda p: twin_critic_loss(critic.apply(p, obs, batch.action), target))(state.critic_params)

    def actor_loss_fn(params):
        mean, log_std = actor.apply(params, obs)
        action, log_prob = sample_tanh_gaussian(k_actor, mean, log_std)
        q = jnp.min(critic.apply(state.critic_params, obs, action), axis=0)
        return sac_actor_loss(q, log_prob, temperature), log_prob

    (a_loss, log_prob), a_grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(state.actor_params)
    t_loss, t_grad = jax.value_and_grad(temperature_loss)(state.log_temperature, log_prob, -float(tasks.ACTION_DIM))
    critic_params, critic_opt = adam_step(state.critic_params, c_grads, state.critic_opt)
    actor_params, actor_opt = adam_step(state.actor_params, a_grads, state.actor_opt)
    log_temperature, temperature_opt = adam_step(state.log_temperature, t_grad, state.temperature_opt)
    new_state = state.replace(actor_params=actor_params, critic_params=critic_params,
                              critic_target=polyak_update(state.critic_target, critic_params, config.tau),
                              log_temperature=log_temperature, actor_opt=actor_opt, critic_opt=critic_opt,
                              temperature_opt=temperature_opt, step=state.step + 1)
    metrics = {"critic_loss": c_loss, "actor_loss": a_loss, "temperature": temperature,
               "entropy": -log_prob.mean(), "target_q": target.mean()}
    return new_state, metrics


def act(actor_params: Any, features: jax.Array, key: jax.Array, config: ExpertConfig) -> jax.Array:
    """(B, 28) features → (B, 6) actions sampled from π (exploration during training)."""
    actor, _ = _modules(config)
    mean, log_std = actor.apply(actor_params, _normalize(features))
    return sample_tanh_gaussian(key, mean, log_std)[0]


@struct.dataclass
class Trainer:
    """Everything training carries between compiled chunks (a pytree).

    Attributes:
      sac: SAC parameters and optimiser states.
      env_state: (N,) environment states; features: (N, 28) their expert features.
      buffer: replay arrays ``features`` (C, 28), ``action`` (C, 6), ``reward`` (C,), ``next_features``.
      size, position: () int32 filled rows and next write row of the ring buffer.
      key: PRNG key; vector_steps: () int32 environment steps taken by the vector.
      episode_return: (N,) running undiscounted return of each current episode.
    """

    sac: ContinuousCQLState
    env_state: EnvState
    features: jax.Array
    buffer: dict[str, jax.Array]
    size: jax.Array
    position: jax.Array
    key: jax.Array
    vector_steps: jax.Array
    episode_return: jax.Array


def _reset(env: HalfCheetah, key: jax.Array, params: EnvParams, n: int) -> EnvState:
    task = jnp.arange(n, dtype=jnp.int32) % len(ALL_GOALS)
    _, state = env.reset_to_task_batch(jax.random.split(key, n), params, task)
    return state


def init_trainer(key: jax.Array, config: ExpertConfig) -> Trainer:
    """Fresh SAC, N environments (round-robin over the nine tasks) and an empty buffer."""
    env, params = HalfCheetah(config.backend), expert_params()
    k_sac, k_env, key = jax.random.split(key, 3)
    state = _reset(env, k_env, params, config.num_envs)
    c = config.buffer_size
    buffer = {"features": jnp.zeros((c, FEATURE_DIM)), "action": jnp.zeros((c, tasks.ACTION_DIM)),
              "reward": jnp.zeros((c,)), "next_features": jnp.zeros((c, FEATURE_DIM))}
    trainer = Trainer(sac=init_sac(k_sac, config), env_state=state, features=state_features(state, params),
                      buffer=buffer, size=jnp.zeros((), jnp.int32), position=jnp.zeros((), jnp.int32), key=key,
                      vector_steps=jnp.zeros((), jnp.int32), episode_return=jnp.zeros((config.num_envs,)))
    return jax.tree.map(lambda x: jnp.array(x, copy=True), trainer)  # distinct buffers (targets = online)


def make_train_chunk(config: ExpertConfig) -> Callable[[Trainer], tuple[Trainer, dict[str, jax.Array]]]:
    """The compiled chunk: ``steps_per_chunk`` × (one vector env step, then ``updates_per_step``
    updates once the warm-up is over). Returns the trainer and the chunk's metrics (means of the
    update metrics, ``episode_return``: mean return of the episodes that ended in the chunk (NaN if
    none), per task (9,))."""
    env, params = HalfCheetah(config.backend), expert_params()
    n, k = config.num_envs, len(ALL_GOALS)

    def one_step(trainer: Trainer, _: Any) -> tuple[Trainer, dict[str, jax.Array]]:
        key, k_act, k_reset, k_upd = jax.random.split(trainer.key, 4)
        warm = trainer.vector_steps < config.warmup_steps
        random_action = jax.random.uniform(k_act, (n, tasks.ACTION_DIM), minval=-1.0, maxval=1.0)
        action = jnp.where(warm, random_action, act(trainer.sac.actor_params, trainer.features, k_act, config))
        _, stepped, reward, _, _ = env.step_batch(jax.random.split(k_act, n), trainer.env_state, action, params)
        stepped = stepped.replace(done=jnp.zeros_like(stepped.done), success=jnp.zeros_like(stepped.success))
        next_features = state_features(stepped, params)
        rows = (trainer.position + jnp.arange(n)) % config.buffer_size
        buffer = {"features": trainer.buffer["features"].at[rows].set(trainer.features),
                  "action": trainer.buffer["action"].at[rows].set(action),
                  "reward": trainer.buffer["reward"].at[rows].set(reward),
                  "next_features": trainer.buffer["next_features"].at[rows].set(next_features)}
        ended = stepped.t >= tasks.MAX_STEPS
        episode_return = trainer.episode_return + reward
        fresh = _reset(env, k_reset, params, n)
        env_state = jax.tree.map(lambda f, s: jnp.where(ended.reshape(ended.shape + (1,) * (s.ndim - 1)), f, s),
                                 fresh, stepped)
        size = jnp.minimum(trainer.size + n, config.buffer_size)

        def updates(sac: ContinuousCQLState) -> tuple[ContinuousCQLState, dict[str, jax.Array]]:
            def body(sac, key_u):
                k_idx, k_sac = jax.random.split(key_u)
                idx = jax.random.randint(k_idx, (config.batch_size,), 0, size)
                batch = Batch(state=buffer["features"][idx], embedding=jnp.zeros((config.batch_size, 0)),
                              action=buffer["action"][idx], reward=buffer["reward"][idx],
                              next_state=buffer["next_features"][idx], terminal=jnp.zeros((config.batch_size,)),
                              imaginary=jnp.zeros((config.batch_size,), bool))
                return sac_update(sac, batch, k_sac, config)

            sac, metrics = jax.lax.scan(body, sac, jax.random.split(k_upd, config.updates_per_step))
            return sac, jax.tree.map(jnp.mean, metrics)

        zeros = {name: jnp.float32(jnp.nan) for name in ("critic_loss", "actor_loss", "temperature", "entropy",
                                                           "target_q")}
        sac, metrics = jax.lax.cond(warm, lambda s: (s, zeros), updates, trainer.sac)
        finished = jnp.where(ended, episode_return, 0.0)
        metrics["return_sum"] = jax.ops.segment_sum(finished, trainer.env_state.task, k)
        metrics["return_count"] = jax.ops.segment_sum(ended.astype(jnp.float32), trainer.env_state.task, k)
        trainer = Trainer(sac=sac, env_state=env_state, features=state_features(env_state, params), buffer=buffer,
                          size=size, position=(trainer.position + n) % config.buffer_size, key=key,
                          vector_steps=trainer.vector_steps + 1,
                          episode_return=jnp.where(ended, 0.0, episode_return))
        return trainer, metrics

    def chunk(trainer: Trainer) -> tuple[Trainer, dict[str, jax.Array]]:
        trainer, metrics = jax.lax.scan(one_step, trainer, None, length=config.steps_per_chunk)
        out = {name: jnp.nanmean(value) for name, value in metrics.items() if not name.startswith("return")}
        total, count = metrics["return_sum"].sum(0), metrics["return_count"].sum(0)
        out["episode_return"] = jnp.where(count > 0, total / jnp.maximum(count, 1.0), jnp.nan)
        return trainer, out

    return jax.jit(chunk, donate_argnums=0)


def save_actor(path: str | Path, actor_params: Any) -> str:
    """Writes the actor's parameters as one uncompressed ``.npz`` (float32, no pickle) and returns its
    SHA-256. The bytes depend on the parameters only (sorted names, fixed zip timestamps), so exporting
    the same checkpoint twice gives the same checksum."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = flatten_named(jax.device_get(actor_params), ACTOR_PREFIX)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            with archive.open(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w") as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arrays[name], np.float32), allow_pickle=False)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_actor(weights: str | Path, config: ExpertConfig = ExpertConfig()) -> Any:
    """The actor of an actor file, a checkpoint directory of :func:`save_expert`, or a directory of such
    checkpoints (its latest).

    Raises:
      CheckpointError: no checkpoint there, or a damaged or incompatible one.
    """
    path = Path(weights)
    if path.is_file():
        return load_actor_file(path)
    if not is_checkpoint(path):
        found = list_checkpoints(path)
        if not found:
            raise CheckpointError(f"no HalfCheetah expert checkpoint in {path} (expected an actor .npz file, a "
                                  "step-* checkpoint directory or a directory of them)")
        path = found[-1][1]
    return load_expert(path, config).actor_params


def save_expert(directory: str | Path, sac: ContinuousCQLState, config: ExpertConfig, step: int,
                meta: dict[str, Any] | None = None) -> Path:
    """Writes the SAC state (actor, critics, targets, temperature, optimiser moments) as orbax checkpoint
    ``directory/step-<step:08d>`` through :func:`imaginejax.core.checkpoint.save_checkpoint` (the last two
    checkpoints are kept); ``meta`` (JSON) is stored with the expert's configuration. Returns its path."""
    arrays = flatten_named(jax.device_get(sac), "sac")
    info = {"kind": "cheetah-sac-expert", "config": {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                                                     for k, v in dataclasses.asdict(config).items()}}
    info.update(meta or {})
    return save_checkpoint(directory, step, arrays, info, keep=2)


def load_expert(path: str | Path, config: ExpertConfig = ExpertConfig()) -> ContinuousCQLState:
    """Reads a checkpoint written by :func:`save_expert` (one ``step-*`` directory) into the SAC structure of
    ``config``, bitwise as saved.

    Raises:
      CheckpointError: missing, truncated, corrupted or incompatible checkpoint (the message names the file
        and the fix).
    """
    _, arrays = load_checkpoint(path)
    target = jax.device_get(init_sac(jax.random.PRNGKey(0), config))
    return jax.tree.map(jnp.asarray, unflatten_named(arrays, target, "sac", Path(path)))


def train_expert(key: jax.Array, config: ExpertConfig, chunks: int, *, checkpoint_dir: str | Path | None = None,
                 log: bool = True) -> ContinuousCQLState:
    """Trains for ``chunks`` compiled chunks, printing a line per chunk, saving after each when
    ``checkpoint_dir`` is given. Returns the SAC state."""
    trainer = init_trainer(key, config)
    chunk = make_train_chunk(config)
    start = time.perf_counter()
    for c in range(chunks):
        trainer, metrics = chunk(trainer)
        metrics = jax.device_get(metrics)
        steps = int(trainer.vector_steps) * config.num_envs
        if log:
            returns = " ".join("  nan" if np.isnan(r) else f"{r:5.0f}" for r in metrics["episode_return"])
            print(f"chunk {c + 1}/{chunks}: {steps} env steps, {int(trainer.sac.step)} updates, "
                  f"{time.perf_counter() - start:.0f} s, critic {metrics['critic_loss']:.3g}, "
                  f"α {metrics['temperature']:.3g}, returns per task [{returns}]", file=sys.stderr, flush=True)
        if checkpoint_dir is not None:
            save_expert(checkpoint_dir, trainer.sac, config, c + 1, {"env_steps": steps})
    return trainer.sac


def evaluate_expert(actor_params: Any, level: str, episodes_per_task: int, key: jax.Array,
                    backend: str = "mujoco") -> dict[str, float]:
    """Success rate per task of a level with the deterministic expert in the real environment (success
    ends an episode), via :func:`imaginejax.data.collect.collect`. Returns {task name: rate}."""
    params = make_params(level, embed=False)
    k = params.num_tasks
    n = episodes_per_task * k
    ds = collect(HalfCheetah(backend), params, make_policy(actor_params), key, n,
                 task_indices=np.arange(n) % k, chunk_size=n, policy_name="cheetah-sac-expert", progress=False)
    success = ds.terminals.any(axis=1)
    names = [tasks.describe_goal(g) for g in np.asarray(params.goals)]
    return {names[t]: float(success[np.arange(n) % k == t].mean()) for t in range(k)}


def main() -> None:
    """``python experiments/experts/cheetah_sac.py --chunks 60 --out DIR [--write-asset FILE]``: train, save,
    evaluate (``--export-from CHECKPOINT`` instead of training: export and evaluate an existing actor)."""
    parser = argparse.ArgumentParser(description="Train the HalfCheetah SAC expert (all nine tasks).")
    parser.add_argument("--chunks", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory "
                        "(default: <cache root>/experts/cheetah-sac)")
    parser.add_argument("--eval-episodes", type=int, default=20, help="episodes per task and level (0: no evaluation)")
    parser.add_argument("--write-asset", type=Path, default=None, metavar="FILE",
                        help="also write the actor as a packaged-weights file (e.g. "
                        "envs/cheetah/assets/cheetah_sac_actor.npz) and print its SHA-256")
    parser.add_argument("--export-from", type=Path, default=None, metavar="CHECKPOINT",
                        help="do not train: take the actor of this checkpoint (or directory of checkpoints)")
    args = parser.parse_args()
    config = ExpertConfig()
    if args.export_from is not None:
        actor_params = load_actor(args.export_from, config)
    else:
        out = args.out or cache_root() / "experts" / "cheetah-sac"
        actor_params = train_expert(jax.random.PRNGKey(args.seed), config, args.chunks, checkpoint_dir=out).actor_params
    if args.write_asset is not None:
        digest = save_actor(args.write_asset, actor_params)
        print(f"wrote {args.write_asset} ({args.write_asset.stat().st_size} bytes); if it replaces the packaged "
              f"weights, set PACKAGED_SHA256 = \"{digest}\" in envs/cheetah/expert.py", flush=True)
    for level in ("train", "easy", "hard") if args.eval_episodes > 0 else ():
        rates = evaluate_expert(actor_params, level, args.eval_episodes, jax.random.PRNGKey(100 + args.seed))
        print(f"{level}: " + ", ".join(f"{name} {rate:.2f}" for name, rate in rates.items()), flush=True)


if __name__ == "__main__":
    main()
