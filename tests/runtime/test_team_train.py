"""`longhaul team train` end to end on a tiny random model and the real sandbox: demonstrations,
SFT per role, one GRPO step on team episodes, the three evaluations, per-role metrics, a checkpoint
for every role; and a bad config refused in one line."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longhaul.config import validate_config
from longhaul.errors import LonghaulError
from longhaul.runtime.team_train import TeamTrainConfig, TeamTrainer, train_team
from tests.cli_main import run_main


def tiny(tmp_path, **over) -> TeamTrainConfig:
    tree = {"name": "team", "output_dir": str(tmp_path), "model": {"name": "tiny-llama", "context_length": 8192},
            "workflow": "navigator_driver", "family": "multistep", "policies": "per_role",
            "demos": {"tasks": 3, "variants": ["reference"]},
            "sft": {"data": {"batch_size": 2}, "train": {"steps": 1, "lr": 1e-3, "micro_batch": 2, "autocast": "none"}},
            "rl": {"rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 16},
                   "train": {"steps": 1, "micro_batch": 2, "autocast": "none"}},
            "eval": {"tasks": 2, "max_new_tokens": 16}, "isolate": False, **over}
    return validate_config(tree, TeamTrainConfig)


@pytest.mark.slow  # ~30 s: demos, SFT and an RL step of two tiny policies, then of one; the parts have fast tests
def test_a_per_role_team_trains_end_to_end_beside_a_single_agent(tmp_path):
    summary = train_team(tiny(tmp_path, compare=["single"]))
    run = tmp_path / "team"
    single = summary["compared"]["single"]
    page = (run / "report.html").read_text()
    assert "turn 1: navigator" in page and "Variants, on the same held-out tasks" in page and "rl vs single rl" in page
    assert "turn 1: agent" in (run / "single" / "report.html").read_text()
    assert list(single["stages"]) == ["base", "sft", "rl"] and set(single["stages"]["rl"]["roles"]) == {"agent"}
    assert {"rl_vs_single_rl"} == {k for k in single if "_vs_" in k}
    solo_rows = [json.loads(line) for line in (run / "single" / "demos.jsonl").read_text().splitlines()]
    assert solo_rows and {r["role"] for r in solo_rows} == {"agent"}
    assert json.loads((run / "single" / "eval_rl.json").read_text())["task_ids"] == json.loads(
        (run / "eval_rl.json").read_text())["task_ids"]  # paired: the same held-out tasks
    assert list(summary["stages"]) == ["base", "sft", "rl"]
    assert all(row["n"] == 2 and len(row["ci95"]) == 2 for row in summary["stages"].values())
    assert {"sft_vs_base", "rl_vs_sft", "rl_vs_base"} <= set(summary)
    rows = [json.loads(line) for line in (run / "demos.jsonl").read_text().splitlines()]
    assert {r["role"] for r in rows} == {"navigator", "driver"}
    for role in ("navigator", "driver"):  # each role's SFT saw only its own rows
        own = [json.loads(line) for line in (run / f"demos_{role}.jsonl").read_text().splitlines()]
        assert own and {r["role"] for r in own} == {role}
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for role in ("navigator", "driver"):
        assert {f"role/{role}/tokens", f"role/{role}/invalid_calls", f"role/{role}/reward_share"} <= set(m)
        assert f"policy/{role}/loss" in m  # one trainer per role's policy
    manifest = json.loads((run / "rl" / "team.json").read_text())
    assert manifest["policies"] == "per_role" and set(manifest["roles"]) == {"navigator", "driver"}
    assert manifest["roles"]["navigator"] != manifest["roles"]["driver"]
    assert all((Path(p) / "config.json").is_file() for p in manifest["roles"].values())


def test_bad_configs_are_refused_at_load(tmp_path):
    with pytest.raises(LonghaulError, match="policies"):
        tiny(tmp_path, policies="both")
    with pytest.raises(LonghaulError, match="unknown workflow 'pilots'"):
        TeamTrainer(tiny(tmp_path, workflow="pilots"))
    assert TeamTrainer(tiny(tmp_path, budgets={"max_turns": 3, "max_tokens": 500})).wf.max_turns == 3
    with pytest.raises(LonghaulError, match="max_turnz"):
        TeamTrainer(tiny(tmp_path, budgets={"max_turnz": 3}))
    with pytest.raises(LonghaulError, match="rl: .*group_size"):
        TeamTrainer(tiny(tmp_path, rl={"rollout": {"group_size": 1}}))
    with pytest.raises(LonghaulError, match="compare names 'per_role', this run's own policies"):
        tiny(tmp_path, compare=["single", "per_role"])
    with pytest.raises(LonghaulError, match="compare lists a variant twice"):
        tiny(tmp_path, compare=["single", "single"])
    with pytest.raises(LonghaulError, match="drop compare"):
        tiny(tmp_path, solo=True, compare=["shared"])
    with pytest.raises(LonghaulError, match="set rl.rollout.sampler to engine"):
        TeamTrainer(tiny(tmp_path, policies="adapters", rl={"rollout": {"sampler": "hf"}}))
    with pytest.raises(LonghaulError, match="set rl.train.lora_r above 0"):
        TeamTrainer(tiny(tmp_path, policies="adapters", rl={"train": {"lora_r": 0}}))
    single = tiny(tmp_path, compare=["single", "shared"]).variant("single")
    assert single.solo and single.policies == "shared" and single.compare == [] and single.run_dir == tmp_path / "team" / "single"
    assert [r.name for r in TeamTrainer(single).wf.roles] == ["agent"]


def test_a_policies_variant_starts_from_the_run_s_base_evaluation_and_demonstrations(tmp_path):
    trainer = TeamTrainer(tiny(tmp_path, compare=["single", "adapters"]))
    trainer.dir.mkdir(parents=True)
    for f in ("eval_base.json", "episodes_base.jsonl", "demos.jsonl"):
        (trainer.dir / f).write_text(f"{f} of the shared run\n")
    (trainer.dir / "eval_sft.json").write_text("{}")
    adapters = trainer.variant("adapters")
    assert adapters.cfg.policies == "adapters" and adapters.dir == trainer.dir / "adapters"
    for f in ("eval_base.json", "episodes_base.jsonl", "demos.jsonl"):
        assert (adapters.dir / f).read_text() == f"{f} of the shared run\n"
    assert not (adapters.dir / "eval_sft.json").exists()  # trained stages are the variant's own
    (adapters.dir / "demos.jsonl").write_text("its own\n")
    assert (trainer.variant("adapters").dir / "demos.jsonl").read_text() == "its own\n"  # never overwritten
    # one agent in place of the team: another workflow, so nothing carries over
    assert trainer.variant("single").cfg.solo and not (trainer.dir / "single").exists()


def test_an_adapter_s_sft_runs_at_the_adapter_learning_rate(tmp_path):
    demos = tmp_path / "demos.jsonl"
    full = TeamTrainer(tiny(tmp_path, sft={"train": {"lr": 1e-4}})).sft_config("navigator", "tiny-llama", demos)
    assert full.train.lr == 1e-4 and not full.train.lora_r
    adapter = TeamTrainer(tiny(tmp_path, policies="adapters", sft={"train": {"lr": 1e-4}})).sft_config("navigator", "tiny-llama", demos)
    assert adapter.train.lr == 1e-3 and adapter.train.lora_r == 16 and adapter.train.lora_alpha == 32
    mine = TeamTrainer(tiny(tmp_path, policies="adapters", adapter_sft={"train": {"lr": 3e-4, "lora_r": 8}}))
    assert (mine.sft_config("driver", "tiny-llama", demos).train.lr, mine.sft_config("driver", "tiny-llama", demos).train.lora_r) == (3e-4, 8)


def test_the_command_refuses_a_bad_config_in_one_line(tmp_path):
    cfg = tmp_path / "team.yaml"
    cfg.write_text("workflow: coder_tester\nfamily: humaneval\n")
    r = run_main("team", "train", str(cfg), cwd=tmp_path)
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == "error: family 'humaneval' is single-turn; a team shares a workspace: choose a workspace family"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # ~20 s: SFT of two adapters, an RL step on one engine, three evaluations
def test_one_adapter_per_role_over_one_base(tmp_path):
    summary = train_team(tiny(tmp_path, policies="adapters", rl={"rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 16},
                                                                 "train": {"steps": 1, "micro_batch": 2, "autocast": "none", "lora_r": 4}}))
    run = tmp_path / "team"
    assert list(summary["stages"]) == ["base", "sft", "rl"]
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    manifest = json.loads((run / "rl" / "team.json").read_text())
    assert manifest["policies"] == "adapters" and manifest["base"] == "tiny-llama"
    for role in ("navigator", "driver"):
        adapter = Path(manifest["roles"][role])
        assert adapter == run / "rl" / role / "adapter" and not (adapter / "config.json").exists()
        cfg = json.loads((adapter / "adapter_config.json").read_text())
        assert cfg["r"] == 4 and (adapter / "adapter_model.safetensors").is_file()
        sft = json.loads((run / "sft" / role / "adapter" / "adapter_config.json").read_text())
        assert sft["r"] == 4  # SFT trained the adapter RL goes on with, of the RL stage's rank
        before, after = (load_file(d / "adapter_model.safetensors") for d in (run / "sft" / role / "adapter", adapter))
        assert before.keys() == after.keys() and any(v.abs().max() > 0 for k, v in before.items() if "lora_B" in k)
        # RL goes on with the SFT adapter (a new one would have lora_B all zero): a tiny random team's
        # episodes all fail, so no group has a signal and the adapter comes out as it went in
        trained = m[f"policy/{role}/num_trained_seqs"] > 0
        assert any(not torch.equal(before[k], after[k]) for k in before) == trained
    assert {"policy/navigator/loss", "policy/driver/loss"} <= set(m)


def test_each_role_s_adapter_wraps_a_copy_that_shares_the_base_weights():
    from longhaul.models import load_policy
    from longhaul.models.lora import apply_lora
    from longhaul.runtime.team_train import _sharing

    base, _ = load_policy("tiny-llama")
    twins = [apply_lora(_sharing(base), 4, 8, 0.0, ["q_proj", "v_proj"], "tiny-llama") for _ in range(2)]
    ptrs = {n: p.data_ptr() for n, p in base.named_parameters()}
    for twin in twins:
        shared = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p.data_ptr()
                  for n, p in twin.named_parameters() if "lora_" not in n}
        assert shared == ptrs  # every base weight is the base's own tensor, not a copy
    a, b = ({n for n, p in t.named_parameters() if p.requires_grad} for t in twins)
    assert a == b and a and all("lora_" in n for n in a)
    assert not any("lora_" in n for n, _ in base.named_parameters())  # the base itself stays plain
    assert twins[0].base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight is not \
        twins[1].base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
