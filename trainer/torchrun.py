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
logged as an error with a traceback (in about a third of the two-replica runs on a CPU), though
every worker had finished and the job's result stands; any other exit-barrier failure (a node
still running at the barrier's timeout) is torchrun's own lines. c10's C++ warning of the same
race (twenty frames) is the agent's C++ log, kept on a cluster, where the agent's failed
connections to the rendezvous are what a stuck multi-node start shows; the local backend, whose
rendezvous is on loopback, asks for the agent's C++ warnings off (:data:`QUIET_AGENT_ENV`;
`TORCH_CPP_LOG_LEVEL` set by the user wins). The workers get the environment as it was.
Everything else is torchrun's own behaviour.
"""

from __future__ import annotations

import logging
import os
import sys

#: torchrun's logger of the exit barrier (`torch.distributed.elastic.agent.server.api`).
AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"


#: Set by the local backend: the agent's own c10 log level (`ERROR`), for this process alone.
QUIET_AGENT_ENV = "KFTRAIN_AGENT_CPP_LOG_LEVEL"
#: What a connection a peer closed reads as, in the rendezvous store's and gloo's words: the
#: race of a store after a successful job here, a lost rank in a rank's collective
#: (trainer/distributed.py).
PEER_CLOSED = ("Connection was likely closed", "Connection closed by peer", "Connection reset", "Broken pipe")


class ExitBarrierNote(logging.Filter):
    """torchrun's "Error waiting on exit barrier" of a closed store connection, and its traceback,
    as one warning line (another failure of the barrier passes as torchrun logs it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if str(record.msg).startswith("Error waiting on exit barrier") and any(c in str(exc) for c in PEER_CLOSED):
            first = str(exc).splitlines()[0]
            record.msg = "exit barrier: another agent left first (%s: %s); this node's workers had finished"
            record.args = (type(exc).__name__, first)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def stop_once() -> None:
    """Make torchrun's stop-signal handler act on the first signal only. It raises out of
    whatever runs, and a second stop signal while torchrun stops its workers (a local run's stop
    and its launcher's cancel each send one; a kubelet and an impatient user too) raised inside
    its logging call: thirty lines of `--- Logging error ---` for a stop that was going well. The
    workers are stopped by the first, and SIGKILL still ends torchrun."""
    import signal

    import torch.distributed.elastic.multiprocessing.api as elastic

    first = elastic._terminate_process_handler

    def once(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        first(signum, frame)

    elastic._terminate_process_handler = once


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv` (the command line when None); return the process's exit status."""
    level = os.environ.pop(QUIET_AGENT_ENV, "")
    quiet = bool(level) and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:  # read by c10 as torch loads; the workers torchrun starts get the environment as it was
        os.environ["TORCH_CPP_LOG_LEVEL"] = level
    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.run import main as torchrun
    finally:
        if quiet:
            del os.environ["TORCH_CPP_LOG_LEVEL"]

    from trainer.stacks import print_stacks_on_signals

    logging.getLogger(AGENT_LOGGER).addFilter(ExitBarrierNote())
    print_stacks_on_signals()
    stop_once()
    try:
        torchrun(argv)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
