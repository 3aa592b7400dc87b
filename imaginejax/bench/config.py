"""Typed configuration of the ``imaginejax`` command: dataclasses loaded from TOML presets with overrides.

A configuration has five sections, each a frozen dataclass: :class:`DataConfig` (real expert data),
:class:`ImagineConfig` (imaginary data: an LLM imaginer, oracle rollouts, or none), :class:`TrainConfig`
(the sweep: algorithms × seeds × hyperparameters × real/imaginary ratios, the engine's budget),
:class:`LoggingConfig` (progress display, optional TensorBoard / Weights & Biases) and
:class:`ReportConfig` (statistics and figures).

Where values come from, later ones winning:

1. the dataclass defaults;
2. a preset: ``experiments/presets/<name>.toml`` (``--preset NAME``) or any TOML file (``--config FILE``).
   A preset may start with ``extends = "<other preset>"`` and then only states what differs;
3. ``--set key=value`` overrides, keys dotted (``train.updates=2000``, ``train.algo.cql.hp.alpha=5``);
   values are TOML (``[0, 0.5]``, ``true``, ``"babyai"``), and a bare word is taken as a string.

Every field is type-checked when loaded; a wrong name, type or value raises :class:`ConfigError` naming the
field (``train.updates``) and saying how to fix it. Numbers are checked before anything is compiled: every
float finite (NaN or inf nowhere, free tables included), learning rates > 0, ``train.updates`` and the
seeds within the 32-bit integers JAX computes with by default (:data:`INT32_MAX`). ``describe()`` renders every field with its type,
default and meaning (the ``--help`` of ``train`` and ``bench``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence


def _preset_dir() -> Path:
    """``experiments/presets``: the installed ``imaginejax.presets`` package (any install, editable or not),
    else the source tree's folder (running from a checkout without installing)."""
    try:
        from imaginejax import presets
    except ImportError:
        return Path(__file__).resolve().parents[1] / "experiments" / "presets"
    return Path(presets.__file__).resolve().parent


PRESET_DIR = _preset_dir()


class ConfigError(ValueError):
    """A configuration value is missing, misspelt, of the wrong type or out of range."""


# The algorithms count updates in int32 and JAX makes keys from 32-bit seeds (64-bit integers need
# jax_enable_x64): larger values would overflow the counters or give the key of a smaller seed.
INT32_MAX = 2**31 - 1
LEARNING_RATE = re.compile(r"(^|_)(learning_rate|lr)$")  # learning_rate, actor_lr, alpha_prime_lr, ...


def _finite(value: Any, where: str) -> None:
    """Raises ConfigError naming ``where`` when ``value`` is or holds (in lists, tables) a NaN or infinite float."""
    if isinstance(value, float) and not math.isfinite(value):
        field = re.sub(r"\[\d+\].*", "", where)  # a list's element: the list is what --set replaces
        raise ConfigError(f"config field {where}: {value} is not a finite number; give a finite value (--set "
                          f"{field}={'<number>' if field == where else '[<numbers>]'})")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite(v, f"{where}[{i}]")


def _field(default: Any, doc: str) -> Any:
    """A dataclass field with a default (copied for mutable defaults) and its ``--help`` text."""
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata={"help": doc})
    return dataclasses.field(default=default, metadata={"help": doc})


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Real data: expert trajectories of the environment's training level."""

    env: str = _field("clevr", "environment registry name (imaginejax.envs.registered())")
    episodes: int = _field(2000, "real expert trajectories collected for the training level")
    rl_episodes: int = _field(0, "of those, how many the RL algorithms train on (0 = all; the reference "
                                 "fine-tunes the imaginer on 10,000 and trains RL on 6,400)")
    epsilon: float = _field(0.1, "the expert's random-action probability (data diversity)")
    seed: int = _field(0, "collection seed")
    embed: bool = _field(True, "embed instructions with the sentence encoder (False: bare state, E = 0)")
    dir: str = _field("", "dataset cache directory ('' = $IMAGINEJAX_HOME/data)")


