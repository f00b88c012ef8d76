"""The embeddings moved to the output's vocabulary (mergekit's tokenizer_source / tokenizer:), a
step on the merge's staged output: each model's vocabulary tensors (embed_tokens, lm_head) read
whole by range, their rows moved to the output's token ids (as jobs.tokenizer planned), the rows
a model lacks filled as mergekit fills them, and the moved tensors merged by the same request
at full read in a scratch catalog (the same kernels: mergekit's bytes), replacing the staged
ones. The merge's budget does not apply to them (counted apart: `vocab_bytes_read`)."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.queue import NewIngestJob
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_tokenizer import MODEL_TOKEN, ZERO, TokenSpec, is_vocab_tensor
from mergepipe.core.request import Budget, MergeRequest
from mergepipe.core.vocab import DTYPE_SIZES
from mergepipe.executor.slices import edit_config, hashed_tensor, read_tensor, require_finite
from mergepipe.executor.stream import ExecutionResult, output_hash
from mergepipe.jobs.ingest import run_ingestion
from mergepipe.jobs.merge import merge
from mergepipe.jobs.tokenizer import Reindex, TokenizerPlan, apply_tokenizer, model_json
from mergepipe.storage.checkpoint import INDEX_FILE, open_checkpoint
from mergepipe.storage.storage import RangeReader, open_reader

_TIED_HEAD, _TIED_TO = "lm_head.weight", "embed_tokens.weight"


@dataclass(frozen=True)
class TokenizerStep:
    """The merge's last step on its staged output (jobs.merge.Finish): the embeddings
    re-indexed, the tokenizer files written; returns the manifest's record of both."""

    plan: TokenizerPlan
    request: MergeRequest

    def __call__(self, stage: Path, result: ExecutionResult) -> dict[str, object]:
        """Replace the staged vocabulary tensors by the merge of the re-indexed ones (`result`
        updated to match: shapes, hashes) and write the tokenizer files."""
        reindex = self.plan.reindex
        record: dict[str, object] = {"options": dict(self.plan.options or {})}
        if reindex is not None:
            staged = {t.name: t for t in result.tensors if is_vocab_tensor(t.name)}
            dtype = self.request.params.get("compute_dtype", "float32")  # absent: the default
            moved: dict[str, list[torch.Tensor]] = {}
            read = 0
            with open_reader(random_access=True) as reader:
                for name in staged:
                    inputs = []
                    for m in reindex.models:
                        t = _read_tensor(m.path, name, reader)
                        read += t.numel() * t.element_size()
                        inputs.append(t if dtype == "files" else t.to(getattr(torch, str(dtype))))
                    moved[name] = move_rows(reindex, inputs)
            merged = _merge(self.request, reindex, moved, {n: t.dtype for n, t in staged.items()})
            _splice(stage, result, merged)
            edit_config(stage, ("vocab_size",), reindex.rows)  # mergekit writes it too
            resized = any(tuple(merged[n].shape) != staged[n].shape for n in merged)
            record.update(reindex.record(), vocab_bytes_read=read, tensors=sorted(merged),
                          resized=resized)
        record["files"] = apply_tokenizer(self.plan, stage)
        return record

    def document(self) -> dict[str, Any]:
        return self.plan.document()

    @property
    def reindexes(self) -> bool:
        return self.plan.reindex is not None


def queued_step(request: Mapping[str, Any]) -> TokenizerStep | None:
    """The tokenizer step a queued merge carries (jobs.merge.submit_merge stores its config's
    tokenizer plan under the request's "tokenizer"); None without one."""
    doc = request.get("tokenizer")
    if doc is None:
        return None
    return TokenizerStep(TokenizerPlan.from_document(doc), MergeRequest.from_dict(dict(request)))


