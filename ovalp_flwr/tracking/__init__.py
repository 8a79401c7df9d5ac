"""Experiment tracking: a run's config, its rounds and its files logged to MLflow from the
ServerApp (`tracking = "mlflow"`), off the round loop (`tracker.py`); its options
(`options.py`). No client needs it; nothing here imports MLflow until a run asks for it."""
