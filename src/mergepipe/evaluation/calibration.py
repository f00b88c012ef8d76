"""`mergepipe calibrate`: run a registered base on a calibration text and store, per linear
weight, the RMS of each input channel (catalog.calibrations), for utility=activation plans.

The model runs on CPU with transformers (the optional `eval` extra, imported only here), one
chunk of tokens at a time, with a forward hook on every nn.Linear that adds the squares of its
inputs per channel and of its outputs (float64) and counts the tokens. Memory: the model's weights in float32
plus one chunk's activations; nothing per token is kept. docs/catalog.md#calibrations."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mergepipe.catalog.calibrations import (
    CalibrationRow,
    ChannelRms,
    calibration_id,
    get_calibration,
    write_calibration,
)
from mergepipe.catalog.col_groups import group_mean_square
from mergepipe.catalog.db import Catalog
from mergepipe.catalog.lifecycle import resolve_model
from mergepipe.catalog.models import model_tensors
from mergepipe.core.errors import InvalidRequest, NotFound

EXTRA = "eval"
DEFAULT_TOKENS = 2048
CHUNK_TOKENS = 512  # tokens per forward pass (capped by the model's context length)


class MissingExtra(InvalidRequest):
    """A command needs an optional extra that is not installed."""

    code = "missing_package"


def require_transformers() -> Any:
    """transformers, or MissingExtra naming the extra that brings it."""
    try:
        import transformers
    except ImportError:
        raise MissingExtra("calibration runs the model with transformers, which is not "
                           f"installed: pip install 'mergepipe[{EXTRA}]'",
                           field="transformers") from None
    return transformers


@dataclass(frozen=True)
class Measured:
    """What one run over the text found: tokens run and per linear module its channel RMS."""

    tokens: int
    rms: dict[str, np.ndarray]  # module name + ".weight" -> RMS per input channel
    out_ms: dict[str, float]    # module name + ".weight" -> mean over tokens of ||output||^2


def channel_rms(model_dir: str | Path, text: str, tokens: int, model_name: str) -> Measured:
    """Run the model in `model_dir` (transformers' files: config.json, safetensors, tokenizer)
    over the first `tokens` tokens of `text`; the RMS of each nn.Linear's input channels."""
    transformers = require_transformers()
    import torch

    path = Path(model_dir)
    if not path.is_dir():
        raise InvalidRequest(f"model {model_name!r}: calibration needs a local checkpoint "
                             f"directory, not {str(path)!r}", field="base")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as e:
        raise InvalidRequest(f"model {model_name!r} has no usable tokenizer files in "
                             f"{str(path)!r} (calibration tokenizes with the model's own "
                             f"tokenizer): {str(e).splitlines()[0][:200]}",
                             field="base") from None
    ids = list(tok(text, add_special_tokens=False)["input_ids"])[:tokens]
    if not ids:
        raise InvalidRequest("the calibration text gives no tokens", field="text")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path),
                                                                  dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise InvalidRequest(f"model {model_name!r}: transformers cannot load "
                             f"{str(path)!r}: {str(e).splitlines()[0][:200]}",
                             field="base") from None
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    out_sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    handles = []

    def hook(name: str) -> Any:
        def after(_module: Any, args: tuple[Any, ...], output: Any) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float64)
            s = (x * x).sum(dim=0)
            sums[name] = s if name not in sums else sums[name] + s
            y = output.detach().to(torch.float64)
            out_sums[name] = out_sums.get(name, 0.0) + float((y * y).sum())
            counts[name] = counts.get(name, 0) + x.shape[0]
        return after

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_hook(hook(name)))
    ctx = int(getattr(model.config, "max_position_embeddings", CHUNK_TOKENS) or CHUNK_TOKENS)
    chunk = max(1, min(CHUNK_TOKENS, ctx))
    bos = tok.bos_token_id
    try:
        with torch.no_grad():
            for start in range(0, len(ids), chunk - (1 if bos is not None else 0)):
                piece = ids[start:start + chunk - (1 if bos is not None else 0)]
                if bos is not None:
                    piece = [bos, *piece]
                model(input_ids=torch.tensor([piece], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    rms = {f"{n}.weight": torch.sqrt(s / counts[n]).numpy() for n, s in sums.items()}
    return Measured(len(ids), rms, {f"{n}.weight": s / counts[n] for n, s in out_sums.items()})


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
    measured = channel_rms(row.path, text, tokens, row.name)
    shapes = {t.name: t.shape for t in model_tensors(cat, row.name)}
    vectors = [ChannelRms(name, [float(v) for v in r], group_mean_square(r),
                          measured.out_ms[name])
               for name, r in sorted(measured.rms.items())
               if len(shapes.get(name, ())) == 2 and shapes[name][1] == r.size]
    if not vectors:
        raise InvalidRequest(f"model {row.name!r}: no linear weight of the model matches a "
                             "tensor of the checkpoint by name and shape", field="base")
    squares = [v * v for c in vectors for v in c.rms]
    fallback = math.sqrt(math.fsum(squares) / len(squares))
    digest = hashlib.sha256(text.encode()).hexdigest()
    cid = calibration_id(row.name, digest, measured.tokens, vectors)
    existing = get_calibration(cat, cid)
    if existing is not None:
        return existing
    with cat.transaction() as conn:
        write_calibration(conn, CalibrationRow(cid, row.name, digest, measured.tokens, fallback),
                          vectors)
    out = get_calibration(cat, cid)
    assert out is not None
    return out
