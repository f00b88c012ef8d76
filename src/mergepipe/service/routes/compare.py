"""POST /v1/compare: KL(A || B) and perplexities of two registered models on a text, while the
client waits: at most MAX_COMPARE_TOKENS tokens, one comparison at a time (else 429)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter

from mergepipe.core.errors import Busy
from mergepipe.evaluation.compare import compare as run_compare
from mergepipe.service.schemas import CompareIn, CompareOut
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["compare"])
_ONE_AT_A_TIME = threading.Lock()


@router.post("/compare", response_model=CompareOut,
             summary="Teacher-forced KL(A || B) per token and perplexities on a text")
def compare(body: CompareIn, st: State) -> dict[str, Any]:
    if not _ONE_AT_A_TIME.acquire(blocking=False):
        raise Busy("a comparison is running on this server; retry when it ends",
                   field="model_a")
    try:
        return run_compare(st.cat, body.model_a, body.model_b, body.text, tokens=body.tokens,
                           tokenizer=body.tokenizer).to_dict()
    finally:
        _ONE_AT_A_TIME.release()
