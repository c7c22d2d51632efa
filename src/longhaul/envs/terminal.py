"""Procedurally generated shell tasks on files, text and data (family ``terminal``).

Each task gives the agent a small workspace (files under /work) and asks for a change of state
that the usual command-line tools make: sort and dedupe a list, total a CSV column per group,
rename files by a pattern, list the files holding a token, count matching lines, replace a
string across a tree, pack an archive, fix permissions, summarise a log as JSON, install a
package from a local offline wheelhouse and use it. The hidden check (the program in
`state_check.py`, driven by a per-task `spec.json`) compares the final files with what the task's
data determines exactly, so an empty or placeholder output never passes.

A task is a pure function of ``(seed, difficulty, subfamily)``: a private ``random.Random(seed)``
picks the sub-family (unless one is forced) and every name, number and row. A sub-family is a
builder ``(rng, difficulty) -> Built`` registered with ``@_register(name)``; difficulty 1 is
one plain step, 2 and 3 grow the data and add a second condition or step. ``Built.reference``
solves the task through the tools only (`run`, `write_file`), which the oracle agent replays.

This module holds the sub-families only. What generated families share (the registry, splits,
pseudo-words) is `longhaul.envs.kit`; the task shape, `Built` and `build_task`, is
`longhaul.envs.state_task`, shared with ``multistep``; the wheels are `longhaul.envs.wheel`.
"""

from __future__ import annotations

import json
import re

from longhaul.envs import kit
from longhaul.envs.kit import lines, make_registry, pick, sentence, word, words
from longhaul.envs.state_task import Built, build_task, q, run
from longhaul.envs.wheel import make_wheel
from longhaul.envs.workspace import WorkspaceTask

FAMILY = "terminal"
VERSION = "1"
DIFFICULTIES = kit.DIFFICULTIES
SPLIT_SEED_BASE = kit.SPLIT_SEED_BASE

SUBFAMILIES, _register = make_registry()

# ------------------------------------------------------------------ sub-families --


@_register("sort_unique")
def _sort_unique(rng, d):
    n = pick(d, rng.randint(12, 18), rng.randint(20, 30), rng.randint(25, 35))
    vocab = words(rng, n)
    counts = {w: rng.choice((1, 1, 2, 3, 4)) for w in vocab}
    if d == 3:  # a clear frequency order at the top, then ties broken by word
        for w, c in zip(vocab, (9, 7, 6, 6)):
            counts[w] = c
    tokens = [w for w, c in counts.items() for _ in range(c)]
    rng.shuffle(tokens)

    def noisy(w):
        if d == 1:
            return w
        w = "".join(ch.upper() if rng.random() < 0.3 else ch for ch in w)
        return " " * rng.choice((0, 0, 1, 2)) + w + " " * rng.choice((0, 0, 1))

    def body(toks):
        out = []
        for t in toks:
            out.append(noisy(t))
            if d > 1 and rng.random() < 0.15:
                out.append(rng.choice(("", " ", "  ")))
        return lines(out)

    expect = lines(sorted(vocab))
    if d < 3:
        files = {"words.txt": body(tokens)}
        src = "words.txt"
    else:
        k = rng.randint(3, 4)
        names = words(rng, k, 2, 2)
        parts = [tokens[i::k] for i in range(k)]
        files = {f"lists/{nm}.txt": body(p) for nm, p in zip(names, parts)}
        src = "lists/*.txt"
    checks = [{"op": "text", "path": "sorted.txt", "expect": expect}]
    if d == 1:
        instruction = ("`words.txt` has one word per line, some of them repeated. Write `sorted.txt` with every distinct "
                       "word exactly once, sorted in byte order (as `LC_ALL=C sort` sorts), one per line.")
        ref = [run("LC_ALL=C sort -u words.txt > sorted.txt")]
    else:
        where = "`words.txt` has" if d == 2 else "The files `lists/*.txt` have"
        instruction = (f"{where} one word per line in mixed case, with stray spaces around words, blank lines and repeats. "
                       "Treat words case-insensitively: write `sorted.txt` with every distinct word once, in lowercase, "
                       "without spaces, sorted in byte order (as `LC_ALL=C sort` sorts), one per line; blank lines are not words.")
        norm = f"cat {src} | tr 'A-Z' 'a-z' | tr -d ' \\t' | grep -v '^$'"
        ref = [run(f"{norm} | LC_ALL=C sort -u > sorted.txt")]
        if d == 3:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            checks.append({"op": "text", "path": "top.txt", "expect": lines(f"{c} {w}" for w, c in top)})
            instruction += (" Also write `top.txt` with the 3 most frequent words over all the files (after the same "
                            "lowercasing), one per line as `COUNT WORD` (e.g. `5 word`), most frequent first, ties in byte order of the word.")
            ref.append(run(f"{norm} | LC_ALL=C sort | uniq -c | LC_ALL=C sort -k1,1nr -k2,2 | head -n 3 | awk '{{print $1, $2}}' > top.txt"))
    return Built(instruction, files, checks, tuple(ref))


