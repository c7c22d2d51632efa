"""The agent loop: drive a policy through envs, turn by turn, into token-exact Trajectories.

A policy is anything with `generate(prompts, sampling, keys) -> [Generation]` over token ids:
the model's sampler (`ModelPolicy`), a scripted oracle (`ScriptedPolicy`), later a remote
server. Episodes run side by side, scheduled one of two ways. `continuous` (for policies that
take concurrent calls, `policy.concurrent`): every episode runs on its own thread and asks for
its next reply as soon as its env has stepped; the engine batches whatever is in flight.
`rounds`: every live episode's prompt goes to the policy in one batch, then the envs step in a
thread pool. Sandbox work is in subprocesses, so threads overlap it either way. Samples do not
depend on the schedule: a policy seeds each reply from its episode key and turn.

Token exactness: turn k+1's prompt is built as turn k's prompt + its sampled ids + the tokens of
the text the chat template adds after that reply (end-of-turn, tool observations, the next
generation prompt). Nothing the model produced is re-tokenised. Where the template would not
extend the previous text (a template that rewrites history), the prompt is re-rendered and a
new segment starts; `prompt_mode="retokenize"` always re-renders and starts a new segment only
when the re-rendered ids do not extend the previous ones. An episode ends `done` (the env
terminated), `truncated` (max turns, max tokens, context overflow) or `infra_error`.
"""

from __future__ import annotations

import threading
import time
import zlib
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol

from longhaul.inference import LLMEngine, RolloutParams, generate
from longhaul.types import Score, Trajectory, Turn


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"
    version: int = 0  # weight version that produced the tokens
    versions: list[int] = field(default_factory=list)  # per token, where the sampler records it (else `version` for all)


class Policy(Protocol):
    def generate(self, prompts: list[list[int]], sampling: RolloutParams, keys: list[str]) -> list[Generation]: ...


class ModelPolicy:
    """A model through the rollout `generate`: the engine (which takes concurrent calls and
    batches them) or a plain HF model. With the engine, each reply is seeded from (seed, episode
    key, the key's call count), so an episode's samples do not depend on what ran beside it;
    without keys, or with the HF sampler, each call advances the seed. `lora`: the engine's LoRA
    adapter this policy samples with (one engine, one adapter per role of a team)."""

    def __init__(self, model, tok, version: int = 0, seed: int = 0, lora: str | None = None):
        self.model, self.tok, self.version, self.seed, self.lora = model, tok, version, seed, lora
        self._calls: dict[str, int] = {}

    @property
    def concurrent(self) -> bool:

        return isinstance(self.model, LLMEngine)

    def generate(self, prompts, sampling, keys=None):

        seeds = None
        if keys is not None and self.concurrent:
            seeds = []
            for key in keys:
                n = self._calls.get(key, 0)
                self._calls[key] = n + 1  # one thread per key: no other writer
                seeds.append((self.seed * 1_000_003 + zlib.crc32(f"{key}#{n}".encode())) % 2**63)
            outs = generate(self.model, self.tok, prompts, sampling, seeds=seeds, lora=self.lora)
        else:
            outs = generate(self.model, self.tok, prompts, sampling, seed=self.seed, lora=self.lora)
            self.seed += 1
        return [Generation(o.token_ids, o.logprobs, o.finish_reason, self.version, list(o.versions)) for o in outs]


