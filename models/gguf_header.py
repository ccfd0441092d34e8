"""Read a GGUF file's header (metadata and tensor index) without the gguf package's reader.

`gguf.GGUFReader` builds numpy objects for every part of every field: for a vocabulary of
150K-262K strings that takes ~20 s and ~1 GB on the first load of a real file. This reader
walks the header once with struct over a memory map, decoding strings as it goes; numeric
arrays go through np.frombuffer. The values are those `GGUFReader(path).fields[k].contents()`
gives (strings strict UTF-8, arrays as lists). Layout (GGUF v2/v3): magic, version, tensor
count, kv count, the key/values, the tensor infos, then the data section at the next multiple
of `general.alignment` (default 32); a tensor's offset counts from there.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# value type (GGUFValueType) -> the struct / numpy code of its scalars: uint8, int8, ...
SCALARS = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd"))
NUMPY_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}  # for read_tensor


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type_name: str  # a gguf.GGMLQuantizationType name, e.g. "Q4_K"
    shape: tuple[int, ...]  # GGUF order: the fastest axis first
    data_offset: int  # from the start of its file
    n_bytes: int
    part: int = 0  # the file of a split GGUF that holds it (gguf_split.py), from 0


@dataclass(frozen=True)
class GgufHeader:
    path: Path
    version: int
    fields: dict  # key -> int, float, bool, str or a list of them
    tensors: list[GgufTensor]
    data_start: int  # of the data section, aligned
    parts: tuple[Path, ...] = ()  # every file of a split GGUF, in order (gguf_split.py)

    def file_of(self, tensor: GgufTensor) -> Path:
        """The file that holds `tensor`'s data."""
        return self.parts[tensor.part] if self.parts else self.path


class _Bad(Exception):
    """A reason the file cannot be read; read_header turns it into one ModelError line."""


class _Cursor:
    """Reads little- or big-endian values from a mapped file, checking each against its end."""

    def __init__(self, buf: mmap.mmap, order: str):
        self.buf, self.order, self.pos, self.size = buf, order, 0, len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Bad(f"{what} at byte {self.pos}: past the end of the file")

    def scalar(self, code: str):
        fmt = self.order + code
        n = struct.calcsize(fmt)
        self.need(n, "a value")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        return self.strings(1)[0]

    def strings(self, count: int) -> list[str]:
        """`count` strings (length, UTF-8 bytes) in one tight loop: a vocabulary has 262K."""
        self.need(count * 8, f"{count} strings")  # each has at least its length
        buf, pos, size, out = self.buf, self.pos, self.size, []
        unpack = struct.Struct(self.order + "Q").unpack_from
        try:
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                if pos + n > size:
                    raise _Bad(f"a string of {n} bytes at byte {pos}: past the end of the file")
                out.append(buf[pos : pos + n].decode("utf-8"))
                pos += n
        except struct.error:
            raise _Bad(f"a string length at byte {pos}: past the end of the file") from None
        except UnicodeDecodeError as e:
            raise _Bad(f"the string at byte {pos} is not UTF-8 ({e.reason})") from None
        self.pos = pos
        return out

    def numbers(self, code: str, count: int) -> list:
        dtype = np.dtype(code).newbyteorder(self.order)
        self.need(count * dtype.itemsize, f"an array of {count} values")
        raw = self.buf[self.pos : self.pos + count * dtype.itemsize]
        self.pos += len(raw)
        return np.frombuffer(raw, dtype=dtype).tolist()

    def value(self, vtype: int):
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype != ARRAY:
            raise _Bad(f"unknown value type {vtype}")
        itype, count = self.scalar("I"), self.scalar("Q")
        if itype == STRING:
            return self.strings(count)
        if itype in SCALARS:
            return self.numbers(SCALARS[itype], count)
        raise _Bad(f"arrays of value type {itype} are not supported")


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    n_dims = cur.scalar("I")
    cur.need(n_dims * 8, f"the {n_dims} dimensions of tensor {name}")
    shape = tuple(cur.scalar("Q") for _ in range(n_dims))
    return name, shape, cur.scalar("I"), cur.scalar("Q")


def _tensors(infos: list, data_start: int, size: int) -> list[GgufTensor]:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    tensors, names = [], set()
    for name, shape, type_id, offset in infos:
        if name in names:
            raise _Bad(f"tensor {name} is listed twice")
        names.add(name)
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise _Bad(f"tensor {name} has unknown type {type_id}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        n_elements = int(np.prod(shape, dtype=object))  # Python ints: no overflow
        n_bytes = n_elements * type_size // block
        start = data_start + offset
        if start + n_bytes > size:
            raise _Bad(f"the data of tensor {name}: past the end of the file")
        tensors.append(GgufTensor(name, qtype.name, shape, start, n_bytes))
    return tensors


def _parse(path: Path, buf: mmap.mmap) -> GgufHeader:
    if buf[:4] != MAGIC:
        raise _Bad("it does not start with GGUF")
    # A version whose low 16 bits are 0 was written for the other byte order (as GGUFReader).
    order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"
    cur = _Cursor(buf, order)
    cur.pos = 4
    version = cur.scalar("I")
    if version not in VERSIONS:
        raise _Bad(f"version {version}; msa reads versions 2 and 3")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    cur.need(n_kv * 12, f"{n_kv} key/values")  # each at least a key length and a type
    fields = {}
    for _ in range(n_kv):
        key = cur.string()
        fields[key] = cur.value(cur.scalar("I"))
    cur.need(n_tensors * 24, f"{n_tensors} tensor infos")  # name length, dims, type, offset
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Bad(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-cur.pos // alignment) * alignment
    return GgufHeader(path, version, fields, _tensors(infos, data_start, cur.size), data_start)


def read_header(path: Path | str) -> GgufHeader:
    """The metadata and tensor index of the GGUF file at `path`; ModelError (one line) for a
    file that is not one (wrong magic, truncated, unknown type, counts past its end)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if f.seek(0, 2) < 24:  # magic, version and the two counts
                raise _Bad("it is too short")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf)
    except (_Bad, OSError) as e:
        raise ModelError(f"{path} is not a readable GGUF file ({e})") from None


def read_tensor(header: GgufHeader, name: str) -> np.ndarray:
    """A floating-point tensor's values, mapped from the file (rows first, numpy order)."""
    t = next((t for t in header.tensors if t.name == name), None)
    if t is None or t.type_name not in NUMPY_TYPES:
        raise ModelError(f"{header.path} has no floating-point tensor {name}")
    dtype = np.dtype(NUMPY_TYPES[t.type_name])
    shape = tuple(reversed(t.shape))
    return np.memmap(header.file_of(t), dtype=dtype, mode="r", offset=t.data_offset, shape=shape)
