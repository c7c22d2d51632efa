"""The experience pool under a multi-agent workload: does the replay buffer stay off the
critical path over >= 10,000 turns of 4 roles?

Rollout threads play episodes of a team (ROLES roles taking turns round-robin, TURNS_PER_ROLE
turns each, GROUP samples an episode) and put one group a role an episode into the real
`ReplayBuffer`, with its JSONL write-through on disk; a trainer thread takes each role's groups
(`take(n, step, role=...)`) and runs a real GRPO step (`GRPOTrainer`) on a per-role tiny-llama
policy. Admission control is the runtime's: an episode for step k starts once the trainer has
finished step k - staleness (sync: k), so `async` overlaps generation and updates and `sync`
alternates them.

Generation is synthetic: token ids of realistic sizes (a 49,152-token vocabulary; the shared
transcript grows from PROMPT[0] to PROMPT[1] tokens over an episode, completions COMPLETION
tokens, behaviour log-probs and weight versions per token), paced by sleeping at --gen-tok-s
completion tokens a second across all workers (prefill is free). The default, 4,000 tok/s,
is ~9x this 2-core host's best measured engine throughput (432 tok/s, SmolLM2-135M, batch 32):
the faster generation is, the larger the pool's share, so the share measured here bounds the
real one from above. The update trains each sequence's last --train-tokens tokens (ids folded
into the tiny vocabulary): a real optimizer step that keeps the trainer ahead of generation, as
the acceptance ("gradient updates never stall rollouts") asks of the runtime, not of the model.

Reported for each mode: groups written and read a second, seconds inside `put` / `take` less
the time they waited (a full buffer, an empty one) summed over threads and over the wall clock,
their cost a group and a turn and the generation rate at which they would reach 2%; update and
generation time over the wall clock; the rollouts' stall (admission plus a full buffer); the
trainer's idle time; staleness; resident memory sampled over the run (after warm-up, the first
10% of turns, against the end: flat is within 5%).

    python benchmarks/multi_agent_pool.py [--turns 10000] [--sync-turns 2000] [--gen-tok-s 4000]

Writes benchmarks/results/multi_agent_pool.{json,html} and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "multi_agent_pool.json"
VOCAB = 49_152  # SmolLM2's: ids as wide in the JSON log as a real run's


@dataclass
class PoolBench:
    turns: int = 10_000  # at least this many turns (each sample's turn counts once)
    roles: int = 4
    group: int = 4  # samples an episode: each role's group holds this many trajectories
    turns_per_role: int = 2  # each role speaks this often an episode
    workers: int = 4  # rollout threads, one episode each at a time
    episodes_per_step: int = 4  # groups of each role a training step takes
    staleness: int = 2  # async: episodes for step k start once step k - staleness is trained
    gen_tok_s: float = 4000.0  # modelled generation throughput, all workers together; 0: unpaced
    prompt: tuple[int, int] = (500, 2000)  # the first turn's prompt starts near the low end, the last ends near the high
    completion: tuple[int, int] = (50, 200)
    train_tokens: int = 512  # each sequence's last tokens the update trains on
    warmup: float = 0.1  # share of the turns after which resident memory must stay flat
    sample_s: float = 0.5  # resident memory and counters sampled this often


class Team:
    """The synthetic side: one episode's per-role groups, generated turn by turn at the paced rate."""

    def __init__(self, cfg: PoolBench, version, seed: int):
        self.cfg, self.version, self.rng = cfg, version, random.Random(seed)
        self.names = [f"role{r}" for r in range(cfg.roles)]

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def episode(self, e: int) -> tuple[dict[str, list], int, float]:
        """(role -> trajectories, turns, seconds slept) of episode `e`."""
        from longhaul.types import Trajectory, Turn

        cfg, rng = self.cfg, self.rng
        n = cfg.roles * cfg.turns_per_role
        lo, hi = cfg.prompt
        transcripts = [self._ids(rng.randint(lo, lo + (hi - lo) // 7)) for _ in range(cfg.group)]
        growth = [(hi - len(t)) / max(1, n - 1) for t in transcripts]
        turns = {r: [[] for _ in range(cfg.group)] for r in self.names}
        slept = 0.0
        for k in range(n):
            role, made = self.names[k % cfg.roles], 0
            for s, script in enumerate(transcripts):
                c = self._ids(rng.randint(*cfg.completion))
                v = self.version()
                turns[role][s].append(Turn(list(script), c, [-3 * rng.random() for _ in c], [v] * len(c), [1] * len(c)))
                script += c + self._ids(max(0, round(growth[s]) - len(c)))  # what the others see: the turn, then a tool's output
                made += len(c)
            if cfg.gen_tok_s:
                pause = made * cfg.workers / cfg.gen_tok_s  # each worker gets 1 / workers of the throughput
                time.sleep(pause)
                slept += pause
        info = lambda r, s: {"role": r, "episode": f"e{e}", "policy": r, "task_id": f"task{e}", "sample": s}
        groups = {r: [Trajectory(ts, float(s % 2), e, info(r, s)) for s, ts in enumerate(turns[r])] for r in self.names}
        return groups, n * cfg.group, slept


def clipped(group: list, keep: int, vocab: int) -> list:
    """The group as single-turn trajectories of each sequence's last `keep` tokens, ids folded into
    `vocab` (from 3: below are the byte tokenizer's specials): what the tiny policy trains on."""
    from longhaul.types import Trajectory, Turn

    out = []
    for t in group:
        seq = t.sequences()[0]  # one segment: each turn's prompt extends the last exactly
        pad = [0] * len(seq.prompt_ids)
        ids = [3 + i % (vocab - 3) for i in (seq.prompt_ids + seq.completion_ids)[-keep:]]
        mask, lps = (pad + seq.loss_mask)[-keep:], ([0.0] * len(pad) + seq.logprobs)[-keep:]
        cut = max(1, len(ids) // 8)  # the first eighth is the prompt
        out.append(Trajectory([Turn(ids[:cut], ids[cut:], lps[cut:], [0] * (len(ids) - cut), mask[cut:])], t.reward, t.group, {}))
    return out


class Clock:
    """Seconds a thread spends in each activity; threads add to their own and the totals are summed."""

    def __init__(self):
        self.s: dict[str, float] = {}

    def add(self, what: str, t0: float) -> float:
        now = time.perf_counter()
        self.s[what] = self.s.get(what, 0.0) + now - t0
        return now


def run(cfg: PoolBench, mode: str, work: Path) -> dict:
    """One run of `cfg` in `mode` ("async" or "sync") with its replay log under `work`."""
    import torch

    from longhaul.config import AlgoConfig, TrainConfig
    from longhaul.models import load_policy
    from longhaul.rl.grpo import GRPOTrainer
    from longhaul.runtime.buffer import Entry, ReplayBuffer, reward_spread
    from longhaul.runtime.memory import _status

    torch.set_num_threads(1)  # the other core is the rollout threads' and the pool's
    lag = cfg.staleness if mode == "async" else 0
    per_episode = cfg.roles * cfg.turns_per_role * cfg.group
    steps = -(-cfg.turns // (per_episode * cfg.episodes_per_step))
    episodes = steps * cfg.episodes_per_step
    capacity = cfg.roles * cfg.episodes_per_step * (lag + 2)  # as the controller sizes it: in flight + one spare step
    work.mkdir(parents=True, exist_ok=True)
    buf = ReplayBuffer.open(work / "buffer.jsonl", capacity)
    names = [f"role{r}" for r in range(cfg.roles)]
    trainers, vocab = {}, 0
    for r in names:
        policy, tok = load_policy("tiny-llama")
        vocab = len(tok)
        trainers[r] = GRPOTrainer(policy, tok.pad_token_id, AlgoConfig(kl_coef=0.0), TrainConfig(lr=1e-4, micro_batch=8, autocast="none"),
                                  1.0, cfg.train_tokens)
    state = {"version": 0, "next": 0, "turns": 0, "staleness": [], "taken": dict.fromkeys(names, 0), "error": None}
    cond = threading.Condition()
    clocks: list[Clock] = []

    def worker(i: int) -> None:
        clock, team = Clock(), Team(cfg, lambda: state["version"], seed=i)
        clocks.append(clock)
        try:
            while True:
                with cond:
                    e = state["next"]
                    if e >= episodes or state["error"]:
                        return
                    state["next"] += 1
                step = e // cfg.episodes_per_step
                t = time.perf_counter()
                with cond:
                    cond.wait_for(lambda k=step: state["version"] >= k - lag or state["error"])
                t = clock.add("admission_wait", t)
                groups, turns, slept = team.episode(e)
                t = clock.add("generate", t)
                clock.s["generate_slept"] = clock.s.get("generate_slept", 0.0) + slept
                for ri, r in enumerate(names):  # one group a role, each a task position of step's request
                    g, index = groups[r], (e % cfg.episodes_per_step) * cfg.roles + ri
                    buf.put(Entry(f"{step}.0/{index}", step, 0, index, f"task{e}", g, reward_spread(g)))
                    t = clock.add("put", t)
                with cond:
                    state["turns"] += turns
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            with cond:
                state["error"] = state["error"] or err
                cond.notify_all()

    def trainer() -> None:
        clock = Clock()
        clocks.append(clock)
        try:
            for step in range(steps):
                for r in names:
                    t = time.perf_counter()
                    entries = buf.take(cfg.episodes_per_step, step, role=r, timeout=600)
                    t = clock.add("take", t)
                    state["taken"][r] += len(entries)
                    state["staleness"] += [step - e.version for e in entries]
                    batch = [clipped(e.group, cfg.train_tokens, vocab) for e in entries]
                    t = clock.add("prepare", t)
                    trainers[r].step(batch)
                    clock.add("update", t)
                    clock.s["updates"] = clock.s.get("updates", 0) + 1
                with cond:
                    state["version"] = step + 1
                    cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            with cond:
                state["error"] = state["error"] or err
                cond.notify_all()

    samples, done = [], threading.Event()
    t_start = time.perf_counter()

    def sampler() -> None:
        while True:
            samples.append({"t": time.perf_counter() - t_start, "rss": _status().get("VmRSS", 0), "puts": buf.put_total,
                            "takes": buf.taken_total, "turns": state["turns"], "buffered": len(buf)})
            if done.wait(cfg.sample_s):
                return

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(cfg.workers)]
    threads.append(threading.Thread(target=trainer, daemon=True))
    watch = threading.Thread(target=sampler, daemon=True)
    watch.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t_start
    done.set()
    watch.join()
    buf.close()
    if state["error"]:
        raise state["error"]
    return summary(cfg, mode, buf, clocks, state, samples, wall, steps, episodes, capacity, work / "buffer.jsonl")


def summary(cfg: PoolBench, mode: str, buf, clocks: list[Clock], state: dict, samples: list[dict], wall: float,
            steps: int, episodes: int, capacity: int, log: Path) -> dict:
    tot = lambda k: sum(c.s.get(k, 0.0) for c in clocks)
    put_s, take_s = tot("put") - buf.put_wait_s, tot("take") - buf.take_wait_s
    pool_s, turns = put_s + take_s, state["turns"]
    rss = rss_trend(samples, cfg.warmup * turns)
    per_turn = pool_s / turns
    gen_s = tot("generate") / cfg.workers
    return {
        "mode": mode, "turns": turns, "episodes": episodes, "steps": steps, "updates": int(tot("updates")),
        "capacity": capacity, "groups_put": buf.put_total, "groups_taken": buf.taken_total, "taken_by_role": state["taken"],
        "wall_s": wall, "turns_per_s": turns / wall, "writes_per_s": buf.put_total / wall, "reads_per_s": buf.taken_total / wall,
        "put_s": put_s, "take_s": take_s, "pool_s": pool_s, "pool_share": pool_s / wall,
        "put_ms_per_group": 1e3 * put_s / buf.put_total, "take_ms_per_group": 1e3 * take_s / buf.taken_total,
        "pool_ms_per_turn": 1e3 * per_turn,
        # generation at this many turns a second would bring the pool's share to 2% (its work at this cost a turn)
        "pool_2pct_turns_per_s": 0.02 / per_turn,
        "put_wait_s": buf.put_wait_s, "take_wait_s": buf.take_wait_s,
        "update_s": tot("update"), "update_share": tot("update") / wall, "prepare_s": tot("prepare"),
        "generate_s_per_worker": gen_s, "generate_share": gen_s / wall, "generate_slept_s_per_worker": tot("generate_slept") / cfg.workers,
        "stall_s": tot("admission_wait") + buf.put_wait_s, "stall_share": (tot("admission_wait") + buf.put_wait_s) / (wall * cfg.workers),
        "admission_wait_s": tot("admission_wait"), "trainer_idle_s": buf.take_wait_s, "trainer_idle_share": buf.take_wait_s / wall,
        "staleness_mean": sum(state["staleness"]) / len(state["staleness"]), "staleness_max": max(state["staleness"]),
        "peak_buffered_groups": max(s["buffered"] for s in samples), "log_bytes": log.stat().st_size,
        "rss_mb": rss, "samples": samples,
    }


def rss_trend(samples: list[dict], warm_turns: float) -> dict:
    """Resident memory (MB) after warm-up: the peak of its first tenth against the peak of the run's
    last tenth (peaks, as the buffer's fill and the allocator make it swing), and its least-squares
    slope in MB a minute. Flat: the last peak within 5% of the first."""
    mb = 1 / 2**20
    post = [s for s in samples if s["turns"] >= warm_turns] or samples[-1:]
    tenth = max(1, len(post) // 10)
    warm, end = max(s["rss"] for s in post[:tenth]) * mb, max(s["rss"] for s in post[-tenth:]) * mb
    ts, ys = [s["t"] for s in post], [s["rss"] * mb for s in post]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    slope = 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var else 0.0
    return {"start": samples[0]["rss"] * mb, "warm": warm, "end": end, "max_after_warm": max(ys), "growth": end / warm - 1,
            "slope_mb_per_min": slope, "flat": end <= 1.05 * warm}


def table(runs: list[dict]) -> str:
    rows = [("turns", "{turns:d}"), ("wall clock s", "{wall_s:.1f}"), ("writes/s (groups put)", "{writes_per_s:.1f}"),
            ("reads/s (groups taken)", "{reads_per_s:.1f}"), ("put ms / group", "{put_ms_per_group:.2f}"),
            ("take ms / group", "{take_ms_per_group:.3f}"), ("pool ms / turn", "{pool_ms_per_turn:.3f}"),
            ("pool share of wall", "{pool_share:.2%}"), ("pool at 2% when gen reaches (turns/s)", "{pool_2pct_turns_per_s:.0f}"),
            ("updates share of wall", "{update_share:.1%}"), ("generation share (per worker)", "{generate_share:.1%}"),
            ("rollout stall s (all workers)", "{stall_s:.2f}"), ("trainer idle share", "{trainer_idle_share:.1%}"),
            ("staleness mean / max", "{staleness_mean:.2f} / {staleness_max}"), ("replay log MB", "{log_mb:.0f}")]
    out = [f"{'':40s}" + "".join(f"{r['mode']:>16s}" for r in runs)]
    for label, fmt in rows:
        out.append(f"{label:40s}" + "".join(f"{fmt.format(**r, log_mb=r['log_bytes'] / 2**20):>16s}" for r in runs))
    for key, label in (("start", "start"), ("warm", "peak after warm-up"), ("end", "peak at the end"), ("max_after_warm", "max after warm-up")):
        out.append(f"{'RSS MB, ' + label:40s}" + "".join(f"{r['rss_mb'][key]:16.0f}" for r in runs))
    out.append(f"{'RSS end vs warm-up (flat: within 5%)':40s}" + "".join(
        f"{r['rss_mb']['growth']:+15.1%}{'' if r['rss_mb']['flat'] else '!'}" for r in runs))
    out.append(f"{'RSS slope after warm-up, MB/min':40s}" + "".join(f"{r['rss_mb']['slope_mb_per_min']:+16.2f}" for r in runs))
    return "\n".join(out)


def write_plot(runs: list[dict], path: Path) -> Path:
    from longhaul.eval.svg import line_chart

    def rate(samples: list[dict], key: str) -> tuple[list, list]:
        pts = [(b["t"], (b[key] - a[key]) / (b["t"] - a["t"])) for a, b in pairwise(samples) if b["t"] > a["t"]]
        return [p[0] for p in pts], [p[1] for p in pts]

    charts = [line_chart({r["mode"]: ([s["t"] for s in r["samples"]], [s["rss"] / 2**20 for s in r["samples"]]) for r in runs},
                         "resident memory", "seconds", "MB")]
    for r in runs:
        charts.append(line_chart({"writes/s": rate(r["samples"], "puts"), "reads/s": rate(r["samples"], "takes")},
                                 f"{r['mode']}: pool groups a second", "seconds", "groups/s", y_min=0))
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>multi-agent pool</title></head><body style='font-family:sans-serif'>"
            "<h1>longhaul: the replay pool under 4 roles</h1><div style='display:flex;flex-wrap:wrap;gap:12px'>" + "".join(charts)
            + "</div></body></html>")
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page)
    os.replace(tmp, path)
    return path


def main_result(cfg: PoolBench, runs: list[dict], out: Path, command: str = "") -> dict:
    """Write the runs to `out` (JSON, atomically) and the plot beside it; returns what was written."""
    sys.path.insert(0, str(HERE))
    from common import host

    result = {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host(), "command": command, "config": asdict(cfg),
              "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    write_plot(runs, out.with_suffix(".html"))
    return result


def main() -> None:
    d = PoolBench()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=d.turns, help="turns of the async run")
    ap.add_argument("--sync-turns", type=int, default=2000, help="turns of the sync run beside it (0: none)")
    ap.add_argument("--roles", type=int, default=d.roles)
    ap.add_argument("--group", type=int, default=d.group)
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--gen-tok-s", type=float, default=d.gen_tok_s, help="modelled generation throughput (0: unpaced)")
    ap.add_argument("--train-tokens", type=int, default=d.train_tokens)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    cfg = PoolBench(turns=a.turns, roles=a.roles, group=a.group, workers=a.workers, gen_tok_s=a.gen_tok_s, train_tokens=a.train_tokens)
    work = Path(tempfile.mkdtemp(prefix="multi-agent-pool-"))
    runs = [run(cfg, "async", work / "async")]
    print(f"async: {runs[0]['turns']} turns in {runs[0]['wall_s']:.0f} s", file=sys.stderr, flush=True)
    if a.sync_turns:
        runs.append(run(PoolBench(**{**asdict(cfg), "turns": a.sync_turns}), "sync", work / "sync"))
    print(table(runs))
    main_result(cfg, runs, a.out, " ".join(["python", *sys.argv]))
    print(f"wrote {a.out} and {a.out.with_suffix('.html')} (replay logs in {work})")


if __name__ == "__main__":
    main()
