"""The suite on one accelerator, measured against the alternatives on the same machine, in one bounded run.

    python experiments/accelerator/driver.py --out DIR [--stages info matmul train engine envs imaginer bench]
                                             [--budget 450] [--dry-run] [--no-d3rlpy]

Started by ``run.sh`` on a GPU machine (which installs the carried wheels first); ``--dry-run`` runs every
stage at tiny sizes on whatever JAX finds (a CPU here), so the script is tested where no GPU is.

Stages, each with a share of ``--budget`` seconds (a stage past its share skips what is left and says so):

* ``info``: device, memory, versions, host cores, load average.
* ``matmul``: the device's measured matmul peak (``jnp.dot`` of n × n matrices, float32 at XLA's default
  precision — what the algorithms use — and bfloat16), the denominator of every "% of peak".
* ``train``: every algorithm at R runs in one call against d3rlpy on the same device (``train_stage.py``).
* ``engine``: the engine's interval against the bare update scan at the same R, without and with evaluation
  (``experiments/benchmarks/engine_overhead.py``; goal: ≥ 80 % of the bare rate without evaluation).
* ``envs``: CLEVR and BabyAI at large batches; MJX HalfCheetah, Meta-World and LIBERO against MuJoCo C on
  all host cores (``env_stage.py``).
* ``imaginer``: fine-tuning and generation tokens/s against transformers (``imaginer_stage.py``).
* ``bench``: the quick CLEVR protocol, ``imaginejax bench --preset clevr-quick``, wall time.

Writes ``DIR/accelerator.json`` (everything) and ``DIR/accelerator.md`` (the tables) after every stage, so a
run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "benchmarks"))

# JAX takes this share of the device's memory at start; the rest serves PyTorch (d3rlpy, transformers) in
# the same run and the bench stage's own JAX process.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.45")

STAGES = ("info", "matmul", "train", "engine", "envs", "imaginer", "bench")
SHARES = {"info": 0.01, "matmul": 0.03, "train": 0.40, "engine": 0.10, "envs": 0.32, "imaginer": 0.24, "bench": 0.25}


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What each stage measures; :data:`GPU` and :data:`DRY` are the two settings."""

    peak_size: int = 8192
    algos: tuple[str, ...] = ()  # () = every registered algorithm
    runs: tuple[int, ...] = (1, 8, 64, 512)
    updates: int = 100
    repeats: int = 3
    dataset_size: int = 50_000
    compile_threads: int = 8
    train_timing_reserve: float = 50.0
    d3rlpy: bool = True
    d3rlpy_device: str = "cuda:0"
    d3rlpy_procs: int = 8
    d3rlpy_updates: int = 2000
    d3rlpy_seconds: float = 1.5
    d3rlpy_repeats: int = 2
    d3rlpy_warmup: int = 5
    d3rlpy_reserve: float = 45.0
    jax_envs: tuple[str, ...] = ("clevr", "babyai")
    jax_batches: tuple[int, ...] = (1024, 16384, 262144, 1048576)
    env_steps: int = 20
    mjx_cases: tuple[tuple[str, str | None], ...] = (("cheetah", None), ("metaworld", "reach"),
                                                     ("metaworld", "pick-place"), ("libero", None))
    mjx_batches: tuple[int, ...] = (1024, 4096, 16384)
    mjx_steps: int = 5
    c_batch: int = 1024
    mjx_reserve: float = 60.0
    mjx_timing_reserve: float = 25.0
    imaginer_models: tuple[str, ...] = ("tiny", "smollm2-135m")
    ft_batch: int = 16
    ft_length: int = 256
    gen_batches: tuple[int, ...] = (1, 64)
    gen_prompt: int = 64
    gen_new: int = 64
    generation_reserve: float = 20.0
    torch_device: str = "cuda"
    engine_algos: tuple[str, ...] = ("bc", "cql")
    engine_runs: tuple[int, ...] = (8, 64)
    engine_updates: int = 1000
    engine_eval_episodes: int = 80
    bench_preset: str = "clevr-quick"
    bench_overrides: tuple[str, ...] = ()


