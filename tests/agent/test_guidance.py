"""Off-policy guidance (`rollout.guidance`): a group that no sample passed gets the task's verified
oracle demonstration, replayed through the real loop and sandbox; trainers read its unknown
behaviour log-probs as on-policy; metrics and curricula count sampled episodes only."""

import copy
import math

import pytest
import torch

from longhaul.agent.demos import scripts_for
from longhaul.agent.loop import AgentConfig, ScriptedPolicy, run_episodes
from longhaul.agent.rollout import guide
from longhaul.config import AlgoConfig, RunConfig, TrainConfig
from longhaul.envs import get_family
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import WorkspaceEnv
from longhaul.errors import LonghaulError
from longhaul.models import load_policy
from longhaul.models.byte_tokenizer import byte_tokenizer
from longhaul.rl.grpo import GRPOTrainer
from longhaul.runtime.online import _step_metrics
from longhaul.runtime.setup import Part, check_guidance, check_runtime
from longhaul.types import Trajectory, Turn

CFG = AgentConfig(max_turns=10, max_tokens=10_000_000, workers=2)


def _sampled(tok, family, tasks, scripts_per_task):
    """Groups from scripted 'samples': for each task, one script per group member."""
    env = family.make_env or (lambda t: WorkspaceEnv())
    flat, scripts, keys = [], {}, []
    for i, (task, members) in enumerate(zip(tasks, scripts_per_task)):
        for j, script in enumerate(members):
            key = f"{i}.{j}"
            scripts[key], flat = script, flat + [task]
            keys.append(key)
    trajs = run_episodes(ScriptedPolicy(tok, scripts), tok, env, flat, CFG, keys=keys,
                         groups=[int(k.split(".")[0]) for k in keys])
    out, at = [], 0
    for members in scripts_per_task:
        out.append(trajs[at:at + len(members)])
        at += len(members)
    return out, env


def test_a_group_no_sample_passed_gets_a_passing_oracle_episode_in_place_of_its_last():
    tok, fam = byte_tokenizer(), get_family("terminal")
    tasks = fam.make_split("train", 2, 1, None)
    null = [format_call("submit")]
    oracle = scripts_for(tasks[1], "reference")[0]
    groups, env = _sampled(tok, fam, tasks, [[null, null, null], [oracle, null, null]])
    assert not any(t.info["passed"] for t in groups[0]) and groups[1][0].info["passed"]
    before = copy.deepcopy(groups)

    assert guide(groups, tasks, tok, env, CFG, "reference", version=3) == 1
    demo = groups[0][-1]
    assert demo.info["guided"] and demo.info["passed"] and demo.reward > 0 and demo.group == before[0][-1].group
    assert [tok.decode(t.completion_ids[:-1]) for t in demo.turns] == scripts_for(tasks[0], "reference")[0]
    assert all(math.isnan(x) for t in demo.turns for x in t.logprobs)
    assert all(v == 3 for t in demo.turns for v in t.versions)
    assert groups[0][:2] == before[0][:2] and groups[1] == before[1]  # only the failed group's last sample changes


def test_no_guidance_where_the_demonstration_cannot_run_to_its_submit():
    tok, fam = byte_tokenizer(), get_family("terminal")
    tasks = fam.make_split("train", 1, 1, None)
    groups, env = _sampled(tok, fam, tasks, [[[format_call("submit")]] * 2])
    short = AgentConfig(max_turns=1, max_tokens=10_000_000)  # every reference needs a call before its submit
    assert guide(groups, tasks, tok, env, short, "reference") == 0
    assert not any(t.info.get("guided") for t in groups[0])


def _groups(tok, behaviour):
    prompt = tok("<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n").input_ids
    group = []
    for ids, r in [([5, 6, 7], 1.0), ([20, 21], 0.0), ([30, 31, 32, 33], 0.0), ([40, 41], 0.0)]:
        group.append(Trajectory([Turn(prompt, ids, [behaviour] * len(ids), [0] * len(ids), [1] * len(ids))], r, 0))
    return [group]


def test_tokens_no_sampler_wrote_train_as_on_policy():
    """NaN behaviour log-probs (a demonstration) get importance weight 1: with a cap on the
    weights the update equals the uncorrected one, and the gap metric stays finite."""
    base, tok = load_policy("tiny-llama")

    def step(groups, **algo):
        model = copy.deepcopy(base)
        trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.0, **algo), TrainConfig(autocast="none", lr=1e-3))
        m = trainer.step(groups)
        return m, [p.detach().clone() for p in model.parameters()]

    m1, p1 = step(_groups(tok, float("nan")), tis_cap=2.0)
    m2, p2 = step(_groups(tok, -0.5), tis_cap=None)
    assert math.isfinite(m1["loss"]) and m1["logprob_gap"] == 0.0 and m1["grad_norm"] > 0
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    for a, b in zip(p1, p2):
        assert torch.allclose(a, b, atol=1e-6)
    # log-probs 0 from a real sampler: each token's weight is min(pi, 2), far below 1
    m3, _ = step(_groups(tok, 0.0), tis_cap=2.0)
    assert m3["grad_norm"] < 0.5 * m1["grad_norm"]


def test_step_metrics_count_sampled_episodes_only():
    def traj(passed, guided=False):
        info = {"passed": passed, "submitted": True, "turns": 2, "ended": "done"}
        if guided:
            info["guided"] = True
        return Trajectory([Turn([1], [2, 3], [0.0, 0.0], [0, 0], [1, 1])], float(passed), 0, info)

    groups = [[traj(False), traj(False), traj(True, guided=True)], [traj(True), traj(False), traj(False)]]
    gen = {"timing/gen": 1.0, "timing/score": 1.0, "gen_tokens": 10}
    m = _step_metrics(groups, gen, {"reward": 2 / 6, "num_tokens": 4}, 1.0)
    assert m["pass_rate"] == pytest.approx(1 / 5) and m["reward"] == pytest.approx(1 / 5) and m["guidance/demos"] == 1


def test_guidance_needs_grpo_and_an_oracle():
    cfg = RunConfig.model_validate({"name": "g", "task": {"family": "terminal"}, "algo": {"name": "ppo"},
                                    "rollout": {"guidance": "reference"}})
    with pytest.raises(LonghaulError, match="algo.name=grpo only"):
        check_runtime(cfg)
    fam = get_family("terminal")
    tasks = fam.make_split("train", 2, 1, None)
    check_guidance([Part(None, fam, tasks, [], 64)], "reference")
    bare = [copy.copy(t) for t in tasks]
    for t in bare:
        object.__setattr__(t, "reference", ())
    with pytest.raises(LonghaulError, match="has no oracle"):
        check_guidance([Part(None, fam, bare, [], 64)], "reference")
    with pytest.raises(LonghaulError, match="no workspace family"):
        check_guidance([Part(None, get_family("funcgen"), [], [], 64)], "reference")
