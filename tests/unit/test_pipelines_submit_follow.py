"""`kftrain submit --wait` following a run (pipelines/submit.py `follow`) on a fake clock.

The KFP API is the STAND-IN of tests/kfp_standin.py behind kfp.Client's real code, reached without
a socket; each poll of the run answers the next entry of a script: a state, or an HTTP status
that fails the poll. What is tested is the class of answers a real KFP API gives over a long
run: every final state ends the wait (kfp.Client's own wait never stopped on CANCELED), a poll
failing transiently is retried and an outage longer than the budget is one line, any other
failure is one line, and the timeout names the last state; every ending that leaves the run in
KFP says so with its link.
"""

from __future__ import annotations

import pytest
import urllib3

from pipelines.submit import FOLLOW_RETRY_BUDGET_S, Submission, SubmitError, follow
from tests.kfp_standin import StandInKFP, socketless
from tests.unit.test_launch_retry import Clock

pytestmark = pytest.mark.timeout(60)
HOST = "http://kfp.example.test:8080"
DAY = 24 * 3600
GOES_ON = "the run is not stopped by this; see it at"


def followed(monkeypatch, states: list[str | int], timeout_s: float = DAY, poll_s: float = 10):
    """Follow a run of a stand-in whose polls answer `states` on a fake clock:
    (result or the SubmitError, the lines logged, the seconds the clock advanced)."""
    import kfp

    clock = Clock()
    with StandInKFP(run_states=states) as api:
        monkeypatch.setattr(urllib3.PoolManager, "urlopen", socketless(api))
        client = kfp.Client(host=HOST)
        api.runs["r-1"] = {"run_id": "r-1", "state": "PENDING", "polls": 0}  # as a submitted run is
        result = Submission("p", "v", "kftrain-v", "e", "r-1", f"{HOST}/#/runs/details/r-1")
        try:
            outcome = follow(
                client, HOST, result, timeout_s, poll_s, now=clock.now, sleep=clock.sleep, log=clock.lines.append
            )
        except SubmitError as exc:
            outcome = exc
    polls = [r for r in api.requests if r["path"].startswith("/apis/v2beta1/runs/")]
    assert polls and all(r["timeout"] is not None for r in polls)  # no poll may wait forever
    return outcome, clock.lines, sum(clock.sleeps)


@pytest.mark.parametrize(
    ("states", "final", "seen"),
    [
        (["PENDING", "RUNNING", "SUCCEEDED"], "SUCCEEDED", ["PENDING (0s)", "RUNNING (10s)", "SUCCEEDED (20s)"]),
        (["RUNNING", "FAILED"], "FAILED", ["RUNNING (0s)", "FAILED (10s)"]),
        (["RUNNING", "CANCELING", "CANCELED"], "CANCELED", ["RUNNING (0s)", "CANCELING (10s)", "CANCELED (20s)"]),
        (["RUNNING", "SKIPPED"], "SKIPPED", ["RUNNING (0s)", "SKIPPED (10s)"]),
        (["RUNNING", "PAUSED", "RUNNING", "SUCCEEDED"], "SUCCEEDED", ["RUNNING (0s)", "PAUSED (10s)", "RUNNING (20s)"]),
        (["RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"], "SUCCEEDED", ["RUNNING (0s)", "SUCCEEDED (30s)"]),
    ],
)
def test_every_final_state_ends_the_wait_and_each_new_state_is_one_line(monkeypatch, states, final, seen):
    result, lines, _ = followed(monkeypatch, states)
    assert result.state == final
    assert [line.removeprefix("run ") for line in lines][: len(seen)] == seen
    if final == "FAILED":
        assert result.error == "train: PyTorchJob failed: JobFailed"


