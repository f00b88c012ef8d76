-- The Fisher diagonal of one calibration, per block of the base's grid.
SELECT tensor, block_index, fisher FROM calibration_blocks
WHERE calibration_id = :calibration_id ORDER BY tensor, block_index
