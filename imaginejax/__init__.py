"""ImagineJAX: offline RL from real and imaginary rollouts, natively in JAX."""

__version__ = "0.1.0"
