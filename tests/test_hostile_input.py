"""Hostile and malformed input: every hole found by an outside attack on the importers, datasets and
validation is closed, each case a regression test (checkpoints: tests/test_checkpoint.py, test_resume.py;
random inputs: tests/test_fuzz_importers.py).

Threat model: reference files, Minari datasets and dataset directories from the internet are untrusted;
reading one must import exactly what a legitimate file holds or raise our DatasetError naming the field —
never run code, never crash the process, never read another file."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import pickletools
import re
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import h5py
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dataset_helpers import assert_bit_exact, random_babyai_dataset

import imaginejax.interop.reference as reference
from imaginejax import envs
from imaginejax.core.files import file_sha256
from imaginejax.data import DatasetError, EnvFacts, TrajectoryDataset, load_dataset, save_dataset, validate_for_env
from imaginejax.data.collect import collect, random_policy
from imaginejax.data.safe_pickle import read_pickle
from imaginejax.interop.reference import export_reference, import_reference, load_npy, read_reference_file

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def babyai() -> TrajectoryDataset:
    return random_babyai_dataset(8, key_seed=3, embed_dim=8, table_seed=0)


@pytest.fixture(scope="module")
def clevr() -> tuple[TrajectoryDataset, EnvFacts]:
    env, params = envs.make("clevr", "train", embed=False)
    ds = collect(env, params, random_policy(env.num_actions), jax.random.PRNGKey(0), 8, chunk_size=8,
                 progress=False)
    return ds, EnvFacts.of(env)


def write_npy_pickle(path: Path, stream: bytes) -> Path:
    """A 0-d object .npy (what np.save(path, a_dict) writes) around a given pickle stream."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|O", "fortran_order": False, "shape": ()})
        f.write(stream)
    return path


def holder(value: object) -> np.ndarray:
    out = np.empty((), dtype=object)
    out[()] = value
    return out


# ------------------------------------------------------------------------------------------- .npy pickles


def forged_structured_npy(path: Path) -> Path:
    """np.save of ``{"actions": a}`` where ``a``'s dtype, rebuilt through ``numpy.dtype.__setstate__``,
    lays its int64 field ``b`` over its object field ``a``: the list-pickled item writes the integer as an
    object pointer. ``np.load(path, allow_pickle=True)`` dies with SIGSEGV on it (NumPy 2.5); so did the
    allow-list unpickler this project used before (every global it names is NumPy's own)."""
    a = np.zeros(1, dtype=[("a", "O"), ("b", "<i8")])
    a[0] = (None, 0x4141414141)
    stream = bytearray(pickle.dumps(holder({"actions": a}), protocol=2))
    ops = list(pickletools.genops(bytes(stream)))
    for k, (op, arg, pos) in enumerate(ops):  # field "b": (dtype('i8'), 8) -> offset 0
        if op.name == "BININT1" and arg == 8 and ops[k + 1][0].name == "TUPLE2":
            stream[pos + 1] = 0
            break
    else:
        raise AssertionError("the field offset was not found")
    return write_npy_pickle(path, bytes(stream))