@dataclasses.dataclass(frozen=True)
class ImagineConfig:
    """Imaginary data for the novel levels."""

    source: Literal["imaginer", "oracle", "none"] = _field(
        "imaginer", "'imaginer': a KALM imaginer fine-tuned on the real data writes rollouts; 'oracle': real "
        "expert rollouts of the novel tasks (the paper's upper bound); 'none': real data only (ratios must be 0)")
    levels: tuple[str, ...] = _field((), "levels to imagine ([] = every level except train)")
    episodes: int = _field(200, "imaginary (or oracle) trajectories per level")
    level_episodes: dict[str, int] = _field({}, "per-level counts overriding imagine.episodes, e.g. {easy = 72400}")
    preset: str = _field("tiny", "imaginer fine-tuning preset (imaginejax.imaginer.finetune.PRESETS), or 'shipped': "
                                 "the package's trained imaginer of data.env, no fine-tuning")
    finetune: dict[str, Any] = _field({}, "fields of the imaginer preset to override, e.g. {num_steps = 200}")
    chunk_size: int = _field(64, "rollouts generated per compiled call")
    seed: int = _field(1, "generation (or oracle collection) seed")
    filter: Literal["none", "legal", "consistent-legal"] = _field(
        "none", "quality filter on imaginary rollouts before training: 'legal' keeps rollouts whose every state "
        "is legal, 'consistent-legal' also requires reaching the goal (recorded in the results)")
    oversample: int = _field(
        1, "generate k × the episodes of each level and keep the best of each task by the quality report "
        "(goal reached and legal, goal, legal, the rest; then lower dynamics error); imagine.filter applies "
        "to the kept rollouts; 1 = keep every generated rollout")


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
    """Per-algorithm settings under ``[train.algo.<name>]``."""

    batch_size: int = _field(0, "batch size for this algorithm (0 = train.batch_size)")
    hp: dict[str, float] = _field({}, "fixed hyperparameters (names as in the algorithm's hp pytree)")
    sweep: dict[str, tuple[float, ...]] = _field({}, "hyperparameter name -> values swept as a grid")
    options: dict[str, Any] = _field({}, "static options that fix compiled shapes "
                                         "(imaginejax.algos.static_options), e.g. for combo "
                                         "{config = {rollout_batch = 5000}}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The sweep and the engine's budget."""

    algos: tuple[str, ...] = _field((), "algorithms ([] = every registered one for the action space)")
    seeds: int = _field(5, "seeds per configuration (seeds 0 .. n-1)")
    ratios: tuple[float, ...] = _field((0.0, 0.5), "imaginary fraction of each batch, swept as a grid (runs "
                                                   "without imaginary data have ratio 0; the others each ratio > 0)")
    conditions: tuple[str, ...] = _field(
        ("real", "imaginary", "oracle"), "data conditions trained side by side in one sweep: 'real' (real data "
        "only), 'imaginary' (real + imagine.source's rollouts), 'oracle' (real + expert rollouts of the novel "
        "tasks, the paper's upper bound)")
    protocol: Literal["per-level", "pooled"] = _field(
        "per-level", "'per-level' (the reference's): runs for each novel level mix in that level's data only; "
        "'pooled': one buffer of every novel level's data")
    batch_size: int = _field(256, "transitions per gradient update")
    updates: int = _field(10000, "gradient updates per run")
    intervals: int = _field(10, "evaluations (and checkpoints) during training; divides train.updates")
    eval_levels: tuple[str, ...] = _field((), "levels evaluated after every interval ([] = every level of data.env)")
    eval_episodes: int = _field(100, "episodes per level per evaluation, rounded up to a multiple of the level's "
                                     "task count (every task evaluated equally often)")
    encoder_width: int = _field(0, "width of the two tanh language-encoder layers; 0 = each algorithm's "
                                   "reference network (BENCHMARK §4; BabyAI's reference width is 64)")
    hidden: tuple[int, ...] = _field((256, 256), "widths of the ReLU head after the encoder (with encoder_width > 0)")
    checkpoint_every: int = _field(1, "checkpoint every K intervals (and after the last)")
    keep_checkpoints: int = _field(2, "checkpoints kept per chunk")
    memory_budget_mb: int = _field(0, "device memory budget for chunking the run axis (0 = automatic)")
    run_block: int = _field(0, "0 = vmap all runs at once; b > 0 = blocks of b runs (bitwise chunk-independent)")
    algo: dict[str, AlgoConfig] = _field({}, "per-algorithm settings: [train.algo.<name>] batch_size, hp, sweep")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """What is shown and where metrics go besides metrics.jsonl / metrics.csv."""

    progress: Literal["auto", "bar", "lines", "off"] = _field(
        "auto", "'bar' redraws one line (terminals), 'lines' prints one line per interval, 'auto' picks")
    tensorboard: bool = _field(False, "also write TensorBoard event files (needs: pip install tensorboardX)")
    wandb: bool = _field(False, "also log to Weights & Biases (needs: pip install wandb)")
    wandb_project: str = _field("imaginejax", "Weights & Biases project")
    wandb_mode: Literal["offline", "online"] = _field("offline", "'offline' never touches the network")


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """Statistics table and figures."""

    statistic: Literal["iqm", "mean"] = _field("iqm", "point estimate over seeds")
    last: int = _field(5, "success of a run = its mean over the last k evaluations (KALM: 5; all if fewer)")
    reps: int = _field(2000, "bootstrap replicates of the 95 % intervals")
    seed: int = _field(0, "bootstrap seed")
    figures: bool = _field(True, "write learning curves and bar charts (PNG + CSV)")


@dataclasses.dataclass(frozen=True)
class Config:
    """A whole protocol: data, imaginary data, training sweep, logging, report."""

    name: str = _field("", "preset name (informational)")
    description: str = _field("", "what the preset is for (informational)")
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    imagine: ImagineConfig = dataclasses.field(default_factory=ImagineConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
    report: ReportConfig = dataclasses.field(default_factory=ReportConfig)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready nested dict (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def results_key(self) -> dict[str, Any]:
        """The sections that determine results (data, imagine, train): what a resumed run must match."""
        full = self.to_json()
        return {k: full[k] for k in ("data", "imagine", "train")}


# ---------------------------------------------------------------------------------------------------
# Converting raw (TOML) values into typed dataclasses
# ---------------------------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if tp is Any:
        return "any value"
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0]).removeprefix('an ').removeprefix('a ')}s"
    if origin is dict:
        return "a table (dict)"
    if dataclasses.is_dataclass(tp):
        return "a table (section)"
    return str(tp)


