"""Configuration: one pydantic model per component, loaded from YAML plus dotted overrides.

Unknown keys are errors that name the key and suggest the nearest valid one. This module
owns parsing and validation only; components read their own section.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from longhaul.errors import LonghaulError
from longhaul.hardware import check_device_name, resolve_autocast, resolve_dtype
from longhaul.runtime.algorithms import ALGORITHMS
from longhaul.runtime.trackers import TRACKERS


DeviceName = Annotated[str, AfterValidator(check_device_name)]  # auto, cpu, cuda or cuda:N (`hardware.resolve_device`)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


SCALED_ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")


class ModelConfig(Section):
    name: str = "smollm2-135m-instruct"  # built-in name, HF directory, or .gguf file
    context_length: int | None = None  # None: the model's max_position_embeddings
    # RoPE extension for this run, in the trainer and the engine alike (`models.scale_rope`), e.g.
    # {rope_type: yarn, factor: 4}; linear, yarn and llama3 multiply the model's positions by factor
    rope_scaling: dict | None = None

    @field_validator("rope_scaling")
    @classmethod
    def _rope_scaling(cls, v: dict | None) -> dict | None:
        if v is None:
            return v
        kind = v.get("rope_type", v.get("type"))
        if kind not in SCALED_ROPE_TYPES:
            raise ValueError(f"rope_scaling.rope_type {kind!r} is not one of {', '.join(SCALED_ROPE_TYPES)}; set one of them")
        factor = v.get("factor")
        if not isinstance(factor, (int, float)) or factor <= 1:
            raise ValueError(f"rope_scaling.factor must be a number above 1 (how many times the model's context), got {factor!r}")
        out = {k: val for k, val in v.items() if k != "type"}
        out["rope_type"], out["factor"] = kind, float(factor)
        return out


class TaskConfig(Section):
    family: str = "funcgen"  # a built-in family, or your own as package.module:Name (docs/custom-tasks.md)
    reward: str | None = None  # package.module:function (completions, tasks) -> rewards, replacing the family's verifier
    reward_model: str | None = None  # checkpoint/export of an `algo.name: rm` run: its score is the reward (RLHF); pass/fail stays the verifier's
    require_envcheck: bool = True  # refuse a family without a current, passing `longhaul envcheck` manifest entry
    difficulty: int = Field(1, ge=1, le=3)  # 1 plain, 2 one extra condition, 3 composed + edge case
    subfamilies: list[str] | None = None  # None: all sub-families of the family


class RolloutConfig(Section):
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2)  # samples per prompt; GRPO needs >= 2 to form a baseline
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    # sampler copy of the weights; auto: bf16 where the hardware has it (~1.6x faster on AVX512-BF16), else fp32
    # (emulated bf16 is far slower); resolved when the config is loaded, so config.yaml records what ran
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", validate_default=True)
    # where the sampler runs: auto is a CUDA GPU where torch sees one, else the CPU (resolved where the sampler starts)
    device: DeviceName = "auto"
    # the paged engine (prefix cache: a group's prompt is prefilled once), vLLM in its own process (`make vllm`;
    # inference/vllm_engine.py), or the HF sampler
    sampler: Literal["engine", "vllm", "hf"] = "engine"
    # the engine's weights quantized (re-quantized at every weight sync), as FlashRL samples in int8: faster decode, at
    # a gap between the sampler's and the trainer's log-probs (metric logprob_gap; algo.tis_cap corrects for it)
    quantization: Literal["none", "int8", "q8_0", "q4_0", "q4_1"] = "none"
    exec_timeout_s: float = Field(5.0, gt=0)  # hidden tests of one completion
    exec_workers: int = Field(2, ge=1)
    max_turns: int = Field(8, ge=1)  # assistant replies per episode of a multi-turn (workspace) family
    # when a multi-turn episode's next reply would not fit the context: elide old tool outputs (all but the last
    # keep_outputs) and go on in a new segment, or end the episode as truncated
    context: Literal["elide", "truncate"] = "elide"
    keep_outputs: int = Field(2, ge=0)
    # a multi-turn episode ends (truncated, "idle") after this many replies in a row without a valid tool call: a
    # stuck agent spends the rest of its turns' tokens for nothing; None: only max_turns ends it
    max_idle_turns: int | None = Field(3, ge=1)
    require_submit: bool = True  # multi-turn: an episode that never calls submit scores 0 ("unsubmitted")
    # multi-turn episodes with the engine: each asks for its next reply as soon as its env has stepped
    # (continuous), or all live episodes reply, then all envs step (rounds); samples are the same either way
    schedule: Literal["continuous", "rounds"] = "continuous"
    # multi-turn GRPO: a group in which no sample passed gets the task's verified oracle demonstration (this
    # variant of `longhaul data sft`'s) in place of its last sample, so tasks the policy cannot yet solve still
    # give a gradient (off-policy guidance, after LUFFY); "off": groups are as sampled
    guidance: Literal["off", "reference", "explore"] = "off"

    def agent_options(self) -> dict:
        """The AgentConfig fields this section sets for multi-turn episodes."""
        return {"context": self.context, "keep_outputs": self.keep_outputs, "max_idle_turns": self.max_idle_turns,
                "require_submit": self.require_submit, "schedule": self.schedule}

    @field_validator("dtype")
    @classmethod
    def _resolve_dtype(cls, v: str) -> str:
        return resolve_dtype(v)


class DataConfig(Section):
    """A dataset for the offline trainers (sft, dpo, rm, distill)."""
    path: str | None = None  # a JSONL file, a directory written by `datasets.save_to_disk`, or a .parquet/.json file
    split: str = "train"  # split to read from a saved DatasetDict
    heldout_fraction: float = Field(0.1, ge=0, lt=1)  # rows kept out of training for the before/after evaluation
    batch_size: int = Field(8, ge=1)  # rows per optimizer step (micro-batched by train.micro_batch)
    max_length: int = Field(1024, ge=8)  # rows longer than this many tokens are truncated from the right
    packing: bool = False  # SFT: pack rows into max_length with attention kept inside each row
    # SFT packing: tokens a packed bin holds (None: max_length). A micro-batch's activations grow with
    # it; a row longer than this still trains, in a bin of its own
    pack_length: int | None = Field(None, ge=8)
    shuffle: bool = True


class AlgoConfig(Section):
    name: str = "grpo"  # one of runtime.algorithms.ALGORITHMS: grpo, ppo, onpolicy_distill; sft, rm, dpo, distill
    advantage: str = "grpo"  # registered estimator name (longhaul.rl.advantages); PPO always uses gae
    loss: str = "ppo_clip"  # registered policy loss name (longhaul.rl.losses)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.28, ge=0)  # DAPO clip-higher keeps exploration alive
    kl_coef: float = Field(0.02, ge=0)  # 0 disables the reference model entirely
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    drop_zero_std_groups: bool = True  # groups with equal rewards carry no policy gradient; skip their compute
    # weight of negative advantages (below-baseline samples): 1 is the estimator as defined; 0 reinforces only
    # what beat its group (positive-sample reinforcement: sharpens pass@1, the greedy policy, at the cost of pass@k)
    negative_weight: float = Field(1.0, ge=0, le=1)
    dual_clip_c: float = Field(3.0, gt=1)  # used by loss=dual_clip
    entropy_coef: float = Field(0.0, ge=0)  # entropy bonus; 0 keeps entropy a metric only
    tis_cap: float | None = Field(None, gt=0)  # cap of the importance weight vs the sampler's log-probs; tis: None is off
    off_policy: Literal["tis", "decoupled"] = "tis"  # tis truncates pi/mu at tis_cap; decoupled (AReaL) weights by pi_prox/mu, drops tokens over the cap
    overlong_buffer: int = Field(0, ge=0)  # DAPO soft overlong punishment over the last N tokens; 0: off
    overlong_penalty: float = Field(1.0, ge=0)
    dynamic_sampling: bool = False  # DAPO: replace groups whose rewards are all equal with fresh prompts' groups
    max_refill_rounds: int = Field(3, ge=1)  # extra rollout rounds a step may spend refilling
    mask_truncated: bool = False  # DAPO: samples cut at max_new_tokens get no loss (they still shape the group baseline)
    kl_warn: float = Field(1.0, gt=0)  # warn when the mean KL to the reference exceeds this
    entropy_warn: float = Field(0.01, ge=0)  # warn when the mean token entropy falls below this (collapse)
    kl_penalty: Literal["loss", "reward"] = "loss"  # KL as a loss term, or folded into the token rewards (PPO's form)
    kl_target: float | None = Field(None, gt=0)  # adaptive KL coefficient tracking this KL (Ziegler et al.); None: fixed
    # PPO (actor and critic)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    value_clip: float = Field(0.2, gt=0)
    vf_coef: float = Field(0.5, gt=0)
    critic_lr: float = Field(1e-5, gt=0)
    ppo_epochs: int = Field(1, ge=1)  # passes over each rollout batch
    mini_batches: int = Field(1, ge=1)  # optimizer steps per pass
    whiten_advantages: bool = True
    # DPO
    beta: float = Field(0.1, gt=0)
    dpo_loss: str = "sigmoid"  # registered name (longhaul.rl.dpo): sigmoid, ipo (summed log-ratios), ipo_norm (TRL: per-token means)
    # distillation (offline on teacher logits, or on-policy: the student samples, the teacher scores)
    teacher: str | None = None  # a model name, HF directory or .gguf, with the student's tokenizer
    distill_loss: str = "forward_kl"  # registered name (longhaul.rl.distill): forward_kl, reverse_kl, jsd
    distill_temperature: float = Field(1.0, gt=0)
    jsd_beta: float = Field(0.5, gt=0, lt=1)
    distill_reward_weight: float = Field(0.0, ge=0)  # on-policy: add this times the outcome reward's GRPO advantage

    @field_validator("name")
    @classmethod
    def _registered(cls, v: str) -> str:
        if v not in ALGORITHMS:
            raise ValueError(ALGORITHMS.unknown(v))
        return v


class TrainConfig(Section):
    steps: int = Field(20, ge=0)
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    micro_batch: int = Field(8, ge=1)  # sequences per forward/backward; accumulation keeps the update exact
    share_prompt: bool = True  # run each group's prompt once and repeat its KV (same gradient, far fewer tokens)
    lora_r: int = Field(0, ge=0)  # 0: full fine-tuning; >0: LoRA adapters of this rank (peft), merged on export
    lora_alpha: float = Field(16.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_targets: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    autocast: Literal["auto", "none", "bfloat16"] = Field("auto", validate_default=True)  # fp32 master weights either way; auto as rollout.dtype
    device: DeviceName = "auto"  # where the policy trains: auto is a CUDA GPU where torch sees one, else the CPU
    save_every: int = Field(5, ge=0)  # 0: only the final checkpoint
    keep_last: int = Field(2, ge=1)
    # processes one packed row is split over (context parallel: each holds 1/N of its tokens' activations, for rows
    # too long for one); SFT with data.packing only. 1: no split
    context_parallel: int = Field(1, ge=1)
    context_attention: Literal["ring", "ulysses"] = "ring"  # ring: any N; ulysses: N must divide the query heads

    @field_validator("autocast")
    @classmethod
    def _resolve_autocast(cls, v: str) -> str:
        return resolve_autocast(v)


class EvalConfig(Section):
    before_after: bool = True  # greedy eval of base and trained policy on the same held-out tasks
    n_tasks: int = Field(120, ge=1)
    max_new_tokens: int = Field(128, ge=1)
    batch_size: int = Field(32, ge=1)
    max_turns: int = Field(10, ge=1)  # assistant replies per episode of a multi-turn (workspace) family


class RuntimeConfig(Section):
    """Where rollouts and training run, and how far rollouts may run ahead of the trainer."""
    mode: Literal["sync", "async"] = "sync"  # sync: generate, then train, in turn (the on-policy reference)
    max_staleness: int = Field(1, ge=0)  # async: a step's rollouts may start this many versions behind the trainer
    partial_rollouts: bool = True  # async: a weight update reaches generation in flight (per-token versions recorded)
    # what in-flight sequences do with their K/V at a weight update: recompute it under the new weights (a prefill
    # again, AReaL's way), or keep it and decode on over it (PipelineRL's way: no prefill again; on CPU a re-prefill
    # of every sequence in flight costs seconds a step). Either way each token records the version that sampled it
    inflight_kv: Literal["recompute", "keep"] = "recompute"
    backend: Literal["local", "ray"] = "local"
    workers: int = Field(1, ge=1)  # rollout workers (engine + agent loop + sandbox scoring each)
    worker_kind: Literal["thread", "process"] = "process"  # local async workers: threads share the GIL; processes do not
    # torch threads of a local process worker; None: cores // (workers + 1), at least 1. While rollouts run the trainer
    # keeps the other cores (oversubscribed OpenMP threads stall each other: 2+2 threads on 2 cores ran at 0.2x)
    worker_threads: int | None = Field(None, ge=1)
    weight_sync: Literal["auto", "inprocess", "shm", "files"] = "auto"  # auto: inprocess for threads, shm for processes
    buffer_capacity: int = Field(0, ge=0)  # groups held between workers and trainer; 0: (max_staleness + 2) x prompts_per_step
    buffer_order: Literal["fifo", "recency", "priority"] = "fifo"  # fifo trains each step on its own request (deterministic)
    request_timeout_s: float = Field(1800.0, gt=0)  # a request running longer (a hung episode) is killed and requeued
    max_retries: int = Field(2, ge=0)  # requeues of one request before its episodes count as infra errors
    # requests one worker runs at once, sharing its engine's batches; None: 1 + max_staleness (async), 1 (sync)
    worker_inflight: int | None = Field(None, ge=1)
    trainers: int = Field(1, ge=1)  # data-parallel trainer processes (torch.distributed: gloo on CPU, NCCL on GPU)
    # how trainers > 1 sync: ddp (DistributedDataParallel, full replicas) or fsdp2 (fully_shard: gradients and
    # optimizer state sharded over the trainers; rank 0 still keeps full weights for the rollouts)
    data_parallel: Literal["ddp", "fsdp2"] = "ddp"
    address: str | None = None  # ray: "auto" joins a running cluster (`ray start --head`); None starts a local one
    worker_cpus: float = Field(1.0, gt=0)  # ray: CPUs a rollout actor asks for
    worker_memory_gb: float | None = Field(None, gt=0)  # ray: memory a rollout actor asks for (None: no request)
    trainer_actor: bool = False  # ray: the trainer (and the controller) run in an actor; this process only waits and reports
    trainer_cpus: float = Field(1.0, gt=0)  # ray: CPUs the trainer actor asks for (its torch threads, rounded down, >= 1)
    trainer_gpus: float = Field(0.0, ge=0)  # ray: GPUs the trainer actor asks for
    trainer_memory_gb: float | None = Field(None, gt=0)  # ray: memory the trainer actor asks for (None: no request)
    trainer_restarts: int = Field(2, ge=0)  # ray: a trainer actor that dies is replaced this many times, resuming from its last checkpoint
    # ray: sandbox-pool actors that score replies and host agent episodes' environments for the rollout actors
    # (rollout actor k uses pool k mod N); 0: each rollout worker scores in its own process
    sandbox_pools: int = Field(0, ge=0)
    sandbox_cpus: float = Field(1.0, gt=0)  # ray: CPUs a sandbox-pool actor asks for
    sandbox_memory_gb: float | None = Field(None, gt=0)  # ray: memory a sandbox-pool actor asks for (None: no request)


class DomainConfig(Section):
    """One domain of a joint run (an item of the `domains:` list)."""
    family: str  # a built-in family, or your own as package.module:Name
    name: str | None = None  # unique in the run; None: the family name (name repeated families explicitly)
    version: str | None = None  # pin: refuse to train when the installed family has another version
    weight: float = Field(1.0, gt=0)  # share of rollout slots among drawable domains of the same priority
    priority: int = 0  # higher pre-empts: it takes every slot it can use before any lower priority is drawn
    budget_episodes: int | None = Field(None, ge=1)  # episodes (trajectories) after which it stops being drawn
    budget_tokens: int | None = Field(None, ge=1)  # tokens (prompt + completion) after which it stops being drawn
    difficulty: int = Field(1, ge=1, le=3)
    subfamilies: list[str] | None = None  # None: all sub-families of the family
    tasks: int = Field(256, ge=1)  # training pool size; the curriculum draws from it
    curriculum: str | None = None  # None: scheduling.curriculum
    max_turns: int | None = Field(None, ge=1)  # None: rollout.max_turns
    max_new_tokens: int | None = Field(None, ge=1)  # None: rollout.max_new_tokens
    exec_timeout_s: float | None = Field(None, gt=0)  # None: rollout.exec_timeout_s
    sandbox: dict = {}  # SandboxSpec fields (wall_s, memory_bytes, pids, network, ...) for this domain's episodes
    reward: str | None = None  # package.module:function (completions, tasks) -> rewards, replacing the verifier's reward
    reward_scale: float = 1.0  # shaped reward = reward_scale * reward + reward_offset
    reward_offset: float = 0.0
    require_envcheck: bool = True  # refuse the family without a current, passing envcheck manifest entry

    @property
    def key(self) -> str:
        return self.name or self.family


class SchedulingConfig(Section):
    """How domains share the rollout batch and how each domain picks its tasks."""
    mixing: Literal["stride", "sample"] = "stride"  # stride: deterministic weighted round robin (shares exact to a slot); sample: i.i.d. by weight
    curriculum: str = "uniform"  # default policy (longhaul.runtime.domains.curriculum): uniform, learnable_band, expected_signal, retire_solved, revisit_failures
    # what the curriculum's outcomes are kept per: each task, or each sub-family (its tasks share one record;
    # with few draws per task, the only way a policy learns which kinds of task carry signal)
    curriculum_unit: Literal["task", "subfamily"] = "task"
    window: int = Field(16, ge=1)  # recent outcomes kept per unit; its pass rate is over these
    min_samples: int = Field(4, ge=1)  # outcomes before a task's pass rate is trusted (fewer: it counts as unexplored)
    boost: float = Field(4.0, gt=0)  # weight of a favoured task (learnable band, recent failure) vs 1 for a neutral one
    floor: float = Field(0.1, ge=0)  # learnable_band: weight of a task stuck at 0 or 1 (kept > 0: the policy moves)


class LogConfig(Section):
    """Where a run's metrics go besides metrics.jsonl, which always has them (docs/training.md#trackers)."""
    # trackers (tensorboard, mlflow, wandb, trackio), each an optional dependency (pip install
    # 'longhaul[trackers]'), refused at the start when missing; None: tensorboard when installed
    report_to: list[str] | None = None
    project: str = "longhaul"  # the project (MLflow: experiment) each tracker files the run under; the run is `name`
    tables_every: int = Field(10, ge=0)  # a table of the step's episodes to the trackers every N steps (online runs); 0: none
    progress: bool = True
    # every command the run's sandboxes run, one JSON line each, in <run>/audit.jsonl (the console
    # shows an episode's); false: none
    audit: bool = True

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_alias(cls, data):
        """`tensorboard: true/false`, the key before report_to: false takes tensorboard out of
        report_to, true puts it in (with report_to unset, true is the default's meaning)."""
        if not isinstance(data, dict) or "tensorboard" not in data:
            return data
        data = dict(data)
        on, given = data.pop("tensorboard"), data.get("report_to")
        given = [given] if isinstance(given, str) else given
        if not on:
            data["report_to"] = [n for n in given or [] if n != "tensorboard"]
        elif given is not None and "tensorboard" not in given:
            data["report_to"] = [*given, "tensorboard"]
        return data

    @field_validator("report_to", mode="before")
    @classmethod
    def _trackers(cls, v):
        if v is None:
            return v
        names = [v] if isinstance(v, str) else v
        if not isinstance(names, list):
            raise ValueError("report_to must be a list of trackers, e.g. [tensorboard, wandb]")
        for n in names:
            if n not in TRACKERS:
                near = difflib.get_close_matches(str(n), TRACKERS, n=1)
                raise ValueError(f"unknown tracker {n!r}; {'did you mean ' + near[0] + '? ' if near else ''}"
                                 f"choose from {', '.join(TRACKERS)}")
        return list(dict.fromkeys(names))


