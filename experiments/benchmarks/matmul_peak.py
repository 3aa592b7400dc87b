"""This CPU's float32 matmul peak, and the FLOP counts that put a training update against it.

    python experiments/benchmarks/matmul_peak.py [--size 2048] [--repeats 7] [--allow-busy]

Three measurements, used by ``algo_updates.py`` (and printed by this script on their own):

* :func:`matmul_peak`: FLOP/s of a jitted ``jnp.dot`` of two n×n float32 matrices, 2n³ FLOPs per product,
  best of ``repeats`` timed calls after compilation (the best, not the median: the peak is what the
  hardware can do, and a busy machine only ever slows a call down).
* :func:`matmul_flops`: the matrix-multiply FLOPs of a function, counted exactly on its jaxpr: every
  ``dot_general`` costs 2 · |output| · Π(contracted sizes), a ``scan`` body counts ``length`` times,
  a ``cond`` its most expensive branch, and every nested jaxpr (jit, custom_jvp/vjp, remat, shard_map)
  is walked. Because ``jax.grad`` writes the backward pass into the jaxpr, this is the forward *and*
  backward count the update really traces — e.g. a dense layer whose input needs no gradient costs
  2× its forward (forward + weight gradient), the others 3× (plus the input gradient), instead of the
  usual "≈ 3× forward" rule of thumb. ``while`` loops have no static trip count: their body counts once
  and the loop is reported in :attr:`FlopCount.while_loops`.
* :func:`xla_flops`: XLA's own cost analysis of the compiled program (``compiled.cost_analysis()``):
  all FLOPs XLA attributes, matmuls *and* elementwise work (bias adds, activations, Adam), after its
  optimisations. XLA counts a ``while`` (``lax.scan``) body once, whatever the trip count, so it is
  applied to one update, never to the timed scan. A matmul that XLA lowered to a custom call would
  count 0 here, so the two counts cross-check each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from _common import add_load_arguments, best_seconds, check_load, load_note


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """Matrix-multiply FLOPs of one traced function.

    Attributes:
      flops: 2 · multiply-adds of every ``dot_general`` the function executes (scan bodies × length).
      dots: number of ``dot_general`` equations executed (scan bodies × length).
      while_loops: number of ``while`` loops met, whose bodies were counted once (0: the count is exact).
    """

    flops: int
    dots: int
    while_loops: int


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[jex_core.Jaxpr]:
    """Every (closed) jaxpr held in an equation's parameters, as plain jaxprs."""
    for value in params.values():
        for item in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


def _dot_general_flops(eqn: jex_core.JaxprEqn) -> int:
    """2 · |output| · Π(contracted sizes) for one ``dot_general`` equation."""
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs_shape = eqn.invars[0].aval.shape
    contracted = math.prod(int(lhs_shape[d]) for d in lhs_contract)
    return 2 * math.prod(int(s) for s in eqn.outvars[0].aval.shape) * contracted


def _count(jaxpr: jex_core.Jaxpr) -> tuple[int, int, int]:
    flops = dots = loops = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            flops += _dot_general_flops(eqn)
            dots += 1
        elif name == "scan":
            f, d, w = _count(eqn.params["jaxpr"].jaxpr)
            length = int(eqn.params["length"])
            flops, dots, loops = flops + length * f, dots + length * d, loops + w
        elif name == "cond":
            branches = [_count(b.jaxpr) for b in eqn.params["branches"]]
            f, d, w = max(branches)
            flops, dots, loops = flops + f, dots + d, loops + w
        elif name == "while":
            for sub in _sub_jaxprs(eqn.params):
                f, d, w = _count(sub)
                flops, dots, loops = flops + f, dots + d, loops + w
            loops += 1
        elif name in ("conv_general_dilated", "ragged_dot", "ragged_dot_general"):
            raise NotImplementedError(f"matmul_flops does not count {name!r}; extend _count for it")
        else:
            for sub in _sub_jaxprs(eqn.params):
                f, d, w = _count(sub)
                flops, dots, loops = flops + f, dots + d, loops + w
    return flops, dots, loops


