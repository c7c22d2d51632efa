"""Token generation for rollouts and evaluation.

For now a compact sampler over an HF model with a KV cache (`hf_sampler`); the paged
engine of the inference issue replaces it behind the same `generate` call.
"""

from longhaul.inference.hf_sampler import Completion, SamplingParams, generate

__all__ = ["Completion", "SamplingParams", "generate"]
