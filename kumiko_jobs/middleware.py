"""``CorrelationMiddleware``: jobs dispatched while a request is handled carry its correlation id.

The id is the request's ``X-Request-ID`` header when it is a valid one (1-64 characters of
letters, digits and ``._:/+=-``: it is stored on every run, in a 64-character column), else a
new one, time-ordered like run ids (run_ids.py: the runs' correlation index takes it). It is
set as ``request.correlation_id`` and returned in the response's ``X-Request-ID`` header, so a
client or proxy can quote it. Sync and async stacks both work.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from kumiko_jobs.observability import correlation_scope
from kumiko_jobs.run_ids import new_run_id
from kumiko_jobs.validation import is_correlation_id

HEADER = "X-Request-ID"


def correlation_id_for(request: HttpRequest) -> str:
    """The request's own id if it sent a valid one, else a new one."""
    sent = request.headers.get(HEADER)
    return sent if sent is not None and is_correlation_id(sent) else new_run_id().hex


class CorrelationMiddleware:
    """Put it early in ``MIDDLEWARE`` (after SecurityMiddleware) so everything after it,
    ``transaction.atomic()`` commits included, dispatches with the request's id."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        if self.is_async:
            return self._acall(request)
        correlation_id = self._start(request)
        with correlation_scope(correlation_id):
            response: HttpResponseBase = self.get_response(request)
        return self._finish(response, correlation_id)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        correlation_id = self._start(request)
        with correlation_scope(correlation_id):
            response: HttpResponseBase = await self.get_response(request)
        return self._finish(response, correlation_id)

    @staticmethod
    def _start(request: HttpRequest) -> str:
        correlation_id = correlation_id_for(request)
        request.correlation_id = correlation_id  # type: ignore[attr-defined]
        return correlation_id

    @staticmethod
    def _finish(response: HttpResponseBase, correlation_id: str) -> HttpResponseBase:
        if HEADER not in response.headers:
            response.headers[HEADER] = correlation_id
        return response