GPU = Sizes()
DRY = Sizes(peak_size=256, algos=("bc", "td3bc"), runs=(1, 2), updates=2, repeats=2, dataset_size=512,
            compile_threads=2, train_timing_reserve=0.0, d3rlpy_device="cpu", d3rlpy_procs=2, d3rlpy_updates=3,
            d3rlpy_seconds=1.0, d3rlpy_repeats=1, d3rlpy_warmup=1, d3rlpy_reserve=0.0, jax_batches=(8,), env_steps=2,
            mjx_cases=(("cheetah", None),), mjx_batches=(2,), mjx_steps=1, c_batch=2, mjx_reserve=0.0,
            mjx_timing_reserve=0.0, imaginer_models=("tiny",), ft_batch=2, ft_length=64, gen_batches=(1,),
            gen_prompt=8, gen_new=4, generation_reserve=0.0, torch_device="cpu", engine_algos=("bc",),
            engine_runs=(2,), engine_updates=2, engine_eval_episodes=4,
            bench_overrides=("data.episodes=20", "imagine.episodes=4", "imagine.finetune={num_steps = 2, "
                             "warmup_steps = 1, log_every = 1, checkpoint_every = 2}", "train.seeds=2",
                             "train.updates=4", "train.intervals=2", "train.eval_episodes=1",
                             "train.algos=[\"bc\"]"))


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------------------------------ stages


def stage_info(sizes: Sizes, budget: Any) -> dict[str, Any]:
    import jax

    device = jax.devices()[0]
    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "platform": device.platform,
        "device": getattr(device, "device_kind", str(device)), "device_count": jax.device_count(),
        "memory_bytes": (device.memory_stats() or {}).get("bytes_limit"),
        "jax": jax.__version__, "python": platform.python_version(), "host_cores": os.cpu_count(),
        "load_average": os.getloadavg()}
    for package in ("jaxlib", "flax", "optax", "mujoco", "mujoco_mjx", "torch", "transformers", "d3rlpy"):
        try:
            from importlib.metadata import version

            info[package] = version(package.replace("_", "-"))
        except Exception:  # noqa: BLE001 - not installed
            info[package] = None
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = None
    log(f"device {info['device']} ({info['platform']}), jax {info['jax']}, {info['host_cores']} host cores")
    return info


def stage_matmul(sizes: Sizes, budget: Any) -> dict[str, Any]:
    from matmul_peak import matmul_peak

    out: dict[str, Any] = {"size": sizes.peak_size}
    for dtype in ("float32", "bfloat16"):
        out[dtype] = matmul_peak(sizes.peak_size, 7, dtype=dtype)
        log(f"matmul peak {dtype}: {out[dtype] / 1e12:.1f} TFLOP/s")
    return out


def stage_engine(sizes: Sizes, budget: Any) -> dict[str, Any]:
    """``engine_overhead.py``'s contenders (bare scan, interval, interval + evaluation, trainer) for each
    algorithm and R, alternated ``sizes.repeats`` times; what the budget leaves out is listed as skipped."""
    import jax
    from engine_overhead import CONTENDERS, SHAPES, measure, random_transitions

    from imaginejax import envs
    from imaginejax.lang import encode_instructions

    level = envs.make("clevr", "train", embed=encode_instructions)
    data = random_transitions(jax.random.PRNGKey(1), SHAPES[1], sizes.dataset_size)
    rows, skipped = [], []
    for name in sizes.engine_algos:
        for runs in sizes.engine_runs:
            if budget.expired():
                skipped.append(f"{name} R={runs}: budget spent")
                continue
            rows += [{"algorithm": name, "runs": runs, "contender": r["contender"],
                      "seed_updates_per_s": r["updates_per_s_median"], "share_of_bare": r["share_of_bare_median"],
                      "seconds": r["samples"]}
                     for r in measure(name, runs, sizes.engine_updates, sizes.engine_eval_episodes, 3, sizes.repeats,
                                      data, level)]
            log(f"engine {name} R={runs}: " + ", ".join(f"{r['contender']} {r['share_of_bare']:.0%}"
                                                       for r in rows[-len(CONTENDERS):]))
    return {"updates": sizes.engine_updates, "eval_episodes": sizes.engine_eval_episodes, "rows": rows,
            "skipped": skipped}


