"""Team episodes with the real sandbox: workflows refused at load, a scripted coder and tester
that solve a real bugfix task, faults that mask an episode, a plugin workflow, a tiny model."""

import sys
import time

import pytest
import torch

from longhaul.agent.loop import AgentConfig, ModelPolicy, ScriptedPolicy
from longhaul.agent.team import run_team
from longhaul.agent.workflows import CODER_TESTER, NAVIGATOR_DRIVER, family_tools, load_workflow, solo, workflow_from
from longhaul.envs.registry import get_family
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import HIDDEN_DIR, WorkspaceEnv, WorkspaceTask
from longhaul.errors import LonghaulError
from longhaul.models import load_policy
from longhaul.models.byte_tokenizer import byte_tokenizer

SRC = "def add(a, b):\n    return a - b\n"
FIX = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
HIDDEN = "from m import add\n\n\ndef test_hidden():\n    assert add(1, 1) == 2\n"
CFG = AgentConfig(max_tokens=100_000, max_new_tokens=4096)


def small_task(i=0):
    return WorkspaceTask(f"t/v1/{i}", "t", "1", i, 1, "x", "Fix add in m.py.", {"m.py": SRC}, {"test_h.py": HIDDEN},
                         f"python3 -m pytest -q -o pythonpath=. {HIDDEN_DIR}")


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def bugfix():
    return get_family("bugfix")


