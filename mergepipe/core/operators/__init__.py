"""Pure block operators (no I/O), one module each, collected in REGISTRY by request name."""

from __future__ import annotations

from mergepipe.core.operators.base import BlockContext, ExpertBlock, Operator
from mergepipe.core.operators.dare_linear import dare_linear
from mergepipe.core.operators.dare_ties import dare_ties
from mergepipe.core.operators.linear import linear
from mergepipe.core.operators.task_arithmetic import task_arithmetic
from mergepipe.core.operators.ties import ties

REGISTRY: dict[str, Operator] = {
    "linear": linear,
    "task_arithmetic": task_arithmetic,
    "ties": ties,
    "dare_linear": dare_linear,
    "dare_ties": dare_ties,
}

__all__ = ["REGISTRY", "BlockContext", "ExpertBlock", "Operator"]
