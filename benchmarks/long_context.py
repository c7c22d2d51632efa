"""Long context: (b) needle accuracy by length with and without a RoPE extension, and (c) the
time to first token of an agent's next turn with the KV offload
tiers off, in host memory, and on disk, replaying recorded multi-turn episodes.

Episodes are verified demonstrations of a workspace family (`longhaul data sft`'s rows, built
here through the real sandbox unless `--episodes FILE.jsonl` names rows with `messages`). Each
assistant message is one turn; its prompt is the chat template over every message before it,
so turn k+1's prompt extends turn k's by the reply and the tool's output. The episodes are
replayed interleaved, as agents whose tool calls take a while: turn k of every episode, then
turn k+1 of every episode, one request at a time, each `max_tokens=1` (the first token is the
figure; the next prompt takes the recorded reply, not the sampled one). The KV pool is sized
to `--pool-tokens`, smaller than the episodes' histories together, so between two turns of one
episode the other episodes' traffic evicts its blocks: with the tiers off its next turn
prefills its history again, with them on it brings the blocks back.

    python benchmarks/long_context.py [--family multistep] [--n 12] [--pool-tokens 6144]
        [--modes off,host,disk] [--parts offload,niah] [--out benchmarks/results/long_context.json]

Prints a table (TTFT of turns after the first: mean, p50, p90; tokens prefilled; each tier's
hit rate) and writes the JSON atomically. The first turn of every episode is cold in every
mode and is reported apart.

(b) runs `longhaul eval --suite niah` (`--niah-kind`, `--niah-n` tasks at each of
`--niah-lengths` thousand tokens) on the model as it is and with YaRN (`--yarn-factor`),
reporting accuracy by length and RULER's effective length (the longest above 85.6%). `decode`
times the prefill of one random prompt of each of `--decode-lengths` thousand tokens and the
`--decode-tokens` tokens after it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from longhaul.agent.demos import build_demos
from longhaul.cpus import available_cpus
from longhaul.envs.registry import get_family
from longhaul.hardware import resolve_dtype
from longhaul.inference.config import DTYPES
from longhaul.inference.engine import LLMEngine
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.runtime.progress import progress_bar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, pct, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "long_context.json"


def episode_turns(tok, rows: list[dict]) -> list[list[list[int]]]:
    """Each episode's turn prompts (token ids), from its messages."""
    out = []
    for row in rows:
        msgs, turns = row["messages"], []
        for i, m in enumerate(msgs):
            if m["role"] == "assistant" and i:
                text = tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True)
                turns.append(tok(text, add_special_tokens=False).input_ids)
        if len(turns) >= 2:
            out.append(turns)
    return out


def replay(engine: LLMEngine, episodes: list[list[list[int]]], prog, task) -> list[dict]:
    """Turn k of every episode, then k+1; one request at a time. Returns a row per request."""
    rows, depth = [], max(len(e) for e in episodes)
    greedy = SamplingParams(temperature=0, max_tokens=1)
    for k in range(depth):
        for e, turns in enumerate(episodes):
            if k >= len(turns):
                continue
            before = engine.stats()
            t = time.perf_counter()
            engine.generate([turns[k]], greedy)
            ttft = time.perf_counter() - t
            after = engine.stats()
            found = {name: after[name] - before[name] for name in ("prefix_cache_hits", "kv_offload_host_hits", "kv_offload_disk_hits")}
            rows.append({"episode": e, "turn": k, "prompt_tokens": len(turns[k]), "ttft_s": ttft,
                         "prefilled": len(turns[k]) - sum(found.values()), **found})
            prog.advance(task)
    return rows


def summary(rows: list[dict]) -> dict:
    later = [r for r in rows if r["turn"] > 0]
    ttft = [r["ttft_s"] for r in later]
    prompt = sum(r["prompt_tokens"] for r in later)
    return {"turns": len(later), "ttft_mean_s": statistics.fmean(ttft), "ttft_p50_s": pct(ttft, 0.5),
            "ttft_p90_s": pct(ttft, 0.9), "first_turn_ttft_mean_s": statistics.fmean(r["ttft_s"] for r in rows if r["turn"] == 0),
            "prompt_tokens": prompt, "prefilled_tokens": sum(r["prefilled"] for r in later),
            "pool_hit_rate": sum(r["prefix_cache_hits"] for r in later) / prompt,
            "host_hit_rate": sum(r["kv_offload_host_hits"] for r in later) / prompt,
            "disk_hit_rate": sum(r["kv_offload_disk_hits"] for r in later) / prompt}