@_register("csv_group_sum")
def _csv_group_sum(rng, d):
    group = rng.choice(("region", "store", "team", "city", "branch", "depot"))
    groups = words(rng, pick(d, rng.randint(3, 4), rng.randint(4, 5), rng.randint(4, 6)))
    items = words(rng, 6, avoid=groups)
    nrows = pick(d, rng.randint(10, 14), rng.randint(18, 26), rng.randint(30, 45))
    cols = ["id", group, "item", "qty", "price"] + (["status"] if d == 3 else [])
    rng.shuffle(cols)
    rows = []
    for i in range(nrows):
        g = groups[i] if i < len(groups) else rng.choice(groups)  # every group has a row
        status = "paid" if i < len(groups) else rng.choice(("paid", "paid", "refunded", "pending"))
        rows.append({"id": str(1000 + i * rng.randint(1, 3) + rng.randint(0, 9) * 1000), group: g, "item": rng.choice(items),
                     "qty": str(rng.randint(1, 9)), "price": str(rng.randint(2, 99)), "status": status})
    rng.shuffle(rows)
    csv = lines([",".join(cols)] + [",".join(r[c] for c in cols) for r in rows])
    totals: dict[str, int] = {}
    for r in rows:
        if d == 3 and r["status"] != "paid":
            continue
        v = int(r["qty"]) * (int(r["price"]) if d > 1 else 1)
        totals[r[group]] = totals.get(r[group], 0) + v
    expect = lines([f"{group},total"] + [f"{g},{totals[g]}" for g in sorted(totals)])
    what = pick(d, "the sum of `qty`", "the sum of `qty * price`", "the sum of `qty * price` over the rows whose `status` is `paid`")
    instruction = (f"`sales.csv` is a CSV file with a header row (plain commas, no quoting). Write `totals.csv` with the header "
                   f"`{group},total` and then one row `{group.upper()},TOTAL` per {group} (in byte order of the {group} name), "
                   f"where TOTAL is {what} for that {group}" + (f" (leave out a {group} with no paid rows)" if d == 3 else "") + ".")
    ix = {c: i + 1 for i, c in enumerate(cols)}
    val = f"${ix['qty']}" if d == 1 else f"${ix['qty']}*${ix['price']}"
    cond = f"NR>1 && ${ix['status']}==\"paid\"" if d == 3 else "NR>1"
    ref = run(f"{{ echo '{group},total'; awk -F, '{cond} {{s[${ix[group]}]+={val}}} END {{for (k in s) print k \",\" s[k]}}' sales.csv "
              f"| LC_ALL=C sort -t, -k1,1; }} > totals.csv")
    return Built(instruction, {"sales.csv": csv}, [{"op": "text", "path": "totals.csv", "expect": expect}], (ref,))


