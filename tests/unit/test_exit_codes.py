"""trainer/exit_codes.py: the codes fall in the range Kubeflow's ExitCode restart policy gives them."""

from trainer import exit_codes


def test_interruptions_are_retryable_and_faults_permanent():
    # restartPolicy ExitCode: 1-127 permanent, 128-255 retryable (Training Operator docs).
    assert 128 <= exit_codes.TERMINATED_CHECKPOINTED <= 255
    for code in (exit_codes.USER_ERROR, exit_codes.NONFINITE_LOSS, exit_codes.COLLECTIVE_TIMEOUT):
        assert 1 <= code <= 127
    codes = [v for k, v in vars(exit_codes).items() if k.isupper()]
    assert len(codes) == len(set(codes))
