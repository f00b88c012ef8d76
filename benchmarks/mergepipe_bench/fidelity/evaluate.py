"""Downstream measurements: teacher-forced KL between models, greedy exact match, L2 deviation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mergepipe_bench.fidelity.model import collate
from mergepipe_bench.fidelity.tasks import PAD, Example


@torch.no_grad()
def log_probs(model: Any, examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-probs (N, T-1, V) float32 and the target ids (N, T-1), PAD-padded."""
    ids, _ = collate([e.ids() for e in examples], [e.answers for e in examples])
    logits = model(input_ids=ids, attention_mask=(ids != PAD).long()).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1), ids[:, 1:]


def masks(examples: list[Example], targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Boolean (N, T-1) masks of the positions scored: all real tokens, and answer tokens."""
    real = targets != PAD
    answer = torch.zeros_like(real)
    for i, e in enumerate(examples):
        answer[i, [j - 1 for j in e.answers]] = True  # position j-1 predicts token j
    return {"all": real, "answer": answer & real}


def token_kl(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(ref || other) per position, from log-probs (N, T, V) -> (N, T)."""
    return (ref.exp() * (ref - other)).sum(-1).clamp_min(0.0)


def kl_summary(ref: torch.Tensor, other: torch.Tensor, examples: list[Example],
               targets: torch.Tensor) -> dict[str, Any]:
    """Mean per-token KL(ref || other) over all / answer tokens, overall and per task."""
    kl = token_kl(ref, other)
    m = masks(examples, targets)
    tasks = sorted({e.task for e in examples})
    out: dict[str, Any] = {}
    for scope, mask in m.items():
        out[scope] = float(kl[mask].mean())
        out[f"{scope}_by_task"] = {}
        for t in tasks:
            rows = torch.tensor([e.task == t for e in examples])
            out[f"{scope}_by_task"][t] = float(kl[rows][mask[rows]].mean())
    return out


def exact_match(lp: torch.Tensor, examples: list[Example], targets: torch.Tensor
                ) -> dict[str, float]:
    """Exact match per task: the argmax at every answer position equals the gold f(x), given
    the gold line so far (teacher-forced; the inputs x are random, so they are not predicted)."""
    ok = (lp.argmax(-1) == targets) | ~masks(examples, targets)["answer"]
    per = ok.all(-1)
    out: dict[str, float] = {}
    for t in sorted({e.task for e in examples}):
        rows = torch.tensor([e.task == t for e in examples])
        out[t] = float(per[rows].float().mean())
    out["mean"] = float(sum(out.values()) / len(out))
    return out


def task_accuracy(model: Any, examples: list[Example]) -> dict[str, float]:
    """Exact match of a model on examples, per task and mean."""
    lp, targets = log_probs(model, examples)
    return exact_match(lp, examples, targets)


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint directory, as float32."""
    from safetensors.torch import load_file
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(f).items()})
    return out


def l2_deviation(full: dict[str, torch.Tensor], other: dict[str, torch.Tensor]
                 ) -> dict[str, float]:
    """||full - other||_2 over all tensors (float64 sums), and relative to ||full||_2."""
    diff = sum(float((full[k].double() - other[k].double()).pow(2).sum()) for k in full)
    norm = sum(float(full[k].double().pow(2).sum()) for k in full)
    return {"abs": diff ** 0.5, "rel": (diff / norm) ** 0.5}


def weight_errors(plan: dict[str, torch.Tensor], full: dict[str, torch.Tensor],
                  base: dict[str, torch.Tensor]) -> dict[str, float]:
    """How far a budgeted merge's weights lie from the full merge's, over the tensors the full
    merge changes: rel_l2 = ||M - M_full|| / ||M_full - B|| (one norm over all of them), and
    tensor_rel = the mean over tensors of ||M_t - M_full,t||^2 / ||M_full,t - B_t||^2 (each
    tensor's update weighing the same: the scale-free objective of tensor_energy)."""
    err = upd = 0.0
    shares = []
    for k, m in full.items():
        u = float((m.double() - base[k].double()).pow(2).sum()) if k in base else 0.0
        if u == 0.0:
            continue
        e = float((plan[k].double() - m.double()).pow(2).sum())
        err, upd = err + e, upd + u
        shares.append(e / u)
    return {"rel_l2": (err / upd) ** 0.5 if upd else 0.0,
            "tensor_rel": sum(shares) / len(shares) if shares else 0.0}


def additive_reference(base: dict[str, torch.Tensor], experts: list[dict[str, torch.Tensor]],
                       coefficients: list[float]) -> dict[str, torch.Tensor]:
    """M = B + sum_i alpha_i (E_i - B) in float32, straight from the checkpoints (no engine)."""
    out = {}
    for k, b in base.items():
        m = b.clone()
        for e, a in zip(experts, coefficients, strict=True):
            m += a * (e[k] - b)
        out[k] = m
    return out


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| over all tensors (same names and shapes)."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)
