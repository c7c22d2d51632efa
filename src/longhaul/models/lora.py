"""LoRA adapters through peft: wrap, unwrap, save/load adapter state, merge for export.

peft is an optional dependency (`pip install 'longhaul[lora]'`), imported only here."""

from __future__ import annotations

import shutil
from pathlib import Path

from longhaul.atomic import atomic_dir
from longhaul.errors import LonghaulError
from longhaul.models.loader import load_policy


def _peft():
    try:
        import peft
    except ImportError as e:
        raise LonghaulError("LoRA needs peft; run `pip install 'longhaul[lora]'` (make test installs it) or set train.lora_r=0") from e
    return peft


def apply_lora(model, r: int, alpha: float, dropout: float, targets: list[str], base_name: str):
    """Freeze `model` and add rank-`r` adapters on the named linear layers. Adapters start at
    zero (B = 0), so the wrapped model computes exactly what the base model does."""
    peft = _peft()
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none",
                          task_type="CAUSAL_LM")
    wrapped = peft.get_peft_model(model, cfg)
    wrapped.peft_config["default"].base_model_name_or_path = base_name  # how export finds the base again
    return wrapped


def is_lora(model) -> bool:
    return hasattr(model, "get_base_model") and hasattr(model, "peft_config")


def unwrap(model):
    """The HF CausalLM inside a peft wrapper (its layers carry the adapters), or the model itself."""
    return model.get_base_model() if is_lora(model) else model


def load_adapter(model, path: Path) -> None:
    from safetensors.torch import load_file

    peft = _peft()
    result = peft.set_peft_model_state_dict(model, load_file(path / "adapter_model.safetensors"))
    if getattr(result, "unexpected_keys", None):
        raise RuntimeError(f"adapter checkpoint {path} does not match the model: unexpected {result.unexpected_keys[:3]}")


def merged_from_checkpoint(path: Path):
    """(merged plain HF model, tokenizer) from a LoRA checkpoint directory."""
    import json

    base_name = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    base, tok = load_policy(base_name)
    peft = _peft()
    model = peft.PeftModel.from_pretrained(base, str(path))
    return model.merge_and_unload(), tok


def load_lora(model, path: Path, trainable: bool = True):
    """`model` wrapped with the adapter saved in `path` (peft's adapter_config.json and
    adapter_model.safetensors), trainable to go on training it."""
    peft = _peft()
    return peft.PeftModel.from_pretrained(model, str(path), is_trainable=trainable)


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def is_adapter_dir(path) -> bool:
    """Whether `path` holds a peft adapter: its config and its weights."""
    return all((Path(path) / name).is_file() for name in ADAPTER_FILES)


def copy_adapter(src: Path, out: Path) -> Path:
    """A checkpoint's adapter files (config and weights, not the base) copied to `out`, atomically."""
    with atomic_dir(out) as tmp:
        for name in ADAPTER_FILES:
            shutil.copy2(Path(src) / name, tmp / name)
    return Path(out)
