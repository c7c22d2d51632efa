"""Sampling parameters and the sampler: logits of a batch -> next tokens and their logprobs.

Owns `SamplingParams` (vLLM's field names), the logits processing as pure tensor functions
(temperature, min-p, top-k, top-p, banned tokens), reproducible per-request sampling and the
logprobs returned with each token. Does not own stop conditions on text (`sequence`) or
running the model.

Order of processing, as vLLM v1: banned tokens (min_tokens), temperature, min-p, top-k,
top-p. Greedy (temperature 0) takes the argmax of the banned-only logits. The returned logprob
of a token is, with `logprobs_mode="processed"` (default), from the distribution actually
sampled from: log_softmax of the processed logits (for greedy, of the raw logits), which is
the behaviour log-probability RL needs; with `"raw"`, from log_softmax of the model's raw
logits. Top-n logprobs use the same mode and, as in
vLLM, also hold the sampled token when it is not among the top n.

Sampling is inverse-CDF with one uniform per token from the request's own generator, so a
seeded request draws the same tokens whatever else shares its batch (torch.multinomial with a
shared generator does not). On CPU the draw, the argmax and the log-normaliser of fp32 logits
run in one native call (`csrc/sample.cpp`, the same chunked inverse CDF as `inverse_cdf`) where
the kernels build; torch's ops elsewhere. The runner's whole native decode step
(`ModelRunner.decode_sample`) draws the same way, with the same kernel, for rows that need
nothing but a temperature (`by_temperature_only`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from longhaul.errors import LonghaulError
from longhaul.ops.kernels import native


class SamplingParamsError(LonghaulError, ValueError):
    """A SamplingParams field is out of range (the message names it)."""


@dataclass
class SamplingParams:
    """How to sample one request. Field names and defaults follow vLLM's `SamplingParams`."""

    n: int = 1  # completions per prompt; only 1 (submit the prompt n times for a group)
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # keep the k most likely tokens; 0 (or -1) keeps all
    top_p: float = 1.0  # keep the smallest nucleus with this much mass
    min_p: float = 0.0  # drop tokens below min_p times the top token's probability
    max_tokens: int | None = 16  # new tokens at most; None = up to the model's length
    min_tokens: int = 0  # EOS and stop tokens are banned until this many tokens exist
    stop: str | list[str] | None = None  # stop strings, matched on the generated text
    stop_token_ids: list[int] | None = None  # extra tokens that end the request
    ignore_eos: bool = False  # keep going past EOS (benchmarks: exactly max_tokens)
    include_stop_str_in_output: bool = False  # keep the matched stop string in `text`
    seed: int | None = None  # per-request seed; None draws one from the engine's seed
    logprobs: int | None = None  # also return the top-n logprobs of every position
    logprobs_mode: str = "processed"  # "processed" (the sampled distribution) or "raw"
    skip_special_tokens: bool = True  # when detokenizing `text`
    lora: str | None = None  # a LoRA adapter added with `LLMEngine.add_lora` (vLLM passes a LoRARequest); None: the base
    stop_strings: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self):
        def bad(name: str, why: str):
            raise SamplingParamsError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        if self.n != 1:
            bad("n", "must be 1 (submit a prompt n times to sample a group)")
        if not self.temperature >= 0:
            bad("temperature", "must be >= 0")
        if self.top_k < -1:
            bad("top_k", "must be -1, 0 (all tokens) or a positive count")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad("max_tokens", "must be >= 1 or None")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad("min_tokens", "must be in [0, max_tokens]")
        if self.logprobs is not None and self.logprobs < 0:
            bad("logprobs", "must be None or a count >= 0")
        if self.logprobs_mode not in ("processed", "raw"):
            bad("logprobs_mode", "must be 'processed' or 'raw'")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            bad("stop", "must not contain an empty string")
        self.stop_strings = tuple(stop)
        self.top_k = max(self.top_k, 0)
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# ---- pure tensor functions: (B, V) logits -> (B, V) logits with dropped tokens at -inf ----

