"""The agent pipeline (`longhaul pipeline CONFIG`, the main job): verified demonstrations,
multi-turn SFT on them, multi-turn RL from the SFT weights, then greedy evaluation of the base,
SFT and SFT+RL policies on the same held-out tasks, and one report.

Everything goes under `runs/<name>/`:
- `demos.jsonl`: demonstrations of every family (train split; held-out sub-families left out);
- `sft/`: an offline run (`algo.name: sft`) on them, its final weights exported to `sft/model`;
- `rl/`: an online run (GRPO over the families' agent episodes) from the stage before, exported
  to `rl/model`;
- `eval_<stage>.json` and `episodes_<stage>.jsonl`: each policy on the same held-out tasks
  (per family, and each held-out sub-family apart), with its agent metrics, partial credit and
  transcripts;
- `pictures/`: for families that render what an episode built (scene3d), the report's shown
  episodes, first and last stage;
- `pipeline.json` (every figure) and `report.html`.
A stage whose output exists is not run again, so an interrupted pipeline continues where it
stopped. Ablations are the same pipeline with other `stages`: `[rl]` is RL from the base model
with no cold start, `[sft]` SFT alone. Owns the sequence and the comparison; each stage is the
ordinary trainer (`runtime.train`) with a config built here.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import ValidationError

from longhaul.agent.demos import build_demos
from longhaul.config import PipelineConfig, RunConfig, _explain
from longhaul.envinfo import collect
from longhaul.envs import get_family
from longhaul.envs.datasets import write_jsonl
from longhaul.errors import LonghaulError
from longhaul.eval.envcheck import require_checked
from longhaul.eval.passrate import EvalResult, evaluate
from longhaul.eval.pipeline_report import picture_path, shown_episodes, write_pipeline_report
from longhaul.eval.stats import mcnemar_exact, wilson
from longhaul.hardware import native_bf16
from longhaul.inference import LLMEngine
from longhaul.malloc import keep_freed_memory
from longhaul.models import load_policy
from longhaul.rl.checkpoint import export_checkpoint
from longhaul.runtime import train
from longhaul.runtime.progress import console, progress_bar
from longhaul.runtime.rollout import make_sampler


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _run_config(tree: dict, stage: str) -> RunConfig:
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as e:
        raise LonghaulError(f"pipeline {stage}: {_explain(e, RunConfig)}") from e


def _long_rows_autocast() -> str:
    """The stages' autocast: multi-turn rows of ~1,000 tokens make training compute-bound, and
    wherever bf16 arithmetic is native, bf16 runs it ~2x faster than fp32 (unlike decode and
    single-turn GRPO's short rows, where `auto` may keep fp32; see `longhaul.hardware`)."""
    return "bfloat16" if native_bf16() else "none"


def sft_run_config(base: dict, start: str, demos: Path, context: int, overrides: dict) -> RunConfig:
    """The multi-turn SFT stage on `demos` from `start`: `base` (name, output_dir, seed, model),
    the defaults below, then the user's `overrides`."""
    tree = _merge(base, {
        "model": {"name": start}, "algo": {"name": "sft"},
        # bins of 2,048 tokens: a micro-batch's activations (and the heap the C allocator then
        # keeps) are half those of 4,096-token bins, for the same tokens a step
        "data": {"path": str(demos), "packing": True, "max_length": context, "pack_length": min(context, 2048),
                 "batch_size": 8, "heldout_fraction": 0.1},
        "train": {"steps": 30, "lr": 1e-4, "micro_batch": 1, "warmup_steps": 3, "save_every": 0,
                  "autocast": _long_rows_autocast()}})
    return _run_config(_merge(tree, overrides), "sft")


def earlier_timing(summary: Path) -> dict[str, float]:
    """The seconds each stage took in an earlier run's summary (its finished stages do not run again)."""
    if not summary.exists():
        return {}
    return {k: v for k, v in json.loads(summary.read_text()).get("timing_s", {}).items() if k != "total"}


def _transcript(t) -> dict:
    """An evaluated episode as episodes_<stage>.jsonl keeps it."""
    return {"task_id": t.info.get("task_id"), "passed": t.info.get("passed"), "status": t.info.get("status"),
            "reward": t.info.get("reward"), "messages": t.info.get("messages", [])}


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)



