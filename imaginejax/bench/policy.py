"""A trained policy to take away: one run's acting parameters, saved, loaded and run anywhere.

    policy = Policy.from_results(results, algo="bc", seed=0)  # of fit(), protocol.train or load_sweep(workspace)
    policy.save("policy/")                           # policy.safetensors + policy.json
    policy = Policy.load("policy/")
    actions = policy.predict(obs)                    # obs (B, S+E) -> (B,) int32 or (B, A) float32
    actions = policy.act(states, "push the red ball to the left of the blue ball")
    action = policy(gym_observation)                 # a dict of imaginejax.interop.gym_adapter

Only what ``act`` reads is kept: tracing ``algo.act(state, obs, key, hp, deterministic=True)`` to a
jaxpr and walking it back from the actions marks the leaves of (state, hp) it depends on — the acting
network and, where the algorithm normalises, the state statistics. Loading rebuilds the rest of the state
as zeros, which ``act`` never reads, so actions are bitwise those of the trained state.

On disk: ``policy.safetensors`` (those leaves by pytree path) and ``policy.json`` (algorithm, static
options, network, :class:`~imaginejax.algos.base.Spec`, sentence encoder, environment, provenance, the
tensors' SHA-256). :meth:`Policy.load` checks the record, the checksum, and every tensor's name, shape
and dtype against the algorithm's own state; nothing is unpickled or executed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from imaginejax.core import __version__
from imaginejax import algos as algo_registry
from imaginejax.algos.base import Algorithm, Spec
from imaginejax.algos.common import DataStats
from imaginejax.algos.networks import NetConfig
from imaginejax.core.files import field_problem, write_bytes, write_json

if TYPE_CHECKING:
    from imaginejax.bench.results import Results, TrainedRuns
    from imaginejax.training.evaluation import EvalResult

PyTree = Any
FORMAT = "imaginejax-policy"
VERSION = 1
TENSORS_FILE = "policy.safetensors"
RECORD_FILE = "policy.json"


class PolicyError(ValueError):
    """A policy that cannot be built or loaded: missing, damaged, or not what its record says."""


# Bounds a record is held to before anything is traced or built: far above the networks trained here
# (widths 32-1024, 2-4 layers), far below what takes minutes to trace or gigabytes to hold.
MAX_WIDTH = 16384
MAX_LAYERS = 16
MAX_COUNT = 1 << 20  # any other count of an option: samples, rows, ensemble members
RECORD_FIELDS = ("format", "version", "algo", "options", "net", "spec", "encoder", "env", "provenance",
                 "imaginejax", "tensors", "sha256")
ENCODER_FIELDS = ("model", "dim", "fingerprint", "normalize")


# ---------------------------------------------------------------------------------------------------
# What act reads
# ---------------------------------------------------------------------------------------------------
def template(algo: Algorithm, spec: Spec) -> tuple[PyTree, PyTree]:
    """Shapes and dtypes of one run's (state, hp), without computing anything."""
    hp = algo.default_hp(spec)
    state = jax.eval_shape(lambda key, stats, h: algo.init(key, spec, stats, h), jax.random.PRNGKey(0),
                           DataStats.identity(spec.state_dim), hp)
    return state, jax.eval_shape(lambda: hp)


def named_leaves(tree: PyTree, prefix: str) -> dict[str, Any]:
    """{prefix + pytree path: leaf}, the names of the tensors file."""
    return {prefix + jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def acting_names(algo: Algorithm, spec: Spec) -> tuple[str, ...]:
    """Names (``state...`` / ``hp...``) of the leaves that ``act`` depends on.

    Dependency is read off the jaxpr of ``act`` over (state, hp): a variable is needed when an equation
    that produces a needed variable reads it, starting from the actions. Nested calls count as a whole.
    """
    state, hp = template(algo, spec)
    obs = jax.ShapeDtypeStruct((1, spec.obs_dim), jnp.float32)
    closed = jax.make_jaxpr(lambda s, h, o: algo.act(s, o, jax.random.PRNGKey(0), h, True))(state, hp, obs)
    graph = closed.jaxpr
    needed = {v for v in graph.outvars if isinstance(v, jex.Var)}
    for eqn in reversed(graph.eqns):
        if any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if isinstance(v, jex.Var))
    names = list(named_leaves(state, "state")) + list(named_leaves(hp, "hp"))
    return tuple(name for name, var in zip(names, graph.invars) if var in needed)