@_register("rename_ext")
def _rename_ext(rng, d):
    dirs = ["docs"] + [f"docs/{w}" for w in words(rng, pick(d, 1, 2, 2), 2, 2)]
    if d > 1:
        dirs.append(f"{dirs[1]}/{word(rng, 2, 2)}")
    files, expect = {}, {}
    n = pick(d, rng.randint(4, 6), rng.randint(8, 11), rng.randint(9, 12))
    stems = words(rng, n + 4)
    for i in range(n):
        base = stems[i]
        if d == 3 and i % 3 == 0:  # names with spaces
            base = f"{base} {word(rng, 1, 2)} {rng.randint(1, 9)}"
        dr = dirs[i % len(dirs)]
        content = lines([sentence(rng) for _ in range(rng.randint(1, 3))])
        files[f"{dr}/{base}.txt"] = content
        expect[f"{dr}/{base}.md"[len('docs/'):]] = content
    for j, ext in enumerate(pick(d, (".log",), (".log", ".txt.bak", ".cfg"), (".log", ".txt.bak", ".text"))):
        dr = dirs[j % len(dirs)]
        content = lines([sentence(rng)])
        files[f"{dr}/{stems[n + j]}{ext}"] = content
        expect[f"{dr}/{stems[n + j]}{ext}"[len('docs/'):]] = content
    checks = [{"op": "tree", "root": "docs", "files": expect}]
    outside = ""
    if d > 1:
        keep = f"{word(rng, 2, 2)}.txt"
        files[keep] = lines([sentence(rng)])
        checks.append({"op": "text", "path": keep, "expect": files[keep]})
        outside = f" Files outside `docs/` (like `{keep}`) stay as they are."
    spaces = " Some names contain spaces." if d == 3 else ""
    instruction = ("Rename every file ending in `.txt` anywhere under `docs/` (subdirectories included) so that it ends in `.md` "
                   f"instead, e.g. `docs/a/b.txt` becomes `docs/a/b.md`. Keep contents unchanged and leave every other file alone.{spaces}{outside}")
    ref = run("find docs -type f -name '*.txt' -exec sh -c 'for f do mv -- \"$f\" \"${f%.txt}.md\"; done' sh {} +")
    return Built(instruction, files, checks, (ref,))


_WORDCH = re.compile(r"[A-Za-z0-9_]")


@_register("grep_files")
def _grep_files(rng, d):
    tag = rng.choice(("TODO", "FIXME", "HACK", "XXX", "BUG", "NOTE"))
    token = f"{tag}-{rng.randint(100, 9999)}"
    dirs = ["src"] + [f"src/{w}" for w in words(rng, pick(d, 1, 3, 4), 2, 2)]
    if d > 1:
        dirs.append(f"{dirs[1]}/{word(rng, 2, 2)}")
    n = pick(d, rng.randint(7, 9), rng.randint(12, 16), rng.randint(16, 22))
    names = words(rng, n)
    kinds = ["real"] * rng.randint(2, 4)
    if d > 1:
        kinds += ["case"] * rng.randint(1, 2)
    if d > 2:
        kinds += ["prefix", "suffix"]
    kinds += ["plain"] * (n - len(kinds))
    rng.shuffle(kinds)
    files = {}
    for i, (nm, kind) in enumerate(zip(names, kinds)):
        ext = rng.choice((".py", ".txt", ".cfg", ".md"))
        body = [f"# {sentence(rng)}" if ext == ".py" else sentence(rng) for _ in range(rng.randint(3, 7))]
        mark = {"real": token, "case": token.lower(), "prefix": f"X{token}", "suffix": f"{token}{rng.randint(0, 9)}"}.get(kind)
        if mark:
            k = rng.randrange(len(body))
            body[k] = f"{body[k]} {mark}: {sentence(rng, 2, 4)}"
        if kind == "real" and rng.random() < 0.4:  # a second hit in the same file
            body.append(f"see {token} again")
        files[f"{dirs[i % len(dirs)]}/{nm}{ext}"] = lines(body)
    pat = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(token) + r"(?![A-Za-z0-9_])")
    hits = sorted(p for p, t in files.items() if pat.search(t))
    assert len(hits) == kinds.count("real")
    instruction = (f"Find every file under `src/` that contains the token `{token}` (case-sensitive, as a whole word: not as part of "
                   f"a longer token). Write their paths relative to /work (like `src/x/y.py`), one per line, sorted in byte order, "
                   "to `matches.txt`.")
    ref = run(f"grep -rlw -- {q(token)} src | LC_ALL=C sort > matches.txt")
    return Built(instruction, files, [{"op": "text", "path": "matches.txt", "expect": lines(hits)}], (ref,))


def _log_line(rng, level, comp, status, extra=""):
    ts = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
    return f"{ts} {level} {comp}: {sentence(rng, 2, 5)}{extra} status={status}"


