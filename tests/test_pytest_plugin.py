"""The fixtures users get from kumiko_jobs.pytest_plugin, exercised in a pytester run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from kumiko_jobs.keys import Keys

pytest_plugins = ["pytester"]


def test_plugin_fixtures_isolate_and_run_jobs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> None:
    pytester.makeconftest('pytest_plugins = ["kumiko_jobs.pytest_plugin"]')
    pytester.makepyfile(
        """
        from kumiko_jobs import dispatch
        from kumiko_jobs.connection import get_keys

        from kumiko_jobs.connection import get_redis

        def test_runs(run_jobs, kumiko_prefix):
            assert get_keys().prefix == kumiko_prefix
            dispatch("tests.record", {"n": 1})
            assert get_redis().sismember("rq:queues", get_keys().queue("worker"))
            assert run_jobs() == {"succeeded": 1}
            print(f"prefix={kumiko_prefix}")
        """
    )
    # A subprocess: pytest-django sets up Django once per process.
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", str(root))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-W", "error", "--ds", "tests.settings", "-s"
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    # Nothing of the test's prefix is left in Redis, not even its queue in RQ's global list.
    [prefix] = re.findall(r"prefix=(\S+)", result.stdout.str())
    assert not list(redis_client.scan_iter(match=f"*{prefix}*"))
    assert not redis_client.sismember("rq:queues", Keys(prefix).queue("worker"))
