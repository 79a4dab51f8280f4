"""torchrun (`torch.distributed.run`), ending with the status a stop signal deserves.

    python -m trainer.torchrun [torchrun options] -m trainer.train ...

On SIGTERM torchrun passes the signal to its workers, waits for them (up to
`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, which the launcher sets to the pod's grace period), and then
raises the signal as an exception out of its `main`, so the interpreter exits with 1: to the
Training Operator's `restartPolicy: ExitCode` a permanent failure. Here it ends with 128 + the
signal instead (143 for SIGTERM, :data:`trainer.exit_codes.TERMINATED_CHECKPOINTED`): retryable,
as the workers' own exit codes say (they stop at a step boundary and commit a checkpoint first).
It also prints its stacks on SIGUSR1 (:mod:`trainer.stacks`), as the ranks do. Everything else is
torchrun's own behaviour.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` (the command line when None); return the process's exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    from trainer.stacks import print_stacks_on_signals

    print_stacks_on_signals()
    try:
        torchrun(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