def encoder_record(embed_dim: int) -> dict[str, Any] | None:
    """The sentence encoder of the instruction embeddings (None when E = 0): model name, width, the
    fingerprint of its weights and tokenizer, L2-normalised."""
    if embed_dim == 0:
        return None
    from imaginejax.lang import default_encoder

    encoder = default_encoder()
    return {"model": encoder.model_id, "dim": int(encoder.dim), "fingerprint": encoder.fingerprint, "normalize": True}


# ---------------------------------------------------------------------------------------------------
# The policy
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    """One trained run's acting parameters and everything needed to run them.

    Attributes:
      algo: algorithm registry name.
      spec: the environment interface it was trained for.
      net: its network shapes (None: the algorithm's reference network).
      options: static options of the algorithm's factory.
      env: environment registry name.
      encoder: the sentence encoder of its instruction embeddings (:func:`encoder_record`), None for E = 0.
      provenance: where it comes from (run, seed, ratio, data, hp, steps, last success, source).
      tensors: name -> array of every leaf ``act`` reads (:func:`acting_names`).
    """

    algo: str
    spec: Spec
    net: NetConfig | None
    options: dict[str, Any]
    env: str
    encoder: dict[str, Any] | None
    provenance: dict[str, Any]
    tensors: dict[str, np.ndarray]

    @classmethod
    def from_state(cls, algo: str, spec: Spec, net: NetConfig | None, options: Mapping[str, Any], env: str,
                   state: PyTree, hp: PyTree, provenance: Mapping[str, Any]) -> "Policy":
        """The policy of a trained ``state`` with hyperparameters ``hp`` (one run, no run axis)."""
        record = algo_registry.make(algo, spec, net, **options)
        arrays = {**named_leaves(state, "state"), **named_leaves(hp, "hp")}
        tensors = {name: np.asarray(arrays[name]) for name in acting_names(record, spec)}
        return cls(algo=algo, spec=spec, net=net, options=dict(options), env=env,
                   encoder=encoder_record(spec.embed_dim), provenance=dict(provenance), tensors=tensors)

    def __repr__(self) -> str:
        """What it acts on and where it comes from; the tensors counted, not printed."""
        spec, origin = self.spec, self.provenance
        actions = f"{spec.action_dim} {'discrete' if spec.discrete else 'continuous'}"
        parameters = sum(int(np.prod(np.shape(a))) for a in self.tensors.values())
        where = "".join(f", {k}={origin[k]!r}" for k in ("run", "seed", "ratio", "data", "steps") if k in origin)
        return (f"Policy(algo={self.algo!r}, env={self.env!r}, obs_dim={spec.obs_dim} (state {spec.state_dim} + "
                f"embedding {spec.embed_dim}), actions={actions}, net={self.net}"
                + (f", options={self.options}" if self.options else "")
                + f", encoder={self.encoder and self.encoder['model']!r}, "
                f"{len(self.tensors)} tensors ({parameters:,} parameters){where})")

    # -- running it ----------------------------------------------------------------------------
    @functools.cached_property
    def algorithm(self) -> Algorithm:
        """The algorithm record (pure functions) this policy acts with."""
        return algo_registry.make(self.algo, self.spec, self.net, **self.options)

    def fill(self, tensors: Mapping[str, Any]) -> tuple[PyTree, PyTree]:
        """(state, hp) of one run: ``tensors`` (name -> leaf) where stored, zeros where ``act`` reads
        nothing. Inside a traced function the zeros are never built (nothing reads them)."""
        state, hp = template(self.algorithm, self.spec)
        fill = lambda prefix, tree: jax.tree_util.tree_unflatten(
            jax.tree.structure(tree), [jnp.asarray(tensors[name]) if name in tensors
                                       else jnp.zeros(leaf.shape, leaf.dtype)
                                       for name, leaf in named_leaves(tree, prefix).items()])
        return fill("state", state), fill("hp", hp)

    @functools.cached_property
    def state(self) -> tuple[PyTree, PyTree]:
        """(state, hp) of one run as arrays: the stored leaves, zeros where ``act`` reads nothing."""
        # Concrete arrays even when first read while a function is traced: the cache outlives the trace.
        with jax.ensure_compile_time_eval():
            return self.fill(self.tensors)

    @functools.cached_property
    def _predict(self) -> Any:
        act, fill = self.algorithm.act, self.fill

        def predict(tensors: Mapping[str, Any], obs: jax.Array) -> jax.Array:
            state, hp = fill(tensors)
            return act(state, obs, jax.random.PRNGKey(0), hp, True)

        return jax.jit(predict)

    def policy_fn(self) -> Any:
        """``(obs (B, S+E), key) -> actions``, deterministic, for :func:`imaginejax.training.evaluation.evaluate`
        (jit it: the leaves ``act`` never reads are then never built)."""
        act, fill, tensors = self.algorithm.act, self.fill, self.tensors

        def policy(obs: jax.Array, key: jax.Array) -> jax.Array:
            state, hp = fill(tensors)
            return act(state, obs, key, hp, True)

        return policy

    def predict(self, obs: Any) -> np.ndarray:
        """Deterministic actions, jitted: obs (B, S+E) -> (B,) int32 (discrete) or (B, A) float32."""
        obs = np.asarray(obs, np.float32)
        if obs.ndim != 2 or obs.shape[1] != self.spec.obs_dim:
            raise ValueError(f"predict takes observations (B, S+E) = (B, {self.spec.obs_dim}) (state {self.spec.state_dim} "
                             f"⊕ embedding {self.spec.embed_dim}), got {list(obs.shape)}")
        return np.asarray(self._predict(self.tensors, obs))

    def embed(self, instructions: str | Sequence[str]) -> np.ndarray:
        """Instruction string(s) -> (M, E) with the encoder recorded at training.

        Raises:
          PolicyError: the installed encoder is not the one the policy was trained with.
        """
        texts = [instructions] if isinstance(instructions, str) else list(instructions)
        if self.encoder is None:
            raise PolicyError(f"this {self.algo} policy takes no instruction (trained with E = 0): call "
                              "act(states) or predict(states)")
        from imaginejax.lang import default_encoder, encode_instructions

        found = default_encoder()
        if found.fingerprint != self.encoder["fingerprint"]:
            raise PolicyError(f"the policy was trained with the {self.encoder['model']} encoder of fingerprint "
                              f"{self.encoder['fingerprint'][:16]}…, the installed {found.model_id} has "
                              f"{found.fingerprint[:16]}…: install the same encoder weights")
        return encode_instructions(texts, normalize=bool(self.encoder["normalize"]))

    def act(self, states: Any, instruction: str | Sequence[str] | None = None) -> np.ndarray:
        """Actions for states (B, S) (or one state (S,)) given one instruction for all or one per row."""
        states = np.asarray(states, np.float32)
        single = states.ndim == 1
        states = np.atleast_2d(states)
        if instruction is None:
            if self.spec.embed_dim:
                raise PolicyError("this policy is conditioned on an instruction: act(states, instruction)")
            embedding = np.zeros((states.shape[0], 0), np.float32)
        else:
            embedding = self.embed(instruction)
            if embedding.shape[0] not in (1, states.shape[0]):
                raise ValueError(f"{embedding.shape[0]} instructions for {states.shape[0]} states: give one, or one per state")
            embedding = np.broadcast_to(embedding, (states.shape[0], embedding.shape[1]))
        actions = self.predict(np.concatenate([states, embedding], axis=1))
        return actions[0] if single else actions

    def __call__(self, observation: Mapping[str, Any]) -> np.ndarray:
        """The action of a Gymnasium observation of :mod:`imaginejax.interop.gym_adapter` (one
        environment's dict, or a vector environment's batched dict): ``state`` ⊕ ``embedding`` (or the
        ``instruction`` text embedded when the environment gives no embedding)."""
        states = np.asarray(observation["state"], np.float32)
        single = states.ndim == 1
        states = np.atleast_2d(states)
        if self.spec.embed_dim and "embedding" in observation:
            embedding = np.atleast_2d(np.asarray(observation["embedding"], np.float32))
        elif self.spec.embed_dim:
            text = observation["instruction"]
            if not all(isinstance(t, str) for t in ([text] if isinstance(text, str) else text)):
                raise PolicyError("the observation has neither an embedding nor an instruction text: make the "
                                  "environment with embed=True or instruction='text'")
            embedding = self.embed(text)
        else:
            embedding = np.zeros((states.shape[0], 0), np.float32)
        actions = self.predict(np.concatenate([states, embedding], axis=1))
        return actions[0] if single else actions

    # -- evaluating it ---------------------------------------------------------------------------
    def evaluate(self, level: str, episodes: int, seed: int = 0) -> "EvalResult":
        """Success of this policy on ``level`` of its environment through the jitted evaluation of
        training (:func:`imaginejax.training.evaluation.evaluate`, every task equally often, key ``PRNGKey(seed)``)."""
        from imaginejax.training.evaluation import evaluate

        env, params = self.environment(level)
        run = jax.jit(lambda key: evaluate(self.policy_fn(), env, params, key, episodes))
        return jax.device_get(run(jax.random.PRNGKey(seed)))

    def environment(self, level: str) -> tuple[Any, Any]:
        """(env, params) of ``level`` of its environment, instructions embedded by its recorded encoder."""
        from imaginejax import envs

        embed = None if self.encoder is None else (lambda texts: self.embed(list(texts)))
        return envs.make(self.env, level, embed=embed)

    # -- files -----------------------------------------------------------------------------------
    def record(self, checksum: str) -> dict[str, Any]:
        """The JSON record of :meth:`save`."""
        return {"format": FORMAT, "version": VERSION, "algo": self.algo, "options": self.options,
                "net": None if self.net is None else dataclasses.asdict(self.net),
                "spec": dataclasses.asdict(self.spec), "encoder": self.encoder, "env": self.env,
                "provenance": self.provenance, "imaginejax": __version__,
                "tensors": {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in self.tensors.items()},
                "sha256": checksum}

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """``directory/policy.safetensors`` and ``directory/policy.json`` (each written atomically)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # np.ascontiguousarray makes a 0-d array 1-d: reshaped back, a scalar leaf (BCQ's threshold) keeps its shape.
        data = safetensors.numpy.save({name: np.ascontiguousarray(a).reshape(np.shape(a)) for name, a in self.tensors.items()})
        write_bytes(directory / TENSORS_FILE, data)
        write_json(directory / RECORD_FILE, self.record(hashlib.sha256(data).hexdigest()))
        return directory

    @classmethod
    def from_results(cls, results: "Results", algo: str | None = None, seed: int | None = None,
                     ratio: float | None = None, data: str | None = None,
                     hp: Mapping[str, float] | None = None) -> "Policy":
        """The trained policy of the one run of ``results`` matching the given fields (:func:`from_results`)."""
        return from_results(results, algo=algo, seed=seed, ratio=ratio, data=data, hp=hp)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> "Policy":
        """The policy saved in ``directory`` by :meth:`save`.

        Raises:
          PolicyError: a file is missing, unreadable or damaged (checksum); a field of the record is not what
            :func:`check_record` allows (checked before anything is traced or built); the tensors disagree
            with the algorithm's state (names, shapes, dtypes) or a value is not finite.
        """
        directory = Path(directory)
        record_path, tensors_path = directory / RECORD_FILE, directory / TENSORS_FILE
        for path in (record_path, tensors_path):
            if not path.is_file():
                raise PolicyError(f"{path} is missing: {directory} is not a policy directory (write one with "
                                  "imaginejax export or Policy.save)")
        try:
            record = json.loads(record_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
            raise PolicyError(f"{record_path} is not valid JSON ({error}): export the policy again") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise PolicyError(f"{record_path} is not an ImagineJAX policy record (format {FORMAT!r} expected)")
        if record.get("version") != VERSION:
            raise PolicyError(f"{record_path} is policy format version {record.get('version')!r}; this code reads "
                              f"version {VERSION}: export it again with this version")
        data = tensors_path.read_bytes()
        if hashlib.sha256(data).hexdigest() != record.get("sha256"):
            raise PolicyError(f"{tensors_path} does not match the SHA-256 in {record_path}: the file was damaged or "
                              "replaced; export the policy again")
        try:
            tensors = safetensors.numpy.load(data)
        except Exception as error:  # safetensors reports a malformed header as its own error types
            raise PolicyError(f"{tensors_path} is not a readable safetensors file ({error})") from None
        policy = check_record(record, record_path, tensors)
        try:
            algorithm = policy.algorithm
        except (TypeError, ValueError) as error:
            raise PolicyError(f"{record_path} does not describe a policy this code can build ({type(error).__name__}: "
                              f"{error}): export it again") from None
        spec = policy.spec
        state, hp = template(algorithm, spec)
        expected = {**named_leaves(state, "state"), **named_leaves(hp, "hp")}
        wanted = acting_names(algorithm, spec)
        if sorted(tensors) != sorted(wanted):
            missing, extra = sorted(set(wanted) - set(tensors)), sorted(set(tensors) - set(wanted))
            raise PolicyError(f"{tensors_path} does not hold what a {policy.algo} policy for {spec} acts with "
                              f"(missing {missing[:3]}, unexpected {extra[:3]}): export it again")
        for name, value in tensors.items():
            leaf = expected[name]
            if value.shape != tuple(leaf.shape) or value.dtype != leaf.dtype:
                raise PolicyError(f"{tensors_path}: {name} is {value.dtype}{list(value.shape)} but the recorded "
                                  f"{policy.algo} network needs {leaf.dtype}{list(leaf.shape)}")
            if np.issubdtype(value.dtype, np.inexact) and not np.all(np.isfinite(value)):
                raise PolicyError(f"{tensors_path}: {name} holds non-finite values")
        return dataclasses.replace(policy, tensors=tensors)


# ---------------------------------------------------------------------------------------------------
# Checking a record before anything is built from it
# ---------------------------------------------------------------------------------------------------
def _refuse(path: Path, field: str, value: Any, problem: str, fix: str = "export the policy again") -> PolicyError:
    return PolicyError(field_problem(path, field, value, problem, fix))


def _count(path: Path, field: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in [low, high] (JSON booleans are not counts)."""
    if type(value) is not int:
        raise _refuse(path, field, value, "not an integer")
    if not low <= value <= high:
        raise _refuse(path, field, value, f"outside [{low}, {high}]")
    return value


