"""Procedurally generated multi-step tool tasks (family ``multistep``).

The information a task needs is spread over several files, so no single tool call solves it:
read a config to learn which data file, column and aggregate to compute; follow a chain of
``next: PATH`` clue files to a secret; find the module a README names and fix the constants a
visible test pins down; repair a moved input path in a script's settings and rerun it; restore
a file that a git commit deleted; join a team list with ticket files to answer a question. The
instruction says what to achieve, never the answer, and every reference solution takes at least
three tool calls before submit. The hidden check (the shared ``state_check.py``) verifies the
final state.

Tasks are pure functions of ``(seed, difficulty, subfamily)``, made with the task kit
(``longhaul.envs.kit``) in the state-checked shape ``terminal`` uses (``longhaul.envs.state_task``).
Difficulty adds hops: a profile file between the config and the data, a row filter, a longer
clue chain with relative paths, a layout document between the README and the module, a second
broken setting, a decoy the task must leave alone.
"""

from __future__ import annotations

import itertools
import json
import posixpath

from longhaul.envs import kit
from longhaul.envs import patch as patchlib
from longhaul.envs.kit import lines, make_registry, pick, sentence, word, words
from longhaul.envs.state_task import Built, build_task, q, read, run, write
from longhaul.envs.workspace import Action, WorkspaceTask

FAMILY = "multistep"
VERSION = "1"
DIFFICULTIES = kit.DIFFICULTIES
SPLIT_SEED_BASE = kit.SPLIT_SEED_BASE
MIN_REFERENCE_CALLS = 3
TEST_COMMAND = "python3 -m pytest -q -o pythonpath=. tests"

__all__ = ["DIFFICULTIES", "FAMILY", "SPLIT_SEED_BASE", "SUBFAMILIES", "VERSION", "make_split", "make_task"]

SUBFAMILIES, _register = make_registry()


# ------------------------------------------------------------------ sub-families --

_AGGS = {"sum": sum, "max": max, "min": min}


@_register("config_lookup")
def _config_lookup(rng, d):
    cols = words(rng, 4, 2, 2)
    kinds = words(rng, 3, 1, 2, avoid=cols)
    names = words(rng, pick(d, 3, 4, 5), 2, 3, avoid=cols + kinds)
    files, tables = {}, {}
    for nm in names:
        order = cols[:]
        rng.shuffle(order)
        rows = [{"id": str(100 + i), "kind": kinds[i] if i < len(kinds) else rng.choice(kinds),
                 **{c: rng.randint(1, 500) for c in cols}} for i in range(rng.randint(*pick(d, (6, 9), (8, 12), (10, 16))))]
        tables[nm] = rows
        files[f"data/{nm}.csv"] = lines([",".join(["id", "kind", *order])] +
                                         [",".join([r["id"], r["kind"], *(str(r[c]) for c in order)]) for r in rows])
    src, col, agg = rng.choice(names), rng.choice(cols), rng.choice(sorted(_AGGS))
    rows = tables[src]
    kind = rng.choice(kinds) if d == 3 else None
    if kind:
        rows = [r for r in rows if r["kind"] == kind]
    value = _AGGS[agg](r[col] for r in rows)
    spec = [f"source = data/{src}.csv", f"column = {col}", f"aggregate = {agg}"] + ([f"where = kind == {kind}"] if kind else [])
    head = ["# settings of the nightly report job", "[report]", f"title = {sentence(rng, 2, 4)}"]
    tail = ["", "[output]", f"format = {rng.choice(('plain', 'text'))}", f"owner = {word(rng, 2, 2)}"]
    ref = [read("config/report.ini")]
    if d == 1:
        files["config/report.ini"] = lines(head + spec + tail)
    else:
        profiles = words(rng, 3, 2, 2, avoid=names + cols + kinds)
        prof = profiles[0]
        files["config/report.ini"] = lines(head + [f"profile = {prof}", "# profiles are in config/profiles/<name>.ini"] + tail)
        for p in profiles:
            body = spec if p == prof else [f"source = data/{rng.choice(names)}.csv", f"column = {rng.choice(cols)}",
                                           f"aggregate = {rng.choice(sorted(_AGGS))}"]
            files[f"config/profiles/{p}.ini"] = lines(["[profile]", *body])
        ref.append(read(f"config/profiles/{prof}.ini"))
    ref += [read(f"data/{src}.csv"), write("answer.txt", f"{value}\n")]
    rows_note = ", which rows" if d == 3 else ""
    instruction = ("A report job is configured under `config/` (start with `config/report.ini`). Work out which data file, "
                   f"which column{rows_note} and which aggregate it asks for, compute that number from the data and write "
                   "just the number to `answer.txt`.")
    return Built(instruction, files, [{"op": "answer", "path": "answer.txt", "expect": str(value)}], tuple(ref))


