"""Joint multi-domain training: domains and their task queues (`scheduler`), and placing the
work of many domains on a cluster (`cluster`, `placement`, `placer`, `ray_mapping`), with a
discrete-event simulator to measure it (`cluster_sim`). See docs/scheduling.md."""

from longhaul.runtime.scheduling.domains import Domain, DomainConfig, RolloutLimits, SchedulingConfig, build_domains
from longhaul.runtime.scheduling.scheduler import Draw, Outcome, TaskScheduler

__all__ = ["Domain", "DomainConfig", "Draw", "Outcome", "RolloutLimits", "SchedulingConfig", "TaskScheduler", "build_domains"]
