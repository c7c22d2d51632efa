"""Long context: (a) peak memory and seconds of one SFT step against sequence length, ours with
context_parallel 1 and 2 beside a plain HF forward/backward; (b) needle accuracy by length with
and without a RoPE extension; and (c) the time to first token of an agent's next turn with the
KV offload tiers off, in host memory, and on disk, replaying recorded multi-turn episodes.

(a) `--parts sft`: for each of `--sft-lengths` thousand tokens, one row of that many tokens (a
long user message, a short reply) trained one step, each configuration in its own process tree
whose resident memory (all its processes together) is sampled every 0.1 s: ours through
`run_offline` (packed rows, `train.context_parallel` 1 and 2 over gloo, YaRN x4 past the model's
8,192 positions) and the anchor, HF's model in the same dtype with SDPA attention, one
forward/backward over the row and an AdamW step. A configuration that passes `--sft-cap-gb`
is stopped and reported as over it (the machine's memory stays the tests' and the OS's); one
that passes `--sft-timeout` minutes is reported as timed out. Lengths after a configuration's
first failure are skipped for it.

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
`--niah-lengths` thousand tokens) on the model as it is, with YaRN (`--yarn-factor`), and after a
short SFT with YaRN on needle tasks of other seeds (`--niah-ft-steps` steps over `--niah-ft-rows`
tasks of `--niah-ft-lengths` thousand tokens; shorter than the evaluation's longest), or those of
`--niah-variants` (plain, yarn, tuned), reporting accuracy by length and RULER's effective
length (the longest above 85.6%). `decode`
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


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


REPLY = "The stone is under the cloud."


def sft_row(tok, length: int) -> tuple[list[dict], list[int], int]:
    """A chat of exactly `length` tokens (a long user message, a short reply): its messages, its
    token ids, and where the reply's tokens start."""
    words = "the river keeps a stone under every cloud and the maple waits".split()
    n = length
    for _ in range(4):  # a word is about a token; settle the count in a few passes
        messages = [{"role": "user", "content": " ".join(words[i % len(words)] for i in range(n))},
                    {"role": "assistant", "content": REPLY}]
        ids = _chat_ids(tok, messages)
        if len(ids) == length:
            break
        n -= len(ids) - length
    return messages, ids, len(_chat_ids(tok, messages[:1], add_generation_prompt=True))


def _chat_ids(tok, messages: list[dict], **kw) -> list[int]:
    got = tok.apply_chat_template(messages, tokenize=True, **kw)
    return list(got["input_ids"] if hasattr(got, "keys") else got)


