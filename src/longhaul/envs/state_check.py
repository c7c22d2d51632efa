"""Hidden state check of a longhaul task: the checks of spec.json against the files in the cwd."""
import json
import os
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.getcwd()


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def raw(path):
    if not os.path.isfile(path):
        fail(f"{path} is missing or not a regular file")
    with open(path, "rb") as f:
        return f.read()


def text(path):
    try:
        return raw(path).decode("utf-8")
    except UnicodeDecodeError:
        fail(f"{path} is not UTF-8 text")


def chomp(s):
    return s[:-1] if s.endswith("\n") else s


def walk(root, skip_hidden):
    found = {}
    for d, dirs, files in os.walk(root):
        if skip_hidden:
            dirs[:] = [x for x in dirs if not x.startswith(".")]
            files = [x for x in files if not x.startswith(".")]
        for name in files:
            p = os.path.join(d, name)
            found[os.path.relpath(p, root)] = p
        for name in dirs:  # os.walk does not descend into links to directories: name them as entries
            p = os.path.join(d, name)
            if os.path.islink(p):
                found[os.path.relpath(p, root)] = p
    return found


def member_name(name):
    while name.startswith("./"):
        name = name[2:]
    if name.startswith("/") or ".." in name.split("/"):
        fail(f"archive member {name!r} has an absolute or '..' path")
    return name


def check(c):
    op, path = c["op"], c.get("path")
    if op == "text":  # exact text; one final newline more or less is accepted
        if chomp(text(path)) != chomp(c["expect"]):
            fail(f"{path} does not have the expected content")
    elif op == "answer":  # a short answer: surrounding whitespace is ignored
        if text(path).strip() != c["expect"]:
            fail(f"{path} does not hold the right answer")
    elif op == "json":
        try:
            got = json.loads(text(path))
        except ValueError as e:
            fail(f"{path} is not valid JSON ({e})")
        if got != c["expect"]:
            fail(f"{path} does not hold the expected JSON")
    elif op == "json_key":
        try:
            got = json.loads(text(path))
        except ValueError as e:
            fail(f"{path} is not valid JSON ({e})")
        if not isinstance(got, dict) or got.get(c["key"]) != c["expect"]:
            fail(f"{path}: key {c['key']!r} does not have the expected value")
    elif op == "absent":
        if os.path.lexists(path):
            fail(f"{path} should not exist")
    elif op == "tree":  # exactly these regular files under root, byte for byte
        root = c["root"]
        if not os.path.isdir(root):
            fail(f"{root}/ is missing")
        found = walk(root, c.get("skip_hidden", False))
        want = c["files"]
        extra = sorted(set(found) - set(want))
        missing = sorted(set(want) - set(found))
        if missing:
            fail(f"missing under {root}/: {', '.join(missing[:5])}")
        if extra:
            fail(f"unexpected under {root}/: {', '.join(extra[:5])}")
        for rel, content in want.items():
            p = found[rel]
            if os.path.islink(p) or not os.path.isfile(p):
                fail(f"{p} is not a regular file")
            if raw(p) != content.encode("utf-8"):
                fail(f"{p} does not have the expected content")
    elif op == "mode":
        if os.path.islink(path) or not os.path.isfile(path):
            fail(f"{path} is missing or not a regular file")
        mode = os.stat(path).st_mode
        if c["exec"] and not mode & 0o100:
            fail(f"{path} is not executable")
        if not c["exec"] and mode & 0o111:
            fail(f"{path} should not be executable")
    elif op == "tar":  # a gzip tar holding exactly these regular files (directory entries are ignored)
        raw(path)
        try:
            with tarfile.open(path, "r:gz") as tf:
                got = {}
                for m in tf.getmembers():
                    if m.isdir():
                        continue
                    name = member_name(m.name)
                    if not m.isfile():
                        fail(f"archive member {name!r} is not a regular file")
                    data = tf.extractfile(m).read().decode("utf-8", "replace")
                    if name in got and got[name] != data:
                        fail(f"archive member {name!r} appears twice with different content")
                    got[name] = data
        except (tarfile.TarError, OSError, EOFError) as e:
            fail(f"{path} is not a readable .tar.gz archive ({e})")
        want = c["files"]
        if sorted(got) != sorted(want):
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            fail(f"{path}: missing members {missing[:5]}, unexpected members {extra[:5]}")
        for name, content in want.items():
            if got[name] != content:
                fail(f"{path}: member {name!r} does not have the expected content")
    elif op == "python":  # a probe in a child interpreter (agent code may exit or print): its last line is JSON
        try:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONNOUSERSITE"}  # the probe sees what the agent installed
            r = subprocess.run([sys.executable, "-c", c["code"], WORK], cwd=HERE, capture_output=True, text=True,
                               timeout=c.get("timeout", 20), env=env)
        except subprocess.TimeoutExpired:
            fail(f"{c['what']}: the probe timed out")
        lines = [x for x in r.stdout.splitlines() if x.strip()]
        if r.returncode != 0 or not lines:
            fail(f"{c['what']}: the probe failed: {(r.stderr.strip().splitlines() or ['no output'])[-1][:200]}")
        try:
            got = json.loads(lines[-1])
        except ValueError:
            fail(f"{c['what']}: the probe printed no JSON")
        if got != c["expect"]:
            bad = sorted(k for k in c["expect"] if not isinstance(got, dict) or got.get(k) != c["expect"][k])
            fail(f"{c['what']}: wrong {', '.join(bad) or 'result'}")
    else:
        fail(f"unknown check {op!r}")


def main():
    with open(os.path.join(HERE, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    for c in spec["checks"]:
        check(c)
    print("ok")


if __name__ == "__main__":
    main()
