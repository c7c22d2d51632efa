"""Single-turn episodes: chat prompt -> sampled completion -> verifier score -> Trajectory."""

from __future__ import annotations

import time

from longhaul.inference import RolloutParams, generate
from longhaul.types import Trajectory, Turn


def encode_prompt(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(rendered, add_special_tokens=False).input_ids


def run_groups(model, tok, family, tasks, params: RolloutParams, group_size: int, seed: int, version: int,
               exec_timeout_s: float = 5.0, exec_workers: int = 2) -> tuple[list[list[Trajectory]], dict]:
    """Sample `group_size` completions per task, score them, and return groups plus timings."""
    prompts = [encode_prompt(tok, t.prompt) for t in tasks]
    flat = [p for p in prompts for _ in range(group_size)]
    t0 = time.perf_counter()
    outs = generate(model, tok, flat, params, seed=seed)
    t_gen = time.perf_counter() - t0
    replies = [tok.decode(o.token_ids, skip_special_tokens=True) for o in outs]
    flat_tasks = [t for t in tasks for _ in range(group_size)]
    t1 = time.perf_counter()
    scores = family.score_many(flat_tasks, replies, timeout_s=exec_timeout_s, workers=exec_workers)
    t_score = time.perf_counter() - t1
    groups: list[list[Trajectory]] = []
    for g, task in enumerate(tasks):
        group = []
        for k in range(group_size):
            i = g * group_size + k
            o, s = outs[i], scores[i]
            versions = o.versions or [version] * len(o.token_ids)  # the engine records each token's (partial rollouts span versions)
            turn = Turn(prompts[g], o.token_ids, o.logprobs, versions, [1] * len(o.token_ids), o.finish_reason)
            info = {"task_id": task.task_id, "family": task.family, "version": task.version, "status": s.status,
                    "passed": s.passed, "ended": "truncated" if o.finish_reason == "length" else "done", "reply": replies[i]}
            group.append(Trajectory([turn], s.reward, g, info))
        groups.append(group)
    return groups, {"timing/gen": t_gen, "timing/score": t_score, "gen_tokens": sum(len(o.token_ids) for o in outs)}
