"""`niah`: needles in a haystack of a given length, generated here, for long-context evaluation.

Four kinds, after the passkey test (Mohtashami and Jaggi, 2023) and RULER's synthetic tasks, each
at six lengths (sub-family `<kind>_<n>k`, n in 1, 2, 4, 8, 16, 32): the whole prompt, chat template
and answer included, fits n x 1,024 tokens of SmolLM2's (Llama-style) tokenizer, so an 8k task
sits inside an 8,192-token window; the evaluation counts the real prompt tokens.
- `passkey`: one five-digit pass key hidden in repeated filler; "What is the pass key?"
- `single`: one "special magic number for <word>" in varied filler sentences; asked for it.
- `multikey`: four magic numbers for four different words, asked for one of them (the others
  are distractors of the same form).
- `vartrack`: a chain of assignments VAR A = 12345, VAR B = VAR A, ... scattered through the
  filler; asked which variables hold the value (all of them, any order).
The needle sits at a depth drawn from the seed (0-100% of the haystack, in tenths). A reply
passes when it contains the answer's digits (for `vartrack`, every variable name of the chain
and no other). Evaluation only: there is one split, `heldout`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from longhaul.envs.kit import SPLIT_SEED_BASE
from longhaul.types import Score

VERSION = "2"
FAMILY = "niah"
KINDS = ("passkey", "single", "multikey", "vartrack")
LENGTHS_K = (1, 2, 4, 8, 16, 32)
SUBFAMILIES = tuple(f"{kind}_{n}k" for kind in KINDS for n in LENGTHS_K)
# the haystack's characters per token in SmolLM2's BPE, measured: the passkey filler repeats short
# words and punctuation; the varied sentences of the other kinds pack more characters a token
CHARS_PER_TOKEN = {"passkey": 3.75, "single": 4.8, "multikey": 4.8, "vartrack": 4.8}
HAYSTACK_SHARE, PROMPT_RESERVE = 0.985, 200  # haystack tokens = share x n x 1,024 - reserve: room for the
# tokenizer's few percent of spread over seeds, intro, question, chat template and a 48-token answer

_PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
_SENTENCES = (
    "The committee met on a grey morning to discuss the budget for the coming year.",
    "Rivers carry sediment from the mountains and lay it down where the current slows.",
    "A good compiler reports the first error clearly and recovers enough to find the next.",
    "The orchard was planted in rows of twelve, with a path wide enough for a cart.",
    "Most of the letters were never answered, but the archive kept every one of them.",
    "In winter the harbour froze at its edges and the ferries ran on a reduced timetable.",
    "She tuned the instrument by ear, then checked it against the fork out of habit.",
    "The survey counted birds at dawn, when they sing most and are easiest to find.",
    "Each chapter of the manual ends with exercises that the next chapter assumes.",
    "The bridge was closed for repairs, so the traffic went round by the old mill road.",
)
_WORDS = ("harbor", "lantern", "meadow", "copper", "falcon", "glacier", "orchid", "quartz", "saddle", "thimble",
          "violet", "walnut", "beacon", "cobalt", "ember", "juniper")


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    version: str
    seed: int
    difficulty: int
    subfamily: str
    length_tokens: int  # the window the whole prompt fits (n x 1,024)
    depth: float  # where the (first) needle sits, as a share of the haystack
    answer: tuple[str, ...]  # what a passing reply contains
    prompt: str


def _haystack(rng: random.Random, kind: str, n_chars: int) -> list[str]:
    """Filler pieces adding up to about n_chars characters."""
    if kind == "passkey":
        return [_PASSKEY_FILLER] * max(1, round(n_chars / len(_PASSKEY_FILLER)))
    out, total = [], 0
    while total < n_chars:
        s = rng.choice(_SENTENCES) + " "
        out.append(s)
        total += len(s)
    return out


def _insert(pieces: list[str], needles: list[str], depths: list[float]) -> str:
    pieces = list(pieces)
    for needle, depth in sorted(zip(needles, depths), key=lambda x: -x[1]):  # deepest first: earlier positions hold
        pieces.insert(round(depth * len(pieces)), needle + " ")
    return "".join(pieces)


def _number(rng: random.Random) -> str:
    return str(rng.randrange(10_000, 100_000))


def make_task(seed: int, subfamily: str) -> Task:
    kind, _, size = subfamily.rpartition("_")
    if kind not in KINDS or size not in {f"{n}k" for n in LENGTHS_K}:
        raise ValueError(f"unknown sub-family {subfamily!r}; valid: {', '.join(SUBFAMILIES)}")
    rng = random.Random(seed)
    tokens = int(size[:-1]) * 1024
    depth = rng.randrange(11) / 10
    body = _haystack(rng, kind, int((tokens * HAYSTACK_SHARE - PROMPT_RESERVE) * CHARS_PER_TOKEN[kind]))
    if kind == "passkey":
        key = _number(rng)
        text = _insert(body, [f"The pass key is {key}. Remember it. {key} is the pass key."], [depth])
        intro = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it."
        question, answer = "What is the pass key? The pass key is", (key,)
    elif kind in ("single", "multikey"):
        words = rng.sample(_WORDS, 1 if kind == "single" else 4)
        values = [_number(rng) for _ in words]
        depths = [depth] + [rng.randrange(11) / 10 for _ in words[1:]]
        text = _insert(body, [f"One of the special magic numbers for {w} is: {v}." for w, v in zip(words, values)], depths)
        intro = "Some special magic numbers are hidden inside the following text. Make sure to memorize them."
        question = f"What is the special magic number for {words[0]} mentioned in the provided text? The number is"
        answer = (values[0],)
    else:  # vartrack
        value, names = _number(rng), rng.sample([chr(c) + chr(d) for c in range(65, 91) for d in range(65, 91)], 4)
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
        depths = sorted([depth] + [rng.randrange(11) / 10 for _ in chain[1:]])
        text = _insert(body, chain, depths)
        intro = "Memorize and track the chain of variable assignments hidden in the following text."
        question = f"Which variables are assigned the value {value}? Answer with their names, separated by commas:"
        answer = tuple(names)
    prompt = f"{intro}\n\n{text}\n\n{question}"
    return Task(f"{FAMILY}/v{VERSION}/{subfamily}/{seed}", FAMILY, VERSION, seed, 1, subfamily, tokens, depth, answer, prompt)


def make_split(split: str, n: int, difficulty: int = 1, subfamilies=None) -> list[Task]:
    """`n` tasks, each sub-family of `subfamilies` (default: the passkey test at every length) in turn."""
    if split != "heldout":
        raise ValueError(f"niah is for evaluation only (split 'heldout'), not {split!r}")
    if difficulty != 1:
        raise ValueError(f"niah has one difficulty (1); its sub-families set the length, got difficulty {difficulty!r}")
    subs = list(subfamilies) if subfamilies else [f"passkey_{n}k" for n in LENGTHS_K]
    unknown = [s for s in subs if s not in SUBFAMILIES]
    if unknown:
        raise ValueError(f"unknown sub-family {unknown[0]!r}; valid: {', '.join(SUBFAMILIES)}")
    base = SPLIT_SEED_BASE[split]
    return [make_task(base + i, subs[i % len(subs)]) for i in range(n)]


def passed(task: Task, reply: str) -> bool:
    if task.subfamily.startswith("vartrack"):
        named = set(re.findall(r"\b[A-Z]{2}\b", reply))
        return named == set(task.answer)
    return task.answer[0] in re.findall(r"\d+", reply)


def score_many(tasks, replies: list[str], timeout_s: float = 0.0, workers: int = 1) -> list[Score]:
    out = []
    for t, r in zip(tasks, replies):
        ok = passed(t, r)
        out.append(Score(1.0 if ok else 0.0, ok, "pass" if ok else "fail"))
    return out


def reference_reply(task: Task) -> str:
    return " " + ", ".join(task.answer) + "."


def null_reply(task: Task) -> str:
    return " I could not find it."