def stage_bench(sizes: Sizes, budget: Any, work: Path) -> dict[str, Any]:
    """``imaginejax bench`` in a fresh process, home and workspace under ``work``, wall time, stopped at the
    stage's budget; its log is ``work/bench.log``."""
    workspace = work / "bench-workspace"
    command = [sys.executable, "-m", "imaginejax.cli", "bench", "--env", "clevr", "--preset", sizes.bench_preset,
               "--out", str(workspace), *[arg for o in sizes.bench_overrides for arg in ("--set", o)]]
    env = dict(os.environ, IMAGINEJAX_HOME=str(work / "bench-home"), XLA_PYTHON_CLIENT_MEM_FRACTION="0.4")
    start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / "bench.log"
    with open(log_path, "w", encoding="utf-8") as handle:
        try:
            result = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                    timeout=max(5.0, budget.left()), check=False)
            status = "finished" if result.returncode == 0 else f"failed (exit {result.returncode})"
        except subprocess.TimeoutExpired:
            status = "stopped at the budget"
    seconds = time.perf_counter() - start
    tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
    log(f"bench {sizes.bench_preset}: {status} after {seconds:.0f} s")
    return {"preset": sizes.bench_preset, "overrides": list(sizes.bench_overrides), "status": status,
            "wall_seconds": seconds, "log_tail": tail}


# ------------------------------------------------------------------------------------------ tables


