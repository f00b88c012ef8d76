-- The Fisher diagonal of one calibration per block of the base's grid; every parameter except
-- the id is a list (fisher: a list of lists).
INSERT INTO calibration_blocks (calibration_id, tensor, block_index, fisher)
SELECT :calibration_id, unnest(:tensor), unnest(:block_index), unnest(:fisher)
