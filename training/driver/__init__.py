"""The training run: typed configs, building a run's parts, the trainer loop, checkpoints, the warm start,
progress and the metrics log."""
