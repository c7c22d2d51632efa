from longhaul.sandbox import run_many, run_python


def test_exit_codes_and_output():
    ok = run_python("print('hi')")
    assert ok.ok and ok.stdout == "hi\n"
    bad = run_python("raise SystemExit(3)")
    assert bad.exit_code == 3 and not bad.ok


def test_timeout_kills_the_process_group():
    r = run_python("import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)", timeout_s=0.5)
    assert r.timed_out and not r.ok and r.wall_s < 10


def test_output_is_capped_and_non_utf8_survives():
    r = run_python("import sys\nsys.stdout.buffer.write(b'\\xff' * 200000)")
    assert r.ok and len(r.stdout) <= 64 * 1024


def test_run_many_keeps_order():
    rs = run_many([f"print({i})" for i in range(6)], workers=2)
    assert [r.stdout.strip() for r in rs] == [str(i) for i in range(6)]
