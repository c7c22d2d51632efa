"""Model weights for serving: a safetensors directory with a sha256 manifest, fetched from a
local path or any fsspec URL, verified, and memory-mapped.

Owns the manifest (`manifest.json`: every file of the model directory with its sha256 and
size, written by `write_manifest` or `python -m longhaul.serve.weights manifest DIR`),
`fetch` (a URL -> a verified local directory: `file://` and plain paths are used in place,
any other fsspec protocol (s3://, gs://, http://, memory:// ...) is downloaded once into the
cache, hashed while it streams, and renamed into place only when every file matches),
`mmap_safetensors` (tensors that are views of a private, copy-on-write mapping of the file:
no read into anonymous memory, pages shared through the page cache, a read-only volume is
fine) and `load_model` (name or source -> what `LLMEngine` takes). Built-in names and .gguf
files go through `longhaul.models.load_policy`. Does not own the engine's own weight layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from longhaul.errors import LonghaulError
from longhaul.models.loader import BUILTINS, cache_home, load_policy

MANIFEST = "manifest.json"
FORMAT = "longhaul-weights/1"
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
           "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str | Path) -> Path:
    """Hash every file of a model directory into its manifest.json (written atomically)."""
    d = Path(directory)
    if not d.is_dir() or not any(d.glob("*.safetensors")):
        raise LonghaulError(f"{str(d)!r} is not a directory with .safetensors files; save the model with save_pretrained first")
    files = {p.name: {"sha256": sha256_file(p), "size": p.stat().st_size}
             for p in sorted(d.iterdir()) if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")}
    tmp = d / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1) + "\n")
    os.replace(tmp, d / MANIFEST)
    return d / MANIFEST


def _read_manifest(raw: bytes, where: str) -> dict:
    try:
        data = json.loads(raw)
        files = data["files"]
        assert data.get("format") == FORMAT and isinstance(files, dict) and files
        for name, entry in files.items():
            assert "/" not in name and not name.startswith(".") and len(entry["sha256"]) == 64 and entry["size"] >= 0
    except Exception:
        raise LonghaulError(f"the weights manifest at {where} is not a {FORMAT} manifest; "
                            "write one with `python -m longhaul.serve.weights manifest DIR`") from None
    return files


def verify(directory: Path) -> None:
    """Check every manifest entry of a local directory: present, same size, same sha256."""
    files = _read_manifest((directory / MANIFEST).read_bytes(), str(directory / MANIFEST))
    for name, entry in files.items():
        p = directory / name
        if not p.is_file() or p.stat().st_size != entry["size"]:
            raise LonghaulError(f"weights file {name!r} in {str(directory)!r} is missing or has the wrong size; re-copy the model")
        if sha256_file(p) != entry["sha256"]:
            raise LonghaulError(f"weights file {name!r} in {str(directory)!r} does not match its sha256 in the manifest; "
                                "the copy is corrupt or was changed: re-copy it (or re-write the manifest if the change is intended)")


def _cache_root() -> Path:

    return cache_home() / "weights"


def fetch(source: str) -> Path:
    """A local, verified directory for a path or URL (see the module docstring)."""
    import fsspec

    if "://" not in source or source.startswith("file://"):
        d = Path(source.removeprefix("file://")).expanduser()
        if not d.is_dir():
            raise LonghaulError(f"model directory {str(d)!r} not found; pass a built-in name, a directory or a URL")
        if (d / MANIFEST).is_file():
            verify(d)
        return d
    try:
        fs, root = fsspec.core.url_to_fs(source)
        raw = fs.cat_file(f"{root.rstrip('/')}/{MANIFEST}")
    except (FileNotFoundError, OSError, ValueError, ImportError) as e:
        raise LonghaulError(f"cannot read {source.rstrip('/')}/{MANIFEST} ({type(e).__name__}: {e}); check the URL, "
                            "and that the directory has a manifest (python -m longhaul.serve.weights manifest DIR)") from None
    files = _read_manifest(raw, f"{source}/{MANIFEST}")
    dest = _cache_root() / hashlib.sha256(raw).hexdigest()[:24]
    if (dest / MANIFEST).is_file():
        verify(dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        for name, entry in files.items():
            h, size = hashlib.sha256(), 0
            with fs.open(f"{root.rstrip('/')}/{name}", "rb") as src, open(tmp / name, "wb") as out:
                while block := src.read(_CHUNK):
                    h.update(block)
                    size += len(block)
                    out.write(block)
            if h.hexdigest() != entry["sha256"] or size != entry["size"]:
                raise LonghaulError(f"weights file {name!r} from {source} does not match its manifest (sha256 or size); "
                                    "the source is corrupt or changed under its manifest")
        (tmp / MANIFEST).write_bytes(raw)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process fetched the same weights first
            if not (dest / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def mmap_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file as views of a private mapping of it."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise LonghaulError(f"{str(path)!r} is not a safetensors file (too short)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise LonghaulError(f"{str(path)!r} is not a safetensors file (bad header length)")
        header = json.loads(f.read(n))
    data = torch.empty(0, dtype=torch.uint8)
    data.set_(torch.UntypedStorage.from_file(str(path), shared=False, nbytes=size))  # MAP_PRIVATE: copy-on-write
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise LonghaulError(f"tensor {name!r} of {str(path)!r} has dtype {info['dtype']}, which torch cannot map")
        begin, end = info["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        item = torch.empty(0, dtype=dtype).element_size()
        if (8 + n + begin) % item:  # misaligned for a view: copy this one tensor
            raw = raw.clone()
        out[name] = raw.view(dtype).view(info["shape"])
    return out


@dataclass
class MappedModel:
    """What `LLMEngine` reads of a model (config, generation config, state_dict) without an
    nn.Module: the engine copies the weights into its own layout anyway."""

    config: object
    generation_config: object
    tensors: dict[str, torch.Tensor]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors


def load_model(source: str):
    """(model for LLMEngine, tokenizer) of a built-in name, a .gguf, a directory or a URL."""
    if source in BUILTINS or source.endswith(".gguf"):
        return load_policy(source)
    d = fetch(source)
    if not (d / "config.json").is_file():
        raise LonghaulError(f"{source!r} has no config.json; serve an HF model directory (save_pretrained) with safetensors")
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tensors = {}
    for f in sorted(d.glob("*.safetensors")):
        tensors.update(mmap_safetensors(f))
    if not tensors:
        raise LonghaulError(f"{source!r} holds no .safetensors weights; save the model with safetensors")
    config = AutoConfig.from_pretrained(d)
    gen = GenerationConfig.from_pretrained(d) if (d / "generation_config.json").is_file() else GenerationConfig.from_model_config(config)
    tok = AutoTokenizer.from_pretrained(d)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return MappedModel(config, gen, tensors), tok


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "manifest":
        sys.exit("usage: python -m longhaul.serve.weights manifest MODEL_DIR")
    try:
        print(write_manifest(sys.argv[2]))
    except LonghaulError as e:
        sys.exit(f"error: {e}")
