"""``gymnasium.make`` finds every environment by id in a fresh interpreter, with the adapter named in the id
(Gymnasium >= 1.0 loads no plugins, so the module that registers the ids is imported by Gymnasium itself)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import gymnasium
assert "imaginejax.interop.gym_adapter" not in sys.modules
env = gymnasium.make("imaginejax.interop.gym_adapter:imaginejax/clevr-hard-v0")
obs, info = env.reset(seed=0)
assert env.observation_space.contains(obs), obs
ids = sorted(i for i in gymnasium.registry if i.startswith("imaginejax/"))
print(len(ids), ids[0], ids[-1], env.unwrapped.spec.id)
"""


def test_make_by_id_in_a_fresh_interpreter() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # five environments x four levels, sorted by id
    assert done.stdout.split() == ["20", "imaginejax/babyai-easy-v0", "imaginejax/metaworld-train-v0",
                                   "imaginejax/clevr-hard-v0"]
