"""Running registered models (transformers, CPU): what a merge does to a model's predictions.
transformers is the optional extra `eval`, imported only when a model runs."""
