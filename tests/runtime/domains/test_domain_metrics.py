"""Per-domain metrics through a run's metrics.jsonl into the HTML domain report."""

import random

from longhaul.runtime.domains import Outcome, TaskScheduler
from longhaul.eval.domain_report import domain_names, domain_report, write_domain_report
from longhaul.runtime.metrics import MetricsLog, read_metrics
from tests.runtime.domains.domain_helpers import synthetic


def test_metrics_rows_render_as_a_domain_report(tmp_path):
    sched = TaskScheduler([synthetic("alpha", 16, weight=1.0), synthetic("beta", 16, weight=3.0)], seed=0)
    rng = random.Random(0)
    log = MetricsLog(tmp_path)
    for step in range(1, 6):
        draws = sched.next_tasks(4)
        sched.record(Outcome(d.domain, d.task.task_id, 1.0, rng.random() < 0.5, tokens=5, sandbox_s=0.25) for d in draws)
        log.write(step, {"reward": 0.5, **sched.metrics()})
    log.close()
    rows = read_metrics(tmp_path)
    assert domain_names(rows) == ["alpha", "beta"]
    assert [r["domain/beta/share"] for r in rows] == [0.75] * 5  # stride mixing: exact every step of 4
    page = domain_report(rows)
    assert page.count("<svg") == 3 and "<td>alpha</td><td>5</td>" in page and "<td>beta</td><td>15</td>" in page
    out = write_domain_report(tmp_path, rows, "run x")
    assert out.name == "domains.html" and out.read_text().count("<svg") == 3
    assert domain_report([{"step": 1, "reward": 0.1}]) == "" and write_domain_report(tmp_path, [{"step": 1}]) is None
