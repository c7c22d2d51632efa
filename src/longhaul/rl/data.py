"""Datasets in the conventional formats, tokenised with a loss mask.

- `{"messages": [{role, content}, ...]}`: loss on every assistant message;
- `{"prompt": ..., "completion": ...}`: strings (used as-is) or message lists (chat template);
- `{"prompt": ..., "chosen": ..., "rejected": ...}`: preference pairs.
Files: JSONL (`.jsonl`), a JSON list (`.json`), Parquet (`.parquet`), or a directory written by
HF `datasets`' `save_to_disk` (a Dataset or a DatasetDict, whose split is picked by name).
Assistant spans are found by rendering the chat template turn by turn, so the mask matches the
exact tokens the model sees.
"""

from __future__ import annotations

import json
from pathlib import Path

from longhaul.errors import LonghaulError


def read_jsonl(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise LonghaulError(f"dataset {str(p)!r} not found; pass a JSONL file")
    rows = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise LonghaulError(f"dataset {str(p)!r} line {n} is not valid JSON ({e.msg}); fix or remove that line") from e
    if not rows:
        raise LonghaulError(f"dataset {str(p)!r} is empty")
    return rows


def load_rows(path: str | Path, split: str = "train") -> list[dict]:
    """Rows of a dataset file or `save_to_disk` directory, as plain dicts."""
    p = Path(path)
    if p.is_file() and p.suffix == ".jsonl":
        return read_jsonl(p)
    if p.is_file() and p.suffix == ".json":
        try:
            rows = json.loads(p.read_text())
        except json.JSONDecodeError:
            return read_jsonl(p)  # JSON lines under a .json name
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise LonghaulError(f"dataset {str(p)!r} must hold a JSON list of objects (or one object per line)")
        return rows
    if not p.exists():
        raise LonghaulError(f"dataset {str(p)!r} not found; set data.path to a .jsonl/.json/.parquet file or a save_to_disk directory")
    try:
        import datasets
    except ImportError as e:
        raise LonghaulError(f"reading {str(p)!r} needs HF datasets; pip install 'longhaul[datasets]' or convert it to JSONL") from e
    if p.is_file() and p.suffix == ".parquet":
        ds = datasets.Dataset.from_parquet(str(p))
    elif p.is_dir():
        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise LonghaulError(f"dataset {str(p)!r} has splits {sorted(ds)}, not {split!r}; set data.split")
            ds = ds[split]
    else:
        raise LonghaulError(f"dataset {str(p)!r}: unknown format; use .jsonl, .json, .parquet or a save_to_disk directory")
    rows = ds.to_list()
    if not rows:
        raise LonghaulError(f"dataset {str(p)!r} is empty")
    return rows


def encode_pair_row(tok, row: dict) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    """A preference row -> ((chosen ids, mask), (rejected ids, mask)); both share the prompt."""
    missing = [k for k in ("prompt", "chosen", "rejected") if k not in row]
    if missing:
        raise LonghaulError(f"preference rows need 'prompt', 'chosen' and 'rejected'; missing {missing}")
    return encode_prompt_completion(tok, row["prompt"], row["chosen"]), encode_prompt_completion(tok, row["prompt"], row["rejected"])


def truncate(row: tuple[list[int], list[int]], max_length: int) -> tuple[list[int], list[int]]:
    ids, mask = row
    return ids[:max_length], mask[:max_length]


def _render(tok, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok(text, add_special_tokens=False).input_ids


def encode_messages(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(ids, mask) with mask 1 on the tokens of assistant messages (and their end-of-turn)."""
    if not any(m.get("role") == "assistant" for m in messages):
        raise LonghaulError("a messages row has no assistant message, so nothing to train on; drop it or add the reply")
    ids, mask = [], []
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            raise LonghaulError(f"message {i} has role {m.get('role')!r}; use system, user, assistant or tool")
        full = _render(tok, messages[: i + 1], add_generation_prompt=False)
        if m["role"] == "assistant":
            prefix = _render(tok, messages[:i], add_generation_prompt=True)
            if full[: len(prefix)] != prefix or prefix[: len(ids)] != ids:
                raise LonghaulError("the chat template does not extend turn by turn; cannot locate assistant tokens exactly")
            ids, mask = prefix, mask + [0] * (len(prefix) - len(mask))
        if full[: len(ids)] != ids:
            raise LonghaulError("the chat template does not extend turn by turn; cannot locate assistant tokens exactly")
        mask += [1 if m["role"] == "assistant" else 0] * (len(full) - len(ids))
        ids = full
    return ids, mask


def encode_prompt_completion(tok, prompt, completion) -> tuple[list[int], list[int]]:
    if isinstance(prompt, list):
        p = _render(tok, prompt, add_generation_prompt=True)
        if isinstance(completion, list):
            ids, mask = encode_messages(tok, prompt + completion)
            return ids, [0] * len(p) + mask[len(p):]
        c = tok(completion, add_special_tokens=False).input_ids + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
        return p + c, [0] * len(p) + [1] * len(c)
    p = tok(prompt, add_special_tokens=False).input_ids
    c = tok(completion, add_special_tokens=False).input_ids + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
    return p + c, [0] * len(p) + [1] * len(c)


def encode_sft_row(tok, row: dict) -> tuple[list[int], list[int]]:
    if "messages" in row:
        return encode_messages(tok, row["messages"])
    if "prompt" in row and "completion" in row:
        return encode_prompt_completion(tok, row["prompt"], row["completion"])
    raise LonghaulError(f"SFT rows need 'messages' or 'prompt'+'completion'; got keys {sorted(row)}")
