"""The cluster simulator that measures `longhaul.placement`'s placer: a synthetic workload
(`workload`), the discrete-event simulation (`cluster_sim`) and the fairness measure's
building blocks (`fairness`). Used by benchmarks/scheduler_sim.py and the tests."""