def _isolated(fn, *args):
    """fn(*args) in a fresh child process (spawn); its result, or its exception raised here. A
    stage's memory peak (SFT activations, an engine's KV pool) then ends with its process
    instead of staying in this one's heap, which longhaul keeps for reuse (`longhaul.malloc`):
    the pipeline's peak is its largest stage's, not the sum of all of them."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1, initializer=_stage_child, initargs=(os.getpid(),)) as pool:
        return pool.apply(fn, args)


def _stage_child(parent: int) -> None:
    """A stage process ends with the pipeline: SIGTERM when its parent dies (a `kill` of the
    pipeline would otherwise leave the stage training on as an orphan)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)
    keep_freed_memory()


def _train_stage(run_cfg: RunConfig, out: Path) -> None:

    train(run_cfg)
    export_checkpoint(run_cfg.run_dir, None, out)


def _eval_stage(cfg: PipelineConfig, stage: str, model: str, humaneval: bool, only_humaneval: bool = False) -> None:
    Pipeline(cfg)._evaluate_here(stage, model, humaneval, only_humaneval)


class Pipeline:
    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg
        self.dir = cfg.run_dir
        self.families = {name: get_family(name) for name in cfg.families}
        bad = [f for f in self.families.values() if f.kind != "workspace"]
        if bad:
            raise LonghaulError(f"the pipeline trains agents: family {bad[0].name!r} is single-turn; list workspace families")
        for fam, subs in cfg.subfamilies.items():
            if fam not in self.families:
                raise LonghaulError(f"subfamilies: {fam!r} is not one of the listed families ({', '.join(cfg.families)}); "
                                    "name a listed family")
            unknown = [s for s in subs if s not in self.families[fam].subfamilies]
            if unknown or not subs:
                raise LonghaulError(f"subfamilies: {fam}: {unknown or 'an empty list'} is not a list of its sub-families "
                                    f"(valid: {', '.join(self.families[fam].subfamilies)})")
        self.heldout_subs: dict[str, list[str]] = {}
        for item in cfg.heldout_subfamilies:
            fam, _, sub = item.partition("/")
            if fam not in self.families or sub not in self.families[fam].subfamilies:
                raise LonghaulError(f"heldout_subfamilies: {item!r} is not family/subfamily of a listed family "
                                    f"(e.g. {cfg.families[0]}/{sorted(self.families[cfg.families[0]].subfamilies)[0]})")
            self.heldout_subs.setdefault(fam, []).append(sub)
        empty = [f for f in self.families if self.allowed(f) == []]
        if empty:
            raise LonghaulError(f"family {empty[0]!r} has no sub-family left to train on after heldout_subfamilies; "
                                "hold out fewer of its sub-families")
        self.timing: dict[str, float] = {}
        # the stages' settings are checked now, not after the stages before them have run
        if "sft" in cfg.stages:
            self.sft_config(cfg.model.name, self.dir / "demos.jsonl")
        if "rl" in cfg.stages:
            self.rl_config(cfg.model.name)

    def allowed(self, family: str) -> list[str] | None:
        """The sub-families training and the family's own evaluation set use (None: all)."""
        chosen, out = self.cfg.subfamilies.get(family), self.heldout_subs.get(family, [])
        if chosen is None and not out:
            return None
        return [s for s in (chosen or self.families[family].subfamilies) if s not in out]

    # ---- stages ------------------------------------------------------------------------
    def demos(self) -> Path:

        path = self.dir / "demos.jsonl"
        if path.exists():
            return path
        c = self.cfg
        rows, t0 = [], time.perf_counter()
        with progress_bar(True) as prog:
            for name, fam in self.families.items():
                bar = prog.add_task(f"demonstrations: {name}", total=c.demos.tasks * len(c.demos.variants), info="")
                rows += build_demos(fam, c.demos.tasks, c.difficulty, tuple(c.demos.variants), c.demos.seed,
                                    on_done=lambda t, bar=bar: prog.advance(bar), subfamilies=self.allowed(name))
        if not rows:
            raise LonghaulError("no demonstration passed its hidden checks; run `longhaul envcheck` on the families")
        write_jsonl(rows, path)
        self.timing["demos"] = time.perf_counter() - t0
        kinds = Counter(r["variant"] for r in rows)
        console.print(f"{len(rows)} verified demonstrations ({', '.join(f'{k} {v}' for k, v in kinds.items())}, "
                      f"{sum(r['repair'] for r in rows)} with a repair) -> {path}")
        return path

    def _base_tree(self, name: str) -> dict:
        c = self.cfg
        return {"name": name, "output_dir": str(self.dir), "seed": c.seed, "model": c.model.model_dump(),
                "log": {"report_to": []}}

    def sft(self, start: str, demos: Path) -> str:
        out = self.dir / "sft" / "model"
        if (out / "config.json").exists():
            return str(out)
        return self._train(self.sft_config(start, demos), out)

    def sft_config(self, start: str, demos: Path) -> RunConfig:
        return sft_run_config(self._base_tree("sft"), start, demos, self.cfg.model.context_length or 4096, self.cfg.sft)

    def rl(self, start: str) -> str:
        out = self.dir / "rl" / "model"
        if (out / "config.json").exists():
            return str(out)
        return self._train(self.rl_config(start), out)

    def rl_config(self, start: str) -> RunConfig:
        c = self.cfg
        tree = _merge(self._base_tree("rl"), {
            "model": {"name": start},
            "rollout": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": c.eval.max_new_tokens, "max_turns": c.eval.max_turns,
                        "temperature": 1.0, "context": "elide"},
            "algo": {"name": "grpo", "kl_coef": 0.0},
            # episodes of up to 4,096 tokens: two a micro-batch keep the update's activations small
            "train": {"steps": 10, "lr": 1e-5, "micro_batch": 2, "save_every": 0, "autocast": _long_rows_autocast()},
            "eval": {"before_after": False}})
        if len(self.families) == 1:
            (name,) = self.families
            tree["task"] = {"family": name, "difficulty": c.difficulty, "subfamilies": self.allowed(name)}
        else:
            tree["domains"] = [{"family": n, "difficulty": c.difficulty, "subfamilies": self.allowed(n)} for n in self.families]
        return _run_config(_merge(tree, c.rl), "rl")

    def _stage(self, key: str, fn, *args) -> None:
        """fn(*args) in its own process (`_isolated`); its wall clock, start-up and model loading
        included, is timing_s[key]."""
        t0 = time.perf_counter()
        _isolated(fn, *args)
        self.timing[key] = time.perf_counter() - t0

    def _train(self, run_cfg: RunConfig, out: Path) -> str:
        self._stage(run_cfg.name, _train_stage, run_cfg, out)
        return str(out)

    # ---- evaluation ---------------------------------------------------------------------
    def eval_sets(self) -> dict[str, list]:
        """Held-out tasks by set: each family on its trained sub-families, each held-out sub-family apart."""
        c, sets = self.cfg, {}
        for name, fam in self.families.items():
            sets[name] = self._heldout(fam, self.allowed(name))
            for sub in self.heldout_subs.get(name, []):
                sets[f"{name}/{sub} (held-out sub-family)"] = fam.make_split("heldout", c.eval.tasks, c.difficulty, [sub])
        return sets

    def _heldout(self, fam, subs: list[str] | None) -> list:
        """`eval.tasks` held-out tasks of `fam`; stratified: as even a split over `subs` (or all its
        sub-families) as the count allows, each sub-family's tasks from the same held-out seeds."""
        c = self.cfg
        subs = subs or list(fam.subfamilies)
        if not c.eval.stratify or len(subs) < 2:
            return fam.make_split("heldout", c.eval.tasks, c.difficulty, subs or None)
        per, extra = divmod(c.eval.tasks, len(subs))
        tasks = [fam.make_split("heldout", per + (i < extra), c.difficulty, [sub]) for i, sub in enumerate(subs)]
        # interleaved, so a set cut into batches still mixes every kind of task
        return [ts[k] for k in range(per + 1) for ts in tasks if k < len(ts)]

    def evaluate(self, stage: str, model: str, humaneval: bool = False) -> dict:
        """The policy at `model` on every set (and HumanEval when asked), cached in eval_<stage>.json."""
        path = self.dir / f"eval_{stage}.json"
        if not path.exists():
            self._stage(f"eval_{stage}", _eval_stage, self.cfg, stage, model, humaneval)
        elif humaneval and "humaneval" not in json.loads(path.read_text()):  # a finished run asked for HumanEval too
            self._stage(f"humaneval_{stage}", _eval_stage, self.cfg, stage, model, True, True)
        return {k: EvalResult(**v) for k, v in json.loads(path.read_text()).items()}

    def _evaluate_here(self, stage: str, model: str, humaneval: bool, only_humaneval: bool = False) -> None:
        """`evaluate`'s work, in this process: writes eval_<stage>.json and the transcripts.
        `only_humaneval` runs HumanEval alone and adds it to the stage's existing eval_<stage>.json."""
        c = self.cfg
        policy, tok = load_policy(model, c.model.rope_scaling)
        run_cfg = _run_config(_merge(self._base_tree("eval"), {"model": {"name": model}}), "eval")
        sampler = make_sampler(run_cfg, policy, tok)
        results, episodes = {}, {}
        sets = {} if only_humaneval else self.eval_sets()
        with progress_bar(True) as prog:
            bar = prog.add_task(f"eval {stage}", total=sum(len(v) for v in sets.values()) + c.eval.humaneval_tasks * humaneval,
                                info="")

            def one_set(key: str):
                kept = episodes.setdefault(key, [])
                results[key] = evaluate(sampler, tok, self.families[key.split("/")[0]], sets[key], stage, c.eval.max_new_tokens,
                                        batch_size=c.eval.batch_size, max_turns=c.eval.max_turns,
                                        on_batch=lambda n: prog.advance(bar, n), seed=c.seed,
                                        on_episodes=lambda trajs: kept.extend(_transcript(t) for t in trajs),
                                        agent={**run_cfg.rollout.agent_options(), "keep_messages": True})

            # the sets side by side: the engine batches their episodes together, so one set's
            # last long episodes do not run alone (the HF sampler takes one call at a time)
            parallel = isinstance(sampler, LLMEngine) and len(sets) > 1
            with ThreadPoolExecutor(max_workers=len(sets) if parallel else 1) as pool:
                list(pool.map(one_set, list(sets)))
            results = {key: results[key] for key in sets}
            if humaneval:
                he = get_family("humaneval")
                tasks = he.make_split("heldout", c.eval.humaneval_tasks, 1, None)
                results["humaneval"] = evaluate(sampler, tok, he, tasks, stage, 384, batch_size=32,
                                                on_batch=lambda n: prog.advance(bar, n))
        fields = ("label", "task_ids", "passed", "statuses", "counts", "samples", "agent", "rewards")
        out = {k: {f: getattr(r, f) for f in fields} for k, r in results.items()}
        path = self.dir / f"eval_{stage}.json"
        if not only_humaneval:
            tmp = self.dir / f".episodes_{stage}.jsonl.tmp"
            tmp.write_text("".join(json.dumps(e) + "\n" for key in sets for e in episodes[key]))
            os.replace(tmp, self.dir / f"episodes_{stage}.jsonl")
        else:
            out = {**json.loads(path.read_text()), **out}
        _write_json(path, out)

    # ---- the whole -----------------------------------------------------------------------
    def pictures(self, stages: list[str]) -> int:
        """PNGs of what the report's shown episodes built, first and last stage, for families that
        render them (`Family.render_episode`, e.g. scene3d); a picture that fails is left out with a
        warning. Returns how many were written."""
        tasks = {t.task_id: (name, t) for name, ts in self.eval_sets().items() for t in ts}
        done = 0
        for tid, *episodes in shown_episodes(self.dir, stages, self.cfg.eval.show):
            name, task = tasks.get(tid, (None, None))
            render = self.families[name.split("/")[0]].render_episode if name else None
            if render is None:
                continue
            for stage, ep in zip((stages[0], stages[-1]), episodes):
                out = picture_path(self.dir, stage, tid)
                out.parent.mkdir(parents=True, exist_ok=True)
                try:
                    render(task, ep.get("messages", []), out)
                    done += 1
                except LonghaulError as e:
                    console.print(f"warning: no picture of {tid} at {stage}: {e}")
        return done

    def run(self) -> dict:
        c = self.cfg
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.dir / "pipeline_config.json", c.model_dump(mode="json"))
        self.timing = earlier_timing(self.dir / "pipeline.json")
        if "rl" in c.stages and c.rl.get("task", {}).get("require_envcheck", True):
            for fam in self.families.values():  # before any stage runs, not after the SFT
                require_checked(fam)
        base = c.model.name
        last = c.stages[-1] if c.stages else "base"
        evals = {"base": self.evaluate("base", base, c.eval.humaneval)}
        model = base
        if "sft" in c.stages:
            model = self.sft(base, self.demos())
            evals["sft"] = self.evaluate("sft", model, c.eval.humaneval and last == "sft")
        if "rl" in c.stages:
            model = self.rl(model)
            evals["rl"] = self.evaluate("rl", model, c.eval.humaneval)
        self.timing["total"] = sum(v for k, v in self.timing.items() if not k.startswith("humaneval_"))
        summary = summarize(evals, self.timing, c)
        _write_json(self.dir / "pipeline.json", summary)
        self.pictures(list(evals))

        report = write_pipeline_report(self.dir, summary)
        print_summary(summary)
        console.print(f"report: {report}")
        return summary


