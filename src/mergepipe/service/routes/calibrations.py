"""POST /v1/calibrations: run a registered base over a calibration text and store its
input-channel RMS (mergepipe.evaluation.calibration), for utility=activation plans."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from mergepipe.evaluation.calibration import calibrate
from mergepipe.service.schemas import CalibrationIn, CalibrationOut
from mergepipe.service.state import State

router = APIRouter(prefix="/v1", tags=["calibrations"])


@router.post("/calibrations", status_code=201, response_model=CalibrationOut,
             summary="Measure a base's input-channel RMS on a text (for utility=activation)")
def create(body: CalibrationIn, st: State) -> dict[str, Any]:
    # synchronous: runs the model on CPU in the request's worker thread (a few seconds for
    # small models and the default 2048 tokens)
    return calibrate(st.cat, body.base, body.text, body.tokens).to_dict()
