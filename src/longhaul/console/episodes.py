"""A run's episodes as turns, whole: every prompt, reply, tool call and tool output untruncated.

Three files hold episodes: `episodes_<stage>.jsonl` (a pipeline's evaluations: chat messages),
`demos.jsonl` (verified demonstrations: chat messages) and `buffer.jsonl` (an online run's
replay log: `put` lines of trajectory groups, `types.Trajectory` as dicts). Chat messages are
shown as they are (a team episode's rows, one a role, as the whole episode in the order of its
turns, each message marked with the role that acted); a trajectory shows its `info["messages"]`
when it kept them, else its tokens decoded with the run's tokenizer: the first prompt of each
segment, each reply with its per-turn reward, and the tokens between one turn's reply and the
next prompt (the tool output and template glue) as the environment's turn.

An episode's id is `<line>.<member>` (member: its place in a buffer group, 0 elsewhere).
`Episodes` keeps, per file, a summary of each episode (task, passed, status, step, reward)
indexed incrementally, so filters and pages do not re-read a growing buffer.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from longhaul.console.jsonl import JsonlCache, parse_lines
from longhaul.console.paths import ConsoleError, RunsRoot, read_config
from longhaul.envs.tools import parse_message
from longhaul.home import cache_home
from longhaul.models.byte_tokenizer import byte_tokenizer

PAGE_MAX = 100  # episodes one page may carry (each whole)


def episode_sources(d: Path) -> list[str]:
    """The episode files of a run directory, evaluations first."""
    names = sorted(p.name for p in d.glob("episodes_*.jsonl"))
    return names + [n for n in ("demos.jsonl", "buffer.jsonl") if (d / n).is_file()]


def _summaries(n: int, row: dict) -> list[dict]:
    """The episodes of one line, without their turns."""
    if "op" in row or "group" in row:  # a buffer line: a group put, or a take / drop of groups
        if row.get("op", "put") != "put":
            return []
        out = []
        for j, t in enumerate(row.get("group") or []):
            info = t.get("info") or {}
            out.append({"id": f"{n}.{j}", "task_id": info.get("task_id", row.get("task_id")), "passed": info.get("passed"),
                        "status": info.get("status"), "step": row.get("step"), "reward": t.get("reward"),
                        "n_turns": len(t.get("turns") or [])})
        return out
    msgs = row.get("messages") or []
    out = {"id": f"{n}.0", "task_id": row.get("task_id"), "passed": row.get("passed"), "status": row.get("status"),
           "step": row.get("step"), "reward": row.get("reward"), "n_turns": sum(m.get("role") == "assistant" for m in msgs)}
    if row.get("role"):  # a team episode's row: one a role
        out["role"] = row["role"]
    return [out]


class _Index:
    def __init__(self):
        self.items: list[dict] = []
        self.warnings: list[str] = []
        self.parsed = 0  # lines summarised so far


class Episodes:
    def __init__(self, root: RunsRoot, cache: JsonlCache):
        self.root, self.cache = root, cache
        self._indexes: dict[Path, _Index] = {}

    def _file(self, run: str, source: str) -> tuple[Path, Path]:
        d = self.root.run_dir(run)
        if source not in episode_sources(d) or self.root.file(d, source) is None:
            have = ", ".join(episode_sources(d)) or "none"
            raise ConsoleError(404, f"run {run!r} has no episode file {source!r}; its episode files: {have}")
        return d, d / source

    def _index(self, path: Path) -> _Index:
        idx = self._indexes.setdefault(path, _Index())
        f = self.cache.get(path)
        with f.lock:
            if f.refresh():
                idx.items, idx.warnings, idx.parsed = [], [], 0
            rows, warnings = parse_lines(f.lines(idx.parsed, len(f)), idx.parsed, path.name)
            idx.parsed = len(f)
            idx.items += [s for n, r in rows for s in _summaries(n, r)]
            idx.warnings += warnings
        return idx

    def page(self, run: str, source: str, result: str | None = None, task: str | None = None, step: int | None = None,
             offset: int = 0, limit: int = 20, turns: bool = True) -> dict:
        """Episodes matching the filters (result "pass"/"fail", task id substring, step), from `offset`."""
        if result not in (None, "", "pass", "fail"):
            raise ConsoleError(400, f"result={result!r}: use pass or fail (or leave it out)")
        d, path = self._file(run, source)
        idx = self._index(path)
        items = idx.items
        if result:
            items = [e for e in items if bool(e["passed"]) == (result == "pass")]
        if task:
            items = [e for e in items if task.lower() in str(e["task_id"]).lower()]
        if step is not None:
            items = [e for e in items if e["step"] == step]
        chosen = items[max(0, offset): max(0, offset) + max(1, min(limit, PAGE_MAX))]
        if turns:
            chosen = [self._whole(d, path, e) for e in chosen]
        return {"source": source, "total": len(items), "offset": offset, "episodes": chosen, "warnings": list(idx.warnings)}

    def one(self, run: str, source: str, ident: str) -> dict:
        d, path = self._file(run, source)
        idx = self._index(path)
        found = next((e for e in idx.items if e["id"] == ident), None)
        if found is None:
            raise ConsoleError(404, f"no episode {ident!r} in {source} of run {run!r}; pick one from the episode list")
        return self._whole(d, path, found)

    def _whole(self, d: Path, path: Path, summary: dict) -> dict:
        line, member = (int(x) for x in summary["id"].split("."))
        f = self.cache.get(path)
        with f.lock:
            raw = f.lines(line - 1, line)
        row = json.loads(raw[0]) if raw else {}
        if "group" in row:
            traj = (row.get("group") or [{}])[member]
            info = dict(traj.get("info") or {})
            msgs = info.pop("messages", None)
            turns = message_turns(msgs, [t.get("reward") for t in traj.get("turns") or []]) if msgs else \
                token_turns(traj.get("turns") or [], _tokenizer((read_config(d)[1].get("model") or {}).get("name")))
        elif row.get("turn_log") and row.get("role"):  # a team episode: every role's row, in the order of turns
            roles = _team_rows(f, line, row)
            info = {k: v for k, v in row.items() if k != "messages"}
            turns = team_message_turns(roles)
        else:
            info = {k: v for k, v in row.items() if k != "messages"}
            turns = message_turns(row.get("messages") or [], [])
        return {**summary, "turns": turns, "info": info}


def _team_rows(f, line: int, row: dict) -> dict[str, dict]:
    """Role -> row of the team episode that holds `row` (line `line`): the rows of one episode's
    roles sit on consecutive lines with its episode key (or, in files without one, its task id),
    one a role."""
    found, roles, n = {line: row}, {row["role"]}, len(f)
    key = "episode" if row.get("episode") else "task_id"

    def same(k: int) -> dict | None:
        with f.lock:
            raw = f.lines(k - 1, k) if 1 <= k <= n else []
        other = json.loads(raw[0]) if raw else {}
        ok = other.get(key) == row.get(key) and other.get("role") and other["role"] not in roles
        return other if ok else None

    for step in (-1, 1):  # the neighbours above, then below
        k = line + step
        while (other := same(k)) is not None:
            found[k] = other
            roles.add(other["role"])
            k += step
    return {r["role"]: r for _, r in sorted(found.items())}


def team_turns(ep: dict[str, dict]) -> list[tuple[dict, list[dict]]]:
    """The episode in the order the roles took their turns: (turn entry, that turn's messages in
    the acting role's own chat: the teammates' news, its replies, their tool outputs)."""
    first = next(iter(ep.values()))
    log = first.get("turn_log", [])
    out = []
    for i, t in enumerate(log):
        msgs = ep.get(t["role"], {}).get("messages", [])
        end = next((u["first"] for u in log[i + 1:] if u["role"] == t["role"]), len(msgs))
        out.append((t, msgs[t["first"]:end]))
    return out


def team_message_turns(rows: dict[str, dict]) -> list[dict]:
    """A team episode as turns: the task, then each team turn's marker and that turn's messages in
    the acting role's own chat, each carrying its `actor` (and its place among the roles)."""
    roles = list(rows)
    first = next(iter(rows.values()))
    out = [{"role": "user", "content": m.get("content") or ""} for m in (first.get("messages") or [])[1:2]]
    for t, msgs in team_turns(rows):
        i = roles.index(t["role"]) if t["role"] in roles else 0
        out.append({"role": "team", "content": f"turn {t['turn']}: {t['role']} ({t['outcome']})", "actor": t["role"], "actor_index": i})
        out += [{**m, "actor": t["role"], "actor_index": i} for m in message_turns(msgs, [])]
    return out


