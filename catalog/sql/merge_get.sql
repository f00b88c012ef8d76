SELECT merge_id, status, operator, base, request, params, seed, plan_hash, plan, budget_bytes,
       full_read_bytes, planned_expert_bytes, expert_bytes_read, base_bytes_read, omission_bound,
       output_name, output_path, output_hash, blocks_done, blocks_total, plan_seconds,
       exec_seconds, error, created_at, finished_at
FROM merges
WHERE merge_id = :merge_id
