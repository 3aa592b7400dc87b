"""Imaginer fine-tuning throughput: tokens/s of our training steps vs a PyTorch transformers step.

    .venv/bin/python experiments/benchmarks/imaginer_finetune.py [--models tiny smollm2-135m]
        [--modes full lora] [--batch 8] [--length 128] [--steps 5] [--torch-threads 1 2]
        [--ref-python .venv-ref/bin/python] [--allow-busy]

For each backbone (the ``tiny`` preset's 4-layer Llama, and SmolLM2-135M's architecture) and each
mode (full fine-tuning; LoRA rank 16 on q/k/v/o with everything else frozen), on one batch of
``--batch`` rows × ``--length`` tokens:

* **ours, LM step** — a plain causal-LM training step in JAX (our Flax Llama forward, full-vocabulary
  cross-entropy at every position, backward, clip + AdamW as :func:`~imaginejax.imaginer.finetune.make_optimizer`;
  LoRA merged into the kernels as in our fine-tuning): the same computation as the PyTorch step;
* **PyTorch, LM step** — transformers' ``LlamaForCausalLM(config)`` (SDPA attention), ``loss =
  model(input_ids, labels=input_ids).loss``, backward, ``clip_grad_norm_(1.0)``, ``AdamW``; LoRA as
  rank-16 adapters added to the same four projections (base frozen, the usual unmerged form). Run
  in long-lived workers of the reference interpreter, one per ``--torch-threads`` setting with
  ``OMP_WAIT_POLICY=PASSIVE``;
* **ours, KALM step** — what our fine-tuning actually runs (:func:`~imaginejax.imaginer.finetune.make_train_step`)
  on a rollout-task batch of the same shape built by the real batch builder (states and actions
  spliced at placeholders, regression/classification heads, no full-vocabulary logits), for
  context: it is cheaper than an LM step because only text targets need the LM head.

Weights are random with the exact configuration (SmolLM2's read from its GGUF metadata): the speed
of a step does not depend on their values. After one warm-up step per side (for us it includes
compilation), the three steps and every PyTorch worker are timed in alternation, ``--steps`` rounds;
tokens/s = real tokens per step / seconds per step, best and median, PyTorch at its faster thread
setting (by median), ratios of the best and of the median rates. The run refuses to start at a load
average above the core count unless ``--allow-busy`` (the table then says busy). Writes
``results/benchmarks/imaginer_finetune.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

from _common import (RESULTS, Spread, Worker, add_load_arguments, add_reference_arguments, alternate, check_load,
                     fastest, fmt_ratio, fmt_spread, is_busy, load_note, protocol_stdout, serve, timed,
                     torch_workers)

LORA_RANK, LORA_ALPHA = 16, 16.0
LEARNING_RATE = 1e-4


def _first_call_seconds(step: Callable[[], Any]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------- ours


SMOLLM2_ARCHITECTURE_ENV = "IMAGINEJAX_SMOLLM2_ARCHITECTURE"


def smollm2_config() -> Any:
    """SmolLM2-135M's :class:`LlamaConfig`: from the JSON that ``$IMAGINEJAX_SMOLLM2_ARCHITECTURE`` names
    (:func:`export_smollm2_config` writes it, for machines without the GGUF) when set, else from its GGUF."""
    from imaginejax.imaginer.llama import LlamaConfig
    from imaginejax.imaginer.loading import load_gguf_config, smollm2_gguf_path

    path = os.environ.get(SMOLLM2_ARCHITECTURE_ENV)
    if not path:
        return load_gguf_config(smollm2_gguf_path())
    fields = json.loads(Path(path).read_text(encoding="utf-8"))
    fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
    return LlamaConfig(**fields)


def export_smollm2_config(path: Path) -> None:
    """SmolLM2-135M's configuration, read from its GGUF, as the JSON :func:`smollm2_config` reads."""
    config = smollm2_config()
    path.write_text(json.dumps({f.name: getattr(config, f.name) for f in dataclasses.fields(config)}),
                    encoding="utf-8")


