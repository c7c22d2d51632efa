"""What the engine returns for a request: `RequestOutput` and its `RequestMetrics`.

Owns the output record only. Outputs are cumulative (vLLM's default): each one carries every
token generated so far, with `finished` set on the last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RequestMetrics:
    arrival_time: float  # time.perf_counter() at add_request
    first_token_time: float | None
    finished_time: float | None
    time_to_first_token: float | None  # seconds from arrival to the first sampled token
    e2e_latency: float | None  # seconds from arrival to finishing
    num_cached_tokens: int  # prompt tokens served by the prefix cache on first schedule


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens (EOS / stop token included when it ended the request)
    text: str
    logprobs: list[float]  # of each generated token, in the params' logprobs_mode
    top_logprobs: list[dict[int, float]] | None  # per token, when params.logprobs is set
    weight_version: list[int]  # the weight version that produced each token
    finish_reason: str | None  # "stop" | "length" | "abort", None while running
    finished: bool
    metrics: RequestMetrics | None = field(default=None)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.top_logprobs is not None:  # JSON keys must be strings
            d["top_logprobs"] = [{str(k): v for k, v in t.items()} for t in self.top_logprobs]
        return d


def output_of(seq) -> RequestOutput:
    """Snapshot a `Sequence` (lists are copied: later steps do not change this output)."""
    ttft = None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time
    e2e = None if seq.finished_time is None else seq.finished_time - seq.arrival_time
    metrics = RequestMetrics(seq.arrival_time, seq.first_token_time, seq.finished_time, ttft, e2e, seq.num_cached_tokens or 0)
    return RequestOutput(
        request_id=seq.request_id,
        prompt=seq.prompt,
        prompt_token_ids=seq.prompt_token_ids,
        token_ids=seq.output_token_ids,
        text=seq.text,
        logprobs=list(seq.logprobs),
        top_logprobs=list(seq.top_logprobs) if seq.params.logprobs else None,
        weight_version=list(seq.weight_versions),
        finish_reason=seq.finish_reason,
        finished=seq.finished,
        metrics=metrics,
    )
