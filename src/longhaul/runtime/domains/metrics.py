"""Per-domain metrics of a joint run: pass rate, reward, tokens, sandbox time, share of slots.

`DomainMetrics` counts one domain's episodes since the last `flush()` (a training step) and in
total; `flat()` gives the `domain/<name>/...` keys that go to metrics.jsonl
(`eval.domain_report` renders them).

Keys per domain and step (`<m>` = `domain/<name>/`): `<m>episodes`, `<m>pass_rate`,
`<m>reward` (the verifier's reward, before the domain's shaping), `<m>tokens`, `<m>sandbox_s`, `<m>draws`,
`<m>share` (the domain's fraction of the step's draws), `<m>infra_errors`; and running totals
`<m>episodes_total`, `<m>tokens_total`, `<m>sandbox_s_total`. Rate keys are absent in a step
where the domain had no episode (never NaN).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Counts:
    episodes: int = 0
    passes: int = 0
    reward: float = 0.0  # sum of the verifier's rewards
    tokens: int = 0
    sandbox_s: float = 0.0
    draws: int = 0
    infra_errors: int = 0


@dataclass
class DomainMetrics:
    name: str
    step: Counts = field(default_factory=Counts)
    total: Counts = field(default_factory=Counts)

    def add(self, reward: float, passed: bool | None, tokens: int, sandbox_s: float) -> None:
        for c in (self.step, self.total):
            c.tokens += tokens
            c.sandbox_s += sandbox_s
            if passed is None:
                c.infra_errors += 1
            else:
                c.episodes += 1
                c.passes += bool(passed)
                c.reward += reward

    def drawn(self) -> None:
        self.step.draws += 1
        self.total.draws += 1

    def flat(self, step_draws: int) -> dict:
        m, s, t = f"domain/{self.name}/", self.step, self.total
        out = {f"{m}episodes": s.episodes, f"{m}tokens": s.tokens, f"{m}sandbox_s": round(s.sandbox_s, 6),
               f"{m}draws": s.draws, f"{m}infra_errors": s.infra_errors, f"{m}episodes_total": t.episodes,
               f"{m}tokens_total": t.tokens, f"{m}sandbox_s_total": round(t.sandbox_s, 6)}
        if s.episodes:
            out[f"{m}pass_rate"] = s.passes / s.episodes
            out[f"{m}reward"] = s.reward / s.episodes
        if step_draws:
            out[f"{m}share"] = s.draws / step_draws
        return out

    def flush(self) -> None:
        self.step = Counts()

    def state_dict(self) -> dict:
        return {"step": asdict(self.step), "total": asdict(self.total)}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.total = Counts(**state["step"]), Counts(**state["total"])