class RunConfig(Section):
    name: str = "run"
    seed: int = 0
    output_dir: str = "runs"
    threads: int | None = None  # torch intra-op threads; None: all cores
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    algo: AlgoConfig = AlgoConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    data: DataConfig = DataConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    domains: list[DomainConfig] = []  # a joint multi-domain run (docs/scheduling.md); empty: task.family alone
    scheduling: SchedulingConfig = SchedulingConfig()
    log: LogConfig = LogConfig()

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name

    @model_validator(mode="after")
    def _inflight_kv_needs_the_engine(self):
        if self.rollout.sampler == "vllm" and self.runtime.inflight_kv == "keep":
            raise ValueError("runtime.inflight_kv keep needs rollout.sampler engine: vLLM re-prefills rollouts in flight "
                             "after a weight update; set inflight_kv: recompute, or use longhaul's engine")
        return self


class DemosConfig(Section):
    """The pipeline's demonstrations (longhaul.agent.demos)."""
    tasks: int = Field(48, ge=1)  # train tasks per family replayed into demonstrations
    variants: list[Literal["reference", "explore", "repair"]] = ["reference", "explore", "repair"]
    seed: int = 0  # seeds the exploration orders and wrong attempts


class PipelineEvalConfig(Section):
    tasks: int = Field(40, ge=1)  # held-out tasks per family; every stage is evaluated on the same ones, greedy
    max_turns: int = Field(10, ge=1)
    max_new_tokens: int = Field(192, ge=1)  # per reply
    batch_size: int = Field(32, ge=1)  # episodes of a set run side by side (a set of up to this many tasks runs as one batch)
    humaneval: bool = True  # also HumanEval pass@1 of the base and the final model (does agent training cost coding?)
    humaneval_tasks: int = Field(164, ge=1, le=164)  # the first N of HumanEval's 164 problems
    show: int = Field(3, ge=0)  # held-out episodes shown turn by turn in the report, before and after
    # a family's held-out tasks split evenly over its sub-families (else each task draws one at random,
    # and a set of 30 can hold 11 of one kind): one sub-family's behaviour does not swing the result
    stratify: bool = True


