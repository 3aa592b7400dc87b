"""End-to-end fingerprint of the whole protocol, to show that a refactor left every result bitwise unchanged.

    python experiments/benchmarks/protocol_fingerprint.py save DIR
    python experiments/benchmarks/protocol_fingerprint.py compare DIR_A DIR_B
    python experiments/benchmarks/protocol_fingerprint.py recollect DIR   # rebuild DIR/fingerprint only

``save`` runs the protocol on small budgets through the package's public surface only — the command line
(the ``imaginejax`` script's entry point, read from ``[project.scripts]`` of the repository's
pyproject.toml and run with this interpreter, so a moved ``cli`` module needs no reinstall) and the top-level
``imaginejax.fit`` / ``imaginejax.Policy`` (plus ``imaginejax.data.load_dataset`` to hold a dataset in
memory) — with ``IMAGINEJAX_HOME`` set to the fresh directory ``DIR/home``, so data collection, the
imaginer and every run are reproduced from nothing. Internal module paths of the package are never
imported, so the same script measures the code before and after its modules move. The stages
(``DIR/work/<stage>``; each command's stdout is kept as ``DIR/work/<stage>.stdout``, its stderr as
``.stderr``):

1. ``collect``: ``imaginejax collect`` of 24 BabyAI trajectories (no instruction embeddings);
2. ``clevr-bench``: ``imaginejax bench`` on the clevr-quick preset with BC and CQL, 2 seeds, 40 updates:
   64 real expert trajectories (embedded by the sentence encoder), a 2-layer imaginer fine-tuned for 4
   steps writing 8 imaginary rollouts of the easy level, the conditions real / real + imaginary, the train
   and easy levels evaluated, the table and figures (their CSV data);
3. ``clevr-report``: ``imaginejax report`` of that workspace with another statistic, seed and window;
4. ``export`` + ``evaluate``: one CQL run of it as a policy directory, evaluated on the easy level;
5. ``cheetah-train``: ``imaginejax train`` on the cheetah-quick preset (continuous actions, MuJoCo C
   expert) with TD3+BC and PRDC on real and real + oracle data of the easy level (``imagine.source=oracle``:
   expert rollouts of the novel level, collected);
6. ``fit``: ``imaginejax.fit`` of BC on the collected BabyAI dataset held in memory, its runs, a policy of
   it saved and loaded back with ``imaginejax.Policy.load`` and its actions on the dataset's first states.

Every sweep runs under ``train.memory_budget_mb=2048`` so its chunking does not follow the free memory.

What is kept (``DIR/fingerprint/``): ``arrays.npz`` + ``arrays.json`` (the arrays, by name) and
``records.json`` (everything else), built from every file the stages wrote under ``DIR/work`` and
``DIR/home``: arrays of ``.npz`` and ``.safetensors`` files and of the last checkpoint step of each
orbax checkpoint folder (``<step>/arrays/tree``, read with orbax itself); contents of ``.json``,
``.jsonl``, ``.csv``, ``.md``, ``.txt`` files and of each command's stdout; the names of all other files
(pictures, logs, the checkpoints' own files). Left out, so that two runs of the same code agree:

* values under keys that are wall-clock times or rates (``seconds``, ``created_at``, ``tokens_per_s`` ...,
  see ``TIME_KEY``); CSV columns and checkpoint arrays alike (a checkpoint's ``history/seconds``);
* the SHA-256 of ``.npz`` files in dataset manifests (a zip member records its write time; the arrays
  themselves are kept) and the list of orbax's own files in a checkpoint manifest (random names);
* ``train.log`` / ``*.log`` and stderr (timings, progress bars);
* absolute paths: ``DIR``, the repository and the interpreter's prefix become ``<DIR>``, ``<REPO>``,
  ``<PREFIX>``.

``timings.json`` records how long each stage took; ``compare`` ignores it.

``compare`` prints one line per item (an array, or a file's record): ``bitwise equal``, or the largest
difference and where it is; items present on one side only are differences. Exit status 1 on any
difference, 0 when everything is bitwise equal.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FINGERPRINT = "fingerprint"
# Keys (and CSV columns) whose values are wall-clock times, dates or rates: never part of a fingerprint.
TIME_KEY = re.compile(r"(^|[_/ .-])(seconds|secs|time|times|timestamp|created_at|created|date|elapsed|duration|wall"
                      r"|eta)$|per_s$|per_second$|/s$")
SKIP_SUFFIXES = (".log", ".png", ".gif", ".jpg", ".svg", ".stderr")

SMALL_NET = ["train.encoder_width=16", "train.hidden=[16]", "train.memory_budget_mb=2048",
             "logging.progress=lines", "report.reps=200"]
TINY_IMAGINER = ("imagine.finetune={num_steps = 4, log_every = 2, checkpoint_every = 4, architecture = "
                 "{hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4, "
                 "num_key_value_heads = 2, max_position_embeddings = 2048, tie_word_embeddings = true}}")


def sets(*assignments: str) -> list[str]:
    return [arg for a in assignments for arg in ("--set", a)]


def stages(work: Path) -> list[tuple[str, list[str]]]:
    """(stage name, imaginejax arguments) of the command-line stages, in order."""
    return [
        ("collect", ["collect", "--env", "babyai", "--level", "train", "--episodes", "24", "--out",
                     str(work / "collect"), "--no-embed", "--seed", "0"]),
        ("clevr-bench", ["bench", "--preset", "clevr-quick", "--out", str(work / "clevr-bench")] + sets(
            'train.algos=["bc", "cql"]', "data.episodes=64", "imagine.episodes=8", "imagine.chunk_size=8",
            'imagine.levels=["easy"]', TINY_IMAGINER, "train.seeds=2", "train.updates=40", "train.intervals=2",
            "train.eval_episodes=8", "train.batch_size=32", 'train.conditions=["real", "imaginary"]',
            'train.eval_levels=["train", "easy"]', "report.last=2", *SMALL_NET)),
        ("clevr-report", ["report", str(work / "clevr-bench"), "--statistic", "mean", "--reps", "300", "--seed", "3",
                          "--last", "1", "--no-figures", "--out", str(work / "clevr-report.md")]),
        ("export", ["export", str(work / "clevr-bench"), "--algo", "cql", "--seed", "1", "--data", "imaginary/easy",
                    "--out", str(work / "export")]),
        ("evaluate", ["evaluate", str(work / "export"), "--level", "easy", "--episodes", "16", "--seed", "2"]),
        ("cheetah-train", ["train", "--preset", "cheetah-quick", "--algo", "td3bc", "--algo", "prdc", "--out",
                           str(work / "cheetah-train")] + sets(
            "data.episodes=16", "imagine.source=oracle", "imagine.episodes=4", 'imagine.levels=["easy"]',
            "train.seeds=2", "train.updates=40", "train.intervals=2", "train.eval_episodes=4", "train.batch_size=32",
            'train.conditions=["real", "imaginary"]', 'train.eval_levels=["train", "easy"]', *SMALL_NET)),
    ]


FIT_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import numpy as np
    import imaginejax
    from imaginejax.data import load_dataset

    work = Path(sys.argv[1])
    real = load_dataset(work / "collect")  # a TrajectoryDataset in memory
    results = imaginejax.fit("bc", env="babyai", real=real, seeds=2, updates=20, intervals=2, batch_size=16,
                             eval_episodes=6, out=work / "fit",
                             overrides=["data.embed=false", "train.encoder_width=16", "train.hidden=[16]",
                                        "train.memory_budget_mb=2048"], log=lambda message: None)
    out = work / "fit-results"
    out.mkdir()
    runs = [{"algo": r.algo, "run": r.run, "config": r.config, "seed": r.seed, "ratio": r.ratio, "hp": r.hp,
             "data": r.data, "steps": list(r.steps), "success": {k: list(v) for k, v in r.success.items()},
             "returns": {k: list(v) for k, v in r.returns.items()},
             "task_success": {k: list(v) for k, v in r.task_success.items()}, "finite": r.finite}
            for r in results.runs]
    (out / "results.json").write_text(json.dumps({"runs": runs, "levels": list(results.levels),
                                                  "table": imaginejax.table(results)}, indent=1))
    policy = imaginejax.Policy.from_results(results, seed=1)
    policy.save(work / "fit-policy")
    loaded = imaginejax.Policy.load(work / "fit-policy")
    obs = np.asarray(real.states[:, 0], np.float32)
    np.savez(out / "actions.npz", in_memory=np.asarray(policy.predict(obs)), loaded=np.asarray(loaded.predict(obs)),
             **{"tensor/" + k: np.asarray(v) for k, v in loaded.tensors.items()})
    print(f"fit: {len(runs)} runs, policy {policy.algo} with {len(loaded.tensors)} tensors")
""")


