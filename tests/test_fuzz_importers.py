"""Property / fuzz tests of the reference-file importers (hypothesis).

Invariant: a file imports exactly (what a legitimate file holds) or raises our DatasetError; it never
crashes the process, never reads another file and never runs code. Inputs: random values of the accepted
kinds pickled with protocols 2–5 (exact round trip), the same streams with opcodes deleted, repeated,
swapped or inserted (code-running globals among them), byte flips and truncations of .npy / HDF5 / parquet
files (read in one child process with an audit hook, so a crash fails the test instead of killing pytest),
and random HDF5 layouts (chunking, filters, external storage, virtual datasets, links, dtypes).
Policy records (``policy.json``) with random field mutations — wrong types, huge widths and layer counts,
path-like and other environments' names — load exactly what the record says or raise PolicyError, in one
child process under a memory cap and a per-record time limit.
Budgets are small (a few seconds each) and the examples fixed; raise max_examples and set
IMAGINEJAX_FUZZ_RANDOM=1 locally to search longer."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from imaginejax.data import DatasetError
from imaginejax.data.safe_pickle import read_pickle
from imaginejax.interop.reference import read_reference_file

REPO = Path(__file__).resolve().parents[1]


def budget(examples: int) -> settings:
    """A small fuzz budget, no example database, no deadline; the same examples on every run unless
    ``IMAGINEJAX_FUZZ_RANDOM=1`` (then new ones each run: search locally, since pyarrow aborts the process on
    about 1 in 2,000 byte-flipped parquet footers, which a random CI run would hit now and then)."""
    return settings(max_examples=examples, deadline=None, database=None,
                    derandomize=os.environ.get("IMAGINEJAX_FUZZ_RANDOM") != "1",
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------------------------------ pickle values

DTYPES = st.sampled_from(["?", "i1", "i2", "<i4", ">i4", "i8", "u1", "u2", "u4", "<u8", "f2", "<f4", ">f4", "f8",
                          "c8", "c16", "U3", "S2"])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(DTYPES))
    value = draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)))
    return np.asfortranarray(value) if draw(st.booleans()) else value


LEAVES = st.one_of(arrays(), TEXT, st.integers(-2**70, 2**70), st.floats(allow_nan=False), st.booleans(),
                   st.none(), st.binary(max_size=5))
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.tuples(inner, inner),
                                                      st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes(order="A") == b.tobytes(order="A") and a.flags.f_contiguous == b.flags.f_contiguous)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@budget(120)
@given(value=VALUES, protocol=st.integers(2, 5), wrapped=st.booleans())
def test_accepted_values_round_trip_exactly(value: object, protocol: int, wrapped: bool) -> None:
    """Whatever NumPy / pickle write for arrays of accepted dtypes, strings and plain containers is read
    back exactly (np.save wraps a dict in a 0-d object array: ``wrapped``)."""
    if wrapped:
        holder = np.empty((), dtype=object)
        holder[()] = value
        got = read_pickle(pickle.dumps(holder, protocol=protocol), field="f")
        assert isinstance(got, np.ndarray) and got.dtype == object and got.shape == ()
        got = got.item()
    else:
        got = read_pickle(pickle.dumps(value, protocol=protocol), field="f")
    assert same(value, got), (value, got)


def _plain_output(value: object) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufcUS" or (value.dtype == object and all(_plain_output(v) for v in value.flat))
    if isinstance(value, dict):
        return all(type(k) in (str, int) and _plain_output(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain_output(v) for v in value)
    return value is None or type(value) in (bool, int, float, str, bytes) or isinstance(value, np.generic)


def _ops(stream: bytes) -> list[bytes]:
    """The stream cut at opcode boundaries (PROTO first, STOP last)."""
    starts = [pos for _, _, pos in pickletools.genops(stream)] + [len(stream)]
    return [stream[a:b] for a, b in zip(starts, starts[1:])]


def _code_ops(marker: Path) -> list[bytes]:
    """Opcodes that would run a command creating ``marker`` if anything called what they name."""
    command = f"touch {marker}".encode()
    arg = b"\x8c" + bytes([len(command)]) + command
    return [b"cos\nsystem\n", b"cposix\nsystem\n", b"cbuiltins\neval\n", b"csubprocess\ncall\n",
            b"\x8c\x02os\x8c\x06system\x93", arg, arg + b"\x85R", b"R", b"b", b"\x81", b"\x92",
            b"cnumpy\ndtype\n", b"cnumpy._core.multiarray\n_reconstruct\n", b"cnumpy\nndarray\n",
            b"(", b"t", b")", b"]", b"}", b"a", b"e", b"s", b"u", b"\x94", b"h\x00", b"2", b"0", b"1",
            b"\x8c\x02V8", b"\x8c\x02O8", b"K?", b"K\x00", b"N", b"\x88"]


@budget(200)
@given(value=VALUES, protocol=st.integers(2, 5), edits=st.lists(
    st.tuples(st.sampled_from(["delete", "repeat", "swap", "insert"]), st.integers(0, 10**6),
              st.integers(0, 10**6)), min_size=1, max_size=4))
def test_mutated_pickles_are_read_or_refused_and_never_run_code(tmp_path_factory: pytest.TempPathFactory,
                                                                value: object, protocol: int,
                                                                edits: list[tuple[str, int, int]]) -> None:
    """Random pickles built from the accepted opcodes (valid streams with opcodes deleted, repeated,
    swapped or inserted, code-running globals among the insertions): read into plain values or refused
    with DatasetError — never another exception, never a call."""
    marker = tmp_path_factory.getbasetemp() / "fuzz-pwned"
    holder = np.empty((), dtype=object)
    holder[()] = value
    ops = _ops(pickle.dumps(holder, protocol=protocol))
    pool = _code_ops(marker)
    for kind, i, j in edits:
        body = ops[1:-1]  # PROTO and STOP stay in place
        if kind == "insert" or not body:
            body.insert(i % (len(body) + 1), pool[j % len(pool)])
        elif kind == "delete":
            del body[i % len(body)]
        elif kind == "repeat":
            body.insert(i % len(body), body[i % len(body)])
        else:
            a, b = i % len(body), j % len(body)
            body[a], body[b] = body[b], body[a]
        ops = [ops[0], *body, ops[-1]]
    try:
        got = read_pickle(b"".join(ops), field="fuzz.npy")
    except DatasetError as err:
        assert err.field and err.problem and err.fix
    else:
        assert _plain_output(got)
    assert not marker.exists()


# ------------------------------------------------------------------------- byte flips in a child process

CHILD = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import imaginejax.interop.reference as reference
    from imaginejax.data.errors import DatasetError

    reference.HDF5_SECONDS = (10.0, 0.0)
    folder = Path(sys.argv[1]).resolve()
    allowed = [folder, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.argv[2]).resolve(),
               Path("/proc"), Path("/sys"), Path("/dev")]
    tempfile.gettempdir()  # probes the temporary directory once, before the hook
    # Libraries the readers import lazily, imported before the hook: the hook watches what reading a file
    # opens, not their import-time reads (pandas, which pyarrow loads when present, opens the system's
    # time-zone database).
    import importlib.util
    import pyarrow.parquet
    if importlib.util.find_spec("pandas") is not None:
        import pandas
    strays = []

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes)):
            path = Path(args[0] if isinstance(args[0], str) else args[0].decode()).resolve()
            if not any(path.is_relative_to(root) for root in allowed) and "imaginejax-hdf5-" not in str(path):
                strays.append(f"open {path}")
        elif event in ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
            strays.append(event)
        elif event == "subprocess.Popen" and "hdf5_reader.py" not in " ".join(map(str, args[1])):
            strays.append(f"Popen {args[1]}")

    sys.addaudithook(audit)
    for file in sorted(folder.iterdir()):
        print(json.dumps({"start": file.name}), flush=True)
        try:
            reference.read_reference_file(file)
            outcome = "ok"
        except DatasetError:
            outcome = "DatasetError"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        print(json.dumps({"file": file.name, "outcome": outcome, "strays": strays}), flush=True)
        strays.clear()
""")


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """One small legitimate file per container, in the reference layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("originals")
    arrays = {"observations": np.arange(2 * 5 * 4, dtype=np.float32).reshape(2, 5, 4),
              "actions": np.ones((2, 5), np.int32), "masks": np.ones((2, 5, 1), np.float32),
              "instructions": np.array(["go to the red ball", "open the door"])}
    np.save(folder / "a.npy", dict(arrays, imaginejax='{"env": "babyai"}'), allow_pickle=True)
    with h5py.File(folder / "a.h5", "w") as f:
        f["observations"] = arrays["observations"]
        f.create_dataset("actions", data=arrays["actions"], chunks=(1, 5), compression="gzip", shuffle=True)
        f.create_dataset("instructions", data=arrays["instructions"].astype(object), dtype=h5py.string_dtype())
        f.attrs["imaginejax"] = '{"env": "babyai"}'
    table = pa.table({"observations": pa.array(arrays["observations"].reshape(2, -1).tolist()),
                      "instructions": pa.array(arrays["instructions"].tolist())})
    pq.write_table(table.replace_schema_metadata({b"imaginejax": b'{"env": "babyai"}'}), folder / "a.parquet")
    return {kind: (folder / f"a.{kind}").read_bytes() for kind in ("npy", "h5", "parquet")}


def test_byte_flips_and_truncations_never_crash_read_outside_or_run_code(tmp_path: Path,
                                                                         originals: dict[str, bytes]) -> None:
    folder = tmp_path / "mutants"
    folder.mkdir()
    written: list[Path] = []

    @budget(150)
    @given(kind=st.sampled_from(sorted(originals)), cut=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
           flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=6))
    def mutate(kind: str, cut: float | None, flips: list[tuple[float, int]]) -> None:
        data = bytearray(originals[kind])
        for where, byte in flips:
            data[int(where * len(data))] = byte
        if cut is not None:
            data = data[: int(cut * len(data))]
        file = folder / f"{len(written):04d}.{kind}"
        file.write_bytes(bytes(data))
        written.append(file)

    mutate()
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(REPO)], capture_output=True, text=True,
                          timeout=600)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    started = [r["start"] for r in records if "start" in r]
    assert done.returncode == 0, f"the importer crashed the process on {started[-1:]}: {done.stderr[-2000:]}"
    results = [r for r in records if "file" in r]
    assert len(results) == len(written)
    for r in results:
        assert r["outcome"] in ("ok", "DatasetError") and not r["strays"], r
    assert any(r["outcome"] == "ok" for r in results) and any(r["outcome"] == "DatasetError" for r in results)


# ---------------------------------------------------------------------------------- random HDF5 layouts

PLAIN_DTYPES = ["<f4", ">f8", "<i4", "u1", "?", "<i8"]
REFUSED_DTYPES = ["compound", "vlen int", "reference"]
STORAGES = ["contiguous", "chunked", "gzip", "shuffle+gzip+fletcher32", "lzf", "external", "virtual"]
NAMES = ["actions", "masks", "observations", "rewards", "terminals"]


@st.composite
def layouts(draw: st.DrawFn) -> list[dict]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    out = []
    for name in names:
        kind = draw(st.sampled_from(["plain"] * 5 + ["string", "bytes", "dtype", "soft link", "external link"]))
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        entry = {"name": name, "kind": kind, "shape": shape, "storage": draw(st.sampled_from(STORAGES)),
                 "dtype": draw(st.sampled_from(PLAIN_DTYPES if kind == "plain" else REFUSED_DTYPES)),
                 "seed": draw(st.integers(0, 2**16))}
        out.append(entry)
    return out


def _write_layout(folder: Path, layout: list[dict]) -> tuple[Path, dict[str, np.ndarray], str | None]:
    """Writes the layout; returns the file, what a correct reader returns, and the first refused name."""
    file, secret = folder / "layout.h5", folder / "secret.bin"
    secret.write_bytes(np.full(4096, 7.25, np.float64).tobytes())
    with h5py.File(folder / "other.h5", "w") as g:
        g["data"] = np.full(64, 7.25)
    expected: dict[str, np.ndarray] = {}
    refused = []
    with h5py.File(file, "w") as f:
        f.create_group("group").create_dataset("inside", data=np.zeros(3))  # groups are not fields
        for entry in layout:
            name, kind, shape = entry["name"], entry["kind"], entry["shape"]
            rng = np.random.default_rng(entry["seed"])
            if kind == "soft link":
                f[name] = h5py.SoftLink("/group/inside")
                refused.append(name)
                continue
            if kind == "external link":
                f[name] = h5py.ExternalLink(str(folder / "other.h5"), "/data")
                refused.append(name)
                continue
            if kind == "string":
                value = np.array(["".join(rng.choice(list("abcé€ ")) for _ in range(3)) for _ in range(shape[0])])
                f.create_dataset(name, data=value.astype(object), dtype=h5py.string_dtype())
                expected[name] = value
                continue
            if kind == "bytes":
                value = np.array([b"ab", b"xyz", b"q", b"rs"][: shape[0]])
                f[name] = value
                expected[name] = value.astype(str)
                continue
            if kind == "dtype":
                dtype = {"compound": np.dtype([("a", "<f4"), ("b", "<i8")]), "vlen int": h5py.vlen_dtype(np.int32),
                         "reference": h5py.ref_dtype}[entry["dtype"]]
                f.create_dataset(name, shape=shape[:1], dtype=dtype)
                refused.append(name)
                continue
            value = (rng.normal(size=shape) * 100).astype(entry["dtype"])
            storage = entry["storage"]
            if storage == "external":
                f.create_dataset(name, shape=shape, dtype=value.dtype,
                                 external=[(str(secret), 0, value.nbytes)])
                refused.append(name)
            elif storage == "virtual":
                count = int(np.prod(shape))
                mapping = h5py.VirtualLayout(shape=(count,), dtype="<f8")
                mapping[:] = h5py.VirtualSource(str(folder / "other.h5"), "data", shape=(64,))[:count]
                f.create_virtual_dataset(name, mapping)
                refused.append(name)
            else:
                options = {"contiguous": {}, "chunked": {"chunks": True}, "gzip": {"compression": "gzip"},
                           "shuffle+gzip+fletcher32": {"compression": "gzip", "shuffle": True, "fletcher32": True},
                           "lzf": {"compression": "lzf"}}[storage]
                f.create_dataset(name, data=value, **options)
                expected[name] = value
    first_refused = min(refused) if refused else None  # HDF5 lists links by name
    return file, expected, first_refused


@budget(25)
@given(layout=layouts())
def test_random_hdf5_layouts_import_exactly_or_are_refused_by_name(tmp_path: Path, layout: list[dict]) -> None:
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # hypothesis runs many examples in one tmp_path
    file, expected, first_refused = _write_layout(folder, layout)
    if first_refused is not None:
        with pytest.raises(DatasetError) as err:
            read_reference_file(file)
        assert err.value.field == first_refused, (err.value, layout)
        return
    got = read_reference_file(file)
    assert list(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert got[name].tobytes() == value.tobytes(), name


# ------------------------------------------------------------ sizes, nesting and metadata (memory bombs)

LIMIT = 64_000_000  # the decode budget the child runs under ($IMAGINEJAX_MAX_DECODED_BYTES)

BOMB_CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys, time
    os.environ["IMAGINEJAX_MAX_DECODED_BYTES"] = sys.argv[2]
    from pathlib import Path
    from imaginejax.data import DatasetError
    from imaginejax.interop.reference import read_reference_file

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))

    def alarm(*_):
        raise TimeoutError("ran past 20 s")

    signal.signal(signal.SIGALRM, alarm)
    for file in sorted(Path(sys.argv[1]).iterdir()):
        print(json.dumps({"start": file.name}), flush=True)
        start = time.perf_counter()
        signal.alarm(20)
        try:
            read_reference_file(file)
            record = {"outcome": "ok"}
        except DatasetError as err:
            record = {"outcome": "DatasetError", "field": err.field}
        except BaseException as err:
            record = {"outcome": f"{type(err).__name__}: {str(err)[:300]}"}
        signal.alarm(0)
        print(json.dumps(dict(record, file=file.name, seconds=time.perf_counter() - start)), flush=True)
""")


