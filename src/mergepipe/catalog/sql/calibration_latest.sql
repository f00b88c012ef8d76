-- The newest calibration of a base model (ties: the larger id).
SELECT calibration_id, model, text_sha256, tokens, fallback_rms, fallback_fisher, created_at
FROM calibrations WHERE model = :model
ORDER BY created_at DESC, calibration_id DESC
LIMIT 1