def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p (B,) times the row's top probability."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p[:, None] * probs.amax(-1, keepdim=True), float("-inf"))


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep each row's top_k (B,) largest logits (ties with the k-th kept); 0 keeps all."""
    k_max = int(top_k.max())
    kth = logits.topk(k_max, dim=-1).values.gather(-1, (top_k.clamp(min=1) - 1)[:, None])  # (B, 1)
    kth = kth.masked_fill((top_k == 0)[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (B,): a token is
    dropped once the mass strictly before it already reaches top_p (the top token stays)."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= top_p[:, None]
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def process_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Raw (B, V) float32 logits (banned tokens already at -inf) -> the logits sampled from."""
    dev = logits.device
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    if any(t != 1 for t in temps):
        logits = logits / torch.tensor(temps, device=dev)[:, None]
    if any(p.min_p > 0 and not p.greedy for p in params):
        logits = apply_min_p(logits, torch.tensor([0.0 if p.greedy else p.min_p for p in params], device=dev))
    if any(p.top_k > 0 and not p.greedy for p in params):
        logits = apply_top_k(logits, torch.tensor([0 if p.greedy else p.top_k for p in params], device=dev))
    if any(p.top_p < 1 and not p.greedy for p in params):
        logits = apply_top_p(logits, torch.tensor([1.0 if p.greedy else p.top_p for p in params], device=dev))
    return logits


def by_temperature_only(p: SamplingParams) -> bool:
    """Whether p's token is drawn with nothing but its temperature (greedy, or no min-p, top-k or
    top-p) and returns no top logprobs and the processed logprob: what the runner's whole native
    step (`ModelRunner.decode_sample`) samples."""
    return (p.greedy or (p.min_p == 0 and p.top_k == 0 and p.top_p == 1)) and not p.logprobs \
        and p.logprobs_mode == "processed"


def uniforms(generators: list[torch.Generator]) -> torch.Tensor:
    """(B,) float64 uniforms in [0, 1), one from each row's generator."""
    return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The token whose cumulative weight first exceeds u * total, per row.

    weights (B, V) >= 0 (unnormalised probabilities), u (B,) in [0, 1) -> (B,) long. Two
    levels: a cumsum over chunk sums picks the chunk, a cumsum inside it the token, so no
    (B, V) cumsum is needed (the flat one is ~8x slower at V = 49k). A token of weight 0 is
    never returned, whatever the rounding.
    """
    b, v = weights.shape
    if v % chunk:
        weights = torch.nn.functional.pad(weights, (0, chunk - v % chunk))
    blocks = weights.view(b, -1, chunk)  # (B, C, chunk)
    sums = blocks.sum(-1).double()  # (B, C): an fp32 reduction, float64 from here on
    cum = sums.cumsum(-1)
    target = u.to(cum.dtype) * cum[:, -1]  # (B,)
    c = torch.searchsorted(cum, target[:, None], right=True).squeeze(-1).clamp(max=sums.shape[1] - 1)
    c = torch.where(sums.gather(-1, c[:, None]).squeeze(-1) > 0, c, _last_positive(sums))
    rest = (target - (cum.gather(-1, c[:, None]).squeeze(-1) - sums.gather(-1, c[:, None]).squeeze(-1))).clamp(min=0)
    inner = blocks[torch.arange(b, device=weights.device), c].to(torch.float64)  # (B, chunk)
    j = torch.searchsorted(inner.cumsum(-1), rest[:, None], right=True).squeeze(-1).clamp(max=chunk - 1)
    j = torch.where(inner.gather(-1, j[:, None]).squeeze(-1) > 0, j, _last_positive(inner))
    return c * chunk + j


def _last_positive(x: torch.Tensor) -> torch.Tensor:
    """(B, n) -> (B,) index of each row's last positive entry (a rounding fallback)."""
    idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(x > 0, idx, -1).amax(-1).clamp(min=0)


def sample_from(logp: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """(B, V) log-probabilities (or any log-weights), one generator a row -> (B,) token ids.

    Inverse-CDF with one uniform per row from the row's own generator: reproducible per
    request whatever shares the batch (torch.multinomial's shared generator is not)."""
    m = logp.amax(-1, keepdim=True)
    return inverse_cdf((logp - m).exp(), uniforms(generators).to(logp.device))


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float] | None]


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator],
           banned: list[list[int]]) -> SampleResult:
    """One token per row. logits (B, V) float32 raw; banned[b] token ids that row b may not
    sample (EOS and stop tokens before min_tokens).

    Works from one exp pass: w = exp(x - max) gives the log-normaliser (logprobs are
    x - logsumexp, never a full log_softmax) and the weights of the inverse CDF."""
    raw = logits
    if any(banned):
        logits = logits.clone()
        for b, ids in enumerate(banned):
            if ids:
                logits[b, ids] = float("-inf")
    x = process_logits(logits, params)
    greedy_rows = [b for b, p in enumerate(params) if p.greedy]
    random_rows = [b for b, p in enumerate(params) if not p.greedy]
    kernel = native() if x.is_cpu and x.dtype == torch.float32 else None
    if kernel is not None:  # the argmax or the draw, and the log-normaliser, in one call
        if len(random_rows) == len(params):
            u = uniforms(generators)
        else:
            u = torch.full((len(params),), -1.0, dtype=torch.float64)
            if random_rows:
                u[random_rows] = uniforms([generators[b] for b in random_rows])
        tokens, lse = kernel.sample_rows(x, u)
        lse = lse[:, None]
    elif len(greedy_rows) == len(params):
        m, tokens = x.max(-1, keepdim=True)  # max with indices: argmax is ~2x slower on CPU
        tokens = tokens.squeeze(-1)
        w = torch.sub(x, m).exp_()
    else:
        m = x.amax(-1, keepdim=True)
        w = torch.sub(x, m).exp_()  # (B, V)
        u = torch.zeros(len(params), dtype=torch.float64)
        u[random_rows] = uniforms([generators[b] for b in random_rows])
        tokens = inverse_cdf(w, u.to(x.device))
        if greedy_rows:
            rows = torch.tensor(greedy_rows, device=x.device)
            tokens[rows] = x[rows].max(-1).indices
    if kernel is None:
        lse = m + w.sum(-1, keepdim=True).log()  # (B, 1)
    any_raw = any(p.logprobs_mode == "raw" for p in params)
    raw_lse = raw.logsumexp(-1, keepdim=True) if any_raw else lse
    idx = tokens[:, None]
    chosen_p = (x.gather(-1, idx) - lse).squeeze(-1).tolist()
    chosen_r = (raw.gather(-1, idx) - raw_lse).squeeze(-1).tolist() if any_raw else chosen_p
    chosen = [chosen_r[b] if p.logprobs_mode == "raw" else chosen_p[b] for b, p in enumerate(params)]
    top: list[dict[int, float] | None] = [None] * len(params)
    n_max = max((p.logprobs or 0) for p in params)
    if n_max:  # vLLM's shape: the top n, plus the sampled token when it is not among them
        vals_p, ids_p = x.topk(n_max, dim=-1)
        vals_p = vals_p - lse
        vals_r, ids_r = raw.topk(n_max, dim=-1) if any_raw else (vals_p, ids_p)
        if any_raw:
            vals_r = vals_r - raw_lse
        tok_list = tokens.tolist()
        for b, p in enumerate(params):
            if p.logprobs:
                vals, ids = (vals_r, ids_r) if p.logprobs_mode == "raw" else (vals_p, ids_p)
                top[b] = dict(zip(ids[b, :p.logprobs].tolist(), vals[b, :p.logprobs].tolist()))
                top[b].setdefault(tok_list[b], chosen[b])
    return SampleResult(tokens.tolist(), chosen, top)
