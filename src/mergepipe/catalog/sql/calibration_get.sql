-- One calibration by id.
SELECT calibration_id, model, text_sha256, tokens, fallback_rms, fallback_fisher, created_at
FROM calibrations WHERE calibration_id = :calibration_id