def sft_child(a) -> None:
    """One SFT step of one configuration at one length, in this process; prints its seconds."""
    length, work = a.sft_length, Path(a.sft_dir)
    model, tok = load_policy(a.model)
    messages, ids, start = sft_row(tok, length)
    if a.sft_child == "anchor":  # HF's model as loaded (SDPA attention), the same row, one AdamW step
        model = model.to(DTYPES[resolve_dtype(a.dtype)]).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        x = torch.tensor([ids])
        labels = x.clone()
        labels[:, :start] = -100
        t = time.perf_counter()
        model(input_ids=x, labels=labels).loss.backward()
        opt.step()
        print(json.dumps({"seconds": time.perf_counter() - t, "tokens": len(ids)}), flush=True)
        return
    from longhaul.config import load_config
    from longhaul.runtime.offline import run_offline

    del model
    rows = work / "rows.jsonl"
    rows.write_text((json.dumps({"messages": messages}) + "\n") * 2)  # a dataset of one row is refused; a step takes one
    more = ["model.rope_scaling={rope_type: yarn, factor: 4}"] if length > 8192 else []
    cfg = load_config(None, [f"name=sft{length}", f"output_dir={work}", f"model.name={a.model}", "algo.name=sft",
                             f"data.path={rows}", "data.packing=true", f"data.max_length={length}", "data.batch_size=1",
                             "data.heldout_fraction=0", "train.steps=1", "train.micro_batch=1", "train.save_every=0",
                             "log.progress=false", "log.tensorboard=false", "log.audit=false",
                             f"train.context_parallel={a.sft_cp}", f"threads={max(1, (os.cpu_count() or 2) // a.sft_cp)}", *more])
    t = time.perf_counter()
    run_offline(cfg)
    steps = [json.loads(line) for line in (work / f"sft{length}" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in steps if "step_time" in r][-1]
    print(json.dumps({"seconds": last["step_time"], "run_s": time.perf_counter() - t, "tokens": len(ids)}), flush=True)


def sft_steps(a) -> dict:
    """(a): every configuration at every length, each in a child process tree, memory sampled."""
    configs = [("ours cp=1", ["--sft-child", "ours", "--sft-cp", "1"]), ("ours cp=2", ["--sft-child", "ours", "--sft-cp", "2"]),
               ("HF forward/backward", ["--sft-child", "anchor"])]
    wanted = {"cp1": "ours cp=1", "cp2": "ours cp=2", "anchor": "HF forward/backward"}
    asked = a.sft_configs.split(",")
    unknown = [c for c in asked if c not in wanted]
    if unknown:
        raise SystemExit(f"--sft-configs: unknown {unknown[0]!r}; use cp1, cp2 and anchor, comma-separated")
    configs = [c for c in configs if c[0] in {wanted[k] for k in asked}]
    out, failed = [], set()
    for k in [int(x) for x in a.sft_lengths.split(",")]:
        for name, args in configs:
            if name in failed:
                out.append({"config": name, "length": k * 1024, "status": "skipped (failed at a shorter length)"})
                continue
            with tempfile.TemporaryDirectory() as work:
                cmd = [sys.executable, __file__, "--model", a.model, "--dtype", a.dtype, "--sft-length", str(k * 1024),
                       "--sft-dir", work, *args]
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
                peak, t0, status = 0, time.perf_counter(), "ok"
                while proc.poll() is None:
                    peak = max(peak, tree_rss(proc.pid))
                    if peak > a.sft_cap_gb * 1e9 or time.perf_counter() - t0 > a.sft_timeout * 60:
                        status = f"over {a.sft_cap_gb:g} GB" if peak > a.sft_cap_gb * 1e9 else f"over {a.sft_timeout:g} min"
                        os.killpg(proc.pid, 9)
                        break
                    time.sleep(0.1)
                stdout, stderr = proc.communicate()
                row = {"config": name, "length": k * 1024, "peak_gb": round(peak / 1e9, 2), "wall_s": round(time.perf_counter() - t0, 1)}
                last = [line for line in stdout.splitlines() if line.startswith("{")]
                if status == "ok" and (proc.returncode != 0 or not last):
                    status = f"failed (exit {proc.returncode}): {(stderr.strip().splitlines() or ['?'])[-1][:200]}"
                if status == "ok":
                    row.update(json.loads(last[-1]))
                else:
                    failed.add(name)
                row["status"] = status
                print(f"sft {name} {k}k: {status}, peak {row['peak_gb']} GB, "
                      f"{row.get('seconds', float('nan')):.1f} s a step", flush=True)
                out.append(row)
    return {"dtype": resolve_dtype(a.dtype), "cap_gb": a.sft_cap_gb, "rows": out}


def sft_table(r: dict) -> str:
    lines = ["| length | configuration | peak GB (all processes) | seconds a step | status |", "|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['length']:,} | {row['config']} | {row.get('peak_gb', '-')} | "
                     f"{row['seconds']:.1f} | ok |" if row["status"] == "ok" else
                     f"| {row['length']:,} | {row['config']} | {row.get('peak_gb', '-')} | - | {row['status']} |")
    return "\n".join(lines)


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


NIAH_VARIANTS = ("plain", "yarn", "tuned")  # (b): the model as it is, with YaRN, and fine-tuned with YaRN
NIAH_TRAIN_SEEDS = 2_000_000  # the fine-tune's needle tasks: seeds disjoint from the evaluation's (`niah` heldout: 1,000,000 + i)


def niah_finetune(a, work: Path, scaling: dict) -> Path:
    """(b)'s third variant: `--niah-ft-steps` SFT steps of the model with `scaling` on `--niah-ft-rows`
    needle tasks of `--niah-ft-lengths` thousand tokens (the reference reply as the answer), exported
    as an HF directory for `longhaul eval`."""
    from longhaul.config import load_config
    from longhaul.envs import niah as needles
    from longhaul.rl.checkpoint import export_checkpoint
    from longhaul.runtime.offline import run_offline

    lengths = [int(k) for k in a.niah_ft_lengths.split(",")]
    rows = work / "needles.jsonl"
    with rows.open("w") as f:
        for i in range(a.niah_ft_rows):
            task = needles.make_task(NIAH_TRAIN_SEEDS + i, f"{a.niah_kind}_{lengths[i % len(lengths)]}k")
            f.write(json.dumps({"messages": [{"role": "user", "content": task.prompt},
                                             {"role": "assistant", "content": needles.reference_reply(task).strip()}]}) + "\n")
    cfg = load_config(None, ["name=niah_ft", f"output_dir={work}", f"model.name={a.model}", "algo.name=sft", f"data.path={rows}",
                             "data.packing=true", f"data.max_length={1024 * max(lengths)}", "data.batch_size=2",
                             "data.heldout_fraction=0", f"train.steps={a.niah_ft_steps}", "train.micro_batch=1",
                             f"train.lr={a.niah_ft_lr}", f"train.save_every={a.niah_ft_steps}", "log.tensorboard=false",
                             "log.audit=false", f"model.rope_scaling={json.dumps(scaling)}"])
    t = time.perf_counter()
    run_offline(cfg)
    print(f"fine-tune: {a.niah_ft_steps} steps in {time.perf_counter() - t:.0f} s", flush=True)
    return Path(export_checkpoint(work / "niah_ft", None, work / "exported"))


def niah(a) -> dict:
    """Needle accuracy by length for each RoPE variant, through `longhaul eval --suite niah`: the model
    as it is, with YaRN, and (`--niah-ft-steps` > 0) after a short fine-tune on needles with YaRN."""
    lengths = [int(k) for k in a.niah_lengths.split(",")]
    subs = [f"{a.niah_kind}_{k}k" for k in lengths]
    yarn = {"rope_type": "yarn", "factor": a.yarn_factor}
    wanted = a.niah_variants.split(",")
    unknown = [v for v in wanted if v not in NIAH_VARIANTS]
    if unknown:
        raise SystemExit(f"--niah-variants: unknown {unknown[0]!r}; use {', '.join(NIAH_VARIANTS)}, comma-separated")
    variants = [("no scaling", None, a.model)] if "plain" in wanted else []
    variants += [(f"yarn x{a.yarn_factor:g}", yarn, a.model)] if "yarn" in wanted else []
    if not variants and not a.niah_ft_steps:
        raise SystemExit("--niah-variants tuned with --niah-ft-steps 0 runs nothing; give steps or another variant")
    out = {}
    with tempfile.TemporaryDirectory() as work:
        if a.niah_ft_steps and "tuned" in wanted:
            variants.append((f"yarn x{a.yarn_factor:g}, fine-tuned", yarn, str(niah_finetune(a, Path(work), yarn))))
        for name, scaling, model in variants:
            cmd = [sys.executable, "-m", "longhaul.cli", "eval", "--model", model, "--suite", "niah", "--subfamilies", ",".join(subs),
                   "--n", str(a.niah_n * len(subs)), "--max-new-tokens", "48", "--dtype", a.dtype, "--json",
                   "--context-length", str(1024 * max(lengths))]  # an n k task fits n x 1,024 with its answer
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
            if model != a.model:
                out[name]["fine_tune"] = {"steps": a.niah_ft_steps, "rows": a.niah_ft_rows, "lengths_k": a.niah_ft_lengths,
                                          "lr": a.niah_ft_lr, "seeds_from": NIAH_TRAIN_SEEDS}
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
    p.add_argument("--niah-variants", default=",".join(NIAH_VARIANTS), help="(b): which of the three variants run")
    p.add_argument("--niah-ft-steps", type=int, default=16, help="(b): SFT steps of the fine-tuned variant (0: not run)")
    p.add_argument("--niah-ft-rows", type=int, default=32, help="(b): needle tasks it trains on (two a step)")
    p.add_argument("--niah-ft-lengths", default="1,2", help="(b): their lengths in thousands of tokens, in turn")
    p.add_argument("--niah-ft-lr", type=float, default=1e-4)
    p.add_argument("--sft-lengths", default="4,8,16", help="(a): sequence lengths in thousands of tokens (1024 each)")
    p.add_argument("--sft-configs", default="cp1,cp2,anchor", help="(a): which of ours cp=1, cp=2 and the anchor run")
    p.add_argument("--sft-cap-gb", type=float, default=20.0, help="(a): stop a configuration whose processes pass this")
    p.add_argument("--sft-timeout", type=float, default=30.0, help="(a): minutes a configuration may take at one length")
    p.add_argument("--sft-child", choices=("ours", "anchor"), help=argparse.SUPPRESS)
    p.add_argument("--sft-length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--sft-cp", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--sft-dir", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.sft_child:  # one configuration of (a), in its own process tree
        sft_child(a)
        return
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
    if "sft" in parts:
        r["sft"] = sft_steps(a)
        print(sft_table(r["sft"]))
    write_json(r, a.out)


if __name__ == "__main__":
    main()
