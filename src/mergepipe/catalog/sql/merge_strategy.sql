-- How a planned merge is computed: its strategy and the merge it reuses (incremental).
UPDATE merges SET strategy = :strategy, previous_merge = :previous_merge
WHERE merge_id = :merge_id
