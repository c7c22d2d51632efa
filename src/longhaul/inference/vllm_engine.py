"""vLLM as a rollout and evaluation engine (`rollout.sampler: vllm`), behind the same calls as
the built-in engine: `generate` (through `rollout_sampler.generate`) returns token ids, the
log-prob of each under the distribution it was sampled from, and the weight version of each;
`update_weights(tensors, version)` replaces the weights in place, without a restart.

vLLM runs in its own interpreter (`vllm_worker.py`: its pinned dependencies do not share
longhaul's environment), found as `$LONGHAUL_VLLM_PYTHON`, else this interpreter when it can
import vllm; `make vllm` builds `.venv-vllm` with vLLM's CPU build. The model goes to the worker
as an HF directory (a policy in memory is saved to a temporary one first); new weights travel as
one safetensors file in shared memory (/dev/shm where it exists) and are reloaded in place
(`vllm_worker.py` says how).

Calls from many threads run at once, as on the built-in engine: each call's prompts join the
worker's batch in flight, and its answer comes when its last completion ends. A weight update
lands between two engine steps without waiting for the rollouts in flight: they keep the tokens
they have, re-prefill under the new weights and go on (partial rollouts), each token recording
the version it was sampled under. `pause()` and `resume()` hold the rollouts in flight between two
steps, as on the built-in engine.

Sampling semantics are longhaul's `SamplingParams`: temperature 0 is greedy, a per-request seed
makes a draw reproducible, stop strings end a completion and are kept in it.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future
from pathlib import Path

from longhaul.errors import LonghaulError
from longhaul.inference.hf_sampler import Completion, RolloutParams

WORKER = Path(__file__).with_name("vllm_worker.py")
NEEDS = "vLLM with LLM.apply_model, LLM.reset_prefix_cache and logprobs_mode (0.10 or later)"


def vllm_python() -> str:
    """The interpreter that runs vLLM."""
    found = os.environ.get("LONGHAUL_VLLM_PYTHON")
    if found:
        if not os.access(found, os.X_OK):
            raise LonghaulError(f"LONGHAUL_VLLM_PYTHON={found!r} is not an executable; point it at the python of an environment "
                                "with vLLM (`make vllm` builds .venv-vllm)")
        return found
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise LonghaulError("rollout.sampler vllm needs vLLM: `make vllm` builds .venv-vllm with its CPU build; then set "
                        "LONGHAUL_VLLM_PYTHON=.venv-vllm/bin/python (or install vllm here)")


class VLLMEngine:
    def __init__(self, model, tok=None, dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
                 kv_cache_gb: float = 1.0, python: str | None = None, tensors: dict | None = None):
        """model: an HF directory, or a model object whose config, with `tok` and `tensors` (HF
        names; default the model's own weights), is saved to a temporary directory first."""
        self._tmp = None
        if isinstance(model, (str, Path)):
            path = Path(model)
        else:
            from safetensors.torch import save_file

            self._tmp = tempfile.mkdtemp(prefix="longhaul-vllm-model-")
            model.config.save_pretrained(self._tmp)
            save_file(_unshared(model.state_dict() if tensors is None else tensors), os.path.join(self._tmp, "model.safetensors"))
            if tok is not None:
                tok.save_pretrained(self._tmp)
            path = Path(self._tmp)
        from transformers import AutoConfig

        self.max_model_len = max_model_len or AutoConfig.from_pretrained(path).max_position_embeddings
        self.weight_version = 0
        self._write = threading.Lock()  # one line at a time on the worker's stdin; guards _pending and _gone
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._gone: str | None = None  # why the worker stopped answering, once it has
        settings = {"model": str(path), "dtype": dtype, "max_model_len": self.max_model_len, "seed": seed, "enforce_eager": True}
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gb:g}")}
        self._proc = subprocess.Popen([python or vllm_python(), str(WORKER), json.dumps(settings)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._stderr: list[str] = []
        self._stderr_reader = threading.Thread(target=self._drain, name="longhaul-vllm-stderr", daemon=True)
        self._stderr_reader.start()
        line = self._proc.stdout.readline()
        hello = json.loads(line) if line else {"fatal": self._exit_reason()}
        if "fatal" in hello:
            self.close()
            raise LonghaulError(hello["fatal"])
        self.version = hello["ready"]
        threading.Thread(target=self._answers, name="longhaul-vllm-answers", daemon=True).start()

    def _drain(self) -> None:
        for line in self._proc.stderr:
            self._stderr = (self._stderr + [line.rstrip()])[-40:]

    def _exit_reason(self) -> str:
        self._proc.wait()
        self._stderr_reader.join(5)  # its last lines name the cause
        said = [s for s in self._stderr if s.strip()]
        return f"the vLLM worker exited ({said[-1][-300:] if said else 'no output'}); needs {NEEDS}"

    def _answers(self) -> None:
        """Hands each answer to the call waiting for it; when the worker's output ends, fails
        every call still waiting."""
        for line in self._proc.stdout:
            msg = json.loads(line)
            with self._write:
                fut = self._pending.pop(msg.get("id"), None)
            if fut is not None:
                fut.set_result(msg)
        reason = self._exit_reason()
        with self._write:
            self._gone = reason
            waiting, self._pending = list(self._pending.values()), {}
        for fut in waiting:
            fut.set_exception(LonghaulError(reason))

    def _call(self, msg: dict) -> dict:
        fut: Future = Future()
        with self._write:
            if self._gone is not None or self._proc.poll() is not None:
                raise LonghaulError("the vLLM worker is not running (closed, or it died); build a new engine")
            cid = next(self._ids)
            self._pending[cid] = fut
            try:
                self._proc.stdin.write(json.dumps({**msg, "id": cid}) + "\n")
                self._proc.stdin.flush()
            except OSError:  # the worker died since: its pipe is closed
                del self._pending[cid]
                raise LonghaulError("the vLLM worker is not running (it died); build a new engine") from None
        out = fut.result()
        if "error" in out:
            raise LonghaulError(f"vLLM: {out['error']}")
        return out

    def generate(self, prompts: list[list[int]], params: RolloutParams, seeds: list[int]) -> list[Completion]:
        reqs = [{"max_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p, "seed": s,
                 "stop": list(params.stop)} for s in seeds]
        outs = self._call({"op": "generate", "prompts": [list(map(int, p)) for p in prompts], "params": reqs})["outputs"]
        return [Completion(o["token_ids"], o["logprobs"], "length" if o["finish_reason"] == "length" else "stop", o["versions"])
                for o in outs]

    def update_weights(self, tensors: dict, version: int, keep_kv: bool = False) -> None:
        """Replace the weights (HF names) in place; tokens sampled from then on carry `version`.
        Rollouts in flight re-prefill under the new weights (`keep_kv`, decoding on over the
        old weights' K/V, is longhaul's engine's alone: vLLM cannot keep a request's blocks out
        of its prefix cache)."""
        if keep_kv:
            raise LonghaulError("the vLLM sampler re-prefills rollouts in flight after a weight update; "
                                "set runtime.inflight_kv: recompute, or rollout.sampler: engine to keep their K/V")
        from safetensors.torch import save_file

        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix="longhaul-vllm-weights-", suffix=".safetensors", dir=shm)
        os.close(fd)
        try:
            save_file(_unshared(tensors), path)
            self._call({"op": "load", "path": path, "version": int(version)})
        finally:
            os.unlink(path)
        self.weight_version = int(version)

    def pause(self) -> None:
        """Stop stepping once the step in flight ends; rollouts in flight keep their K/V and
        tokens (vLLM's pause that keeps requests), and calls made meanwhile wait with them."""
        self._call({"op": "pause"})

    def resume(self) -> None:
        self._call({"op": "resume"})

    def close(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            try:
                with self._write:  # not inside another call's line
                    proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    proc.stdin.flush()
                proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _unshared(tensors: dict) -> dict:
    """Tensors safetensors can write: contiguous, and a copy where two names share memory (tied
    embeddings)."""
    seen, out = set(), {}
    for name, t in tensors.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        out[name] = t.contiguous() if key not in seen else t.clone().contiguous()
        seen.add(key)
    return out