def _convert(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked (and minimally coerced: int -> float, list -> tuple) against type ``tp``."""
    origin = typing.get_origin(tp)
    bad = lambda: ConfigError(f"config field {where}: expected {_type_name(tp)}, got {value!r} "
                              f"({type(value).__name__}); fix the value in the preset or pass "
                              f"--set {where}=<{_type_name(tp)}>")
    if tp is Any:
        _finite(value, where)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        _finite(float(value), where)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad()
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise bad()
        item = typing.get_args(tp)[0]
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad()
        item = typing.get_args(tp)[1]
        return {str(k): _convert(v, item, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise bad()
        return from_dict(tp, value, where)
    raise TypeError(f"unsupported config type {tp} at {where}")


def from_dict(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """Builds dataclass ``cls`` from a nested mapping; unknown keys and wrong types raise ConfigError.

    Args:
      cls: a config dataclass.
      data: raw values (e.g. parsed TOML); missing fields keep their defaults.
      where: dotted path of ``data`` in the whole config (for messages).
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in hints:
            raise ConfigError(f"unknown config field {path}; valid fields"
                              f"{' of [' + where + ']' if where else ''}: {', '.join(names)}")
        kwargs[key] = _convert(value, hints[key], path)
    return cls(**kwargs)


# ---------------------------------------------------------------------------------------------------
# Presets, files and overrides
# ---------------------------------------------------------------------------------------------------
def available_presets() -> tuple[str, ...]:
    """Preset names in ``experiments/presets`` (file stems)."""
    return tuple(sorted(p.stem for p in PRESET_DIR.glob("*.toml")))


def _preset_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        return path
    candidate = PRESET_DIR / f"{name_or_path}.toml"
    if not candidate.is_file():
        raise ConfigError(f"unknown preset {name_or_path!r}; available presets: "
                          f"{', '.join(available_presets())} (or pass a path to a .toml file)")
    return candidate


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: tables merge key by key, everything else is replaced."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def read_preset(name_or_path: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The raw (untyped) table of a preset or TOML file, with ``extends`` chains resolved."""
    path = _preset_path(name_or_path)
    if str(path) in _seen:
        raise ConfigError(f"preset {path} extends itself (cycle: {' -> '.join(_seen + (str(path),))})")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'extends' must be a preset name or path, got {parent!r}")
    if not Path(parent).is_absolute() and Path(parent).suffix == ".toml":
        parent = str(path.parent / parent)
    return _merge(read_preset(parent, _seen + (str(path),)), raw)


def parse_value(text: str) -> Any:
    """A ``--set`` value: TOML (``3``, ``1e-3``, ``true``, ``[0, 0.5]``, ``{a = 1}``, ``"x"``), else the bare
    text as a string.

    Raises:
      ConfigError: a list or table that is not TOML (e.g. unquoted strings in a list), with the quoting.
    """
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        if text.startswith(("[", "{")):
            raise ConfigError(f"value {text!r} is not a TOML {'list' if text[0] == '[' else 'table'}: "
                              "quote the strings inside it and the whole assignment for the shell, e.g. "
                              """--set 'train.algos=["bc", "cql"]'""") from None
        return text


def apply_override(raw: dict[str, Any], assignment: str) -> dict[str, Any]:
    """``raw`` with one ``key=value`` assignment applied (key dotted; checked when the config is built)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set train.updates=2000")
    key, text = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise ConfigError(f"--set {assignment!r}: empty part in key {key!r}; keys look like train.updates")
    _check_path(parts, assignment)
    try:
        nested: Any = parse_value(text.strip())
    except ConfigError as error:
        raise ConfigError(f"--set {assignment!r}: {error}") from None
    for part in reversed(parts):
        nested = {part: nested}
    return _merge(raw, nested)


def _check_path(parts: Sequence[str], assignment: str) -> None:
    """Fails early, naming the valid fields, when a ``--set`` key leaves the config's structure."""
    cls: Any = Config
    for depth, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            origin = typing.get_origin(cls)
            if origin is dict:  # free keys (algorithm names, hyperparameter names)
                cls = typing.get_args(cls)[1]
                continue
            raise ConfigError(f"--set {assignment!r}: {'.'.join(parts[:depth])} is a value, not a section")
        hints = typing.get_type_hints(cls)
        if part not in hints:
            where = ".".join(parts[:depth]) or "the top level"
            raise ConfigError(f"--set {assignment!r}: unknown field {'.'.join(parts[:depth + 1])}; valid "
                              f"fields of {where}: {', '.join(f.name for f in dataclasses.fields(cls))}")
        cls = hints[part]


def load_config(preset: str | None = None, overrides: Sequence[str] = (), *,
                config_file: str | None = None) -> Config:
    """Defaults ← preset / config file ← ``--set`` overrides, then :func:`validate`.

    Args:
      preset: a preset name in ``experiments/presets`` (or a path), or None for the defaults.
      overrides: ``key=value`` strings.
      config_file: a TOML file applied after the preset (its own ``extends`` is honoured).
    """
    raw: dict[str, Any] = {}
    if preset:
        raw = read_preset(preset)
        raw.setdefault("name", Path(preset).stem)
    if config_file:
        raw = _merge(raw, read_preset(config_file))
    for assignment in overrides:
        raw = apply_override(raw, assignment)
    config = from_dict(Config, raw)
    validate(config)
    return config


def validate(config: Config) -> None:
    """Range and consistency checks that types alone cannot express; raises :class:`ConfigError`."""
    from imaginejax import algos, envs

    data, imagine, train = config.data, config.imagine, config.train
    if data.env not in envs.registered():
        raise ConfigError(f"data.env: unknown environment {data.env!r}; valid: {', '.join(envs.registered())}")
    positive = {"data.episodes": data.episodes, "imagine.episodes": imagine.episodes,
                "imagine.chunk_size": imagine.chunk_size, "train.seeds": train.seeds,
                "train.batch_size": train.batch_size, "train.updates": train.updates,
                "train.intervals": train.intervals, "train.eval_episodes": train.eval_episodes,
                "train.checkpoint_every": train.checkpoint_every,
                "train.keep_checkpoints": train.keep_checkpoints}
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if imagine.oversample < 1:
        raise ConfigError(f"imagine.oversample must be an integer >= 1 (k: generate k × imagine.episodes per level, "
                          f"keep the best), got {imagine.oversample}: e.g. --set imagine.oversample=4, or 1 to keep "
                          "every generated rollout")
    for name, value in {"train.memory_budget_mb": train.memory_budget_mb, "train.run_block": train.run_block,
                        "train.encoder_width": train.encoder_width,
                        "report.reps": config.report.reps - 1}.items():
        if value < 0:
            raise ConfigError(f"{name} must be >= {0 if name != 'report.reps' else 1}, got {value}")
    if not 0 <= data.rl_episodes <= data.episodes:
        raise ConfigError(f"data.rl_episodes must be in [0, data.episodes = {data.episodes}], got {data.rl_episodes}")
    if not 0.0 <= data.epsilon <= 1.0:
        raise ConfigError(f"data.epsilon must be in [0, 1], got {data.epsilon}")
    if train.updates > INT32_MAX:
        raise ConfigError(f"train.updates = {train.updates:,} is above {INT32_MAX:,} (2**31 - 1), the most the "
                          "algorithms' int32 update counters hold (JAX computes in 32-bit integers by default): "
                          f"lower it, e.g. --set train.updates={INT32_MAX // train.intervals * train.intervals}")
    for name, value in {"data.seed": data.seed, "imagine.seed": imagine.seed, "report.seed": config.report.seed}.items():
        if not 0 <= value <= INT32_MAX:
            raise ConfigError(f"{name} must be in [0, {INT32_MAX}] (JAX makes keys from 32-bit seeds: a larger or "
                              f"negative one gives the key of another seed), got {value}")
    if train.updates % train.intervals:
        raise ConfigError(f"train.updates ({train.updates}) must be a multiple of train.intervals "
                          f"({train.intervals}): e.g. --set train.updates={train.updates // train.intervals * train.intervals or train.intervals}")
    if any(w < 1 for w in train.hidden):
        raise ConfigError(f"train.hidden widths must be >= 1, got {list(train.hidden)}")
    if not train.ratios:
        raise ConfigError("train.ratios is empty: give at least one ratio, e.g. [0.0]")
    known_conditions = ("real", "imaginary", "oracle")
    for condition in train.conditions:
        if condition not in known_conditions:
            raise ConfigError(f"train.conditions: unknown condition {condition!r}; valid: {', '.join(known_conditions)}")
    if not train.conditions:
        raise ConfigError("train.conditions is empty: give at least one of real, imaginary, oracle")
    if config.report.last < 1:
        raise ConfigError(f"report.last must be >= 1, got {config.report.last}")
    for ratio in train.ratios:
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"train.ratios: {ratio} is outside [0, 1]")
    if imagine.source == "none" and any(r > 0 for r in train.ratios):
        raise ConfigError(f"train.ratios {list(train.ratios)} draw imaginary data but imagine.source is 'none': "
                          "set imagine.source to 'imaginer' or 'oracle', or train.ratios to [0.0]")
    from imaginejax.envs import ENV_LEVELS

    novel = [lv for lv in ENV_LEVELS[data.env] if lv != "train"]
    for level in train.eval_levels:
        if level not in ENV_LEVELS[data.env]:
            raise ConfigError(f"train.eval_levels: {level!r} is not a level of {data.env}; valid: "
                              f"{', '.join(ENV_LEVELS[data.env])}")
    for level in imagine.levels:
        if level not in novel:
            raise ConfigError(f"imagine.levels: {level!r} is not a novel level of {data.env}; valid: {', '.join(novel)}")
    for level, count in imagine.level_episodes.items():
        if level not in novel:
            raise ConfigError(f"imagine.level_episodes.{level}: not a novel level of {data.env}; valid: {', '.join(novel)}")
        if count < 1:
            raise ConfigError(f"imagine.level_episodes.{level} must be >= 1, got {count}")
    known = algos.registered()
    for name in tuple(train.algos) + tuple(train.algo):
        if name not in known:
            where = "train.algos" if name in train.algos else f"train.algo.{name}"
            raise ConfigError(f"{where}: unknown algorithm {name!r}; registered: {', '.join(known)}")
    for name, settings in train.algo.items():
        valid = set(algos.static_options(name))
        for option in settings.options:
            if option not in valid:
                raise ConfigError(f"train.algo.{name}.options.{option}: {name} has no such static option; "
                                  f"valid: {', '.join(sorted(valid)) or 'none'}")
    for name, settings in train.algo.items():
        if settings.batch_size < 0:
            raise ConfigError(f"train.algo.{name}.batch_size must be >= 0 (0 = train.batch_size)")
        for hp, values in settings.sweep.items():
            if not values:
                raise ConfigError(f"train.algo.{name}.sweep.{hp} is empty: give at least one value")
        values = [("hp", k, v) for k, v in settings.hp.items()]
        values += [("sweep", k, v) for k, vs in settings.sweep.items() for v in vs]
        for table, key, value in values:
            if LEARNING_RATE.search(key) and value <= 0:
                raise ConfigError(f"train.algo.{name}.{table}.{key} = {value:g}: a learning rate must be > 0 (at 0 "
                                  "nothing trains, below 0 training ascends the loss); e.g. 1e-3")
    if imagine.source == "imaginer":
        from imaginejax.imaginer.finetune import PRESETS, Preset

        if imagine.preset not in PRESETS and imagine.preset != "shipped":
            raise ConfigError(f"imagine.preset: unknown imaginer preset {imagine.preset!r}; valid: "
                              f"{', '.join(PRESETS)}, shipped (the package's trained imaginer)")
        fields = {f.name for f in dataclasses.fields(Preset)}
        for key, value in imagine.finetune.items():
            if key not in fields or key == "name":
                raise ConfigError(f"imagine.finetune.{key} is not a field of the imaginer preset; valid: "
                                  f"{', '.join(sorted(fields - {'name'}))}")
            if LEARNING_RATE.search(key) and isinstance(value, (int, float)) and value <= 0:
                raise ConfigError(f"imagine.finetune.{key} = {value:g}: a learning rate must be > 0; e.g. 1e-4")
        if imagine.preset in PRESETS:
            try:  # the preset's own checks (e.g. its validation settings), before any data work
                PRESETS[imagine.preset].replace(**imagine.finetune)
            except (TypeError, ValueError) as error:
                raise ConfigError(f"imagine.finetune: {error}") from None