@st.composite
def bombs(draw: st.DrawFn) -> dict:
    """A file spec and the bytes it decodes to: nested pickle references under a long key, unwritten
    HDF5 datasets, HDF5 strings sharing a fill value, a parquet dictionary page, parquet schema metadata."""
    kind = draw(st.sampled_from(["pickle", "hdf5 fill", "hdf5 strings", "parquet dictionary", "parquet metadata"]))
    spec: dict = {"kind": kind}
    if kind == "pickle":
        spec.update(depth=draw(st.integers(1, 4)), fanout=draw(st.integers(1, 2000)), leaf=draw(st.integers(1, 8192)),
                    key=draw(st.integers(1, 20_000)), nesting=draw(st.integers(0, 60)))
        spec["decoded"] = 8 * spec["leaf"] * spec["fanout"] ** spec["depth"]
    elif kind == "hdf5 fill":
        spec.update(count=draw(st.integers(1, 40)), length=draw(st.integers(1, 1 << 24)))
        spec["decoded"] = 8 * spec["count"] * spec["length"]
    elif kind in ("hdf5 strings", "parquet dictionary"):
        spec.update(count=draw(st.integers(1, 100_000)), length=draw(st.integers(1, 100_000)))
        spec["decoded"] = spec["count"] * spec["length"]
    else:
        spec.update(key=draw(st.sampled_from(["observations", "actions", "instruction_table", "next_observations",
                                              "terminals", "imaginejax-array"])))
        spec["decoded"] = 0
    return spec