def run(a) -> dict:
    model, tok = load_policy(a.model)
    if a.episodes:
        rows = [json.loads(line) for line in Path(a.episodes).read_text().splitlines() if line.strip()]
    else:
        rows = build_demos(get_family(a.family), a.n, variants=("explore",))  # the longest histories of the oracle's variants
    episodes = episode_turns(tok, rows)[:a.n]
    if not episodes:
        raise SystemExit("no episode has two turns or more; pass --episodes rows with several assistant messages")
    dtype = resolve_dtype(a.dtype)
    cfg = model.config
    per_token = KVCache.bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads,
                                        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads, DTYPES[dtype])
    longest = max(len(t[-1]) for t in episodes)
    pool_tokens = max(a.pool_tokens, longest + 64)
    results = {}
    with tempfile.TemporaryDirectory() as disk, progress_bar() as prog:
        for mode in a.modes.split(","):
            tiers = {"off": {}, "host": {"kv_offload_memory_gb": a.host_gb},
                     "disk": {"kv_offload_dir": disk, "kv_offload_disk_gb": a.host_gb}}[mode]
            engine = LLMEngine(model, tokenizer=tok, dtype=dtype, num_kv_blocks=-(-pool_tokens // 16), max_num_seqs=4, **tiers)
            engine.generate([episodes[0][0][:64]], SamplingParams(max_tokens=2))  # warm-up, outside the clock
            engine.flush_prefix_cache()
            task = prog.add_task(f"{mode:>4}", total=sum(len(e) for e in episodes), info="")
            rows_m = replay(engine, episodes, prog, task)
            results[mode] = {"summary": summary(rows_m), "requests": rows_m}
            del engine
    history = sum(len(t[-1]) for t in episodes)
    return {"benchmark": "long_context.offload", "model": a.model, "dtype": dtype, "family": a.family if not a.episodes else a.episodes,
            "episodes": len(episodes), "turns": sum(len(e) for e in episodes), "pool_tokens": pool_tokens,
            "pool_bytes": pool_tokens * per_token, "histories_tokens": history, "longest_prompt": longest,
            "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "available_cpus": available_cpus()},
            "date": time.strftime("%Y-%m-%d %H:%M"), "modes": results}


def decode_after(a) -> list[dict]:
    """Prefill of one random prompt of n tokens, then `--decode-tokens` more, for each n."""
    model, tok = load_policy(a.model)
    dtype = resolve_dtype(a.dtype)
    lengths = [int(k) * 1024 for k in a.decode_lengths.split(",")]
    engine = LLMEngine(model, tokenizer=tok, dtype=dtype, max_model_len=max(lengths) + a.decode_tokens + 16)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in lengths:
        ids = torch.randint(100, 40000, (n,), generator=gen).tolist()
        engine.flush_prefix_cache()
        engine.add_request(f"decode-{n}", ids, SamplingParams(max_tokens=a.decode_tokens + 1, ignore_eos=True))
        t0, first = time.perf_counter(), None
        while engine.has_unfinished_requests():
            if engine.step() and first is None:
                first = time.perf_counter()  # the prompt's last chunk and the first token
        end = time.perf_counter()
        rows.append({"prompt_tokens": n, "prefill_s": first - t0, "prefill_tok_s": n / (first - t0),
                     "decode_tok_s": a.decode_tokens / (end - first)})
        print(f"{n:>6} tokens: prefill {rows[-1]['prefill_tok_s']:.0f} tok/s, then {rows[-1]['decode_tok_s']:.1f} tok/s", flush=True)
    return rows


RULER_THRESHOLD = 0.856  # RULER's effective length: the longest length scoring above this


def niah(a) -> dict:
    """Needle accuracy by length for each RoPE variant, through `longhaul eval --suite niah`."""
    subs = [f"{a.niah_kind}_{k}k" for k in a.niah_lengths.split(",")]
    out = {}
    for name, scaling in (("no scaling", None), (f"yarn x{a.yarn_factor:g}", {"rope_type": "yarn", "factor": a.yarn_factor})):
        cmd = [sys.executable, "-m", "longhaul.cli", "eval", "--model", a.model, "--suite", "niah", "--subfamilies", ",".join(subs),
               "--n", str(a.niah_n * len(subs)), "--max-new-tokens", "48", "--dtype", a.dtype, "--json",
               "--context-length", str(int(1331 * max(int(k) for k in a.niah_lengths.split(","))) + 512)]  # haystacks run ~1.2x long
        if scaling:
            cmd += ["--rope-scaling", json.dumps(scaling)]
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            said = [line for line in done.stderr.splitlines() if line.strip() and "Loading weights" not in line]
            raise SystemExit(f"{name}: longhaul eval exited {done.returncode}: {said[-1] if said else '(nothing on stderr)'}")
        groups = json.loads(done.stdout)["by_subfamily"]
        acc = {s.rsplit("_", 1)[1]: groups[s]["passed"] / groups[s]["n"] for s in subs if s in groups}
        effective = max((int(k[:-1]) for k, v in acc.items() if v > RULER_THRESHOLD), default=0)
        out[name] = {"accuracy": acc, "n_per_length": a.niah_n, "effective_length_k": effective, "rope_scaling": scaling,
                     "seconds": time.perf_counter() - t}
        print(f"{name}: " + ", ".join(f"{k} {v:.0%}" for k, v in acc.items()) + f"; effective {effective}k", flush=True)
    return out


def niah_table(r: dict) -> str:
    variants = r["niah"]
    lengths = list(next(iter(variants.values()))["accuracy"])
    lines = [f"| variant | {' | '.join(lengths)} | effective length |", "|---" * (len(lengths) + 2) + "|"]
    for name, v in variants.items():
        lines.append(f"| {name} | " + " | ".join(f"{v['accuracy'][k]:.0%}" for k in lengths) + f" | {v['effective_length_k']}k |")
    return "\n".join(lines)


def table(r: dict) -> str:
    off = r["modes"].get("off", {}).get("summary")
    head = (f"{r['model']} {r['dtype']}, {r['episodes']} episodes / {r['turns']} turns of {r['family']}, pool {r['pool_tokens']} "
            f"tokens (histories {r['histories_tokens']}), {r['machine']['cpu']}")
    lines = [head,
             "| tiers | TTFT mean s | p50 | p90 | vs off | prefilled tokens | pool hits | host hits | disk hits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode, m in r["modes"].items():
        s = m["summary"]
        ratio = f"{off['ttft_mean_s'] / s['ttft_mean_s']:.2f}x" if off else "-"
        lines.append(f"| {mode} | {s['ttft_mean_s']:.3f} | {s['ttft_p50_s']:.3f} | {s['ttft_p90_s']:.3f} | {ratio} | "
                     f"{s['prefilled_tokens']} of {s['prompt_tokens']} | {s['pool_hit_rate']:.0%} | {s['host_hit_rate']:.0%} | "
                     f"{s['disk_hit_rate']:.0%} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--family", default="multistep")
    p.add_argument("--episodes", default=None, help="JSONL rows with `messages` (longhaul data sft's output) instead of building them")
    p.add_argument("--n", type=int, default=12, help="episodes")
    p.add_argument("--pool-tokens", type=int, default=6144, help="the KV pool's size in tokens (at least the longest prompt)")
    p.add_argument("--host-gb", type=float, default=2.0, help="the host tier's (or the disk tier's) bound")
    p.add_argument("--modes", default="off,host,disk")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--parts", default="offload,decode,niah",
                   help="offload (TTFT of the next turn), decode (prefill and decode speed after a long prompt), niah (needle accuracy)")
    p.add_argument("--decode-lengths", default="1,4,8,16", help="prompt lengths in thousands of tokens")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--niah-kind", default="passkey", help="passkey, single, multikey or vartrack")
    p.add_argument("--niah-lengths", default="1,2,4,8", help="haystack lengths in thousands of tokens (16: ~3 min a task on 2 cores)")
    p.add_argument("--niah-n", type=int, default=6, help="tasks a length")
    p.add_argument("--yarn-factor", type=float, default=4.0)
    a = p.parse_args()
    parts = a.parts.split(",")
    r = run(a) if "offload" in parts else {"model": a.model, "date": time.strftime("%Y-%m-%d %H:%M"),
                                           "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "available_cpus": available_cpus()}}
    if "offload" in parts:
        print(table(r))
    if "decode" in parts:
        r["decode"] = {"dtype": resolve_dtype(a.dtype), "new_tokens": a.decode_tokens, "rows": decode_after(a)}
    if "niah" in parts:
        r["niah"] = niah(a)
        print(niah_table(r))
    write_json(r, a.out)


if __name__ == "__main__":
    main()
