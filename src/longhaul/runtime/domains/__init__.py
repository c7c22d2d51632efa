"""Joint multi-domain training: the domains of a run (`domains`), their curricula
(`curriculum`), task queues and fair sharing (`queues`), the task scheduler the training loop
calls (`scheduler`) and per-domain metrics (`metrics`). Placing work on a cluster is
`longhaul.placement`'s. See docs/scheduling.md."""

from longhaul.runtime.domains.domains import Domain, DomainConfig, RolloutLimits, SchedulingConfig, build_domains
from longhaul.runtime.domains.scheduler import Draw, Outcome, TaskScheduler

__all__ = ["Domain", "DomainConfig", "Draw", "Outcome", "RolloutLimits", "SchedulingConfig", "TaskScheduler", "build_domains"]
