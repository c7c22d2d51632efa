"""The agent loop with real policies (scripted oracle, a tiny random model) and the real sandbox."""

import dataclasses

import pytest
import torch

from longhaul.agent.loop import AgentConfig, Generation, ModelPolicy, ScriptedPolicy, run_episodes
from longhaul.envs.base import AnswerEnv
from longhaul.envs.registry import get_family
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import HIDDEN_DIR, WorkspaceEnv, WorkspaceTask
from longhaul.models import load_policy
from longhaul.models.byte_tokenizer import byte_tokenizer

SRC = "def add(a, b):\n    return a - b\n"
FIX = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
HIDDEN = "from m import add\n\n\ndef test_hidden():\n    assert add(1, 1) == 2\n"


def task(i=0):
    return WorkspaceTask(f"t/v1/{i}", "t", "1", i, 1, "x", "Fix add in m.py.", {"m.py": SRC}, {"test_h.py": HIDDEN},
                         f"python3 -m pytest -q -o pythonpath=. {HIDDEN_DIR}")


ORACLE = [format_call("read_file", path="m.py"), format_call("apply_patch", patch=FIX), format_call("submit")]


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


def extends(turns):
    for a, b in zip(turns, turns[1:]):
        if b.segment == a.segment and b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] != a.prompt_ids + a.completion_ids:
            return False
    return True


def test_oracle_and_null_through_the_loop_are_token_exact(tok):
    tasks = [task(0), task(1)]
    keys = ["oracle", "null"]
    pol = ScriptedPolicy(tok, {"oracle": ORACLE, "null": [format_call("submit")]})
    oracle, null = run_episodes(pol, tok, lambda t: WorkspaceEnv(), tasks, AgentConfig(max_tokens=100_000), keys=keys)
    assert (oracle.reward, oracle.info["ended"], oracle.info["turns"], oracle.info["tool_calls"]) == (1.0, "done", 3, 3)
    assert (null.reward, null.info["status"]) == (0.0, "fail")
    assert oracle.info["segments"] == 1 and extends(oracle.turns)
    for t in oracle.turns:
        assert len(t.completion_ids) == len(t.logprobs) == len(t.versions) == len(t.loss_mask)
        assert t.loss_mask == [1] * len(t.completion_ids)
    # the last prompt, decoded, is exactly the chat template over the messages: observations included
    last = tok.decode(oracle.turns[-1].prompt_ids)
    assert "patched m.py" in last and last.endswith("<|im_start|>assistant\n") and last.count("<|im_start|>tool") == 2


def test_retokenize_mode_matches_extend_for_a_template_that_extends(tok):
    pol = lambda: ScriptedPolicy(tok, {"k": ORACLE})
    a = run_episodes(pol(), tok, lambda t: WorkspaceEnv(), [task()], AgentConfig(max_tokens=100_000), keys=["k"])[0]
    b = run_episodes(pol(), tok, lambda t: WorkspaceEnv(), [task()], AgentConfig(max_tokens=100_000, prompt_mode="retokenize"),
                     keys=["k"])[0]
    assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns] and b.info["segments"] == 1


def test_a_template_that_rewrites_history_starts_a_new_segment(tok):
    class Forgetful:  # renders only the last two messages: earlier turns vanish from the prompt
        def __init__(self, tok):
            self.tok = tok
            self.eos_token_id = tok.eos_token_id

        def apply_chat_template(self, messages, **kw):
            return self.tok.apply_chat_template(messages[-2:], **kw)

        def __call__(self, *a, **kw):
            return self.tok(*a, **kw)

        def decode(self, *a, **kw):
            return self.tok.decode(*a, **kw)

    ft = Forgetful(tok)
    traj = run_episodes(ScriptedPolicy(ft, {"k": ORACLE}), ft, lambda t: WorkspaceEnv(), [task()],
                        AgentConfig(max_tokens=100_000), keys=["k"])[0]
    assert traj.reward == 1.0 and traj.info["segments"] == 3 and [t.segment for t in traj.turns] == [0, 1, 2]