def test_forged_structured_dtype_npy_is_refused_and_cannot_crash_the_process(tmp_path: Path) -> None:
    file = forged_structured_npy(tmp_path / "forged.npy")
    script = textwrap.dedent("""
        import sys
        from imaginejax.interop.reference import import_reference
        from imaginejax.data.errors import DatasetError
        try:
            import_reference(sys.argv[1], env="babyai", level="train", source="real")
        except DatasetError as err:
            print("REFUSED", err.field, "|", err.problem)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(file)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -11 was SIGSEGV
    assert done.stdout.startswith("REFUSED actions |") and "'V16'" in done.stdout


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_np_save_layouts_of_every_protocol_import_bit_exact(tmp_path: Path, babyai: TrajectoryDataset,
                                                            protocol: int) -> None:
    arrays = reference.reference_arrays(babyai)
    arrays["observations"] = np.asfortranarray(arrays["observations"])  # order and byte order kept too
    arrays["rewards"] = arrays["rewards"].astype(">f4")
    file = write_npy_pickle(tmp_path / f"p{protocol}.npy", pickle.dumps(holder(arrays), protocol=protocol))
    assert_bit_exact(babyai, import_reference(file))
    raw = tmp_path / f"raw{protocol}.npy"  # a bare pickle stream under a .npy name
    raw.write_bytes(pickle.dumps(dict(arrays), protocol=protocol))
    assert_bit_exact(babyai, import_reference(raw))


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _refused_payloads(marker: Path) -> dict[str, tuple[object, str]]:
    """name -> (value placed under the key "bad" of the pickled dict, text the error must contain)."""
    import collections
    import datetime

    cycle: list = []
    cycle.append(cycle)
    deep: list = []
    for _ in range(150):
        deep = [deep]
    return {
        "code": (RunsCode(marker), "system"),
        "foreign global": (datetime.date(2025, 1, 1), "datetime.date"),
        "structured dtype": (np.zeros(2, dtype=[("x", "<f4"), ("y", "<i4")]), "not a bool / integer"),
        "void dtype": (np.zeros(2, dtype="V4"), "'V4'"),
        "datetime dtype": (np.zeros(2, dtype="M8[s]"), "'M8'"),
        "dtype metadata": (np.zeros(2, dtype=np.dtype("f4", metadata={"m": 1})), "metadata"),
        "set": ({1, 2}, "set"),
        "counter": (collections.Counter(a=1), "Counter"),
        "cycle": (cycle, "contains itself"),
        "deep nesting": (deep, "nested deeper than 100"),
    }


@pytest.mark.parametrize("name", list(_refused_payloads(Path("x"))))
@pytest.mark.parametrize("protocol", [2, 5])
def test_refused_values_name_their_key_and_never_run(tmp_path: Path, name: str, protocol: int) -> None:
    marker = tmp_path / "pwned"
    value, text = _refused_payloads(marker)[name]
    file = write_npy_pickle(tmp_path / "bad.npy", pickle.dumps(holder({"ok": np.zeros(3), "bad": value}),
                                                               protocol=protocol))
    with pytest.raises(DatasetError) as err:
        load_npy(file)
    assert err.value.field.startswith("bad") and err.value.path == str(file), err.value  # "bad", "bad[0]", ".."
    assert text in str(err.value)
    assert not marker.exists()


def test_an_object_array_is_never_built_from_raw_bytes(tmp_path: Path) -> None:
    """Protocol 5 rebuilds arrays with ``_frombuffer(buffer, dtype, shape, order)``: with an object dtype
    the buffer's bytes would be pointers."""
    stream = pickle.dumps({"bad": np.arange(2, dtype=np.int64)}, protocol=5)
    ops = list(pickletools.genops(stream))
    descr = next(pos for op, arg, pos in ops if op.name == "SHORT_BINUNICODE" and arg == "i8")
    forged = stream[:descr] + b"\x8c\x02O8" + stream[descr + 4:]
    forged = forged.replace(b"K\x00t", b"K?t", 1)  # the dtype state's flags: object (63)
    with pytest.raises(DatasetError, match="object array from a raw buffer") as err:
        read_pickle(forged, field="f.npy")
    assert err.value.field == "bad"


def test_refused_opcodes_and_protocols_name_the_file(tmp_path: Path) -> None:
    for stream, text in ((pickle.dumps({"a": 1}, protocol=1), "protocol 0 or 1"),
                         (pickle.dumps({"a": frozenset()}, protocol=4), "FROZENSET"),
                         (b"\x80\x04cos\nsystem\n(S'touch x'\ntR.", "opcode STRING"),
                         (b"\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00N", "before seeing STOP")):
        with pytest.raises(DatasetError, match=text) as err:
            read_pickle(stream, field="f.npy")
        assert err.value.field == "f.npy"


def test_references_repeated_in_a_list_cannot_blow_up_memory(tmp_path: Path) -> None:
    """20,000 references (2 bytes each) to one 8 MB array would stack into 160 GB."""
    block = np.zeros(1 << 20)
    file = tmp_path / "bomb.npy"
    np.save(file, {"observations": [block] * 20_000}, allow_pickle=True)
    assert file.stat().st_size < 9 << 20
    with pytest.raises(DatasetError, match="would expand to 167772160000 bytes") as err:
        read_reference_file(file)
    assert err.value.field == "observations"


def test_npy_headers_of_other_dtypes_or_sizes_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "rec.npy", np.zeros(3, dtype=[("a", "<f4")]))
    with pytest.raises(DatasetError, match="not a bool / numeric / string dtype"):
        load_npy(tmp_path / "rec.npy")
    np.save(tmp_path / "mixed.npy", np.zeros(3, dtype=[("a", "O"), ("b", "<i8")]), allow_pickle=True)
    with pytest.raises(DatasetError, match="mixes object fields"):
        load_npy(tmp_path / "mixed.npy")
    with open(tmp_path / "huge.npy", "wb") as f:  # a header promising 8 TB over 8 bytes of data
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (1 << 40,)})
        f.write(b"\0" * 8)
    with pytest.raises(DatasetError, match="promises 8796093022208 bytes"):
        load_npy(tmp_path / "huge.npy")


