"""A file whose stamp changed since ingestion (a `touch`, a copy keeping the bytes): re-verified
by content hash. When every catalogued byte range still has its hash and the header still
places the tensors where the catalog has them, the new stamp is recorded and the file is
accepted; otherwise SourceChanged names the model, the file and what differs."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import BlockRow, FileRow, TensorRow
from mergepipe.core.errors import InvalidCheckpoint, SourceChanged
from mergepipe.storage.safetensors_format import read_header
from mergepipe.storage.storage import open_reader
from mergepipe.storage.store_types import Stamp


def reverify_file(cat: Catalog, model: str, f: FileRow, stamp: Stamp, change: str,
                  tensors: Sequence[TensorRow], blocks: Sequence[BlockRow]) -> FileRow:
    """Check file `f` of `model` (now stamped `stamp`, `change` saying how the stamp differs)
    against the catalog's content hashes; the file row with its new stamp, recorded, if its
    bytes are the ones ingested. SourceChanged if not."""
    def changed(what: str) -> SourceChanged:
        return SourceChanged(f"model {model!r}: file {f.path} changed after ingestion ({change}; "
                             f"{what}); re-ingest {model!r} (a new version) before merging it")

    mine = [t for t in tensors if t.file_index == f.index]
    spans = {(t.dtype, t.shape, t.data_offset, t.nbytes) for t in mine}
    spans |= {(t.lora_a.dtype, t.lora_a.shape, t.lora_a.offset, t.lora_a.nbytes)
              for t in tensors if t.lora_a is not None and t.lora_a.file_index == f.index}
    try:
        header = read_header(f.path)
    except (OSError, InvalidCheckpoint) as e:
        raise changed(f"its header cannot be read: {e}") from None
    have = {(e.dtype, e.shape, e.data_offset, e.nbytes) for e in header.tensors}
    if header.header_len != f.header_len or not spans <= have:
        raise changed("its header differs from the catalog's")
    with open_reader() as reader:
        if f.etag is not None or f.version_id is not None:
            reader.pin(f.path, stamp)
        for b in blocks:
            if b.file_index == f.index and xxhash.xxh3_128_hexdigest(
                    reader.read(f.path, b.byte_offset, b.nbytes)) != b.content_hash:
                raise changed(f"tensor {b.tensor!r} block {b.block_index} differs from the "
                              "catalog's content hash")
        for t in tensors:
            a = t.lora_a
            if (a is not None and a.file_index == f.index and a.content_hash is not None
                    and xxhash.xxh3_128_hexdigest(reader.read(f.path, a.offset, a.nbytes))
                    != a.content_hash):
                raise changed(f"tensor {t.name!r} lora_A differs from the catalog's content "
                              "hash")
    new = FileRow(f.index, f.path, stamp.size, stamp.mtime_ns, f.header_len, stamp.etag,
                  stamp.version_id)
    cat.execute("files_restamp", {"model": model, "file_index": f.index, "path": f.path,
                                  "size": new.size, "mtime_ns": new.mtime_ns,
                                  "header_len": new.header_len, "etag": new.etag,
                                  "version_id": new.version_id})
    return new
