"""A complete user task family, environment and reward function (see docs/custom-tasks.md).

- `Reverse`: single-turn; "reverse this word" answered in the reply, scored exactly.
- `CountLines`: multi-turn; a file in the workspace, the agent writes its line count to
  answer.txt using the tools; a hidden checker decides.
- `length_reward`: a TRL-style reward function, partial credit by shared prefix.
Run `longhaul envcheck wordtasks:Reverse wordtasks:CountLines` with this directory on PYTHONPATH.
"""

import random
from dataclasses import dataclass

from longhaul.envs.workspace import Action, WorkspaceTask
from longhaul.types import Score

WORDS = ["anchor", "bridge", "candle", "dragon", "engine", "forest", "garden", "harbor", "island", "jungle"]


@dataclass(frozen=True)
class ReverseTask:
    task_id: str
    family: str
    version: str
    seed: int
    difficulty: int
    prompt: str
    answer: str


class Reverse:
    FAMILY = "reverse"
    VERSION = "1"
    DIFFICULTIES = (1, 2)

    @staticmethod
    def make_split(split, n, difficulty=1, subfamilies=None):
        if split not in ("train", "heldout"):
            raise ValueError(f"unknown split {split!r}; choose train or heldout")
        base = 0 if split == "train" else 1_000_000
        out = []
        for seed in range(base, base + n):
            rng = random.Random(seed)
            word = "".join(rng.choice(WORDS) for _ in range(difficulty))
            out.append(ReverseTask(f"reverse/v1/{seed}-d{difficulty}", "reverse", "1", seed, difficulty,
                                   f"Reply with the word {word} spelled backwards, and nothing else.", word[::-1]))
        return out

    @staticmethod
    def score_many(tasks, replies, **_):
        return [Score(float(r.strip() == t.answer), r.strip() == t.answer, "pass" if r.strip() == t.answer else "fail")
                for t, r in zip(tasks, replies)]

    @staticmethod
    def reference_reply(task):
        return task.answer


CHECK = """import sys
want = open('.longhaul_hidden/want.txt').read().strip()
try:
    got = open('answer.txt').read().strip()
except FileNotFoundError:
    sys.exit('answer.txt is missing')
sys.exit(0 if got == want else f'answer.txt says {got!r}')
"""


class CountLines:
    FAMILY = "countlines"
    VERSION = "1"
    SUBFAMILIES = ("count",)

    @staticmethod
    def make_split(split, n, difficulty=1, subfamilies=None):
        base = 0 if split == "train" else 1_000_000
        tasks = []
        for seed in range(base, base + n):
            rng = random.Random(seed)
            lines = [rng.choice(WORDS) for _ in range(rng.randint(3, 40))]
            tasks.append(WorkspaceTask(
                task_id=f"countlines/v1/{seed}", family="countlines", version="1", seed=seed, difficulty=difficulty,
                subfamily="count", instruction="How many lines does data/words.txt have? Write the number to answer.txt.",
                files={"data/words.txt": "\n".join(lines) + "\n"}, hidden_files={"check.py": CHECK, "want.txt": f"{len(lines)}\n"},
                verify_command="python3 -I .longhaul_hidden/check.py", check_python=False,
                reference=(Action("run", {"command": "wc -l < data/words.txt > answer.txt"}),)))
        return tasks


def length_reward(completions, tasks):
    """Partial credit: the fraction of the answer's prefix the completion gets right (1.0 = exact)."""
    out = []
    for c, t in zip(completions, tasks):
        c = c.strip()
        k = next((i for i, (a, b) in enumerate(zip(c, t.answer)) if a != b), min(len(c), len(t.answer)))
        out.append(1.0 if c == t.answer else k / max(len(t.answer), 1) * 0.5)
    return out
