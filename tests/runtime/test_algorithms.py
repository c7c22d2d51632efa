"""The algorithm registry: `algo.name` accepts exactly its names, a registered algorithm trains
through `longhaul.runtime.train` like a built-in, and bad registrations or drivers get one line."""

import json

import pytest

from longhaul.config import load_config
from longhaul.errors import LonghaulError
from longhaul.runtime import train
from longhaul.runtime.algorithms import ALGORITHMS, register_algorithm
from longhaul.runtime.offline import run_offline
from longhaul.runtime.online import online_builder


def test_config_names_come_from_the_registry():
    assert {"grpo", "ppo", "onpolicy_distill", "sft", "rm", "dpo", "distill"} <= set(ALGORITHMS)
    for name in ALGORITHMS:
        assert load_config(None, [f"algo.name={name}"]).algo.name == name
    with pytest.raises(LonghaulError, match=r"config key 'algo.name': unknown algorithm 'grpoo'; did you mean 'grpo'\?"):
        load_config(None, ["algo.name=grpoo"])


def test_every_builtin_builder_imports():
    for algo in ALGORITHMS.values():
        assert callable(algo.load()) or hasattr(algo.load(), "build"), algo.name


def test_a_registered_algorithm_trains_like_a_builtin(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"say {i}"}, {"role": "assistant", "content": w}]}) + "\n"
                            for i, w in enumerate(["apple", "river", "stone", "cloud", "amber", "maple"])))
    register_algorithm("my_sft", "offline", "longhaul.runtime.offline:SFT")
    try:
        cfg = load_config(None, ["name=mine", f"output_dir={tmp_path}", "model.name=tiny-llama", "algo.name=my_sft", f"data.path={rows}",
                                 "data.batch_size=2", "train.steps=2", "train.micro_batch=2", "train.autocast=none",
                                 "log.progress=false", "log.tensorboard=false"])
        out = train(cfg)
        assert [json.loads(x)["step"] for x in (tmp_path / "mine" / "metrics.jsonl").read_text().splitlines()][-1] == 2
        assert out["heldout"]["after"]
    finally:
        ALGORITHMS.pop("my_sft")


def test_bad_registrations_and_drivers_get_one_line():
    with pytest.raises(LonghaulError, match="driver 'batch' is not 'online' or 'offline'"):
        register_algorithm("x", "batch", "a.b:c")
    with pytest.raises(LonghaulError, match="builder 'a.b' is not 'package.module:attribute'"):
        register_algorithm("x", "online", "a.b")
    register_algorithm("gone", "online", "longhaul.nowhere:trainer")
    try:
        with pytest.raises(LonghaulError, match="algorithm 'gone': cannot import its builder 'longhaul.nowhere:trainer'"):
            online_builder("gone")
    finally:
        ALGORITHMS.pop("gone")
    with pytest.raises(LonghaulError, match="algo.name=sft learns from a dataset"):
        online_builder("sft")
    with pytest.raises(LonghaulError, match="algo.name=grpo learns from its own rollouts"):
        run_offline(load_config(None, ["algo.name=grpo"]))
    assert "x" not in ALGORITHMS
