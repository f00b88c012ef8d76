-- The channel RMS of every linear weight of one calibration; every parameter except the id is
-- a list (rms, group_ms: lists of lists).
INSERT INTO calibration_rms (calibration_id, tensor, rms, group_ms)
SELECT :calibration_id, unnest(:tensor), unnest(:rms), unnest(:group_ms)
