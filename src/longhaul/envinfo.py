"""Versions and hardware facts for bug reports (`longhaul env`)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import torch

import longhaul
from longhaul.malloc import allocator


def _version(mod: str) -> str:
    try:
        return __import__(mod).__version__
    except Exception:
        return "not installed"


def collect() -> dict:
    bwrap = shutil.which("bwrap")
    if bwrap:
        r = subprocess.run([bwrap, "--version"], capture_output=True, text=True)
        bwrap = f"{r.stdout.strip()} ({bwrap})"
    gpu = "none"
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "longhaul": longhaul.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "pydantic": _version("pydantic"),
        "bubblewrap": bwrap or "not found (apt-get install bubblewrap)",
        "cpu": f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
        "gpu": gpu,
        "allocator": allocator(),
    }
