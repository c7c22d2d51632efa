"""Multi-turn trajectories in the trainer: segments become masked sequences; environment
tokens never carry loss; infra errors are neither scored nor trained on; and a real multi-turn
run (agent loop + workspace sandbox) trains end to end."""

import copy
import json

import pytest
import torch

from longhaul.config import AlgoConfig, RunConfig, TrainConfig
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer
from longhaul.types import Trajectory, Turn


def _two_turns(prompt, a, obs, b, version=0):
    t1 = Turn(prompt, a, [-0.5] * len(a), [version] * len(a), [1] * len(a))
    t2 = Turn(prompt + a + obs, b, [-0.7] * len(b), [version + 1] * len(b), [1] * len(b))
    return [t1, t2]


def test_sequences_join_a_segment_and_mask_the_environment_tokens():
    turns = _two_turns([1, 2, 3], [10, 11], [90, 91, 92], [12])
    turns.append(Turn([7, 8], [13, 14], [-0.1, -0.2], [5, 5], [1, 1], "length", segment=1))
    (s0, s1) = Trajectory(turns, 1.0, 0).sequences()
    assert s0.prompt_ids == [1, 2, 3] and s0.completion_ids == [10, 11, 90, 91, 92, 12]
    assert s0.loss_mask == [1, 1, 0, 0, 0, 1] and s0.logprobs == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.7]
    assert (s1.prompt_ids, s1.completion_ids, s1.loss_mask, s1.finish_reason) == ([7, 8], [13, 14], [1, 1], "length")
    single = Trajectory([Turn([1], [2, 3], [-1.0, -1.0], [0, 0], [1, 1])], 0.0, 0).sequences()
    assert len(single) == 1 and single[0].completion_ids == [2, 3] and single[0].loss_mask == [1, 1]


def _step(model, tok, groups, **algo):
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.0, **algo), TrainConfig(micro_batch=2, autocast="none", lr=1e-3))
    m = trainer.step(groups)
    return m, {n: p.detach().clone() for n, p in model.named_parameters()}


def _groups(tok, env_mask=0):
    prompt = tok("<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n").input_ids
    obs = tok("<|im_end|>\n<|im_start|>tool\nerror: nope<|im_end|>\n<|im_start|>assistant\n").input_ids
    multi, flat = [], []
    for j, (a, b, r) in enumerate([([5, 6, 7], [8, 9], 1.0), ([20, 21], [22, 23, 24], 0.0), ([30], [31], 0.0), ([40, 41], [42], 1.0)]):
        turns = _two_turns(prompt, a, obs, b)
        multi.append(Trajectory(turns, r, 0))
        ids = a + obs + b
        mask = [1] * len(a) + [env_mask] * len(obs) + [1] * len(b)
        flat.append(Trajectory([Turn(prompt, ids, [-0.5] * len(ids), [0] * len(ids), mask)], r, 0))
    return [multi], [flat]


def test_a_multi_turn_trajectory_updates_like_its_masked_sequence_and_the_mask_matters():
    base, tok = load_policy("tiny-llama")
    multi, flat = _groups(tok)
    m1, p1 = _step(copy.deepcopy(base), tok, multi)
    m2, p2 = _step(copy.deepcopy(base), tok, flat)
    assert m1["num_tokens"] == m2["num_tokens"] == sum(len(t.turns[0].completion_ids) + len(t.turns[1].completion_ids) for t in multi[0])
    for n in p1:
        assert torch.allclose(p1[n], p2[n], atol=1e-6), f"{n}: {(p1[n] - p2[n]).abs().max()}"
    _, unmasked = _groups(tok, env_mask=1)
    _, p3 = _step(copy.deepcopy(base), tok, unmasked)
    assert any(not torch.allclose(p1[n], p3[n], atol=1e-6) for n in p1)  # training on tool output would differ


def test_infra_errors_move_no_baseline_and_are_not_trained_on():
    base, tok = load_policy("tiny-llama")
    multi, _ = _groups(tok)
    broken = copy.deepcopy(multi)
    broken[0].append(Trajectory(broken[0][0].turns, 0.0, 0, {"ended": "infra_error"}))
    m1, p1 = _step(copy.deepcopy(base), tok, multi, advantage="dr_grpo")
    m2, p2 = _step(copy.deepcopy(base), tok, broken, advantage="dr_grpo")
    assert m2["num_trained_seqs"] == m1["num_trained_seqs"] == 4
    # the group mean (dr_grpo's baseline) is unchanged when the infra error holds the mean of the others
    for n in p1:
        assert torch.allclose(p1[n], p2[n], atol=1e-6), f"{n}: {(p1[n] - p2[n]).abs().max()}"