def _option(path: Path, field: str, value: Any, default: Any, annotation: Any) -> Any:
    """A static option read from JSON, checked against its factory default (and annotation, for
    None-able fields): booleans, counts, widths, floats, None, and dataclass tables of these."""
    text = str(annotation)
    if value is None and (default is None or "None" in text):
        return None
    if dataclasses.is_dataclass(default):
        if not isinstance(value, dict):
            raise _refuse(path, field, value, f"not a table of {type(default).__name__} fields")
        known = {f.name: f for f in dataclasses.fields(default)}
        for key, sub in value.items():
            if key not in known:
                raise _refuse(path, f"{field}.{key}", sub, f"{type(default).__name__} has no such field; valid: "
                              f"{', '.join(known)}")
            _option(path, f"{field}.{key}", sub, getattr(default, key), known[key].type)
        return value
    if isinstance(default, bool):
        if type(value) is not bool:
            raise _refuse(path, field, value, "not true or false")
    elif isinstance(default, int) or (default is None and "int" in text.replace("|", " ").split()):
        _count(path, field, value, 0, MAX_COUNT)
    elif isinstance(default, float):
        if type(value) not in (int, float) or not np.isfinite(value):
            raise _refuse(path, field, value, "not a finite number")
    elif isinstance(default, tuple) and all(type(v) is int for v in default):
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_LAYERS:
            raise _refuse(path, field, value, f"not a list of 1 to {MAX_LAYERS} widths")
        for i, width in enumerate(value):
            _count(path, f"{field}[{i}]", width, 1, MAX_WIDTH)
    else:
        raise _refuse(path, field, value, f"not a value a policy record can hold (default {default!r})")
    return value


