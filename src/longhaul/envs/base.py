"""The Env protocol every environment follows, and the single-turn env for code-answer families.

    reset(task, seed) -> (messages, info)
    step(assistant_message) -> StepResult(observations, reward, terminated, truncated, info)
    tools() -> OpenAI function schemas
    verify() -> Score      (hidden checks run here and only here)
    close()

`assistant_message` is the model's reply as a string or an OpenAI-style message dict (with
`content` and optionally `tool_calls`). Observations are chat messages the agent loop appends.
Envs never raise on model output. The multi-turn workspace env lives in `longhaul.envs.workspace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from longhaul.types import Score


@dataclass
class StepResult:
    observations: list[dict]  # messages to append after the assistant's reply (role "tool" or "user")
    reward: float  # per-turn reward; the episode's final reward comes from verify()
    terminated: bool  # the agent finished (submitted, or answered a single-turn task)
    truncated: bool  # the episode was cut (budget, or infra error when info says so)
    info: dict = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    def reset(self, task, seed: int = 0) -> tuple[list[dict], dict]: ...
    def step(self, message) -> StepResult: ...
    def tools(self) -> list[dict]: ...
    def verify(self) -> Score: ...
    def close(self) -> None: ...


class AnswerEnv:
    """Single-turn: the reply is the answer (a fenced code block for code families), scored by the
    family's `score_many` verifier. No tools."""

    def __init__(self, score_many, **score_kw):
        self.score_many = score_many
        self.score_kw = score_kw
        self.task = None
        self.reply: str | None = None

    def tools(self) -> list[dict]:
        return []

    def reset(self, task, seed: int = 0) -> tuple[list[dict], dict]:
        self.task, self.reply = task, None
        return [{"role": "user", "content": task.prompt}], {"task_id": task.task_id, "family": task.family, "version": task.version}

    def step(self, message) -> StepResult:
        self.reply = message if isinstance(message, str) else (message.get("content") or "")
        return StepResult([], 0.0, True, False, {})

    def verify(self) -> Score:
        if self.task is None:
            raise RuntimeError("verify() needs a reset() episode")
        return self.score_many([self.task], [self.reply or ""], **self.score_kw)[0]

    def close(self) -> None:
        self.task = None
