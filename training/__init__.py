"""TRACE training (installed as ``trace_gym.training``): the success predictor, root and prefix allocation with
its baselines, tree rollout collection, tree-aware advantages, the clipped policy-gradient loss, the trainer
and its command-line driver."""
