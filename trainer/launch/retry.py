"""One retry policy for every call to a cluster's API (Kubernetes for the launcher, KFP for
`kftrain submit --wait`): transient vs final.

A training job runs for hours; in that time the API server restarts, a load balancer resets
connections, and API Priority and Fairness answers 429. None of that says anything about the
job, so none of it may fail the step (and `run_job` deletes the job on any failure).

- Transient, retried: HTTP 5xx, 429 and 408 (after `Retry-After` when the server sends it), and
  connection errors (urllib3 errors, `ConnectionError`, `TimeoutError`, `OSError`,
  `http.client.HTTPException`), with capped exponential backoff and jitter.
- Final, raised at once: every other answer (400, 401, 403, 404, 409, 422, ...): retrying
  cannot change it, and the caller decides what it means (404 on get: the job is gone; 409 on
  create: re-attach).
- One call retries for at most `kubernetes.api_retry_budget_seconds` (and never past the job's
  deadline), then fails with :class:`ApiUnavailable`, which names the call and the last cause.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import http.client
import random
import re
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.launch.backend import JobFailed

try:  # the kubernetes client's transport; absent only where the client is not installed
    from urllib3.exceptions import HTTPError as _Urllib3Error
except ImportError:  # pragma: no cover
    _Urllib3Error = OSError

T = TypeVar("T")

#: Every API call's (connect, read) timeout, in seconds. The clients have none: a connection that
#: a dead API server or load balancer leaves half-open blocked the caller for good, past its
#: deadline and its retry budget. A timed-out call is transient (retried).
REQUEST_TIMEOUT_S = (10.0, 60.0)
#: How long a cancel's delete is retried: within a pod's default 30 s termination grace, which a
#: KFP step's pod has, so that "delete it by hand" is said before the launcher is killed.
CANCEL_RETRY_BUDGET_S = 20.0
RETRIED_STATUSES = frozenset({408, 429})
CONNECTION_ERRORS = (_Urllib3Error, OSError, http.client.HTTPException)  # OSError covers Connection/TimeoutError


class ApiUnavailable(JobFailed):
    """An API call kept failing transiently until its retry budget or the deadline ran out."""

    def __init__(self, message: str, at_deadline: bool = False) -> None:
        super().__init__(message)
        self.at_deadline = at_deadline


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of an API error (`ApiException.status`), or None for other errors."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and status > 0 else None


def is_transient(exc: BaseException) -> bool:
    """True when asking again may get a different answer: 5xx, 429, 408, or a connection error."""
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status in RETRIED_STATUSES
    return isinstance(exc, CONNECTION_ERRORS)


def retry_after(exc: BaseException, now: dt.datetime | None = None) -> float | None:
    """Seconds the server asked us to wait (`Retry-After`: seconds or an HTTP date), if it did."""
    headers = getattr(exc, "headers", None)
    if not headers:
        return None
    value = next((v for k, v in headers.items() if str(k).lower() == "retry-after"), None)
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    try:
        when = email.utils.parsedate_to_datetime(str(value))
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - (now or dt.datetime.now(dt.timezone.utc))).total_seconds())


def refused_call(exc: BaseException) -> str:
    """The call a final API error answered (`get PyTorchJob team/x`), as :meth:`ApiRetry.call` named it;
    `a call` when the error did not come through it."""
    return f"'{exc.api_call}'" if isinstance(getattr(exc, "api_call", None), str) else "a call"


def describe(exc: BaseException) -> str:
    """A one-line cause: `(503) Service Unavailable` for API errors, `Type: message` otherwise
    (`str(ApiException)` spans several lines with headers and body)."""
    status = http_status(exc)
    if status is not None:
        return f"({status}) {getattr(exc, 'reason', '') or ''}".rstrip()
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def unreachable(exc: BaseException) -> str:
    """What the system said of a connection that got no answer (`Connection refused`, `Name or
    service not known`), from under urllib3's `MaxRetryError(... NewConnectionError(...))`."""
    text = str(getattr(exc, "reason", None) or exc)
    said = re.findall(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    return said[-1].strip() if said else describe(exc)[:200]


class ApiRetry:
    """Calls a function, retrying transient API errors within a time budget.

    `now` and `sleep` are injected so tests run on a fake clock; `rng` gives the jitter. The
    budget is per call, not per job: a job that lives for days survives any number of short
    outages, while one outage longer than the budget fails the step with its cause. `api` names
    the service in the error, and `limit` the budget (default: the setting that gives it).
    """

    def __init__(
        self,
        budget_s: float,
        *,
        now: Callable[[], dt.datetime],
        sleep: Callable[[float], None],
        log: Callable[[str], None],
        base_s: float = 1.0,
        cap_s: float = 30.0,
        rng: Callable[[], float] = random.random,
        api: str = "Kubernetes API",
        limit: str | None = None,
    ) -> None:
        self.budget_s, self.base_s, self.cap_s = budget_s, base_s, cap_s
        self.api = api
        self.limit = limit or f"(kubernetes.api_retry_budget_seconds={budget_s:g})"
        self._now, self._sleep, self._log, self._rng = now, sleep, log, rng

    def backoff(self, attempt: int) -> float:
        """Delay before retry number `attempt` (0-based): doubling from `base_s`, capped at
        `cap_s`, then scaled by 0.5-1.0 so that many launchers do not retry in lockstep."""
        return min(self.cap_s, self.base_s * 2**attempt) * (0.5 + self._rng() / 2)

    def call(self, what: str, fn: Callable[..., T], *args: Any, stop_at: dt.datetime | None = None, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)`, retried while it fails transiently; `what` names the call in
        logs and errors (`get PyTorchJob team/kftrain-...`). Final errors propagate unchanged."""
        start = self._now()
        give_up = start + dt.timedelta(seconds=self.budget_s)
        at_deadline = stop_at is not None and stop_at < give_up
        if at_deadline:
            give_up = stop_at
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    exc.api_call = what  # the caller's error names the call that was refused
                    raise
                now = self._now()
                # `Retry-After: 0` would make a tight loop against a server that is shedding load.
                asked = retry_after(exc, now) or None
                delay = asked if asked is not None else self.backoff(attempt)
                left = (give_up - now).total_seconds()
                # Past the budget, or the server asks for longer than is left: that is the answer.
                if left <= 0 or (asked is not None and asked > left):
                    waited = (now - start).total_seconds()
                    limit = "until the job's deadline (job.timeout_seconds)" if at_deadline else self.limit
                    how = f"kept failing for {waited:.0f}s {limit}"
                    if left > 0:  # the server's own answer: wait longer than there is left
                        how = (
                            f"failed, and the server asked to wait {asked:.0f}s, past what is left "
                            f"({left:.0f}s {limit})"
                        )
                    raise ApiUnavailable(
                        f"{self.api} call '{what}' {how}; last error: {describe(exc)}", at_deadline=at_deadline
                    ) from exc
                delay = min(delay, left)
                cause = f"returned {http_status(exc)}" if http_status(exc) else f"failed ({describe(exc)})"
                hint = " (Retry-After)" if asked is not None else ""
                self._log(f"kftrain: API {what} {cause}; retrying in {delay:.1f}s{hint}")
            self._sleep(delay)
            attempt += 1