def _write_bomb(file: Path, spec: dict) -> Path:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    kind = spec["kind"]
    if kind == "pickle":
        value: object = np.zeros(spec["leaf"])
        for _ in range(spec["depth"]):
            value = [value] * spec["fanout"]
        key = "k" * spec["key"]
        for _ in range(spec["nesting"]):
            value = {key: value}
        file = file.with_suffix(".npy")
        np.save(file, {"observations": value}, allow_pickle=True)
    elif kind == "hdf5 fill":
        file = file.with_suffix(".h5")
        with h5py.File(file, "w") as f:
            for i in range(spec["count"]):
                f.create_dataset(f"d{i}", shape=(spec["length"],), dtype="<f8", chunks=(min(spec["length"], 1 << 16),))
    elif kind == "hdf5 strings":
        file = file.with_suffix(".h5")
        with h5py.File(file, "w") as f:
            f.create_dataset("instructions", shape=(spec["count"],), dtype=h5py.string_dtype(),
                             chunks=(min(spec["count"], 1024),), fillvalue=b"x" * spec["length"])
    elif kind == "parquet dictionary":
        file = file.with_suffix(".parquet")
        column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(spec["count"], np.int32)),
                                                pa.array(["y" * spec["length"]]))
        pq.write_table(pa.table({"instructions": column}), file, compression="zstd", store_schema=False)
    else:
        file = file.with_suffix(".parquet")
        buffer = io.BytesIO()
        np.save(buffer, np.array(["an instruction"]), allow_pickle=False)
        table = pa.table({"observations": pa.array([[0.5] * 4] * 2), "actions": pa.array([1, 2])})
        pq.write_table(table.replace_schema_metadata({f"array:{spec['key']}".encode(): buffer.getvalue()}), file)
    return file


