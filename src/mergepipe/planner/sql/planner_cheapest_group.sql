-- The smallest budget that reads at least one expert byte when whole groups are planned
-- (planner_rank_group.sql): the cheapest group alone, its units' bytes plus lora_A once
-- per (expert, tensor) of the group, as planner_fill_pass_group.sql charges it. NULL: no group.
SELECT MIN(alone) FROM (
    SELECT group_rank, SUM(nbytes) + SUM(lora_a) AS alone
    FROM (
        SELECT group_rank, position, ordinal, SUM(nbytes) AS nbytes,
               MAX(lora_a_nbytes) AS lora_a
        FROM planner_candidates
        GROUP BY group_rank, position, ordinal
    ) AS per_tensor
    GROUP BY group_rank
) AS groups
