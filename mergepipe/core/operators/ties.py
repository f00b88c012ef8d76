"""ties: magnitude trim from the catalog threshold, sign election, disjoint (normalized) sum."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mergepipe.core.operators.base import read_experts
from mergepipe.core.operators.spec import MergekitMethod, OperatorSpec

if TYPE_CHECKING:  # torch loads with the first merge, not with a request's validation
    import torch

    from mergepipe.core.operators.base import BlockContext, ExpertBlock


def ties(base: torch.Tensor, experts: list[ExpertBlock], ctx: BlockContext) -> torch.Tensor:
    """TIES-merging; entries tied at the trim threshold are kept by the keyed rule."""
    from mergepipe.core.operators import mergekit_arith as mk

    if mk.uses_mergekit_arith(ctx):
        return mk.gta(base, experts, ctx, sparsify=mk.magnitude_mask, consensus=True,
                      normalize_default=True)
    import torch

    from mergepipe.core.operators.sparsify import (
        elect_into,
        finish_into,
        scale_,
        scratch,
        trimmed_into,
    )

    read = [e for e in read_experts(experts) if e.delta is not None]
    if not read:
        return base.clone()
    trimmed = []
    for j, e in enumerate(read):
        assert e.delta is not None
        w = trimmed_into(e.delta, e.trim, e.key, ctx.flat_offset, scratch.like(("w", j), base))
        trimmed.append(scale_(w, e.weight))
    out = torch.empty_like(base)
    divisor = scratch.like("divisor", base) if ctx.normalize(True) else None
    elect_into(trimmed, [e.weight for e in read], out, divisor)
    return finish_into(out, base, ctx.lam, divisor)


SPEC = OperatorSpec(
    name="ties", title="TIES",
    formula="M = B + lambda * disjoint_mean_i(w_i trim(D_i, density_i))",
    kernel=ties, normalize_default=True, additive=False, density=True, trim=True,
    # (expert, block) units: on both fidelity families they kept TIES closer to the full merge
    # than coherent groups (docs/FIDELITY.md, "Planning units"); unit=group opts in. Ranked
    # per tensor: the only ranking that beat random plans of equal bytes on both families
    default_utility="per_tensor",
    not_incremental=("TIES trims each expert at its own magnitude threshold and elects each "
                     "entry's sign over all experts together: one expert more can flip signs "
                     "everywhere"),
    mergekit=MergekitMethod("ties", params={"normalize": "normalize", "lambda": "lambda",
                                            "rescale": None}),
)
