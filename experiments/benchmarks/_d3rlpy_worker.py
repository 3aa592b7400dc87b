"""d3rlpy side of ``algo_updates.py``: runs in the reference interpreter, never in the project's venv.

Started by ``algo_updates.py`` as a long-lived subprocess of the reference interpreter
(``.venv-ref/bin/python``: PyTorch CPU + d3rlpy). It is set up with

    .venv-ref/bin/pip install "d3rlpy==2.8.1" "torch==2.13.0"

(pinning torch keeps the CPU build already there; d3rlpy 2.8.1 itself pulls only light dependencies:
gym, gymnasium, h5py, scikit-learn, scipy, structlog, dataclasses-json, colorama, tqdm).

Protocol: one JSON object per line on stdin, one JSON answer per line on stdout (logging goes to
stderr). Requests:

* ``{"op": "hello"}`` -> versions and thread counts.
* ``{"op": "measure", "algo", "discrete", "state_dim", "embed_dim", "action_dim", "batch_size",
  "dataset_size", "seeds", "updates", "warmup", "nets", "max_seconds"}`` -> ``{"ok": true, "updates",
  "requested", "seconds", "update_seconds", "params"}``: ``seeds`` independent d3rlpy algorithms (seeds
  0..seeds-1, built and warmed up with ``warmup`` updates once, then kept for later requests) each run
  ``updates`` steps of d3rlpy's own training loop, one after the other (what a user does for several
  seeds): sample a minibatch from the replay buffer (``dataset.sample_transition_batch``), then
  ``algo.update(batch)``.
  ``seconds`` is the wall time of all of it, ``update_seconds`` the part spent in ``update``. With
  ``max_seconds`` (optional) the loop stops after the update that crosses it: ``updates`` is then the
  number actually done (fewer than ``requested``), so updates / seconds stays a true rate.
  ``nets`` maps a role (``actor``, ``critic``, ``imitator``, ``q``) to ``{"encoder_width",
  "encoder_layers", "hidden"}``.
* ``{"op": "quit"}``.

Networks: every network is our reference architecture (BENCHMARK.md §4): ``encoder_layers`` tanh layers
of ``encoder_width`` over the observation (state ⊕ instruction embedding), then ReLU layers ``hidden``;
d3rlpy adds its own output layer (Q-value, action, logits, VAE moments). With an action input, the
action joins after the tanh layers, as in ``imaginejax.algos.common.EncodedCritic``.

The dataset: ``dataset_size`` random transitions in episodes of 100 steps, observations of width
S + E (a random state next to one of 64 random instruction embeddings, as an instruction-conditioned
buffer would hold), actions uniform in [-1, 1]^A or over all n discrete actions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

from _common import protocol_stdout, serve

# Before d3rlpy's imports: its structlog, gym's warnings and progress bars must not reach the answers.
PROTOCOL = protocol_stdout()

import numpy as np
import torch
from torch import nn

import d3rlpy
from d3rlpy.algos.utility import build_scalers_with_transition_picker
from d3rlpy.models.encoders import EncoderFactory, register_encoder_factory
from d3rlpy.models.torch import Encoder, EncoderWithAction

EPISODE_LENGTH = 100
NUM_INSTRUCTIONS = 64
# d3rlpy's device for every algorithm of this process: "cuda:0" on a GPU machine, False (CPU) by default.
DEVICE = os.environ.get("IMAGINEJAX_D3RLPY_DEVICE") or False


def _tanh_layers(in_dim: int, width: int, layers: int) -> tuple[nn.Module, int]:
    modules: list[nn.Module] = []
    for _ in range(layers):
        modules += [nn.Linear(in_dim, width), nn.Tanh()]
        in_dim = width
    return nn.Sequential(*modules), in_dim


def _relu_layers(in_dim: int, hidden: list[int]) -> tuple[nn.Module, int]:
    modules: list[nn.Module] = []
    for width in hidden:
        modules += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*modules), in_dim


class LanguageEncoder(Encoder):
    """obs (B, S+E) -> tanh layers -> ReLU layers -> (B, hidden[-1])."""

    def __init__(self, obs_dim: int, width: int, layers: int, hidden: list[int]):
        super().__init__()
        self.language, out = _tanh_layers(obs_dim, width, layers)
        self.head, _ = _relu_layers(out, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.language(x))


class LanguageEncoderWithAction(EncoderWithAction):
    """(obs (B, S+E), action (B, A)) -> tanh layers on obs, ⊕ action, ReLU layers -> (B, hidden[-1])."""

    def __init__(self, obs_dim: int, action_dim: int, width: int, layers: int, hidden: list[int]):
        super().__init__()
        self.language, out = _tanh_layers(obs_dim, width, layers)
        self.head, _ = _relu_layers(out + action_dim, hidden)

    def forward(self, x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.language(x), action], dim=-1))


@dataclasses.dataclass()
class LanguageEncoderFactory(EncoderFactory):
    """d3rlpy encoder factory for the reference architecture (module docstring)."""

    encoder_width: int = 256
    encoder_layers: int = 2
    hidden: list[int] = dataclasses.field(default_factory=lambda: [256, 256])

    def create(self, observation_shape: Any) -> LanguageEncoder:
        return LanguageEncoder(int(observation_shape[0]), self.encoder_width, self.encoder_layers,
                               list(self.hidden))

    def create_with_action(self, observation_shape: Any, action_size: int,
                           discrete_action: bool = False) -> LanguageEncoderWithAction:
        if discrete_action:
            raise ValueError("LanguageEncoderFactory: discrete actions are not concatenated to the encoder")
        return LanguageEncoderWithAction(int(observation_shape[0]), action_size, self.encoder_width,
                                         self.encoder_layers, list(self.hidden))

    @staticmethod
    def get_type() -> str:
        return "imaginejax_language"


register_encoder_factory(LanguageEncoderFactory)


def _factory(nets: dict[str, dict[str, Any]], role: str) -> LanguageEncoderFactory:
    if role not in nets:
        raise ValueError(f"nets has no entry for role {role!r} (got {sorted(nets)})")
    spec = nets[role]
    return LanguageEncoderFactory(int(spec["encoder_width"]), int(spec["encoder_layers"]),
                                  [int(h) for h in spec["hidden"]])


def make_config(algo: str, discrete: bool, batch_size: int, nets: dict[str, dict[str, Any]]) -> Any:
    """The d3rlpy config standing for our ``algo`` (reference hyperparameters, BENCHMARK.md §4)."""
    algos = d3rlpy.algos
    scaler = d3rlpy.preprocessing.StandardObservationScaler
    if (algo, discrete) == ("bc", False):
        return algos.BCConfig(batch_size=batch_size, learning_rate=1e-3, policy_type="deterministic",
                              encoder_factory=_factory(nets, "actor"))
    if (algo, discrete) == ("bc", True):
        return algos.DiscreteBCConfig(batch_size=batch_size, learning_rate=1e-3, beta=0.0,
                                      encoder_factory=_factory(nets, "actor"))
    if (algo, discrete) == ("td3bc", False):
        return algos.TD3PlusBCConfig(batch_size=batch_size, actor_encoder_factory=_factory(nets, "actor"),
                                     critic_encoder_factory=_factory(nets, "critic"), alpha=2.5,
                                     update_actor_interval=2, observation_scaler=scaler())
    if (algo, discrete) == ("prdc", False):
        return algos.PRDCConfig(batch_size=batch_size, actor_encoder_factory=_factory(nets, "actor"),
                                critic_encoder_factory=_factory(nets, "critic"), alpha=2.5, beta=2.0,
                                update_actor_interval=2, observation_scaler=scaler())
    if (algo, discrete) == ("cql", False):
        return algos.CQLConfig(batch_size=batch_size, actor_learning_rate=1e-4, critic_learning_rate=3e-4,
                               conservative_weight=5.0, n_action_samples=10,
                               actor_encoder_factory=_factory(nets, "actor"),
                               critic_encoder_factory=_factory(nets, "critic"))
    if (algo, discrete) == ("cql", True):
        return algos.DiscreteCQLConfig(batch_size=batch_size, learning_rate=6.25e-5, alpha=10.0,
                                       target_update_interval=8000, encoder_factory=_factory(nets, "q"))
    if (algo, discrete) == ("bcq", False):
        # One n_action_samples serves d3rlpy's target and acting; the update we time uses the target's
        # 10 samples of the reference (acting with 100 is not part of an update).
        return algos.BCQConfig(batch_size=batch_size, actor_learning_rate=1e-3, critic_learning_rate=1e-3,
                               imitator_learning_rate=1e-3, lam=0.75, action_flexibility=0.05,
                               n_action_samples=10, beta=0.5,
                               actor_encoder_factory=_factory(nets, "actor"),
                               critic_encoder_factory=_factory(nets, "critic"),
                               imitator_encoder_factory=_factory(nets, "imitator"))
    if (algo, discrete) == ("bcq", True):
        return algos.DiscreteBCQConfig(batch_size=batch_size, learning_rate=6.25e-5, action_flexibility=0.3,
                                       beta=1e-2, target_update_interval=8000, share_encoder=True,
                                       encoder_factory=_factory(nets, "q"))
    kind = "discrete" if discrete else "continuous"
    raise ValueError(f"no d3rlpy counterpart for {kind} {algo!r}")


def make_dataset(discrete: bool, state_dim: int, embed_dim: int, action_dim: int, size: int,
                 seed: int = 0) -> d3rlpy.dataset.ReplayBuffer:
    """``size`` random transitions (module docstring) as a d3rlpy MDPDataset."""
    if size < 2 * EPISODE_LENGTH:
        raise ValueError(f"dataset_size must be >= {2 * EPISODE_LENGTH}, got {size}")
    size -= size % EPISODE_LENGTH
    rng = np.random.default_rng(seed)
    embeddings = rng.standard_normal((NUM_INSTRUCTIONS, embed_dim)).astype(np.float32)
    episode_instruction = rng.integers(0, NUM_INSTRUCTIONS, size // EPISODE_LENGTH)
    states = rng.standard_normal((size, state_dim)).astype(np.float32)
    observations = np.concatenate([states, embeddings[np.repeat(episode_instruction, EPISODE_LENGTH)]], 1)
    if discrete:
        actions = rng.permutation(np.arange(size) % action_dim).astype(np.int64)  # every action occurs
    else:
        actions = rng.uniform(-1.0, 1.0, (size, action_dim)).astype(np.float32)
    rewards = rng.standard_normal(size).astype(np.float32)
    ends = (np.arange(size) % EPISODE_LENGTH) == EPISODE_LENGTH - 1
    terminals = (ends & (rng.random(size) < 0.5)).astype(np.float32)
    timeouts = (ends & (terminals == 0)).astype(np.float32)
    kwargs: dict[str, Any] = {}
    if discrete:
        kwargs = {"action_space": d3rlpy.ActionSpace.DISCRETE, "action_size": action_dim}
    return d3rlpy.dataset.MDPDataset(observations, actions, rewards, terminals, timeouts, **kwargs)


def count_params(algo: Any) -> int:
    """Trainable parameters of the online networks (target copies and optimiser states excluded)."""
    total = 0
    for field in dataclasses.fields(algo.impl.modules):
        module = getattr(algo.impl.modules, field.name)
        if field.name.startswith("targ") or not isinstance(module, nn.Module):
            continue
        total += sum(p.numel() for p in module.parameters())
    return int(total)


class Worker:
    """Keeps datasets and built algorithms between requests (each built and warmed up once)."""

    def __init__(self) -> None:
        self.datasets: dict[tuple, Any] = {}
        self.algos: dict[tuple, Any] = {}

    def dataset(self, req: dict[str, Any]) -> Any:
        key = (req["discrete"], req["state_dim"], req["embed_dim"], req["action_dim"], req["dataset_size"])
        if key not in self.datasets:
            self.datasets[key] = make_dataset(*key)
        return self.datasets[key]

    def algo(self, req: dict[str, Any], seed: int) -> Any:
        key = (req["algo"], req["discrete"], req["state_dim"], req["embed_dim"], req["action_dim"],
               req["batch_size"], req["dataset_size"], json.dumps(req["nets"], sort_keys=True), seed)
        if key in self.algos:
            return self.algos[key]
        dataset = self.dataset(req)
        d3rlpy.seed(seed)
        algo = make_config(req["algo"], req["discrete"], req["batch_size"], req["nets"]).create(device=DEVICE)
        build_scalers_with_transition_picker(algo, dataset)
        algo.build_with_dataset(dataset)
        if req["algo"] == "prdc":
            # PRDC.fit builds this index before training: (β·scaled observation, action) of every transition.
            obs = np.concatenate([ep.observations for ep in dataset.episodes])
            act = np.concatenate([ep.actions for ep in dataset.episodes]).reshape(len(obs), -1)
            if algo.observation_scaler is not None and algo.observation_scaler.built:
                obs = algo.observation_scaler.transform_numpy(obs)
            algo._nbsr.fit(np.concatenate([obs * algo.config.beta, act], axis=1))
        for _ in range(int(req["warmup"])):
            algo.update(dataset.sample_transition_batch(req["batch_size"]))
        self.algos[key] = algo
        return algo

    def measure(self, req: dict[str, Any]) -> dict[str, Any]:
        dataset = self.dataset(req)
        runs = [self.algo(req, seed) for seed in range(int(req["seeds"]))]
        batch_size, updates = int(req["batch_size"]), int(req["updates"])
        budget = float(req.get("max_seconds") or "inf")
        update_seconds, done = 0.0, 0
        start = time.perf_counter()
        for algo in runs:  # seeds one after another, as a user runs them
            for _ in range(updates):
                batch = dataset.sample_transition_batch(batch_size)
                t0 = time.perf_counter()
                algo.update(batch)
                update_seconds += time.perf_counter() - t0
                done += 1
                if time.perf_counter() - start > budget:
                    break
            if time.perf_counter() - start > budget:
                break
        seconds = time.perf_counter() - start
        return {"ok": True, "updates": done, "requested": updates * len(runs), "seconds": seconds,
                "update_seconds": update_seconds, "params": count_params(runs[0])}


def main() -> None:
    worker = Worker()

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("op") == "hello":
            return {"d3rlpy": d3rlpy.__version__, "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads(), "device": DEVICE or "cpu", "python": sys.version.split()[0]}
        if req.get("op") == "measure":
            return worker.measure(req)
        raise ValueError(f"unknown op {req.get('op')!r} (hello, measure, quit)")

    serve(handle, PROTOCOL)


if __name__ == "__main__":
    main()