def _stage_row(results: dict[str, EvalResult], sets: list[str]) -> dict:
    passed = [p for k in sets for p in results[k].passed]
    joined = EvalResult.concat([results[k] for k in sets]) if sets else None
    row = {"passed": sum(passed), "n": len(passed), "pass_rate": sum(passed) / max(1, len(passed)),
           "ci95": list(wilson(sum(passed), len(passed))), "agent": joined.agent if joined else None}
    if joined is not None and joined.rewards:
        s = joined.summary(ks=(1,))
        row.update(mean_reward=s["mean_reward"], mean_reward_ci95=s["mean_reward_ci95"])
    return row


def _paired(results_a: dict, results_b: dict, sets: list[str]) -> dict:
    a = [p for k in sets for p in results_a[k].passed]
    b = [p for k in sets for p in results_b[k].passed]
    return mcnemar_exact(a, b)


def summarize(evals: dict[str, dict[str, EvalResult]], timing: dict, cfg: PipelineConfig) -> dict:
    """The pipeline's figures: per stage over the trained sets, per set, the held-out
    sub-families apart, paired tests between consecutive stages, HumanEval."""
    first = next(iter(evals.values()))
    trained_sets = [k for k in first if k in cfg.families]
    transfer_sets = [k for k in first if "held-out sub-family" in k]
    out = {"stages": {s: _stage_row(r, trained_sets) for s, r in evals.items()},
           "by_set": {k: {s: _stage_row(r, [k]) for s, r in evals.items()} for k in trained_sets + transfer_sets},
           "transfer": {s: _stage_row(r, transfer_sets) for s, r in evals.items()} if transfer_sets else {},
           "humaneval": {s: _stage_row(r, ["humaneval"]) for s, r in evals.items() if "humaneval" in r},
           "timing_s": {k: round(v, 1) for k, v in timing.items()}, "config": cfg.model_dump(mode="json"),
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    stages = list(evals)
    for a, b in zip(stages, stages[1:]):
        out[f"{b}_vs_{a}"] = _paired(evals[a], evals[b], trained_sets)
        if transfer_sets:
            out[f"{b}_vs_{a}_transfer"] = _paired(evals[a], evals[b], transfer_sets)
    if transfer_sets and len(stages) > 1:
        out[f"{stages[-1]}_vs_base_transfer"] = _paired(evals["base"], evals[stages[-1]], transfer_sets)

    out["host"] = collect().get("cpu")
    return out


def print_summary(summary: dict) -> None:
    from rich.table import Table

    t = Table(title="held-out pass@1 (greedy, same tasks for every stage)")
    for col in ("stage", "passed", "pass rate", "95% interval", "mean reward", "submit", "repair rate", "transfer", "HumanEval"):
        t.add_column(col)
    for stage, row in summary["stages"].items():
        ag = row.get("agent") or {}
        tr = summary["transfer"].get(stage)
        he = summary["humaneval"].get(stage)
        fmt = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
        t.add_row(stage, f"{row['passed']}/{row['n']}", f"{100 * row['pass_rate']:.1f}%",
                  f"[{100 * row['ci95'][0]:.1f}, {100 * row['ci95'][1]:.1f}]",
                  f"{row['mean_reward']:.3f}" if "mean_reward" in row else "-", fmt(ag.get("submit_rate")), fmt(ag.get("repair_rate")),
                  f"{tr['passed']}/{tr['n']}" if tr else "-", f"{he['passed']}/{he['n']}" if he else "-")
    console.print(t)
    for key in [k for k in summary if k.endswith("_vs_sft") or k.endswith("_vs_base")]:
        m = summary[key]
        console.print(f"{key}: gained {m['gained']}, lost {m['lost']}, exact McNemar p = {m['p_value']:.3g}")


def run_pipeline(cfg: PipelineConfig) -> dict:
    return Pipeline(cfg).run()
