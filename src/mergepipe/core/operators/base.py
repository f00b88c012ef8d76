"""The kernel contract: what a block operator receives and returns (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class Trim(Protocol):
    """TIES trim threshold of one expert tensor (planner.plan.TrimThreshold satisfies it)."""

    @property
    def tau(self) -> float: ...  # k-th largest |delta| of the tensor
    @property
    def above(self) -> int: ...  # count of |delta| > tau
    @property
    def tied(self) -> int: ...  # count of |delta| == tau
    @property
    def k(self) -> int: ...  # int(density * numel): entries to keep


@dataclass(frozen=True)
class ExpertBlock:
    """One expert's view of the block being merged; `delta` None means the block was not read."""

    index: int  # position of the expert in the request
    model: str
    delta: torch.Tensor | None  # float32 delta of this block, None = not read
    weight: float
    density: float
    trim: Trim | None  # TIES trim of this expert's tensor (ties only)
    key: int  # keyed_hash.expert_key(seed, model, tensor)
    # the expert's own block as float32 (full experts under mergekit arithmetic), else None
    value: torch.Tensor | None = None


@dataclass(frozen=True)
class ReadExpert(ExpertBlock):
    """An expert whose block was read: what `read_experts` gives the kernels."""

    delta: torch.Tensor


@dataclass(frozen=True)
class BlockContext:
    """Where the block sits and the request's global parameters."""

    tensor: str
    block_index: int
    flat_offset: int  # flat index (within the tensor) of the block's first element
    params: dict[str, Any] = field(default_factory=dict)  # normalize, lambda, rescale, renormalize
    all_weights: tuple[float, ...] = ()  # weights of all experts of the request
    input_dtype: str = "float32"  # the inputs' promoted dtype (torch name) for compute "files"
    whole_tensor: bool = False  # the block is the whole tensor (executor.torch_path joined it)

    @property
    def lam(self) -> float:
        """The global scale `lambda` (default 1.0)."""
        return float(self.params.get("lambda", 1.0))

    def normalize(self, default: bool) -> bool:
        """The `normalize` parameter, or the operator's default when the request left it out."""
        return bool(self.params.get("normalize", default))


# DARE's rescale of the kept entries (sparsify.dropped_into): by density, to the L1 norm, or none
RESCALES = ("density", "l1", "none")
Operator = Callable[["torch.Tensor", list[ExpertBlock], BlockContext], "torch.Tensor"]


def as_read(e: ExpertBlock) -> ReadExpert | None:
    """The expert as read (its delta never None), or None when its block was not read: with
    `read_experts`, the one place a kernel learns which experts were read."""
    if isinstance(e, ReadExpert):
        return e
    if e.delta is None:
        return None
    return ReadExpert(e.index, e.model, e.delta, e.weight, e.density, e.trim, e.key, e.value)


def read_experts(experts: list[ExpertBlock]) -> list[ReadExpert]:
    """The experts whose block was read, in request order (omitted ones add nothing)."""
    return [r for r in map(as_read, experts) if r is not None]
