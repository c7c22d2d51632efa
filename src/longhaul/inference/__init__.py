"""Token generation for rollouts, evaluation and serving.

Two generators live here. `LLMEngine` (`engine`) is the paged inference engine: scheduler,
block manager with prefix caching, model runner, sampler and the RL hooks (versioned weight
updates, pause/resume). `hf_sampler` is the older compact sampler over an HF model that the
rollouts and evaluation reach either through `generate` (`rollout_sampler`), with the
rollout-side `SamplingParams`; training and evaluation runs use the engine.

`SamplingParams` here is still the old sampler's; the engine's (vLLM's field names) is
`EngineSamplingParams`, also importable as `longhaul.inference.sampling.SamplingParams`.
"""

from longhaul.inference.engine import LLMEngine
from longhaul.inference.hf_sampler import Completion, SamplingParams
from longhaul.inference.outputs import RequestOutput
from longhaul.inference.rollout_sampler import context_length, generate, make_engine, sync_weights
from longhaul.inference.sampling import SamplingParams as EngineSamplingParams

__all__ = ["Completion", "EngineSamplingParams", "LLMEngine", "RequestOutput", "SamplingParams", "context_length", "generate",
           "make_engine", "sync_weights"]
