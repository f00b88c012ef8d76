-- The channel RMS vectors of one calibration, by tensor name.
SELECT tensor, rms, group_ms FROM calibration_rms
WHERE calibration_id = :calibration_id ORDER BY tensor
