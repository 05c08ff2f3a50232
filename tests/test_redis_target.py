"""The Redis setting: URL, TLS, Sentinel and cache forms, and their checks (E013-E104, W105, E106)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kumiko_jobs.checks import check_redis_setting
from kumiko_jobs.redis_target import InvalidRedisSetting, configured_value, mask_password, parse

LOCAL = "redis://127.0.0.1:6379/0"


def test_url_forms_are_kept_as_written() -> None:
    for url in (
        "redis://:pw@h:6379/2",
        "rediss://u:pw@h:6380/0?ssl_cert_reqs=none",
        "unix:///run/r.sock?db=1",
    ):
        target = parse(url)
        assert (target.kind, target.raw) == ("url", url)
    assert parse("rediss://h:6380/0").ssl


def test_sentinel_url() -> None:
    target = parse("redis+sentinel://app:s3cret@10.0.0.1:26379,[::1]:26380/mymaster/3?sentinel_password=sp")
    assert target.kind == "sentinel"
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380))
    assert (target.service_name, target.db) == ("mymaster", 3)
    assert (target.username, target.password) == ("app", "s3cret")
    assert target.sentinel_password == "sp" and not target.ssl
    tls = parse("rediss+sentinel://h:26379/m?ssl_cert_reqs=none&ssl_ca_certs=/ca.pem")
    assert tls.ssl and tls.ssl_options == {"ssl_cert_reqs": "none", "ssl_ca_certs": "/ca.pem"}
    assert parse("redis+sentinel://h:26379/m").db == 0


def test_cache_form() -> None:
    target = parse("cache:default")
    assert (target.kind, target.cache_alias) == ("cache", "default")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("http://x", "is not a Redis URL"),
        ("cache:", "names no cache"),
        ("redis://h:port/0", "not a valid URL"),
        ("redis+sentinel://h:26379", "is not a Sentinel URL"),
        ("redis+sentinel://h/m", "needs host:port"),
        ("redis+sentinel://h:26379/m?ssl_cert_reqs=none", "need rediss+sentinel"),
        ("redis+sentinel://h:26379/m?colour=blue", "unknown option(s) colour"),
        ("", "is not a Redis URL"),
    ],
)
def test_bad_values_say_what_to_write(value: str, fragment: str) -> None:
    with pytest.raises(InvalidRedisSetting, match=re.escape(fragment)):
        parse(value)


def test_passwords_never_show() -> None:
    assert mask_password("redis://u:pw@h:6379/0") == "redis://u:***@h:6379/0"
    assert mask_password("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_password("redis+sentinel://:pw@a:1,b:2/m?sentinel_password=sp") == (
        "redis+sentinel://:***@a:1,b:2/m?sentinel_password=***"
    )
    assert "pw" not in parse("redis+sentinel://:pw@a:1/m").describe()
    with pytest.raises(InvalidRedisSetting) as caught:
        parse("http://u:hunter2@h")
    assert "hunter2" not in str(caught.value)


def test_precedence_redis_then_redis_url_then_env(monkeypatch: Any) -> None:
    monkeypatch.setenv("KUMIKO_REDIS_URL", "redis://env:6379/0")
    assert configured_value({"REDIS": "cache:x", "REDIS_URL": LOCAL}) == ("REDIS", "cache:x")
    assert configured_value({"REDIS": None, "REDIS_URL": LOCAL}) == ("REDIS_URL", LOCAL)
    assert configured_value({}) == ("env KUMIKO_REDIS_URL", "redis://env:6379/0")


def _only(settings: Any, **config: Any) -> list[str]:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS": None, "REDIS_URL": None, **config}
    return [m.id for m in check_redis_setting()]


def test_e101_unparseable_setting(settings: Any) -> None:
    assert _only(settings, REDIS="http://x") == ["kumiko_jobs.E013"]
    assert _only(settings, REDIS_URL="http://x") == ["kumiko_jobs.E013"]
    assert _only(settings, REDIS=LOCAL) == []


def test_e102_both_settings(settings: Any) -> None:
    assert _only(settings, REDIS=LOCAL, REDIS_URL=LOCAL) == ["kumiko_jobs.E102"]


def test_e103_unknown_cache(settings: Any) -> None:
    assert _only(settings, REDIS="cache:nope") == ["kumiko_jobs.E103"]


def test_e104_cache_that_is_not_django_redis(settings: Any) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "builtin": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": LOCAL},
    }
    assert _only(settings, REDIS="cache:builtin") == ["kumiko_jobs.E104"]


def test_w105_cache_without_socket_timeouts(settings: Any) -> None:
    settings.CACHES = {
        **settings.CACHES,
        # Two URLs: django-redis shares one pool per URL between caches.
        "bare": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"},
        "timed": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": LOCAL,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5},
        },
    }
    assert _only(settings, REDIS="cache:bare") == ["kumiko_jobs.W105"]
    assert _only(settings, REDIS="cache:timed") == []


def test_e106_a_cache_django_redis_cannot_build_is_an_error_not_a_crash(settings: Any) -> None:
    settings.CACHES = {
        **settings.CACHES,
        "nourl": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "http://127.0.0.1:6379/0"},
        "noclient": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": LOCAL,
            "OPTIONS": {"CLIENT_CLASS": "no_such_module.Client"},
        },
    }
    for alias in ("nourl", "noclient"):
        [message] = _messages(settings, REDIS=f"cache:{alias}")
        assert message.id == "kumiko_jobs.E106"
        assert f"CACHES[{alias!r}]" in message.msg and "cannot build" in message.msg


def _messages(settings: Any, **config: Any) -> list[Any]:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS": None, "REDIS_URL": None, **config}
    return list(check_redis_setting())