def matmul_flops(fn: Callable[..., Any], *args: Any) -> FlopCount:
    """Matrix-multiply FLOPs of ``fn(*args)`` from its jaxpr (see the module docstring).

    Args:
      fn: a traceable function (may contain ``jax.grad``, ``vmap``, ``lax.scan``, nested ``jit``).
      *args: example arguments, or ``jax.ShapeDtypeStruct`` s (nothing is computed).

    Returns:
      The :class:`FlopCount`; shapes come from the trace, so a vmapped function counts every run.
    """
    flops, dots, loops = _count(jax.make_jaxpr(fn)(*args).jaxpr)
    return FlopCount(flops=flops, dots=dots, while_loops=loops)


def xla_flops(compiled: Any) -> float:
    """FLOPs XLA's cost analysis attributes to a compiled program (``jit(f).lower(...).compile()``).

    Returns NaN when the backend gives no estimate. Loop bodies count once (module docstring).
    """
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax returned one dict per program
        analysis = analysis[0] if analysis else {}
    value = (analysis or {}).get("flops")
    return float("nan") if value is None else float(value)


def matmul_peak(size: int = 2048, repeats: int = 7, key: jax.Array | None = None,
                dtype: Any = jnp.float32) -> float:
    """Best FLOP/s of a jitted (size × size) @ (size × size) product in ``dtype`` on the default device
    (XLA's default precision).

    Args:
      size: n, the matrix side; 2n³ FLOPs per product.
      repeats: timed calls after one warm-up call (compilation excluded); the fastest counts.
      key: PRNG key for the operands (default ``PRNGKey(0)``).
      dtype: of the operands (default float32).

    Returns:
      FLOP/s.
    """
    if size < 1 or repeats < 1:
        raise ValueError(f"size and repeats must be >= 1, got size={size}, repeats={repeats}")
    key = jax.random.PRNGKey(0) if key is None else key
    a, b = jax.random.normal(key, (2, size, size), dtype)
    dot = jax.jit(jnp.dot).lower(a, b).compile()
    dot(a, b).block_until_ready()
    return 2.0 * size**3 / best_seconds(lambda: dot(a, b).block_until_ready(), repeats)


def chained_product_rate(batch: int = 256, width: int = 408, chain: int = 64, repeats: int = 7) -> float:
    """Best float32 FLOP/s of ``chain`` dependent (batch × width) @ (width × width) products in one scan.

    The shape of one dense layer of an update at batch 256 (the small-matrix rate, for comparison with
    :func:`matmul_peak`). Each product feeds the next, so XLA cannot hoist or skip any of them.
    """
    x = jnp.ones((batch, width), jnp.float32)
    w = jnp.eye(width, dtype=jnp.float32)

    def run(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda h, _: (h @ w, None), x, None, length=chain)[0]

    compiled = jax.jit(run).lower(x, w).compile()
    compiled(x, w).block_until_ready()
    return 2.0 * batch * width * width * chain / best_seconds(lambda: compiled(x, w).block_until_ready(), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=7)
    add_load_arguments(parser)
    args = parser.parse_args()
    load_before = check_load(args.allow_busy)
    peak = matmul_peak(args.size, args.repeats)
    small = chained_product_rate(repeats=args.repeats)
    print(f"float32 matmul peak ({args.size}² jnp.dot, best of {args.repeats}): {peak / 1e9:.1f} GFLOP/s")
    print(f"256×408 @ 408×408 chained products (best of {args.repeats}): {small / 1e9:.1f} GFLOP/s "
          f"({100 * small / peak:.0f}% of peak)")
    print(f"devices: {jax.devices()}, numpy {np.__version__}, jax {jax.__version__}; {load_note(load_before)}")


if __name__ == "__main__":
    main()