@_register("count_matches")
def _count_matches(rng, d):
    comps = words(rng, 4, 2, 2)
    dirs = ["logs"] + ([f"logs/{w}" for w in words(rng, 2, 2, 2)] if d == 3 else [])
    names = words(rng, pick(d, rng.randint(3, 4), rng.randint(4, 5), rng.randint(5, 7)), 2, 2)
    files, expect = {}, []
    for i, nm in enumerate(names):
        path = f"{dirs[i % len(dirs)]}/{nm}.log"
        out, count = [], 0
        for _ in range(rng.randint(*pick(d, (4, 9), (8, 14), (8, 16)))):
            level = rng.choice(("INFO", "INFO", "WARN", "ERROR", "ERROR", "DEBUG"))
            status = rng.choice((200, 200, 201, 404, 500, 502, 503, 302))
            extra = " after ERROR" if d > 1 and level != "ERROR" and rng.random() < 0.25 else ""
            out.append(_log_line(rng, level, rng.choice(comps), status, extra))
            count += level == "ERROR" and (d == 1 or 500 <= status <= 599)
        if i == 0:  # one file with no match at all
            out = [x for x in out if x.split()[1] != "ERROR"] or [_log_line(rng, "INFO", comps[0], 200)]
            count = 0
        files[path] = lines(out)
        expect.append((path, count))
    expect.sort()
    what = ("whose level (the second field) is `ERROR`" if d == 1 else
            "whose level (the second field) is `ERROR` and whose last field is `status=5xx` (a 5xx status code)")
    where = "every `*.log` file in `logs/`" if d < 3 else "every `*.log` file anywhere under `logs/`"
    instruction = (f"For {where}, count the lines {what}. Write `counts.txt` with one line `PATH COUNT` per file (PATH relative "
                   "to /work, like `logs/a.log`), sorted by PATH in byte order, including files with a count of 0.")
    cond = '$2=="ERROR"' if d == 1 else '$2=="ERROR" && $NF ~ /^status=5[0-9][0-9]$/'
    ref = run(f"for f in $(find logs -type f -name '*.log' | LC_ALL=C sort); do echo \"$f $(awk '{cond}' \"$f\" | wc -l)\"; done > counts.txt")
    return Built(instruction, files, [{"op": "text", "path": "counts.txt", "expect": lines(f"{p} {c}" for p, c in expect)}], (ref,))


@_register("sed_replace")
def _sed_replace(rng, d):
    a, b, dom = word(rng, 2, 2), word(rng, 1, 2), rng.choice(("internal", "corp", "lan", "example.com"))
    old = f"{a}{rng.randint(1, 9)}.{b}.{dom}"
    new = f"{word(rng, 2, 2)}{rng.randint(1, 9)}.{b}.{dom}"
    lookalike = old.replace(".", "-")  # matches the unescaped pattern `a1.b.dom`, never the literal string
    dirs = ["site"] + [f"site/{w}" for w in words(rng, pick(d, 1, 2, 3), 2, 2)]
    n = pick(d, rng.randint(4, 6), rng.randint(7, 10), rng.randint(9, 12))
    names = words(rng, n)
    files = {}
    for i, nm in enumerate(names):
        ext = ".conf" if i < 2 else rng.choice((".conf", ".html", ".txt"))
        if d > 1 and i == 2:
            ext = ".html"
        body = []
        for _ in range(rng.randint(3, 6)):
            r = rng.random()
            if r < 0.35 or (i < 3 and not body):
                body.append(f"upstream_{word(rng, 1, 2)} = http://{old}:{rng.randint(1000, 9999)}/")
            elif d == 3 and r < 0.5:
                body.append(f"alias = {lookalike}")
            else:
                body.append(f"{word(rng, 1, 2)} = {sentence(rng, 1, 3)}")
        files[f"{dirs[i % len(dirs)]}/{nm}{ext}"] = lines(body)
    if d == 3 and not any(lookalike in t for p, t in files.items() if p.endswith(".conf")):
        first = min(p for p in files if p.endswith(".conf"))
        files[first] += f"alias = {lookalike}\n"
    in_scope = (lambda p: True) if d == 1 else (lambda p: p.endswith(".conf"))
    expect = {p[len("site/"):]: (t.replace(old, new) if in_scope(p) else t) for p, t in files.items()}
    other = f"{word(rng, 2, 2)}.conf"
    files[other] = lines([f"mirror = http://{old}/", sentence(rng)])
    scope = "every file under `site/`" if d == 1 else "every `*.conf` file under `site/` (subdirectories included; other files stay unchanged)"
    instruction = (f"The host `{old}` was renamed to `{new}`. Replace every occurrence of the exact string `{old}` with `{new}` "
                   f"in {scope}. Change nothing else; `{other}` outside `site/` must stay as it is.")
    esc = old.replace(".", r"\.")
    pat = "-type f" if d == 1 else "-type f -name '*.conf'"
    ref = run(f"find site {pat} -exec sed -i 's/{esc}/{new}/g' {{}} +")
    checks = [{"op": "tree", "root": "site", "files": expect}, {"op": "text", "path": other, "expect": files[other]}]
    return Built(instruction, files, checks, (ref,))


