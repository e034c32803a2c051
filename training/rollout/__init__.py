"""Playing policies in envs as trees: the collector (local), Ray workers, the simulation env, evaluation.
Torch-free: nothing here imports torch."""
