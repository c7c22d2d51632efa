"""vLLM in its own interpreter, for `rollout.sampler: vllm` (`vllm_engine.VLLMEngine`).

vLLM pins versions of transformers, fastapi and setuptools that longhaul's own environment does
not share, so it lives in a virtual environment of its own (`make vllm`: `.venv-vllm`) and this
file runs there as a script: it imports nothing of longhaul, only the standard library, torch,
safetensors and vllm. One JSON object a line on stdin, one answer a line on stdout (vLLM's own
logging goes to stderr):

- `{"op": "generate", "prompts": [[ids]], "params": [{...}]}` -> `{"outputs": [{"token_ids",
  "logprobs", "finish_reason"}]}`: each prompt with its own SamplingParams fields (max_tokens,
  temperature, top_p, seed, stop); the log-prob of each sampled token under the distribution
  it was sampled from (vLLM's `processed_logprobs`, longhaul's `"processed"`);
- `{"op": "load", "path": FILE}` -> `{"loaded": n}`: the safetensors file's tensors replace the
  model's weights in place (the worker's `reload_weights`, which re-processes them into the
  layout its kernels use, else the model's `load_weights`), and the prefix cache is reset (its
  blocks were computed with the old weights);
- `{"op": "quit"}`.
Errors answer `{"error": "..."}` and the worker goes on.

The first argument is a JSON object of `vllm.LLM` settings (model, dtype, max_model_len, seed,
...). The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a weight
load reaches the model directly.
"""

import json
import os
import sys


def _sampling(p: dict, SamplingParams):
    return SamplingParams(max_tokens=p["max_tokens"], temperature=p.get("temperature", 0.0), top_p=p.get("top_p", 1.0),
                          seed=p.get("seed"), stop=p.get("stop") or None, include_stop_str_in_output=True,
                          skip_special_tokens=False, logprobs=0)


def _answer(out, msg: dict) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def main() -> None:
    settings = json.loads(sys.argv[1])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out, sys.stdout = sys.stdout, sys.stderr  # nothing but answers on the protocol's stream
    import vllm
    from vllm import LLM, SamplingParams

    missing = [f"LLM.{name}" for name in ("apply_model", "reset_prefix_cache") if not hasattr(LLM, name)]
    if missing:
        _answer(out, {"fatal": f"vLLM {vllm.__version__} lacks {', '.join(missing)}, which longhaul's vllm sampler needs "
                               "(weights replaced in place); install vLLM 0.10 or later"})
        return
    try:
        llm = LLM(logprobs_mode="processed_logprobs", **settings)
    except TypeError as e:
        _answer(out, {"fatal": f"vLLM {vllm.__version__} does not take an LLM setting longhaul needs ({e}); install vLLM 0.10 or later"})
        return
    _answer(out, {"ready": vllm.__version__})
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "generate":
                prompts = [{"prompt_token_ids": ids} for ids in cmd["prompts"]]
                results = llm.generate(prompts, [_sampling(p, SamplingParams) for p in cmd["params"]], use_tqdm=False)
                outs = []
                for r in results:
                    c = r.outputs[0]
                    ids = list(c.token_ids)
                    lps = [step[t].logprob for step, t in zip(c.logprobs or [], ids)]
                    outs.append({"token_ids": ids, "logprobs": lps, "finish_reason": c.finish_reason or "stop"})
                _answer(out, {"outputs": outs})
            elif cmd["op"] == "load":
                from safetensors.torch import load_file

                tensors = load_file(cmd["path"])
                try:  # the weights in checkpoint form, re-processed into the kernels' layout (CPU linears are repacked)
                    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors.items()), "is_checkpoint_format": True})
                except AttributeError:  # an older worker without in-place reload: plain parameters only
                    llm.apply_model(lambda model: model.load_weights(tensors.items()))
                llm.reset_prefix_cache()
                _answer(out, {"loaded": len(tensors)})
            else:
                _answer(out, {"error": f"unknown op {cmd['op']!r}"})
        except Exception as e:  # the caller raises it; the worker serves on
            _answer(out, {"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
