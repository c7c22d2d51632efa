"""The LM head fused with the log-softmax: per-token log-probs (and entropy) of target tokens
from hidden states, without materialising the full (tokens x vocab) logits more than once.

Owns `head_logprobs(hidden, weight, targets, temperature, with_entropy)`. The plain way
(`logprobs._token_logprobs` over `lm_head(hidden)`) keeps the logits, their scaled copy, the
softmax and softmax * logits alive as separate (M, V) fp32 tensors, and autograd adds a
zeros-and-scatter for the gather and an exp for the logsumexp backward: at V = 49,152 that is
~200 MB a tensor for ~1,000 tokens, each pass memory-bound. Here, the forward computes the logits
chunk by chunk into one (M, V) buffer that becomes the softmax p in place (a chunk stays in cache
for its logsumexp), which is all the backward needs, as two GEMMs (past `KEEP_BYTES` the
backward recomputes it a chunk at a time instead):

    d logp_t / d z = onehot(target) - p,  z = logits / T
    grad_logits = g * (onehot - p) / T;  grad_h = grad_logits @ W;  grad_W = grad_logits^T @ h

The entropy is a metric here (no gradient); a caller that needs its gradient (an entropy bonus)
uses the plain path. Does not own which rows are picked (`packed_forward`, `logprobs`).

Numerics: fp32 equals the plain path to rounding (tests: 1e-5 on log-probs and gradients). Under
bf16 autocast the matmuls run in bf16 as `F.linear` would under autocast, the softmax in fp32.
"""

from __future__ import annotations

import torch

from longhaul.ops.autocast import autocast_dtype
from longhaul.ops.kernels import native

CHUNK = 256  # rows a chunk: a (256, 49152) fp32 block is 48 MB, the size of a large L3
KEEP_BYTES = 512 << 20  # a softmax (M, V) fp32 larger than this is recomputed in the backward, not kept
BACKWARD_CHUNK = 1024  # rows a recomputed chunk: 200 MB of fp32 softmax at V = 49,152 (~400 MB with bf16 copies)


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
    dt = autocast_dtype(hidden.device)  # the dtype autocast would run the head's matmul in (None: off)
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


def _logits_grad(p: torch.Tensor, targets: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The softmax p (m, V) turned in place into d loss / d z for per-row weights g (m,) on log p(target)."""
    return p.mul_(-g[:, None]).scatter_add_(1, targets[:, None], g[:, None])


class _HeadLogprobs(torch.autograd.Function):
    """Keeps the softmax (M, V) for the backward's two GEMMs; past `KEEP_BYTES` (long packed rows:
    4,096 tokens' softmax is 0.8 GB at V = 49,152) keeps nothing and recomputes it a
    `BACKWARD_CHUNK` at a time, one more head GEMM for O(chunk) memory."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, head=None, logits=None, scratch=False):
        keep = logits is not None or hidden.shape[0] * weight.shape[0] * 4 <= KEEP_BYTES
        logp, ent, probs, dt = _forward(hidden, weight, targets, temperature, with_entropy, keep_p=keep, head=head, logits=logits,
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
        g = g_logp.float() / ctx.temperature  # (M,)
        weight_mm = weight.to(dt) if dt is not None else weight
        need_h, need_w = ctx.needs_input_grad[:2]
        if ctx.probs is not None:
            gl, ctx.probs = _logits_grad(ctx.probs, targets, g), None  # (M, V), in the kept softmax's buffer
            grad_h, grad_w = _head_grads(gl, hidden, weight_mm, dt, need_h, need_w)
            return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for s in range(0, hidden.shape[0], BACKWARD_CHUNK):
            h = hidden[s:s + BACKWARD_CHUNK].detach()
            z = _logits(h, weight_mm.detach(), dt)
            if ctx.temperature != 1.0:
                z.div_(ctx.temperature)
            _chunk_stats(z, targets[s:s + BACKWARD_CHUNK], False, keep_p=True)
            gh, gw = _head_grads(_logits_grad(z, targets[s:s + BACKWARD_CHUNK], g[s:s + BACKWARD_CHUNK]), h, weight_mm, dt,
                                 need_h, need_w)
            if gh is not None:
                grad_h[s:s + BACKWARD_CHUNK] = gh
            if gw is not None:
                grad_w += gw
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None, None


def _head_grads(gl: torch.Tensor, hidden: torch.Tensor, weight_mm: torch.Tensor, dt, need_h: bool, need_w: bool):
    """d loss / d logits (m, V) -> (grad of hidden (m, H), of the head weight (V, H)), the matmuls in dt if set."""
    hidden_mm = hidden
    if dt is not None:
        gl, hidden_mm = gl.to(dt), hidden.to(dt)
    grad_h = (gl @ weight_mm).to(hidden.dtype) if need_h else None
    grad_w = (gl.t() @ hidden_mm).float() if need_w else None
    return grad_h, grad_w


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