@_register("pointer_chain")
def _pointer_chain(rng, d):
    hops = pick(d, 3, 5, 7)
    dirs = [f"clues/{w}" for w in words(rng, pick(d, 3, 4, 5), 2, 2)]
    if d > 1:
        dirs += [f"{dirs[0]}/{word(rng, 1, 2)}", f"{dirs[1]}/{word(rng, 1, 2)}"]
    pool = words(rng, hops + 8, 2, 3)
    paths = []
    for i, nm in enumerate(pool):
        paths.append(f"{dirs[rng.randrange(len(dirs))]}/{nm}.txt")
    chain, decoys = paths[:hops], paths[hops:]
    secret = f"{word(rng, 2, 2)}-{rng.randint(1000, 9999)}-{word(rng, 2, 2)}"

    def ref_to(src: str, dst: str) -> str:
        if d == 3 and rng.random() < 0.6:  # relative to the directory of the file the pointer is in
            rel = posixpath.relpath(dst, posixpath.dirname(src))
            return rel if rel.startswith("..") else "./" + rel
        return dst

    def page(extra: str) -> str:
        body = [sentence(rng) for _ in range(rng.randint(1, 4))]
        body.insert(rng.randint(0, len(body)), extra)
        return lines(body)

    files = {"START.txt": page(f"next: {chain[0]}")}
    for a, b in itertools.pairwise(chain):
        files[a] = page(f"next: {ref_to(a, b)}")
    files[chain[-1]] = page(f"secret: {secret}")
    for i, p in enumerate(decoys):  # dead ends and other secrets
        if i % 2 and i + 1 < len(decoys):
            files[p] = page(f"next: {ref_to(p, decoys[i + 1])}")
        else:
            files[p] = page(f"secret: {word(rng, 2, 2)}-{rng.randint(1000, 9999)}-{word(rng, 2, 2)}")
    rel = (" A path that starts with `./` or `../` is relative to the directory of the file it appears in; "
           "other paths are relative to /work.") if d == 3 else " Paths are relative to /work."
    instruction = ("Start at `START.txt` and follow the `next: PATH` lines from file to file." + rel +
                   " The last file of the chain has a line `secret: VALUE`. Write VALUE, and nothing else, to `answer.txt`.")
    ref = [read("START.txt"), *(read(p) for p in chain), write("answer.txt", secret + "\n")]
    return Built(instruction, files, [{"op": "answer", "path": "answer.txt", "expect": secret}], tuple(ref))


_RULES = (  # (domain, function, argument, base constant, rate constant)
    ("shipping", "shipping_cost", "weight", "BASE_FEE", "PER_KG"),
    ("scoring", "score", "hits", "START_SCORE", "POINTS_PER_HIT"),
    ("billing", "monthly_charge", "seats", "PLATFORM_FEE", "PER_SEAT"),
    ("quota", "quota_for", "level", "MIN_QUOTA", "QUOTA_STEP"),
    ("pricing", "ticket_price", "zones", "BASE_PRICE", "PER_ZONE"),
)