@_register("tar_archive")
def _tar_archive(rng, d):
    subs = words(rng, 2, 2, 2)
    dirs = ["data", f"data/{subs[0]}", f"data/{subs[1]}"]
    files = {}
    n = pick(d, rng.randint(5, 7), rng.randint(7, 9), rng.randint(8, 11))
    names = words(rng, n + 3)
    exts = [".csv", ".csv", ".txt", ".json", ".log"]
    for i, nm in enumerate(names[:n]):
        ext = ".csv" if i < 2 else (".json" if i == 2 else rng.choice(exts))
        if ext == ".json":
            body = json.dumps({"name": nm, "value": rng.randint(1, 999)}) + "\n"
        elif ext == ".csv":
            body = lines(["key,value"] + [f"{word(rng, 1, 2)},{rng.randint(1, 99)}" for _ in range(rng.randint(2, 4))])
        else:
            body = lines([sentence(rng)])
        files[f"{dirs[i % len(dirs)]}/{nm}{ext}"] = body
    if d > 1:
        for nm in names[n:]:
            files[f"data/scratch/{nm}.csv"] = lines(["key,value", f"{word(rng, 1, 2)},{rng.randint(1, 99)}"])
        files["data/scratch/notes.json"] = json.dumps({"draft": True}) + "\n"
    kinds = (".csv",) if d < 3 else (".csv", ".json")
    chosen = {p: t for p, t in files.items() if p.endswith(kinds) and not p.startswith("data/scratch/")}
    if d < 3:
        members = chosen
        names_note = "with member names as paths relative to /work (like `data/x.csv`)"
    else:
        members = {p[len("data/"):]: t for p, t in chosen.items()}
        names_note = "with member names relative to `data/` (like `x.csv` or `sub/y.json`, without the `data/` prefix)"
    what = "every `*.csv` file" if d < 3 else "every `*.csv` and `*.json` file"
    excl = " except those under `data/scratch/`" if d > 1 else ""
    instruction = (f"Create a gzip-compressed tar archive `backup.tar.gz` in /work holding {what} under `data/` (subdirectories "
                   f"included){excl}, and nothing else, {names_note}. Leave the original files in place.")
    if d == 1:
        ref = run("find data -type f -name '*.csv' | LC_ALL=C sort | tar -czf backup.tar.gz -T -")
    elif d == 2:
        ref = run("find data -path data/scratch -prune -o -type f -name '*.csv' -print | LC_ALL=C sort | tar -czf backup.tar.gz -T -")
    else:
        ref = run("(cd data && find . -path ./scratch -prune -o -type f \\( -name '*.csv' -o -name '*.json' \\) -print "
                  "| LC_ALL=C sort | tar -czf ../backup.tar.gz -T -)")
    checks = [{"op": "tar", "path": "backup.tar.gz", "files": members},
              {"op": "tree", "root": "data", "files": {p[len("data/"):]: t for p, t in files.items()}}]
    return Built(instruction, files, checks, (ref,))


def _script(rng, shell=True):
    head = "#!/bin/sh" if shell and rng.random() < 0.5 else ("#!/bin/bash" if shell else "")
    body = [f"echo {q(sentence(rng, 2, 4))}", f"{word(rng, 2, 2).upper()}={rng.randint(1, 99)}"]
    return lines(([head] if head else []) + body)


