"""`eagle3 pipeline`: the whole DraftTraining pipeline on one machine (presets, config, runner, report)."""