@pytest.mark.parametrize("status", [502, 503, 504, 429, 500])
def test_a_poll_failing_transiently_is_retried_and_the_wait_goes_on(monkeypatch, status):
    result, lines, _ = followed(monkeypatch, ["RUNNING", status, status, status, "SUCCEEDED"])
    assert result.state == "SUCCEEDED"
    retries = [line for line in lines if line.startswith(f"kftrain: API get run {result.run_id} returned {status}")]
    assert len(retries) == 3, lines


@pytest.mark.parametrize(
    ("states", "timeout_s", "words"),
    [
        (["RUNNING"], 35, "not finished within 35s (last state: RUNNING)"),
        (["PENDING"], 35, "not finished within 35s (last state: PENDING)"),
        (["RUNNING", "CANCELING"], 35, "not finished within 35s (last state: CANCELING)"),
        (["RUNNING", 503], 120, "not finished within 120s (the KFP API was unavailable at the end)"),
    ],
)
def test_the_timeout_names_the_last_state_and_where_the_run_goes_on(monkeypatch, states, timeout_s, words):
    result, _, waited = followed(monkeypatch, states, timeout_s=timeout_s)
    assert result.state == "TIMEOUT"
    assert result.error == f"{words}; {GOES_ON} {result.run_url}"
    assert waited == pytest.approx(timeout_s)  # never sleeps past the timeout


@pytest.mark.parametrize(
    ("states", "words"),
    [
        (
            ["RUNNING", 503],
            f"stopped following: KFP API call 'get run {{id}}' kept failing for {FOLLOW_RETRY_BUDGET_S:.0f}s "
            f"(--wait retries a poll for {FOLLOW_RETRY_BUDGET_S:.0f}s); last error: (503) Error",
        ),
        (["RUNNING", 401], f"stopped following: the KFP API at {HOST} rejected the request (HTTP 401 Error): set"),
        (["RUNNING", 400], f"stopped following: the KFP API at {HOST} answered HTTP 400 Error:"),
    ],
)
def test_a_poll_that_cannot_succeed_is_one_line_saying_where_the_run_goes_on(monkeypatch, states, words):
    error, _, _ = followed(monkeypatch, states)
    assert isinstance(error, SubmitError), error
    message = str(error)
    run_id = message.split("/#/runs/details/")[-1]
    assert message.startswith(words.format(id=run_id)), message
    assert message.endswith(f"; {GOES_ON} {HOST}/#/runs/details/{run_id}")
    assert "\n" not in message


def test_a_run_deleted_mid_wait_is_said_so_and_not_said_to_go_on(monkeypatch):
    error, _, _ = followed(monkeypatch, ["RUNNING", 404])
    assert str(error) == f"stopped following: run r-1 is no longer in the KFP API at {HOST} (HTTP 404): it was deleted"


@pytest.mark.parametrize("answer", [{}, {"error": "session expired"}, {"state": "RUNNING"}])
def test_an_answer_that_is_not_a_kfp_run_stops_the_wait_at_once(monkeypatch, answer):
    """A gateway's answer once its session expired (`{}`, a login page kfp.Client reads as an empty
    run) was followed as RUNTIME_STATE_UNSPECIFIED until --timeout, a day by default."""
    import kfp

    clock = Clock()
    with StandInKFP(run_states=["RUNNING"]) as api:
        monkeypatch.setattr(urllib3.PoolManager, "urlopen", socketless(api))
        client = kfp.Client(host=HOST)
        api.runs["r-1"] = {"run_id": "r-1", "state": "PENDING", "polls": 0}
        api.broken = lambda method, path: answer if path.startswith("/apis/v2beta1/runs/") else None
        result = Submission("p", "v", "kftrain-v", "e", "r-1", f"{HOST}/#/runs/details/r-1")
        with pytest.raises(SubmitError, match=r"does not answer as a KFP API \(its answer to get run has no run_id\)"):
            follow(client, HOST, result, DAY, 10, now=clock.now, sleep=clock.sleep, log=clock.lines.append)
    assert sum(clock.sleeps) == 0