# ------------------------------------------------------------------------------------------------ save


def cli_entry() -> tuple[str, str]:
    """(module, function) of the ``imaginejax`` script, from the repository's pyproject.toml."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, func = scripts["imaginejax"].partition(":")
    return module, func


def run_stage(name: str, argv: list[str], env: dict[str, str], work: Path, python_code: str | None = None) -> float:
    if python_code is None:
        module, func = cli_entry()
        code = f"import sys; from {module} import {func}; sys.exit({func}(sys.argv[1:]))"
    else:
        code = python_code
    start = time.perf_counter()
    with open(work / f"{name}.stdout", "w") as out, open(work / f"{name}.stderr", "w") as err:
        status = subprocess.run([sys.executable, "-c", code, *argv], stdout=out, stderr=err, env=env,
                                cwd=work).returncode
    seconds = time.perf_counter() - start
    if status != 0:
        tail = (work / f"{name}.stderr").read_text()[-3000:]
        raise SystemExit(f"stage {name} failed (exit {status}) after {seconds:.0f}s:\n{tail}")
    print(f"{name}: {seconds:.0f}s", flush=True)
    return seconds


def save(directory: Path) -> None:
    directory = directory.resolve()
    if directory.exists() and any(directory.iterdir()):
        raise SystemExit(f"{directory} is not empty: save into a new directory")
    work, home = directory / "work", directory / "home"
    work.mkdir(parents=True)
    home.mkdir()
    env = dict(os.environ, IMAGINEJAX_HOME=str(home), PYTHONHASHSEED="0", TQDM_DISABLE="1")
    timings: dict[str, float] = {}
    total = time.perf_counter()
    for name, argv in stages(work):
        timings[name] = run_stage(name, argv, env, work)
    timings["fit"] = run_stage("fit", [str(work)], env, work, python_code=FIT_SCRIPT)
    timings["total"] = time.perf_counter() - total
    write_fingerprint(directory, timings)


def write_fingerprint(directory: Path, timings: dict[str, float] | None = None) -> None:
    """DIR/fingerprint/ from the files under DIR/work and DIR/home (again, after a change of what is kept:
    ``recollect DIR``; the stages' timings stay)."""
    directory = directory.resolve()
    out = directory / FINGERPRINT
    if timings is None:
        timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").is_file() else {}
    start = time.perf_counter()
    arrays, records = collect(directory)
    out.mkdir(exist_ok=True)
    names = sorted(arrays)
    np.savez(out / "arrays.npz", **{f"a{i:05d}": arrays[n] for i, n in enumerate(names)})
    (out / "arrays.json").write_text(json.dumps({f"a{i:05d}": n for i, n in enumerate(names)}, indent=1))
    (out / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True))
    timings["fingerprint"] = time.perf_counter() - start
    (out / "timings.json").write_text(json.dumps(timings, indent=1))
    print(f"{len(arrays)} arrays, {len(records)} records -> {out} (stages and fingerprint: "
          f"{timings.get('total', 0) + timings['fingerprint']:.0f}s)")


