-- The access set a dead run of this merge recorded (recorded again when the plan is remade).
DELETE FROM touched_blocks WHERE merge_id = :merge_id
