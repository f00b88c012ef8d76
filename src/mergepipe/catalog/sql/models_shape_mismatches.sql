-- The tensors of the experts named in a list (LoRA adapters left out: their lora_B has its own
-- shape) whose shape differs from the base's tensor of that name, each expert's in checkpoint
-- order: usually none (catalog.models.shape_mismatches).
SELECT e.model, e.tensor, e.shape, b.shape AS base_shape
FROM tensors e
JOIN models m ON m.name = e.model
JOIN tensors b ON b.model = :base AND b.tensor = e.tensor
WHERE list_contains(CAST(:experts AS VARCHAR[]), e.model) AND m.kind <> 'lora'
  AND e.shape <> b.shape
ORDER BY e.model, e.ordinal