class Scrubber:
    """Absolute paths -> placeholders; time keys dropped."""

    def __init__(self, directory: Path):
        pairs = [(str(directory), "<DIR>"), (str(REPO), "<REPO>"), (sys.prefix, "<PREFIX>"),
                 (str(Path(sys.prefix).resolve()), "<PREFIX>")]
        self.pairs = sorted(pairs, key=lambda p: -len(p[0]))

    def text(self, value: str) -> str:
        for path, mark in self.pairs:
            value = value.replace(path, mark)
        return value

    def json(self, value: Any) -> Any:
        if isinstance(value, dict):
            # An .npz file's SHA-256 follows the clock: zip members carry their write time.
            npz = str(value.get("file", "")).endswith(".npz")
            return {self.text(k): self.json(v) for k, v in value.items()
                    if not TIME_KEY.search(str(k)) and not (npz and k == "sha256")}
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value


def collect(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every array and record of the files under DIR/work and DIR/home (see the module docstring)."""
    scrub = Scrubber(directory)
    arrays: dict[str, np.ndarray] = {}
    records: dict[str, Any] = {}
    other: list[str] = []
    checkpoint_dirs: set[Path] = set()
    files = sorted(p for p in directory.rglob("*") if p.is_file() and FINGERPRINT not in p.relative_to(directory).parts)
    for path in files:
        rel = scrub.text(path.relative_to(directory).as_posix())
        parts = path.relative_to(directory).parts
        # An orbax step directory: <folder>/<step>/_CHECKPOINT_METADATA; its files are read as one checkpoint.
        step = next((path.parents[i] for i in range(len(parts) - 1)
                     if (path.parents[i] / "_CHECKPOINT_METADATA").is_file()), None)
        if step is not None:
            checkpoint_dirs.add(step)
            if path.parent == step / "arrays" and path.name == "manifest.json":
                manifest = json.loads(path.read_text())
                manifest.pop("files", None)  # orbax's own files: random names, write-time metadata
                records[rel] = scrub.json(manifest)
            continue
        suffix = path.suffix
        if path.name.endswith(SKIP_SUFFIXES):
            other.append(rel)
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                for key in data.files:
                    arrays[f"{rel}::{key}"] = data[key]
        elif suffix == ".safetensors":
            from safetensors.numpy import load_file

            for key, value in sorted(load_file(path).items()):
                arrays[f"{rel}::{key}"] = value
        elif suffix == ".json":
            records[rel] = scrub.json(json.loads(path.read_text()))
        elif suffix == ".jsonl":
            records[rel] = [scrub.json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        elif suffix == ".csv":
            rows = list(csv.reader(io.StringIO(path.read_text())))
            keep = [i for i, name in enumerate(rows[0]) if not TIME_KEY.search(name)] if rows else []
            records[rel] = [[scrub.text(row[i]) for i in keep if i < len(row)] for row in rows]
        elif suffix in (".md", ".txt", ".stdout"):
            records[rel] = scrub.text(path.read_text()).splitlines()
        else:
            other.append(rel)
    for step_dir in sorted(checkpoint_dirs):
        folder = step_dir.parent
        latest = max((d for d in folder.iterdir() if (d / "_CHECKPOINT_METADATA").is_file()), key=lambda d: d.name)
        if step_dir != latest:
            continue
        rel = scrub.text(step_dir.relative_to(directory).as_posix())
        for key, value in sorted(_flatten(restore_orbax(step_dir)).items()):
            if not TIME_KEY.search(key):  # e.g. history/seconds: each interval's wall-clock time
                arrays[f"{rel}::{key}"] = value
    records["(other files)"] = sorted(other)
    records["(checkpoint steps)"] = sorted(scrub.text(d.relative_to(directory).as_posix()) for d in checkpoint_dirs)
    return arrays, records


def restore_orbax(step_dir: Path) -> Any:
    """The arrays of one orbax checkpoint step (``arrays/tree``, else the step itself), read by orbax."""
    import orbax.checkpoint as ocp

    tree = step_dir / "arrays" / "tree"
    target = tree if tree.is_dir() else next((p for p in step_dir.iterdir() if p.is_dir()), step_dir)
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        return checkpointer.restore(target)
    finally:
        checkpointer.close()


def _flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """A nested dict / list of arrays -> {"a/b/0": array}."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: np.asarray(tree)}
    out: dict[str, np.ndarray] = {}
    for key, value in items:
        out.update(_flatten(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


# --------------------------------------------------------------------------------------------- compare


def load(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    out = Path(directory) / FINGERPRINT
    names = json.loads((out / "arrays.json").read_text())
    with np.load(out / "arrays.npz", allow_pickle=False) as data:
        arrays = {names[k]: data[k] for k in data.files}
    return arrays, json.loads((out / "records.json").read_text())


def array_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    """None when bitwise equal, else the largest difference and where."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"dtype/shape {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.tobytes() == b.tobytes():
        return None
    if a.dtype.kind in "fc":
        da, db = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(da - db)
        nan_mismatch = np.isnan(da) != np.isnan(db)
        diff = np.where(nan_mismatch, np.inf, np.nan_to_num(diff, nan=0.0))
    elif a.dtype.kind in "iub":
        diff = np.abs(a.astype(np.int64) - b.astype(np.int64)).astype(np.float64)
    else:
        diff = (a != b).astype(np.float64)
    where = np.unravel_index(int(np.argmax(diff)), a.shape) if a.shape else ()
    count = int((a != b).sum()) if a.dtype.kind not in "fc" else int((diff != 0).sum())
    return (f"{count} of {a.size} elements differ, largest {float(diff[where]) if a.shape else float(diff):.6g} "
            f"at {list(map(int, where))}: {a[where]!r} vs {b[where]!r}")


def record_difference(a: Any, b: Any, where: str = "") -> tuple[float, str] | None:
    """None when equal; else (size, description) of the largest difference (size inf: not numeric)."""
    if isinstance(a, dict) and isinstance(b, dict):
        worst = None
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                found = (math.inf, f"{where}/{key}: only in {'A' if key in a else 'B'}")
            else:
                found = record_difference(a[key], b[key], f"{where}/{key}")
            if found and (worst is None or found[0] > worst[0]):
                worst = found
        return worst
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return math.inf, f"{where}: length {len(a)} vs {len(b)}"
        worst = None
        for i, (x, y) in enumerate(zip(a, b)):
            found = record_difference(x, y, f"{where}[{i}]")
            if found and (worst is None or found[0] > worst[0]):
                worst = found
        return worst
    if type(a) is type(b) and a == b:
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(float(a) - float(b)), f"{where}: {a!r} vs {b!r}"
    if isinstance(a, str) and isinstance(b, str):
        numbers = _numeric_text_difference(a, b)
        if numbers is not None:
            return numbers[0], f"{where}: {numbers[1]}"
    return math.inf, f"{where}: {_short(a)} vs {_short(b)}"


def _numeric_text_difference(a: str, b: str) -> tuple[float, str] | None:
    """Two texts that differ only in numbers: the largest numeric difference."""
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    if re.sub(number, "#", a) != re.sub(number, "#", b):
        return None
    worst = None
    for x, y in zip(re.findall(number, a), re.findall(number, b)):
        if x != y:
            d = abs(float(x) - float(y))
            if worst is None or d > worst[0]:
                worst = (d, f"{x} vs {y} in {_short(a)!s}")
    return worst


def _short(value: Any, n: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2:]


def _record_message(a: Any, b: Any) -> str | None:
    """None when equal, else 'differs (<largest difference, or not numeric>) at <where>'."""
    found = record_difference(a, b)
    if found is None:
        return None
    size = "not numeric" if math.isinf(found[0]) else f"largest difference {found[0]:.6g}"
    return f"differs ({size}) at {found[1]}"


def compare(dir_a: Path, dir_b: Path) -> int:
    arrays_a, records_a = load(dir_a)
    arrays_b, records_b = load(dir_b)
    differences = total = 0
    for kind, items_a, items_b, difference in (("array", arrays_a, arrays_b, array_difference),
                                               ("record", records_a, records_b, _record_message)):
        for name in sorted(set(items_a) | set(items_b)):
            total += 1
            if name not in items_a or name not in items_b:
                found = f"only in {'A' if name in items_a else 'B'}"
            else:
                found = difference(items_a[name], items_b[name])
            print(f"{kind} {name}: {'bitwise equal' if found is None else found}")
            differences += found is not None
    print(f"\n{total - differences} of {total} items bitwise equal; {differences} differ")
    return 1 if differences else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("save", help="run the protocol and save its fingerprint into DIR (new or empty)")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("recollect", help="rebuild DIR/fingerprint from the files a save left (no rerun)")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("compare", help="compare two saved fingerprints; exit 1 on any difference")
    p.add_argument("dir_a", type=Path)
    p.add_argument("dir_b", type=Path)
    args = parser.parse_args(argv)
    if args.command == "save":
        save(args.dir)
        return 0
    if args.command == "recollect":
        write_fingerprint(args.dir)
        return 0
    return compare(args.dir_a, args.dir_b)


if __name__ == "__main__":
    raise SystemExit(main())
