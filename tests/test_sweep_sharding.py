"""The run axis on a forced-host mesh: one device, a 2-device mesh and an 8-device mesh give bitwise the
same sweep, with ``EngineConfig.run_block`` fixing the vmapped size so that the per-device
arithmetic does not depend on how many runs a device holds. The partitioned compile disables XLA's CSE
(``kernel.COMPILER_OPTIONS``); a control at the end compiles the 2-device interval with XLA's
defaults and checks that it then differs from the one-device interval (at round-off), so the bitwise
equalities are not passing by accident.

XLA_FLAGS must be set before jax is imported, so the check runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.path.insert(0, sys.argv[1])
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from imaginejax.algos.base import Spec
    from imaginejax.algos.bc import BCHyperparams, make_bc
    from imaginejax.algos.common import DataStats
    from imaginejax.algos.networks import NetConfig
    from imaginejax.data.transitions import to_transitions
    import imaginejax.training.kernel as kernel
    from imaginejax.training.kernel import EngineConfig
    from imaginejax.training.loop import make_train
    from imaginejax.training.sweep import Sweep, run_sweep
    from toy_env import NUM_TASKS, STATE_DIM, ToyEnv, expert_dataset

    assert jax.device_count() == 8, jax.devices()
    spec = Spec(state_dim=STATE_DIM, embed_dim=NUM_TASKS, discrete=True, action_dim=NUM_TASKS)
    env = ToyEnv()
    cfg = EngineConfig(batch_size=16, updates_per_interval=20, num_intervals=2, eval_episodes=16, run_block=1)
    trainer = make_train(make_bc(spec, NetConfig(encoder_width=16, hidden=(16,))), spec, cfg,
                         {"train": (env, env.default_params())})
    real = to_transitions(expert_dataset(64))
    imag = to_transitions(expert_dataset(32, seed=1))
    # R = 10 runs (not a multiple of 8: padded to 16 on the mesh, padding dropped).
    sweep = Sweep.grid(seeds=5, ratios=[0.0, 0.5])
    base = BCHyperparams(learning_rate=jnp.float32(3e-3))
    quiet = lambda s: None
    one = run_sweep(trainer, sweep, base, real, imag, mesh=None, memory_budget=1 << 40, log=quiet).result
    eight = run_sweep(trainer, sweep, base, real, imag, memory_budget=1 << 40, log=quiet).result  # auto mesh
    two = run_sweep(trainer, sweep, base, real, imag, mesh=Mesh(np.asarray(jax.devices()[:2]), ("runs",)),
                    memory_budget=1 << 40, log=quiet).result

    assert eight.success["train"].shape == (2, 10) and eight.finite.shape == (10,)
    # 1 device, 2 devices (5 runs each, no padding), 8 devices (10 runs padded to 16): bit for bit.
    for other in (one, two):
        for a, b in zip(jax.tree.leaves(other.state), jax.tree.leaves(eight.state)):
            assert a.shape == b.shape, (a.shape, b.shape)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert set(other.metrics) == set(eight.metrics)
        for name in eight.metrics:
            np.testing.assert_array_equal(other.metrics[name], eight.metrics[name])
        for field in ("success", "returns", "task_success"):
            np.testing.assert_array_equal(getattr(other, field)["train"], getattr(eight, field)["train"])
        np.testing.assert_array_equal(other.finite, eight.finite)
    # Without padding the returned state stays laid out along the run axis of the mesh.
    for leaf in jax.tree.leaves(two.state):
        assert isinstance(leaf.sharding, NamedSharding) and leaf.sharding.spec == P("runs"), leaf.sharding
        assert len(leaf.sharding.device_set) == 2

    # Control: compiled with XLA's defaults (kernel.COMPILER_OPTIONS = None) the 2-device interval is NOT
    # bitwise the one-device interval, so the equalities above are the engine's doing.
    arrays = sweep.build(base)
    keys, hp, ratio = np.asarray(arrays.keys), jax.tree.map(np.asarray, arrays.hp), np.asarray(arrays.ratios)
    kernel.COMPILER_OPTIONS = None
    default = make_train(trainer.algo, spec, cfg, {"train": (env, env.default_params())})
    outs = []
    for mesh in (None, Mesh(np.asarray(jax.devices()[:2]), ("runs",))):
        init_fn, interval_fn = default._functions(mesh)
        rows = np.tile(np.asarray([0, imag.state.shape[0]], np.int32), (len(ratio), 1))
        state = init_fn(keys, hp, DataStats.from_transitions(real))
        outs.append(jax.tree.leaves(interval_fn(state, hp, ratio, rows, real, imag, default.eval_params)))
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(*outs))
    close = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6) for a, b in zip(*outs))
    print("CONTROL", "same" if same else "differs", "close" if close else "far")
    print("BITWISE-OK")
""")


def test_sharded_runs_match_unsharded(tmp_path):
    script = tmp_path / "sharded.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, str(script), str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "BITWISE-OK" in proc.stdout
    # Without the engine's compiler options the partitioned program rounds differently (but closely).
    assert "CONTROL differs close" in proc.stdout, proc.stdout[-3000:]