_PROBE = """import importlib, json, sys
sys.path.insert(0, sys.argv[1])
m = importlib.import_module(@MODULE@)
print(json.dumps({'base': getattr(m, @BASE@), 'rate': getattr(m, @RATE@), 'values': [getattr(m, @FUNC@)(x) for x in @XS@]}))
"""


def _rule_module(domain, fn, arg, base, rate, b, r):
    return (f'"""{domain.capitalize()} rules."""\n\n{base} = {b}\n{rate} = {r}\n\n\n'
            f"def {fn}({arg}):\n    \"\"\"{base} plus {rate} for each unit of {arg}.\"\"\"\n    return {base} + {arg} * {rate}\n")


@_register("fix_constant")
def _fix_constant(rng, d):
    domain, fn, arg, base, rate = rng.choice(_RULES)
    pkg = word(rng, 2, 3)
    mod = f"{domain}_{word(rng, 1, 2)}"
    others = words(rng, 2, 2, 2, avoid=(pkg, mod))
    good_b, good_r = rng.randint(2, 60), rng.randint(2, 15)
    wrong = pick(d, rng.choice(("base", "rate")), "both", "both")
    bad_b = good_b + rng.choice((-1, 1)) * rng.randint(1, 9) if wrong in ("base", "both") else good_b
    bad_r = good_r + rng.choice((-1, 1)) * rng.randint(1, min(good_r - 1, 5)) if wrong in ("rate", "both") else good_r
    path = f"{pkg}/{mod}.py"
    broken = _rule_module(domain, fn, arg, base, rate, bad_b, bad_r)
    fixed = _rule_module(domain, fn, arg, base, rate, good_b, good_r)
    files = {f"{pkg}/__init__.py": f'"""The {pkg} service."""\n', path: broken}
    for o in others:
        files[f"{pkg}/{o}.py"] = (f'"""{sentence(rng, 2, 4).capitalize()}."""\n\n\ndef {o}(items):\n'
                                  f"    return [str(x).strip() for x in items if x]\n")
    decoy = None
    if d == 3:  # a second module with the same constant names, which must stay as it is
        decoy = f"{pkg}/legacy_{domain}.py"
        files[decoy] = ('"""The old rules, kept for reports about past years: do not change."""\n\n'
                        f"{base} = {rng.randint(2, 60)}\n{rate} = {rng.randint(2, 15)}\n")
    xs = sorted(rng.sample(range(1, 40), 2))
    tmod = f"{pkg}.{mod}"
    files[f"tests/test_{domain}.py"] = (f"from {tmod} import {fn}\n\n\ndef test_{fn}_without_{arg}():\n"
                                        f"    assert {fn}(0) == {good_b}\n\n\n"
                                        + "".join(f"def test_{fn}_{x}():\n    assert {fn}({x}) == {good_b + x * good_r}\n\n\n" for x in xs)
                                        ).rstrip("\n") + "\n"
    where = f"The {domain} rules and the constants they use live in `{path}`; the other modules are plumbing."
    if d < 3:
        files["README.md"] = lines([f"# {pkg}", "", sentence(rng, 5, 9).capitalize() + ".", "", where])
        ref = [read("README.md")]
    else:
        layout = [f"- `{pkg}/{o}.py`: {sentence(rng, 2, 4)}" for o in others]
        layout += [f"- `{path}`: the current {domain} rules and their constants",
                   f"- `{decoy}`: the rules of past years, frozen"]
        rng.shuffle(layout)
        files["docs/LAYOUT.md"] = lines(["# Module layout", "", *layout])
        files["README.md"] = lines([f"# {pkg}", "", sentence(rng, 5, 9).capitalize() + ".", "",
                                    "Which module does what is described in `docs/LAYOUT.md`."])
        ref = [read("README.md"), read("docs/LAYOUT.md")]
    ref += [read(f"tests/test_{domain}.py"), read(path),
            Action("apply_patch", {"patch": patchlib.make(path, broken, fixed)}), Action("run_tests")]
    probe_xs = [0, *xs, rng.randint(40, 90)]
    code = _PROBE
    for key, value in (("MODULE", tmod), ("BASE", base), ("RATE", rate), ("FUNC", fn), ("XS", probe_xs)):
        code = code.replace(f"@{key}@", repr(value))
    checks = [{"op": "python", "what": f"the {domain} rules in {path}", "code": code,
               "expect": {"base": good_b, "rate": good_r, "values": [good_b + x * good_r for x in probe_xs]}}]
    if decoy:
        checks.append({"op": "text", "path": decoy, "expect": files[decoy]})
    amount = "Some of its settings have" if wrong == "both" else "One of its settings has"
    instruction = (f"The visible tests of this project fail (`run_tests` runs them). {amount} a wrong value. Find the module "
                   f"that defines the {domain} rules (README.md tells where to look) and fix the wrong constant value(s) "
                   "so that the tests pass. Do not change the tests or the logic of the functions.")
    return Built(instruction, files, checks, tuple(ref), test_command=TEST_COMMAND, check_python=True)


