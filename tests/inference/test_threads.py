"""The thread governor, on a controlled clock: it probes, keeps the fastest count, backs off
while the choice holds, respects the caller's cap; and the engine's outputs do not depend on
the thread count it picks."""

import torch

from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.inference.threads import ThreadGovernor
from longhaul.models import load_policy


class Machine:
    """Thread count, a clock, and a step cost per count that the test changes (contention)."""

    def __init__(self, threads=2, cost=None):
        self.threads, self.now, self.sets = threads, 0.0, 0
        self.cost = cost or {2: 1.0, 1: 1.6}

    def set(self, n):
        self.threads, self.sets = n, self.sets + 1

    def governor(self, **kw):
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
    eng.threads = ThreadGovernor(probe_steps=1, first_probe=0, min_interval=1, max_interval=1)  # probe all the time
    try:
        torch.set_num_threads(2)
        got = eng.generate(prompts, params)
    finally:
        torch.set_num_threads(cap)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    worst = max(abs(a - b) for o, r in zip(got, ref) for a, b in zip(o.logprobs, r.logprobs))
    assert worst < 1e-5, f"max log-prob difference {worst:.3g}"