# ------------------------------------------------------------------------------------------------ HDF5


@pytest.mark.parametrize("case", ["external storage", "virtual dataset", "soft link", "external link",
                                  "compound dtype", "vlen int dtype", "reference dtype", "fill-value bomb"])
def test_hdf5_that_reads_other_files_or_is_not_plain_is_refused(tmp_path: Path, babyai: TrajectoryDataset,
                                                                case: str) -> None:
    """External raw storage and virtual datasets imported another file's bytes silently (a reference file
    could read any file on the machine); each case is now refused naming the dataset."""
    secret = np.full(64, 1234.5, np.float32)
    (tmp_path / "secret.bin").write_bytes(secret.tobytes())
    with h5py.File(tmp_path / "other.h5", "w") as g:
        g["data"] = secret
    file = export_reference(babyai, tmp_path / "ref.h5")
    with h5py.File(file, "a") as f:
        del f["goals"]
        if case == "external storage":
            f.create_dataset("goals", shape=(64,), dtype="<f4", external=[(str(tmp_path / "secret.bin"), 0, 256)])
        elif case == "virtual dataset":
            layout = h5py.VirtualLayout(shape=(64,), dtype="<f4")
            layout[:] = h5py.VirtualSource(str(tmp_path / "other.h5"), "data", shape=(64,))
            f.create_virtual_dataset("goals", layout)
        elif case == "soft link":
            f["goals"] = h5py.SoftLink("/rewards")
        elif case == "external link":
            f["goals"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/data")
        elif case == "compound dtype":
            f.create_dataset("goals", data=np.zeros(3, dtype=[("a", "<f4"), ("b", "<i8")]))
        elif case == "vlen int dtype":
            f.create_dataset("goals", shape=(2,), dtype=h5py.vlen_dtype(np.int32))
        elif case == "reference dtype":
            f.create_dataset("goals", data=np.array([f["rewards"].ref], dtype=h5py.ref_dtype))
        else:  # 8 TB of unwritten chunks, to be filled with the fill value
            f.create_dataset("goals", shape=(1 << 40,), dtype="<f8", chunks=(1 << 16,))
    out = tmp_path / "out"
    with pytest.raises(DatasetError) as err:
        import_reference(file, out=out)
    assert err.value.field == "goals" and err.value.path == str(file), err.value
    assert not out.exists()


def test_hdf5_library_loops_and_crashes_become_our_error(tmp_path: Path, babyai: TrajectoryDataset,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Malformed HDF5 files can make libhdf5 loop forever (seen with 1 of 400 byte-flipped files) or
    crash: the file is read in a child process with a time limit."""
    file = export_reference(babyai, tmp_path / "ref.h5")
    crasher = tmp_path / "crash.py"
    crasher.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setattr(reference, "HDF5_READER", crasher)
    with pytest.raises(DatasetError, match=r"the HDF5 library crashed reading it \(signal 11") as err:
        read_reference_file(file)
    assert err.value.field == "ref.h5"
    looper = tmp_path / "loop.py"
    looper.write_text("while True:\n    pass\n")
    monkeypatch.setattr(reference, "HDF5_READER", looper)
    monkeypatch.setattr(reference, "HDF5_SECONDS", (1.0, 0.0))
    with pytest.raises(DatasetError, match="did not finish reading it within 1 s"):
        read_reference_file(file)


# --------------------------------------------------------------------------------------------- parquet


def test_parquet_metadata_pickle_is_our_error_naming_file_and_field(tmp_path: Path, babyai: TrajectoryDataset
                                                                    ) -> None:
    file = export_reference(babyai, tmp_path / "ref.parquet")
    table = pq.read_table(file)
    meta = dict(table.schema.metadata)
    meta[b"imaginejax"] = pickle.dumps({"env": "babyai"})  # was a bare UnicodeDecodeError
    pq.write_table(table.replace_schema_metadata(meta), file)
    with pytest.raises(DatasetError, match="not UTF-8 JSON text \\(it looks like a pickle\\)") as err:
        import_reference(file)
    assert err.value.field == "imaginejax" and err.value.path == str(file)


def test_parquet_metadata_arrays_and_columns_must_be_plain(tmp_path: Path, babyai: TrajectoryDataset) -> None:
    file = export_reference(babyai, tmp_path / "ref.parquet")
    table = pq.read_table(file)
    meta = dict(table.schema.metadata)
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.zeros(2, dtype=[("a", "<f4")]))
    pq.write_table(table.replace_schema_metadata({**meta, b"array:instruction_table": buffer.getvalue()}), file)
    with pytest.raises(DatasetError, match="dtype") as err:
        read_reference_file(file)
    assert err.value.field == "instruction_table"
    struct = pa.array([{"x": 1}] * table.num_rows)
    pq.write_table(table.append_column("extra", struct).replace_schema_metadata(meta), file)
    with pytest.raises(DatasetError, match="not numbers, bools or strings") as err:
        read_reference_file(file)
    assert err.value.field == "extra"


# ------------------------------------------------------------------------- data against the environment


def test_clevr_action_999_is_refused_by_every_reader(tmp_path: Path, clevr) -> None:
    """CLEVR has 40 actions; a dataset with action 999 saved, loaded and trained until every run was
    non-finite. Now every reader that knows the environment names ``actions``, the row and the value."""
    ds, facts = clevr
    actions = ds.actions.copy()
    actions[2, 1] = 999
    bad = dataclasses.replace(ds, actions=actions)
    for array_format in ("npz", "safetensors"):  # the environment-agnostic format cannot know the action count
        save_dataset(bad, tmp_path / array_format, array_format=array_format)
        with pytest.raises(DatasetError, match=r"outside \[0, 40\) action indices on valid steps, first at "
                                               r"trajectory 2 step 1 \(value 999\).*of 40 actions: check the env "
                                               r"name") as err:
            load_dataset(tmp_path / array_format, env=facts)
        assert err.value.field == "actions" and err.value.path == str(tmp_path / array_format)
    assert load_dataset(tmp_path / "npz").actions[2, 1] == 999  # without the environment: the format is valid
    with pytest.raises(DatasetError, match="value 999"):
        validate_for_env(bad, facts)
    export_reference(bad, tmp_path / "bad.npy")
    with pytest.raises(DatasetError, match=r"outside \[0, 40\), first 999 at trajectory 2 step 1") as err:
        import_reference(tmp_path / "bad.npy")
    assert err.value.field == "actions"
    from imaginejax.interop.minari_io import from_minari, to_minari

    target = to_minari(bad, "test/clevr-bad-v0", root=tmp_path)  # its Discrete space is widened to 1000
    with pytest.raises(DatasetError, match="value 999") as err:
        from_minari(target)
    assert err.value.field == "actions"


def _continuous(n: int = 3, t: int = 4, s: int = 18, a: int = 6, e: int = 8) -> TrajectoryDataset:
    rng = np.random.default_rng(0)
    mask = np.ones((n, t), bool)
    truncations = np.zeros((n, t), bool)
    truncations[:, -1] = True
    state = np.zeros(s, np.float32)
    state[1] = 0.6  # cheetah: rootz of a standing cheetah
    return TrajectoryDataset(
        states=np.broadcast_to(state, (n, t + 1, s)).copy(), actions=rng.uniform(-1, 1, (n, t, a)).astype(np.float32),
        rewards=np.zeros((n, t), np.float32), mask=mask, terminals=np.zeros((n, t), bool), truncations=truncations,
        instruction_ids=np.zeros(n, np.int32), goals=np.zeros((n, 2), np.float32), instructions=("run",),
        instruction_embeddings=np.zeros((1, e), np.float32), env="cheetah", level="train", source="real",
        discrete=False)


def test_validate_for_env_names_field_row_and_fix() -> None:
    env, _ = envs.make("cheetah", "train", embed=False)
    facts = EnvFacts.of(env)
    assert (facts.action_dim, facts.action_low, facts.action_high) == (6, -1.0, 1.0)
    good = _continuous()
    assert validate_for_env(good, facts, embed_dim=8).A == 6

    actions = good.actions.copy()
    actions[1, 2, 4] = 1.5
    with pytest.raises(DatasetError, match=r"outside cheetah's box \[-1, 1\], first at trajectory 1 step 2 "
                                           r"\(entry 1.5\).*rescale") as err:
        validate_for_env(dataclasses.replace(good, actions=actions), facts)
    assert err.value.field == "actions"
    cases = [
        (dataclasses.replace(good, env="libero"), {}, "env", "dataset is of 'libero'"),
        (dataclasses.replace(good, states=good.states[..., :17].copy()), {}, "states", "width S = 17"),
        (dataclasses.replace(good, actions=good.actions[..., :4].copy()), {}, "actions", "width A = 4"),
        (good, {"embed_dim": 384}, "instruction_embeddings", "encoder gives 384-d"),
        (dataclasses.replace(good, goals=np.zeros((3, 5), np.float32)), {}, "goals", "width G = 5"),
        (dataclasses.replace(good, states=good.states + 1e7), {}, "states", r"beyond ±1e\+06"),
    ]
    for ds, kwargs, field, text in cases:
        with pytest.raises(DatasetError, match=text) as err:
            validate_for_env(ds, facts, **kwargs)
        assert err.value.field == field


def test_states_of_another_environment_with_the_right_width_are_refused(clevr) -> None:
    """Real data whose first states mostly fail CLEVR's legality predicate (balls off the workbench or
    inside one another) is not CLEVR data; imaginary data is not held to it (generated states may be
    illegal: that is what the imaginer's quality report measures)."""
    ds, facts = clevr
    foreign = dataclasses.replace(ds, states=np.random.default_rng(0).normal(0, 5, ds.states.shape).astype(np.float32))
    with pytest.raises(DatasetError, match=r"8 of 8 trajectories start in a state that fails clevr's legality "
                                           r"predicate, first trajectory 0") as err:
        validate_for_env(foreign, facts)
    assert err.value.field == "states"
    validate_for_env(dataclasses.replace(foreign, source="imaginary"), facts)
    validate_for_env(ds, facts)  # random-policy real data pushes balls off the workbench later: accepted


# ------------------------------------------------------------------- small files that decode to gigabytes


def _quadratic_keys(depth: int = 99, key_length: int = 100_000, items: int = 190_000) -> bytes:
    """A 290 KB pickle: 99 nested dicts under one memoized 100 KB key, then 190,000 Nones. An error path
    rebuilt per element copies 99 x 100 KB per None: minutes before the path was built lazily."""
    key = b"k" * key_length
    stream = bytearray(b"\x80\x04\x8d" + len(key).to_bytes(8, "little") + key + b"\x94" + b"0")  # MEMOIZE, POP
    stream += b"}h\x00" * depth  # EMPTY_DICT, BINGET 0 (the key)
    stream += b"](" + b"N" * items + b"e" + b"s" * depth + b"."  # a list of Nones; SETITEM per level
    return bytes(stream)


def _bombs(folder: Path, babyai: TrajectoryDataset) -> dict[str, tuple[str, Path, str]]:
    """name -> (reader, file, field the error must name): small files that decode to gigabytes."""
    out: dict[str, tuple[str, Path, str]] = {}
    block = np.zeros(1024)  # 8 KB, referenced 1000 x 1000 times: 8 GB from 12.5 KB
    np.save(folder / "alias.npy", {"observations": [[block] * 1000] * 1000}, allow_pickle=True)
    out["pickle references nested"] = ("ref", folder / "alias.npy", "observations")
    (folder / "keys.npy").write_bytes(_quadratic_keys())
    out["pickle reused keys nested"] = ("ref", folder / "keys.npy", "k" * 60)
    with h5py.File(folder / "fill.h5", "w") as f:  # 100 unwritten 200 MB datasets in 40 KB
        f["observations"] = np.zeros((2, 3, 4), np.float32)
        for i in range(100):
            f.create_dataset(f"d{i:03d}", shape=(25 << 20,), dtype="<f8", chunks=(1 << 16,))
    out["hdf5 fill values summed per file"] = ("ref", folder / "fill.h5", "d001")
    with h5py.File(folder / "vlen.h5", "w") as f:  # 200,000 strings sharing a 50 KB fill value: 10 GB
        f["observations"] = np.zeros((2, 3, 4), np.float32)
        f.create_dataset("instructions", shape=(200_000,), dtype=h5py.string_dtype(), chunks=(1024,),
                         fillvalue=b"x" * 50_000)
    out["hdf5 variable-length strings"] = ("ref", folder / "vlen.h5", "instructions")
    big = pa.array(["y" * 100_000])  # one dictionary entry, 100,000 rows: 10 GB from 462 bytes
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(100_000, np.int32)), big)
    pq.write_table(pa.table({"instructions": column}), folder / "dict.parquet", compression="zstd",
                   store_schema=False)
    out["parquet dictionary page"] = ("ref", folder / "dict.parquet", "instructions")
    rows = pa.table({"instructions": pa.array(["y" * 100_000] * 100)})
    with pq.ParquetWriter(folder / "plain.parquet", rows.schema, compression="zstd", use_dictionary=False) as w:
        for _ in range(200):  # 2 GB of strings from 200 KB
            w.write_table(rows)
    out["parquet compressed strings"] = ("ref", folder / "plain.parquet", "instructions")
    rows = ("states", "actions", "rewards", "mask", "terminals", "truncations", "instruction_ids", "goals")
    ds = dataclasses.replace(babyai, **{k: np.concatenate([getattr(babyai, k)] * 8) for k in rows})  # 64 rows
    target = save_dataset(ds, folder / "npz")
    n, t = ds.actions.shape
    with open(target / "actions.npz", "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
        header = io.BytesIO()  # declares 512 GiB over the data of (64, 128)
        np.lib.format.write_array_header_1_0(header, {"descr": "<i4", "fortran_order": False, "shape": (n << 24, t)})
        z.writestr("actions.npy", header.getvalue() + bytes(4 * n * t))
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["arrays"]["actions"]["sha256"] = file_sha256(target / "actions.npz")
    (target / "manifest.json").write_text(json.dumps(manifest))
    out["npz header larger than the manifest"] = ("dir", target, "actions")
    from imaginejax.interop.minari_io import to_minari

    minari_dir = to_minari(ds, "test/horizon-v0", root=folder / "minari")
    meta_file = minari_dir / "data" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["imaginejax"]["horizon"] = 1_000_000  # 64 x 1e6 x 17 float32 states: 4 GB
    meta_file.write_text(json.dumps(meta))
    out["minari horizon"] = ("minari", minari_dir, "imaginejax.horizon")
    return out


BOMB_CHILD = textwrap.dedent("""
    import json, resource, signal, sys, time
    from pathlib import Path
    from imaginejax.data import DatasetError, load_dataset
    from imaginejax.interop.minari_io import from_minari
    from imaginejax.interop.reference import read_reference_file

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))  # 3 GB, the HDF5 child too
    readers = {"ref": read_reference_file, "dir": load_dataset, "minari": from_minari}

    def alarm(*_):
        raise TimeoutError("ran past 30 s")

    signal.signal(signal.SIGALRM, alarm)
    for name, (reader, file) in json.loads(sys.argv[1]).items():
        start = time.perf_counter()
        signal.alarm(30)
        try:
            readers[reader](file)
            record = {"outcome": "ok"}
        except DatasetError as err:
            record = {"outcome": "DatasetError", "field": err.field, "problem": err.problem, "path": err.path}
        except BaseException as err:
            record = {"outcome": f"{type(err).__name__}: {str(err)[:300]}"}
        signal.alarm(0)
        peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
        record.update(name=name, seconds=time.perf_counter() - start, rss_mb=int(peak.split()[1]) >> 10)
        print(json.dumps(record), flush=True)
""")


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory, babyai: TrajectoryDataset) -> dict[str, dict]:
    """Every bomb read in one child process under RLIMIT_AS = 3 GB and a 30 s alarm each (the default
    budget: half of what the address-space limit leaves)."""
    files = _bombs(tmp_path_factory.mktemp("bombs"), babyai)
    done = subprocess.run([sys.executable, "-c", BOMB_CHILD,
                           json.dumps({k: (reader, str(file)) for k, (reader, file, _) in files.items()})],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "IMAGINEJAX_MAX_DECODED_BYTES"})
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    return {name: dict(records[name], file=str(file), expected_field=field) for name, (_, file, field) in files.items()}


