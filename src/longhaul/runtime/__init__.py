"""Drivers that compose rollouts, scoring and the trainer into a run: the synchronous on-policy
loop (`sync`: grpo, ppo, onpolicy_distill) and the offline loop (`offline`: sft, rm, dpo,
distill). The async/Ray runtime of a later issue joins them here."""


def train(cfg, resume: bool = False) -> dict:
    """Run the algorithm `cfg.algo.name` picks, from scratch or from the run's latest checkpoint."""
    from longhaul.runtime.offline import OFFLINE, run_offline
    from longhaul.runtime.sync import run_training

    return (run_offline if cfg.algo.name in OFFLINE else run_training)(cfg, resume)
