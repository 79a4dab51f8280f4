"""torchrun (`torch.distributed.run`), ending with the status a stop signal deserves.

    python -m trainer.torchrun [torchrun options] -m trainer.train ...

On SIGTERM torchrun passes the signal to its workers, waits for them (up to
`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, which the launcher sets to the pod's grace period), and then
raises the signal as an exception out of its `main`, so the interpreter exits with 1: to the
Training Operator's `restartPolicy: ExitCode` a permanent failure. Here it ends with 128 + the
signal instead (143 for SIGTERM, :data:`trainer.exit_codes.TERMINATED_CHECKPOINTED`): retryable,
as the workers' own exit codes say (they stop at a step boundary and commit a checkpoint first).
It also prints its stacks on SIGUSR1 (:mod:`trainer.stacks`), as the ranks do.

One race of torchrun's is told in one line: after a successful job, the agent that serves the
rendezvous store may leave while another still reads the end of the exit barrier, which torchrun
logged as an error with a traceback and c10's C++ warning with twenty frames (in about a third of
the two-replica runs on a CPU), though every worker had finished and the job's result stands. The
agent's own C++ warnings are off for that (`TORCH_CPP_LOG_LEVEL=ERROR` in the agent alone, unless
set: its workers get the environment as it was). Everything else is torchrun's own behaviour.
"""

from __future__ import annotations

import logging
import os
import sys

#: torchrun's logger of the exit barrier (`torch.distributed.elastic.agent.server.api`).
AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"


class ExitBarrierNote(logging.Filter):
    """torchrun's "Error waiting on exit barrier" and its traceback as one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Error waiting on exit barrier"):
            exc = record.exc_info[1]
            first = str(exc).splitlines()[0] if str(exc) else ""
            record.msg = "exit barrier: another agent left first (%s: %s); this node's workers had finished"
            record.args = (type(exc).__name__, first)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` (the command line when None); return the process's exit status."""
    quiet = "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:  # read by c10 as torch loads; the workers torchrun starts get the environment as it was
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.run import main as torchrun
    finally:
        if quiet:
            del os.environ["TORCH_CPP_LOG_LEVEL"]

    from trainer.stacks import print_stacks_on_signals

    logging.getLogger(AGENT_LOGGER).addFilter(ExitBarrierNote())
    print_stacks_on_signals()
    try:
        torchrun(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
