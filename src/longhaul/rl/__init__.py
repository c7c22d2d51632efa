"""Reinforcement learning: advantage estimators and policy losses (pure tensor functions
registered by name), the GRPO trainer, and checkpoints. Never imports `longhaul.inference`."""
