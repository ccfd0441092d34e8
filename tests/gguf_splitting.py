"""Write a GGUF as a split GGUF with gguf-py's writer, which lays the parts out as llama.cpp's
gguf-split does: the metadata in the first part, `split.*` keys and their own tensors in each."""

from __future__ import annotations

from pathlib import Path


def write_split(
    source: Path, prefix: Path, max_tensors: int, *, metadata_only_first: bool = False
) -> list[Path]:
    """`source` copied into parts `{prefix}-0000i-of-0000n.gguf` of at most `max_tensors`
    tensors each (a first part of metadata alone with `metadata_only_first`); the parts, in
    order."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(
        prefix.with_name(prefix.name + ".gguf"),
        arch,
        split_max_tensors=max_tensors,
        small_first_shard=metadata_only_first,
    )
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = sorted(prefix.parent.glob(f"{prefix.name}-*-of-*.gguf"))
    assert len(parts) > 1, parts
    return parts