def _env_spec(name: str) -> tuple[int, bool, int]:
    """(state width S, discrete, action count or width) of environment ``name``, from its class alone."""
    from imaginejax import envs

    env = envs.entry(name).env_class()
    return int(env.state_dim), bool(env.discrete), int(env.num_actions if env.discrete else env.action_dim)


def check_record(record: Mapping[str, Any], path: Path, tensors: Mapping[str, np.ndarray]) -> Policy:
    """The policy a ``policy.json`` record describes, with ``tensors`` (the tensors file's), every field
    checked before anything is traced or built: registry names, types, the environment's own widths, the
    network's widths and layer counts within bounds and present in the tensors, the tensors table.

    Raises:
      PolicyError: naming the file, the field, the value and the fix.
    """
    import inspect

    from imaginejax import envs
    from imaginejax.lang import EMBED_DIM

    unknown = sorted(set(record) - set(RECORD_FIELDS))
    if unknown:
        raise _refuse(path, unknown[0], record[unknown[0]], f"not a field of a policy record (fields: "
                      f"{', '.join(RECORD_FIELDS)})")
    missing = [f for f in RECORD_FIELDS if f not in record]
    if missing:
        raise PolicyError(f"{path}: field {missing[0]} is missing: export the policy again")
    algo, env = record["algo"], record["env"]
    if not isinstance(algo, str) or algo_registry.variant(algo)[0] not in algo_registry.registered():
        raise _refuse(path, "algo", algo, f"not a registered algorithm (valid: {', '.join(algo_registry.registered())})")
    if not isinstance(env, str) or env not in envs.registered():
        raise _refuse(path, "env", env, f"not a registered environment (valid: {', '.join(envs.registered())})")

    raw = record["spec"]
    fields = [f.name for f in dataclasses.fields(Spec)]
    if not isinstance(raw, dict) or sorted(raw) != sorted(fields):
        raise _refuse(path, "spec", raw, f"not a table of exactly {', '.join(fields)}")
    if type(raw["discrete"]) is not bool:
        raise _refuse(path, "spec.discrete", raw["discrete"], "not true or false")
    spec = Spec(state_dim=_count(path, "spec.state_dim", raw["state_dim"], 1, MAX_WIDTH),
                embed_dim=_count(path, "spec.embed_dim", raw["embed_dim"], 0, MAX_WIDTH),
                discrete=raw["discrete"], action_dim=_count(path, "spec.action_dim", raw["action_dim"], 1, MAX_WIDTH))
    state_dim, discrete, action_dim = _env_spec(env)
    for field, got, want in (("state_dim", spec.state_dim, state_dim), ("discrete", spec.discrete, discrete),
                             ("action_dim", spec.action_dim, action_dim)):
        if got != want:
            raise _refuse(path, f"spec.{field}", got, f"environment {env!r} has {want} (a policy runs only in "
                          "the environment it was trained on)")
    if spec.embed_dim not in (0, EMBED_DIM):
        raise _refuse(path, "spec.embed_dim", spec.embed_dim, f"the sentence encoder gives {EMBED_DIM} (0: none)")

    encoder = record["encoder"]
    if spec.embed_dim == 0 and encoder is not None:
        raise _refuse(path, "encoder", encoder, "a policy without instruction embeddings (embed_dim 0) has none (null)")
    if spec.embed_dim:
        if not isinstance(encoder, dict) or sorted(encoder) != sorted(ENCODER_FIELDS):
            raise _refuse(path, "encoder", encoder, f"not a table of exactly {', '.join(ENCODER_FIELDS)}")
        if not isinstance(encoder["model"], str) or len(encoder["model"]) > 200:
            raise _refuse(path, "encoder.model", encoder["model"], "not a model name")
        if encoder["dim"] != spec.embed_dim or type(encoder["dim"]) is not int:
            raise _refuse(path, "encoder.dim", encoder["dim"], f"spec.embed_dim is {spec.embed_dim}")
        fingerprint = encoder["fingerprint"]
        if not (isinstance(fingerprint, str) and len(fingerprint) == 64 and set(fingerprint) <= set("0123456789abcdef")):
            raise _refuse(path, "encoder.fingerprint", fingerprint, "not a SHA-256 (64 hexadecimal digits)")
        if type(encoder["normalize"]) is not bool:
            raise _refuse(path, "encoder.normalize", encoder["normalize"], "not true or false")

    raw, net = record["net"], None
    if raw is not None:
        fields = [f.name for f in dataclasses.fields(NetConfig)]
        if not isinstance(raw, dict) or sorted(raw) != sorted(fields):
            raise _refuse(path, "net", raw, f"not null or a table of exactly {', '.join(fields)}")
        hidden = raw["hidden"]
        if not isinstance(hidden, list) or not 1 <= len(hidden) <= MAX_LAYERS:
            raise _refuse(path, "net.hidden", hidden, f"not a list of 1 to {MAX_LAYERS} widths")
        net = NetConfig(encoder_width=_count(path, "net.encoder_width", raw["encoder_width"], 1, MAX_WIDTH),
                        encoder_layers=_count(path, "net.encoder_layers", raw["encoder_layers"], 1, MAX_LAYERS),
                        hidden=tuple(_count(path, f"net.hidden[{i}]", w, 1, MAX_WIDTH) for i, w in enumerate(hidden)))
        # Every network starts with the tanh encoder (algos/networks.py), one kernel and one bias per layer,
        # and ends with at least one more layer; its width is among the tensors' dimensions.
        if 2 * (net.encoder_layers + 1) > len(tensors):
            raise _refuse(path, "net.encoder_layers", net.encoder_layers, f"a network of {net.encoder_layers} encoder "
                          f"layers and an output layer holds {2 * (net.encoder_layers + 1)} tensors; {TENSORS_FILE} "
                          f"holds {len(tensors)}")
        dims = sorted({d for a in tensors.values() for d in a.shape})
        if net.encoder_width not in dims:
            raise _refuse(path, "net.encoder_width", net.encoder_width, f"no tensor of {TENSORS_FILE} has this "
                          f"width (widths: {dims[:12]})")

    options = record["options"]
    if not isinstance(options, dict):
        raise _refuse(path, "options", options, "not a table of the algorithm's static options")
    try:
        factory, valid = algo_registry.factory(algo, spec.discrete), algo_registry.static_options(algo, spec.discrete)
    except ValueError as error:
        raise _refuse(path, "algo", algo, str(error)) from None
    for key, value in options.items():
        if key not in valid:
            raise _refuse(path, f"options.{key}", value, f"{algo} ({'discrete' if spec.discrete else 'continuous'}) "
                          f"has no such option; valid: {', '.join(valid) or 'none'}")
        parameter = inspect.signature(factory).parameters[key]
        _option(path, f"options.{key}", value, parameter.default, parameter.annotation)

    if not isinstance(record["provenance"], dict):
        raise _refuse(path, "provenance", record["provenance"], "not a table")
    if not isinstance(record["imaginejax"], str):
        raise _refuse(path, "imaginejax", record["imaginejax"], "not a version string")
    table = record["tensors"]
    found = {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in tensors.items()}
    if table != found:
        raise _refuse(path, "tensors", table, f"the table does not list the names, dtypes and shapes "
                      f"{TENSORS_FILE} holds")
    return Policy(algo=algo, spec=spec, net=net, options=dict(options), env=env, encoder=encoder,
                  provenance=dict(record["provenance"]), tensors={})


