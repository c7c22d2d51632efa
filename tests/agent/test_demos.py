"""Verified multi-turn demonstrations: every row passes its hidden checks in the real sandbox,
repairs show a real failure before the fix, held-out tasks never appear, the rows train through
the SFT encoder with loss on assistant turns only, and bad requests get one-line errors."""

from dataclasses import replace

import pytest

from longhaul.agent.demos import build_demos, scripts_for
from longhaul.envs import get_family
from longhaul.envs.registry import Family
from longhaul.envs.workspace import failed_output
from longhaul.errors import LonghaulError
from longhaul.models.byte_tokenizer import byte_tokenizer
from longhaul.rl.data import encode_messages


def _check_rows(rows, family):
    assert rows
    for r in rows:
        msgs = r["messages"]
        assert [m["role"] for m in msgs[:2]] == ["system", "user"] and msgs[-1]["role"] == "assistant"
        assert '"submit"' in msgs[-1]["content"]
        assert r["family"] == family and r["task_id"].startswith(f"{family}/") and r["turns"] >= 2
        held = {t.task_id for t in get_family(family).make_split("heldout", 50, 1, None)}
        assert r["task_id"] not in held
        if r["repair"]:
            obs = [m["content"] for m in msgs if m["role"] in ("tool", "user")]
            assert any(failed_output(o) for o in obs), "a repair row shows a real failure"


@pytest.mark.parametrize("family,n", [("terminal", 6), ("multistep", 4)])
def test_demonstrations_pass_and_vary(family, n):
    rows = build_demos(get_family(family), n)
    _check_rows(rows, family)
    variants = {r["variant"] for r in rows}
    assert variants == {"reference", "explore", "repair"}
    by_task = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    some = next(v for v in by_task.values() if len(v) >= 2)
    assert len({tuple(m["content"] for m in r["messages"]) for r in some}) == len(some), "variants differ"


def test_bugfix_repairs_each_strategy_fail_then_pass():
    fam = get_family("bugfix")
    task = fam.make_split("train", 1, 1, None)[0]
    for name in ("bad_context", "wrong_edit", "bad_path"):
        from longhaul.agent import demos

        got = demos.STRATEGIES[name](task, __import__("random").Random(0))
        assert got is not None, name
    rows = build_demos(fam, 2, variants=("repair",))
    _check_rows(rows, "bugfix")
    assert all(r["repair"] for r in rows)


def test_rows_encode_with_loss_on_assistant_turns_only():
    rows = build_demos(get_family("terminal"), 2, variants=("repair",))
    tok = byte_tokenizer()
    ids, mask = encode_messages(tok, rows[0]["messages"])
    assert len(ids) == len(mask) and 0 < sum(mask) < len(mask)
    text = tok.decode([i for i, m in zip(ids, mask) if m])
    for m in rows[0]["messages"]:
        if m["role"] == "assistant":
            assert m["content"] in text
        elif m["role"] == "tool" and len(m["content"]) > 20:
            assert m["content"] not in text, "tool output is masked out"


def test_bad_requests_get_one_line_errors():
    terminal = get_family("terminal")
    with pytest.raises(LonghaulError, match="single-turn"):
        build_demos(get_family("funcgen"), 2)
    with pytest.raises(LonghaulError, match="train split only"):
        build_demos(terminal, 2, split="heldout")
    with pytest.raises(LonghaulError, match="unknown demonstration variant 'x'"):
        build_demos(terminal, 2, variants=("x",))
    no_oracle = replace(terminal, name="plain", make_split=lambda *a: [replace(t, reference=()) for t in terminal.make_split(*a)])
    assert isinstance(no_oracle, Family)
    with pytest.raises(LonghaulError, match="has no oracle"):
        build_demos(no_oracle, 2)
    with pytest.raises(LonghaulError, match="unknown demonstration variant"):
        scripts_for(terminal.make_split("train", 1, 1, None)[0], "bogus")


def test_messages_rows_without_an_assistant_turn_are_refused():
    with pytest.raises(LonghaulError, match="no assistant message"):
        encode_messages(byte_tokenizer(), [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}])


def test_sft_on_demonstrations_trains_and_skips_only_whole_over_long_episodes(tmp_path):
    import json

    from longhaul.config import load_config
    from longhaul.runtime import train

    rows = build_demos(get_family("terminal"), 4)
    lens = sorted(len(encode_messages(byte_tokenizer(), r["messages"])[0]) for r in rows)
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def cfg(max_length, name):
        return load_config(None, [f"name={name}", f"output_dir={tmp_path}", "model.name=tiny-llama", "model.context_length=8192",
                                  "algo.name=sft", f"data.path={path}", f"data.max_length={max_length}", "data.batch_size=2",
                                  "data.heldout_fraction=0.25", "data.packing=true", "train.steps=2", "train.lr=1e-3",
                                  "train.micro_batch=2", "train.autocast=none", "log.progress=false", "log.tensorboard=false"])

    out = train(cfg(lens[len(lens) // 2], "half"))  # the longer half is skipped whole, never cut
    assert out["heldout"]["after"]["heldout/loss"] < out["heldout"]["before"]["heldout/loss"]
    with pytest.raises(LonghaulError, match=rf"every multi-turn row .* shortest has {lens[0]}"):
        train(cfg(lens[0] - 1, "none"))