_REPORT_PY = '''"""Summarise the orders file named in settings.json into the output file named there."""
import csv
import json
import os
import sys


def main():
    with open("settings.json") as f:
        cfg = json.load(f)
    path = cfg["input"]
    if not os.path.exists(path):
        sys.exit(f"error: input file {path} not found (check settings.json)")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    totals = {}
    for r in rows:
        totals[r["customer"]] = totals.get(r["customer"], 0) + int(r["amount"])
    top = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    out = cfg["output"]
MAKEDIRS    with open(out, "w") as f:
        f.write(f"orders: {len(rows)}\\n")
        f.write(f"total: {sum(totals.values())} {cfg['currency']}\\n")
        f.write(f"top_customer: {top}\\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
'''


@_register("fix_config_path")
def _fix_config_path(rng, d):
    years = sorted(rng.sample(range(2015, 2024), pick(d, 1, 3, 4)))
    year = rng.choice(years)
    customers = words(rng, rng.randint(3, 5), 2, 2)
    files, expected = {}, None
    for y in years:
        rows = [(f"{y}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}", rng.choice(customers), rng.randint(5, 900))
                for _ in range(rng.randint(5, 12))]
        files[f"archive/{y}/orders.csv"] = lines(["date,customer,amount"] + [f"{a},{c},{m}" for a, c, m in rows])
        if y == year:
            totals: dict[str, int] = {}
            for _, c, m in rows:
                totals[c] = totals.get(c, 0) + m
            top = min(totals.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            currency = rng.choice(("EUR", "USD", "GBP", "CHF"))
            expected = lines([f"orders: {len(rows)}", f"total: {sum(totals.values())} {currency}", f"top_customer: {top}"])
    script = _REPORT_PY.replace("MAKEDIRS", "" if d == 3 else "    os.makedirs(os.path.dirname(out) or \".\", exist_ok=True)\n")
    files["tool/report.py"] = script
    settings = {"input": "data/orders.csv", "output": "out/summary.txt", "currency": currency}
    if d > 1:
        settings["year"] = year
    files["settings.json"] = json.dumps(settings, indent=2) + "\n"
    moved = (f"The order exports no longer live in `data/`: they were moved to `archive/{years[0]}/orders.csv`." if d == 1 else
             "The order exports no longer live in `data/`: each year's export is now `archive/<YEAR>/orders.csv`, "
             "and the report uses the year set in settings.json.")
    files["data/MOVED.md"] = lines(["# Moved", "", moved])
    files[f"data/{word(rng, 2, 2)}.txt"] = lines([sentence(rng)])
    files["tests/test_settings.py"] = ('import json\nimport os\n\n\ndef test_input_file_exists():\n'
                                       '    with open("settings.json") as f:\n        cfg = json.load(f)\n'
                                       '    assert os.path.exists(cfg["input"]), cfg["input"]\n\n\n'
                                       'def test_output_path():\n    with open("settings.json") as f:\n        cfg = json.load(f)\n'
                                       '    assert cfg["output"] == "out/summary.txt"\n')
    good = f"archive/{year}/orders.csv"
    new_settings = json.dumps({**settings, "input": good}, indent=2) + "\n"
    ref = [run("python3 tool/report.py"), read("data/MOVED.md"), read("settings.json"), write("settings.json", new_settings)]
    if d == 3:
        ref.append(run("mkdir -p out"))
    ref.append(run("python3 tool/report.py"))
    instruction = ("`python3 tool/report.py` (run from /work) should write the order summary to `out/summary.txt`, but it "
                   "fails. Fix the configuration, not the script, so that it works, and run it so that `out/summary.txt` "
                   "is produced.")
    checks = [{"op": "json_key", "path": "settings.json", "key": "input", "expect": good},
              {"op": "text", "path": "out/summary.txt", "expect": expected},
              {"op": "text", "path": "tool/report.py", "expect": script}]
    return Built(instruction, files, checks, tuple(ref), test_command=TEST_COMMAND)


def _commit_cmd(state_before: dict, state_after: dict, message: str, when: int) -> str:
    """A bash command that turns the work tree from one committed state into the next and commits it."""
    parts = []
    for p in sorted(set(state_before) - set(state_after)):
        parts.append(f"rm -f -- {q(p)}")
    for p in sorted(state_after):
        if state_before.get(p) != state_after[p]:
            if "/" in p:
                parts.append(f"mkdir -p {q(posixpath.dirname(p))}")
            parts.append(f"printf '%s' {q(state_after[p])} > {q(p)}")
    date = f"2024-02-{when:02d}T10:00:00+0000"
    parts.append(f"git add -A && GIT_AUTHOR_DATE={date} GIT_COMMITTER_DATE={date} git commit -q -m {q(message)}")
    return " && ".join(parts)


@_register("git_restore")
def _git_restore(rng, d):
    names = words(rng, 6, 2, 2)
    target = f"{names[0]}.cfg"

    def cfg():
        return lines([f"{word(rng, 1, 2)} = {rng.choice((str(rng.randint(1, 999)), word(rng, 2, 2), 'true', 'false'))}"
                      for _ in range(rng.randint(3, 6))])

    c1 = {target: cfg(), f"{names[1]}.cfg": cfg(), f"{names[2]}.cfg": cfg(), "README.md": lines([f"# {names[5]}", "", sentence(rng)]),
          f"src/{names[3]}.txt": lines([sentence(rng)]), f"src/{names[4]}.txt": lines([sentence(rng)])}
    bak = f"{names[1]}.cfg.bak"
    if d == 3:
        c1[bak] = cfg()
    history = [(c1, "initial import")]
    state = dict(c1)
    if d > 1:
        state = {**state, target: state[target] + f"{word(rng, 1, 2)} = {rng.randint(1, 999)}\n",
                 f"src/{names[3]}.txt": state[f"src/{names[3]}.txt"] + sentence(rng) + "\n"}
        history.append((state, f"tune {target}"))
    restored = state[target]
    state = {p: t for p, t in state.items() if p not in (target, bak)}
    history.append((state, "remove unused configuration"))
    if d > 1:
        state = {**state, "README.md": state["README.md"] + lines(["", sentence(rng)])}
        history.append((state, "update readme"))
    final = state
    setup, before = ["git init -q"], dict(final)  # the work tree starts as the task's files: the final state
    for k, (after, msg) in enumerate(history):
        setup.append(_commit_cmd(before, after, msg, k + 1))
        before = after
    leave = "; the same commit also removed an obsolete `.bak` file, which must stay deleted" if d == 3 else ""
    instruction = ("A commit in this git repository deleted a `.cfg` configuration file that is still needed. Restore that "
                   "file in the working tree with exactly the content it had just before it was deleted, and leave every "
                   f"other file as it is{leave}.")
    ref = [run("git log --stat --format='%h %ad %s' --date=short"),
           run(f"git rev-list -n 1 HEAD -- {q(target)}"),
           run(f"git checkout \"$(git rev-list -n 1 HEAD -- {q(target)})^\" -- {q(target)}"),
           run("git status --short")]
    checks = [{"op": "text", "path": target, "expect": restored}]
    checks += [{"op": "text", "path": p, "expect": t} for p, t in sorted(final.items())]
    if d == 3:
        checks.append({"op": "absent", "path": bak})
    return Built(instruction, final, checks, tuple(ref), setup=tuple(setup))


@_register("ticket_count")
def _ticket_count(rng, d):
    teams = words(rng, 3, 2, 2)
    users = words(rng, pick(d, rng.randint(6, 8), rng.randint(8, 10), rng.randint(9, 12)), 2, 2, avoid=teams)
    member = {u: teams[i] if i < len(teams) else rng.choice(teams) for i, u in enumerate(users)}
    domain = f"{word(rng, 2, 2)}.example"
    team = rng.choice(teams)
    want_prio = "high" if d > 1 else None
    n = pick(d, rng.randint(8, 12), rng.randint(12, 18), rng.randint(16, 24))
    files, count = {}, 0
    ids = sorted(rng.sample(range(100, 999), n))
    for k, tid in enumerate(ids):
        user = rng.choice([u for u in users if member[u] == team]) if k == 0 else rng.choice(users)
        status = "open" if k == 0 else rng.choice(("open", "open", "closed", "pending"))
        prio = "high" if k == 0 else rng.choice(("low", "medium", "high"))
        shown = f"{user}@{domain}" if d == 3 and rng.random() < 0.5 else user
        files[f"tickets/T-{tid}.txt"] = lines([f"title: {sentence(rng, 2, 5)}", f"assignee: {shown}", f"status: {status}",
                                               f"priority: {prio}", "", sentence(rng, 4, 9)])
        count += member[user] == team and status == "open" and (want_prio is None or prio == want_prio)
    header = "user,email,team" if d == 3 else "user,team"
    files["teams.csv"] = lines([header] + [f"{u},{u}@{domain},{member[u]}" if d == 3 else f"{u},{member[u]}" for u in users])
    cond = f"with status `open`{' and priority `high`' if want_prio else ''}"
    files["question.txt"] = lines([f"How many tickets in `tickets/` {cond} are assigned to members of team `{team}`?"])
    prio_test = " and t.get('priority') == 'high'" if want_prio else ""
    code = ["import csv, glob", "team = {}", "for r in csv.DictReader(open('teams.csv')):",
            "    team[r['user']] = r['team']", "    if r.get('email'):", "        team[r['email']] = r['team']", "n = 0",
            "for p in glob.glob('tickets/*.txt'):",
            "    t = dict(line.split(': ', 1) for line in open(p).read().splitlines() if ': ' in line)",
            f"    n += team.get(t['assignee']) == {team!r} and t['status'] == 'open'{prio_test}", "print(n)"]
    ref = [read("question.txt"), read("teams.csv"), read(f"tickets/T-{ids[0]}.txt"),
           run("python3 - <<'EOF'\n" + "\n".join(code) + "\nEOF"), write("answer.txt", f"{count}\n")]
    instruction = "Answer the question in `question.txt` using the files of this workspace. Write only the number to `answer.txt`."
    return Built(instruction, files, [{"op": "answer", "path": "answer.txt", "expect": str(count)}], tuple(ref))


# ------------------------------------------------------------------ public API --

def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> WorkspaceTask:
    """The task for ``seed`` (its sub-family drawn from the seed unless given)."""
    task = build_task(FAMILY, VERSION, SUBFAMILIES, seed, difficulty, subfamily)
    if len(task.reference) < MIN_REFERENCE_CALLS:
        raise RuntimeError(f"{task.task_id} ({task.subfamily}): the reference has fewer than {MIN_REFERENCE_CALLS} calls")
    return task


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[WorkspaceTask]:
    """``n`` tasks with seeds ``SPLIT_SEED_BASE[split] + i`` (train: 0, heldout: 1_000_000)."""
    return kit.split_tasks(make_task, SUBFAMILIES, split, n, difficulty, subfamilies)
