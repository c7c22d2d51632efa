"""Checkpoints: an HF `save_pretrained` directory plus `trainer_state.pt` (optimizer,
scheduler, RNG states, step, data position), written to a temp directory and renamed, so
a crash never leaves a half-written `step_N/`."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from longhaul.atomic import atomic_dir
from longhaul.errors import LonghaulError
from longhaul.models.lora import is_adapter_dir, is_lora, load_adapter, merged_from_checkpoint

_STEP = re.compile(r"^step_(\d+)$")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # GPU sampling and dropout draw from these
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(ckpt_dir: Path, step: int, model, tokenizer, trainer_state: dict, keep_last: int, extra=None) -> Path:
    """`extra(tmp_dir)` may write more files (a reward head) before the directory is renamed into place."""
    final = ckpt_dir / f"step_{step}"
    with atomic_dir(final) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if extra is not None:
            extra(tmp)
        torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP.match(p.name)) and (p / "trainer_state.pt").is_file()]
    return [p for _, p in sorted(found)]


def load_trainer_state(path: Path) -> dict:
    # on the CPU first: the optimizer's load moves its state to wherever the parameters are now
    return torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)


def load_weights(model, path: Path) -> None:
    from safetensors.torch import load_file

    if is_lora(model):
        return load_adapter(model, path)

    files = sorted(f for f in path.glob("*.safetensors") if f.name != "reward_head.safetensors")
    state = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings are saved once; anything else missing means a broken checkpoint
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")


def export_checkpoint(run_dir: Path, step: int | None, out: Path) -> Path:
    """Copy a checkpoint's HF files (weights, config, tokenizer; not the trainer state) to `out`, atomically."""
    ckpts = list_checkpoints(Path(run_dir) / "checkpoints")
    if not ckpts:
        raise LonghaulError(f"no checkpoints under {str(run_dir)!r}/checkpoints; pass a run directory that has trained")
    src = ckpts[-1] if step is None else Path(run_dir) / "checkpoints" / f"step_{step}"
    if src not in ckpts:
        have = ", ".join(p.name.removeprefix("step_") for p in ckpts)
        raise LonghaulError(f"run {str(run_dir)!r} has no checkpoint for step {step}; available steps: {have}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise LonghaulError(f"output directory {str(out)!r} is not empty; choose a new path")
    with atomic_dir(out) as tmp:
        if is_adapter_dir(src):  # LoRA: merge the adapters into the base
            model, tok = merged_from_checkpoint(src)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            if (src / "reward_head.safetensors").is_file():  # a reward model's head rides along
                shutil.copy2(src / "reward_head.safetensors", tmp / "reward_head.safetensors")
        else:
            for f in src.iterdir():
                if f.name != "trainer_state.pt":
                    shutil.copy2(f, tmp / f.name)
    return out
