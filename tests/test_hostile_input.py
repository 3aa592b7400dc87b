"""Hostile and malformed input: every hole found by an outside attack on the importers, datasets and
validation is closed, each case a regression test (checkpoints: tests/test_checkpoint.py, test_resume.py;
random inputs: tests/test_fuzz_importers.py).

Threat model: reference files, Minari datasets and dataset directories from the internet are untrusted;
reading one must import exactly what a legitimate file holds or raise our DatasetError naming the field —
never run code, never crash the process, never read another file."""

from __future__ import annotations

import dataclasses
import pickle
import pickletools
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import imaginejax.interop.reference as reference
from imaginejax import envs
from imaginejax.data import (DatasetError, EnvFacts, TrajectoryDataset, load_dataset, save_dataset,
                             validate_for_env)
from imaginejax.data.collect import collect, random_policy
from imaginejax.interop.reference import export_reference, import_reference, load_npy, read_reference_file
from imaginejax.data.safe_pickle import read_pickle

from dataset_helpers import assert_bit_exact, random_babyai_dataset

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
