-- 0009: how far an expert lies from its claimed base (docs/catalog.md). tensors.value_l2: the L2
-- norm of a base tensor's values (NULL: experts, and bases ingested before this migration).
-- models.delta_rel_norm: an expert's ||E - B|| / ||B|| over the tensors it has (its delta's L2
-- from its statistics over the base's norm there); delta_rel_norm_max: the largest ratio of
-- one tensor (tensors whose base norm is zero left out). NULL: a base, an expert without
-- statistics, or one of a base without norms. ingest_jobs.force_base: ingest even when the
-- ratio is above the limit a fine-tune stays under.

ALTER TABLE tensors ADD COLUMN value_l2 DOUBLE;
ALTER TABLE models ADD COLUMN delta_rel_norm DOUBLE;
ALTER TABLE models ADD COLUMN delta_rel_norm_max DOUBLE;
ALTER TABLE ingest_jobs ADD COLUMN force_base BOOLEAN NOT NULL DEFAULT FALSE;
