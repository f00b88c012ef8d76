"""The algebra of an incremental merge: M_new - B = c * (M_old - B) + sum_i a_i * T_i, exactly.

For an operator whose M - B is a fixed-coefficient sum of per-expert terms (`spec.not_incremental
is None`: linear, task_arithmetic, dare_linear), a stored merge M_old of the same base and
operator is one more "expert" of the new merge, with coefficient c; the experts whose
coefficient is not c times their old one (added, dropped, reweighted) are the only others read.
T_i is D_i (dare_linear: D_i after its keyed drop, which depends on the seed, the model's name,
the tensor and the density only, so it is the same term in both merges).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mergepipe.core.request import ExpertSpec, MergeRequest, build_request

REL_TOL = 1e-9  # coefficients this close (relative) count as equal: far below float32's 6e-8


@dataclass(frozen=True)
class Previous:
    """A stored succeeded merge whose output is registered, ready, as an expert of the base."""

    merge_id: str
    model: str                     # its output's model name
    request: MergeRequest
    omission_bound: float | None   # its recorded bound (an incremental one includes its carry)
    omission_bound_l2: float | None
    budgeted: bool                 # it read fewer bytes than its full read
    dtype: str                     # its output's dtype (F32 | F16 | BF16 | mixed)
    chain_depth: int               # 0: made from scratch; n: n increments deep


@dataclass(frozen=True)
class Change:
    """One term of the increment besides M_old: an expert added, dropped or reweighted."""

    model: str
    change: str          # added | dropped | reweighted
    coefficient: float   # a_i
    density: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "change": self.change, "coefficient": self.coefficient,
                "density": self.density}


@dataclass(frozen=True)
class Increment:
    """M_new - B = c * (M_old - B) + sum over `changes` of a_i * T_i."""

    previous: Previous
    c: float
    changes: tuple[Change, ...]


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= REL_TOL * max(abs(x), abs(y))


def _terms(req: MergeRequest) -> dict[str, tuple[float, float | None]]:
    """model -> (alpha_i, density or None)."""
    dens: Sequence[float | None] = (req.densities() if req.spec.density
                                    else [None] * len(req.experts))
    return {e.model: (a, d) for e, a, d in zip(req.experts, req.coefficients(), dens, strict=True)}


def _common_ratio(pairs: list[tuple[float, float]]) -> float | None:
    """The ratio new/old shared by the most experts (None: no expert had a coefficient)."""
    ratios = [new / old for old, new in pairs if old != 0.0]
    best, best_n = None, 0
    for r in ratios:
        n = sum(1 for q in ratios if _close(q, r))
        if n > best_n:
            best, best_n = r, n
    return best


def _same_terms(old: MergeRequest, new: MergeRequest) -> bool:
    """Each expert's term T_i is the same function in both merges: same operator and params
    other than normalize and lambda (which the coefficients carry) and the planner's utility,
    same seed for keyed drops."""
    if old.operator != new.operator or old.base != new.base:
        return False
    strip = ("normalize", "lambda", "density", "utility")  # utility ranks blocks, no more
    if ({k: v for k, v in old.params.items() if k not in strip}
            != {k: v for k, v in new.params.items() if k not in strip}):
        return False
    return not new.spec.density or old.seed == new.seed


def find_increment(prev: Previous, new: MergeRequest) -> Increment | None:
    """The increment from `prev` to `new`, or None when `new` is not an increment of it (other
    terms, nothing in common, an expert's density changed, or nothing changed at all)."""
    old = prev.request
    if not _same_terms(old, new) or prev.model in {e.model for e in new.experts}:
        return None
    a_old, a_new = _terms(old), _terms(new)
    common = [m for m in a_new if m in a_old]
    if any(a_old[m][1] != a_new[m][1] for m in common):
        return None  # a keyed drop at another density is another term
    c = _common_ratio([(a_old[m][0], a_new[m][0]) for m in common])
    if c is None or c == 0.0:
        return None
    changes = []
    for m, (alpha, dens) in a_new.items():
        if m not in a_old:
            changes.append(Change(m, "added", alpha, dens))
        elif not _close(alpha, c * a_old[m][0]):
            changes.append(Change(m, "reweighted", alpha - c * a_old[m][0], dens))
    changes += [Change(m, "dropped", -c * alpha, dens)
                for m, (alpha, dens) in a_old.items() if m not in a_new and alpha != 0.0]
    if not changes and _close(c, 1.0):
        return None  # the same merge: its output is already there
    return Increment(prev, c, tuple(changes))


def increment_request(new: MergeRequest, inc: Increment, budget_bytes: int) -> MergeRequest:
    """The request the executor runs: the same operator, unnormalized with lambda 1, over M_old
    (weight c; density 1: no drop) and the changes (weight a_i, their density), under the byte
    budget the scratch plan resolved."""
    sparse = new.spec.density
    experts = [ExpertSpec(inc.previous.model, inc.c, 1.0 if sparse else None)]
    experts += [ExpertSpec(ch.model, ch.coefficient, ch.density) for ch in inc.changes]
    params = {k: v for k, v in new.params.items() if k != "density"}
    params.update(normalize=False)
    params["lambda"] = 1.0
    return build_request(base=new.base, experts=experts, operator=new.operator, params=params,
                         budget={"bytes": max(budget_bytes, 1)}, seed=new.seed,
                         output_dtype=new.output_dtype)


def carried_bounds(inc: Increment, bound: float | None, bound_l2: float | None
                   ) -> tuple[float | None, float | None]:
    """The new plan's omission bounds: its own plus |c| times M_old's (triangle inequality:
    M_old's omitted update enters the new merge scaled by c)."""
    prev = inc.previous
    old = prev.omission_bound if prev.omission_bound is not None else (
        None if prev.budgeted else 0.0)
    if bound is None or old is None:
        return None, None
    old_l2 = prev.omission_bound_l2 if prev.omission_bound_l2 is not None else old
    total = bound + abs(inc.c) * old
    l2 = None if bound_l2 is None else min(bound_l2 + abs(inc.c) * old_l2, total)
    return total, l2


# Float32 roundings of one entry of a fixed-coefficient merge of n terms (the fused kernel and the
# torch kernels alike): per term the weight's conversion, the delta, the product (a keyed drop's
# rescale one more), n - 1 sums; the divisor and lambda, each converted and applied; the base
# added. n + 9 covers them all (docs/incremental.md).
ROUNDINGS_PER_MERGE = 9


def entry_bound(inc: Increment, request: MergeRequest, executed: MergeRequest,
                out_dtype: str) -> dict[str, Any]:
    """The parameters of the per-entry bound of |incremental - scratch| (docs/incremental.md):
    c, the stored merge's and the output's dtypes, the float32 roundings of each computation
    and the coefficients' tolerance."""
    return {"c": inc.c, "previous_dtype": inc.previous.dtype, "output_dtype": out_dtype,
            "scratch_roundings": len(request.experts) + ROUNDINGS_PER_MERGE,
            "incremental_roundings": len(executed.experts) + ROUNDINGS_PER_MERGE,
            "coefficient_tolerance": 2 * REL_TOL, "chain_depth": inc.previous.chain_depth + 1}


def rounding_note(inc: Increment, out_dtype: str) -> str:
    """The per-entry bound of |incremental - scratch| from M_old's rounding (docs/incremental.md)."""
    return (f"per entry e: |M - M_scratch| <= {abs(inc.c):.6g} * (ulp_{inc.previous.dtype}"
            f"(M_old[e]) / 2 + M_old's own float32 error) + ulp_{out_dtype}(M[e]) + float32 "
            "sums: in ulps of the output, unbounded where it nearly cancels"
            + (f"; {inc.previous.chain_depth} earlier increments add their own"
               if inc.previous.chain_depth else ""))