def test_memory_bombs_are_refused_within_the_budget_in_bounded_time(tmp_path: Path) -> None:
    """Random sizes, nesting and metadata: a file is read or refused with DatasetError, in seconds, under a
    3 GB address-space limit; one that decodes past the budget is always refused, and schema metadata never
    stands in for a column (only the instruction table may come from it)."""
    folder = tmp_path / "bombs"
    folder.mkdir()
    specs: dict[str, dict] = {}

    @budget(20)
    @given(spec=bombs())
    def write(spec: dict) -> None:
        file = _write_bomb(folder / f"{len(specs):03d}", spec)
        specs[file.name] = spec

    write()
    done = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(folder), str(LIMIT)], capture_output=True,
                          text=True, timeout=600)
    records = [json.loads(line) for line in done.stdout.splitlines()]
    started = [r["start"] for r in records if "start" in r]
    assert done.returncode == 0, f"the importer crashed the process on {started[-1:]}: {done.stderr[-2000:]}"
    results = [r for r in records if "file" in r]
    assert len(results) == len(specs)
    for r in results:
        spec = specs[r["file"]]
        assert r["outcome"] in ("ok", "DatasetError") and r["seconds"] < 10, (r, spec)
        if spec["decoded"] > LIMIT:
            assert r["outcome"] == "DatasetError", (r, spec)
        if spec["kind"] == "parquet metadata":
            assert (r["outcome"] == "ok") == (spec["key"] == "instruction_table"), (r, spec)


