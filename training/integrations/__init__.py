"""Adapters to other trainers that need the trained model and the collector (torch): TRL's ``rollout_func``."""
