"""`LLMEngine`: the paged inference engine behind rollouts and serving, shaped like vLLM's.

Owns the request lifecycle and the step loop: add requests, `step()` (schedule, one forward,
sample, stop), outputs, weight updates with versions, pause/resume and metrics. The parts
live beside it: `scheduler` (who runs), `block_manager` (blocks, prefix cache), `kv_cache`
(storage), `model_runner` (forward), `sampling` (params and sampler), `sequence` (a
request's state). Does not own tokenization templates (callers pass text or token ids) or
HTTP serving.

    engine = LLMEngine(model="smollm2-135m-instruct", dtype="bfloat16")
    outs = engine.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.8, seed=1))
    outs[0].token_ids, outs[0].logprobs, outs[0].weight_version, outs[0].finish_reason

RL hooks. `update_weights(tensors | path, version)` copies HF-named tensors into the runner in
place and drops all K/V and the prefix cache (computed under the old weights); requests in
flight re-prefill their prompt and tokens so far under the new weights and continue, so a
rollout can span versions (partial rollouts) with `weight_version` recorded per token.
`pause()` / `resume()` may be called from another thread: `pause()` returns once the step in
flight (if any) has ended, and no step runs until `resume()`.

Speculative decoding (`speculative_config`, driven by `spec_worker.SpecDecoder`, which takes
over forward + sample of a scheduled step) builds on two entry points: `ModelRunner.prepare` /
`forward` with `BatchItem(num_logits=k + 1)` scores k drafts per sequence in one forward (the
prefill-chunk path over the existing cache), and `truncate(request_id, num_tokens)` rolls a
sequence's K/V back to its accepted tokens.

Deviations from vLLM: n = 1 only; outputs are cumulative snapshots; `generate()` drives the
step loop itself and should not share the engine with a concurrent `step()` caller; several
threads may call `generate()` at once (each step serves all their requests as one batch).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from longhaul.errors import LonghaulError
from longhaul.inference.block_manager import BlockManager, chain_hash
from longhaul.inference.config import EngineConfig
from longhaul.inference.engine_loop import EngineLoop
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.kv_offload import KVOffload, weights_namespace
from longhaul.inference.kv_quant import kv_bytes_per_token, make_kv_cache
from longhaul.inference.model_runner import BatchItem, ModelRunner
from longhaul.inference.outputs import RequestOutput, output_of
from longhaul.inference.gguf_weights import gguf_packer, read_blocks
from longhaul.inference.quant import quantize_linear
from longhaul.inference.quant_blocks import BlockLinear
from longhaul.inference.sampling import SamplingParams, by_temperature_only, sample
from longhaul.inference.scheduler import Scheduler
from longhaul.inference.sequence import Sequence, detokenizer
from longhaul.inference.spec_worker import SpecDecoder, SpeculativeConfig
from longhaul.inference.threads import ThreadGovernor
from longhaul.models import gguf_file, load_policy
from longhaul.models.lora import is_adapter_dir, is_lora


class LLMEngine:
    def __init__(self, model="smollm2-135m-instruct", dtype: str = "float32", tokenizer=None, speculative_config=None, **kwargs):
        """model: a name / path for `longhaul.models.load_policy`, or an HF model object (then
        pass its tokenizer, or None to work on token ids only). speculative_config: a
        `spec_worker.SpeculativeConfig` (or its dict) to decode speculatively. kwargs:
        `EngineConfig` fields."""
        if isinstance(model, (str, Path)):
            hf, tokenizer = load_policy(str(model))
            label = str(model)
        else:
            hf, label = model, getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.config = cfg = EngineConfig(model=label, dtype=dtype, **kwargs)
        self.tokenizer = tokenizer
        mcfg = hf.config
        self.max_model_len = cfg.max_model_len or mcfg.max_position_embeddings
        self.kv = _make_kv_cache(cfg, mcfg, self.max_model_len)
        num_blocks = self.kv.num_blocks
        self.runner = ModelRunner(hf, self.kv, cfg.torch_dtype, cfg.device, max_positions=self.max_model_len)
        if cfg.quantization:
            self.runner.pack_weights(*_packers(cfg, self.runner, model if isinstance(model, (str, Path)) else None))
        self.runner.drop_plain()  # the packed projections are all the engine keeps of them
        source = cfg.kv_offload_namespace or (str(model) if isinstance(model, (str, Path)) else None)
        self.kv_namespace = None if source is None else \
            weights_namespace(source, cfg.dtype, cfg.quantization, cfg.block_size, cfg.kv_cache_dtype)  # None: private
        self.block_manager = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching, _make_offload(cfg, self.kv,
                                                                                                               self.kv_namespace))
        self.scheduler = Scheduler(self.block_manager, cfg.max_num_seqs, cfg.max_num_batched_tokens)
        self.vocab_size = self.runner.embed.shape[0]
        self.eos_token_ids = _eos_ids(hf, tokenizer)
        self.weight_version = 0
        self.requests: dict[str, Sequence] = {}
        self.prompt_tokens_total = self.generation_tokens_total = 0
        self._num_added = 0
        self._generate_calls = 0
        self.step_hook = None  # called by the stepping thread before each step (e.g. to set its torch threads)
        self._step_lock = threading.Lock()  # held for the whole of a step or a weight update
        self._loop: EngineLoop | None = None  # `loop()`: the stepping thread for callers on many threads
        self._cond = threading.Condition()
        self._paused = False
        self.spec = None  # a spec_worker.SpecDecoder takes over forward + sample when set
        self.loras: dict[str, int] = {}  # LoRA adapter name -> the runner's slot
        self._lora_roots: dict[str, int] = {}  # name -> the prefix-cache root of its requests (new at each replacement)
        self._lora_updates = 0
        self.threads = ThreadGovernor() if cfg.adaptive_threads else None  # intra-op threads from measured step times
        self.step_threads = 0  # the intra-op thread count the last step ran with
        if speculative_config is not None:
            sc = speculative_config if isinstance(speculative_config, SpeculativeConfig) else SpeculativeConfig(**speculative_config)
            self.spec = SpecDecoder(self, sc)

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None) -> None:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise LonghaulError(f"request id {request_id!r} is already in the engine; use a unique id")
        text = prompt if isinstance(prompt, str) else None
        if text is not None:
            if self.tokenizer is None:
                raise LonghaulError("this engine has no tokenizer; pass prompts as token id lists")
            ids = self.tokenizer.encode(text)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise LonghaulError(f"request {request_id!r} has an empty prompt; give it at least one token")
        if len(ids) >= self.max_model_len:
            raise LonghaulError(f"request {request_id!r} has {len(ids)} prompt tokens, at least max_model_len={self.max_model_len}; shorten it")
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise LonghaulError(f"request {request_id!r} has token ids outside the vocabulary [0, {self.vocab_size})")
        if params.stop_strings and self.tokenizer is None:
            raise LonghaulError("stop strings need a tokenizer; pass one to LLMEngine or use stop_token_ids")
        seed = params.seed if params.seed is not None else (self.config.seed * 1_000_003 + self._num_added) % 2**63
        seq = Sequence(request_id, ids, params, self.eos_token_ids, seed, self.max_model_len, text)
        if params.lora is not None:
            if params.lora not in self.loras:
                have = ", ".join(self.loras) or "none added"
                raise LonghaulError(f"request {request_id!r} asks for LoRA adapter {params.lora!r}, which this engine does not have "
                                    f"({have}); add it with add_lora first")
            if self.spec is not None:
                raise LonghaulError("LoRA adapters do not run with speculative decoding; drop speculative_config or the adapter")
            seq.lora, seq.cache_root = self.loras[params.lora], self._lora_roots[params.lora]
        worst = self.block_manager.blocks_for(seq.num_prompt_tokens + seq.max_tokens)
        if worst > self.block_manager.num_blocks:
            raise LonghaulError(f"request {request_id!r} may need {worst} KV blocks but the pool has {self.block_manager.num_blocks}; "
                                f"raise kv_cache_memory_gb / num_kv_blocks or lower max_tokens")
        with self._step_lock:  # a server thread may add while another steps
            self._num_added += 1
            self.requests[request_id] = seq
            self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; returns its final output (finish_reason "abort"), or None if unknown."""
        with self._step_lock:
            seq = self.requests.pop(request_id, None)
            if seq is None:
                return None
            if not seq.finished:
                self.scheduler.finish(seq, "abort")
            return output_of(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduling step. Returns an output for every request that got a token (its
        last one has `finished=True`); finished requests then leave the engine. Returns []
        while paused."""
        outs = [output_of(s) for s in self._step()]
        for o in outs:
            if o.finished:
                self.requests.pop(o.request_id, None)
        return outs

    @torch.inference_mode()
    def _step(self) -> list[Sequence]:
        if self.step_hook is not None:
            self.step_hook()
        with self._step_lock:
            if self._paused:
                return []
            batch = self.scheduler.schedule()
            if not batch:
                return []
            threads = self.threads
            self.step_threads = threads.begin((len(batch.seqs), sum(batch.num_new_tokens))) if threads is not None \
                else torch.get_num_threads()
            try:
                return self._run(batch)
            finally:
                if threads is not None:
                    threads.end()

    def _run(self, batch) -> list[Sequence]:
        """Forward and sample one scheduled batch (under the step lock)."""
        if self.spec is not None:
            return self.spec.step(batch)
        if all(n == 1 for n in batch.num_new_tokens):
            done = self._run_whole(batch)
            if done is not None:
                return done
        items = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            c = seq.num_computed_tokens
            items.append(BatchItem(seq.token_ids[c:c + n], c, seq.block_table, int(c + n == seq.num_tokens), seq.lora))
        logits = self.runner.forward(self.runner.prepare(items))
        sampling = [s for s, it in zip(batch.seqs, items) if it.num_logits]
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.block_manager.cache_blocks(seq)
        if not sampling:
            return []
        res = sample(logits, [s.params for s in sampling], [s.generator for s in sampling], [s.banned_tokens() for s in sampling])
        return self._append(sampling, res.token_ids, res.logprobs, res.top_logprobs)

    def _run_whole(self, batch) -> list[Sequence] | None:
        """A batch of one new token a sequence, each drawn with its temperature alone, in the
        runner's one native call (`ModelRunner.decode_sample`); None where it needs the general
        path. At batch 1 the general path's Python and torch calls between two weight streams
        cost several percent of a token."""
        seqs = batch.seqs
        if not all(by_temperature_only(s.params) and not s.banned_tokens() for s in seqs):
            return None
        items = [BatchItem(s.token_ids[s.num_computed_tokens:s.num_computed_tokens + 1], s.num_computed_tokens, s.block_table,
                           1, s.lora) for s in seqs if s.num_computed_tokens + 1 == s.num_tokens]
        if len(items) != len(seqs):
            return None
        res = self.runner.decode_sample(items, [s.params.temperature for s in seqs], [s.generator for s in seqs])
        if res is None:
            return None
        for seq in seqs:
            seq.num_computed_tokens += 1
            self.block_manager.cache_blocks(seq)
        return self._append(seqs, res[0], res[1], [None] * len(seqs))

    def _append(self, seqs: list[Sequence], tokens: list[int], logprobs: list[float], top: list) -> list[Sequence]:
        """Record each sequence's sampled token; finished ones leave the scheduler."""
        tok = detokenizer(self.tokenizer)
        for b, seq in enumerate(seqs):
            if seq.num_output_tokens == 0:
                self.prompt_tokens_total += seq.num_prompt_tokens
            seq.append_token(tokens[b], logprobs[b], top[b], self.weight_version, tok)
            self.generation_tokens_total += 1
            if seq.finish_reason is not None:
                self.scheduler.finish(seq, seq.finish_reason)
        return seqs

    def generate(self, prompts: list[str] | list[list[int]], params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """Run prompts to completion; outputs in prompt order. Waits (does not return) while
        the engine is paused from another thread."""
        if prompts and isinstance(prompts[0], int):
            raise LonghaulError("generate() takes a list of prompts; wrap a single token-id prompt in a list")
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise LonghaulError(f"got {len(plist)} SamplingParams for {len(prompts)} prompts; pass one or one a prompt")
        with self._step_lock:  # several threads may generate at once (their requests share the batch)
            self._generate_calls += 1
            call = self._generate_calls
        ids = [f"generate-{call}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, plist):
            self.add_request(rid, prompt, p)
        seqs = [self.requests[r] for r in ids]
        try:
            while not all(s.finished for s in seqs):  # an abort from another thread also finishes one
                with self._cond:
                    self._cond.wait_for(lambda: not self._paused)
                self._step()
        finally:
            if self.threads is not None:
                self.threads.release()
        for r in ids:
            self.requests.pop(r, None)
        return [output_of(s) for s in seqs]

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Keep the K/V of a request's first num_tokens tokens (speculative decoding rollback);
        whole blocks past the new end are freed. The caller trims `token_ids` to match."""
        seq = self.requests[request_id]
        for src, dst in self.block_manager.truncate(seq, num_tokens):
            self.kv.copy_block(src, dst)

    # ---- RL hooks ------------------------------------------------------------------------
    def pause(self) -> None:
        """Stop stepping; returns once any step in flight has finished. Thread-safe."""
        with self._cond:
            self._paused = True
        with self._step_lock:
            pass

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def update_weights(self, weights: dict[str, torch.Tensor] | str | Path, version: int, keep_kv: bool = False) -> int:
        """Load HF-named tensors (a dict, a safetensors file or a directory of them) in place
        and tag later tokens with `version`. The prefix cache is dropped (no later request
        reuses K/V of the old weights). In-flight requests re-prefill under the new weights, or
        with `keep_kv` keep the K/V they have and go on decoding over it (PipelineRL's in-flight
        update: no prefill again, but later tokens attend over the old weights' K/V, so none of
        their blocks enters the prefix cache; the log-probs recorded are still those the tokens
        were sampled with). Returns tensors loaded."""
        if self.config.quantization == "gguf":
            raise LonghaulError("this engine runs the weights of a GGUF file as stored and cannot load new ones; "
                                "quantize at load instead (quantization q4_1, q4_0 or q8_0)")
        tensors = weights if isinstance(weights, dict) else _read_weights(Path(weights))
        with self._step_lock:
            loaded = self.runner.load_weights(tensors)
            if keep_kv:
                for seq in self.scheduler.running:  # their later blocks attend over the old K/V: never shared
                    seq.kv_stale = True
            else:
                self.scheduler.preempt_all()
            self.kv_namespace = None  # new weights: the offload tier's blocks are this engine's alone
            self.block_manager.flush()
            self.weight_version = int(version)
        return loaded

    # ---- LoRA adapters -------------------------------------------------------------------
    def add_lora(self, name: str, adapter, scale: float | None = None, version: int | None = None) -> int:
        """Add (or replace) the LoRA adapter `name`: a peft-wrapped model, a directory with
        `adapter_model.safetensors` and `adapter_config.json`, or a dict of PEFT-named lora_A /
        lora_B tensors with `scale` (alpha / r). Requests with `SamplingParams(lora=name)` run
        with it, batched with the base model's and other adapters' requests in the same steps.
        Replacing an adapter re-prefills its requests in flight under the new weights and keeps
        its old K/V out of the prefix cache. `version`, as `update_weights`'s, tags later tokens.
        Returns the adapter's slot."""
        tensors, scale = _adapter_tensors(adapter, scale)
        with self._step_lock:
            slot = self.loras.get(name) or max([0, *self.loras.values()]) + 1
            self.runner.set_lora(slot, tensors, scale)
            self._lora_updates += 1
            root = chain_hash(None, (-1, slot, self._lora_updates))  # no token id is negative: apart from every prompt
            self.loras[name], self._lora_roots[name] = slot, root
            for seq in [s for s in self.scheduler.running if s.lora == slot]:
                self.scheduler.running.remove(seq)
                self.scheduler.preempt(seq, count=False)
            for seq in self.scheduler.waiting:
                if seq.lora == slot:
                    seq.cache_root, seq.block_hashes = root, []
            if version is not None:
                self.weight_version = int(version)
        return slot

    def remove_lora(self, name: str) -> None:
        with self._step_lock:
            if name not in self.loras:
                raise LonghaulError(f"no LoRA adapter {name!r} in this engine; it has {', '.join(self.loras) or 'none'}")
            if any(s.lora == self.loras[name] for s in self.requests.values() if not s.finished):
                raise LonghaulError(f"LoRA adapter {name!r} has requests in flight; let them finish or abort them first")
            self.runner.drop_lora(self.loras.pop(name))
            del self._lora_roots[name]

    def loop(self) -> EngineLoop:
        """This engine's own stepping thread for requests submitted from many threads at once
        (rollout episodes): started by the first submit, ended after a second with nothing to do,
        so an engine no one uses is not kept alive by it. Not for use beside `generate()` or
        another loop stepping the same engine."""
        with self._step_lock:
            if self._loop is None:
                self._loop = EngineLoop(self, idle_exit_s=1.0)
            return self._loop

    def sleep(self) -> int:
        """Give the KV pool's memory back while the engine idles (vLLM's sleep, level 1): its
        pages return to the OS and the prefix cache is dropped, but the pool stays allocated and
        pages back in, zero-filled, as later requests write it; nothing to wake. For a process
        that trains between rollouts on the same memory: a trainer's step and an idle 1 GB pool
        need not be resident at once. Requests in the engine: an error. Returns the bytes handed
        back."""
        with self._step_lock:
            live = len(self.scheduler.running) + len(self.scheduler.waiting)
            if live:
                raise LonghaulError(f"the engine has {live} requests in flight and cannot sleep; finish or abort them first")
            self.block_manager.flush(self.kv_namespace)
            freed = self.kv.discard()
            if self.spec is not None and self.spec.draft is not None:
                freed += self.spec.draft.kv.discard()
            return freed

    def flush_prefix_cache(self) -> None:
        """Forget every cached block, the offload tiers' too."""
        with self._step_lock:
            self.block_manager.flush(self.kv_namespace)

    def stats(self) -> dict[str, float | int]:
        """Current gauges and counters under vLLM's metric names."""
        bm = self.block_manager
        return {
            "num_requests_running": len(self.scheduler.running),
            "num_requests_waiting": len(self.scheduler.waiting),
            "kv_cache_usage_perc": bm.usage(),
            "prefix_cache_queries": bm.prefix_cache_queries,
            "prefix_cache_hits": bm.prefix_cache_hits,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "num_preemptions_total": self.scheduler.num_preemptions_total,
            "num_recomputed_total": self.scheduler.num_recomputed_total,
            "weight_version": self.weight_version,
            "engine_threads": self.step_threads,  # intra-op threads of the last step (0: none yet)
            "thread_switches_total": self.threads.switches if self.threads is not None else 0,
            **(bm.offload.stats() if bm.offload is not None else KVOffload.no_stats()),
        }


def _packers(cfg: EngineConfig, runner: ModelRunner, model: str | Path | None):
    """(projection packer, LM head packer) for `cfg.quantization`."""
    q, dtype = cfg.quantization, cfg.torch_dtype
    if q == "int8":
        return quantize_linear, quantize_linear
    if q == "gguf":
        path = gguf_file(str(model)) if model is not None else None
        if path is None:
            raise LonghaulError(f"quantization gguf needs a model loaded from a GGUF file, and {model or 'a model object'} is not; "
                                f"pass a .gguf path or smollm2-135m-instruct, or quantize at load (q4_1, q4_0, q8_0)")
        packer = gguf_packer(runner, read_blocks(path, runner.config), dtype)
        return packer, packer
    return ((lambda w, b: (BlockLinear.from_float(w, q, b, dtype), None)),
            (lambda w, b: (BlockLinear.from_float(w, "q8_0", b, dtype), None)))  # llama.cpp's head format


def _make_offload(cfg: EngineConfig, kv: KVCache, namespace: str | None) -> KVOffload | None:
    if cfg.kv_offload_memory_gb <= 0 and cfg.kv_offload_dir is None:
        return None
    if not cfg.enable_prefix_caching:
        raise LonghaulError("the KV offload tier keeps the prefix cache's evicted blocks and prefix caching is off; "
                            "set enable_prefix_caching true or drop kv_offload_memory_gb / kv_offload_dir")
    return KVOffload(kv, int(cfg.kv_offload_memory_gb * 2**30), cfg.kv_offload_dir, int(cfg.kv_offload_disk_gb * 2**30),
                     namespace)


def _make_kv_cache(cfg: EngineConfig, mcfg, max_model_len: int) -> KVCache:
    """The KV pool: `num_kv_blocks`, else as many blocks as kv_cache_memory_gb holds (but no
    more than max_num_seqs sequences of max_model_len need, and no fewer than one such sequence
    needs: a pool that cannot hold one would refuse requests the context admits)."""
    head_dim = getattr(mcfg, "head_dim", None) or mcfg.hidden_size // mcfg.num_attention_heads
    shape = (mcfg.num_hidden_layers, mcfg.num_key_value_heads, head_dim)
    if cfg.kv_cache_dtype == "auto":
        per_token = KVCache.bytes_per_token(*shape, cfg.torch_dtype)
    else:
        per_token = kv_bytes_per_token(cfg.kv_cache_dtype, *shape, cfg.torch_dtype, cfg.block_size)
    one_seq = -(-max_model_len // cfg.block_size)
    num_blocks = cfg.num_kv_blocks or max(one_seq, min(int(cfg.kv_cache_memory_gb * 2**30) // (per_token * cfg.block_size),
                                                       cfg.max_num_seqs * one_seq))
    if cfg.kv_cache_dtype == "auto":
        return KVCache(mcfg.num_hidden_layers, num_blocks, cfg.block_size, mcfg.num_key_value_heads, head_dim, cfg.torch_dtype, cfg.device)

    return make_kv_cache(cfg.kv_cache_dtype, mcfg.num_hidden_layers, num_blocks, cfg.block_size, mcfg.num_key_value_heads,
                         head_dim, cfg.torch_dtype, cfg.device)


def _eos_ids(model, tokenizer) -> set[int]:
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids = set([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise LonghaulError(f"{str(path)!r} holds no .safetensors files; save the weights with save_pretrained or safetensors")
        return {k: v for f in files for k, v in load_file(f).items()}
    if path.suffix == ".safetensors" and path.is_file():
        return load_file(path)
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    raise LonghaulError(f"weights {str(path)!r} not found; pass a dict of tensors, a .safetensors file or a directory")


def _adapter_tensors(adapter, scale: float | None) -> tuple[dict[str, torch.Tensor], float]:
    """(PEFT-named lora_A / lora_B tensors, alpha / r) of a peft model, an adapter directory, or
    a dict of tensors with its scale."""
    if isinstance(adapter, dict):
        if scale is None:
            raise LonghaulError("a LoRA adapter given as tensors needs its scale (lora_alpha / r); pass scale=")
        return adapter, float(scale)
    if isinstance(adapter, (str, Path)):
        import json

        from safetensors.torch import load_file

        path = Path(adapter)
        if not is_adapter_dir(path):
            raise LonghaulError(f"{path} is not a LoRA adapter directory; it needs adapter_model.safetensors and adapter_config.json")
        cfg = json.loads((path / "adapter_config.json").read_text())
        return load_file(path / "adapter_model.safetensors"), _peft_scale(cfg["lora_alpha"], cfg["r"], cfg.get("use_rslora", False))
    if is_lora(adapter):
        cfg = adapter.peft_config[adapter.active_adapter]
        active = f".{adapter.active_adapter}."
        tensors = {n.replace(active, "."): p.detach() for n, p in adapter.named_parameters() if "lora_" in n and active in n}
        return tensors, _peft_scale(cfg.lora_alpha, cfg.r, getattr(cfg, "use_rslora", False))
    raise LonghaulError(f"a LoRA adapter is a peft model, an adapter directory or a dict of tensors, not a {type(adapter).__name__}")


def _peft_scale(alpha: float, r: int, rslora: bool) -> float:
    return alpha / r ** 0.5 if rslora else alpha / r