def imagined_levels(config: Config) -> tuple[str, ...]:
    """The levels that get imaginary data: ``imagine.levels`` or every level except ``train``."""
    from imaginejax.envs import ENV_LEVELS

    if config.imagine.levels:
        return tuple(config.imagine.levels)
    return tuple(lv for lv in ENV_LEVELS[config.data.env] if lv != "train")


def data_conditions(config: Config) -> tuple[str, ...]:
    """The data conditions actually trained: ``train.conditions`` without those that cannot apply —
    'imaginary' when ``imagine.source`` is 'none', every mixed condition when no ratio is > 0."""
    mixing = any(r > 0 for r in config.train.ratios)
    source = config.imagine.source
    # With imagine.source 'oracle' the imaginary condition *is* the oracle condition: train it once.
    skip_imaginary = source == "none" or (source == "oracle" and "oracle" in config.train.conditions)
    return tuple(c for c in config.train.conditions
                 if c == "real" or (mixing and not (c == "imaginary" and skip_imaginary)))


def level_episodes(config: Config, level: str) -> int:
    """Imaginary (or oracle) trajectories for ``level``: ``imagine.level_episodes`` or ``imagine.episodes``."""
    return int(config.imagine.level_episodes.get(level, config.imagine.episodes))


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What a configuration means for its environment, worked out once (:func:`resolve`) and passed down to
    the data and training steps instead of the whole :class:`Config`.

    Attributes:
      levels: the evaluated levels (``train.eval_levels``, else every level of the environment).
      novel: every level of the environment but ``train``.
      imagined: the levels given imaginary or oracle data (:func:`imagined_levels`).
      conditions: the data conditions trained (:func:`data_conditions`).
      episodes: imagined level -> imaginary (or oracle) trajectories (:func:`level_episodes`).
      data_root: where expert data is cached (``data.dir``, else ``$IMAGINEJAX_HOME/data``).
      data, imagine: the configuration's ``data`` and ``imagine`` sections.
      protocol: ``train.protocol`` ('per-level' or 'pooled').
    """

    levels: tuple[str, ...]
    novel: tuple[str, ...]
    imagined: tuple[str, ...]
    conditions: tuple[str, ...]
    episodes: Mapping[str, int]
    data_root: Path
    data: DataConfig
    imagine: ImagineConfig
    protocol: str

    @property
    def env(self) -> str:
        """``data.env``."""
        return self.data.env


def resolve(config: Config) -> Resolved:
    """The :class:`Resolved` facts of ``config`` (its environment's levels, the conditions trained, ...)."""
    from imaginejax.core.paths import absolute, cache_root
    from imaginejax.envs import ENV_LEVELS

    d, imagined = config.data, imagined_levels(config)
    return Resolved(levels=tuple(config.train.eval_levels or ENV_LEVELS[d.env]),
                    novel=tuple(lv for lv in ENV_LEVELS[d.env] if lv != "train"), imagined=imagined,
                    conditions=data_conditions(config),
                    episodes={level: level_episodes(config, level) for level in imagined},
                    data_root=absolute(d.dir) if d.dir else cache_root() / "data", data=d, imagine=config.imagine,
                    protocol=config.train.protocol)


def describe(cls: type = Config, prefix: str = "") -> str:
    """One line per field: ``section.key  (type, default)  meaning``, for ``--help``."""
    lines = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(tp):
            lines.append(f"[{path}]  {tp.__doc__.strip().splitlines()[0]}")
            lines.append(describe(tp, f"{path}."))
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        else:
            default = field.default_factory()  # type: ignore[misc]
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        lines.append(f"  {path} = {shown}   ({_type_name(tp)}) {field.metadata.get('help', '')}")
        if typing.get_origin(tp) is dict and dataclasses.is_dataclass(typing.get_args(tp)[1]):
            lines.append(describe(typing.get_args(tp)[1], f"{path}.<name>."))
    return "\n".join(lines)
