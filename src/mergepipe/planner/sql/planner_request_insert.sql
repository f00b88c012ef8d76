INSERT INTO planner_request (position, model, rank_weight, trim_j, has_stats, per_tensor)
VALUES (:position, :model, :rank_weight, :trim_j, :has_stats, :per_tensor)
