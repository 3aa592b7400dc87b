"""Resume: a sweep killed with SIGKILL mid-run and resumed ends exactly like an uninterrupted one;
damaged or foreign checkpoints are refused with a clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from imaginejax.core.checkpoint import CheckpointError, list_checkpoints

SCRIPT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    import jax, jax.numpy as jnp, numpy as np
    from imaginejax.algos.base import Spec
    from imaginejax.algos.bc import BCHyperparams, make_bc
    from imaginejax.algos.networks import NetConfig
    from imaginejax.core.checkpoint import flatten_named
    from imaginejax.data.transitions import to_transitions
    from imaginejax.training.kernel import EngineConfig
    from imaginejax.training.loop import make_train
    from imaginejax.training.sweep import Sweep, run_sweep
    from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

    out, ckpt, run_dir, resume, pause = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1", float(sys.argv[6])
    spec = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
    env = ToyEnv()
    cfg = EngineConfig(batch_size=16, updates_per_interval=30, num_intervals=6, eval_episodes=16)
    trainer = make_train(make_bc(spec, NetConfig(encoder_width=16, hidden=(16,))), spec, cfg,
                         {"train": (env, env.default_params())})
    real = to_transitions(expert_dataset(64))
    imag = to_transitions(expert_dataset(32, seed=1))
    sweep = Sweep.grid(seeds=2, ratios=[0.0, 0.5], hp={"learning_rate": [3e-3]})  # 4 runs ...
    sweep = Sweep.from_runs([{"seed": s.seed, "ratio": s.ratio, "learning_rate": s.hp["learning_rate"]}
                             for s in sweep.table] + [{"seed": 9, "learning_rate": 1e30}])  # ... + one NaN run

    def log(line):
        print(line, flush=True)
        time.sleep(pause)  # gives the parent time to kill us right after an interval's log line

    result = run_sweep(trainer, sweep, BCHyperparams(learning_rate=jnp.float32(1e-3)), real, imag,
                       memory_budget=1 << 40, log=log, checkpoint_dir=ckpt, checkpoint_every=2,
                       keep_checkpoints=2, resume=resume, run_dir=run_dir).result
    arrays = flatten_named(jax.device_get(result.state), "state")
    for group in ("metrics", "success", "returns", "task_success"):
        arrays.update({f"{group}/{k}": v for k, v in getattr(result, group).items()})
    arrays.update(steps=result.steps, finite=result.finite, frozen_at=result.frozen_at)
    np.savez(out, **arrays)
    print("DONE", flush=True)
""")


def _run(script: Path, tests: Path, out: Path, ckpt: Path, run_dir: Path, resume: bool, pause: float = 0.0):
    return [sys.executable, str(script), str(tests), str(out), str(ckpt), str(run_dir), "1" if resume else "0",
            str(pause)]


def _records(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        r.pop("seconds")
    return records


def test_sigkilled_sweep_resumes_to_identical_results(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    tests = Path(__file__).parent
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}

    # The uninterrupted sweep runs alongside.
    fresh = subprocess.Popen(_run(script, tests, tmp_path / "fresh.npz", tmp_path / "ckpt2", tmp_path / "run2",
                                  False), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # The interrupted sweep: killed right after interval 6 was logged, before its checkpoint was written
    # (checkpoints exist for 2 and 4; interval 5's metrics are on disk but in no checkpoint).
    proc = subprocess.Popen(_run(script, tests, tmp_path / "killed.npz", tmp_path / "ckpt", tmp_path / "run",
                                 False, pause=0.3), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[6/6]"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(lines) + proc.stderr.read()[-3000:]
    assert not (tmp_path / "killed.npz").exists()
    assert [i for i, _ in list_checkpoints(tmp_path / "ckpt" / "chunk-000")] == [2, 4]
    assert max(r["interval"] for r in _records(tmp_path / "run")) == 5

    resumed = subprocess.run(_run(script, tests, tmp_path / "resumed.npz", tmp_path / "ckpt", tmp_path / "run",
                                  True), env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "resumed chunk 0" in resumed.stdout and "4/6 intervals done" in resumed.stdout

    assert fresh.wait(timeout=300) == 0, fresh.stderr.read()[-3000:]

    a, b = np.load(tmp_path / "fresh.npz"), np.load(tmp_path / "resumed.npz")
    assert sorted(a.files) == sorted(b.files) and any(k.startswith("state") for k in a.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(a["frozen_at"], [0, 0, 0, 0, 1])  # the NaN run stays isolated
    assert _records(tmp_path / "run") == _records(tmp_path / "run2")  # metrics files as if never killed
    assert [i for i, _ in list_checkpoints(tmp_path / "ckpt" / "chunk-000")] == [4, 6]  # keep last 2


def _toy_trainer():
    sys.path.insert(0, str(Path(__file__).parent))
    from toy_env import NUM_TASKS, STATE_DIM, ToyEnv

    from imaginejax.algos.base import Spec
    from imaginejax.algos.bc import make_bc
    from imaginejax.algos.networks import NetConfig
    from imaginejax.training.kernel import EngineConfig
    from imaginejax.training.loop import make_train

    spec = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
    env = ToyEnv()
    cfg = EngineConfig(batch_size=16, updates_per_interval=5, num_intervals=2, eval_episodes=8)
    return make_train(make_bc(spec, NetConfig(encoder_width=8, hidden=(8,))), spec, cfg,
                      {"train": (env, env.default_params())})


def _toy_sweep(runs: int):
    """The toy BC trainer, ``runs`` keys, hyperparameters (learning rate 1e-3 each) and 32 expert
    trajectories' transitions: what ``trainer.train(keys, hp, real, ...)`` takes."""
    import jax
    from toy_env import expert_dataset

    from imaginejax.algos.bc import BCHyperparams
    from imaginejax.data.transitions import to_transitions

    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    hp = BCHyperparams(learning_rate=jnp.full((runs,), 1e-3, jnp.float32))
    return _toy_trainer(), keys, hp, to_transitions(expert_dataset(32))


def test_damaged_or_foreign_checkpoints_are_refused(tmp_path):
    from imaginejax.algos.bc import BCHyperparams

    trainer, keys, hp, real = _toy_sweep(2)
    ckpt = tmp_path / "ckpt"
    trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt)
    # A finished sweep is not overwritten by accident.
    with pytest.raises(CheckpointError, match="resume=True"):
        trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt)
    # Resuming a finished sweep returns its results without training.
    done = trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt, resume=True)
    assert done.success["train"].shape == (2, 2)
    # Another sweep (other learning rates) in the same directory is refused.
    with pytest.raises(CheckpointError, match="different sweep"):
        trainer.train(keys, BCHyperparams(learning_rate=jnp.full((2,), 2e-3, jnp.float32)), real, log=None,
                      checkpoint_dir=ckpt, resume=True)
    # A truncated array file (the largest chunk file of orbax's tree): the error names the file and
    # what to do.
    latest = list_checkpoints(ckpt / "chunk-000")[-1][1]
    chunk_file = max((p for p in (latest / "arrays" / "tree").rglob("*") if p.is_file()),
                     key=lambda p: p.stat().st_size)
    data = chunk_file.read_bytes()
    chunk_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError,
                       match=rf"{chunk_file.name} is truncated or corrupted.*delete .*step-00000002"):
        trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt, resume=True)
    # A corrupted manifest likewise.
    (latest / "arrays" / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing or corrupted"):
        trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt, resume=True)