# ---------------------------------------------------------------------------------------------------
# In the Gymnasium adapter
# ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GymEvaluation:
    """Episodes of a policy in :class:`~imaginejax.interop.gym_adapter.ImagineVectorEnv`.

    Attributes:
      success: (N,) bool, whether episode i (task ``i mod K``) succeeded.
      tasks: (N,) its task.
      task_success: (K,) success rate per task.
    """

    success: np.ndarray
    tasks: np.ndarray
    task_success: np.ndarray

    @property
    def success_rate(self) -> float:
        """Fraction of successful episodes."""
        return float(self.success.mean())


def evaluate_gym(policy: Policy, level: str, episodes: int, seed: int = 0) -> GymEvaluation:
    """Runs N episodes of ``policy`` in a Gymnasium vector environment of its environment (N rounded up
    to a multiple of the level's K tasks; episode i runs task ``i mod K``; reset with ``seed``: row i
    starts from ``PRNGKey(seed + i)``), each to its first end (success or the step cap)."""
    from imaginejax import envs
    from imaginejax.interop.gym_adapter import make_vec
    from imaginejax.training.evaluation import episodes_per_level

    num_tasks = int(envs.make(policy.env, level)[1].num_tasks)
    n = episodes_per_level(episodes, num_tasks)
    env = make_vec(policy.env, level, num_envs=n, embed=policy.spec.embed_dim > 0)
    tasks = np.arange(n) % num_tasks
    obs, _ = env.reset(seed=seed, options={"task": tasks})
    success, done = np.zeros(n, bool), np.zeros(n, bool)
    for _ in range(int(env.params.max_steps)):
        obs, _, terminated, truncated, _ = env.step(policy(obs))
        success |= terminated & ~done
        done |= terminated | truncated
        if done.all():
            break
    env.close()
    per_task = np.bincount(tasks, weights=success, minlength=num_tasks) / np.bincount(tasks, minlength=num_tasks)
    return GymEvaluation(success=success, tasks=tasks, task_success=per_task)


