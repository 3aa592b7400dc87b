"""Training many runs in one compiled call: the kernel (:mod:`~imaginejax.training.kernel`), the host loop
around it (:mod:`~imaginejax.training.loop`), sweeps (:mod:`~imaginejax.training.sweep`), evaluation in the
JAX environments and progress display. Knows algorithms, datasets and environments, nothing of the protocol."""
