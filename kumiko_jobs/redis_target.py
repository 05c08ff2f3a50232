"""Where kumiko's Redis is: the ``REDIS`` / ``REDIS_URL`` setting, parsed once into a value.

Accepted forms (``KUMIKO_JOBS["REDIS"]``, or the older ``KUMIKO_JOBS["REDIS_URL"]``):

- ``redis://[[user]:password@]host:6379/0``, ``rediss://...`` (TLS; query options such as
  ``ssl_cert_reqs=none`` or ``ssl_ca_certs=/path/ca.pem`` go to redis-py), ``unix:///path.sock?db=0``;
- ``redis+sentinel://[[user]:password@]host:26379[,host:26379...]/<service>[/<db>]`` (and
  ``rediss+sentinel://`` for TLS to the master and the sentinels); the password is the master's,
  ``?sentinel_password=...`` authenticates to the sentinels;
- ``cache:<alias>``: share the connection pool of the django-redis cache ``CACHES[alias]``.

Connections are built by ``connection.py``; django-rq gets the same target from ``dashboard``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CACHE_PREFIX = "cache:"
# Query options of a sentinel URL that concern TLS; redis-py takes them as keyword arguments.
_SSL_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


class InvalidRedisSetting(ValueError):
    """The Redis setting cannot be used; the message says what to write instead."""


@dataclass(frozen=True)
class RedisTarget:
    kind: Literal["url", "sentinel", "cache"]
    # The setting as written (the url kind connects with it as is).
    raw: str
    cache_alias: str = ""
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False
    ssl_options: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """For messages and logs: never shows a password."""
        if self.kind == "cache":
            return f"the django-redis cache {self.cache_alias!r}"
        if self.kind == "sentinel":
            hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"Sentinel master {self.service_name!r} via {hosts} (db {self.db})"
        return mask_password(self.raw)


def configured_value(config: dict[str, Any]) -> tuple[str, str]:
    """(setting name, value) of the Redis setting in force: REDIS, REDIS_URL, env, default."""
    if config.get("REDIS"):
        return "REDIS", str(config["REDIS"])
    if config.get("REDIS_URL"):
        return "REDIS_URL", str(config["REDIS_URL"])
    return "env KUMIKO_REDIS_URL", os.environ.get("KUMIKO_REDIS_URL", DEFAULT_URL)


def parse(value: str) -> RedisTarget:
    """Parse one Redis setting; raise InvalidRedisSetting with a hint when it is unusable."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRedisSetting(f"{value!r} is not a Redis URL or 'cache:<alias>'.")
    if value.startswith(CACHE_PREFIX):
        alias = value[len(CACHE_PREFIX) :]
        if not alias:
            raise InvalidRedisSetting(f"{value!r} names no cache: write 'cache:default'.")
        return RedisTarget(kind="cache", raw=value, cache_alias=alias)
    scheme = value.partition("://")[0].lower() if "://" in value else ""
    if scheme in URL_SCHEMES:
        try:
            parts = urlsplit(value)
            _ = parts.port  # raises on a port that is not a number
        except ValueError as exc:
            raise InvalidRedisSetting(f"{mask_password(value)!r} is not a valid URL ({exc}).") from exc
        return RedisTarget(kind="url", raw=value, ssl=scheme == "rediss")
    if scheme in SENTINEL_SCHEMES:
        return _parse_sentinel(value, ssl=scheme.startswith("rediss"))
    raise InvalidRedisSetting(
        f"{mask_password(value)!r} is not a Redis URL: use redis://, rediss://, unix://, "
        "redis+sentinel:// (or rediss+sentinel://) or 'cache:<alias>'."
    )


def _parse_sentinel(value: str, *, ssl: bool) -> RedisTarget:
    # urlsplit cannot read a comma-separated host list (its .port fails), so split by hand.
    rest = value.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    credentials, _, hosts_part = netloc.rpartition("@")
    username, _, password = credentials.partition(":") if credentials else ("", "", "")
    sentinels: list[tuple[str, int]] = []
    for item in filter(None, hosts_part.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidRedisSetting(
                f"sentinel address {item!r} in {mask_password(value)!r} needs host:port "
                "(e.g. 10.0.0.1:26379)."
            )
        sentinels.append((host.strip("[]"), int(port)))
    segments = [unquote(s) for s in path.split("/") if s]
    if (
        not sentinels
        or not segments
        or len(segments) > 2
        or (len(segments) == 2 and not segments[1].isdigit())
    ):
        raise InvalidRedisSetting(
            f"{mask_password(value)!r} is not a Sentinel URL: write "
            "redis+sentinel://[:password@]host:26379[,host:26379]/<service name>[/<db>]."
        )
    options = {name: values[-1] for name, values in parse_qs(query).items()}
    unknown = set(options) - {"sentinel_password", *_SSL_OPTIONS}
    if unknown:
        raise InvalidRedisSetting(
            f"unknown option(s) {', '.join(sorted(unknown))} in {mask_password(value)!r}; known: "
            f"sentinel_password, {', '.join(_SSL_OPTIONS)}."
        )
    ssl_options: dict[str, Any] = {name: options[name] for name in _SSL_OPTIONS if name in options}
    if "ssl_check_hostname" in ssl_options:
        ssl_options["ssl_check_hostname"] = ssl_options["ssl_check_hostname"].lower() in ("1", "true", "yes")
    if ssl_options and not ssl:
        raise InvalidRedisSetting(f"TLS options in {mask_password(value)!r} need rediss+sentinel://.")
    return RedisTarget(
        kind="sentinel",
        raw=value,
        sentinels=tuple(sentinels),
        service_name=segments[0],
        db=int(segments[1]) if len(segments) == 2 else 0,
        username=unquote(username) or None,
        password=unquote(password) or None,
        sentinel_password=options.get("sentinel_password"),
        ssl=ssl,
        ssl_options=ssl_options,
    )


def mask_password(url: str) -> str:
    """The URL with its password (and a sentinel_password option) replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        credentials, _, hosts = netloc.rpartition("@")
        user, colon, _password = credentials.partition(":")
        netloc = f"{user}{':***' if colon else ''}@{hosts}"
    masked = f"{scheme}://{netloc}{slash}{tail}"
    if "sentinel_password=" in masked:
        parts = urlsplit(masked)
        query = "&".join(
            "sentinel_password=***" if item.startswith("sentinel_password=") else item
            for item in parts.query.split("&")
        )
        masked = urlunsplit(parts._replace(query=query))
    return masked