# ---------------------------------------------------------------------------------------------------
# From a result: in memory or a workspace on disk
# ---------------------------------------------------------------------------------------------------
def from_results(results: "Results", algo: str | None = None, seed: int | None = None, ratio: float | None = None,
                 data: str | None = None, hp: Mapping[str, float] | None = None) -> Policy:
    """The policy of the one run of ``results`` that matches every given field
    (:func:`imaginejax.bench.results.find_run`; ``data="real"`` names the real-only runs).

    Raises:
      PolicyError: no run or several runs match (the message names the values and the fields that tell them
        apart), or the result holds no trained states for the algorithm.
    """
    from imaginejax.bench.results import find_run

    try:
        run = find_run(results, algo=algo, seed=seed, ratio=ratio, data=data, hp=hp)
    except ValueError as error:
        raise PolicyError(str(error)) from None
    trained = results.trained.get(run.algo)
    if trained is None:
        raise PolicyError(f"the results hold no trained states of {run.algo}: train it with fit() or bench.train, or "
                          "read a workspace with load_sweep")
    if isinstance(trained, (str, os.PathLike)):
        trained = trained_from_disk(Path(trained), run.algo, run.run)
    state = jax.tree.map(lambda x: np.asarray(x)[trained.row(run.run)], trained.states)
    record = algo_registry.make(run.algo, trained.spec, trained.net, **trained.options)
    from imaginejax.training.sweep import RunSpec, Sweep

    spec_row = RunSpec(run=0, config=0, seed=run.seed, ratio=run.ratio, hp=dict(run.hp), data=run.data)
    hp_one = jax.tree.map(lambda x: x[0], Sweep((spec_row,)).build(record.default_hp(trained.spec)).hp)
    provenance = {"run": run.run, "seed": run.seed, "ratio": run.ratio, "data": run.data, "hp": dict(run.hp),
                  "steps": run.steps[-1] if run.steps else 0, "finite": run.finite,
                  "success": {lv: v[-1] for lv, v in run.success.items() if v}, "source": trained.source}
    return Policy.from_state(run.algo, trained.spec, trained.net, trained.options, trained.env, state, hp_one,
                             provenance)


