-- One calibration run of a base (catalog.calibrations).
INSERT INTO calibrations (calibration_id, model, text_sha256, tokens, fallback_rms,
                          fallback_fisher)
VALUES (:calibration_id, :model, :text_sha256, :tokens, :fallback_rms, :fallback_fisher)
