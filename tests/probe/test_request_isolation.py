"""Nothing survives a request: each gets a fresh, size-limited scratch space that is its only writable
place and is gone when it ends (issue: untrusted submissions, item 2)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("verifiers")

from hostile import OS, submit, with_env  # noqa: E402

# Writes a marker everywhere it can, then reports (as a load_environment error) what it found of an
# earlier request's markers and where its writes were refused.
PROBE_PLACES = """    _found, _refused = [], []
    _places = ('/tmp', '/scratch', '/dev/shm', os.environ.get('TMPDIR', ''), os.environ.get('HOME', ''), '.',
               '/sandbox')
    for _d in _places:
        try:
            _found += [_d + '/' + _n for _n in os.listdir(_d) if _n.startswith('marker')]
        except OSError:
            pass
    for _d in _places:
        try:
            _fd = os.open(_d + '/marker-' + str(os.getpid()), os.O_WRONLY | os.O_CREAT)
            os.close(_fd)
        except OSError:
            _refused.append(_d)
    raise ValueError('FOUND=' + repr(sorted(_found)) + ' REFUSED=' + repr(_refused))
"""


def test_a_later_episode_sees_nothing_an_earlier_one_wrote(make_env):
    first, second = make_env(family="arithmetic"), make_env(family="arithmetic")
    assert first.unwrapped.probe.dynamic.sandbox is second.unwrapped.probe.dynamic.sandbox  # one shared zygote
    obs1, _ = submit(first, with_env(prefix=OS, before_load=PROBE_PLACES))
    obs2, _ = submit(second, with_env(prefix=OS, before_load=PROBE_PLACES), seed=1)
    for obs in (obs1, obs2):
        assert "FOUND=[]" in obs, obs
    # the request could write only to its scratch space (TMPDIR = HOME = /scratch in bubblewrap mode)
    refused = re.search(r"REFUSED=(\[[^\]]*\])", obs2)
    assert refused and "'/tmp'" in refused.group(1) and "'.'" in refused.group(1), obs2


BIG_WRITE = """    _written = 0
    try:
        _fd = os.open(os.environ['TMPDIR'] + '/big', os.O_WRONLY | os.O_CREAT)
        for _ in range(200):
            os.write(_fd, b'x' * 1_000_000)
            _written += 1
    except OSError as _e:
        raise ValueError('STOPPED_AT=' + str(_written) + ' ' + type(_e).__name__)
    raise ValueError('WROTE_ALL')
"""


def test_a_request_cannot_park_data_beyond_its_scratch_limit(make_env):
    env = make_env(family="arithmetic", overrides={"env": {"probe": {"sandbox": {"limits": {"scratch_mb": 24}}}}})
    obs, _ = submit(env, with_env(prefix=OS, before_load=BIG_WRITE))
    stopped = re.search(r"STOPPED_AT=(\d+)", obs)
    assert stopped, obs
    assert int(stopped.group(1)) <= 24 * 1.048576 + 1  # 24 MiB of 1 MB writes (the last one short)
    sandbox = env.unwrapped.probe.dynamic.sandbox
    assert not sandbox.request_folders()
    # and the next request starts from an empty scratch space again
    obs, _ = submit(env, with_env(prefix=OS, before_load=BIG_WRITE), seed=1)
    assert re.search(r"STOPPED_AT=(\d+)", obs) and int(re.search(r"STOPPED_AT=(\d+)", obs).group(1)) >= 20


def test_without_a_private_tmpfs_the_zygote_bounds_and_wipes_the_scratch_folder(make_env):
    """Where mounts are not permitted (an unprivileged bubblewrap, the fallback as a normal user) the
    scratch space is a folder: writing past its limit ends the request (disk_limit), and the next
    request finds it empty."""
    limits = {"scratch_mb": 24, "scratch_tmpfs": False, "wall_seconds": 20}
    env = make_env(family="arithmetic", overrides={"env": {"probe": {"sandbox": {"limits": limits}}}})
    many_files = ("    for _i in range(2000):\n"
                  "        _fd = os.open(os.environ['TMPDIR'] + '/f' + str(_i), os.O_WRONLY | os.O_CREAT)\n"
                  "        os.write(_fd, b'x' * 1_000_000)\n        os.close(_fd)\n        sum(range(100_000))\n")
    obs, _ = submit(env, with_env(prefix=OS, before_load=many_files))
    assert "[disk_limit]" in obs and "more than 24 MB" in obs, obs
    obs, _ = submit(env, with_env(prefix=OS, before_load=PROBE_PLACES), seed=1)
    assert "FOUND=[]" in obs, obs
    assert "'/scratch'" not in re.search(r"REFUSED=(\[[^\]]*\])", obs).group(1), obs  # its folder, writable