def _architecture(model: str) -> dict[str, Any]:
    """LlamaConfig fields (without the vocabulary) of the ``tiny`` preset or of SmolLM2-135M."""
    from imaginejax.imaginer.finetune import TINY_ARCHITECTURE

    if model == "tiny":
        return dict(TINY_ARCHITECTURE)
    config = smollm2_config()
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for name in ("vocab_size", "bos_token_id", "eos_token_ids", "pad_token_id"):
        fields.pop(name)
    return fields


def _kalm_rollout_batch(base: Any, config: Any, batch: int, length: int) -> Any:
    """A rollout-task batch of ``batch`` rows built by the real builder, padded length == ``length``."""
    import numpy as np

    from imaginejax.data.types import TrajectoryDataset
    from imaginejax.imaginer.kalm import build_corpus, build_task_batch, layout_for_corpus

    instruction = "Move the red ball behind the blue ball."
    fixed = len(base.text_format.prefix("rollout")) + len(base.text_format.separator) + 1
    words = len(base.tokenizer.encode(instruction, add_special_tokens=False).ids)
    steps = (length - fixed - words) // 2
    rng = np.random.default_rng(0)
    states = rng.normal(size=(batch, steps + 1, config.state_dim)).astype(np.float32)
    actions = rng.integers(0, config.num_actions, size=(batch, steps)).astype(np.int32)
    mask = np.ones((batch, steps), bool)
    ends = np.zeros((batch, steps), bool)
    ends[:, -1] = True
    ds = TrajectoryDataset(
        states=states, actions=actions, rewards=np.zeros((batch, steps), np.float32), mask=mask,
        terminals=np.zeros_like(ends), truncations=ends, instruction_ids=np.zeros(batch, np.int32),
        goals=np.zeros((batch, 1), np.int32), instructions=(instruction,),
        instruction_embeddings=np.zeros((1, 0), np.float32), env="clevr", level="train",
        source="real", discrete=True)
    corpus = build_corpus([ds], base.tokenizer)
    layout = layout_for_corpus(base.text_format, corpus, predict_initial_state=False)
    out = build_task_batch("rollout", corpus, np.arange(batch), base.text_format, layout, config)
    if out.tokens.shape[1] != length:
        raise SystemExit(f"--length {length} does not fit the rollout layout (got "
                         f"{out.tokens.shape[1]}); use a multiple of 8 >= 32")
    return ds, out


