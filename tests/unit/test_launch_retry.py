"""The retry policy's pure parts: what is transient, what `Retry-After` means, the backoff."""

from __future__ import annotations

import datetime as dt
import http.client

import pytest
import urllib3
from kubernetes.client import ApiException

from tests.fake_kube import T0, api_error
from trainer.launch.retry import ApiRetry, ApiUnavailable, describe, is_transient, retry_after

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.t, self.sleeps, self.lines = T0, [], []

    def now(self) -> dt.datetime:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += dt.timedelta(seconds=s)


def failing(times: int, exc: Exception):
    calls = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return "ok"

    return fn, calls


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (api_error(500), True),
        (api_error(502), True),
        (api_error(503), True),
        (api_error(504), True),
        (api_error(429), True),
        (api_error(408), True),
        (api_error(400), False),
        (api_error(401), False),
        (api_error(403), False),
        (api_error(404), False),
        (api_error(409), False),
        (api_error(410), False),
        (api_error(422), False),
        (ApiException(status=0, reason="no response"), False),
        (ConnectionResetError(), True),
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (OSError("Network is unreachable"), True),
        (urllib3.exceptions.ProtocolError("Connection aborted."), True),
        (urllib3.exceptions.MaxRetryError(None, "/api", reason=ConnectionRefusedError()), True),
        (urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"), True),
        (http.client.IncompleteRead(b""), True),
        (ValueError("bad manifest"), False),
        (KeyError("status"), False),
    ],
)
def test_what_is_transient(exc, transient):
    assert is_transient(exc) is transient


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        (None, None),
        ({}, None),
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": "2.5"}, 2.5),  # header names are case-insensitive
        ({"Retry-After": "-3"}, 0.0),
        ({"Retry-After": "Thu, 01 Jan 2026 00:00:30 GMT"}, 30.0),  # an HTTP date, 30 s after T0
        ({"Retry-After": "soon"}, None),
    ],
)
def test_retry_after(headers, seconds):
    exc = api_error(429, headers)
    assert retry_after(exc, T0) == seconds


def test_describe_is_one_line():
    assert describe(api_error(503)) == "(503) Service Unavailable"
    assert describe(ConnectionResetError(104, "Connection reset by peer")) == (
        "ConnectionResetError: [Errno 104] Connection reset by peer"
    )
    assert describe(TimeoutError()) == "TimeoutError"


def test_backoff_doubles_to_the_cap_and_the_budget_bounds_the_total():
    clock = Clock()
    retry = ApiRetry(100, now=clock.now, sleep=clock.sleep, log=clock.lines.append, rng=lambda: 1.0)
    fn, calls = failing(10_000, api_error(503))
    with pytest.raises(ApiUnavailable, match=r"'get job x' kept failing for 100s .*=100\); last error: \(503\)"):
        retry.call("get job x", fn)
    assert clock.sleeps[:7] == [1, 2, 4, 8, 16, 30, 30]
    assert sum(clock.sleeps) == 100  # the last sleep is cut to what is left of the budget
    assert len(clock.lines) == len(clock.sleeps) == len(calls) - 1


def test_a_zero_retry_after_still_backs_off():
    clock = Clock()
    retry = ApiRetry(100, now=clock.now, sleep=clock.sleep, log=clock.lines.append, rng=lambda: 0.0)
    fn, _ = failing(2, api_error(429, {"Retry-After": "0"}))
    assert retry.call("list pods", fn) == "ok"
    assert clock.sleeps == [0.5, 1.0]


def test_a_final_error_propagates_unchanged_and_is_not_logged():
    clock = Clock()
    retry = ApiRetry(100, now=clock.now, sleep=clock.sleep, log=clock.lines.append)
    error = api_error(404)
    fn, calls = failing(1, error)
    with pytest.raises(ApiException) as info:
        retry.call("get job x", fn)
    assert info.value is error and len(calls) == 1 and not clock.sleeps and not clock.lines
