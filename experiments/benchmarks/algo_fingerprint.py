"""Fingerprints of every registered algorithm, to check that a refactor of ``algos/`` changes no number.

    python experiments/benchmarks/algo_fingerprint.py save DIR [NAME ...]
    python experiments/benchmarks/algo_fingerprint.py compare DIR_BEFORE DIR_AFTER

``save`` trains each algorithm (both action spaces: CLEVR's train level with 40 expert trajectories plus
20 noisier ones as imaginary data, and the continuous reach task of ``tests/toy_continuous_env.py``) for
2 intervals of 20 updates through the engine, two runs (ratio 0 and 0.5) with fixed keys and small
networks, and writes the final state, the per-interval metrics and the evaluations to ``DIR/<kind>_<name>.npz``.
``compare`` prints, per algorithm, "bitwise equal" or the largest absolute difference and where; state
leaves are matched by path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import toy_continuous_env as reach  # noqa: E402
from imaginejax import algos, envs  # noqa: E402
from imaginejax.algos.base import Spec  # noqa: E402
from imaginejax.algos.combo import ComboConfig  # noqa: E402
from imaginejax.algos.dynamics import DynamicsConfig  # noqa: E402
from imaginejax.algos.networks import NetConfig  # noqa: E402
from imaginejax.data.experts import cached_expert_data  # noqa: E402
from imaginejax.data import to_transitions  # noqa: E402
from imaginejax.training.kernel import EngineConfig, broadcast_runs
from imaginejax.training.loop import make_train  # noqa: E402
from imaginejax.lang import encode_instructions  # noqa: E402

NET = NetConfig(encoder_width=32, hidden=(32, 32))
COMBO = ComboConfig(dynamics=DynamicsConfig(ensemble_size=3, num_elites=2, hidden=(32, 32)), rollout_batch=64,
                    rollout_interval=8, horizon=2, retain_rollouts=2, num_action_samples=3)
OPTIONS = {"combo": {"config": COMBO}, "prdc": {"chunk": 64}}
DATA = Path("/tmp/imaginejax-fingerprint-data")


def setups():
    """(kind, spec, real, imag, env, params) for the discrete and the continuous action space."""
    env, params = envs.make("clevr", "train", embed=encode_instructions)
    spec = Spec(state_dim=env.state_dim, embed_dim=int(params.instruction_embeddings.shape[1]), discrete=True,
                action_dim=env.num_actions)
    yield ("discrete", spec, to_transitions(cached_expert_data("clevr", "train", 40, 0, 0.1, DATA)),
           to_transitions(cached_expert_data("clevr", "train", 20, 1, 0.5, DATA)), env, params)
    env = reach.ContinuousReachEnv()
    spec = Spec(state_dim=reach.STATE_DIM, embed_dim=reach.NUM_TASKS, discrete=False, action_dim=reach.ACTION_DIM)
    yield ("continuous", spec, to_transitions(reach.noisy_expert_dataset(256)),
           to_transitions(reach.noisy_expert_dataset(128, seed=7)), env, env.default_params())


def save(out: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for kind, spec, real, imag, env, params in setups():
        for name in algos.registered(spec.discrete):
            if only and name not in only:
                continue
            algo = algos.make(name, spec, NET, **OPTIONS.get(name, {}))
            config = EngineConfig(batch_size=32, updates_per_interval=20, num_intervals=2, eval_episodes=8)
            trainer = make_train(algo, spec, config, {"train": (env, params)})
            result = trainer.train(jax.random.split(jax.random.PRNGKey(0), 2), broadcast_runs(algo.default_hp(spec), 2),
                                   real, imag, ratio=jnp.asarray([0.0, 0.5]), log=None)
            arrays = {"state" + jax.tree_util.keystr(path): np.asarray(leaf)
                      for path, leaf in jax.tree_util.tree_flatten_with_path(result.state.algo)[0]}
            for series in ("metrics", "success", "returns"):
                arrays.update({f"{series}/{k}": np.asarray(v) for k, v in getattr(result, series).items()})
            np.savez(out / f"{kind}_{name}.npz", **arrays)
            print(kind, name, "saved", flush=True)


def compare(before: Path, after: Path) -> None:
    for path in sorted(before.glob("*.npz")):
        a, b = np.load(path), np.load(after / path.name)
        worst, where = 0.0, ""
        for key in sorted(set(a.files) | set(b.files)):
            if key not in a.files or key not in b.files:
                worst, where = float("inf"), f"{key} only on one side"
                continue
            x, y = a[key], b[key]
            if x.shape != y.shape:
                worst, where = float("inf"), f"{key} shapes {x.shape} vs {y.shape}"
            elif not np.array_equal(x, y, equal_nan=True):
                d = float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64))))
                if d >= worst:
                    worst, where = d, key
        print(f"{path.stem:24s} " + ("bitwise equal" if not where else f"max |diff| {worst:.3g} at {where}"))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "save":
        save(Path(sys.argv[2]), sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