def build_ours(model: str, mode: str, batch: int, length: int, compute_dtype: str = "float32",
               lora_targets: tuple[str, ...] | None = None, aot: bool = False, lora_form: str = "merged"
               ) -> dict[str, Any]:
    """Our two training steps of one case, not yet run: ``kalm`` and ``lm`` ({step: a blocking call that
    runs one step and carries the state, tokens: real tokens per step}), and the case's sizes.

    ``compute_dtype``/``lora_targets``/``lora_form``: the preset fields of that name (default: float32, q/k/v/o,
    merged; the LM step always merges).
    ``aot``: the KALM step is compiled here (ahead of its first call) and ``kalm`` also holds ``flops``, XLA's
    count of floating-point operations per step (its cost analysis of the compiled program)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from imaginejax.imaginer import lora as lora_lib
    from imaginejax.imaginer.finetune import (
        TrainState,
        _initial_trainable,
        build_base_model,
        get_preset,
        make_optimizer,
        make_train_step,
    )
    from imaginejax.imaginer.kalm import KalmConfig, StateNormalizer, embedding_std
    from imaginejax.imaginer.llama import forward, init_params

    lora_rank = LORA_RANK if mode == "lora" else 0
    preset = get_preset("tiny", architecture=_architecture(model), learning_rate=LEARNING_RATE,
                        lora_rank=lora_rank, lora_alpha=LORA_ALPHA, num_steps=1000, warmup_steps=0,
                        compute_dtype=compute_dtype, lora_form=lora_form,
                        **({"lora_targets": lora_targets} if lora_targets else {}))
    base = build_base_model(preset, jax.random.key(0))
    config = KalmConfig(llama=base.config, state_dim=10, discrete=True, num_actions=40,
                        state_token_id=base.placeholders[0], action_token_id=base.placeholders[1],
                        compute_dtype=compute_dtype)
    ds, kalm_batch = _kalm_rollout_batch(base, config, batch, length)
    scale = lora_lib.lora_scale(lora_rank, LORA_ALPHA) if lora_rank else None
    optimizer = make_optimizer(preset, preset.num_steps)
    result: dict[str, Any] = {"parameters": int(sum(x.size for x in jax.tree.leaves(base.params)))}

    # KALM step (what fine-tuning runs).
    trainable, frozen = _initial_trainable(preset, base.params, config, jax.random.key(1),
                                           embedding_std(base.params))
    state = jax.device_put(TrainState(jnp.zeros((), jnp.int32), trainable, optimizer.init(trainable)))
    kalm_step = make_train_step(config, optimizer, scale, lora_merged=lora_form == "merged")
    normalizer = StateNormalizer.from_datasets([ds])
    holder = {"state": state}
    result["kalm"] = {"tokens": int(kalm_batch.attention_mask.sum())}
    if aot:
        kalm_step = kalm_step.lower(state, frozen, {"rollout": kalm_batch}, normalizer).compile()
        cost = kalm_step.cost_analysis()
        result["kalm"]["flops"] = float((cost[0] if isinstance(cost, list) else cost)["flops"])

    def run_kalm() -> None:
        holder["state"], metrics = kalm_step(holder["state"], frozen, {"rollout": kalm_batch}, normalizer)
        jax.block_until_ready(metrics["loss"])

    result["kalm"]["step"] = run_kalm

    # Plain causal-LM step (the PyTorch comparison).
    llama_config = dataclasses.replace(base.config, vocab_size=base.config.vocab_size - 2)
    llama = jax.jit(init_params, static_argnums=0)(llama_config, jax.random.key(2))
    if lora_rank:
        lm_trainable = lora_lib.init_lora(jax.random.key(3), llama, llama_config, lora_rank)
        lm_frozen = llama
    else:
        lm_trainable, lm_frozen = llama, None

    def lm_loss(trainable: Any, frozen: Any, ids: jax.Array) -> jax.Array:
        params = lora_lib.merge_lora(frozen, trainable, scale) if frozen is not None else trainable
        logits = forward(params, llama_config, ids).logits
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean()

    @jax.jit
    def lm_step(trainable: Any, opt_state: Any, frozen: Any, ids: jax.Array) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(lm_loss)(trainable, frozen, ids)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    ids = jnp.asarray(np.random.default_rng(4).integers(0, llama_config.vocab_size, size=(batch, length)),
                      jnp.int32)
    lm_holder = {"trainable": lm_trainable, "opt": optimizer.init(lm_trainable)}

    def run_lm() -> None:
        lm_holder["trainable"], lm_holder["opt"], loss = lm_step(lm_holder["trainable"], lm_holder["opt"],
                                                                 lm_frozen, ids)
        jax.block_until_ready(loss)

    result["lm"] = {"step": run_lm, "tokens": batch * length}
    result["hf_config"] = llama_config.to_hf()
    result["trainable_parameters"] = int(sum(x.size for x in jax.tree.leaves(lm_trainable)))
    return result


# ------------------------------------------------------------------------------- PyTorch worker


def torch_worker() -> None:
    """Runs in the reference interpreter, serving requests (``_common.serve``): ``build {case}`` builds the
    case's model and optimizer (dropping the previous case's) and answers its warm-up step's seconds;
    ``step`` answers the seconds of one causal-LM training step."""
    channel = protocol_stdout()
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    device = os.environ.get("IMAGINEJAX_TORCH_DEVICE", "cpu")  # "cuda" on a GPU machine

    class LoRALinear(torch.nn.Module):
        """``base(x) + scale · (x a) b`` with ``a`` random, ``b`` zero, the base frozen."""

        def __init__(self, base: torch.nn.Linear, rank: int, alpha: float) -> None:
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(base.in_features, rank) / base.in_features ** 0.5)
            self.b = torch.nn.Parameter(torch.zeros(rank, base.out_features))
            self.scale = alpha / rank

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.scale * (x @ self.a) @ self.b

    held: dict[str, Any] = {}

    def build(case: dict[str, Any]) -> dict[str, Any]:
        held.clear()
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**case["hf_config"])
        model = transformers.LlamaForCausalLM(config).float().train()
        if case["lora_rank"]:
            for parameter in model.parameters():
                parameter.requires_grad_(False)
            for layer in model.model.layers:
                attention = layer.self_attn
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    setattr(attention, name, LoRALinear(getattr(attention, name), case["lora_rank"],
                                                        case["lora_alpha"]))
        model.to(device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=case["learning_rate"], betas=(0.9, case["adam_b2"]),
                                      weight_decay=0.01)
        ids = torch.randint(0, config.vocab_size, (case["batch"], case["length"]),
                            generator=torch.Generator().manual_seed(4)).to(device)

        def step() -> None:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.startswith("cuda"):
                torch.cuda.synchronize()  # the step's kernels are asynchronous

        held["step"] = step
        return {"first_step_seconds": _first_call_seconds(step),
                "trainable_parameters": sum(p.numel() for p in trainable),
                "attention": model.config._attn_implementation,
                "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
                "threads": torch.get_num_threads()}

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        if req["op"] == "build":
            return build(req["case"])
        if req["op"] == "step":
            return {"seconds": _first_call_seconds(held["step"])}
        raise ValueError(f"unknown op {req['op']!r} (build, step, quit)")

    serve(handle, channel)


# ------------------------------------------------------------------------------------------ main


def measure_case(model: str, mode: str, args: argparse.Namespace, workers: dict[int, Worker]) -> dict[str, Any]:
    """One (model, mode) case: warm-up steps, then our LM and KALM steps and every PyTorch worker's LM step
    alternating ``args.steps`` times."""
    from imaginejax.imaginer.finetune import get_preset

    ours = build_ours(model, mode, args.batch, args.length)
    first = {kind: _first_call_seconds(ours[kind]["step"]) for kind in ("lm", "kalm")}
    case = {"name": f"{model} {mode}", "hf_config": ours["hf_config"], "batch": args.batch, "length": args.length,
            "lora_rank": LORA_RANK if mode == "lora" else 0, "lora_alpha": LORA_ALPHA,
            "learning_rate": LEARNING_RATE, "adam_b2": get_preset("tiny").adam_b2}
    built = {t: w.ask({"op": "build", "case": case}) for t, w in workers.items()}
    contenders = {"lm": timed(ours["lm"]["step"]), "kalm": timed(ours["kalm"]["step"])}
    contenders.update({t: (lambda w=w: w.ask({"op": "step"})["seconds"]) for t, w in workers.items()})
    samples = alternate(contenders, args.steps)
    spreads = {name: Spread.of(seconds) for name, seconds in samples.items()}
    threads = fastest({t: spreads[t] for t in workers}) if workers else None
    theirs = spreads.get(threads)
    lm_tokens, kalm_tokens = ours["lm"]["tokens"], ours["kalm"]["tokens"]
    print(f"{case['name']}: ours LM step {lm_tokens / spreads['lm'].median:8.0f} tokens/s (median), KALM step "
          f"{kalm_tokens / spreads['kalm'].median:8.0f}"
          + (f", PyTorch LM step ({threads} thr) {lm_tokens / theirs.median:8.0f}" if theirs else ""), flush=True)
    return {
        "case": case["name"], "parameters": ours["parameters"], "trainable_parameters": ours["trainable_parameters"],
        "lm_tokens": lm_tokens, "kalm_tokens": kalm_tokens,
        "ours_lm_seconds": samples["lm"], "ours_lm_spread": [spreads["lm"].min, spreads["lm"].median],
        "ours_lm_tokens_per_s": lm_tokens / spreads["lm"].median, "ours_lm_first_step_seconds": first["lm"],
        "ours_kalm_seconds": samples["kalm"], "ours_kalm_spread": [spreads["kalm"].min, spreads["kalm"].median],
        "ours_kalm_tokens_per_s": kalm_tokens / spreads["kalm"].median,
        "ours_kalm_first_step_seconds": first["kalm"],
        "torch_threads": threads, "torch_seconds": {t: samples[t] for t in workers},
        "torch_lm_spread": [theirs.min, theirs.median] if theirs else None,
        "torch_lm_tokens_per_s": lm_tokens / theirs.median if theirs else None,
        "ratio_lm": theirs.median / spreads["lm"].median if theirs else None,
        "ratio_lm_best": theirs.min / spreads["lm"].min if theirs else None,
        "torch_trainable_parameters": built[threads]["trainable_parameters"] if workers else None,
        "torch_versions": built[threads]["versions"] if workers else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m"],
                        choices=["tiny", "smollm2-135m"])
    parser.add_argument("--modes", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side (alternating rounds)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_reference_arguments(parser)
    add_load_arguments(parser)
    args = parser.parse_args()
    if args.torch_worker:
        torch_worker()
        return
    load_before = check_load(args.allow_busy)
    import jax

    workers = torch_workers(args.ref_python, __file__, args.torch_threads)
    try:
        rows = [measure_case(model, mode, args, workers) for model in args.models for mode in args.modes]
    finally:
        for worker in workers.values():
            worker.close()
    load_after = os.getloadavg()[0]
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    torch_versions = rows[0]["torch_versions"] if rows else None
    record = {"benchmark": "imaginer_finetune", "batch": args.batch, "length": args.length,
              "lora_rank": LORA_RANK, "machine": machine, "jax": jax.__version__, "torch": torch_versions,
              "load_before": load_before, "load_after": load_after, "busy": is_busy(load_before, load_after),
              "command": " ".join([Path(sys.executable).name] + sys.argv), "rows": rows}
    lines = [
        "# Imaginer fine-tuning: training-step tokens/s",
        "",
        f"Batch {args.batch} × {args.length} tokens, float32, best / median of {args.steps} alternating steps "
        f"per side after a warm-up; LoRA rank {LORA_RANK} on q/k/v/o. jax {jax.__version__} vs "
        f"{torch_versions or 'no PyTorch reference'} at {', '.join(map(str, args.torch_threads))} threads "
        f"(OMP_WAIT_POLICY=PASSIVE, the faster by median shown); {machine}, {load_note(load_before, load_after)}.",
        "",
        "| case | trainable params | ours, LM step (tokens/s, best / median) | PyTorch LM step (tokens/s, best / median) "
        "| PyTorch threads | ours / PyTorch (best / median) | ours, KALM step (tokens/s, best / median) "
        "| our first step (s, incl. compile) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours = (row["lm_tokens"], Spread(*row["ours_lm_spread"]))
        theirs = (row["lm_tokens"], Spread(*row["torch_lm_spread"])) if row["torch_lm_spread"] else None
        kalm = (row["kalm_tokens"], Spread(*row["ours_kalm_spread"]))
        lines.append(f"| {row['case']} | {row['trainable_parameters']:,} | {fmt_spread(*ours)} | "
                     f"{fmt_spread(*theirs) if theirs else 'n/a'} | {row['torch_threads'] or 'n/a'} | "
                     f"{fmt_ratio(ours, theirs)} | {fmt_spread(*kalm)} | {row['ours_lm_first_step_seconds']:.1f} |")
    lines += ["", "LM step: causal-LM cross-entropy over the full vocabulary at every position (the same "
              "computation on both sides). KALM step: our fine-tuning's rollout-task step on the same "
              "batch shape (heads instead of full-vocabulary logits).", "",
              f"Command: `{record['command']}`", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "imaginer_finetune.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / "imaginer_finetune.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
