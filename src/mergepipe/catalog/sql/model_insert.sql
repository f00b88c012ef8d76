-- Register a model version (ingestion's write phase): `name` keys the version, `family` is the
-- name users give (docs/lifecycle.md).
INSERT INTO models (name, kind, path, base, status, error, has_stats, block_bytes, n_tensors,
                    tensor_bytes, lora_scale, source_merge, ingest_seconds, family, version,
                    delta_rel_norm, delta_rel_norm_max)
VALUES (:name, :kind, :path, :base, :status, :error, :has_stats, :block_bytes, :n_tensors,
        :tensor_bytes, :lora_scale, :source_merge, :ingest_seconds, :family, :version,
        :delta_rel_norm, :delta_rel_norm_max)
