"""One process of the multi-process tests: ``python distributed_worker.py CASE OUT [INTERVALS]``.

Joins the job the environment describes (none: a single-process run), trains CASE's sweeps with
``run_block = 1`` (bitwise independent of the device count), checkpointing into OUT/<algo>/checkpoints
and resuming from them, and writes every process's results to OUT/result-<process>.npz.

Cases: ``toy`` (BC on the toy task, real + imaginary data), ``clevr`` (BC and discrete CQL on CLEVR
from random-policy data, TD3+BC on the continuous toy reach), ``mismatch`` (the toy sweep with data that
differs on process 1); ``cli OUT ARGS...`` runs ``imaginejax ARGS...`` and exits with its status.
XLA_FLAGS (host devices) must be set by the launcher.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from imaginejax.core import distributed  # noqa: E402

distributed.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from imaginejax import algos, envs  # noqa: E402
from imaginejax.algos.base import Spec  # noqa: E402
from imaginejax.algos.networks import NetConfig  # noqa: E402
from imaginejax.bench.sweeps import interface  # noqa: E402
from imaginejax.data import load_dataset, save_dataset  # noqa: E402
from imaginejax.data.collect import collect, random_policy  # noqa: E402
from imaginejax.data.transitions import to_transitions  # noqa: E402
from imaginejax.training.kernel import EngineConfig
from imaginejax.training.loop import make_train  # noqa: E402
from imaginejax.training.sweep import Sweep, run_sweep  # noqa: E402

NET = NetConfig(encoder_width=16, hidden=(16,))


def sweep_of(name: str, spec: Spec, levels: dict, real, imag, out: Path, intervals: int, updates: int,
             eval_episodes: int) -> dict[str, np.ndarray]:
    """One algorithm's sweep (3 seeds × ratios 0, 0.5), its results as named host arrays."""
    cfg = EngineConfig(batch_size=16, updates_per_interval=updates, num_intervals=intervals,
                       eval_episodes=eval_episodes, run_block=1)
    algo = algos.make(name, spec, NET)
    trainer = make_train(algo, spec, cfg, levels)
    sweep = Sweep.grid(seeds=3, ratios=[0.0, 0.5])
    result = run_sweep(trainer, sweep, algo.default_hp(spec), real, imag, memory_budget=1 << 40,
                       run_dir=out / name, checkpoint_dir=out / name / "checkpoints", resume=True,
                       log=lambda line: print(line, file=sys.stderr, flush=True)).result
    arrays = {f"{name}/state/{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(result.state))}
    arrays.update({f"{name}/metrics/{k}": v for k, v in result.metrics.items()})
    for field in ("success", "returns", "task_success"):
        arrays.update({f"{name}/{field}/{lv}": v for lv, v in getattr(result, field).items()})
    arrays[f"{name}/frozen_at"] = result.frozen_at
    return arrays


def toy(out: Path, intervals: int, mismatch: bool = False) -> dict[str, np.ndarray]:
    from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

    spec = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
    env = ToyEnv()
    real = to_transitions(expert_dataset(64, seed=7 if mismatch and jax.process_index() == 1 else 0))
    imag = to_transitions(expert_dataset(32, seed=1))
    return sweep_of("bc", spec, {"train": (env, env.default_params())}, real, imag, out, intervals, 20, 16)


def clevr_data(directory: Path, level: str, episodes: int, seed: int):
    """Random-policy CLEVR trajectories of ``level`` (no embeddings), collected by process 0 once."""
    path = directory / f"clevr-{level}-random-{episodes}-{seed}"

    def make():
        if (path / "manifest.json").exists():
            return load_dataset(path)
        env, params = envs.make("clevr", level)
        ds = collect(env, params, random_policy(env.num_actions), jax.random.PRNGKey(seed), episodes,
                     chunk_size=episodes, progress=False)
        save_dataset(ds, path, overwrite=True)
        return ds

    return distributed.writer_first(make)


def clevr(out: Path, intervals: int, data_dir: Path) -> dict[str, np.ndarray]:
    from toy_continuous_env import ACTION_DIM, NUM_TASKS, STATE_DIM, ContinuousReachEnv, noisy_expert_dataset

    real_ds, imag_ds = clevr_data(data_dir, "train", 8, 0), clevr_data(data_dir, "easy", 4, 1)
    levels = {lv: envs.make("clevr", lv) for lv in ("train", "easy")}
    spec = interface(real_ds, levels)
    real, imag = to_transitions(real_ds), to_transitions(imag_ds)
    arrays = {}
    for name in ("bc", "cql"):
        arrays.update(sweep_of(name, spec, levels, real, imag, out, intervals, 10, 8))
    reach = ContinuousReachEnv()
    reach_spec = Spec(STATE_DIM, NUM_TASKS, False, ACTION_DIM)
    arrays.update(sweep_of("td3bc", reach_spec, {"train": (reach, reach.default_params())},
                           to_transitions(noisy_expert_dataset(64)), to_transitions(noisy_expert_dataset(32, seed=1)),
                           out, intervals, 10, 16))
    return arrays


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    if case == "cli":
        from imaginejax import cli

        raise SystemExit(cli.main(sys.argv[3:]))
    intervals = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    if case == "clevr":
        arrays = clevr(out, intervals, Path(sys.argv[4]))
    else:
        arrays = toy(out, intervals, mismatch=case == "mismatch")
    np.savez(out / f"result-{jax.process_index()}.npz", **arrays)
    print(f"process {jax.process_index()} of {jax.process_count()} on {jax.device_count()} devices: done",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