def exact(traj) -> bool:
    """Every reply's prompt extends the previous reply's prompt + completion, in one segment."""
    turns = traj.turns
    return all(t.segment == 0 for t in turns) and all(
        b.prompt_ids[:len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
        for a, b in zip(turns, turns[1:]))


def edit(base: dict, **changes) -> dict:
    out = {**base, "roles": [dict(r) for r in base["roles"]], "order": dict(base["order"])}
    out.update(changes)
    return out


# ---- refusals at load ------------------------------------------------------------------------
def test_an_unknown_role_in_the_turn_order_is_refused():
    wf = edit(NAVIGATOR_DRIVER, order={"kind": "round_robin", "turns": ["navigator", "pilot"]})
    with pytest.raises(LonghaulError, match="unknown role 'pilot'; use one of driver, navigator") as e:
        workflow_from(wf, "x")
    assert "\n" not in str(e.value)


def test_a_tool_the_family_does_not_have_is_refused(bugfix):
    wf = edit(NAVIGATOR_DRIVER)
    wf["roles"][0] = {**wf["roles"][0], "tools": ["read_file", "browse_web"]}
    with pytest.raises(LonghaulError, match="role 'navigator' may call 'browse_web', which family 'bugfix' does not have") as e:
        workflow_from(wf, "x").check_tools(family_tools(bugfix), "bugfix")
    assert "\n" not in str(e.value)


def test_a_turn_graph_with_no_end_is_refused():
    wf = edit(CODER_TESTER, order={"kind": "graph", "start": "tester", "edges": [
        {"from": "tester", "to": "coder"}, {"from": "coder", "to": "tester"}]})
    with pytest.raises(LonghaulError, match="the turn graph has no end") as e:
        workflow_from(wf, "x")
    assert "\n" not in str(e.value)
    dangling = edit(CODER_TESTER, order={"kind": "graph", "start": "tester", "edges": [
        {"from": "tester", "to": "coder"}, {"from": "coder", "to": "end", "when": "submit"}]})
    with pytest.raises(LonghaulError, match="what follows a turn of 'coder' that ends in yield"):
        workflow_from(dangling, "x")


def test_a_role_with_no_policy_is_refused():
    wf = edit(CODER_TESTER)
    wf["roles"][1] = {k: v for k, v in wf["roles"][1].items() if k != "policy"}
    with pytest.raises(LonghaulError, match="role 'coder' has no policy") as e:
        workflow_from(wf, "x")
    assert "\n" not in str(e.value)


def test_a_misspelled_key_is_named_with_its_fix():
    wf = edit(CODER_TESTER)
    wf["roles"][0] = {**wf["roles"][0], "tols": []}
    with pytest.raises(LonghaulError, match=r"workflow 'x': unknown config key 'roles.0.tols'; did you mean roles.0.tools\?"):
        workflow_from(wf, "x")


def test_shipped_workflows_load_against_the_workspace_families():
    for fam in ("bugfix", "multistep"):
        for name in ("coder_tester", "navigator_driver"):
            assert load_workflow(name, get_family(fam)).name == name
    with pytest.raises(LonghaulError, match="single-turn"):
        load_workflow("coder_tester", get_family("funcgen"))
    with pytest.raises(LonghaulError, match="unknown workflow 'pair'"):
        load_workflow("pair")


def test_a_team_s_single_agent_counterpart_has_its_tools_and_budgets():
    wf = workflow_from({**NAVIGATOR_DRIVER, "max_turns": 4, "max_tokens": 2500, "turn_timeout_s": 30}, "nd")
    one = solo(wf)
    (role,) = one.roles
    driver = wf.role("driver")
    assert role.tools == [t for t in driver.tools if t != "message"]  # the navigator's tools are the driver's reads
    assert role.replies == max(r.replies for r in wf.roles) and "message" not in role.tools
    assert (one.max_turns, one.max_tokens, one.turn_timeout_s) == (4, 2500, 30)
    assert one.order.kind == "round_robin" and one.order.turns == [role.name]
    mixed = solo(workflow_from(CODER_TESTER, "ct")).roles[0].tools
    assert "apply_patch" in mixed and "write_file" in mixed and mixed.count("read_file") == 1
    with pytest.raises(LonghaulError, match="no role may submit"):
        solo(workflow_from({**NAVIGATOR_DRIVER, "roles": [NAVIGATOR_DRIVER["roles"][0]], "order": {
            "kind": "sequence", "turns": ["navigator"]}}, "readers"))


def test_a_scripted_single_agent_solves_a_task_with_no_team_in_its_prompt(tok, bugfix):
    task = bugfix.make_split("train", 1)[0]
    one = solo(load_workflow("coder_tester", bugfix))
    patch = next(a for a in task.reference if a.tool == "apply_patch")
    pol = ScriptedPolicy(tok, {"e:agent": [patch.text(), format_call("run_tests"), format_call("submit")]})
    [(agent,)] = run_team(one, {"agent": pol}, tok, lambda t: WorkspaceEnv(), [task], CFG, episodes=["e"])
    assert (agent.info["ended"], agent.reward, len(agent.turns)) == ("done", 1.0, 3) and exact(agent)
    system = tok.decode(agent.turns[0].prompt_ids)
    assert "You work alone" in system and "Your team" not in system and '"message"' not in system


# ---- a real task, solved by a scripted team -------------------------------------------------
def test_a_scripted_coder_and_tester_solve_a_bugfix_task_token_exact(tok, bugfix):
    task = bugfix.make_split("train", 1)[0]
    wf = load_workflow("coder_tester", bugfix)
    patch = next(a for a in task.reference if a.tool == "apply_patch")
    test = task.files["tests/test_issue.py"]
    scripts = {
        "e:tester": [format_call("read_file", path="tests/test_issue.py"),
                     format_call("write_file", path="tests/test_team.py", content=test),
                     format_call("message", to="coder", text="tests/test_team.py checks merge."),
                     format_call("message", to="coder", text="Yes, merge must join touching intervals.")],
        "e:coder": [format_call("run_tests"),
                    format_call("message", to="tester", text="Is test_merge_touching_and_gap right?"),
                    patch.text(), format_call("run_tests"), format_call("submit")],
    }
    pol = ScriptedPolicy(tok, scripts)
    t0 = time.perf_counter()
    [(tester, coder)] = run_team(wf, {"tester": pol, "coder": pol}, tok, lambda t: WorkspaceEnv(), [task], CFG, episodes=["e"])
    wall = time.perf_counter() - t0
    for traj, role in ((tester, "tester"), (coder, "coder")):
        i = traj.info
        assert (i["role"], i["policy"], i["episode"], i["task_id"]) == (role, role, "e", task.task_id)
        assert (i["ended"], i["status"], traj.reward, i["submitted"]) == ("done", "pass", 1.0, True)
        assert i["role_turns"] == 2 and i["team_turns"] == 4 and exact(traj), i
        for t in traj.turns:
            assert len(t.completion_ids) == len(t.logprobs) == len(t.versions) == len(t.loss_mask)
    assert [len(tester.turns), len(coder.turns)] == [4, 5]
    assert tester.info["role_reward"] == 1.0 and "role_reward" not in coder.info  # its test tells the fix from the bug
    assert [(m["from"], m["to"]) for m in coder.info["team_messages"]] == [("tester", "coder"), ("coder", "tester"),
                                                                           ("tester", "coder")]
    # the coder's second turn opens with the tester's answer, inside its exact prompt
    last = tok.decode(coder.turns[2].prompt_ids)
    assert "[tester] Yes, merge must join touching intervals." in last and "It is your turn again" in last
    assert "[coder] Is test_merge_touching_and_gap right?" in tok.decode(tester.turns[3].prompt_ids)
    assert wall < 20, wall


def test_a_role_calling_a_tool_it_may_not_is_refused_not_run(tok):
    wf = load_workflow("navigator_driver")
    scripts = {"e:navigator": [format_call("write_file", path="m.py", content="x"),
                               format_call("message", to="driver", text="Patch m.py: add, not subtract.")],
               "e:driver": [format_call("apply_patch", patch=FIX), format_call("submit")]}
    pol = ScriptedPolicy(tok, scripts)
    [(nav, drv)] = run_team(wf, {"navigator": pol, "driver": pol}, tok, lambda t: WorkspaceEnv(), [small_task()], CFG,
                            episodes=["e"])
    assert nav.info["invalid_calls"] == 1 and "may not call 'write_file'" in tok.decode(nav.turns[1].prompt_ids)
    assert (drv.reward, drv.info["ended"], drv.info["role_turns"], nav.info["messages_sent"]) == (1.0, "done", 1, 1)


# ---- faults and budgets ----------------------------------------------------------------------
class Crashing:
    """A scripted policy whose replies for one key raise after `after` calls."""

    concurrent = True

    def __init__(self, inner, key, after=1, sleep=0.0):
        self.inner, self.key, self.after, self.sleep, self.calls = inner, key, after, sleep, 0

    def generate(self, prompts, sampling, keys):
        if keys[0] == self.key:
            self.calls += 1
            if self.calls > self.after:
                if self.sleep:
                    time.sleep(self.sleep)
                    return self.inner.generate(prompts, sampling, keys)
                raise RuntimeError("worker lost")
        return self.inner.generate(prompts, sampling, keys)


def solving_scripts(episodes):
    out = {}
    for e in episodes:
        out[f"{e}:navigator"] = [format_call("message", to="driver", text="Fix add.")]
        out[f"{e}:driver"] = [format_call("read_file", path="m.py"), format_call("apply_patch", patch=FIX), format_call("submit")]
    return out


def test_a_role_that_crashes_masks_the_episode_and_the_next_one_runs(tok):
    wf = load_workflow("navigator_driver")
    pol = Crashing(ScriptedPolicy(tok, solving_scripts(["a", "b"])), "a:driver", after=1)
    seen = []
    first, second = run_team(wf, {"navigator": pol, "driver": pol}, tok, lambda t: WorkspaceEnv(),
                             [small_task(0), small_task(1)], CFG, episodes=["a", "b"], on_done=seen.append)
    for traj in first:  # every role of the broken episode, not only the driver's
        assert (traj.info["ended"], traj.info["status"], traj.info["passed"]) == ("infra_error", "infra_error", False)
        assert traj.info["infra_error"] == "role driver: policy: RuntimeError: worker lost"
    assert len(first[1].turns) == 1  # the reply before the crash is kept, the episode masked
    assert [t.info["ended"] for t in second] == ["done", "done"] and second[1].reward == 1.0
    assert len(seen) == 2


def test_the_grpo_baseline_leaves_out_a_crashed_team_episode(tok):
    """The trainer's own selection (rl.grpo) drops infra errors from the group baseline."""
    from longhaul.config import AlgoConfig, TrainConfig
    from longhaul.rl.grpo import GRPOTrainer

    wf = load_workflow("navigator_driver")
    pol = Crashing(ScriptedPolicy(tok, solving_scripts(["a", "b"])), "a:driver", after=1)
    first, second = run_team(wf, {"navigator": pol, "driver": pol}, tok, lambda t: WorkspaceEnv(),
                             [small_task(0), small_task(0)], CFG, episodes=["a", "b"])
    group = [first[1], second[1]]  # the driver's trajectories of two episodes of one task
    model, mtok = load_policy("tiny-llama")
    trainer = GRPOTrainer(model, mtok.pad_token_id, AlgoConfig(drop_zero_std_groups=False), TrainConfig(autocast="none"))
    rewards, _, seqs, _, _ = trainer.select([group])
    assert rewards.tolist() == [[1.0, 1.0]] and len(seqs) == 1  # the crashed one: the group's mean, and no sequence


def test_a_turn_past_its_timeout_is_an_infra_error(tok):
    wf = load_workflow("navigator_driver").model_copy(update={"turn_timeout_s": 0.5})
    pol = Crashing(ScriptedPolicy(tok, solving_scripts(["a"])), "a:driver", after=0, sleep=2.0)
    [trajs] = run_team(wf, {"navigator": pol, "driver": pol}, tok, lambda t: WorkspaceEnv(), [small_task()], CFG,
                       episodes=["a"])
    assert {t.info["ended"] for t in trajs} == {"infra_error"} and "timeout" in trajs[0].info["infra_error"]


def test_running_out_of_turns_is_truncated_and_scored(tok):
    wf = load_workflow("navigator_driver").model_copy(update={"max_turns": 3})
    chat = {"a:navigator": [format_call("message", to="driver", text="Look around.")],
            "a:driver": [format_call("list_dir"), format_call("message", to="navigator", text="What now?")]}
    pol = ScriptedPolicy(tok, chat)
    [trajs] = run_team(wf, {"navigator": pol, "driver": pol}, tok, lambda t: WorkspaceEnv(), [small_task()], CFG,
                       episodes=["a"])
    assert [t.info["role_turns"] for t in trajs] == [2, 1]
    assert {(t.info["ended"], t.info["truncated_by"], t.info["status"]) for t in trajs} == {("truncated", "max_turns", "fail")}


# ---- plugins and policies --------------------------------------------------------------------
PLUGIN = '''
from longhaul.agent.workflows import Workflow

PAIR = Workflow.model_validate({
    "name": "fixer_pair",
    "roles": [{"name": "reader", "policy": "shared", "tools": ["read_file", "message"], "system": "Read.",
               "reward": "team_plugin:sent"},
              {"name": "fixer", "policy": "shared", "tools": ["apply_patch", "submit"], "system": "Fix.", "replies": 3}],
    "order": {"kind": "sequence", "turns": ["reader", "fixer"]},
})


def sent(env, task, role):
    return 0.5 if role == "reader" else None
'''


def test_a_plugin_workflow_loads_from_package_module_name(tok, tmp_path, monkeypatch):
    (tmp_path / "team_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = load_workflow("team_plugin:PAIR", get_family("bugfix"))
    scripts = {"p:reader": [format_call("read_file", path="m.py"), format_call("message", to="fixer", text="a - b")],
               "p:fixer": [format_call("apply_patch", patch=FIX), format_call("submit")]}
    [(reader, fixer)] = run_team(wf, {"shared": ScriptedPolicy(tok, scripts)}, tok, lambda t: WorkspaceEnv(), [small_task()],
                                 CFG, episodes=["p"])
    assert (fixer.reward, fixer.info["ended"], reader.info["policy"], reader.info["role_reward"]) == (1.0, "done", "shared", 0.5)
    with pytest.raises(LonghaulError, match="has no 'MISSING'"):
        load_workflow("team_plugin:MISSING")
    with pytest.raises(LonghaulError, match="needs policies shared"):
        run_team(wf, {}, tok, lambda t: WorkspaceEnv(), [small_task()], CFG)
    sys.modules.pop("team_plugin", None)


def test_a_tiny_model_drives_beside_a_scripted_navigator(tok):
    torch.manual_seed(0)
    model, mtok = load_policy("tiny-llama")
    wf = load_workflow("navigator_driver").model_copy(update={"max_turns": 4})
    wf.roles[1] = wf.roles[1].model_copy(update={"replies": 2, "max_new_tokens": 8})
    nav = ScriptedPolicy(mtok, {"m:navigator": [format_call("message", to="driver", text="Fix add in m.py.")]})
    cfg = AgentConfig(max_tokens=20_000, max_new_tokens=4096, temperature=1.0)
    [(n, d)] = run_team(wf, {"navigator": nav, "driver": ModelPolicy(model, mtok, version=3, seed=1)}, mtok,
                        lambda t: WorkspaceEnv(), [small_task()], cfg, episodes=["m"])
    assert (d.info["ended"], d.info["truncated_by"], len(d.turns), d.info["role_turns"]) == ("truncated", "max_turns", 4, 2)
    assert exact(d) and exact(n) and d.info["invalid_calls"] == 4
    for t in d.turns:
        assert t.versions == [3] * len(t.completion_ids) and all(lp <= 0 for lp in t.logprobs)
    turn = d.turns[-1]  # the recorded log-probs are the model's on the exact ids
    ids = torch.tensor([turn.prompt_ids + turn.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(turn.prompt_ids) - 1:-1].float(), -1)
    ref = logp.gather(-1, torch.tensor(turn.completion_ids)[:, None]).squeeze(-1)
    assert torch.allclose(ref, torch.tensor(turn.logprobs), atol=1e-4), (ref - torch.tensor(turn.logprobs)).abs().max()
