"""Our GGUF header reader (models/gguf_header.py) against gguf.GGUFReader, the gguf package's own
reader: every key and value, every tensor's name, type, shape, offset and size, on files the
package writes (tiny models, every value type) and, where MSA_REAL_GGUF_DIR is set, on the real
files, with the time and peak memory of both readers; broken files give one line."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from llamacpp_reference import REAL_GGUF_DIR
from tiny_checkpoints import gguf_blocks, random_llama_weights, write_tiny_gguf

from msa.models import ModelConfig, ModelError
from msa.models.config import Qwen3Config
from msa.models.gguf_header import read_header, read_tensor

gguf = pytest.importorskip("gguf")

# read at import: the per-test home clears MSA_* variables
REAL_DIR = REAL_GGUF_DIR
REAL_FILES = ["gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
TENSOR_TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]


def assert_same_as_gguf_reader(path: Path) -> None:
    ours = read_header(path)
    reader = gguf.GGUFReader(str(path))
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.fields) == list(expected)
    for key, value in expected.items():
        got = ours.fields[key]
        assert got == value and type(got) is type(value), key
        if isinstance(value, list):
            assert [type(v) for v in got] == [type(v) for v in value], key
    assert ours.version == reader.fields["GGUF.version"].contents()
    assert ours.data_start == reader.data_offset
    assert [(t.name, t.type_name, t.shape, t.data_offset, t.n_bytes) for t in ours.tensors] == [
        (t.name, t.tensor_type.name, tuple(int(s) for s in t.shape), t.data_offset, t.n_bytes)
        for t in reader.tensors
    ]


def write_every_kind(path: Path) -> None:
    """Every value type, arrays of each, non-ASCII strings, and tensors of several types."""
    w = gguf.GGUFWriter(str(path), "llama")
    for kind, value in [
        ("uint8", 200), ("int8", -100), ("uint16", 60000), ("int16", -30000),
        ("uint32", 4_000_000_000), ("int32", -2_000_000_000), ("float32", 0.1),
        ("uint64", 2**63 + 5), ("int64", -(2**62)), ("float64", 0.1), ("bool", True),
        ("string", "naïve café 中文 😀"),
    ]:  # fmt: skip
        getattr(w, f"add_{kind}")(f"test.{kind}", value)
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25, 1e-3])
    w.add_array("test.bools", [True, False, True])
    w.add_array("test.strings", ["", "a", "ünï", "😀 x", "\n\t"])
    w.add_array("test.empty", [])
    w.add_token_list([f"tok{i}" for i in range(300)] + ["Ġthe", "▁world", "<0x0A>"])
    w.add_token_scores(np.linspace(-5, 0, 303, dtype=np.float32).tolist())
    rng = np.random.default_rng(0)
    for i, kind in enumerate(TENSOR_TYPES):
        a = rng.standard_normal((4, 256)).astype(np.float32)
        if kind in ("F32", "F16"):
            w.add_tensor(f"t.{kind}", a.astype(np.float16) if kind == "F16" else a)
        else:
            raw_dtype = getattr(gguf.GGMLQuantizationType, kind)
            w.add_tensor(f"t.{kind}", gguf_blocks(a, kind, seed=i), raw_dtype=raw_dtype)
    w.add_tensor("rope_freqs.weight", np.linspace(1, 8, 32, dtype=np.float32))
    w.add_tensor("t.3d", rng.standard_normal((2, 3, 32)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("header") / "every-kind.gguf"
    write_every_kind(path)
    return path


def test_every_value_and_tensor_type_as_gguf_reader_gives(every_kind):
    assert_same_as_gguf_reader(every_kind)
    fields = read_header(every_kind).fields
    assert fields["test.string"] == "naïve café 中文 😀" and fields["test.uint64"] == 2**63 + 5


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tiny_models_as_gguf_reader_gives(arch, tmp_path):
    config = (ModelConfig if arch == "llama" else Qwen3Config).tiny(
        hidden_size=256, intermediate_size=512, num_attention_heads=4
    )
    path = tmp_path / f"{arch}.gguf"
    qtypes = {"blk.0.attn_q.weight": "Q4_K", "blk.0.ffn_down.weight": "Q6_K"}
    write_tiny_gguf(
        path, config, random_llama_weights(config), qtype="Q8_0", qtypes=qtypes, arch=arch
    )
    assert_same_as_gguf_reader(path)
    assert {t.type_name for t in read_header(path).tensors} == {"F32", "Q8_0", "Q4_K", "Q6_K"}


def test_a_float_tensor_reads_as_gguf_reader_maps_it(every_kind):
    header = read_header(every_kind)
    reader = {t.name: t for t in gguf.GGUFReader(str(every_kind)).tensors}
    for name in ["rope_freqs.weight", "t.3d", "t.F16", "t.F32"]:
        got = read_tensor(header, name)
        assert got.dtype == reader[name].data.dtype and np.array_equal(got, reader[name].data)
    with pytest.raises(ModelError, match="no floating-point tensor t.Q4_K"):
        read_tensor(header, "t.Q4_K")


def _offset_after(data: bytes, key: str) -> int:
    """Where the type of key/value `key` starts."""
    return data.index(key.encode()) + len(key)


def _broken_files(data: bytes) -> dict[str, bytes]:
    """The BROKEN cases of a good file's bytes."""

    def patched(offset: int, fmt: str, value) -> bytes:
        return data[:offset] + struct.pack(fmt, value) + data[offset + struct.calcsize(fmt) :]

    tokens = _offset_after(data, "tokenizer.ggml.tokens") + 4  # past the array's type
    cases = {
        "empty": b"",
        "magic only": data[:4],
        "wrong magic": b"GGUX" + data[4:],
        "version 9": patched(4, "<I", 9),
        "in the key/values": data[: tokens + 100],
        "in the tensor infos": data[: data.index(b"t.F16") + 3],
        "in the tensor data": data[:-10],
        "unknown value type": patched(_offset_after(data, "test.uint8"), "<I", 77),
        "array of arrays": patched(_offset_after(data, "test.ints") + 4, "<I", 9),
        "tensor count": patched(8, "<Q", 2**62),
        "key/value count": patched(16, "<Q", 2**63),
        "array length": patched(tokens + 4, "<Q", 2**60),
        "string length": patched(tokens + 12, "<Q", 2**63),
        "tensor dims": patched(data.index(b"t.F32") + 5, "<I", 2**31),
        "tensor type": patched(data.index(b"t.F32") + 5 + 4 + 16, "<I", 1000),
        "not utf-8": data.replace(b"tok299", b"tok\xff\xfe9"),
    }
    assert list(cases) == BROKEN
    return cases