@_register("fix_perms")
def _fix_perms(rng, d):
    files, checks, setup = {}, [], []
    if d < 3:
        names = words(rng, rng.randint(3, 5) + (2 if d == 2 else 0), 2, 2)
        for nm in names:
            files[f"bin/{nm}.sh"] = _script(rng)
            checks.append({"op": "mode", "path": f"bin/{nm}.sh", "exec": True})
        for nm in ("README.md", f"{word(rng, 2, 2)}.env"):
            files[f"bin/{nm}"] = lines([sentence(rng)])
            checks.append({"op": "mode", "path": f"bin/{nm}", "exec": False})
        instruction = "Make every `*.sh` file in `bin/` executable; the other files in `bin/` must not be executable."
        ref = [run("chmod +x bin/*.sh")]
        if d == 2:
            sub = word(rng, 2, 2)
            for i, nm in enumerate(words(rng, rng.randint(3, 5), 2, 2, avoid=names)):
                path = f"data/{sub}/{nm}.csv" if i % 2 else f"data/{nm}.csv"
                files[path] = lines(["a,b", f"{rng.randint(1, 9)},{rng.randint(1, 9)}"])
                checks.append({"op": "mode", "path": path, "exec": False})
                setup.append(f"chmod +x {q(path)}")
            instruction += " Also, nothing under `data/` (subdirectories included) may be executable; remove those execute bits."
            ref.append(run("find data -type f -exec chmod a-x {} +"))
        roots = ["bin"] + (["data"] if d == 2 else [])
    else:
        dirs = ["tools"] + [f"tools/{w}" for w in words(rng, 2, 2, 2)]
        names = words(rng, rng.randint(8, 11), 2, 2)
        for i, nm in enumerate(names):
            kind = ("script", "script", "noext", "lib", "data")[i % 5] if i < 5 else rng.choice(("script", "noext", "lib", "data"))
            path = f"{dirs[i % len(dirs)]}/{nm}" + {"script": ".sh", "noext": "", "lib": ".sh", "data": ".txt"}[kind]
            files[path] = _script(rng, shell=kind in ("script", "noext")) if kind != "data" else lines([sentence(rng)])
            checks.append({"op": "mode", "path": path, "exec": kind in ("script", "noext")})
            if kind in ("lib", "data") and rng.random() < 0.6 or i == 3:
                setup.append(f"chmod +x {q(path)}")
        instruction = ("Under `tools/` (subdirectories included), a file must be executable exactly when its first two bytes are `#!` "
                       "(a script, whatever its name); every other file there must not be executable. Fix the permissions.")
        ref = [run("find tools -type f -exec sh -c 'for f do if [ \"$(head -c 2 \"$f\")\" = \"#!\" ]; then chmod +x \"$f\"; "
                   "else chmod a-x \"$f\"; fi; done' sh {} +")]
        roots = ["tools"]
    instruction += " Do not change, move or delete any file."
    for r in roots:
        checks.append({"op": "tree", "root": r, "files": {p[len(r) + 1:]: t for p, t in files.items() if p.startswith(r + "/")}})
    return Built(instruction, files, checks, tuple(ref), setup=tuple(setup))


