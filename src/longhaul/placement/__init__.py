"""Placing the work of many domains on a cluster: the cluster model and its ledger (`cluster`),
jobs, work units and node-choice policies (`placement`), the placer (`placer`, composing its
parts over one shared state, `state`: `books`, `holds`, `preemption` and `handover`), its
estimates (`usage`, `entitlement`) and the mapping onto Ray placement groups (`ray_mapping`).
The job queue (`longhaul.jobqueue`) runs it on a Ray cluster; the simulator that measures it is
`benchmarks/sim`. See docs/scheduling.md."""