class ScriptedPolicy:
    """Replies from fixed scripts, one text per turn, keyed by episode key: the oracle and null
    agents of the quality checks. Tokens are the tokenizer's encoding of each text plus the
    end-of-turn token; log-probs are 0."""

    concurrent = True  # state is per key, and each key belongs to one episode

    def __init__(self, tok, scripts: dict[str, list[str]]):
        self.tok, self.scripts = tok, scripts
        self._pos: dict[str, int] = {}

    def generate(self, prompts, sampling, keys):
        out = []
        for key in keys:
            k = self._pos.get(key, 0)
            script = self.scripts[key]
            text = script[k] if k < len(script) else script[-1]
            self._pos[key] = k + 1
            ids = self.tok(text, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out


@dataclass(frozen=True)
class AgentConfig:
    max_turns: int = 12  # assistant replies per episode
    max_tokens: int = 4096  # prompt + completion of the last turn, i.e. the context the model needs
    max_new_tokens: int = 384  # per reply
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ("</tool_call>",)  # a reply ends after its first tool call
    prompt_mode: Literal["extend", "retokenize"] = "extend"
    workers: int = 4  # envs stepped in parallel
    max_live: int = 64  # episodes (sandboxes) alive at once; more tasks run in waves (rounds) or as slots free (continuous)
    # "continuous": each episode asks for its next reply as soon as its env has stepped (policies
    # that take concurrent calls: the engine); "rounds": all live episodes reply, then all envs step
    schedule: Literal["continuous", "rounds"] = "continuous"
    context: Literal["truncate", "elide"] = "truncate"  # when the next reply would not fit: end the episode, or elide old outputs
    keep_outputs: int = 2  # with "elide": the most recent tool outputs kept whole
    keep_messages: bool = False  # put the episode's chat messages in Trajectory.info["messages"] (reports, demonstrations)
    max_idle_turns: int | None = None  # end (truncated, "idle") after this many replies in a row with no valid tool call
    # an episode that never calls submit scores 0 with status "unsubmitted", whatever its final
    # state (kept in info["state_passed"]): otherwise RL learns to act until the turn limit,
    # since reaching it costs nothing and every extra action is another chance to pass
    require_submit: bool = False


@dataclass
class _Episode:
    key: str
    task: object
    env: object
    messages: list[dict] = field(default_factory=list)
    text: str = ""  # the rendered prompt of the current turn
    ids: list[int] = field(default_factory=list)
    segment: int = 0
    turns: list[Turn] = field(default_factory=list)
    ended: str | None = None
    info: dict = field(default_factory=dict)
    tool_calls: int = 0
    counts: dict = field(default_factory=lambda: {"invalid_calls": 0, "failed_calls": 0, "repeated_calls": 0, "elided": 0})
    replies: set = field(default_factory=set)  # replies seen so far: a repeat is a loop
    idle: int = 0  # replies in a row without a valid tool call
    t0: float = field(default_factory=time.perf_counter)


# episodes on threads share one tokenizer; a fast tokenizer's call sets its padding and
# truncation state first, which must not interleave with another thread's call
_TOKENIZER = threading.Lock()


def _render(tok, messages) -> str:
    with _TOKENIZER:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _encode(tok, text: str) -> list[int]:
    with _TOKENIZER:
        return tok(text, add_special_tokens=False).input_ids


def _decode(tok, ids: list[int]) -> str:
    with _TOKENIZER:
        return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _reply_text(tok, ids: list[int]) -> str:
    """The assistant message content: the reply without its end-of-turn token."""
    if ids and ids[-1] == tok.eos_token_id:
        ids = ids[:-1]
    return _decode(tok, ids)


def _advance(tok, ep: _Episode, completion: list[int], mode: str) -> None:
    """Set ep.ids / ep.text to the next turn's prompt; a new segment where exactness breaks."""
    new_text = _render(tok, ep.messages)
    prev = ep.ids + completion
    if mode == "extend":
        covered = ep.text + _decode(tok, completion)
        if new_text.startswith(covered):
            ep.ids, ep.text = prev + _encode(tok, new_text[len(covered):]), new_text
            return
        ep.ids, ep.text = _encode(tok, new_text), new_text
        ep.segment += 1
        return
    ids = _encode(tok, new_text)
    if ids[: len(prev)] != prev:
        ep.segment += 1
    ep.ids, ep.text = ids, new_text


ELIDED = "[output elided to fit the context: {n} characters]"


def _elide(tok, ep: _Episode, cfg: AgentConfig) -> None:
    """Replace all but the last `cfg.keep_outputs` tool outputs with a marker and re-render:
    the episode goes on in a new segment (its prompt no longer extends the last one)."""
    outputs = [m for m in ep.messages if m.get("role") == "tool" and not m["content"].startswith(ELIDED[:16])]
    old = outputs[:max(0, len(outputs) - cfg.keep_outputs)]
    if not old:
        return
    for m in old:
        m["content"] = ELIDED.format(n=len(m["content"]))
    ep.counts["elided"] += len(old)
    ep.text = _render(tok, ep.messages)
    ep.ids = _encode(tok, ep.text)
    ep.segment += 1


def _finish(ep: _Episode, cfg: AgentConfig, score: Score | None = None) -> Trajectory:
    """The episode as a Trajectory, scored by `score` where given (one verify shared by several
    trajectories of one env), else by the env's verify()."""
    info = {**ep.info, "ended": ep.ended, "turns": len(ep.turns), "tool_calls": ep.tool_calls,
            "segments": ep.segment + 1 if ep.turns else 0, "submitted": ep.ended == "done", **ep.counts}
    if cfg.keep_messages:
        info["messages"] = [dict(m) for m in ep.messages]
    if ep.ended == "infra_error":
        score = Score(0.0, False, "infra_error")
    elif score is None:
        try:
            score = ep.env.verify()
        except Exception as e:  # the verifier's own failure is ours, not the model's
            score = Score(0.0, False, "infra_error")
            info["ended"], info["infra_error"] = "infra_error", f"verify: {type(e).__name__}: {e}"
    if cfg.require_submit and info["ended"] not in ("done", "infra_error"):  # verify's own failure sets it too
        info["state_passed"] = score.passed
        score = Score(0.0, False, "unsubmitted")
    info.update(status=score.status, passed=score.passed, reward=score.reward, wall_s=time.perf_counter() - ep.t0)
    return Trajectory(ep.turns, score.reward, 0, info)


def run_episodes(policy: Policy, tok, make_env: Callable[[object], object], tasks: list, cfg: AgentConfig = AgentConfig(),
                 keys: list[str] | None = None, groups: list[int] | None = None, on_done: Callable | None = None) -> list[Trajectory]:
    """Run one episode per task (repeat a task for a group) and return their Trajectories in order.

    `make_env(task)` gives a fresh env (or one to reuse) for an episode; envs are closed here.
    `keys` name episodes for stateful policies (default "i:task_id"); `groups` sets Trajectory.group.
    """
    keys = keys or [f"{i}:{t.task_id}" for i, t in enumerate(tasks)]
    if cfg.schedule == "continuous" and getattr(policy, "concurrent", False):
        out = _run_continuous(policy, tok, make_env, tasks, keys, cfg, on_done)
    else:
        out = []
        for s in range(0, len(tasks), cfg.max_live):
            out += _run_rounds(policy, tok, make_env, tasks[s:s + cfg.max_live], keys[s:s + cfg.max_live], cfg, on_done)
    for i, t in enumerate(out):
        t.group = groups[i] if groups else i
    return out


def _sampling(cfg: AgentConfig, budget: int) -> RolloutParams:
    return RolloutParams(max_new_tokens=budget, temperature=cfg.temperature, top_p=cfg.top_p, stop=cfg.stop)


def _start(ep: _Episode, tok) -> None:
    try:
        ep.messages, ep.info = ep.env.reset(ep.task)
        ep.text = _render(tok, ep.messages)
        ep.ids = _encode(tok, ep.text)
    except Exception as e:
        ep.ended, ep.info = "infra_error", {"task_id": ep.task.task_id, "infra_error": f"reset: {type(e).__name__}: {e}"}


def _room(ep: _Episode, cfg: AgentConfig) -> int | None:
    """The next reply's token budget, or None (the episode ends here) when the context is full."""
    room = cfg.max_tokens - len(ep.ids)
    if room <= 0:
        ep.ended = "truncated"
        ep.info["truncated_by"] = "context"
        return None
    return min(cfg.max_new_tokens, room)


def _take(tok, ep: _Episode, g: Generation, cfg: AgentConfig) -> None:
    """Record a reply, step the env with it and set up the next turn's prompt (or end the episode)."""
    _record(ep, g)
    reply = _reply_text(tok, g.token_ids)
    try:
        res = ep.env.step({"role": "assistant", "content": reply})
    except Exception as e:
        ep.ended, ep.info["infra_error"] = "infra_error", f"step: {type(e).__name__}: {e}"
        return
    if not _absorb(ep, reply, res):
        return
    if res.terminated:
        ep.ended = "done"
        return
    if res.truncated:
        ep.ended = "truncated"
        return
    if len(ep.turns) >= cfg.max_turns:
        ep.ended, ep.info["truncated_by"] = "truncated", "max_turns"
        return
    if cfg.max_idle_turns and ep.idle >= cfg.max_idle_turns:
        ep.ended, ep.info["truncated_by"] = "truncated", "idle"
        return
    _next_prompt(tok, ep, g.token_ids, cfg)


def _record(ep: _Episode, g: Generation) -> None:
    """Append a sampled reply as the episode's next Turn (prompt = the current ids)."""
    n = len(g.token_ids)
    ep.turns.append(Turn(list(ep.ids), list(g.token_ids), list(g.logprobs), list(g.versions) or [g.version] * n, [1] * n,
                         g.finish_reason, ep.segment))


def _absorb(ep: _Episode, reply: str, res) -> bool:
    """Count a step's result and append the reply and its observations to the messages; False
    (and the episode ended as `infra_error`) where the env reports a fault of its own."""
    ep.turns[-1].reward = float(res.reward)
    ep.tool_calls += res.info.get("tool_calls", 0)
    if res.info.get("infra_error"):
        ep.ended, ep.info["infra_error"] = "infra_error", res.info["infra_error"]
        return False
    for k in ("invalid_calls", "failed_calls"):
        ep.counts[k] += res.info.get(k, 0)
    ep.counts["repeated_calls"] += reply.strip() in ep.replies
    ep.replies.add(reply.strip())
    stuck = "invalid_calls" in res.info and res.info.get("tool_calls", 0) <= res.info["invalid_calls"]  # envs that count them
    ep.idle = ep.idle + 1 if stuck else 0
    ep.messages += [{"role": "assistant", "content": reply}, *res.observations]
    return True


def _next_prompt(tok, ep: _Episode, completion: list[int], cfg: AgentConfig) -> None:
    """The next turn's prompt from the messages (eliding old outputs where the context asks);
    the episode ends truncated when even that does not fit."""
    _advance(tok, ep, completion, cfg.prompt_mode)
    if cfg.context == "elide" and len(ep.ids) + cfg.max_new_tokens > cfg.max_tokens:
        _elide(tok, ep, cfg)
    if len(ep.ids) >= cfg.max_tokens:
        ep.ended, ep.info["truncated_by"] = "truncated", "context"


def _run_rounds(policy: Policy, tok, make_env, tasks: list, keys: list[str], cfg: AgentConfig, on_done) -> list[Trajectory]:
    """Turn-synchronous: each round, every live episode's prompt goes to the policy in one batch
    (one call per distinct budget), then all envs step."""
    episodes = [_Episode(k, t, make_env(t)) for k, t in zip(keys, tasks)]
    results: dict[int, Trajectory] = {}
    with ThreadPoolExecutor(max_workers=max(1, cfg.workers)) as pool:
        list(pool.map(lambda ep: _start(ep, tok), episodes))
        live = [i for i, ep in enumerate(episodes) if ep.ended is None]
        for i, ep in enumerate(episodes):
            if ep.ended is not None:
                results[i] = _close(ep, on_done, cfg)
        while live:
            by_budget: dict[int, list[int]] = {}
            for i in live:
                budget = _room(episodes[i], cfg)
                if budget is not None:
                    by_budget.setdefault(budget, []).append(i)
            gens: dict[int, Generation] = {}
            for budget, idx in by_budget.items():
                for i, g in zip(idx, policy.generate([episodes[i].ids for i in idx], _sampling(cfg, budget),
                                                     [episodes[i].key for i in idx])):
                    gens[i] = g
            list(pool.map(lambda i: _take(tok, episodes[i], gens[i], cfg), list(gens)))
            done = [i for i in live if episodes[i].ended is not None]
            for i, traj in zip(done, pool.map(lambda i: _close(episodes[i], on_done, cfg), done)):
                results[i] = traj
            live = [i for i in live if episodes[i].ended is None]
    return [results[i] for i in range(len(episodes))]


def _run_continuous(policy: Policy, tok, make_env, tasks: list, keys: list[str], cfg: AgentConfig, on_done) -> list[Trajectory]:
    """Each episode runs on its own thread: its next prompt goes to the policy as soon as its env
    has stepped, so a short reply never waits for the longest one of a round and env work
    overlaps generation. The policy batches whatever requests are in flight (the engine's
    continuous batching). At most `max_live` episodes are alive; `workers` bounds how many envs
    reset, step or verify at once."""
    gate = threading.BoundedSemaphore(max(1, cfg.workers))
    failed = threading.Event()

    def drive(i: int) -> Trajectory:
        ep = None
        try:
            with gate:
                if failed.is_set():
                    raise _Abandoned()
                ep = _Episode(keys[i], tasks[i], make_env(tasks[i]))
                _start(ep, tok)
            while ep.ended is None:
                budget = _room(ep, cfg)
                if budget is None:
                    break
                g = policy.generate([ep.ids], _sampling(cfg, budget), [ep.key])[0]
                with gate:
                    if failed.is_set():
                        raise _Abandoned()
                    _take(tok, ep, g, cfg)
        except BaseException:
            failed.set()
            if ep is not None:
                try:
                    ep.env.close()
                except Exception:
                    pass
            raise
        with gate:
            return _close(ep, on_done, cfg)

    with ThreadPoolExecutor(max_workers=max(1, min(cfg.max_live, len(tasks)))) as pool:
        futures = [pool.submit(drive, i) for i in range(len(tasks))]
        wait(futures, return_when=FIRST_EXCEPTION)
        if failed.is_set():
            for f in futures:
                f.cancel()
            wait(futures)
            errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
            raise next((e for e in errors if not isinstance(e, _Abandoned)), errors[0])
        return [f.result() for f in futures]


class _Abandoned(Exception):
    """An episode stopped because another one's policy call failed."""


def _close(ep: _Episode, on_done, cfg: AgentConfig) -> Trajectory:
    try:
        traj = _finish(ep, cfg)
    finally:
        try:
            ep.env.close()
        except Exception:
            pass
    if on_done:
        on_done(traj)
    return traj