def test_turn_and_context_budgets_truncate(tok):
    talk = ScriptedPolicy(tok, {"k": ["I am thinking."]})
    t = run_episodes(talk, tok, lambda t: WorkspaceEnv(), [task()], AgentConfig(max_turns=3, max_tokens=100_000), keys=["k"])[0]
    assert (t.info["ended"], t.info["truncated_by"], t.info["turns"]) == ("truncated", "max_turns", 3)
    talk = ScriptedPolicy(tok, {"k": ["I am thinking.", "Still thinking.", format_call("list_dir"), "Hmm.", "Hm.", "H."]})
    t = run_episodes(talk, tok, lambda t: WorkspaceEnv(), [task()], AgentConfig(max_turns=10, max_idle_turns=3), keys=["k"])[0]
    assert (t.info["truncated_by"], t.info["turns"]) == ("idle", 6)  # a valid call in between resets the count
    # the first prompt alone is ~1,100 byte tokens: a 3,000-token context overflows after a dozen turns
    listing = ScriptedPolicy(tok, {"k": [format_call("read_file", path="m.py")]})
    t = run_episodes(listing, tok, lambda t: WorkspaceEnv(), [task()], AgentConfig(max_turns=50, max_tokens=3000), keys=["k"])[0]
    assert t.info["ended"] == "truncated" and t.info["truncated_by"] == "context" and t.reward == 0.0


def test_an_episode_that_never_submits_scores_nothing_when_submit_is_required(tok):
    """Fixed but never submitted: with require_submit (what RL and the pipeline's evaluation use)
    it scores 0 as "unsubmitted", its final state recorded apart; without, the state decides."""
    fix_only = [format_call("read_file", path="m.py"), format_call("apply_patch", patch=FIX), format_call("list_dir")]
    cfg = AgentConfig(max_turns=4, max_tokens=100_000)
    for required in (True, False):
        pol = ScriptedPolicy(tok, {"fix": fix_only, "done": ORACLE})
        fixed, done = run_episodes(pol, tok, lambda t: WorkspaceEnv(), [task(0), task(1)],
                                   dataclasses.replace(cfg, require_submit=required), keys=["fix", "done"])
        assert (done.reward, done.info["status"], done.info["submitted"]) == (1.0, "pass", True)
        assert fixed.info["ended"] == "truncated" and not fixed.info["submitted"]
        if required:
            assert (fixed.reward, fixed.info["status"], fixed.info["passed"], fixed.info["state_passed"]) == (0.0, "unsubmitted", False, True)
        else:
            assert (fixed.reward, fixed.info["status"]) == (1.0, "pass") and "state_passed" not in fixed.info


def test_infra_errors_are_reported_not_scored(tok):
    class Broken(WorkspaceEnv):
        def step(self, message):
            raise RuntimeError("disk on fire")

    t = run_episodes(ScriptedPolicy(tok, {"k": ORACLE}), tok, lambda t: Broken(), [task()], AgentConfig(max_tokens=100_000),
                     keys=["k"])[0]
    assert t.info["ended"] == "infra_error" and "disk on fire" in t.info["infra_error"] and t.info["status"] == "infra_error"


def test_a_tiny_random_model_runs_episodes_and_records_its_own_logprobs(tok):
    torch.manual_seed(0)
    model, mtok = load_policy("tiny-llama")
    pol = ModelPolicy(model, mtok, version=7, seed=3)
    cfg = AgentConfig(max_turns=2, max_new_tokens=12, max_tokens=20_000, temperature=1.0)
    trajs = run_episodes(pol, mtok, lambda t: WorkspaceEnv(), [task(0), task(1)], cfg)
    for t in trajs:
        assert t.info["ended"] in ("truncated", "done") and extends(t.turns)
        for turn in t.turns:
            assert turn.versions == [7] * len(turn.completion_ids) and all(lp <= 0 for lp in turn.logprobs)
    # the recorded behaviour log-probs are the model's, recomputed from scratch on the exact ids
    turn = trajs[0].turns[-1]
    ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(turn.prompt_ids) - 1:-1].float(), -1)
    ref = logp.gather(-1, torch.tensor(turn.completion_ids)[:, None]).squeeze(-1)
    assert torch.allclose(ref, torch.tensor(turn.logprobs), atol=1e-4), (ref - torch.tensor(turn.logprobs)).abs().max()


