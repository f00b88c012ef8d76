-- The ranking score of each expert block with a nonzero delta under params.utility =
-- activation or fisher (planner.activation), made in one statement from column
-- lists (empty for other utilities).
CREATE OR REPLACE TEMP TABLE planner_activation AS
SELECT unnest(CAST(:position AS INTEGER[])) AS position,
       unnest(CAST(:tensor AS VARCHAR[])) AS tensor,
       unnest(CAST(:block_index AS INTEGER[])) AS block_index,
       unnest(CAST(:act AS DOUBLE[])) AS act
