"""vLLM in its own interpreter, for `rollout.sampler: vllm` (`vllm_engine.VLLMEngine`).

vLLM pins versions of transformers, fastapi and setuptools that longhaul's own environment does
not share, so it lives in a virtual environment of its own (`make vllm`: `.venv-vllm`) and this
file runs there as a script: it imports nothing of longhaul, only the standard library, torch,
safetensors and vllm. One JSON object a line on stdin, one answer a line on stdout (vLLM's own
logging goes to stderr), each answer carrying its command's `id`; commands are taken while the
engine steps, so answers come in the order calls finish:

- `{"op": "generate", "id": N, "prompts": [[ids]], "params": [{...}]}` -> `{"id": N, "outputs":
  [{"token_ids", "logprobs", "versions", "finish_reason"}]}`: each prompt with its own
  SamplingParams fields (max_tokens, temperature, top_p, seed, stop); the log-prob of each
  sampled token under the distribution it was sampled from (vLLM's `processed_logprobs`,
  longhaul's `"processed"`) and the weight version it was sampled under. The prompts join the
  batch in flight: calls from many episodes share the engine's steps.
- `{"op": "load", "id": N, "path": FILE, "version": V}` -> `{"id": N, "loaded": n}`: between two
  steps, the safetensors file's tensors replace the model's weights in place (the worker's
  `reload_weights`, which re-processes them into the layout its kernels use, else the model's
  `load_weights`) and the prefix cache is reset with the running requests preempted: requests
  in flight keep the tokens they have, re-prefill under the new weights and go on (partial
  rollouts), their later tokens stamped V;
- `{"op": "pause", "id": N}` -> `{"id": N, "paused": true}` once the step in flight has ended: no
  step runs until `{"op": "resume", "id": N}` -> `{"id": N, "resumed": true}`; requests in flight
  keep their K/V and tokens, and calls made meanwhile join them;
- `{"op": "quit"}`.
Errors answer `{"id": N, "error": "..."}` and the worker goes on.

The first argument is a JSON object of `vllm.LLM` settings (model, dtype, max_model_len, seed,
...). The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a weight
load reaches the model directly.
"""

import json
import os
import queue
import sys
import threading


def _sampling(p: dict, SamplingParams, delta):
    return SamplingParams(max_tokens=p["max_tokens"], temperature=p.get("temperature", 0.0), top_p=p.get("top_p", 1.0),
                          seed=p.get("seed"), stop=p.get("stop") or None, include_stop_str_in_output=True,
                          skip_special_tokens=False, logprobs=0, output_kind=delta)


def _answer(out, msg: dict) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def _read(inbox: queue.Queue) -> None:
    for line in sys.stdin:
        inbox.put(json.loads(line))
    inbox.put({"op": "quit"})  # the caller is gone


