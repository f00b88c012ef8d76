UPDATE merges
SET plan_hash = :plan_hash, plan = :plan, budget_bytes = :budget_bytes,
    full_read_bytes = :full_read_bytes, planned_expert_bytes = :planned_expert_bytes,
    omission_bound = :omission_bound, blocks_total = :blocks_total, blocks_done = 0,
    plan_seconds = :plan_seconds
WHERE merge_id = :merge_id