def test_single_turn_families_run_through_the_same_loop(tok):
    fam = get_family("funcgen")
    tasks = fam.make_split("heldout", 2)
    scripts = {"ref": [fam.reference_reply(tasks[0])], "null": [fam.null_reply(tasks[1])]}
    good, bad = run_episodes(ScriptedPolicy(tok, scripts), tok, lambda t: AnswerEnv(fam.score_many), tasks,
                             AgentConfig(max_tokens=100_000, stop=()), keys=["ref", "null"])
    assert (good.reward, good.info["turns"], bad.reward) == (1.0, 1, 0.0)


def test_generation_record_defaults():
    g = Generation([1, 2], [-0.1, -0.2], "stop")
    assert g.version == 0


def test_many_tasks_run_in_waves_and_keep_their_order_and_groups(tok):
    tasks = [task(i) for i in range(5)]
    scripts = {f"k{i}": (ORACLE if i % 2 == 0 else [format_call("submit")]) for i in range(5)}
    trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, lambda t: WorkspaceEnv(), tasks,
                         AgentConfig(max_tokens=100_000, max_live=2), keys=list(scripts), groups=[9, 9, 8, 8, 7])
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0, 0.0, 1.0] and [t.group for t in trajs] == [9, 9, 8, 8, 7]
    assert [t.info["task_id"] for t in trajs] == [f"t/v1/{i}" for i in range(5)]


def test_elide_keeps_a_long_episode_going_where_truncate_ends_it(tok):
    reads = [format_call("run", command=f"python3 -c \"print('x' * 1500)\"  # {k}") for k in range(5)]
    script = reads + ORACLE[1:]
    base = AgentConfig(max_turns=12, max_tokens=6000, max_new_tokens=200, temperature=0)
    cut = run_episodes(ScriptedPolicy(tok, {"k": script}), tok, lambda t: WorkspaceEnv(), [task()], base, keys=["k"])[0]
    assert cut.info["ended"] == "truncated" and cut.info["truncated_by"] == "context" and not cut.info["passed"]
    cfg = AgentConfig(max_turns=12, max_tokens=6000, max_new_tokens=200, temperature=0, context="elide", keep_outputs=1,
                      keep_messages=True)
    kept = run_episodes(ScriptedPolicy(tok, {"k": script}), tok, lambda t: WorkspaceEnv(), [task()], cfg, keys=["k"])[0]
    assert kept.info["ended"] == "done" and kept.info["passed"] and kept.info["elided"] >= 3
    assert kept.info["segments"] > 1  # the elided history is a new segment: the trainer never sees a prompt it was not sampled from
    assert max(len(t.prompt_ids) + len(t.completion_ids) for t in kept.turns) <= cfg.max_tokens
    outputs = [m["content"] for m in kept.info["messages"] if m["role"] == "tool"]
    assert sum(o.startswith("[output elided") for o in outputs) == kept.info["elided"]
    assert "x" * 1500 in outputs[4], "the most recent output is kept whole"
    for t in kept.turns:  # every turn's prompt is what the model saw: it decodes to the elided history, never the full one
        assert t.prompt_ids[:len(kept.turns[0].prompt_ids)] == kept.turns[0].prompt_ids


def test_agent_counters_and_metrics(tok):
    from longhaul.eval.agent_metrics import agent_metrics

    bad = "<tool_call>{not json}</tool_call>"
    scripts = {"solve": [format_call("run", command="false"), *ORACLE],  # a failing command, then the fix: a repair
               "loop": [format_call("list_dir"), format_call("list_dir"), bad, format_call("submit")],
               "wander": [format_call("list_dir")] * 3}
    cfg = AgentConfig(max_turns=3 + 1, temperature=0)
    trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, lambda t: WorkspaceEnv(), [task(0), task(1), task(2)], cfg,
                         keys=list(scripts))
    solve, loop, wander = (t.info for t in trajs)
    assert solve["passed"] and solve["submitted"] and solve["failed_calls"] == 1 and solve["invalid_calls"] == 0
    assert loop["submitted"] and not loop["passed"] and loop["repeated_calls"] == 1 and loop["invalid_calls"] == 1
    assert not wander["submitted"] and wander["ended"] == "truncated"
    m = agent_metrics(trajs)
    assert m["pass_rate"] == pytest.approx(1 / 3) and m["submit_rate"] == pytest.approx(2 / 3)
    assert m["turns_to_submit"] == pytest.approx((4 + 4) / 2) and m["invalid_calls"] == pytest.approx(1 / 3)
    assert m["loop_rate"] == pytest.approx(2 / 3) and m["repair_rate"] == 1.0 and m["episodes_with_failures"] == 1


