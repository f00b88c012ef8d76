"""`mergepipe calibrate`: run a registered base on a calibration text (CPU, transformers) and store
per linear weight the RMS of each input channel (utility=activation) and, per block and channel
group, the diagonal of the empirical Fisher information (utility=fisher); docs/catalog.md#calibrations."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mergepipe.catalog.calibrations import (
    CalibrationRow,
    ChannelRms,
    FisherBlock,
    calibration_id,
    get_calibration,
    write_calibration,
)
from mergepipe.catalog.col_groups import GROUPS, bounds, group_mean_square
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.lifecycle import resolve_model
from mergepipe.catalog.models import BlockRow, model_blocks, model_tensors
from mergepipe.core.errors import InvalidRequest, NotFound
from mergepipe.evaluation.models import LocalModel, load_lm, load_tokenizer, local_model

DEFAULT_TOKENS = 2048
CHUNK_TOKENS = 512  # tokens per forward pass (capped by the model's context length)
FISHER_TOKENS = 64  # tokens per example of the Fisher pass


@dataclass(frozen=True)
class Measured:
    """What one run over the text found: tokens run and per linear module its channel RMS."""

    tokens: int
    rms: dict[str, np.ndarray]  # module name + ".weight" -> RMS per input channel
    fisher: dict[str, np.ndarray]  # parameter name -> mean squared gradient (its shape)


def channel_rms(model: LocalModel, text: str, tokens: int) -> Measured:
    """Run `model` (its config.json, safetensors and tokenizer files) over the first `tokens`
    tokens of `text`: the RMS of each nn.Linear's input channels and the Fisher diagonal of
    every parameter."""
    tok = load_tokenizer(model, "base")
    lm = load_lm(model, "base")
    ids = list(tok(text, add_special_tokens=False)["input_ids"])[:tokens]
    if not ids:
        raise InvalidRequest("the calibration text gives no tokens", field="text")
    ctx = int(getattr(lm.config, "max_position_embeddings", CHUNK_TOKENS) or CHUNK_TOKENS)
    chunk = max(2, min(CHUNK_TOKENS, ctx))
    bos = tok.bos_token_id
    rms = _input_rms(lm, _pieces(ids, bos, chunk))
    return Measured(len(ids), rms, _fisher(lm, _pieces(ids, bos, min(FISHER_TOKENS, chunk))))


def _pieces(ids: list[int], bos: int | None, size: int) -> list[list[int]]:
    """Consecutive pieces of at most `size` tokens, each led by the BOS token if there is one."""
    step = max(1, size - (1 if bos is not None else 0))
    return [([bos] if bos is not None else []) + ids[i:i + step] for i in range(0, len(ids), step)]


def _input_rms(model: Any, pieces: list[list[int]]) -> dict[str, np.ndarray]:
    """Forward passes with a pre-hook on every nn.Linear: per input channel, the RMS over all
    tokens (float64 sums; nothing per token kept)."""
    import torch

    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def hook(name: str) -> Any:
        def pre(_module: Any, args: tuple[Any, ...]) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float64)
            s = (x * x).sum(dim=0)
            sums[name] = s if name not in sums else sums[name] + s
            counts[name] = counts.get(name, 0) + x.shape[0]
        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            for piece in pieces:
                model(input_ids=torch.tensor([piece], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return {f"{n}.weight": torch.sqrt(s / counts[n]).numpy() for n, s in sums.items()}


def _fisher(model: Any, pieces: list[list[int]]) -> dict[str, np.ndarray]:
    """Per parameter, the mean over examples (the pieces) of the squared gradient of the
    example's summed next-token loss: the diagonal of the empirical Fisher information, whose
    weighted sum of squared deltas estimates the KL a delta causes."""
    import torch

    params = list(model.named_parameters())
    acc = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params}
    examples = [p for p in pieces if len(p) >= 2]
    for piece in examples:
        x = torch.tensor([piece], dtype=torch.long)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=x, labels=x)
        (out.loss * (len(piece) - 1)).backward()
        for n, p in params:
            if p.grad is not None:
                acc[n] += p.grad.float().square()
    model.zero_grad(set_to_none=True)
    return {n: (a / max(1, len(examples))).numpy() for n, a in acc.items()}


def calibrate(cat: Catalog, base: str, text: str, tokens: int = DEFAULT_TOKENS
              ) -> CalibrationRow:
    """Run the registered base `base` over `text` and store its channel RMS as a calibration
    (the same run again: the existing row). Only the base's own 2-D tensors whose column count
    matches the module's input are stored."""
    if tokens <= 0:
        raise InvalidRequest(f"tokens must be positive, not {tokens}", field="tokens")
    row = resolve_model(cat, base)
    if row is None:
        raise NotFound(f"model {base!r} not found", field="base")
    if row.base is not None:
        raise InvalidRequest(f"model {row.name!r} is an expert; calibrate its base "
                             f"{row.base!r}", field="base")
    measured = channel_rms(local_model(cat, row.name, "base"), text, tokens)
    shapes = {t.name: t.shape for t in model_tensors(cat, row.name)}
    vectors = [ChannelRms(name, [float(v) for v in r], group_mean_square(r))
               for name, r in sorted(measured.rms.items())
               if len(shapes.get(name, ())) == 2 and shapes[name][1] == r.size]
    if not vectors:
        raise InvalidRequest(f"model {row.name!r}: no linear weight of the model matches a "
                             "tensor of the checkpoint by name and shape", field="base")
    squares = [v * v for c in vectors for v in c.rms]
    fallback = math.sqrt(math.fsum(squares) / len(squares))
    fisher = fisher_blocks(measured.fisher, shapes, model_blocks(cat, row.name))
    fallback_fisher = (math.fsum(float(f.sum()) for f in measured.fisher.values())
                       / max(1, sum(f.size for f in measured.fisher.values())))
    digest = hashlib.sha256(text.encode()).hexdigest()
    cid = calibration_id(row.name, digest, measured.tokens, vectors, fisher)
    existing = get_calibration(cat, cid)
    if existing is not None:
        return existing
    with cat.transaction() as conn:
        write_calibration(conn, CalibrationRow(cid, row.name, digest, measured.tokens, fallback,
                                               fallback_fisher), vectors, fisher)
    out = get_calibration(cat, cid)
    assert out is not None
    return out