BROKEN = [
    "empty", "magic only", "wrong magic", "version 9", "in the key/values", "in the tensor infos",
    "in the tensor data", "unknown value type", "array of arrays", "tensor count",
    "key/value count", "array length", "string length", "tensor dims", "tensor type", "not utf-8",
]  # fmt: skip


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_file_gives_one_line(case, every_kind, tmp_path):
    """Truncated anywhere, a wrong magic or type, or a count or length past the file's end:
    one line, without a traceback or an allocation of that size."""
    path = tmp_path / "broken.gguf"
    path.write_bytes(_broken_files(every_kind.read_bytes())[case])
    with pytest.raises(ModelError) as e:
        read_header(path)
    assert str(e.value).startswith(f"{path} is not a readable GGUF file (") and "\n" not in str(
        e.value
    )


MEASURE = """
import sys, time
t0 = time.perf_counter()
if sys.argv[1] == "ours":
    from msa.models.gguf_header import read_header
    fields = read_header(sys.argv[2]).fields
else:
    from gguf import GGUFReader
    reader = GGUFReader(sys.argv[2])
    fields = {k: f.contents() for k, f in reader.fields.items()}
seconds = time.perf_counter() - t0
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(seconds, int(peak.split()[1]) * 1024)
"""


def measure(reader: str, path: Path) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of reading every field with `reader`, in a fresh process."""
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, reader, str(path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seconds, peak = run.stdout.split()
    return float(seconds), int(peak)


@pytest.mark.realmodel
@pytest.mark.skipif(not REAL_DIR, reason="MSA_REAL_GGUF_DIR names no folder of real GGUF files")
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_files_as_gguf_reader_gives_faster_and_smaller(name):
    path = Path(REAL_DIR) / name
    assert path.is_file(), f"{path} is missing"
    assert_same_as_gguf_reader(path)
    (ours_s, ours_peak), (ref_s, ref_peak) = measure("ours", path), measure("gguf", path)
    report = {"file": name, "ours_s": ours_s, "ours_peak": ours_peak}
    report |= {"gguf_reader_s": ref_s, "gguf_reader_peak": ref_peak}
    print(json.dumps(report))  # pytest -s shows it
    assert ours_s * 5 < ref_s and ours_peak < ref_peak, report
