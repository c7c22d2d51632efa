"""The LM head fused with the log-softmax: per-token log-probs (and entropy) of target tokens
from hidden states, without materialising the full (tokens x vocab) logits more than once.

Owns `head_logprobs(hidden, weight, targets, temperature, with_entropy)`. The plain way
(`logprobs._token_logprobs` over `lm_head(hidden)`) keeps the logits, their scaled copy, the
softmax and softmax * logits alive as separate (M, V) fp32 tensors, and autograd adds a
zeros-and-scatter for the gather and an exp for the logsumexp backward: at V = 49,152 that is
~200 MB a tensor for ~1,000 tokens, each pass memory-bound. Here, the forward computes the logits
chunk by chunk into one (M, V) buffer that becomes the softmax p in place (a chunk stays in cache
for its logsumexp), which is all the backward needs, as two GEMMs:

    d logp_t / d z = onehot(target) - p,  z = logits / T
    grad_logits = g * (onehot - p) / T;  grad_h = grad_logits @ W;  grad_W = grad_logits^T @ h

The entropy is a metric here (no gradient); a caller that needs its gradient (an entropy bonus)
uses the plain path. Does not own which rows are picked (`packed_forward`, `logprobs`).

Numerics: fp32 equals the plain path to rounding (tests: 1e-5 on log-probs and gradients). Under
bf16 autocast the matmuls run in bf16 as `F.linear` would under autocast, the softmax in fp32.
"""

from __future__ import annotations

import torch

from longhaul.ops.kernels import native

CHUNK = 256  # rows a chunk: a (256, 49152) fp32 block is 48 MB, the size of a large L3


def _mm_dtype() -> torch.dtype | None:
    """The dtype autocast would run a CPU matmul in now (None: no autocast)."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return None


def _logits(h: torch.Tensor, w, dt: torch.dtype | None) -> torch.Tensor:
    """h (m, H) @ w.T (w already in the autocast dtype, if any, or a callable head) -> float32 (m, V)."""
    if callable(w):
        return w(h).float()
    if dt is not None:
        return (h.to(dt) @ w.t()).float()
    return h @ w.t()


def _chunk_stats(z: torch.Tensor, targets: torch.Tensor, with_entropy: bool, keep_p: bool):
    """Scaled logits z (m, V) -> (logp (m,), entropy (m,) or None); with keep_p, z is
    overwritten in place by the softmax p. fp32 on a CPU with the native kernels: one call
    (`kernels.native().softmax_stats`, two or three passes over z instead of five)."""
    native = _native() if z.dtype == torch.float32 and z.device.type == "cpu" and z.is_contiguous() else None
    if native is not None:
        logp, ent = native.softmax_stats(z, targets, with_entropy, keep_p)
        return logp, ent if with_entropy else None
    lse = torch.logsumexp(z, dim=-1)  # (m,)
    logp = z.gather(1, targets[:, None]).squeeze(1) - lse
    ent = None
    if with_entropy:
        p = torch.exp(z - lse[:, None])
        ent = lse - (p * z).sum(-1)  # H = lse - sum(p * z)
        if keep_p:
            z.copy_(p)
    elif keep_p:
        z.sub_(lse[:, None]).exp_()
    return logp, ent


def _native():

    return native()


def _forward(hidden, weight, targets, temperature: float, with_entropy: bool, keep_p: bool, head=None, logits=None,
             scratch: bool = False):
    """-> logp (M,), entropy (M,) or None, the softmax (M, V) if keep_p, the matmul dtype."""
    dt = _mm_dtype()
    w = head if head is not None else weight.detach().to(dt) if dt is not None else weight.detach()  # cast once, not per chunk
    m, v = hidden.shape[0], weight.shape[0]
    logp = hidden.new_empty(m, dtype=torch.float32)
    ent = hidden.new_empty(m, dtype=torch.float32) if with_entropy else None
    # the caller's logits become the softmax in place when they are scratch (fp32, contiguous)
    scratch = scratch and logits is not None and logits.dtype == torch.float32 and logits.is_contiguous()
    probs = None
    if keep_p:  # one buffer: two GEMMs backward
        probs = logits if scratch else torch.empty((m, v), dtype=torch.float32, device=hidden.device)
    for s in range(0, m, CHUNK):
        z = _logits(hidden[s:s + CHUNK].detach(), w, dt) if logits is None else logits[s:s + CHUNK].float()
        if probs is not None and probs is not logits:
            z = probs[s:s + CHUNK].copy_(z)
        elif logits is not None and not scratch:
            z = z.clone()  # never scale the caller's logits in place
        if temperature != 1.0:
            z.div_(temperature)
        lp, e = _chunk_stats(z, targets[s:s + CHUNK], with_entropy, keep_p)
        logp[s:s + CHUNK] = lp
        if ent is not None:
            ent[s:s + CHUNK] = e
    return logp, ent, probs, dt


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, head=None, logits=None, scratch=False):
        logp, ent, probs, dt = _forward(hidden, weight, targets, temperature, with_entropy, keep_p=True, head=head, logits=logits,
                                        scratch=scratch)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.probs, ctx.temperature, ctx.dt = probs, temperature, dt
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, _g_ent):
        hidden, weight, targets = ctx.saved_tensors
        dt = ctx.dt
        gl, ctx.probs = ctx.probs, None  # (M, V) softmax, turned in place into the logits' gradient
        g = g_logp.float() / ctx.temperature  # (M,)
        gl.mul_(-g[:, None]).scatter_add_(1, targets[:, None], g[:, None])
        if dt is not None:
            gl, weight_mm, hidden_mm = gl.to(dt), weight.to(dt), hidden.to(dt)
        else:
            weight_mm, hidden_mm = weight, hidden
        grad_h = (gl @ weight_mm).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        grad_w = (gl.t() @ hidden_mm).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None, None, None, None


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  with_entropy: bool = False, head=None, logits: torch.Tensor | None = None,
                  logits_scratch: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden (M, H), head weight (V, H), targets (M,) -> log p(target) at `temperature` (M,)
    float32, differentiable in hidden and weight; and the entropy (M,) (no grad) or None.
    `head`: an equivalent callable h -> h @ weight.T (a prepacked copy) for the forward's logits;
    `logits` (M, V): those logits already computed (the sampler's, `rollout_activations`);
    `logits_scratch`: the caller gives them up, so they are overwritten (by the softmax, then its
    gradient) instead of copied (a ~180 MB copy a GRPO group)."""
    targets = targets.long()
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _HeadLogprobs.apply(hidden, weight, targets, float(temperature), with_entropy, head, logits, logits_scratch)
    logp, ent, _, _ = _forward(hidden, weight, targets, float(temperature), with_entropy, keep_p=False, head=head, logits=logits,
                               scratch=logits_scratch)
    return logp, ent