def trained_from_disk(sweep_dir: Path, algo: str, run: int) -> "TrainedRuns":
    """The trained states of the chunk holding ``run``, from its final checkpoint in a workspace's
    ``runs/<algo>/checkpoints/`` (the network, options and environment from ``workspace.json``).

    Raises:
      PolicyError: the sweep is not in a workspace, has no checkpoint of the run, or is not finished.
    """
    from imaginejax import envs
    from imaginejax.bench.config import Config, from_dict
    from imaginejax.bench.results import RETRAIN, SWEEP_FILE, TrainedRuns
    from imaginejax.bench.sweeps import algorithm_shapes
    from imaginejax.bench.workspace import WORKSPACE_FILE, WORKSPACE_FIX, workspace_config
    from imaginejax.core.checkpoint import list_checkpoints, load_checkpoint
    from imaginejax.core.files import fields_of, read_json
    from imaginejax.lang import EMBED_DIM

    workspace = sweep_dir.parent.parent
    found = workspace_config(sweep_dir)
    if found is None:
        raise PolicyError(f"{sweep_dir} is not in a workspace ({workspace / WORKSPACE_FILE} is missing): its network and "
                          "options are recorded there; export from the workspace imaginejax train / bench wrote")
    with fields_of(workspace / WORKSPACE_FILE, WORKSPACE_FIX):
        config = from_dict(Config, found[1])
    net, options = algorithm_shapes(config.train, algo)
    env, _ = envs.make(config.data.env, "train")
    spec = Spec(state_dim=int(env.state_dim), embed_dim=EMBED_DIM if config.data.embed else 0,
                discrete=bool(env.discrete), action_dim=int(env.num_actions if env.discrete else env.action_dim))
    with fields_of(sweep_dir / SWEEP_FILE, RETRAIN):
        intervals = int(read_json(sweep_dir / SWEEP_FILE, RETRAIN)["engine"]["num_intervals"])
    for chunk in sorted((sweep_dir / "checkpoints").glob("chunk-*")):
        found = list_checkpoints(chunk)
        if not found:
            continue
        interval, path = found[-1]
        manifest, arrays = load_checkpoint(path)
        runs = tuple(int(r) for r in manifest["meta"]["runs"])
        if run not in runs:
            continue
        if interval != intervals:
            raise PolicyError(f"run {run} of {sweep_dir} is trained up to interval {interval} of {intervals} ({path}): "
                              "finish the sweep first (re-run the same imaginejax train / bench command)")
        state, _ = template(algo_registry.make(algo, spec, net, **options), spec)
        leaves = []
        for name, leaf in named_leaves(state, "state.algo").items():
            value = arrays.get(name)
            if value is None or value.shape[1:] != tuple(leaf.shape) or value.dtype != leaf.dtype:
                got = "nothing" if value is None else f"{value.dtype}{list(value.shape[1:])}"
                raise PolicyError(f"{path}: {name} is {got} per run, the {algo} of {workspace / WORKSPACE_FILE} needs "
                                  f"{leaf.dtype}{list(leaf.shape)}: the checkpoint is of another configuration")
            leaves.append(value[: len(runs)])
        states = jax.tree_util.tree_unflatten(jax.tree.structure(state), leaves)
        return TrainedRuns(env=config.data.env, spec=spec, net=net, options=options, states=states, runs=runs,
                           source=str(path))
    raise PolicyError(f"{sweep_dir / 'checkpoints'} holds no checkpoint of run {run}: train the sweep with checkpoints "
                      "(imaginejax train / bench write them)")
