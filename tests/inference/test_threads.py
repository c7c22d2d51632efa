"""The thread governor, on a controlled clock: from the neighbours' CPU use it takes a thread
away and gives it back with a band between; where it cannot read that, it probes, keeps the
fastest count, backs off while the choice holds; it respects the caller's cap; and the engine's
outputs do not depend on the thread count it picks. `CpuLoad` reads /proc and cgroups."""

import subprocess
import sys
import time

import pytest
import torch

from longhaul.cpus import CpuLoad, _cgroup_usage_reader, proc_stat_busy
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.inference.threads import SectionThreads, ThreadGovernor
from longhaul.models import load_policy


class Machine:
    """Thread count, a clock, and a step cost per count that the test changes (contention)."""

    def __init__(self, threads=2, cost=None):
        self.threads, self.now, self.sets = threads, 0.0, 0
        self.cost = cost or {2: 1.0, 1: 1.6}

    def set(self, n):
        self.threads, self.sets = n, self.sets + 1

    def governor(self, **kw):
        kw.setdefault("load", None)  # time steps: the probing governor
        return ThreadGovernor(clock=lambda: self.now, set_threads=self.set, get_threads=lambda: self.threads, **kw)

    def steps(self, gov, n, shape=(8, 8)):
        used = []
        for _ in range(n):
            used.append(gov.begin(shape))
            self.now += self.cost[self.threads]
            gov.end()
        return used


def test_keeps_all_threads_alone_and_moves_to_one_under_contention():
    m = Machine()
    gov = m.governor(first_probe=2, min_interval=8, max_interval=64)
    m.steps(gov, 40)
    assert gov.choice == 2 and gov.switches == 0
    assert gov.interval > 8  # the choice held: probes come less often
    m.cost = {2: 5.0, 1: 1.7}  # a busy neighbour: two threads wait at every join
    used = m.steps(gov, 200)
    assert gov.choice == 1 and gov.switches == 1
    assert used[-100:].count(1) >= 90  # two-thread steps only while probing
    m.cost = {2: 1.0, 1: 1.6}  # the neighbour left
    m.steps(gov, 200)
    assert gov.choice == 2 and gov.switches == 2


def test_share_of_steps_spent_probing_is_small_while_the_choice_holds():
    m = Machine()
    gov = m.governor()
    used = m.steps(gov, 2000)
    assert used.count(1) / len(used) < 0.03  # probes at one thread: a few steps per few hundred


def test_a_probe_whose_batch_changes_is_dropped():
    m = Machine(cost={2: 1.0, 1: 3.0})
    gov = m.governor(first_probe=1)
    for k in range(12):  # every step a different shape: no probe completes, nothing is decided
        gov.begin((k, k))
        m.now += m.cost[m.threads]
        gov.end()
    assert gov.choice is None


def test_caller_cap_is_respected_and_given_back():
    m = Machine(threads=4, cost={4: 4.0, 2: 1.0, 1: 1.5})
    gov = m.governor(first_probe=1)
    m.steps(gov, 30)
    assert gov.choice == 2 and m.threads == 2  # probed 4, 2 and 1: kept 2
    gov.release()
    assert m.threads == 4  # generate() returns: the caller's count is back
    m.threads = 1  # the caller now allows one thread (e.g. a trainer took the other cores)
    assert set(m.steps(gov, 50)) == {1}


def test_switches_are_rare_not_per_step():
    m = Machine(cost={2: 5.0, 1: 1.0})
    gov = m.governor()
    m.steps(gov, 1000)
    assert m.sets < 40  # setting the count is costly: only probes and decisions change it


def test_engine_outputs_do_not_depend_on_the_thread_count():
    model, tok = load_policy("tiny-llama")
    prompts = [tok.encode(t) for t in ("hello there", "def fib(n):\n    return", "x" * 30)]
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=3)
    cap = torch.get_num_threads()
    fixed = LLMEngine(model, tokenizer=tok, num_kv_blocks=64, adaptive_threads=False)
    ref = fixed.generate(prompts, params)
    eng = LLMEngine(model, tokenizer=tok, num_kv_blocks=64)
    eng.threads = ThreadGovernor(probe_steps=1, first_probe=0, min_interval=1, max_interval=1, load=None)  # probe all the time
    try:
        torch.set_num_threads(2)
        got = eng.generate(prompts, params)
    finally:
        torch.set_num_threads(cap)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    worst = max(abs(a - b) for o, r in zip(got, ref) for a, b in zip(o.logprobs, r.logprobs))
    assert worst < 1e-5, f"max log-prob difference {worst:.3g}"


class Neighbours:
    """A CpuLoad on a fake clock: 2 CPUs, neighbours whose use the test sets (CPUs)."""

    def __init__(self):
        self.now = self.busy = 0.0
        self.use = 0.0
        self.load = CpuLoad(2, lambda: self.busy, own=lambda: 0.0, clock=lambda: self.now)

    def wait(self, seconds):
        self.now += seconds
        self.busy += self.use * seconds

    def run(self, gov, machine, seconds, step_s=0.01):
        used = []
        for _ in range(round(seconds / step_s)):
            used.append(gov.begin((1, 1)))
            machine.now += step_s
            self.now += step_s
            self.busy += self.use * step_s
            gov.end()
        return used