def test_continuous_and_rounds_give_the_same_episodes_with_the_engine():
    """Replies are seeded by episode key and turn, and the engine's outputs do not depend on the
    batch: the two schedules sample the same tokens, though requests meet in different batches."""
    from longhaul.inference import LLMEngine

    model, mtok = load_policy("tiny-llama")
    tasks = [task(i) for i in range(3) for _ in range(2)]
    runs = {}
    for schedule in ("continuous", "rounds"):
        pol = ModelPolicy(LLMEngine(model=model, tokenizer=mtok), mtok, version=2, seed=5)
        assert pol.concurrent
        cfg = AgentConfig(max_turns=3, max_new_tokens=10, max_tokens=20_000, temperature=1.0, schedule=schedule)
        runs[schedule] = run_episodes(pol, mtok, lambda t: WorkspaceEnv(), tasks, cfg, groups=[0, 0, 1, 1, 2, 2])
    for a, b in zip(runs["continuous"], runs["rounds"]):
        assert [t.completion_ids for t in a.turns] == [t.completion_ids for t in b.turns]
        assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns] and extends(a.turns)
        assert max(abs(x - y) for s, r in zip(a.turns, b.turns) for x, y in zip(s.logprobs, r.logprobs)) < 1e-4
        assert a.group == b.group and a.info["task_id"] == b.info["task_id"]
    assert runs["continuous"][0].turns[0].completion_ids != runs["continuous"][1].turns[0].completion_ids  # a group's episodes differ


class Paced:
    """A scripted policy whose first reply to the "slow" episode takes until the "fast" one has
    finished (or a timeout): it records the order replies were asked for."""

    concurrent = True

    def __init__(self, tok, scripts):
        import threading

        self.inner, self.calls, self.fast_done = ScriptedPolicy(tok, scripts), [], threading.Event()

    def generate(self, prompts, sampling, keys):
        self.calls.append(keys[0] if len(keys) == 1 else tuple(keys))
        if keys == ["slow"] and self.calls.count("slow") == 1:
            self.fast_done.wait(timeout=10)
        out = self.inner.generate(prompts, sampling, keys)
        if keys == ["fast"] and self.calls.count("fast") == len(ORACLE):
            self.fast_done.set()
        return out


def test_continuous_episodes_do_not_wait_for_each_other(tok):
    scripts = {"slow": ORACLE, "fast": ORACLE}
    pol = Paced(tok, scripts)
    trajs = run_episodes(pol, tok, lambda t: WorkspaceEnv(), [task(0), task(1)], AgentConfig(max_tokens=100_000), keys=list(scripts))
    assert [t.reward for t in trajs] == [1.0, 1.0]
    assert pol.calls.index("slow") < pol.calls.index("fast") or pol.calls[0] == "fast"
    assert pol.fast_done.is_set() and pol.calls[-len(ORACLE) + 1:] == ["slow"] * (len(ORACLE) - 1)  # fast ran all its turns first
    rounds = Paced(tok, scripts)
    run_episodes(rounds, tok, lambda t: WorkspaceEnv(), [task(0), task(1)], AgentConfig(max_tokens=100_000, schedule="rounds"),
                 keys=list(scripts))
    assert rounds.calls == [("slow", "fast")] * len(ORACLE)  # one batch a round: each turn waits for the slowest


def test_a_failing_policy_call_stops_every_episode_and_closes_their_envs(tok):
    envs = []

    class Env(WorkspaceEnv):
        def __init__(self):
            super().__init__()
            envs.append(self)

    class Failing(ScriptedPolicy):
        def generate(self, prompts, sampling, keys):
            if keys == ["bad"] and self._pos.get("bad", 0) == 1:
                raise RuntimeError("the server went away")
            return super().generate(prompts, sampling, keys)

    scripts = {"bad": ORACLE, **{f"ok{i}": ORACLE for i in range(3)}}
    with pytest.raises(RuntimeError, match="the server went away"):
        run_episodes(Failing(tok, scripts), tok, lambda t: Env(), [task(i) for i in range(4)], AgentConfig(max_tokens=100_000),
                     keys=list(scripts))
    assert len(envs) == 4 and all(e.sb is None and e.session is None for e in envs)  # every sandbox torn down
