import pytest

from longhaul.config import RunConfig, load_config
from longhaul.errors import LonghaulError


def test_yaml_plus_dotted_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\ntrain:\n  steps: 3\n")
    cfg = load_config(p, ["train.lr=2e-5", "rollout.group_size=4", "task.subfamilies=[strings.reverse]"])
    assert cfg.name == "x" and cfg.train.steps == 3 and cfg.train.lr == 2e-5
    assert cfg.rollout.group_size == 4 and cfg.task.subfamilies == ["strings.reverse"]


def test_unknown_key_names_it_and_suggests(tmp_path):
    with pytest.raises(LonghaulError, match=r"unknown config key 'train.lrr'; did you mean train.lr\?"):
        load_config(None, ["train.lrr=1"])
    p = tmp_path / "c.yaml"
    p.write_text("rollot:\n  group_size: 2\n")
    with pytest.raises(LonghaulError, match=r"'rollot'; did you mean rollout\?"):
        load_config(p)


def test_bad_values_and_files(tmp_path):
    with pytest.raises(LonghaulError, match="train.steps"):
        load_config(None, ["train.steps=-1"])
    with pytest.raises(LonghaulError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(LonghaulError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(LonghaulError, match="key.sub=value"):
        load_config(None, ["train.steps"])
    # a check across sections: one line that names both keys, not the whole tree
    with pytest.raises(LonghaulError, match=r"^config: runtime.inflight_kv keep needs rollout.sampler engine: [^{]*$"):
        load_config(None, ["rollout.sampler=vllm", "runtime.inflight_kv=keep"])


def test_examples_validate():
    for name in ("quickstart", "tiny_grpo"):
        assert isinstance(load_config(f"examples/{name}.yaml"), RunConfig)