class PipelineConfig(Section):
    """`longhaul pipeline`: demonstrations, SFT, multi-turn RL, and the three-way evaluation."""
    name: str = "agent"
    seed: int = 0
    output_dir: str = "runs"
    model: ModelConfig = ModelConfig(context_length=4096)
    families: list[str] = ["multistep", "terminal"]  # workspace families of the demonstrations, the RL and the evaluation
    difficulty: int = Field(1, ge=1, le=3)
    # family -> the sub-families its demonstrations, RL and evaluation use (a family not named: all of them)
    subfamilies: dict[str, list[str]] = {}
    # "family/subfamily": never in the demonstrations or the RL; evaluated apart (does the skill transfer?)
    heldout_subfamilies: list[str] = []
    demos: DemosConfig = DemosConfig()
    sft: dict[str, Any] = {}  # a RunConfig fragment over the SFT stage's defaults (e.g. {train: {steps: 40}})
    rl: dict[str, Any] = {}  # a RunConfig fragment over the RL stage's defaults (grpo from the SFT weights)
    eval: PipelineEvalConfig = PipelineEvalConfig()
    stages: list[Literal["sft", "rl"]] = ["sft", "rl"]  # ablations drop one: rl alone starts from the base model

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.name


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise LonghaulError(f"override {dotted!r}: {key!r} is a value, not a section")
        node = child
    node[keys[-1]] = value


