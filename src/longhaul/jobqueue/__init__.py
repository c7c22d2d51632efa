"""The job queue on a Ray cluster: `longhaul submit` runs of many domains at their priorities,
the placer (`longhaul.placement`) decides where each starts, and the queue service starts,
watches and pre-empts them (`service.py`), with its books in SQLite (`store.py`) and each run's
process in an actor on its node (`runner.py`). See docs/scaleout.md."""
