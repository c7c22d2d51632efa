"""Where a run's training tasks come from: one family's tasks in order, or the multi-domain
task scheduler (`runtime.domains`), behind one small interface the controller uses.

    source.take(n)         -> [(domain or None, task)]   the next n tasks, each trained as one group
    source.record(groups)  feed the step's finished groups back (curriculum, budgets, metrics)
    source.metrics()       per-step metrics (per domain for a joint run)
    source.find(domain, task_id) -> task                 a task by id (a resumed run's requests)
    source.state_dict() / load_state_dict(state)          continue the same draws after a resume

Not owned here: what a domain is, how shares and curricula work (`runtime.domains`).
"""

from __future__ import annotations

from longhaul.errors import LonghaulError
from longhaul.runtime.domains import Outcome


class TaskStream:
    """A fixed list of tasks (one family), handed out in order; its state is the cursor."""

    def __init__(self, tasks: list, cursor: int = 0):
        self.tasks, self.cursor = tasks, cursor
        self._by_id = {t.task_id: t for t in tasks}

    def take(self, n: int) -> list[tuple[str | None, object]]:
        out = self.tasks[self.cursor:self.cursor + n]
        self.cursor += len(out)
        return [(None, t) for t in out]

    def record(self, groups: list) -> None:
        pass

    def metrics(self) -> dict:
        return {}

    def find(self, domain: str | None, task_id: str):
        if task_id not in self._by_id:
            raise LonghaulError(f"the replay log names task {task_id!r}, which this run's task list lacks; resume with the same config")
        return self._by_id[task_id]

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = int(state["cursor"])


class ScheduledTasks:
    """The multi-domain scheduler as a task source: draws by weight, priority, budget and curriculum."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def take(self, n: int) -> list[tuple[str | None, object]]:
        return [(d.domain, d.task) for d in self.scheduler.next_tasks(n)]

    def record(self, groups: list) -> None:

        outcomes = []
        for group in groups:
            for t in group:
                tokens = sum(len(turn.prompt_ids) + len(turn.completion_ids) for turn in t.turns)
                outcomes.append(Outcome(t.info["domain"], t.info["task_id"], float(t.info.get("raw_reward", t.reward)),
                                        bool(t.info.get("passed", False)), tokens, float(t.info.get("wall_s", 0.0)),
                                        t.info.get("ended") == "infra_error", bool(t.info.get("guided", False))))
        self.scheduler.record(outcomes)

    def metrics(self) -> dict:
        return self.scheduler.metrics()

    def find(self, domain: str | None, task_id: str):
        for t in self.scheduler.domain(domain).tasks:
            if t.task_id == task_id:
                return t
        raise LonghaulError(f"the replay log names task {task_id!r} of domain {domain!r}, which its pool lacks; resume with the same config")

    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
