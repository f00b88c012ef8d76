"""How a model stores its weights (a light module: the CLI's parser reads it at start-up)."""

KINDS = ("full", "delta", "lora")