def fisher_blocks(fisher: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                  blocks: list[BlockRow]) -> list[FisherBlock]:
    """The Fisher diagonal on the base's block grid: per block of a 2-D tensor cut into rows,
    its mean over each channel group's entries (GROUPS values, matching block_stats.col_sq);
    per block of any other tensor (or grid) its mean (one value)."""
    out = []
    units: dict[str, int] = {}  # per tensor: its grid's unit count (rows, or elements)
    for b in blocks:
        units[b.tensor] = max(units.get(b.tensor, 0), b.row_end)
    for b in blocks:
        f = fisher.get(b.tensor)
        shape = shapes.get(b.tensor, ())
        if f is None or tuple(f.shape) != tuple(shape):
            continue
        if len(shape) == 2 and shape[1] and units[b.tensor] == shape[0]:  # a row grid
            part = f[b.row_start:b.row_end].astype(np.float64)
            per_col = part.sum(axis=0)
            edges = bounds(int(shape[1]))
            c = np.concatenate([[0.0], np.cumsum(per_col)])
            rows = max(1, b.row_end - b.row_start)
            means = [float((c[edges[g + 1]] - c[edges[g]]) / (rows * (edges[g + 1] - edges[g])))
                     if edges[g + 1] > edges[g] else 0.0 for g in range(GROUPS)]
            out.append(FisherBlock(b.tensor, b.block_index, means))
        else:
            flat = f.reshape(-1).astype(np.float64)[b.row_start:b.row_end]
            out.append(FisherBlock(b.tensor, b.block_index,
                                   [float(flat.mean()) if flat.size else 0.0]))
    return out

