"""The data that flows from rollout to trainer: Turn, Trajectory, Score.

Token-in, token-out: a turn keeps the exact prompt ids it was sampled from, the sampled ids,
their behaviour log-probs and weight versions, and a loss mask. Nothing is re-tokenised
between the sampler and the trainer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace


@dataclass(frozen=True)
class Score:
    reward: float
    passed: bool
    status: str  # "pass", "fail", "syntax", "timeout", ...


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    # behaviour log-prob of each completion token (sampling distribution); NaN where no sampler wrote
    # the token (an oracle demonstration put in by rollout.guidance): trainers treat it as on-policy
    logprobs: list[float]
    versions: list[int]  # weight version that produced each completion token
    loss_mask: list[int]  # 1 on model tokens, 0 on tool/environment tokens
    finish_reason: str = "stop"  # "stop" or "length"
    segment: int = 0  # turns of one segment extend each other's prompt exactly; a new one starts where not
    reward: float = 0.0  # the environment's reward for this turn (StepResult.reward); the outcome is Trajectory.reward


@dataclass
class Trajectory:
    turns: list[Turn]
    reward: float
    group: int  # trajectories sampled from the same prompt share a group
    info: dict = field(default_factory=dict)  # task_id, family, version, ended ("done"/"truncated"/"infra_error"), status

    @property
    def completion_len(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)

    @property
    def min_version(self) -> int:
        """The oldest weight version behind any of its tokens (its staleness is measured from this)."""
        return min((v for t in self.turns for v in t.versions), default=0)

    def to_dict(self) -> dict:
        """A JSON-ready copy; `from_dict(json.loads(json.dumps(d)))` gives back an equal trajectory
        (floats survive JSON exactly: Python writes the shortest repr that reads back the same).
        Equal to `asdict(self)`, but turns are copied list by list: asdict visits every token id
        (~1.3 us each, 2 ms a 1,000-token turn: most of the replay buffer's write-through)."""
        d = asdict(replace(self, turns=[]))  # info may hold nested dataclasses; asdict converts them
        d["turns"] = [{f.name: _copy_list(getattr(t, f.name)) for f in fields(t)} for t in self.turns]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        return cls([Turn(**t) for t in d["turns"]], d["reward"], d["group"], dict(d.get("info", {})))

    def sequences(self) -> list[Sequence]:
        """One training sequence per segment: the segment's first prompt, then every later token
        of the segment, model tokens with mask 1 and their behaviour log-probs, environment
        tokens (observations, template glue) with mask 0. A single-turn trajectory is one
        sequence equal to its turn."""
        out: list[Sequence] = []
        for k, turn in enumerate(self.turns):
            if k == 0 or turn.segment != self.turns[k - 1].segment:
                out.append(Sequence(list(turn.prompt_ids), [], [], [], turn.finish_reason, []))
            else:
                seq = out[-1]
                glue = turn.prompt_ids[len(seq.prompt_ids) + len(seq.completion_ids):]
                seq.completion_ids += glue
                seq.loss_mask += [0] * len(glue)
                seq.logprobs += [0.0] * len(glue)
                seq.turn_index += [k] * len(glue)
            seq = out[-1]
            seq.completion_ids += turn.completion_ids
            seq.loss_mask += list(turn.loss_mask)
            seq.logprobs += list(turn.logprobs)
            seq.turn_index += [k] * len(turn.completion_ids)
            seq.finish_reason = turn.finish_reason
        return out


def _copy_list(v):
    return list(v) if isinstance(v, list) else v


@dataclass
class Sequence:
    """What a trainer consumes: prompt ids, then completion ids with a loss mask."""
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]  # behaviour log-probs; 0 where loss_mask is 0
    finish_reason: str = "stop"
    turn_index: list[int] = field(default_factory=list)  # the trajectory turn each completion token belongs to
