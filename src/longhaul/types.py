"""The data that flows from rollout to trainer: Turn, Trajectory, Score.

Token-in, token-out: a turn keeps the exact prompt ids it was sampled from, the sampled ids,
their behaviour log-probs and weight versions, and a loss mask. Nothing is re-tokenised
between the sampler and the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Score:
    reward: float
    passed: bool
    status: str  # "pass", "fail", "syntax", "timeout", ...


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each completion token (sampling distribution)
    versions: list[int]  # weight version that produced each completion token
    loss_mask: list[int]  # 1 on model tokens, 0 on tool/environment tokens
    finish_reason: str = "stop"  # "stop" or "length"
    segment: int = 0  # turns of one segment extend each other's prompt exactly; a new one starts where not


@dataclass
class Trajectory:
    turns: list[Turn]
    reward: float
    group: int  # trajectories sampled from the same prompt share a group
    info: dict = field(default_factory=dict)  # task_id, family, version, ended ("done"/"truncated"/"infra_error"), status

    @property
    def completion_len(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)
