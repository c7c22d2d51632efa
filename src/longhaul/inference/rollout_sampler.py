"""The one `generate` that rollouts and evaluation call, over either generator.

`generate(sampler, tok, prompts, params, seed)` takes `RolloutParams`
(`max_new_tokens`, `temperature`, `top_p`, `stop`) and returns `Completion`s, whether
`sampler` is an `LLMEngine` (the default for training and evaluation runs), a `VLLMEngine`
(vLLM in its own process, `rollout.sampler: vllm`) or a plain HF model (the compact
`hf_sampler`, kept for callers that hold only a model). With the engine, request i
of a call gets the seed derived from (seed, i), or `seeds[i]`, so a call is reproducible
whatever ran before or beside it. Engine calls go through the engine's one stepping thread
(`engine_loop`), so calls from many threads at once share its steps.

`make_engine(model, tok, dtype)` builds the rollout engine for a policy, and
`sync_weights(engine, policy, version)` copies a (possibly LoRA-wrapped) policy's current
weights into it, merging adapters on the fly.
"""

from __future__ import annotations

import itertools

import torch

from longhaul.errors import LonghaulError
from longhaul.inference.engine import LLMEngine
from longhaul.inference.engine_loop import ThreadStream
from longhaul.inference.hf_sampler import Completion, RolloutParams
from longhaul.inference.hf_sampler import generate as hf_generate
from longhaul.inference.sampling import SamplingParams
from longhaul.inference.vllm_engine import VLLMEngine
from longhaul.models.lora import is_lora, unwrap


def generate(sampler, tok, prompts: list[list[int]], params: RolloutParams, seed: int = 0,
             seeds: list[int] | None = None, lora: str | None = None) -> list[Completion]:
    """`lora`: the engine's LoRA adapter the requests run with (`LLMEngine.add_lora`)."""
    if not isinstance(sampler, LLMEngine):
        if lora is not None:
            raise LonghaulError("LoRA adapters run on longhaul's engine; set rollout.sampler to engine")
        if not isinstance(sampler, VLLMEngine):
            return hf_generate(sampler, tok, prompts, params, seed=seed)
    if not prompts or any(len(x) == 0 for x in prompts):
        raise ValueError("every prompt needs at least one token")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts; pass one a prompt")
    seeds = seeds if seeds is not None else [(seed * 1_000_003 + i) % (2 ** 63) for i in range(len(prompts))]
    if isinstance(sampler, VLLMEngine):
        return sampler.generate(prompts, params, seeds)
    reqs = [SamplingParams(max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                         stop=list(params.stop) or None, include_stop_str_in_output=True, skip_special_tokens=False,
                         seed=s, lora=lora) for s in seeds]
    outs = _stepped(sampler, [list(p) for p in prompts], reqs)
    return [Completion(list(o.token_ids), list(o.logprobs), "length" if o.finish_reason == "length" else "stop", list(o.weight_version))
            for o in outs]


_IDS = itertools.count()


def _stepped(engine: LLMEngine, prompts: list[list[int]], reqs: list) -> list:
    """Run requests on `engine` through its one stepping thread: calls from many threads at once
    (episodes running side by side) join the same steps, and every step runs on the same thread."""
    loop = engine.loop()
    streams = [ThreadStream() for _ in prompts]
    ids = [f"rollout-{next(_IDS)}" for _ in prompts]
    for rid, p, r, s in zip(ids, prompts, reqs, streams):
        loop.submit(rid, p, r, s)
    try:
        return [s.wait() for s in streams]
    except BaseException:  # one request failed: the others are stopped before the error goes up
        loop.settle([rid for rid, s in zip(ids, streams) if not s.done])
        raise


def context_length(sampler) -> int:
    """The longest prompt + completion the sampler serves."""
    if isinstance(sampler, (LLMEngine, VLLMEngine)):
        return sampler.max_model_len
    return sampler.config.max_position_embeddings


def merged_state_dict(policy) -> dict[str, torch.Tensor]:
    """HF-named weights of a policy; LoRA adapters are folded into their base weights."""
    if not is_lora(policy):
        return policy.state_dict()
    model = unwrap(policy)
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
            with torch.no_grad():
                w = module.base_layer.weight.detach()
                for adapter in module.active_adapters:
                    w = w + module.get_delta_weight(adapter)
            out[f"{name}.weight"] = w
            if module.base_layer.bias is not None:
                out[f"{name}.bias"] = module.base_layer.bias.detach()
    for name, t in model.state_dict().items():
        if "lora_" in name or ".base_layer." in name:
            continue
        out.setdefault(name, t)
    return out


def make_engine(model, tok, dtype: str = "bfloat16", **engine_kwargs) -> LLMEngine:
    """A rollout engine holding `model`'s current weights (LoRA merged), in `dtype`."""
    if is_lora(model):
        engine = LLMEngine(model=_plain_copy(unwrap(model)), dtype=dtype, tokenizer=tok, **engine_kwargs)
        engine.update_weights(merged_state_dict(model), version=0)
        return engine
    return LLMEngine(model=model, dtype=dtype, tokenizer=tok, **engine_kwargs)


def _plain_copy(model):
    """A plain HF model of the same architecture (the engine only reads its config and weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        shell = AutoModelForCausalLM.from_config(model.config)
    return shell.to_empty(device="cpu")


def sync_weights(engine: LLMEngine | VLLMEngine, policy, version: int) -> None:
    engine.update_weights(merged_state_dict(policy), version)
