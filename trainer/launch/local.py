"""Replicas as local process groups, with the environment the cluster gives pods.

`spec.kind` chooses the contract: `pytorchjob` (and `auto`, which has no cluster to ask here)
emulates the Training Operator v1 (`replica_env`: a Master and Workers, the job done when the
Master is), `trainjob` emulates Kubeflow Trainer v2 (`replica_env_v2`: only `PET_*` in the
environment, nodes `node-0-<i>`, the job done when every node is, as JobSet's default success
policy has it).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from trainer import stacks
from trainer.launch.backend import JobCancelled, JobFailed, JobTimeout, failure_excerpt, print_line
from trainer.launch.spec import NODE, TRAINJOB, JobSpec, replica_env, replica_env_v2, reserved_env
from trainer.launch.trainjob import EXTRA_ENV as TRAINJOB_EXTRA_ENV
from trainer.procfs import parent_of, started_ticks
from trainer.stopping import STOPPED_BY_PEER
from trainer.torchrun import QUIET_AGENT_ENV

LOOPBACK = "127.0.0.1"
#: Every process of a local job inherits this variable. torchrun starts its workers in new
#: sessions, so neither a process group nor the parent chain (after the agent dies) finds them.
JOB_MARKER_ENV = "KFTRAIN_LOCAL_JOB"
#: Marks every process of one replica (`<job marker>/<replica key>`), as a container holds them: what
#: its first process (torchrun) left running when it died goes with it, its ranks in sessions of
#: their own included.
REPLICA_MARKER_ENV = "KFTRAIN_LOCAL_REPLICA"


#: Every process of a `kftrain run --local` (steps, replicas, torchrun workers) inherits this.
RUN_MARKER_ENV = "KFTRAIN_LOCAL_RUN"


def run_marker(run_id: str) -> str:
    """The :data:`RUN_MARKER_ENV` value of a `kftrain run --local`: its run id and a random tail
    (two starts of one run id are told apart)."""
    return f"{run_id}-{secrets.token_hex(4)}"


def local_run_id() -> str:
    """The run id of the `kftrain run --local` this process is part of ('' outside one): the id the
    user resumes and lists runs by, where KFP's own ids are kfp.local's."""
    marker = os.environ.get(RUN_MARKER_ENV, "")
    return marker.rsplit("-", 1)[0] if marker else ""


def marked_pids(marker: str, var: str = JOB_MARKER_ENV) -> list[int]:
    """Live processes whose environment carries `var=marker`, this process excepted (Linux /proc;
    elsewhere none are found and cancelling falls back to the replicas' process groups)."""
    if not os.path.isdir("/proc"):
        return []
    needle = b"\0" + f"{var}={marker}".encode() + b"\0"
    me = os.getpid()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if needle in b"\0" + f.read() + b"\0":
                    pids.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def _signal_all(groups: set[int], marker: str | None, var: str, sig: int = signal.SIGKILL) -> None:
    """`sig` to the process `groups`, then once each to the processes carrying `var=marker` that
    left them (torch starts each rank in a session of its own): a second SIGTERM reaches torchrun
    while it handles the first, and it prints a logging traceback."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    for pid in marked_pids(marker, var) if marker else []:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) not in groups:
                os.kill(pid, sig)


def stop_marked(marker: str, var: str, grace_s: float = 10.0) -> int:
    """SIGTERM every process carrying `var=marker`, SIGKILL those left after `grace_s`; return how
    many there were. Zombies (exited, not yet reaped) keep their pid but have no environment."""
    pids = marked_pids(marker, var)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while marked_pids(marker, var) and time.monotonic() < end:
        time.sleep(0.05)
    # Processes started meanwhile (a step spawning replicas) are caught here too.
    for _ in range(3):
        left = marked_pids(marker, var)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return len(pids)


def start_watchdog(marker: str, var: str = RUN_MARKER_ENV, grace_s: float = 10.0, remove: str = "") -> int:
    """Start a watchdog in its own session that stops every process carrying `var=marker` as
    soon as this process dies, however it dies (SIGKILL included), then removes the folder
    `remove` (when given). Return the write end of the pipe it watches: close it for a clean
    exit. Only this process holds it (not inheritable), so the pipe reaches EOF exactly when this
    process is gone."""
    read_end, write_end = os.pipe()
    env = {  # not one of them
        k: v for k, v in os.environ.items() if k not in (var, RUN_MARKER_ENV, JOB_MARKER_ENV, REPLICA_MARKER_ENV)
    }
    subprocess.Popen(
        [sys.executable, "-m", "trainer.launch.local", "watch", var, marker, str(grace_s), remove],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl-C or a kill of our process group does not reach it
        close_fds=True,
    )
    os.close(read_end)
    return write_end


@contextlib.contextmanager
def stopped_at_exit(marker: str, var: str, grace_s: float = 10.0, remove: str = "") -> Iterator[None]:
    """Every process carrying `var=marker` is stopped when the block ends, however it ends, and
    by a watchdog (:func:`start_watchdog`) when this process dies inside it, SIGKILL included;
    then the folder `remove` (when given: the processes' temporary files) goes too. Give the
    processes the block starts `var=marker` in their environment."""
    pipe = start_watchdog(marker, var, grace_s, remove)
    try:
        yield
    finally:
        stop_marked(marker, var, grace_s)
        if remove:
            shutil.rmtree(remove, ignore_errors=True)
        os.close(pipe)


def _watch(var: str, marker: str, grace_s: float, remove: str = "") -> int:
    """The watchdog: block until the pipe from the run's process closes, then stop the run and
    remove its temporary folder."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.read(0, 4096):
        pass
    n = stop_marked(marker, var, grace_s)
    if n:
        print(f"kftrain watchdog: the run's process ended; stopped {n} process(es) of it", file=sys.stderr)
    if remove:
        shutil.rmtree(remove, ignore_errors=True)
    return 0


#: kftrain's own top-level packages, which its steps and replicas import by name (`python -m`).
OWN_PACKAGES = ("trainer", "components", "pipelines")


#: The fewest open files a local job's processes get: torchrun's agents, their ranks and the
#: rendezvous each hold some (below it, `ulimit -n 14` say, the rendezvous waited silently until
#: `job.timeout_seconds`).
MIN_OPEN_FILES = 64


#: The least free space in the temporary folder for a local run to start: kfp.local writes each
#: step's code there before kftrain's own runs (full, every step failed with "printf: I/O error",
#: read as a bug in kftrain); the ranks stage checkpoints there too (a fuller disk is named then).
MIN_TEMP_FREE_BYTES = 16 << 20


def temporary_folder_problem() -> str:
    """Why the temporary folder (`$TMPDIR`) cannot take a local run's start, as a line naming the
    fix, or "": under :data:`MIN_TEMP_FREE_BYTES` free."""
    scratch = tempfile.gettempdir()
    try:
        free = shutil.disk_usage(scratch).free
    except OSError:
        return ""
    if free >= MIN_TEMP_FREE_BYTES:
        return ""
    return (
        f"the temporary folder {scratch} has {free / 2**20:.1f} MiB free, under the {MIN_TEMP_FREE_BYTES >> 20} MiB "
        "kftrain's local processes need to start (each step writes its code there, each rank stages its "
        "checkpoints there): free space, or point TMPDIR at a folder with room"
    )


def local_start_problem(folder: str = ".") -> str:
    """What keeps kftrain's local processes from starting right in `folder` (the current one), as
    a line naming the fix, or "": a package or module there named like one of kftrain's
    (:data:`OWN_PACKAGES`), which `python -m` would import in place of kftrain's in every step and
    replica (a project's own `trainer/` is common), or an open-file limit below
    :data:`MIN_OPEN_FILES` that cannot be raised (a soft limit below it is raised, up to the hard one)."""
    import resource

    import trainer

    own_root = os.path.dirname(os.path.dirname(os.path.realpath(trainer.__file__)))
    for name in OWN_PACKAGES if os.path.realpath(folder) != own_root else ():
        for path in (os.path.join(folder, name, "__init__.py"), os.path.join(folder, f"{name}.py")):
            if os.path.isfile(path):
                found = os.path.dirname(path) if path.endswith("__init__.py") else path
                if os.path.isfile(os.path.join(folder, "trainer", "launch", "local.py")):  # kftrain's source
                    what = f"another copy of kftrain's source ({found}) than the one installed at {own_root}"
                else:
                    what = f"{found}, named like kftrain's own package"
                return (
                    f"the current folder holds {what}: the processes kftrain starts here (its steps and replicas) "
                    "would import it in place of the installed kftrain; run kftrain from another folder"
                )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < MIN_OPEN_FILES:
        if hard == resource.RLIM_INFINITY or hard >= MIN_OPEN_FILES:
            # Inherited by what starts here; as many as a usual shell's (1024), where the hard limit allows.
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (1024 if hard == resource.RLIM_INFINITY else min(hard, 1024), hard)
            )
        else:
            return (
                f"this shell allows {hard} open files per process (`ulimit -Hn`), fewer than the {MIN_OPEN_FILES} "
                "kftrain's local processes need; run it where the hard limit is higher (an administrator, or a "
                "container's `nofile` limit, sets it)"
            )
    return ""


#: How a replica's failure says that its processes were stopped from outside after a checkpoint.
NOTHING_TO_FIX = "nothing to fix: resume it"
#: How long a job whose replica failed waits for its other replicas to end, before it names the
#: one most likely the cause (a peer fails its collective within moments of a lost rank).
FAILURE_SETTLE_S = 2.0


def how_it_ended(log_lines: list[str], returncode: int | None = None, oom_kills: int | None = None) -> str:
    """What torchrun's summary in a replica's log says ended its process (torchrun itself exits 1
    whatever did): `; its training process was killed by SIGKILL (...)` for a signal, a note that
    nothing needs fixing for a stop on SIGTERM with a checkpoint committed, else ''. Without a
    summary, the replica's own `returncode` 143 is that stop too (its torchrun agent was the one
    told to stop, as the kubelet tells a pod, and ended as its processes did). `oom_kills`: the
    out-of-memory killer's kills on the machine during the job (None: not known), which say who
    sent a SIGKILL."""
    from trainer import exit_codes
    from trainer.launch.failures import killed_by, root_cause_exit_code

    code = root_cause_exit_code(log_lines)
    if code is None and returncode == exit_codes.TERMINATED_CHECKPOINTED:
        return f"; its processes stopped on a stop signal after committing what they had ({NOTHING_TO_FIX})"
    if code is None and returncode is not None and returncode < 0:  # the replica's own process, by a signal
        return f"; it was killed by {killed_by(-returncode, oom_kills)}"
    if code == exit_codes.TERMINATED_CHECKPOINTED:
        return f"; its training process stopped on a SIGTERM after committing a checkpoint ({NOTHING_TO_FIX})"
    if code is None or code >= 0:
        return ""
    return f"; its training process was killed by {killed_by(-code, oom_kills)}"


def blame(log_lines: list[str], returncode: int | None) -> int:
    """How likely a failed replica is the job's root cause, from its log and exit code (lower:
    more likely): 0 a process of its own killed by a signal; 1 an error of its own, or a stop
    signal it received itself; 2 a stop it passed on from another rank; 3 a collective that failed
    because a peer was lost or hung. The first replica to end is often the casualty: a rank whose
    peer died or hung fails its collective first."""
    from trainer import exit_codes
    from trainer.launch.failures import root_cause_exit_code

    code = root_cause_exit_code(log_lines)  # torchrun's; a command without it exits with its process's own
    code = returncode if code is None else code
    if code is not None and code < 0:
        return 0
    if code == exit_codes.COLLECTIVE_TIMEOUT:
        return 3
    if any(STOPPED_BY_PEER in line for line in log_lines):
        return 2
    return 1


def run_captured(
    cmd: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: str | None = None
) -> tuple[int, str]:
    """Run `cmd` in a process group of its own, stdout and stderr together; return (exit code,
    output). The group is killed when it returns or raises, taking whatever the command left in
    it; past `timeout_s`, :class:`subprocess.TimeoutExpired` carries the output so far."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout_s, output=out) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, out


def _start_problem(command: list[str], exc: OSError) -> str:
    """Why `command` could not start, and what to do (:class:`OSError` of ``Popen``)."""
    program = command[0]
    if os.path.isdir(program):
        return f"its command {program!r} is a folder: name the program or script to run"
    script = program if os.path.isfile(program) else shutil.which(program)
    if isinstance(exc, FileNotFoundError) and script:
        with contextlib.suppress(OSError):
            with open(script, "rb") as f:
                first = f.readline(200)
            if first.startswith(b"#!") and first.rstrip(b"\n").endswith(b"\r"):
                return (
                    f"its command {program!r} ends its `#!` line with a Windows line end (\\r), so no interpreter of "
                    "that name exists: convert the file's line ends (`dos2unix`, `sed -i 's/\\r$//'`)"
                )
        return (
            f"its command {program!r} names, on its `#!` line, an interpreter this machine does not have: fix that "
            "line, or start the script with `python` or `sh`"
        )
    if isinstance(exc, FileNotFoundError):
        return (
            f"its command {program!r} is not on this machine (not a file, nor a command on PATH; locally, a leading "
            f"`python` is this interpreter, {sys.executable}): name a command this machine has, for torchrun "
            "`python -m torch.distributed.run`"
        )
    if isinstance(exc, PermissionError):
        return f"its command {program!r} may not be run ({exc.strerror}): make it executable, or start it with `python`"
    if exc.errno == errno.ENOEXEC:
        return (
            f"its command {program!r} is no program this machine runs ({exc.strerror}): a script needs its `#!` line, "
            "or start it with `python` or `sh`"
        )
    return f"its command {program!r} cannot be run: {exc.strerror or exc}"


def free_port() -> int:
    """A TCP port on loopback that stays free for the process that binds it next (a rendezvous
    store, a test's server): a port merely free now can go to any other process's `bind(0)` or
    outgoing connection before that process starts.

    The port is left in TIME_WAIT (one connection to it, closed from the accepting side first),
    so the kernel hands it to no other socket for a minute, while a listener that sets
    SO_REUSEADDR (torch's TCPStore, Python's HTTP servers) can still take it."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection((LOOPBACK, port)):
            accepted, _ = listener.accept()
            accepted.close()
    return port


@dataclass
class _Replica:
    key: str
    proc: subprocess.Popen
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=400))
    pump: threading.Thread | None = None


