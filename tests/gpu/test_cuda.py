"""The engine and the trainers on a CUDA GPU, against the same code on the CPU and against HF.
`benchmarks/gpu_check.sh` runs these wherever a GPU is at hand; without one they are skipped
(the CPU suite covers the same code on the CPU). LONGHAUL_GPU_TEST_DEVICE=cpu runs them on the
CPU instead, to check the tests themselves on a machine without a GPU."""

import copy
import os

import pytest
import torch

from longhaul.config import AlgoConfig, TrainConfig, load_config
from longhaul.inference import LLMEngine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.rl.grpo import GRPOTrainer
from tests.inference.test_engine import TEXTS, lively
from tests.rl.test_trainer import _groups
from tests.runtime.conftest import EXAMPLE, QUIET

DEVICE = os.environ.get("LONGHAUL_GPU_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_engine_greedy_equals_hf_on_cuda(name):
    model, tok = lively(name)
    model = model.to(DEVICE)
    prompts = [tok.encode(t) for t in TEXTS]
    engine = LLMEngine(model, tokenizer=tok, num_kv_blocks=64, device=DEVICE)
    assert engine.runner.device.type == DEVICE
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=24, logprobs=0))
    for p, o in zip(prompts, outs):
        assert o.token_ids == _hf_greedy(model, p, 24), f"prompt of {len(p)} tokens"
    # the sampled tokens' log-probs are the model's own (one forward of HF over prompt + output)
    p, o = prompts[1], outs[1]
    with torch.no_grad():
        logits = model(torch.tensor([p + o.token_ids], device=DEVICE)).logits[0, len(p) - 1:-1].float()
    ref = logits.log_softmax(-1).gather(-1, torch.tensor(o.token_ids, device=DEVICE)[:, None])[:, 0].cpu()
    got = torch.tensor([lp[t] if isinstance(lp, dict) else lp for lp, t in zip(o.logprobs, o.token_ids)])
    assert (got - ref).abs().max().item() < 1e-4


def _step(model, tok, groups, dp=None) -> dict[str, torch.Tensor]:
    trainer = GRPOTrainer(model, tok.pad_token_id, AlgoConfig(kl_coef=0.05), TrainConfig(micro_batch=4, autocast="none", lr=1e-3),
                          dp=dp)
    trainer.optimizer = torch.optim.SGD(trainer.params, lr=1.0)  # the step is the clipped gradient itself
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda _: 1.0)
    m = trainer.step(groups)
    assert m["num_trained_seqs"] > 0 and m["grad_norm"] > 0
    return {n: p.detach().float().cpu() for n, p in model.named_parameters()}


def test_grpo_step_on_cuda_equals_the_cpu_step():
    base, tok = load_policy("tiny-llama")
    groups = _groups(tok)
    cpu = _step(copy.deepcopy(base), tok, groups)
    gpu = _step(copy.deepcopy(base).to(DEVICE), tok, groups)
    for n in cpu:
        assert (cpu[n] - gpu[n]).abs().max().item() < 1e-4, n


def test_grpo_step_through_nccl_ddp_on_one_rank_equals_the_plain_step(tmp_path):
    import torch.distributed as dist

    from longhaul.rl.distributed import DATA_PARALLEL
    from longhaul.runtime.trainers import join_group

    base, tok = load_policy("tiny-llama")
    groups = _groups(tok)
    plain = _step(copy.deepcopy(base).to(DEVICE), tok, groups)
    join_group(0, 1, f"file://{tmp_path / 'rendezvous'}", DEVICE)
    try:
        assert dist.get_backend() == ("nccl" if DEVICE == "cuda" else "gloo")
        ddp = _step(copy.deepcopy(base).to(DEVICE), tok, groups, dp=DATA_PARALLEL.get_fn("ddp")())
    finally:
        dist.destroy_process_group()
    for n in plain:
        assert (plain[n] - ddp[n]).abs().max().item() < 1e-6, n


def test_a_grpo_run_trains_on_cuda_and_resumes_two_plus_two(tmp_path):
    """examples/tiny_grpo.yaml with the trainer and the rollout engine on the GPU trains, and a
    run of 2 steps resumed to 4 ends on the 4-step run's weights (GPU kernels may sum in another
    order from run to run, hence a tolerance rather than bit equality)."""
    from safetensors.torch import load_file

    from longhaul.runtime import train

    gpu = [f"train.device={DEVICE}", f"rollout.device={DEVICE}", *QUIET]
    train(load_config(EXAMPLE, [f"output_dir={tmp_path / 'a'}", *gpu]))
    train(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", "train.steps=2", *gpu]))
    train(load_config(EXAMPLE, [f"output_dir={tmp_path / 'b'}", *gpu]), resume=True)
    wa, wb = (load_file(tmp_path / r / "tiny_grpo" / "checkpoints" / "step_4" / "model.safetensors") for r in "ab")
    start = dict(load_policy("tiny-llama")[0].named_parameters())
    assert any((wa[k] - start[k].detach()).abs().max() > 0 for k in wa if k in start), "the run did not train"
    for k in wa:
        assert (wa[k] - wb[k]).abs().max().item() < 1e-5, k
