import os
import sys

# Tests import small helpers (toy environments) from this folder.
sys.path.insert(0, os.path.dirname(__file__))

import gc

import jax
import pytest


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drops JAX's compiled executables and traces after each test module.

    The whole suite runs in one process and compiles hundreds of programs (MJX scenes, Llama, every
    algorithm); keeping all of them resident grew the process until XLA crashed while compiling a later
    test (a segfault inside ``backend_compile_and_load`` near the end of a full run). Tests never rely on
    a program compiled by another module, so each module starts with empty caches.
    """
    yield
    jax.clear_caches()
    gc.collect()
