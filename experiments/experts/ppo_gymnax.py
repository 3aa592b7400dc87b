"""PPO (Schulman et al. 2017) on a discrete environment of the registry through the gymnax API, purejaxrl style.

    python experiments/experts/ppo_gymnax.py --env clevr --level train --updates 400 --figure docs/figures/ppo_gymnax_clevr.png

The environment is :func:`imaginejax.interop.as_gymnax` under gymnax's own wrappers
(``FlattenObservationWrapper``, ``LogWrapper``) and ``jax.vmap``; ``make_train(config)`` returns one pure
``train(key)``, a ``lax.scan`` over updates, each a ``lax.scan`` over ``NUM_STEPS`` vector steps, then
``UPDATE_EPOCHS`` × ``NUM_MINIBATCHES`` clipped-surrogate updates:

    δ_t = r_t + γ V(o_{t+1}) (1 − d_t) − V(o_t),   Â_t = δ_t + γλ (1 − d_t) Â_{t+1}
    L = −E[min(ρ Â, clip(ρ, 1 ± ε) Â)] + c_v E[max((V − R)², (V_clip − R)²)] / 2 − c_H E[H(π)]

with ρ = π(a|o) / π_old(a|o) and R = Â + V_old; ``d_t`` = terminated or truncated (a truncated episode
would bootstrap from its final observation, which the auto-reset replaced; it is treated as terminal,
as purejaxrl does). The metric of an update is the success rate of the episodes that ended in it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from gymnax.wrappers import FlattenObservationWrapper, LogWrapper

from imaginejax.interop.gymnax_env import as_gymnax

CONFIG: dict[str, Any] = {
    "ENV": "clevr", "LEVEL": "train", "EMBED": "minilm",
    "NUM_ENVS": 64, "NUM_STEPS": 64, "NUM_UPDATES": 400, "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 8,
    "LR": 3e-4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5, "HIDDEN": 256,
}


class ActorCritic(nn.Module):
    """obs (B, D) → (action logits (B, N), value (B,)), two tanh MLPs."""

    num_actions: int
    hidden: int = 256

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        def mlp(x: jax.Array, out: int, scale: float) -> jax.Array:
            for _ in range(2):
                x = nn.tanh(nn.Dense(self.hidden, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
            return nn.Dense(out, kernel_init=nn.initializers.orthogonal(scale))(x)

        return mlp(obs, self.num_actions, 0.01), mlp(obs, 1, 1.0)[..., 0]


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict[str, jax.Array]


def embedder(name: str | None) -> Callable | None:
    """The instruction encoder named by ``config["EMBED"]``: "minilm" (E = 384) or None (E = 0)."""
    if name is None:
        return None
    from imaginejax.lang import encode_instructions

    if name != "minilm":
        raise ValueError(f"EMBED must be 'minilm' or None, got {name!r}")
    return encode_instructions


def gae(traj: Transition, last_value: jax.Array, gamma: float, lam: float) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimates and returns: traj (T, B) fields, last_value (B,) → Â, R (T, B)."""

    def step(carry: tuple[jax.Array, jax.Array], t: Transition) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        advantage, next_value = carry
        delta = t.reward + gamma * next_value * (1 - t.done) - t.value
        advantage = delta + gamma * lam * (1 - t.done) * advantage
        return (advantage, t.value), advantage

    _, advantages = jax.lax.scan(step, (jnp.zeros_like(last_value), last_value), traj, reverse=True)
    return advantages, advantages + traj.value


