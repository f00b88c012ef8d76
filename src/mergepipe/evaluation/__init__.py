"""Running registered models (transformers, CPU): what a merge does to a model's predictions
(compare), and a base's activations for calibration-aware planning (calibrate). transformers is
the optional extra `eval`, imported only when a model runs."""
