"""/metrics under vLLM's names with the longhaul: prefix, counting exactly what requests did;
and serving weights: a sha256 manifest, file:// and fsspec memory:// sources, corruption
refused, safetensors memory-mapped and equal to safetensors' own loader."""

import re

import fsspec
import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from longhaul.errors import LonghaulError
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.serve.weights import MANIFEST, fetch, load_model, mmap_safetensors, write_manifest
from tests.serve.conftest import running_server

NAMES = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total",
         "prefix_cache_hits_total", "prompt_tokens_total", "generation_tokens_total", "time_to_first_token_seconds_count",
         "inter_token_latency_seconds_count", "e2e_request_latency_seconds_count", "request_queue_time_seconds_count",
         "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"]


def scrape(base) -> dict[str, float]:
    out = {}
    for line in httpx.get(base + "/metrics").text.splitlines():
        m = re.match(r'longhaul:(\w+)(\{[^}]*\})? ([-+.\w]+)$', line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def value(metrics, name, **labels) -> float:
    want = {"model_name": "tiny-llama", **labels}
    for k, v in metrics.items():
        base, _, rest = k.partition("{")
        got = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if base == name and got == want:
            return v
    return 0.0


def test_metrics_count_what_requests_did(tmp_path):
    with running_server(tmp_path, api_keys=["k-m"]) as (base, _):
        before = scrape(base)
        assert all(value(before, n) is not None for n in NAMES) and all(any(k.startswith(n) for k in before) for n in NAMES)
        body = {"messages": [{"role": "user", "content": "the same prompt, twice over, for the prefix cache"}], "max_tokens": 7,
                "min_tokens": 7}
        usage = [httpx.post(base + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer k-m"}, timeout=30).json()["usage"]
                 for _ in range(2)]
        after = scrape(base)
    d = lambda n, **kw: value(after, n, **kw) - value(before, n, **kw)  # noqa: E731
    assert d("generation_tokens_total") == 14 and d("prompt_tokens_total") == 2 * usage[0]["prompt_tokens"]
    assert d("api_key_tokens_total", key="key-1", kind="generation") == 14
    assert d("api_key_tokens_total", key="key-1", kind="prompt") == 2 * usage[0]["prompt_tokens"]
    assert d("e2e_request_latency_seconds_count") == 2 and d("time_to_first_token_seconds_count") == 2
    assert d("inter_token_latency_seconds_count") == 12 and d("request_queue_time_seconds_count") == 2
    assert d("request_success_total", finished_reason="length") == 2
    assert d("prefix_cache_hits_total") >= 16  # the second request found the first's full blocks
    assert value(after, "num_requests_running") == 0 and 0 <= value(after, "kv_cache_usage_perc") <= 1
    assert d("http_requests_total", path="/v1/chat/completions", status="200") == 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model, tok = load_policy("tiny-llama")
    d = tmp_path_factory.mktemp("weights")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    write_manifest(d)
    return d


def test_mmap_equals_safetensors_and_is_copy_on_write(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(4, 2).to(torch.bfloat16)}
    path = tmp_path / "t.safetensors"
    save_file(tensors, str(path))
    mapped, ref = mmap_safetensors(path), load_file(str(path))
    assert set(mapped) == set(ref) and all(torch.equal(mapped[k], ref[k]) and mapped[k].dtype == ref[k].dtype for k in ref)
    mapped["a"].zero_()  # a private mapping: the file keeps its bytes
    assert torch.equal(load_file(str(path))["a"], tensors["a"])


def test_file_and_memory_urls_serve_the_same_model(model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("LONGHAUL_HOME", str(tmp_path / "home"))
    fs = fsspec.filesystem("memory")
    for f in model_dir.iterdir():
        fs.pipe(f"/models/tiny/{f.name}", f.read_bytes())
    local = fetch("memory://models/tiny")
    assert local != model_dir and (local / MANIFEST).is_file() and fetch("memory://models/tiny") == local  # cached
    ids = [[5, 6, 7, 8]]
    params = SamplingParams(max_tokens=12, temperature=0)
    hf, tok = load_policy("tiny-llama")
    ref = LLMEngine(hf, tokenizer=tok, num_kv_blocks=16).generate(ids, params)[0].token_ids
    for source in (f"file://{model_dir}", "memory://models/tiny", str(model_dir)):
        model, tok = load_model(source)
        assert LLMEngine(model, tokenizer=tok, num_kv_blocks=16).generate(ids, params)[0].token_ids == ref


def test_corrupt_or_unmanifested_weights_are_refused(model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("LONGHAUL_HOME", str(tmp_path / "home"))
    fs = fsspec.filesystem("memory")
    for f in model_dir.iterdir():
        data = f.read_bytes()
        fs.pipe(f"/bad/{f.name}", data[:-1] + bytes([data[-1] ^ 1]) if f.suffix == ".safetensors" else data)
    with pytest.raises(LonghaulError, match="does not match its manifest"):
        fetch("memory://bad")
    assert not list((tmp_path / "home" / "weights").glob("[!.]*"))  # nothing half-written is left to be used
    with pytest.raises(LonghaulError, match="manifest"):
        fetch("memory://nowhere")
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in model_dir.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "config.json").write_text((copy / "config.json").read_text().replace('"silu"', '"gelu"'))  # same size
    with pytest.raises(LonghaulError, match="config.json.*does not match its sha256"):
        fetch(str(copy))


def test_a_server_with_a_speculative_config_counts_drafts(tmp_path):
    from longhaul.serve import ServeConfig

    with pytest.raises(ValueError, match="num_speculative_tokens"):
        ServeConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 0})
    with running_server(tmp_path, engine_process=False, speculative_config={"method": "ngram", "num_speculative_tokens": 3}) as (base, _):
        body = {"prompt": "one two one two one two one two", "max_tokens": 16, "temperature": 0, "model": "tiny-llama"}
        r = httpx.post(base + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        after = scrape(base)
    assert value(after, "spec_decode_num_draft_tokens_total") > 0


def test_the_offload_tier_shows_its_hits_in_metrics(tmp_path):
    from longhaul.inference.kv_cache import KVCache

    mcfg = load_policy("tiny-llama")[0].config
    per_token = KVCache.bytes_per_token(mcfg.num_hidden_layers, mcfg.num_key_value_heads,
                                        mcfg.hidden_size // mcfg.num_attention_heads, torch.float32)
    pool_gb = 48 * 16 * per_token / 2**30  # 48 blocks: a few requests fill it
    with running_server(tmp_path, engine_process=False, kv_cache_memory_gb=pool_gb, kv_offload_memory_gb=0.05) as (base, _):
        history = [{"role": "user", "content": "read the file parse.py and tell me which test fails, " * 3}]
        ask = lambda msgs: httpx.post(base + "/v1/chat/completions", timeout=60,  # noqa: E731
                                      json={"messages": msgs, "max_tokens": 4, "temperature": 0}).json()
        reply = ask(history)["choices"][0]["message"]["content"]
        for i in range(6):  # other clients' traffic evicts the history from the pool
            ask([{"role": "user", "content": f"an unrelated question number {i} about something else, " * 3}])
        ask(history + [{"role": "assistant", "content": reply}, {"role": "user", "content": "and then?"}])
        after = scrape(base)
    assert value(after, "kv_offload_host_hits_total") >= 64 and value(after, "kv_offload_stores_total") > 0
    assert value(after, "kv_offload_host_bytes") > 0 and value(after, "kv_offload_disk_bytes") == 0