def make_train(config: dict[str, Any]) -> tuple[Callable[[jax.Array], dict[str, Any]], Any, Any]:
    """``train(key)`` → {"runner_state", "metrics": {"success" (U,), "episodes" (U,), "loss" (U,)}}, and
    the unwrapped gymnax environment and its params (for evaluation)."""
    base, env_params = as_gymnax(config["ENV"], config["LEVEL"], embed=embedder(config["EMBED"]))
    if not base.env.discrete:
        raise ValueError(f"this PPO has a categorical policy; {config['ENV']!r} has continuous actions")
    env = LogWrapper(FlattenObservationWrapper(base))
    n_envs, n_steps = config["NUM_ENVS"], config["NUM_STEPS"]
    minibatch = n_envs * n_steps // config["NUM_MINIBATCHES"]
    network = ActorCritic(base.num_actions, config["HIDDEN"])
    obs_dim = base.observation_space(env_params).shape[0]

    def train(key: jax.Array) -> dict[str, Any]:
        key, init_key, reset_key = jax.random.split(key, 3)
        tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(config["LR"], eps=1e-5))
        state = TrainState.create(apply_fn=network.apply, params=network.init(init_key, jnp.zeros((1, obs_dim))),
                                  tx=tx)
        obs, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, n_envs), env_params)

        def update_step(runner: tuple, _: None) -> tuple[tuple, dict[str, jax.Array]]:
            def env_step(runner: tuple, _: None) -> tuple[tuple, Transition]:
                state, env_state, obs, key = runner
                key, act_key, step_key = jax.random.split(key, 3)
                logits, value = network.apply(state.params, obs)
                action = jax.random.categorical(act_key, logits)
                log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]
                next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, (0, 0, 0, None))(
                    jax.random.split(step_key, n_envs), env_state, action, env_params)
                info = {"returned_episode": info["returned_episode"], "success": info["success"]}
                done = (terminated | truncated).astype(jnp.float32)
                transition = Transition(done, action, value, reward, log_prob, obs, info)
                return (state, env_state, next_obs, key), transition

            runner, traj = jax.lax.scan(env_step, runner, None, n_steps)
            state, env_state, obs, key = runner
            _, last_value = network.apply(state.params, obs)
            advantages, targets = gae(traj, last_value, config["GAMMA"], config["GAE_LAMBDA"])

            def loss_fn(params: Any, batch: tuple[Transition, jax.Array, jax.Array]) -> jax.Array:
                t, advantage, target = batch
                logits, value = network.apply(params, t.obs)
                log_probs = jax.nn.log_softmax(logits)
                log_prob = jnp.take_along_axis(log_probs, t.action[:, None], -1)[:, 0]
                value_clipped = t.value + jnp.clip(value - t.value, -config["CLIP_EPS"], config["CLIP_EPS"])
                value_loss = 0.5 * jnp.maximum((value - target) ** 2, (value_clipped - target) ** 2).mean()
                advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
                ratio = jnp.exp(log_prob - t.log_prob)
                surrogate = jnp.minimum(ratio * advantage,
                                        jnp.clip(ratio, 1 - config["CLIP_EPS"], 1 + config["CLIP_EPS"]) * advantage)
                entropy = -(jnp.exp(log_probs) * log_probs).sum(-1).mean()
                return -surrogate.mean() + config["VF_COEF"] * value_loss - config["ENT_COEF"] * entropy

            def epoch(carry: tuple, _: None) -> tuple[tuple, jax.Array]:
                state, key = carry
                key, perm_key = jax.random.split(key)
                flat = jax.tree.map(lambda x: x.reshape((n_envs * n_steps,) + x.shape[2:]),
                                    (traj, advantages, targets))
                order = jax.random.permutation(perm_key, n_envs * n_steps)
                batches = jax.tree.map(lambda x: x[order].reshape((-1, minibatch) + x.shape[1:]), flat)

                def minibatch_step(state: TrainState, batch: tuple) -> tuple[TrainState, jax.Array]:
                    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
                    return state.apply_gradients(grads=grads), loss

                state, losses = jax.lax.scan(minibatch_step, state, batches)
                return (state, key), losses

            (state, key), losses = jax.lax.scan(epoch, (state, key), None, config["UPDATE_EPOCHS"])
            ended = traj.info["returned_episode"]
            metrics = {"success": (traj.info["success"] & ended).sum() / jnp.maximum(ended.sum(), 1),
                       "episodes": ended.sum(), "loss": losses.mean()}
            return (state, env_state, obs, key), metrics

        runner, metrics = jax.lax.scan(update_step, (state, env_state, obs, key), None, config["NUM_UPDATES"])
        return {"runner_state": runner, "metrics": metrics}

    return train, base, env_params


def success_rates(config: dict[str, Any], params: Any, key: jax.Array, episodes: int) -> tuple[float, float]:
    """(trained policy, uniformly random policy) success over ``episodes`` evaluation episodes, every task
    equally often (:func:`imaginejax.training.evaluation.evaluate` on the wrapped environment's batched kernels)."""
    from imaginejax.training.evaluation import evaluate

    _, base, env_params = make_train(config)
    network = ActorCritic(base.num_actions, config["HIDDEN"])

    def trained(obs: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.categorical(key, network.apply(params, obs)[0])

    def random(obs: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.randint(key, obs.shape[:1], 0, base.num_actions)

    run = jax.jit(lambda policy_key, policy: evaluate(policy, base.env, env_params.table, policy_key,
                                                      episodes).success_rate, static_argnums=1)
    return float(run(key, trained)), float(run(key, random))


def main() -> None:
    parser = argparse.ArgumentParser(description="PPO on a discrete imaginejax environment through gymnax.")
    parser.add_argument("--env", default=CONFIG["ENV"])
    parser.add_argument("--level", default=CONFIG["LEVEL"])
    parser.add_argument("--updates", type=int, default=CONFIG["NUM_UPDATES"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=800)
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args()
    config = {**CONFIG, "ENV": args.env, "LEVEL": args.level, "NUM_UPDATES": args.updates}
    train, _, _ = make_train(config)
    start = time.perf_counter()
    out = jax.block_until_ready(jax.jit(train)(jax.random.PRNGKey(args.seed)))
    seconds = time.perf_counter() - start
    success = np.asarray(out["metrics"]["success"])
    trained, random = success_rates(config, out["runner_state"][0].params, jax.random.PRNGKey(args.seed + 1),
                                    args.eval_episodes)
    steps = config["NUM_UPDATES"] * config["NUM_ENVS"] * config["NUM_STEPS"]
    print(f"{args.env}/{args.level}: {steps} env steps in {seconds:.0f} s (compile included); training success "
          f"first 10 updates {success[:10].mean():.3f}, last 10 {success[-10:].mean():.3f}; evaluation "
          f"({args.eval_episodes} episodes): PPO {trained:.3f}, random {random:.3f}")
    if args.figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        x = np.arange(1, len(success) + 1) * config["NUM_ENVS"] * config["NUM_STEPS"]
        ax.plot(x, success, lw=1, label="PPO, episodes ended in each update")
        ax.axhline(random, color="k", ls="--", label=f"random policy ({random:.2f})")
        ax.axhline(trained, color="tab:green", ls=":", label=f"PPO, evaluation ({trained:.2f})")
        ax.set(xlabel="environment steps", ylabel="success rate", ylim=(0, 1),
               title=f"PPO through gymnax: {args.env} {args.level} (seed {args.seed})")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        args.figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.figure, dpi=120)
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
