"""A run from start to results, both paths: `pipeline.run` and the hooks a path fills in
(`RunPath`). Above `federation` and `personalize`, below the paths (`ova`, `finetune`)."""
