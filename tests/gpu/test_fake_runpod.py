"""The fake Runpod itself: its control route, and 2,000 jobs through run + status over the client's pooled
connections; the throughput the backend needs (>= 200 jobs/s) is asserted in the slow test (10,000 jobs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from fleet.runpod_api import ResultExpired, RetryPolicy, RunpodAPIError, ServerlessClient
from tests.gpu.fake_runpod import FakeRunpod, fakes


@pytest.fixture
def fake_runpod() -> Iterator[Callable[..., FakeRunpod]]:
    with fakes() as make:
        yield make


def test_faults_through_the_control_route(fake_runpod):
    fake = fake_runpod(instant=True)
    with ServerlessClient(fake.endpoint_id, fake.api_key, base_url=fake.job_base_url,
                          retry=RetryPolicy(attempts=1)) as c:
        done = c.run({})
        r = httpx.post(f"{fake.url}/_fake/faults", json={
            "fail_next": [{"route": "health", "status": 503, "count": 1}], "stick_next": 1, "expire": [done]})
        assert r.status_code == 200
        with pytest.raises(RunpodAPIError, match="HTTP 503"):
            c.health()
        assert c.status(c.run({})).status == "IN_QUEUE"
        with pytest.raises(ResultExpired):
            c.status(done)


def _throughput(fake: FakeRunpod, n: int, threads: int = 8) -> float:
    """Jobs per second from the first submit until every job was seen COMPLETED."""
    with ServerlessClient(fake.endpoint_id, fake.api_key, base_url=fake.job_base_url) as c:
        t0 = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            ids = list(pool.map(lambda i: c.run({"i": i}), range(n)))
        pending = set(ids)
        while pending:
            jobs = c.status_many(pending, max_workers=threads)
            pending = {i for i, j in jobs.items() if isinstance(j, RunpodAPIError) or not j.final}
        return n / (time.monotonic() - t0)


def test_two_thousand_jobs_through_the_client_and_the_fake(fake_runpod):
    """Every job submitted from 8 threads is seen completed, none twice. The rate is printed, not asserted: a
    wall-clock bound in the default run fails on a loaded machine (183 jobs/s beside a training job); the slow
    test below holds the >= 200 jobs/s the backend needs, over 10,000 jobs."""
    fake = fake_runpod(instant=True)
    rate = _throughput(fake, 2000)
    print(f"fake Runpod + client: {rate:.0f} jobs/s")
    assert fake.health()["jobs"]["completed"] == 2000


@pytest.mark.slow
def test_throughput_10000_jobs(fake_runpod):
    fake = fake_runpod(instant=True)
    rate = _throughput(fake, 10_000)
    assert rate >= 200 and fake.health()["jobs"]["completed"] == 10_000, f"{rate:.0f} jobs/s"