def test_turn_level_advantages_reach_each_turns_tokens():
    """Per-turn rewards: the first turn of episodes 0 and 1 earned 0.5; the tokens of each turn
    must carry that turn's leave-one-out advantage, not the episode's."""
    base, tok = load_policy("tiny-llama")
    multi, _ = _groups(tok)
    for t, r1 in zip(multi[0], [0.5, 0.5, 0.0, 0.0]):
        t.turns[0].reward = r1
    trainer = GRPOTrainer(base, tok.pad_token_id, AlgoConfig(kl_coef=0.0, advantage="turn_level"), TrainConfig(autocast="none"))
    rewards, _, seqs, advs, _ = trainer.select(multi)
    outcome = [1.0, 0.0, 0.0, 1.0]
    first = [r1 + o for r1, o in zip([0.5, 0.5, 0.0, 0.0], outcome)]  # return-to-go from turn 0
    for j, (s, a) in enumerate(zip(seqs, advs)):
        want0 = first[j] - (sum(first) - first[j]) / 3
        want1 = outcome[j] - (sum(outcome) - outcome[j]) / 3
        n0 = len(multi[0][j].turns[0].completion_ids)
        assert a[:n0] == pytest.approx([want0] * n0) and a[-1] == pytest.approx(want1)
    m = trainer.step(multi)
    assert m["num_trained_seqs"] == 4 and m["grad_norm"] > 0


def test_training_runs_on_a_multi_turn_family_end_to_end(tmp_path, monkeypatch):
    from pathlib import Path

    from longhaul.eval.envcheck import run_envcheck
    from longhaul.runtime.online import run_training

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "plugins"))
    monkeypatch.chdir(tmp_path)
    run_envcheck(["wordtasks:CountLines"], n=2)
    cfg = RunConfig.model_validate({
        "name": "mt", "model": {"name": "tiny-llama", "context_length": 4096},  # byte tokens: the tool prompt is ~1,100
        "task": {"family": "wordtasks:CountLines"},
        "rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 8, "max_turns": 2, "dtype": "float32"},
        "train": {"steps": 1, "autocast": "none"}, "eval": {"n_tasks": 1, "max_new_tokens": 8, "max_turns": 2},
        "log": {"progress": False, "tensorboard": False}})
    res = run_training(cfg)
    rows = [json.loads(x) for x in (Path(res["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 1 and rows[0]["timing/gen"] > 0 and rows[0]["timing/score"] > 0
    assert rows[0]["completions/mean_length"] > 0
    assert (Path(res["run_dir"]) / "report.html").exists() and res["comparison"]["base"]["n"] == 1
    with pytest.raises(Exception, match="over the model context"):  # the tool prompt alone does not fit 1,024
        run_training(cfg.model_copy(update={"name": "mt2", "model": cfg.model.model_copy(update={"context_length": 1024})}))


def test_guidance_puts_a_passing_oracle_episode_into_a_failed_group_end_to_end(tmp_path, monkeypatch):
    """A random model fails every episode; with rollout.guidance each step's group gets the task's
    oracle episode, which passes, and the step trains on it while pass_rate counts samples only."""
    from pathlib import Path

    from longhaul.eval.envcheck import run_envcheck
    from longhaul.runtime.online import run_training

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "plugins"))
    monkeypatch.chdir(tmp_path)
    run_envcheck(["wordtasks:CountLines"], n=2)
    cfg = RunConfig.model_validate({
        "name": "guided", "model": {"name": "tiny-llama", "context_length": 4096},
        "task": {"family": "wordtasks:CountLines"},
        "rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 160, "max_turns": 2, "dtype": "float32",
                    "guidance": "reference", "max_idle_turns": 1},
        "train": {"steps": 2, "autocast": "none"}, "eval": {"before_after": False},
        "log": {"progress": False, "tensorboard": False}})
    res = run_training(cfg)
    rows = [json.loads(x) for x in (Path(res["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["guidance/demos"] for r in rows] == [1, 1], rows
    assert all(r["pass_rate"] == 0.0 and r["num_trained_seqs"] >= 2 and r["grad_norm"] > 0 for r in rows), rows
