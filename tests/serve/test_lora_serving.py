"""LoRA adapters served beside the base model (`--lora-modules NAME=DIR`), through the real
`openai` client against a real server on loopback whose engine runs in its own process: the
adapter is a model id, its greedy replies equal an engine holding the same adapter, and bad
adapter options are one line before anything loads."""

import copy

import openai
import pytest
import torch

from longhaul.cli import main
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.models.lora import apply_lora
from longhaul.serve.openai_api.chat import render
from longhaul.serve.openai_api.protocol import ChatCompletionRequest
from tests.serve.conftest import running_server

MSG = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    model, _ = load_policy("tiny-llama")
    peft = apply_lora(copy.deepcopy(model), 4, 8, 0.0, ["q_proj", "v_proj", "gate_proj", "down_proj"], "tiny-llama")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    out = tmp_path_factory.mktemp("adapter") / "coder"
    peft.save_pretrained(out)
    return out


def test_an_adapter_is_a_model_id_and_answers_as_its_engine_does(tmp_path, adapter):
    model, tok = load_policy("tiny-llama")
    ref = LLMEngine(model, tokenizer=tok, num_kv_blocks=64)
    ref.add_lora("coder", adapter)
    ids = render(tok, ChatCompletionRequest.model_validate({"messages": MSG}))
    want = {lora: ref.generate([ids], SamplingParams(max_tokens=12, temperature=0, lora=lora))[0].text for lora in (None, "coder")}
    assert want[None] != want["coder"]  # the adapter changes the reply
    with running_server(tmp_path, lora_modules={"coder": str(adapter)}) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        cards = {m.id: m for m in client.models.list().data}
        assert list(cards) == ["tiny-llama", "coder"] and cards["coder"].model_extra["parent"] == "tiny-llama"
        assert client.models.retrieve("coder").model_extra["root"] == str(adapter)
        for name, lora in (("tiny-llama", None), ("coder", "coder")):
            r = client.chat.completions.create(model=name, messages=MSG, max_tokens=12, temperature=0)
            assert r.choices[0].message.content == want[lora] and r.model == name
        with pytest.raises(openai.NotFoundError, match="serves 'tiny-llama', 'coder'"):
            client.chat.completions.create(model="tester", messages=MSG, max_tokens=4)


@pytest.mark.parametrize("args, words", [(["--lora-modules", "coder"], "--lora-modules 'coder' is not NAME=ADAPTER_DIR"),
                                         (["--lora-modules", "a=/x", "--lora-modules", "a=/y"], "names 'a' twice"),
                                         (["--lora-modules", "coder=/no/such/dir"], "is not a LoRA adapter directory")])
def test_bad_adapter_options_are_one_line(args, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "tiny-llama", "--jobs-db", str(tmp_path / "j.sqlite"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and words in err[0], err


def test_an_adapter_named_as_the_base_model_is_refused(adapter, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--model", "tiny-llama", "--jobs-db", str(tmp_path / "j.sqlite"), "--lora-modules", f"tiny-llama={adapter}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err == ["error: --lora-modules names an adapter 'tiny-llama', the base model's id; give it another name"]