@_register("log_json")
def _log_json(rng, d):
    comps = words(rng, pick(d, 3, 4, 5), 2, 2)
    levels = ("INFO", "WARN", "ERROR", "DEBUG")
    n = pick(d, rng.randint(10, 15), rng.randint(18, 26), rng.randint(25, 35))
    t = rng.randint(0, 10_000)
    out, recs = [], []
    for i in range(n):
        t += rng.randint(1, 400)
        ts = f"2024-03-{1 + t // 86400 % 28:02d}T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z"
        level = "ERROR" if i == 1 else rng.choice(levels)
        comp = rng.choice(comps)
        out.append(f"{ts} {level} {comp} {sentence(rng, 2, 6)}")
        recs.append((ts, level, comp))
        if d == 3 and rng.random() < 0.2:
            out.append(rng.choice(("", f"# {sentence(rng, 2, 4)}")))
    summary: dict = {"total": len(recs), "levels": {}}
    for _, lv, _ in recs:
        summary["levels"][lv] = summary["levels"].get(lv, 0) + 1
    errs = [r for r in recs if r[1] == "ERROR"]
    if d > 1:
        summary["errors_by_component"] = {}
        for _, _, c in errs:
            summary["errors_by_component"][c] = summary["errors_by_component"].get(c, 0) + 1
    if d == 3:
        summary["first_error"], summary["last_error"] = errs[0][0], errs[-1][0]
    fields = ['"total": the number of log lines', '"levels": an object mapping each level that occurs to its number of lines']
    if d > 1:
        fields.append('"errors_by_component": an object mapping each component with ERROR lines to their number')
    if d == 3:
        fields.append('"first_error" and "last_error": the timestamps of the first and the last ERROR line')
    skip = " Blank lines and lines starting with `#` are not log lines." if d == 3 else ""
    instruction = ("`app.log` has lines `TIMESTAMP LEVEL COMPONENT MESSAGE...` (fields separated by single spaces)." + skip +
                   " Write `summary.json`, a JSON object with exactly these keys: " + "; ".join(fields) + ".")
    code = ["import json", "recs = []", "for line in open('app.log'):",
            "    if not line.strip() or line.startswith('#'):", "        continue",
            "    ts, lv, comp = line.split()[:3]", "    recs.append((ts, lv, comp))",
            "s = {'total': len(recs), 'levels': {}}", "for ts, lv, comp in recs:",
            "    s['levels'][lv] = s['levels'].get(lv, 0) + 1", "errs = [r for r in recs if r[1] == 'ERROR']"]
    if d > 1:
        code += ["s['errors_by_component'] = {}", "for ts, lv, comp in errs:",
                 "    s['errors_by_component'][comp] = s['errors_by_component'].get(comp, 0) + 1"]
    if d == 3:
        code += ["s['first_error'], s['last_error'] = errs[0][0], errs[-1][0]"]
    code += ["json.dump(s, open('summary.json', 'w'), indent=2)"]
    ref = run("python3 - <<'EOF'\n" + "\n".join(code) + "\nEOF")
    return Built(instruction, {"app.log": lines(out)}, [{"op": "json", "path": "summary.json", "expect": summary}], (ref,))


# ---- the offline wheelhouse (wheels from `longhaul.envs.wheel`) --

def _codec_source(name, version, func, shift, mark, dep=None):
    rot = (f"from {dep} import rotate\n" if dep else
           "def rotate(ch, k):\n    if 'a' <= ch <= 'z':\n        return chr((ord(ch) - 97 + k) % 26 + 97)\n"
           "    if 'A' <= ch <= 'Z':\n        return chr((ord(ch) - 65 + k) % 26 + 65)\n    return ch\n")
    return (f'"""{name} {version}: a small line codec."""\n\n{rot}\n__version__ = "{version}"\nSHIFT = {shift}\nMARK = "{mark}"\n\n\n'
            f"def {func}(text):\n    \"\"\"The encoded form of one line of text.\"\"\"\n"
            f"    return MARK + ''.join(rotate(ch, SHIFT) for ch in reversed(text))\n")


def _codec(text, shift, mark):
    def rot(ch):
        if "a" <= ch <= "z":
            return chr((ord(ch) - 97 + shift) % 26 + 97)
        if "A" <= ch <= "Z":
            return chr((ord(ch) - 65 + shift) % 26 + 65)
        return ch
    return mark + "".join(rot(ch) for ch in reversed(text))


_PROBE = """import importlib, importlib.metadata as md, json, os, sys
work = os.path.realpath(sys.argv[1])
local = os.path.join(work, '.local') + os.sep
out = {}
for dist in @DISTS@:
    m = importlib.import_module(dist)
    out[dist] = {'module_in_user_site': os.path.realpath(m.__file__).startswith(local),
                 'dist_in_user_site': os.path.realpath(str(md.distribution(dist).locate_file(''))).startswith(local),
                 'version': md.version(dist)}
m = importlib.import_module(@NAME@)
out['probe'] = [getattr(m, @FUNC@)(x) for x in @PROBES@]
print(json.dumps(out, sort_keys=True))
"""