def move_rows(plan: Reindex, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each model's tensor with its rows at the output's token ids (`tensors` in the order of
    plan.models, vocabulary first); padding rows take the mean of the vocabulary's rows."""
    n, rows = len(plan.tokens), plan.rows
    shape = tensors[0].shape[1:]
    dtype = tensors[0].dtype
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    fill = _fills(plan, tensors, dtype)
    forced = [tid for tid, tok in enumerate(plan.tokens)
              if any(s.name == tok and s.force for s in plan.specs)]
    out = []
    for k, m in enumerate(plan.models):
        new = torch.zeros((rows, *shape), dtype=dtype)
        src = torch.tensor(m.rows, dtype=torch.long)
        keep = src >= 0
        keep[forced] = False
        new[:n][keep] = tensors[k][src[keep]].to(dtype)
        for tid, row in fill.items():
            if not bool(keep[tid]):
                new[tid] = row
        if rows > n:
            new[n:] = torch.mean(new[:n], dim=0)
        out.append(new)
    return out


def _fills(plan: Reindex, tensors: Sequence[torch.Tensor], dtype: torch.dtype
           ) -> dict[int, torch.Tensor]:
    """The row of each token some model lacks (or `force`d), as mergekit fills it: the
    `tokens:` source, else the one model having it, else the base's, else the mean of the
    models having it (summed in order); no model having it: zeros."""
    models, specs = plan.models, {s.name: s for s in plan.specs}
    fill: dict[int, torch.Tensor] = {}
    for tid, tok in enumerate(plan.tokens):
        have = [m.rows[tid] >= 0 for m in models]
        spec = specs.get(tok)
        if not (spec is not None and spec.force) and all(have):
            continue
        if spec is not None:
            fill[tid] = _from_spec(plan, tensors, spec, tid)
        elif sum(have) == 1 or (any(have) and have[plan.base]):
            k = have.index(True) if sum(have) == 1 else plan.base
            fill[tid] = tensors[k][models[k].rows[tid]]
        elif not any(have):
            fill[tid] = tensors[0].new_zeros(tensors[0].shape[1:])
        else:
            mean = torch.zeros(tensors[0].shape[1:], dtype=dtype)
            for k, m in enumerate(models):
                if have[k]:
                    mean = mean + tensors[k][m.rows[tid]]
            mean /= sum(have)
            fill[tid] = mean
    return fill


def _from_spec(plan: Reindex, tensors: Sequence[torch.Tensor], spec: TokenSpec, tid: int
               ) -> torch.Tensor:
    """A `tokenizer.tokens` entry's row (plan_tokenizer checked its model and token)."""
    src, where = spec.source, f"tokenizer.tokens.{spec.name}.source"
    if src.kind == ZERO:
        return tensors[0].new_zeros(tensors[0].shape[1:])
    k = next((i for i, m in enumerate(plan.models) if m.text == src.model), None)
    if k is None:
        raise InvalidRequest(f"{where}: give the token's source (a model lacks it)", field=where)
    m = plan.models[k]
    if src.kind == MODEL_TOKEN:  # plan_tokenizer turned a token into its row
        row = src.token_id
        if row is None or not 0 <= row < tensors[k].shape[0]:
            raise InvalidRequest(f"{where}: {m.text} has no row {row} (it has "
                                 f"{tensors[k].shape[0]})", field=where)
        return tensors[k][row]
    if m.rows[tid] < 0:
        raise InvalidRequest(f"{where}: {m.text} has no token {spec.name!r}", field=where)
    return tensors[k][m.rows[tid]]


def _read_tensor(path: str, name: str, reader: RangeReader | None = None) -> torch.Tensor:
    """The tensor `name` of the checkpoint at `path`, read whole by range (lm_head absent: the
    tied embeddings)."""
    if reader is None:
        with open_reader(random_access=True) as own:
            return _read_tensor(path, name, own)
    entries = open_checkpoint(path).by_name()
    entry = entries.get(name)
    if entry is None and name.endswith(_TIED_HEAD):  # tied: the embeddings serve as lm_head
        entry = next((e for n, e in entries.items() if n.endswith(_TIED_TO)), None)
    if entry is None:
        raise InvalidRequest(f"tokenizer: {path} has no tensor {name!r} to re-index",
                             field="tokenizer")
    return read_tensor(reader, entry)


def _merge(request: MergeRequest, plan: Reindex, moved: Mapping[str, list[torch.Tensor]],
           out_dtypes: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """The request's merge of the moved tensors at full read, in a scratch catalog."""
    base_dir = plan.models[plan.base].path
    config = model_json(base_dir, "config.json") or {}
    with tempfile.TemporaryDirectory(prefix="mergepipe-vocab-") as tmp:
        root = Path(tmp)
        names = [f"v{k}" for k in range(len(plan.models))]
        for k, name in enumerate(names):
            (root / name).mkdir()
            save_file({t: moved[t][k].contiguous() for t in moved},
                      str(root / name / "model.safetensors"), metadata={"format": "pt"})
            (root / name / "config.json").write_text(json.dumps(
                {**config, "vocab_size": plan.rows}))
        base = names[plan.base]
        experts = [n for k, n in enumerate(names) if k != plan.base]
        cat = Catalog(root / "vocab.duckdb")
        try:
            run_ingestion(cat, NewIngestJob(base, "full", str(root / base), None,
                                            with_stats=False))
            for n in experts:
                # with statistics: TIES-family trims read their thresholds from them
                run_ingestion(cat, NewIngestJob(n, "full", str(root / n), base, force=True))
            dtypes = set(out_dtypes.values())
            sub = replace(request, base=base, budget=Budget(fraction=1.0), strategy="scratch",
                          experts=tuple(replace(e, model=n)  # the experts in their order
                                        for e, n in zip(request.experts, experts, strict=True)),
                          output_dtype=dtypes.pop() if len(dtypes) == 1 else None)
            merge(cat, sub, root / "out", output_name="out")
        finally:
            cat.close()
        out: dict[str, torch.Tensor] = {}
        for f in sorted((root / "out").glob("*.safetensors")):
            out.update(load_file(str(f)))
        return {t: out[t] for t in moved}


def _splice(stage: Path, result: ExecutionResult, merged: Mapping[str, torch.Tensor]) -> None:
    """Rewrite the staged files holding the merged tensors; `result` follows."""
    for name, tensor in merged.items():  # refused before any staged file changes
        require_finite(name, tensor)
    by_file: dict[str, list[str]] = {}
    for t in result.tensors:
        if t.name in merged:
            by_file.setdefault(t.file, []).append(t.name)
    for fname in by_file:
        with safe_open(str(stage / fname), framework="pt") as f:
            meta = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        tensors.update({k: merged[k] for k in by_file[fname]})
        (stage / fname).unlink()
        save_file(tensors, str(stage / fname), metadata=meta)
    result.tensors = [hashed_tensor(t.name, merged[t.name], t.file) if t.name in merged else t
                      for t in result.tensors]
    result.output_hash = output_hash(result.tensors)
    for name in merged:
        result.first_passes.pop(name, None)  # the registration scans them again
    index = stage / INDEX_FILE
    if index.is_file():
        doc = json.loads(index.read_text())
        doc.setdefault("metadata", {})["total_size"] = sum(
            DTYPE_SIZES[t.dtype] * math.prod(t.shape) for t in result.tensors)
        index.write_text(json.dumps(doc, indent=2))
