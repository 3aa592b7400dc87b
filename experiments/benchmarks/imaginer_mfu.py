"""Model FLOP utilisation (MFU) of the imaginer's fine-tuning step on this device.

    python experiments/benchmarks/imaginer_mfu.py [--model smollm2-135m] [--modes lora-all lora-all-attached full]
        [--dtypes bfloat16 float32] [--rows 32 128 512] [--length 128] [--steps 10] [--seconds 120]
        [--peak-tflops P] [--out results/benchmarks/imaginer_mfu]

The step is the KALM step fine-tuning runs (``imaginer_finetune.build_ours``: the real batch builder, regression
and classification heads, clip + AdamW) on one rollout-task batch of ``rows`` × ``--length`` tokens, random
weights with the model's exact architecture. Modes: ``full`` fine-tuning, ``lora`` (q/k/v/o) and ``lora-all``
(every projection) with the adapters merged into the kernels, ``lora-all-attached`` with them attached
(``Preset.lora_form``: fewer FLOPs, more and skinnier matmuls). Per case: compiled ahead of time, FLOPs per
step = XLA's cost analysis of the compiled program; one warm-up step, then ``--steps`` timed steps (min and
median); tokens/s counts real tokens, achieved TFLOP/s = FLOPs per step / seconds per step, MFU = achieved / peak.
The peak is ``--peak-tflops``, else the device's dense bfloat16 peak (H100 SXM and H200: 989.4 TFLOP/s); both
dtypes are reported against it, as MFU usually is. Cases run in the order given (dtype, mode, rows) until
``--seconds`` are spent; the tables are rewritten after every case, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import imaginer_finetune as ift  # noqa: E402

# Dense bfloat16 tensor-core peaks (TFLOP/s, without sparsity) by the device_kind substring.
BF16_PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}


def device_peak(kind: str) -> float | None:
    """The dense bf16 peak of a device kind (TFLOP/s), None when unknown."""
    return next((peak for name, peak in BF16_PEAK_TFLOPS.items() if name in kind), None)


def measure(model: str, mode: str, dtype: str, rows: int, length: int, steps: int,
            peak: float | None) -> dict[str, Any]:
    """One case: compile, warm up, time ``steps`` steps; tokens/s, TFLOP/s and MFU (min / median step)."""
    from imaginejax.imaginer import lora as lora_lib

    start = time.perf_counter()
    case = ift.build_ours(model, "full" if mode == "full" else "lora", rows, length, compute_dtype=dtype,
                          lora_targets=lora_lib.LORA_TARGETS if mode.startswith("lora-all") else None, aot=True,
                          lora_form="attached" if mode.endswith("attached") else "merged")
    kalm = case["kalm"]
    kalm["step"]()
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        kalm["step"]()
        times.append(time.perf_counter() - t)
    best, median = min(times), statistics.median(times)
    row = {"model": model, "mode": mode, "dtype": dtype, "rows": rows, "length": length,
           "tokens_per_step": kalm["tokens"], "gflop_per_step": kalm["flops"] / 1e9,
           "step_ms_min": best * 1e3, "step_ms_median": median * 1e3,
           "tokens_per_s_median": kalm["tokens"] / median, "tflops_median": kalm["flops"] / median / 1e12,
           "tflops_best": kalm["flops"] / best / 1e12, "compile_and_first_s": compile_s}
    if peak:
        row["mfu_median"] = row["tflops_median"] / peak
        row["mfu_best"] = row["tflops_best"] / peak
    return row


def markdown(device: str, peak: float | None, rows: list[dict[str, Any]]) -> str:
    """The table of every measured case."""
    lines = [f"Imaginer fine-tuning step, MFU on {device} (peak {peak or 'unknown'} TFLOP/s dense bf16)", "",
             "| model | mode | dtype | rows × length | tokens/step | GFLOP/step | ms/step (min / median) | "
             "tokens/s (median) | TFLOP/s (median) | MFU (median / best) | compile s |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mfu = (f"{100 * r['mfu_median']:.1f} / {100 * r['mfu_best']:.1f} %" if "mfu_median" in r else "–")
        lines.append(f"| {r['model']} | {r['mode']} | {r['dtype']} | {r['rows']} × {r['length']} | "
                     f"{r['tokens_per_step']:,} | {r['gflop_per_step']:,.0f} | {r['step_ms_min']:.2f} / "
                     f"{r['step_ms_median']:.2f} | {r['tokens_per_s_median']:,.0f} | {r['tflops_median']:.1f} | "
                     f"{mfu} | {r['compile_and_first_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import jax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", choices=["tiny", "smollm2-135m"])
    parser.add_argument("--modes", nargs="+", default=["lora-all", "lora-all-attached"],
                        choices=["lora-all", "lora-all-attached", "lora", "full"])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--rows", nargs="+", type=int, default=[32, 128, 512])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=120.0, help="no case starts after this many seconds")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/imaginer_mfu"))
    args = parser.parse_args()
    device = jax.devices()[0].device_kind
    peak = args.peak_tflops or device_peak(device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start, rows = time.perf_counter(), []
    for dtype in args.dtypes:
        for mode in args.modes:
            for count in args.rows:
                if time.perf_counter() - start > args.seconds:
                    print(f"budget spent: {dtype} {mode} rows={count} not measured", flush=True)
                    continue
                rows.append(measure(args.model, mode, dtype, count, args.length, args.steps, peak))
                print(json.dumps(rows[-1]), flush=True)
                args.out.with_suffix(".json").write_text(json.dumps(
                    {"device": device, "peak_tflops": peak, "jax": jax.__version__, "rows": rows}, indent=1))
                args.out.with_suffix(".md").write_text(markdown(device, peak, rows))
    print(markdown(device, peak, rows), flush=True)


if __name__ == "__main__":
    main()