def test_sensed_governor_yields_a_thread_to_a_busy_neighbour_and_takes_it_back():
    m, nb = Machine(), Neighbours()
    gov = m.governor(load=nb.load)
    assert set(nb.run(gov, m, 2.0)) == {2}  # alone: every step at both threads, no probe at one
    nb.use = 0.7  # one busy process, getting its share beside our two threads
    used = nb.run(gov, m, 2.0)
    assert used[-150:] == [1] * 150 and used.count(2) <= 50  # within two windows at two threads, then one
    nb.use = 0.32  # within the band: no flapping either way
    assert set(nb.run(gov, m, 2.0)) == {1}
    nb.use = 0.05  # the neighbour left
    used = nb.run(gov, m, 2.0)
    assert used[-150:] == [2] * 150
    assert gov.switches == 2 and m.sets == 2


def test_a_new_governor_beside_a_busy_neighbour_runs_even_its_first_step_at_one_thread():
    m, nb = Machine(), Neighbours()
    nb.use = 1.0  # busy before the engine's first request
    waited = []
    gov = m.governor(load=nb.load, sleep=lambda s: (waited.append(s), nb.wait(s)))
    assert nb.run(gov, m, 1.0) == [1] * 100
    assert waited == [pytest.approx(0.05)]  # once, the first window
    m, alone = Machine(), Neighbours()
    waited.clear()
    gov = m.governor(load=alone.load, sleep=lambda s: (waited.append(s), alone.wait(s)))
    alone.wait(1.0)  # an engine made a while before its first request: nothing to wait for
    assert set(alone.run(gov, m, 1.0)) == {2} and waited == [0.0]


def test_sensed_governor_keeps_under_the_callers_cap():
    m, nb = Machine(threads=1), Neighbours()
    gov = m.governor(load=nb.load)
    assert set(nb.run(gov, m, 1.0)) == {1}  # alone, but the caller allows one thread
    nb.use = 0.32
    m.threads = 2
    assert set(nb.run(gov, m, 1.0)) == {2}  # a neighbour inside the band does not take a thread
    nb.use = 1.0
    assert nb.run(gov, m, 1.0)[-50:] == [1] * 50


def test_proc_stat_busy_counts_only_the_allowed_cpus_and_busy_fields():
    text = ("cpu  300 0 30 1000 5 0 0 7 0 0\n"
            "cpu0 100 0 10 500 5 0 0 7 0 0\n"
            "cpu1 200 10 20 500 0 3 2 0 0 0\n"
            "intr 1 2 3\n")
    assert proc_stat_busy(text, {0}, 100) == pytest.approx(1.1)  # iowait and steal are not busy
    assert proc_stat_busy(text, {0, 1}, 100) == pytest.approx(1.1 + 2.35)


def test_cgroup_usage_is_read_from_v2_and_v1(tmp_path):
    (tmp_path / "pod" / "c").mkdir(parents=True)
    (tmp_path / "pod" / "c" / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    assert _cgroup_usage_reader(tmp_path, "0::/pod/c\n")() == pytest.approx(2.5)
    (tmp_path / "cpuacct" / "job").mkdir(parents=True)
    (tmp_path / "cpuacct" / "job" / "cpuacct.usage").write_text("1500000000\n")
    assert _cgroup_usage_reader(tmp_path, "4:cpuacct:/job\n")() == pytest.approx(1.5)
    assert _cgroup_usage_reader(tmp_path, "0::/missing\n") is None


def test_cpu_load_sees_a_real_busy_process():
    load = CpuLoad.open()
    if load is None:
        pytest.skip("no /proc/stat on this system: the governor times steps instead")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        load.others()
        time.sleep(0.6)
        _, others = load.others()
    finally:
        busy.kill()
        busy.wait()
    assert others > 0.6, f"a spinning process read as {others:.2f} CPUs"
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass  # our own work is not a neighbour's
    _, mine = load.others()
    assert mine < 0.5, f"this process's own work read as {mine:.2f} CPUs of others'"


def test_section_threads_follow_the_neighbours_of_the_previous_run():
    """A training step gets the count the neighbours left during the previous step, not during
    what ran between steps; the caller's count comes back after each."""
    m, nb = Machine(), Neighbours()
    sec = SectionThreads(load=nb.load, set_threads=m.set, get_threads=lambda: m.threads)

    def section(use, seconds=1.0):
        with sec:
            used = m.threads
            nb.use = use
            nb.now += seconds
            nb.busy += use * seconds
        return used

    assert section(0.0) == 2 and m.threads == 2
    assert section(0.9) == 2  # a neighbour appears during this step ...
    assert section(0.9) == 1 and m.threads == 2  # ... so the next step runs at one thread, and gives two back
    nb.now += 5.0
    nb.busy += 5.0 * 1.5  # between steps (generation, its sandboxed commands): not the step's window
    assert section(0.32) == 1  # inside the band: stays
    assert section(0.05) == 1
    assert section(0.0) == 2  # the neighbour left during the previous step
    m.threads = 1  # the caller allows one thread: the cap
    assert section(0.0) == 1
