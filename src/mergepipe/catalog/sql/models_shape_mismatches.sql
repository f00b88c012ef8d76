-- The tensors of the experts named in a list (LoRA adapters left out: their lora_B has its own
-- shape) whose shape differs from the base's tensor of that name, each expert's in checkpoint
-- order: usually none (catalog.models.shape_mismatches). The LoRA filter as NOT IN: a join to
-- the models costs DuckDB twice as much here.
SELECT e.model, e.tensor, e.shape, b.shape AS base_shape
FROM tensors e
JOIN tensors b ON b.model = :base AND b.tensor = e.tensor
WHERE list_contains(CAST(:experts AS VARCHAR[]), e.model) AND e.shape <> b.shape
  AND e.model NOT IN (SELECT name FROM models WHERE kind = 'lora')
ORDER BY e.model, e.ordinal
