"""`storage.stored_bytes` and `StorageWatch`, the measure behind the disk cap of a workdir no tmpfs
caps: allocated blocks, each inode once, links not followed, unreadable directories counted."""

import os

from longhaul.sandbox.storage import StorageWatch, stored_bytes

MB = 1 << 20


def _write(path, n):
    with open(path, "wb") as f:
        f.write(b"x" * n)


def test_counts_blocks_once_per_inode_and_follows_no_link(tmp_path):
    base = stored_bytes(tmp_path)
    _write(tmp_path / "a", 2 * MB)
    os.link(tmp_path / "a", tmp_path / "hard")
    os.symlink("/usr", tmp_path / "out")  # a link out of the tree adds only itself
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as f:
        f.truncate(512 * MB)  # holds no data
    got = stored_bytes(tmp_path) - base
    assert 2 * MB <= got < 2 * MB + 64 * 1024, got


def test_an_unreadable_directory_is_still_counted(tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    _write(d / "f", 3 * MB)
    os.chmod(d, 0)
    try:
        assert stored_bytes(tmp_path) >= 3 * MB
    finally:
        os.chmod(d, 0o700)


def test_the_watch_trips_past_the_cap_and_spares_a_workdir_already_over_it(tmp_path):
    # forced samples: an unforced one waits out a pause that stretches with the walk's cost
    w = StorageWatch(tmp_path, cap=1 * MB, interval=0.0)
    _write(tmp_path / "small", MB // 2)
    assert not w.over(force=True)
    _write(tmp_path / "big", 2 * MB)
    assert w.over(force=True)
    over_already = StorageWatch(tmp_path, cap=1 * MB, interval=0.0)  # a later command in the same workdir
    assert not over_already.over(force=True)
    os.remove(tmp_path / "big")
    assert not over_already.over(force=True)
    _write(tmp_path / "more", 4 * MB)
    assert over_already.over(force=True)


def test_an_unforced_sample_waits_for_its_interval(tmp_path):
    w = StorageWatch(tmp_path, cap=1 * MB, interval=3600.0)
    _write(tmp_path / "big", 2 * MB)
    assert w.due() > 3000
    assert not w.over()  # not due yet: no sample taken
    assert w.over(force=True)
    assert w.due() > 3000  # the forced sample set the next one an interval away