class Worker:
    """The engine and the calls in flight: each call's requests, their tokens, log-probs and
    versions so far."""

    def __init__(self, llm, out):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        try:
            from vllm.inputs import tokens_input
        except ImportError:  # before engine inputs had a type: the prompt dict as the LLM API takes it
            tokens_input = lambda ids: {"prompt_token_ids": ids}  # noqa: E731
        self.llm, self.engine, self.out = llm, llm.llm_engine, out
        self.params = lambda p: _sampling(p, SamplingParams, RequestOutputKind.DELTA)
        self.prompt = tokens_input
        self.version = 0
        self.paused = False
        self.calls: dict = {}  # call id -> [request ids, requests left]
        self.seqs: dict = {}  # request id -> {"token_ids", "logprobs", "versions", "finish_reason"}

    def generate(self, cmd: dict) -> None:
        cid, added = cmd["id"], []
        try:
            for i, (ids, p) in enumerate(zip(cmd["prompts"], cmd["params"])):
                rid = f"{cid}.{i}"
                self.seqs[rid] = {"token_ids": [], "logprobs": [], "versions": [], "finish_reason": None}
                self.engine.add_request(rid, self.prompt(list(ids)), self.params(p))
                added.append(rid)
        except Exception:
            if added:
                self.engine.abort_request(added)
            for i in range(len(cmd["prompts"])):
                self.seqs.pop(f"{cid}.{i}", None)
            raise
        if added:
            self.calls[cid] = [added, len(added)]
        else:
            _answer(self.out, {"id": cid, "outputs": []})

    def load(self, cmd: dict) -> int:
        from safetensors.torch import load_file

        tensors = load_file(cmd["path"])
        try:  # the weights in checkpoint form, re-processed into the kernels' layout (CPU linears are repacked)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors.items()), "is_checkpoint_format": True})
        except AttributeError:  # an older worker without in-place reload: plain parameters only
            self.llm.apply_model(lambda model: model.load_weights(tensors.items()))
        self.version = int(cmd["version"])  # every later token comes from these weights
        # no block computed with the old weights is reused; requests in flight re-prefill
        try:
            reset = self.engine.reset_prefix_cache(reset_running_requests=True)
        except TypeError:  # a vLLM that resets only an idle cache
            reset = self.engine.reset_prefix_cache()
        if reset is False:
            raise RuntimeError("vLLM kept its prefix cache after the weight load (requests were running)")
        return len(tensors)

    def step(self) -> None:
        for o in self.engine.step():
            seq = self.seqs.get(o.request_id)
            if seq is None:
                continue
            c = o.outputs[0]
            ids = list(c.token_ids)
            seq["token_ids"] += ids
            seq["logprobs"] += [lp[t].logprob for lp, t in zip(c.logprobs or [], ids)]
            seq["versions"] += [self.version] * len(ids)
            if o.finished:
                seq["finish_reason"] = c.finish_reason or "stop"
                self.finish(int(o.request_id.rsplit(".", 1)[0]))

    def fail_all(self, why: str) -> None:
        rids = [rid for rids, _ in self.calls.values() for rid in rids]
        if rids:
            self.engine.abort_request(rids)
        for cid in list(self.calls):
            _answer(self.out, {"id": cid, "error": why})
        self.calls.clear()
        self.seqs.clear()

    def finish(self, cid: int) -> None:
        call = self.calls[cid]
        call[1] -= 1
        if call[1] == 0:
            del self.calls[cid]
            _answer(self.out, {"id": cid, "outputs": [self.seqs.pop(rid) for rid in call[0]]})


def main() -> None:
    settings = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out, sys.stdout = sys.stdout, sys.stderr  # nothing but answers on the protocol's stream
    import vllm
    from vllm import LLM

    missing = [f"LLM.{name}" for name in ("apply_model", "reset_prefix_cache") if not hasattr(LLM, name)]
    if missing:
        _answer(out, {"fatal": f"vLLM {vllm.__version__} lacks {', '.join(missing)}, which longhaul's vllm sampler needs "
                               "(weights replaced in place); install vLLM 0.10 or later"})
        return
    # steps one at a time: with asynchronous scheduling a batch already launched when a weight
    # load arrives would run on the old weights and its tokens be stamped with the new version
    try:
        try:
            llm = LLM(logprobs_mode="processed_logprobs", async_scheduling=False, **settings)
        except TypeError as e:
            if "async_scheduling" not in str(e):
                raise
            llm = LLM(logprobs_mode="processed_logprobs", **settings)  # a vLLM that always steps one at a time
    except TypeError as e:
        _answer(out, {"fatal": f"vLLM {vllm.__version__} does not take an LLM setting longhaul needs ({e}); install vLLM 0.10 or later"})
        return
    worker = Worker(llm, out)
    _answer(out, {"ready": vllm.__version__})
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_read, args=(inbox,), daemon=True).start()
    while True:
        busy = not worker.paused and worker.engine.has_unfinished_requests()
        try:  # every command waiting, then a step; with nothing to step, wait for one
            cmd = inbox.get(block=not busy)
        except queue.Empty:
            try:
                worker.step()
            except Exception as e:  # every call in flight fails with it; the worker serves on
                worker.fail_all(f"{type(e).__name__}: {e}")
            continue
        if cmd["op"] == "quit":
            break
        try:
            if cmd["op"] == "generate":
                worker.generate(cmd)
            elif cmd["op"] == "load":
                _answer(out, {"id": cmd["id"], "loaded": worker.load(cmd)})
            elif cmd["op"] in ("pause", "resume"):
                worker.paused = cmd["op"] == "pause"
                _answer(out, {"id": cmd["id"], "paused" if worker.paused else "resumed": True})
            else:
                _answer(out, {"id": cmd.get("id"), "error": f"unknown op {cmd['op']!r}"})
        except Exception as e:  # the caller raises it; the worker serves on
            _answer(out, {"id": cmd.get("id"), "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