# ------------------------------------------------------------------------------------------ policy records

POLICY_CHILD = textwrap.dedent("""
    import dataclasses, json, resource, signal, sys
    from pathlib import Path

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a record that allocates fails here, not the machine
    import numpy as np
    import safetensors.numpy
    from imaginejax.bench.policy import Policy, PolicyError

    def too_slow(*_):
        raise TimeoutError("still loading after 20 s")

    signal.signal(signal.SIGALRM, too_slow)
    for folder in sorted(Path(sys.argv[1]).iterdir()):
        record = json.loads((folder / "policy.json").read_text())
        signal.alarm(20)
        try:
            p = Policy.load(folder)
            stored = safetensors.numpy.load_file(str(folder / "policy.safetensors"))
            net = None if p.net is None else {**dataclasses.asdict(p.net), "hidden": list(p.net.hidden)}
            exact = (p.algo, p.env, dataclasses.asdict(p.spec), net, p.options, p.encoder, p.provenance) == (
                record["algo"], record["env"], record["spec"], record["net"], record["options"], record["encoder"],
                record["provenance"]) and sorted(p.tensors) == sorted(stored) and all(
                p.tensors[k].tobytes() == stored[k].tobytes() for k in stored)
            outcome = "exact" if exact else "inexact"
        except PolicyError:
            outcome = "PolicyError"
        except BaseException as err:
            outcome = f"{type(err).__name__}: {str(err)[:300]}"
        signal.alarm(0)
        print(json.dumps({"case": folder.name, "outcome": outcome}), flush=True)
""")

