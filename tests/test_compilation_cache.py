"""JAX's persistent compilation cache, on by default for the command line and fit(): a second process loads
the program the first compiled (jax's own cache-hit event), numbers unchanged; off by
``$IMAGINEJAX_COMPILATION_CACHE=0``; a directory the user chose is kept."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import jax, jax.numpy as jnp
from imaginejax.core.paths import enable_compilation_cache
hits = []
jax.monitoring.register_event_listener(lambda event, **kwargs: hits.append(event == "/jax/compilation_cache/cache_hits"))
directory = enable_compilation_cache()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # store even this small program
value = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.linspace(0.0, 1.0, 32 * 32).reshape(32, 32))
print(directory, sum(hits), float(value).hex())
"""


def _run(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_second_process_loads_the_program_the_first_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "IMAGINEJAX_COMPILATION_CACHE")}
    env["IMAGINEJAX_HOME"] = str(tmp_path)
    first, second = _run(env), _run(env)
    assert first[0] == second[0] == str(tmp_path / "jax-cache")
    assert first[1] == "0" and int(second[1]) >= 1
    assert first[2] == second[2]  # the loaded program computes bitwise what the compiled one did
    assert any((tmp_path / "jax-cache").iterdir())


def test_the_cache_is_off_when_asked_and_a_chosen_directory_is_kept(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(IMAGINEJAX_HOME=str(tmp_path / "home"), IMAGINEJAX_COMPILATION_CACHE="0")
    assert _run(env)[:2] == ["None", "0"]
    assert not (tmp_path / "home" / "jax-cache").exists()
    env.update(IMAGINEJAX_COMPILATION_CACHE="1", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"))
    assert _run(env)[0] == str(tmp_path / "mine")