def _section_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section model at a validation error's location (list items like domains.2 included)."""
    import typing

    for part in loc:
        if isinstance(part, int):
            continue  # an item of the list the previous part named
        field = model.model_fields.get(str(part))
        ann = field.annotation if field is not None else None
        if typing.get_origin(ann) is list:
            ann = typing.get_args(ann)[0]
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


def _explain(err: ValidationError, model: type[BaseModel]) -> str:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    dotted = ".".join(str(p) for p in loc)
    if first["type"] == "extra_forbidden":
        parent = _section_at(model, loc[:-1])
        valid = sorted(parent.model_fields) if parent else []
        near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        prefix = ".".join(str(p) for p in loc[:-1])
        hint = f"did you mean {prefix + '.' if prefix else ''}{near[0]}?" if near else f"valid keys: {', '.join(valid)}"
        return f"unknown config key {dotted!r}; {hint}"
    msg = first["msg"].removeprefix("Value error, ")
    if not loc:  # a check across sections: its message names the keys
        return f"config: {msg}"
    return f"config key {dotted!r}: {msg} (got {first.get('input')!r})"


def load_config(path: str | Path | None, overrides: list[str] = (), model: type[BaseModel] = RunConfig):
    """Read YAML (or nothing), apply `a.b=value` overrides (values parsed as YAML), validate."""
    tree: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise LonghaulError(f"config file {str(p)!r} not found; pass an existing YAML file (see examples/)")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise LonghaulError(f"config file {str(p)!r} is not valid YAML: {str(e).splitlines()[0]}") from e
        if not isinstance(tree, dict):
            raise LonghaulError(f"config file {str(p)!r} must hold a mapping of sections at the top")
    for item in overrides:
        if "=" not in item:
            raise LonghaulError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), yaml.safe_load(raw) if raw else "")
    return validate_config(tree, model)


def validate_config(tree: dict, model: type[BaseModel] = RunConfig):
    """The config a tree of sections describes, or one line that names the bad key."""
    try:
        return model.model_validate(tree)
    except ValidationError as e:
        raise LonghaulError(_explain(e, model)) from e


def dump_config(cfg: BaseModel) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
