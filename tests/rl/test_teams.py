"""Team episodes grouped by (task, role) for GRPO: real scripted team episodes in the sandbox,
the trainer's own selection with the turn-level estimator, checked against a plain loop."""

import pytest
import torch

from longhaul.agent.loop import AgentConfig, ScriptedPolicy
from longhaul.agent.team import run_team
from longhaul.agent.workflows import load_workflow
from longhaul.config import AlgoConfig, TrainConfig
from longhaul.envs.tools import format_call
from longhaul.envs.workspace import HIDDEN_DIR, WorkspaceEnv, WorkspaceTask
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer
from longhaul.rl.teams import role_groups

SRC = "def add(a, b):\n    return a - b\n"
FIX = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
HIDDEN = "from m import add\n\n\ndef test_hidden():\n    assert add(1, 1) == 2\n"


def task(i):
    return WorkspaceTask(f"t/v1/{i}", "t", "1", i, 1, "x", "Fix add in m.py.", {"m.py": SRC}, {"test_h.py": HIDDEN},
                         f"python3 -m pytest -q -o pythonpath=. {HIDDEN_DIR}")


class CrashOn:
    concurrent = True

    def __init__(self, inner, key):
        self.inner, self.key = inner, key

    def generate(self, prompts, sampling, keys):
        if keys[0] == self.key:
            raise RuntimeError("worker lost")
        return self.inner.generate(prompts, sampling, keys)


def reference_advantages(trajs):
    """Leave-one-out over the others of the group that had a k-th reply (outcome at the last
    reply, gamma 1); infra errors take the others' mean and get none."""
    ok = [t for t in trajs if t.info["ended"] != "infra_error"]
    out = {}
    for j, t in enumerate(trajs):
        if t not in ok or not t.turns:
            continue
        others = [o for o in trajs if o is not t]
        filled = [o.reward if o in ok else sum(x.reward for x in ok if x is not o) / len([x for x in ok if x is not o])
                  for o in others]
        lens = [max(1, len(o.turns)) if o in ok else 1 for o in others]
        for k in range(len(t.turns)):
            reached = [r for r, n in zip(filled, lens) if n > k]
            base = sum(reached) / len(reached) if reached else sum(filled) / len(filled)
            out[(j, k)] = t.reward - base
    return out


def test_role_groups_give_turn_level_advantages_by_role_and_turn():
    tok = load_policy("tiny-llama")[1]
    wf = load_workflow("navigator_driver")
    fix = [format_call("read_file", path="m.py"), format_call("apply_patch", patch=FIX), format_call("submit")]
    lazy = [format_call("list_dir"), format_call("submit")]
    plans = {0: [fix, lazy, fix], 1: [lazy, fix, fix]}  # per task: the drivers of its three episodes
    scripts, episodes = {}, []
    for g, drivers in plans.items():
        for e, driver in enumerate(drivers):
            name = f"{g}.{e}"
            episodes.append(name)
            scripts[f"{name}:navigator"] = [format_call("list_dir"), format_call("message", to="driver", text="Fix add.")]
            scripts[f"{name}:driver"] = driver
    pol = CrashOn(ScriptedPolicy(tok, scripts), "1.2:driver")  # task 1's third episode breaks
    out = run_team(wf, {"navigator": pol, "driver": pol}, tok, lambda t: WorkspaceEnv(), [task(g) for g in plans for _ in range(3)],
                   AgentConfig(max_tokens=100_000, max_new_tokens=4096), episodes=episodes, groups=[0, 0, 0, 1, 1, 1])
    assert [e[1].reward for e in out] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0] and out[5][0].info["ended"] == "infra_error"
    groups, keys = role_groups(out)
    assert keys == [(0, "navigator"), (0, "driver"), (1, "navigator"), (1, "driver")]
    assert all(t.info["role"] == role for g, (_, role) in zip(groups, keys) for t in g)

    model = load_policy("tiny-llama")[0]
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(advantage="turn_level", drop_zero_std_groups=False),
                          TrainConfig(autocast="none"))
    _, _, seqs, advs, sizes = trainer.select(groups)
    assert sizes == [3, 3, 2, 2]  # the broken episode trains neither role
    got, s = {}, 0
    for i, g in enumerate(groups):
        for j, t in enumerate(g):
            if t.info["ended"] == "infra_error":
                continue
            seq, adv = seqs[s], advs[s]
            s += 1
            for k, m, a in zip(seq.turn_index, seq.loss_mask, adv):
                if m:
                    got[(i, j, k)] = a
    for i, g in enumerate(groups):
        for (j, k), want in reference_advantages(g).items():
            assert got[(i, j, k)] == pytest.approx(want, abs=1e-6), (keys[i], j, k)
    # the driver's two replies of a lazy episode and three of a fixing one: different baselines by turn
    assert got[(1, 1, 0)] == pytest.approx(-1.0) and got[(1, 0, 2)] == pytest.approx(0.0)
    assert torch.isfinite(torch.tensor([a for adv in advs for a in adv])).all()