@pytest.mark.parametrize("name", ["pickle references nested", "hdf5 fill values summed per file",
                                  "hdf5 variable-length strings", "parquet dictionary page",
                                  "parquet compressed strings", "npz header larger than the manifest",
                                  "minari horizon"])
def test_small_files_that_decode_to_gigabytes_are_refused_before_allocating(bombs: dict[str, dict], name: str
                                                                           ) -> None:
    """Each ended in MemoryError / ArrowMemoryError, or 'memory allocation failed' inside libhdf5, under a
    3 GB address-space limit (measured before: 8.4 s and 2.8 GB RSS for the nested references). Now our
    error names the field and the decoded size, in seconds, without the allocation."""
    record = bombs[name]
    assert record["outcome"] == "DatasetError", record
    assert record["field"] == record["expected_field"], record
    assert re.search(r"\d{9,}", record["problem"]), record  # the size it would decode to, or the shape
    assert record["seconds"] < 10 and record["rss_mb"] < 1000, record


def test_reused_keys_nested_deep_are_read_in_linear_time(bombs: dict[str, dict]) -> None:
    """A 290 KB pickle ran for minutes (each of 190,000 elements rebuilt a 10 MB error path); the path is
    now built only for an error, and a long key is cut where an error names it."""
    record = bombs["pickle reused keys nested"]
    assert record["seconds"] < 5, record
    assert record["outcome"] == "DatasetError" and record["field"].startswith("k" * 60), record
    assert len(record["field"]) < 100 and "holds a dict" in record["problem"]
    start = time.perf_counter()
    value = read_pickle(_quadratic_keys(), field="keys.npy")  # the reader alone: linear
    assert time.perf_counter() - start < 3
    for _ in range(99):
        value = value["k" * 100_000]
    assert value == [None] * 190_000


