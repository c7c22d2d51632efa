"""A digest of what a generated family's `make_split` returns for fixed arguments: every field of
every task, so that a refactor of the task kit is shown to leave ids and contents as they were.
`python tests/envs/split_digest.py` prints the digests of the tree on PYTHONPATH."""

import dataclasses
import hashlib
import json
import sys

CALLS = [("train", 24, 1, None), ("train", 12, 2, None), ("heldout", 12, 3, None), ("train", 8, 2, "first-two")]


def _plain(x):
    if dataclasses.is_dataclass(x):
        return {"__type__": type(x).__name__, **{f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, bytes):
        return "bytes:" + x.hex()
    return x


def split_digest(make_split, subfamilies) -> str:
    h = hashlib.sha256()
    for split, n, difficulty, restrict in CALLS:
        pool = sorted(subfamilies)[:2] if restrict else None
        for task in make_split(split, n, difficulty, pool):
            h.update(json.dumps(_plain(task), sort_keys=True).encode() + b"\n")
    return h.hexdigest()[:16]


if __name__ == "__main__":
    from longhaul.envs import echo, funcgen, multistep, terminal

    print(json.dumps({
        "funcgen": split_digest(funcgen.make_split, funcgen.SUBFAMILIES),
        "terminal": split_digest(terminal.make_split, terminal.SUBFAMILIES),
        "multistep": split_digest(multistep.make_split, multistep.SUBFAMILIES),
        "echo": split_digest(lambda s, n, d, sub: echo.make_split(s, n, d), ()),
    }, indent=1), file=sys.stdout)
