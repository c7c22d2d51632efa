"""Token generation for rollouts, evaluation and serving, with vLLM's names.

`LLMEngine` (`engine`) is the paged inference engine: scheduler, block manager with prefix
caching, model runner, sampler and the RL hooks (versioned weight updates, pause/resume).
`SamplingParams` is its per-request sampling (vLLM's fields: `max_tokens`, `ignore_eos`,
`stop`, `seed`, `logprobs`, ...):

    from longhaul.inference import LLMEngine, SamplingParams
    outs = LLMEngine("smollm2-135m-instruct").generate(["def fib(n):"], SamplingParams(max_tokens=64))

Rollouts and evaluation call `generate(sampler, tok, prompts, RolloutParams(...))`
(`rollout_sampler`): one call over token ids, through the engine or, for callers that hold
only an HF model, the compact `hf_sampler`. `RolloutParams` is that call's budget and
sampling (`max_new_tokens`, `temperature`, `top_p`, `stop`).
"""

from longhaul.inference.engine import LLMEngine
from longhaul.inference.hf_sampler import Completion, RolloutParams
from longhaul.inference.outputs import RequestOutput
from longhaul.inference.rollout_sampler import context_length, generate, make_engine, sync_weights
from longhaul.inference.sampling import SamplingParams

__all__ = ["Completion", "LLMEngine", "RequestOutput", "RolloutParams", "SamplingParams", "context_length", "generate",
           "make_engine", "sync_weights"]
