"""The fixtures users get from kumiko_jobs.pytest_plugin, exercised in a pytester run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


def test_plugin_fixtures_isolate_and_run_jobs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest('pytest_plugins = ["kumiko_jobs.pytest_plugin"]')
    pytester.makepyfile(
        """
        from kumiko_jobs import dispatch
        from kumiko_jobs.connection import get_keys

        def test_runs(run_jobs, kumiko_prefix):
            assert get_keys().prefix == kumiko_prefix
            dispatch("tests.record", {"n": 1})
            assert run_jobs() == {"succeeded": 1}
        """
    )
    # A subprocess: pytest-django sets up Django once per process.
    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", str(root))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "--ds", "tests.settings")
    result.assert_outcomes(passed=1)
