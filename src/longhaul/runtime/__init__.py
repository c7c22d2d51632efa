"""Drivers that compose rollouts, scoring and the trainer into a run: the synchronous on-policy
loop (`sync`: grpo, ppo, onpolicy_distill) and the offline loop (`offline`: sft, rm, dpo,
distill), each in this process or, with `runtime.trainer_actor` on Ray, in a trainer actor."""


def train(cfg, resume: bool = False) -> dict:
    """Run the algorithm `cfg.algo.name` picks, from scratch or from the run's latest checkpoint."""
    from longhaul.runtime.offline import OFFLINE, run_offline
    from longhaul.runtime.sync import run_training

    if cfg.runtime.trainer_actor:
        from longhaul.errors import LonghaulError
        from longhaul.runtime.ray_backend import train_in_actor

        if cfg.runtime.backend != "ray":
            raise LonghaulError("runtime.trainer_actor=true needs runtime.backend=ray (an actor is a Ray process); set both or neither")
        return train_in_actor(cfg, resume)
    return (run_offline if cfg.algo.name in OFFLINE else run_training)(cfg, resume)
