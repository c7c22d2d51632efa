"""Checkpoints: an HF `save_pretrained` directory plus `trainer_state.pt` (optimizer,
scheduler, RNG states, step, data position), written to a temp directory and renamed, so
a crash never leaves a half-written `step_N/`."""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

_STEP = re.compile(r"^step_(\d+)$")


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(ckpt_dir: Path, step: int, model, tokenizer, trainer_state: dict, keep_last: int) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(dir=ckpt_dir, prefix=f".step_{step}.tmp-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP.match(p.name)) and (p / "trainer_state.pt").is_file()]
    return [p for _, p in sorted(found)]


def load_trainer_state(path: Path) -> dict:
    return torch.load(path / "trainer_state.pt", weights_only=False)


def load_weights(model, path: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(f))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings are saved once; anything else missing means a broken checkpoint
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {path} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
