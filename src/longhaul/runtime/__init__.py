"""Drivers that compose rollouts, scoring and the trainer into a run: the online loop (`online`:
grpo, ppo, onpolicy_distill; sync or async) and the offline loop (`offline`: sft, rm, dpo,
distill), each in this process or, with `runtime.trainer_actor` on Ray, in a trainer actor.
`algorithms` names every algorithm and its driver; `setup` prepares a run and evaluates held-out
tasks for both drivers and for `longhaul eval`."""

from longhaul.errors import LonghaulError


def train(cfg, resume: bool = False) -> dict:
    """Run the algorithm `cfg.algo.name` picks, from scratch or from the run's latest checkpoint."""
    # the drivers are imported here, not above: importing any `longhaul.runtime.*` module runs this
    # file first, and the drivers import most of the package (the trainer actor calls `train` back)
    from longhaul.runtime.algorithms import ALGORITHMS
    from longhaul.runtime.offline import run_offline
    from longhaul.runtime.online import run_training

    if cfg.runtime.trainer_actor:
        from longhaul.runtime.ray_backend import train_in_actor

        if cfg.runtime.backend != "ray":
            raise LonghaulError("runtime.trainer_actor=true needs runtime.backend=ray (an actor is a Ray process); set both or neither")
        return train_in_actor(cfg, resume)
    return (run_offline if ALGORITHMS.get_fn(cfg.algo.name).driver == "offline" else run_training)(cfg, resume)