@_register("wheel_install")
def _wheel_install(rng, d):
    name = word(rng, 2, 3) + rng.choice(("kit", "fmt", "codec", "tools", "lib"))
    func = rng.choice(("encode", "scramble", "transform", "convert", "mangle"))
    major = rng.randint(0, 3)
    versions = [f"{major}.{rng.randint(1, 4)}.{rng.randint(0, 9)}"]
    if d > 1:  # a newer release that pip would pick by default: the task pins the older one
        versions.append(f"{major}.{int(versions[0].split('.')[1]) + rng.randint(1, 3)}.{rng.randint(0, 9)}")
    dep = word(rng, 2, 2) + "core" if d == 3 else None
    params = {v: (rng.randint(1, 25), rng.choice("#@%+=~") + word(rng, 1, 1).upper()) for v in versions}
    while d > 1 and params[versions[0]][0] == params[versions[1]][0]:
        params[versions[1]] = (rng.randint(1, 25), params[versions[1]][1])
    files = {}
    for v in versions:
        shift, mark = params[v]
        fname, data = make_wheel(name, v, {f"{name}/__init__.py": _codec_source(name, v, func, shift, mark, dep)},
                                 requires=(dep,) if dep else (), summary=f"{name}: a small line codec")
        files[f"wheelhouse/{fname}"] = data
    if dep:
        dv = f"1.{rng.randint(0, 9)}.{rng.randint(0, 9)}"
        src = ('"""Shared helpers."""\n\n\ndef rotate(ch, k):\n    if "a" <= ch <= "z":\n        return chr((ord(ch) - 97 + k) % 26 + 97)\n'
               '    if "A" <= ch <= "Z":\n        return chr((ord(ch) - 65 + k) % 26 + 65)\n    return ch\n')
        fname, data = make_wheel(dep, dv, {f"{dep}/__init__.py": src})
        files[f"wheelhouse/{fname}"] = data
    want = versions[0]
    n = pick(d, rng.randint(4, 7), rng.randint(10, 16), rng.randint(14, 20))
    inputs = [" ".join(word(rng, 1, 3).capitalize() if rng.random() < 0.3 else word(rng, 1, 3) for _ in range(rng.randint(1, 4)))
              + rng.choice(("", "", "!", f" {rng.randint(1, 99)}")) for _ in range(n)]
    files["input.txt"] = lines(inputs)
    shift, mark = params[want]
    expect = lines(_codec(x, shift, mark) for x in inputs)
    pin = f" version `{want}` of" if d > 1 else ""
    instruction = (f"Install{pin} the Python package `{name}` from the local wheel directory `wheelhouse/` (there is no network) "
                   f"into your user site-packages (`pip install --user`, which puts it under /work/.local). Then use its function "
                   f"`{name}.{func}(text)` on every line of `input.txt` (without the line's newline) and write the results, "
                   "one per line and in the same order, to `output.txt`.")
    spec = f"{name}=={want}" if d > 1 else name
    dists = [name] + ([dep] if dep else [])
    probes = [rng.choice(inputs), "Az09 " + word(rng, 2, 2)]
    code = _PROBE
    for key, value in (("DISTS", dists), ("NAME", name), ("FUNC", func), ("PROBES", probes)):
        code = code.replace(f"@{key}@", repr(value))
    expect_probe = {dist: {"module_in_user_site": True, "dist_in_user_site": True, "version": want if dist == name else dv}
                    for dist in dists}
    expect_probe["probe"] = [_codec(x, shift, mark) for x in probes]
    checks = [{"op": "text", "path": "output.txt", "expect": expect},
              {"op": "python", "what": f"the installed package {name}", "code": code, "expect": expect_probe}]
    ref = (run(f"python3 -m pip install --disable-pip-version-check --no-index --find-links wheelhouse --user {q(spec)}"),
           run(f"python3 - <<'EOF' > output.txt\nimport {name}\nfor line in open('input.txt'):\n"
               f"    print({name}.{func}(line.rstrip('\\n')))\nEOF"))
    return Built(instruction, files, checks, ref)


# ------------------------------------------------------------------ public API --

def make_task(seed: int, difficulty: int = 1, subfamily: str | None = None) -> WorkspaceTask:
    """The task for ``seed`` (its sub-family drawn from the seed unless given)."""
    return build_task(FAMILY, VERSION, SUBFAMILIES, seed, difficulty, subfamily)


def make_split(split: str, n: int, difficulty: int = 1, subfamilies: list[str] | None = None) -> list[WorkspaceTask]:
    """``n`` tasks with seeds ``SPLIT_SEED_BASE[split] + i`` (train: 0, heldout: 1_000_000)."""
    return kit.split_tasks(make_task, SUBFAMILIES, split, n, difficulty, subfamilies)
