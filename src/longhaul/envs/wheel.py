"""Pure-Python wheels built in memory, byte-identical for the same inputs: the offline
wheelhouse of terminal's `wheel_install` tasks. Just enough of the wheel format for pip to install
them (METADATA, WHEEL, top_level.txt, RECORD); no scripts, data or C extensions.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile

from longhaul.envs.kit import lines

_ZIP_DATE = (2024, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(name: str, version: str, modules: dict[str, str], requires: tuple = (), summary: str = "") -> tuple[str, bytes]:
    """(file name, bytes) of a pure-Python wheel holding ``modules`` (path -> source); byte-identical for the same inputs."""
    info = f"{name}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary or name}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    entries = {**modules, f"{info}/METADATA": lines(meta),
               f"{info}/WHEEL": lines(["Wheel-Version: 1.0", "Generator: longhaul", "Root-Is-Purelib: true", "Tag: py3-none-any"]),
               f"{info}/top_level.txt": lines(sorted({p.split("/")[0].removesuffix(".py") for p in modules}))}
    record = [f"{p},{_record_hash(t.encode())},{len(t.encode())}" for p, t in entries.items()] + [f"{info}/RECORD,,"]
    entries[f"{info}/RECORD"] = lines(record)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, content in entries.items():
            zi = zipfile.ZipInfo(path, date_time=_ZIP_DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, content.encode())
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()