#: Shells a step's command runs through: the process that started a step is the first one above them.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "busybox"})


def starting_process() -> tuple[int, int] | None:
    """(pid, start time) of the process that started this one, through any shells between
    (kfp.local runs a step as `sh -c '... python -m kfp.dsl.executor_main'` below the user's
    script); None where that is init or /proc does not say."""
    pid = os.getppid()
    for _ in range(16):
        found = parent_of(pid)
        if found is None:
            return None
        if found[0] not in SHELLS:
            started = started_ticks(pid)
            return None if pid <= 1 or started is None else (pid, started)
        pid = found[1]
    return None


class LocalBackend:
    """Runs each replica's command as its own process group on this machine.

    `sink` receives every log line, already prefixed with its replica (``[master-0] ...``).
    A job's processes are stopped, and its temporary folder removed, however the process that
    runs this backend ends (a watchdog's work when it is killed outright), and with `stop_with`
    (:func:`starting_process`: a pipeline step's) also when that process ends: a kfp.local script
    stopped by a signal to it alone leaves its steps running, re-parented (was: the job ran on
    until its time limit, nobody watching).
    """

    def __init__(
        self,
        sink: Callable[[str], None] | None = None,
        grace_s: float = 30.0,
        python: str = sys.executable,
        stop_with: tuple[int, int] | None = None,
    ) -> None:
        self._sink = sink or print_line
        self._grace_s = grace_s
        self._python = python
        self._stop_with = stop_with
        self._jobs: dict[str, list[_Replica]] = {}
        self._markers: dict[str, str] = {}
        self._oom_kills_at_start: dict[str, int | None] = {}
        self._scratch: dict[str, str] = {}
        self._watchdogs: dict[str, int] = {}

    def _command(self, spec: JobSpec) -> list[str]:
        cmd = list(spec.command)
        if cmd[0] in ("python", "python3"):
            cmd[0] = self._python  # the image's `python` is this interpreter locally
        return cmd

    def submit(self, spec: JobSpec) -> None:
        if any(r.proc.poll() is None for r in self._jobs.get(spec.name, [])):
            return  # already running: re-attach, like a retried launcher on a cluster (one that ended starts anew)
        if spec.name in self._jobs:  # one that ended without a cancel (a failed wait's): its folder and watchdog go
            self.cancel(spec)
        from trainer.launch.failures import oom_kill_count

        port = free_port()
        self._oom_kills_at_start[spec.name] = oom_kill_count()
        marker = self._markers[spec.name] = f"{spec.name}-{secrets.token_hex(6)}"
        replicas: list[_Replica] = []
        self._jobs[spec.name] = replicas  # as they start: a start that fails half-way is cancelled whole
        v2 = spec.kind == TRAINJOB
        # A pod gets the operator's rendezvous variables alone: a shell's own (kftrain started
        # inside a torchrun or a pod, a PET_RDZV_BACKEND exported) would change how the job forms.
        inherited = {k: v for k, v in os.environ.items() if not reserved_env(k)}
        # The job's own temporary folder, as a pod has its own /tmp: removed when the job ends, with
        # what its processes leave there (torchrun's `torchelastic_*` folder, which it never
        # removes; a killed rank's checkpoint staging). A TMPDIR in the job's env is the user's.
        # A short name: the ranks' DataLoader workers make Unix sockets below it (training_data.worker_sockets_fit).
        scratch = self._scratch[spec.name] = tempfile.mkdtemp(prefix="job-")
        inherited["TMPDIR"] = scratch
        self._watchdogs[spec.name] = start_watchdog(marker, JOB_MARKER_ENV, 10.0, remove=scratch)
        for rank, (rtype, index) in enumerate(spec.replicas_by_rank(TRAINJOB if v2 else "pytorchjob")):
            if v2:
                env = {**inherited, **spec.env, **TRAINJOB_EXTRA_ENV, **replica_env_v2(spec, rank, LOOPBACK)}
                env["PET_MASTER_PORT"] = str(port)
            else:
                env = {**inherited, **spec.env, **replica_env(spec, rtype, index, master_addr=LOOPBACK)}
                env["MASTER_PORT"] = env["PET_MASTER_PORT"] = str(port)
            env[QUIET_AGENT_ENV] = "ERROR"  # the rendezvous is on loopback: its race's C++ trace is noise
            # Keys as the Kubernetes backend names replicas: `master-0` / `node-0-1` (the pod's hostname).
            key = f"{NODE}-0-{index}" if v2 else f"{rtype}-{index}"
            env[JOB_MARKER_ENV], env[REPLICA_MARKER_ENV] = marker, f"{marker}/{key}"
            command = self._command(spec)
            try:
                proc = subprocess.Popen(
                    command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    bufsize=1,
                    start_new_session=True,  # its own process group: cancel kills torchrun's children too
                )
            except OSError as exc:  # what a container would fail to start with
                raise JobFailed(
                    f"job {spec.name}: replica {key} could not start: {_start_problem(command, exc)}"
                ) from None
            rep = _Replica(key=key, proc=proc)
            rep.pump = threading.Thread(target=self._pump, args=(rep,), daemon=True)
            rep.pump.start()
            replicas.append(rep)

    def _pump(self, rep: _Replica) -> None:
        assert rep.proc.stdout is not None
        for line in rep.proc.stdout:
            line = line.rstrip("\n")
            rep.tail.append(line)
            self._sink(f"[{rep.key}] {line}")

    def wait(self, spec: JobSpec) -> None:
        replicas = self._jobs[spec.name]
        master = replicas[0]
        timeout_s = spec.timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            failed = [r for r in replicas if r.proc.poll() not in (None, 0)]
            if failed:
                raise JobFailed(self._failure(spec, replicas))
            if spec.kind == TRAINJOB:
                if all(r.proc.poll() == 0 for r in replicas):
                    break  # like JobSet's default success policy: every node completed
            elif master.proc.poll() == 0:
                break  # like the operator: with a Master, the job succeeds when the Master does
            if self._stop_with and started_ticks(self._stop_with[0]) != self._stop_with[1]:
                raise JobCancelled(
                    f"the process that started this step (pid {self._stop_with[0]}) has ended; job {spec.name} "
                    "cancelled"
                )
            if time.monotonic() > deadline:
                where = " (where each process waited: the stacks above)" if self.ask_for_stacks(spec) else ""
                raise JobTimeout(
                    f"job {spec.name} did not finish within {timeout_s:.0f}s ({spec.timeout_field}){where}; "
                    "cancelling it"
                )
            time.sleep(0.2)
        # Workers normally end with the Master; give stragglers a grace period, then stop them.
        end = time.monotonic() + self._grace_s
        while any(r.proc.poll() is None for r in replicas) and time.monotonic() < end:
            time.sleep(0.1)
        self.cancel(spec)
        for r in replicas:
            self._drain(r)

    @staticmethod
    def _drain(rep: _Replica) -> None:
        if rep.pump is not None:
            rep.pump.join(timeout=5)

    def _failure(self, spec: JobSpec, replicas: list[_Replica]) -> str:
        """The message of a job a replica of which failed: the replica most likely the cause
        (:func:`blame`), once the others have had a moment to end too, and the replicas still
        running when a collective failed (a hung one among them)."""

        def ended() -> list[_Replica]:
            return [r for r in replicas if r.proc.poll() is not None]

        def failed_and_gone() -> list[_Replica]:
            # A container ends with its first process, and what that left running goes with it (a
            # SIGKILLed torchrun's workers went on training, holding its log open): its group, and
            # the ranks torch starts in sessions of their own (was: training on, and committing
            # checkpoints, until the cancel).
            failed = [r for r in ended() if r.proc.returncode != 0]
            for r in failed:
                _signal_all({r.proc.pid}, f"{self._markers.get(spec.name)}/{r.key}", REPLICA_MARKER_ENV)
            return failed

        failed_and_gone()  # at once, not after the others' moment to end
        end = time.monotonic() + FAILURE_SETTLE_S
        while len(ended()) < len(replicas) and time.monotonic() < end:
            time.sleep(0.05)
        failed = failed_and_gone()
        for r in failed:
            self._drain(r)  # torchrun's summary, which says what ended the process, comes last
        rep = min(failed, key=lambda r: blame(list(r.tail), r.proc.returncode))
        running = [r.key for r in replicas if r.proc.poll() is None]
        hung = (
            f"; replica(s) {', '.join(running)} had not ended (a hung process, or one the failure had not reached)"
            if running and blame(list(rep.tail), rep.proc.returncode) == 3
            else ""
        )
        lines = failure_excerpt(list(rep.tail))
        tail = "\n".join(f"  [{rep.key}] {line}" for line in lines)
        ended_by = how_it_ended(list(rep.tail), rep.proc.returncode, self._oom_kills_since_start(spec))
        # A process killed before it printed anything (was: "Its last log lines:" and nothing after).
        said = f" Its last log lines:\n{tail}" if lines else " It printed no line."
        return (
            f"job {spec.name} failed: replica {rep.key} exited with code {rep.proc.returncode}{ended_by}{hung}.{said}"
        )

    def _oom_kills_since_start(self, spec: JobSpec) -> int | None:
        """The processes the out-of-memory killer killed on this machine since the job started (None:
        the kernel does not say): whether a replica's SIGKILL was the kernel's or someone's."""
        from trainer.launch.failures import oom_kill_count

        start, now = self._oom_kills_at_start.get(spec.name), oom_kill_count()
        return None if start is None or now is None else now - start

    def ask_for_stacks(self, spec: JobSpec, settle_s: float = 1.0) -> list[int]:
        """Have every process of the job that can (:mod:`trainer.stacks`: kftrain's ranks and
        torchrun agents) print its threads' stacks into the log, and wait `settle_s` for the lines;
        return the processes asked."""
        marker = self._markers.get(spec.name)
        asked = stacks.ask_for_stacks(sorted(marked_pids(marker))) if marker else []  # the agents carry it too
        if asked:
            time.sleep(settle_s)
        return asked

    def logs(self, spec: JobSpec, tail: int = 50) -> dict[str, list[str]]:
        return {r.key: list(r.tail)[-tail:] for r in self._jobs.get(spec.name, [])}

    def cancel(self, spec: JobSpec) -> None:
        """SIGTERM to every process of the job (as stopping its containers would), then, after a
        grace period, SIGKILL whatever is left; their last lines (a rank's "stopped by SIGTERM,
        checkpoint committed") are passed on before this returns."""
        replicas = self._jobs.get(spec.name, [])
        self.kill(spec, signal.SIGTERM)
        end = time.monotonic() + 10.0
        while self._alive(spec) and time.monotonic() < end:
            for r in replicas:
                r.proc.poll()  # reap the agents
            time.sleep(0.05)
        self.kill(spec)
        for r in replicas:
            self._drain(r)
        if spec.name in self._scratch:
            shutil.rmtree(self._scratch.pop(spec.name), ignore_errors=True)
        if spec.name in self._watchdogs:  # the job is over: its watchdog ends with nothing to do
            os.close(self._watchdogs.pop(spec.name))

    def kill(self, spec: JobSpec, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to every process of the job at once, as a node failure would."""
        marker = self._markers.get(spec.name)
        _signal_all({r.proc.pid for r in self._jobs.get(spec.name, [])}, marker, JOB_MARKER_ENV, sig)
        if sig == signal.SIGKILL:
            for r in self._jobs.get(spec.name, []):
                r.proc.wait()
            end = time.monotonic() + 5.0
            while self._alive(spec) and time.monotonic() < end:
                time.sleep(0.02)

    def _alive(self, spec: JobSpec) -> bool:
        marker = self._markers.get(spec.name)
        if marker and marked_pids(marker):
            return True
        return any(r.proc.poll() is None for r in self._jobs.get(spec.name, []))


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "watch":
        sys.exit(_watch(sys.argv[2], sys.argv[3], float(sys.argv[4]), *sys.argv[5:]))
    sys.exit("usage: python -m trainer.launch.local watch VAR MARKER GRACE_SECONDS [FOLDER]")