def test_the_decode_budget_is_summed_per_file_and_can_be_raised(tmp_path: Path) -> None:
    """The limit is per file, not per field, and ``max_decoded_bytes=`` / $IMAGINEJAX_MAX_DECODED_BYTES move
    it: four 1 MB arrays pass alone, not together under 3 MB."""
    arrays = {f"a{i}": np.zeros(1 << 17) for i in range(4)}
    np.save(tmp_path / "four.npy", arrays, allow_pickle=True)
    with pytest.raises(DatasetError, match=r"above the limit of 3000000 bytes.*IMAGINEJAX_MAX_DECODED_BYTES") as err:
        read_reference_file(tmp_path / "four.npy", max_decoded_bytes=3_000_000)
    assert err.value.field == "four.npy" and err.value.path == str(tmp_path / "four.npy")
    assert set(read_reference_file(tmp_path / "four.npy", max_decoded_bytes=8_000_000)) == set(arrays)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IMAGINEJAX_MAX_DECODED_BYTES", "3e6")
        with pytest.raises(DatasetError, match="above the limit of 3000000 bytes"):
            read_reference_file(tmp_path / "four.npy")


def test_parquet_metadata_never_replaces_or_adds_a_column(tmp_path: Path, babyai: TrajectoryDataset) -> None:
    """An ``array:observations`` schema metadata entry replaced the visible column: pyarrow and pandas
    showed the file's observations, the importer trained on the metadata's. Metadata may carry the record
    and the instruction table only."""
    file = export_reference(babyai, tmp_path / "ref.parquet", next_observations=False)
    table = pq.read_table(file)
    meta = dict(table.schema.metadata)
    buffer = io.BytesIO()
    np.save(buffer, np.full((8, 3, 4), 666, np.float32))
    for key, text in ((b"array:observations", "in place of the column 'observations'"),
                      (b"array:next_observations", "holds an array no column shows")):
        pq.write_table(table.replace_schema_metadata({**meta, key: buffer.getvalue()}), file)
        assert pq.read_table(file).column("observations").equals(table.column("observations"))
        with pytest.raises(DatasetError, match=text) as err:
            import_reference(file)
        assert err.value.field == key.decode()[6:] and err.value.path == str(file)
    pq.write_table(table.append_column("imaginejax", pa.array(["x"] * table.num_rows)).replace_schema_metadata(meta),
                   file)
    with pytest.raises(DatasetError, match="both a column and the schema metadata record"):
        import_reference(file)
