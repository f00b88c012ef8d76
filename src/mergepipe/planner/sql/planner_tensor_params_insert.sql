INSERT INTO planner_tensor_params (position, tensor, rank_weight, trim_j)
VALUES (:position, :tensor, :rank_weight, :trim_j)
