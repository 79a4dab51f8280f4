"""`kftrain submit` against a host that answers 200 with JSON but not as the KFP API.

The server is the STAND-IN KFP API of tests/kfp_standin.py, reached without a socket: urllib3's
`PoolManager.urlopen` (the transport under kfp.Client) is replaced by a function that hands each
request to the stand-in's `handle` (a unit test opens no connection). One call at a time answers
as a server that is not KFP does, `{}` or an object without the id; everything else of kfp.Client
is real. What is tested (pipelines/submit.py `_kfp_call`): every call whose answer lacks the id
the next call or a printed link needs ends in one line saying the host does not answer as the
KFP API, and no link with `None` in it is printed before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import urllib3

from pipelines.submit import SubmitError, submit
from tests.kfp_standin import PREFIX, StandInKFP, socketless

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "compiled" / "training_pipeline.yaml"
HOST = "http://kfp.example.test:8080"

#: (method, path) of a call -> its answer from a server that is not KFP, and the error's words.
NOT_KFP = {
    "upload": (("POST", "/pipelines/upload"), {}, "upload the pipeline has no pipeline_id"),
    "versions": (
        ("GET", "/versions"),
        {"pipeline_versions": [{}]},
        "list pipeline versions has a version without a pipeline_version_id",
    ),
    "upload version": (
        ("POST", "/pipelines/upload_version"),
        {"display_name": "x"},
        "upload the pipeline version has no pipeline_version_id",
    ),
    "experiment": (("POST", "/experiments"), {}, "create the experiment has no experiment_id"),
    "run": (("POST", "/runs"), {"run_id": ""}, "create the run has no run_id"),
    "every call": ((None, ""), {}, "upload the pipeline has no pipeline_id"),  # `{}` to everything
}


@pytest.fixture
def kfp_api(monkeypatch):
    """The STAND-IN KFP API behind kfp.Client's transport (`kfp_api.broken = not_kfp(key)` makes
    one call answer as a server that is not KFP)."""
    with StandInKFP() as api:  # its own server listens, unused: no request reaches a socket
        monkeypatch.setattr(urllib3.PoolManager, "urlopen", socketless(api))
        yield api


def not_kfp(key: str):
    """`StandInKFP.broken` answering the call `NOT_KFP[key]` names as a server that is not KFP."""
    (bad_method, suffix), bad_answer, _ = NOT_KFP[key]

    def broken(method: str, path: str) -> dict | None:
        return bad_answer if bad_method is None or (method == bad_method and path.endswith(suffix)) else None

    return broken


def _submit(params=None):
    import kfp

    client = kfp.Client(host=HOST)
    return submit(client, HOST, PACKAGE, "kftrain-test", "exp", "run 1", params or {})


def test_the_stand_in_transport_submits_as_a_kfp_api_would(kfp_api, capsys):
    """The harness itself: with no call broken, the submission goes through and every link is real."""
    result = _submit()
    assert result.run_id in kfp_api.runs and result.run_url == f"{HOST}/#/runs/details/{result.run_id}"
    out = capsys.readouterr().out
    assert "Pipeline details: " in out and "Run details: " in out and "None" not in out
    assert kfp_api.requests[0]["path"] == f"{PREFIX}/healthz"


@pytest.mark.parametrize("broken", list(NOT_KFP))
def test_an_answer_without_the_id_kfp_gives_is_one_line_and_no_link_to_none(kfp_api, capsys, broken):
    kfp_api.broken = not_kfp(broken)
    with pytest.raises(SubmitError) as caught:
        _submit()
    message = str(caught.value)
    assert message.startswith(f"{HOST} does not answer as a KFP API (its answer to {NOT_KFP[broken][2]}): check --host")
    assert "\n" not in message
    assert "None" not in capsys.readouterr().out  # no `.../details/None` link before the error


@pytest.mark.parametrize(
    ("token", "login"),
    [
        (None, "if a login page stands in front of it, set KFP_TOKEN"),
        # A token sent and a login page all the same: the token did not get past it (was: "set KFP_TOKEN").
        ("eyJhbGciOi.expired", "if that is a login page in front of it, the token sent did not get past it "
         "(expired, or for another audience or host): set KFP_TOKEN to a fresh one"),
    ],
)  # fmt: skip
def test_submit_command_prints_only_the_error_line_for_a_host_that_answers_empty_objects(
    kfp_api, capsys, monkeypatch, token, login
):
    """The probe's case (`{}` to every request) through `kftrain submit`. The health probe is a
    separate urllib request (tested against a stand-in process in tests/integration/test_submit.py):
    here it is skipped, as it lets `{}` through."""
    from pipelines.cli import main

    monkeypatch.setattr("pipelines.submit.probe_host", lambda host, timeout_s=10.0, ca=None: None)
    if token:
        monkeypatch.setenv("KFP_TOKEN", token)
    else:
        monkeypatch.delenv("KFP_TOKEN", raising=False)
    kfp_api.broken = not_kfp("every call")
    assert main(["submit", "--host", HOST, "--package", str(PACKAGE)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"kftrain: error: {HOST} does not answer as a KFP API (its answer to upload the pipeline has no pipeline_id): "
        "check --host; it is the KFP API or UI address, e.g. http://localhost:8080 with `kubectl port-forward "
        f"svc/ml-pipeline-ui 8080:80`, and {login}"
    ]