POLICY_FIELDS = ["algo", "env", "spec", "spec.state_dim", "spec.embed_dim", "spec.action_dim", "spec.discrete", "net",
                 "net.encoder_width", "net.encoder_layers", "net.hidden", "net.hidden.0", "options", "encoder",
                 "provenance", "provenance.seed", "imaginejax", "tensors", "model_path"]
HOSTILE_VALUES = st.one_of(
    st.sampled_from([0, -1, 1, 10, 16, 17, 40, 384, 2**31, 10**12, 20000, 1.5, float("inf"), True, False, None, "",
                     "10", "../clevr", "/etc/passwd", "clevr/../babyai", "babyai", "cheetah", "metaworld", "bc", "cql",
                     "bcq", [], {}, [16, 16], [10**6, 10**6], [16] * 40, ["a"], {"config": {"act_samples": 10**9}},
                     {"double_q": False}, {"x": 1}]),
    st.integers(-10, 10**7), TEXT)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained BC policy of CLEVR without instruction embeddings, saved (nothing trains: the record is
    what is fuzzed)."""
    import jax

    from imaginejax import algos
    from imaginejax.algos.base import Spec
    from imaginejax.algos.common import DataStats
    from imaginejax.algos.networks import NetConfig
    from imaginejax.bench.policy import Policy

    spec, net = Spec(10, 0, True, 40), NetConfig(16, 2, (16, 16))
    algo = algos.make("bc", spec, net)
    hp = algo.default_hp(spec)
    state = algo.init(jax.random.PRNGKey(0), spec, DataStats.identity(10), hp)
    return Policy.from_state("bc", spec, net, {}, "clevr", state, hp, {"seed": 0}).save(
        tmp_path_factory.mktemp("policy") / "policy")


def test_mutated_policy_records_load_exactly_or_are_refused(tmp_path: Path, policy_dir: Path) -> None:
    import shutil

    original = json.loads((policy_dir / "policy.json").read_text())
    folder = tmp_path / "records"
    folder.mkdir()
    written: list[dict] = []

    @budget(30)
    @given(edits=st.lists(st.tuples(st.sampled_from(POLICY_FIELDS), st.one_of(HOSTILE_VALUES, st.just("<delete>"))),
                          min_size=0, max_size=3))
    def mutate(edits: list[tuple[str, object]]) -> None:
        record = json.loads(json.dumps(original))
        for field, value in edits:
            *parents, last = field.split(".")
            node = record
            for key in parents:
                node = node[int(key)] if isinstance(node, list) and key.isdigit() else node.get(key) \
                    if isinstance(node, dict) else None
            if isinstance(node, list) and last.isdigit() and int(last) < len(node):
                node[int(last)] = value
            elif isinstance(node, dict):
                if value == "<delete>":
                    node.pop(last, None)
                else:
                    node[last] = value
        case = folder / f"{len(written):04d}"
        shutil.copytree(policy_dir, case)
        (case / "policy.json").write_text(json.dumps(record))
        written.append(record)

    mutate()
    done = subprocess.run([sys.executable, "-c", POLICY_CHILD, str(folder)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(results) == len(written), done.stderr[-2000:]
    for r in results:
        assert r["outcome"] in ("exact", "PolicyError"), (r, written[int(r["case"])])
    assert {r["outcome"] for r in results} == {"exact", "PolicyError"}
