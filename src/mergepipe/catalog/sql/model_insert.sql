-- Register a model (ingestion's write phase).
INSERT INTO models (name, kind, path, base, status, error, has_stats, block_bytes, n_tensors,
                    tensor_bytes, lora_scale, source_merge, ingest_seconds, delta_rel_norm,
                    delta_rel_norm_max)
VALUES (:name, :kind, :path, :base, :status, :error, :has_stats, :block_bytes, :n_tensors,
        :tensor_bytes, :lora_scale, :source_merge, :ingest_seconds, :delta_rel_norm,
        :delta_rel_norm_max)