def _f(x: Any, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _nan(x: float) -> str:
    return "no counterpart" if x != x else f"{x:,.1f}"


def markdown(results: dict[str, Any]) -> str:
    """The Markdown tables of whatever stages are in ``results``."""
    info = results["stages"].get("info", {}).get("result", {})
    lines = [f"Device: {info.get('device')} ({info.get('platform')}), {info.get('date')}, JAX {info.get('jax')}, "
             f"{info.get('host_cores')} host cores; budget {results['budget']:.0f} s"
             f"{' (dry run)' if results['dry_run'] else ''}.", ""]
    for name, stage in results["stages"].items():
        lines.append(f"- stage `{name}`: {stage['status']} in {stage['seconds']:.0f} s"
                     + (f" — {stage['error'].splitlines()[-1]}" if stage.get("error") else ""))
    matmul = results["stages"].get("matmul", {}).get("result")
    if matmul:
        lines += ["", f"Matmul peak ({matmul['size']}²): float32 {matmul['float32'] / 1e12:.1f} TFLOP/s, "
                      f"bfloat16 {matmul['bfloat16'] / 1e12:.1f} TFLOP/s."]
    train = results["stages"].get("train", {}).get("result")
    if train:
        lines += ["", "| algorithm | actions | R | seed-updates/s | % of f32 peak | compile s |",
                  "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['algorithm']} | {r['action_space']} | {r['runs']} | {_f(r['seed_updates_per_s'])} | "
                  f"{_f(r['percent_of_peak'], 2)} | {_f(r['compile_seconds'], 1)} |" for r in train["rows"]]
        d3 = train.get("d3rlpy", {})
        if d3.get("rows"):
            n = next((r.get("processes") for r in d3["rows"] if r.get("processes")), "N")
            lines += ["", f"| algorithm | actions | JAX R=1 | d3rlpy 1 process | ratio | JAX R={n} | "
                          f"d3rlpy {n} processes | ratio |", "|---|---|---:|---:|---:|---:|---:|---:|"]
            for r in d3["rows"]:
                if "d3rlpy_one_process" not in r:
                    lines.append(f"| {r['algorithm']} | {r['action_space']} | {r.get('note', '')} |||||| ")
                    continue
                lines.append(f"| {r['algorithm']} | {r['action_space']} | {_f(r['jax_r1'])} | "
                             f"{_f(r['d3rlpy_one_process'])} | {_f(r['ratio_one'], 1)}× | {_f(r['jax_r_procs'])} | "
                             f"{_f(r['d3rlpy_processes_total'])} | {_f(r['ratio_procs'], 1)}× |")
        elif d3.get("note"):
            lines += ["", f"d3rlpy: {d3['note']}"]
        lines += ["", f"Reference protocol (5 environments × 4 levels × 3 data conditions × 5 seeds × "
                      f"{PROTOCOL_UPDATES:,} updates per algorithm), hours of gradient updates on this device:", "",
                  "| algorithm | ours (60 runs per call) | d3rlpy, runs one after another | d3rlpy, "
                  "processes at once |", "|---|---:|---:|---:|"]
        for r in projection(train):
            lines.append(f"| {r['algorithm']}{'' if r['complete'] else ' (partial)'} | {_f(r['ours_hours'], 1)} | "
                         f"{_nan(r['d3rlpy_sequential_hours'])} | {_nan(r['d3rlpy_parallel_hours'])} |")
        for s in train.get("skipped", []) + train.get("failures", []):
            lines.append(f"- skipped: {s}")
    engine = results["stages"].get("engine", {}).get("result")
    if engine:
        lines += ["", f"Engine against the bare update scan ({engine['updates']:,} updates per interval, evaluation "
                      f"{engine['eval_episodes']} episodes per run on CLEVR train):", "",
                  "| algorithm | R | contender | seed-updates/s | share of the bare scan |", "|---|---:|---|---:|---:|"]
        lines += [f"| {r['algorithm']} | {r['runs']} | {r['contender']} | {_f(r['seed_updates_per_s'])} | "
                  f"{r['share_of_bare']:.0%} |" for r in engine["rows"]]
        lines += [f"- skipped: {s}" for s in engine.get("skipped", [])]
    envs = results["stages"].get("envs", {}).get("result")
    if envs:
        lines += ["", "| env | backend | batch | steps/s | MuJoCo C steps/s (batch) | ratio | compile s |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in envs["rows"]:
            if "error" in r:
                lines.append(f"| {r['env']} | {r['backend']} | {r['batch']} | {r['error'][:80]} |||| ")
                continue
            c = (f"{_f(r['mujoco_c_steps_per_s'])} ({r['mujoco_c_batch']})" if "ratio" in r else "—")
            lines.append(f"| {r['env']} | {r['backend']} | {r['batch']:,} | {_f(r['steps_per_s'])} | {c} | "
                         f"{_f(r.get('ratio'), 2)} | {_f(r['compile_seconds'], 1)} |")
        lines += [f"- skipped: {s}" for s in envs.get("skipped", [])]
    imaginer = results["stages"].get("imaginer", {}).get("result")
    if imaginer:
        lines += ["", "| model | fine-tuning | ours LM tokens/s | PyTorch tokens/s | ratio | ours KALM tokens/s |",
                  "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['mode']} | {_f(r.get('ours_lm_tokens_per_s'))} | "
                  f"{_f(r.get('torch_lm_tokens_per_s'))} | {_f(r.get('ratio_lm'), 2)}× | "
                  f"{_f(r.get('ours_kalm_tokens_per_s'))} |" for r in imaginer["finetune"]]
        lines += ["", "| model | batch | ours generation tokens/s | PyTorch tokens/s | ratio |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['model']} | {r['batch']} | {_f(r.get('ours_tokens_per_s'))} | "
                  f"{_f(r.get('torch_tokens_per_s'))} | {_f(r.get('ratio'), 2)}× |" for r in imaginer["generation"]]
    bench = results["stages"].get("bench", {}).get("result")
    if bench:
        lines += ["", f"`imaginejax bench --preset {bench['preset']}`: {bench['status']}, "
                      f"{bench['wall_seconds']:.0f} s wall clock."]
    return "\n".join(lines) + "\n"


# The reference protocol (BENCHMARK.md §1, §4): per environment and algorithm, 4 levels × 3 data conditions
# × 5 seeds, 500k gradient updates each (the d3rlpy path's schedule).
PROTOCOL_ENVS = {"clevr": "discrete", "babyai": "discrete", "cheetah": "continuous", "metaworld": "continuous",
                 "libero": "continuous"}
PROTOCOL_RUNS, PROTOCOL_UPDATES = 4 * 3 * 5, 500_000


def projection(train: dict[str, Any]) -> list[dict[str, Any]]:
    """Hours of gradient updates for the reference protocol on this device, per algorithm.

    Ours: each (environment, algorithm) sweep of 60 runs in one call, at the measured rate of the closest
    measured R ≥ 60 (else the largest). The reference: one process per run, the 60 runs one after another
    (d3rlpy's one-process rate) or ``processes`` at a time (its summed rate). Evaluation excluded.
    """
    rows = []
    rates: dict[tuple[str, str], dict[int, float]] = {}
    for r in train.get("rows", []):
        rates.setdefault((r["algorithm"], r["action_space"]), {})[r["runs"]] = r["seed_updates_per_s"]
    d3 = {(r["algorithm"], r["action_space"]): r for r in train.get("d3rlpy", {}).get("rows", [])
          if "d3rlpy_one_process" in r}
    for algorithm in sorted({a for a, _ in rates}):
        ours = theirs_seq = theirs_par = 0.0
        complete = True
        for env, space in PROTOCOL_ENVS.items():
            measured = rates.get((algorithm, space))
            if not measured:
                complete = False
                continue
            runs = min([r for r in measured if r >= PROTOCOL_RUNS] or [max(measured)])
            ours += PROTOCOL_RUNS * PROTOCOL_UPDATES / measured[runs]
            ref = d3.get((algorithm, space))
            if ref is None:
                theirs_seq = theirs_par = float("nan")
            else:
                theirs_seq += PROTOCOL_RUNS * PROTOCOL_UPDATES / ref["d3rlpy_one_process"]
                theirs_par += PROTOCOL_RUNS * PROTOCOL_UPDATES / ref["d3rlpy_processes_total"]
        rows.append({"algorithm": algorithm, "complete": complete, "ours_hours": ours / 3600,
                     "d3rlpy_sequential_hours": theirs_seq / 3600, "d3rlpy_parallel_hours": theirs_par / 3600})
    return rows


def write(out_dir: Path, results: dict[str, Any]) -> None:
    from imaginejax.core.files import write_json, write_text

    write_json(out_dir / "accelerator.json", results)
    write_text(out_dir / "accelerator.md", markdown(results))


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--budget", type=float, default=450.0, help="wall seconds for all stages together")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, any backend (a CPU test)")
    parser.add_argument("--no-d3rlpy", action="store_true")
    parser.add_argument("--algos", nargs="*", default=None, help="algorithms of the train stage (default: all)")
    parser.add_argument("--runs", nargs="*", type=int, default=None, help="run counts R of the train stage")
    parser.add_argument("--jax-envs", nargs="*", default=None, help="plain-JAX envs of the envs stage")
    parser.add_argument("--mjx-cases", nargs="*", default=None, metavar="ENV[:TASK]",
                        help="MJX cases of the envs stage, e.g. cheetah libero metaworld:reach")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch folder of the bench stage (default: OUT/work; keep it out of a folder whose "
                             "files are all fetched)")
    args = parser.parse_args()
    sizes = DRY if args.dry_run else GPU
    if args.no_d3rlpy:
        sizes = dataclasses.replace(sizes, d3rlpy=False)
    if args.algos is not None:
        sizes = dataclasses.replace(sizes, algos=tuple(args.algos))
    if args.runs is not None:
        sizes = dataclasses.replace(sizes, runs=tuple(args.runs))
    if args.jax_envs is not None:
        sizes = dataclasses.replace(sizes, jax_envs=tuple(args.jax_envs))
    if args.mjx_cases is not None:
        sizes = dataclasses.replace(sizes, mjx_cases=tuple((c.split(":") + [None])[:2] for c in args.mjx_cases))
    args.out.mkdir(parents=True, exist_ok=True)

    from budget import Budget

    import env_stage
    import imaginer_stage
    import train_stage

    results: dict[str, Any] = {"budget": args.budget, "dry_run": args.dry_run, "argv": sys.argv[1:],
                               "sizes": dataclasses.asdict(sizes), "stages": {}}
    overall = Budget(args.budget)
    peak = None
    for name in args.stages:
        remaining = [s for s in args.stages if s not in results["stages"]]
        share = SHARES[name] / sum(SHARES[s] for s in remaining)
        budget = Budget(max(1.0, overall.left() * share))
        log(f"stage {name}: {budget.seconds:.0f} s")
        runners: dict[str, Callable[[], Any]] = {
            "info": lambda: stage_info(sizes, budget),
            "matmul": lambda: stage_matmul(sizes, budget),
            "train": lambda: train_stage.run(sizes, budget, peak or 1.0, log),
            "engine": lambda: stage_engine(sizes, budget),
            "envs": lambda: env_stage.run(sizes, budget, log),
            "imaginer": lambda: imaginer_stage.run(sizes, budget, log),
            "bench": lambda: stage_bench(sizes, budget, args.work or args.out / "work"),
        }
        entry: dict[str, Any] = {"budget_seconds": budget.seconds}
        try:
            entry["result"] = runners[name]()
            entry["status"] = "ok"
        except Exception:  # noqa: BLE001 - a broken stage is recorded and the next one runs
            entry["status"] = "failed"
            entry["error"] = traceback.format_exc()
            log(f"stage {name} failed:\n{entry['error']}")
        entry["seconds"] = budget.spent()
        results["stages"][name] = entry
        if name == "matmul" and entry["status"] == "ok":
            peak = entry["result"]["float32"]
        write(args.out, results)
    print(markdown(results), flush=True)
    # Compilations left behind at a budget run on in pool threads; the results are written, so leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
