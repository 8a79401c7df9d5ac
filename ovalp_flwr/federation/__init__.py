"""What both paths share on Flower: messages, set-up exchanges, strategy, evaluation, validation, checkpoints, results."""