def test_interval_events_drive_progress_over_chunks_and_resume(tmp_path):
    import io

    from imaginejax.training.progress import IntervalProgress

    trainer, keys, hp, real = _toy_sweep(3)
    events, lines = [], []
    trainer.train(keys, hp, real, log=lines.append, on_interval=events.append, runs_per_chunk=2, mesh=None,
                  checkpoint_dir=tmp_path / "ckpt")
    # 3 runs in chunks of 2 and 1, 2 intervals each: one event per interval per chunk, in order.
    assert [(e.chunk, e.runs, e.interval, e.step, e.resumed) for e in events] == [
        (0, (0, 1), 1, 5, False), (0, (0, 1), 2, 10, False), (1, (2,), 1, 5, False), (1, (2,), 2, 10, False)]
    assert all(e.num_intervals == 2 and e.seconds > 0 for e in events)
    assert not any("step" in line for line in lines)  # interval lines went to the events, not twice

    stream = io.StringIO()
    progress = IntervalProgress("bc", 3, 2, 5, 0, mode="lines", stream=stream)
    trainer.train(keys, hp, real, log=progress, on_interval=progress.interval, runs_per_chunk=2, mesh=None,
                  checkpoint_dir=tmp_path / "ckpt", resume=True)
    # Resuming the finished sweep: one restored event per chunk, everything counted done, nothing trained.
    assert progress.done == progress.total == 6 and progress.timed_runs == 0
    assert stream.getvalue().count("resumed chunk") == 2 and "updates/s" not in stream.getvalue()


def test_ctrl_c_says_how_far_the_checkpoints_got(tmp_path):
    """A KeyboardInterrupt inside training becomes checkpoint.Interrupted (still a KeyboardInterrupt) whose
    message names the last checkpointed interval and the chunk."""
    from imaginejax.core.checkpoint import Interrupted

    trainer, keys, hp, real = _toy_sweep(3)

    def stop_at(chunk: int, interval: int):
        def on_interval(event):
            if (event.chunk, event.interval) == (chunk, interval):
                raise KeyboardInterrupt
        return on_interval

    with pytest.raises(Interrupted, match=r"^interrupted after interval 1/2 of chunk 2/2$"):
        trainer.train(keys, hp, real, log=None, on_interval=stop_at(1, 2), runs_per_chunk=2, mesh=None,
                      checkpoint_dir=tmp_path / "ckpt")


@pytest.mark.parametrize("interval", [1, 3])
def test_a_checkpoint_with_an_edited_interval_is_never_resumed(tmp_path, interval):
    """``"interval": 2`` edited to 1 in manifest.json resumed silently from the wrong point (and to 3 raised
    a bare IndexError); now resuming stops with a CheckpointError naming the checkpoint and the previous one."""
    trainer, keys, hp, real = _toy_sweep(2)
    ckpt = tmp_path / "ckpt"
    trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt)
    (first, _), (last, latest) = list_checkpoints(ckpt / "chunk-000")
    assert (first, last) == (1, 2)
    manifest = latest / "arrays" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"interval": 2', f'"interval": {interval}'))
    with pytest.raises(CheckpointError, match=rf"{latest}.*delete {latest} to resume from the previous checkpoint "
                                              rf".*step-00000001"):
        trainer.train(keys, hp, real, log=None, checkpoint_dir=ckpt, resume=True)