def _calls(message: dict) -> list[dict]:
    return [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in parse_message(message)]


def message_turns(msgs: list[dict], rewards: list) -> list[dict]:
    """Chat messages as turns; the k-th assistant message carries the k-th turn reward when known."""
    out, k = [], 0
    for m in msgs:
        turn = {"role": m.get("role"), "content": m.get("content") or ""}
        if m.get("role") == "assistant":
            turn["tool_calls"] = _calls(m)
            turn["reward"] = rewards[k] if k < len(rewards) else None
            k += 1
        out.append(turn)
    return out


def token_turns(turns: list[dict], tok) -> list[dict]:
    """Token turns decoded: each segment's first prompt, each reply, and the tokens between a
    reply and the next prompt of the same segment (the environment's answer)."""
    decode = (lambda ids: tok.decode(ids, skip_special_tokens=False)) if tok is not None else \
        (lambda ids: f"[{len(ids)} token ids; no tokenizer found for this run's model] {ids}")
    out = []
    for k, t in enumerate(turns):
        prompt, reply = t.get("prompt_ids") or [], t.get("completion_ids") or []
        prev = turns[k - 1] if k else None
        if prev is None or t.get("segment", 0) != prev.get("segment", 0):
            out.append({"role": "prompt", "content": decode(prompt)})
        else:
            glue = prompt[len(prev.get("prompt_ids") or []) + len(prev.get("completion_ids") or []):]
            out.append({"role": "tool", "content": decode(glue)})
        text = decode(reply)
        out.append({"role": "assistant", "content": text, "tool_calls": _calls({"content": text}), "reward": t.get("reward"),
                    "finish_reason": t.get("finish_reason")})
    return out


@lru_cache(maxsize=8)
def _tokenizer(name: str | None):
    """The tokenizer of a model name as configs write it: the tiny built-ins' byte tokenizer, an
    HF directory, or a prepared built-in under the longhaul cache; None when none is found."""
    if not name:
        return None
    if name.startswith("tiny-"):
        return byte_tokenizer()
    for d in (Path(name).expanduser(), cache_home() / "models" / name):
        if (d / "tokenizer.json").is_file() or (d / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            try:
                return AutoTokenizer.from_pretrained(d)
            except (OSError, ValueError):
                return None
    return None
