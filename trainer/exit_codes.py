"""The exit codes of a training process, which the launcher reads to tell why a replica ended.

Kubeflow's `restartPolicy: ExitCode` treats 1-127 as permanent failures and 128-255 as
retryable, so an interruption that saved its work exits in the retryable range and a fault in
the run itself in the permanent one.
"""

#: Trained to the end.
OK = 0
#: The run itself failed: a bad input, a bug in user code (permanent; no restart helps).
USER_ERROR = 1
#: The loss or gradients became non-finite (train.on_nonfinite: stop): permanent.
NONFINITE_LOSS = 3
#: A collective did not complete within job.collective_timeout_seconds (a hung or lost peer).
COLLECTIVE_TIMEOUT = 4
#: Stopped by SIGTERM (preemption, eviction, Ctrl-C) after committing a checkpoint at a step
#: boundary: retryable, and a restart resumes where it stopped (128 + SIGTERM).
TERMINATED_CHECKPOINTED = 143
