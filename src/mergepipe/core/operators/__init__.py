"""Merge operators: one module each declaring its OperatorSpec, registered here by name."""

from __future__ import annotations

from mergepipe.core.operators import (
    arcee_fusion,
    breadcrumbs,
    breadcrumbs_ties,
    dare_linear,
    dare_ties,
    della,
    della_linear,
    karcher,
    linear,
    model_stock,
    multislerp,
    nearswap,
    nuslerp,
    ram,
    ramplus_tl,
    sce,
    slerp,
    task_arithmetic,
    ties,
)
from mergepipe.core.operators.base import BlockContext, ExpertBlock, Operator
from mergepipe.core.operators.registry import (
    REGISTRY,
    get_operator,
    mergekit_methods,
    register,
    unregister,
)
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec, Param

register(linear.SPEC)
register(task_arithmetic.SPEC)
register(ties.SPEC)
register(dare_linear.SPEC)
register(dare_ties.SPEC)
register(breadcrumbs.SPEC)
register(breadcrumbs_ties.SPEC)
register(della.SPEC)
register(della_linear.SPEC)
register(slerp.SPEC)
register(nuslerp.SPEC)
register(model_stock.SPEC)
register(multislerp.SPEC)
register(karcher.SPEC)
register(nearswap.SPEC)
register(sce.SPEC)
register(ram.SPEC)
register(ramplus_tl.SPEC)
register(arcee_fusion.SPEC)

__all__ = ["REGISTRY", "BlockContext", "ExpertBlock", "MergekitMethod", "Operator",
           "OperatorSpec", "Param", "get_operator", "mergekit_methods", "register", "unregister"]
