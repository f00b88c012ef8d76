"""What the executor knows of each input model, loaded from the catalog, and drift checks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import (
    BlockRow,
    FileRow,
    LoraA,
    TensorRow,
    find_models,
    model_blocks,
    models_details,
)
from mergepipe.catalog.reverify import reverify_file
from mergepipe.core.errors import InvalidRequest, NotFound, SourceChanged
from mergepipe.storage.store import store_for


@dataclass
class ModelSource:
    """A catalog model as the executor reads it."""

    name: str
    kind: str
    path: str
    base: str | None
    lora_scale: float | None
    files: dict[int, FileRow]
    tensors: dict[str, TensorRow]  # in checkpoint order
    blocks: dict[tuple[str, int], BlockRow] = field(default_factory=dict)
    # False: `blocks` holds only the blocks a plan reads (load_models(..., planned=...));
    # complete_blocks loads the rest when every block is needed (a re-verification)
    complete: bool = True

    def complete_blocks(self, cat: Catalog) -> dict[tuple[str, int], BlockRow]:
        """Every block of the model (loaded now if only the planned ones were)."""
        if not self.complete:
            self.blocks = {(b.tensor, b.block_index): b for b in model_blocks(cat, self.name)}
            self.complete = True
        return self.blocks

    def file_path(self, index: int) -> str:
        return self.files[index].path

    def tensor_blocks(self, tensor: str) -> list[BlockRow]:
        """The blocks of one tensor in row order."""
        info = self.tensors[tensor]
        out = []
        i = 0
        while (tensor, i) in self.blocks:
            out.append(self.blocks[(tensor, i)])
            i += 1
        if not out:
            raise InvalidRequest(f"model {self.name!r}: tensor {info.name!r} has no blocks in the "
                                 "catalog; re-ingest the model", field="base")
        return out

    def check_files(self, cat: Catalog) -> None:
        """Raise SourceChanged if a file is gone or differs from ingestion."""
        for f in list(self.files.values()):
            try:
                st = store_for(f.path).stat(f.path)
            except OSError as e:
                raise SourceChanged(
                    f"model {self.name!r}: file {f.path} is not readable ({e.strerror}); it was "
                    f"moved or deleted after ingestion: restore it or re-ingest {self.name!r}"
                ) from None
            change = st.change_from(f.stamp)
            if change is not None:
                self.files[f.index] = reverify_file(cat, self.name, f, st, change,
                                                    list(self.tensors.values()),
                                                    list(self.complete_blocks(cat).values()))

    def verify_block(self, block: BlockRow, raw: bytes | bytearray | memoryview) -> None:
        """Raise SourceChanged unless `raw` has the block's catalogued xxh3-128 content hash."""
        self._verify(raw, block.content_hash, f"tensor {block.tensor!r} block {block.block_index}",
                     block.file_index, block.byte_offset, block.nbytes)

    def verify_lora_a(self, tensor: str, spec: LoraA, raw: bytes | bytearray | memoryview
                      ) -> None:
        """Raise SourceChanged unless `raw` has lora_A's catalogued hash (if the row has one)."""
        if spec.content_hash is not None:
            self._verify(raw, spec.content_hash, f"tensor {tensor!r} lora_A", spec.file_index,
                         spec.offset, spec.nbytes)

    def _verify(self, raw: bytes | bytearray | memoryview, content_hash: str, what: str,
                file_index: int, offset: int, nbytes: int) -> None:
        if xxhash.xxh3_128_hexdigest(raw) != content_hash:
            raise SourceChanged(
                f"model {self.name!r}: {what} in {self.file_path(file_index)} (bytes {offset}.."
                f"{offset + nbytes}) does not match the catalog's content hash: "
                f"the file changed after ingestion; re-ingest {self.name!r}")


def load_models(cat: Catalog, names: Sequence[str], *,
                planned: Sequence[tuple[str, str, int]] | None = None) -> list[ModelSource]:
    """Files, tensors and blocks of each named model, in four or five catalog queries for all of them, on one connection;
    NotFound / InvalidRequest for the first name that is missing or not ready. With `planned`
    ((model, tensor, block_index): a plan's access set), every block is loaded of the first
    model (the base, streamed whole) and only the planned ones of the others (incomplete)."""
    whole = None if planned is None else names[:1]
    with cat.reader() as conn:  # one connection for the five queries
        rows = find_models(conn, names)
        for name in names:
            m = rows.get(name)
            if m is None:
                raise NotFound(f"model {name!r} is not in the catalog", field="model")
            if m.status != "ready":
                raise InvalidRequest(f"model {name!r} is {m.status}, not ready", field="model")
        files, tensors, blocks = models_details(conn, names, whole=whole, named=planned or ())
    out = {n: ModelSource(m.name, m.kind, m.path, m.base, m.lora_scale,
                          {f.index: f for f in files[n]}, {t.name: t for t in tensors[n]},
                          {(b.tensor, b.block_index): b for b in blocks[n]},
                          complete=whole is None or n in whole)
           for n, m in rows.items()}
    return [out[n] for n in names]
