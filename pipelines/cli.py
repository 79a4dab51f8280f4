"""The `kftrain` command line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import shlex
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from trainer.errors import KftrainError, redact, redact_url

if TYPE_CHECKING:
    from trainer.config import Config


def _cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.compile import compile_all

    with _writing("--output-dir"):
        paths = compile_all(args.output_dir)
    for path in paths:
        print(f"wrote {path}")
    return 0


def _resume_command(argv: list[str], run_id: str | None, drop: tuple[str, ...] = ()) -> str:
    """The command line that continues this run: the same arguments, less the flags `drop` names,
    with --run-id (without one when `run_id` is None: the same run started anew). A password in a
    URL among them is written `***`: put credentials in the environment, not on the command line."""
    import shlex

    dropped = ("--run-id", *drop)
    args, skip, path_next = [], False, False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in dropped:
            skip = True
            continue
        if a.startswith(tuple(f"{flag}=" for flag in dropped)):
            continue
        flag, eq, value = a.partition("=")
        if path_next:  # a path flag's value: the same place from another folder
            a, path_next = _absolute(a), False
        elif eq and flag in _PATH_FLAGS:
            a = f"{flag}={_absolute(value)}"
        path_next = a in _PATH_FLAGS
        args.append(a)
    return redact(shlex.join(["kftrain", *args, *(["--run-id", run_id] if run_id else [])]))


#: `kftrain run`'s flags that take a place on this machine (`--store` a local folder, too).
_PATH_FLAGS = ("--config", "--output-dir", "--summary", "--store")


def _absolute(value: str) -> str:
    """A local path made absolute; a URI (`s3://...`) as it is."""
    return value if "://" in value or not value else os.path.abspath(os.path.expanduser(value))


#: `--min-accuracy` when not given (a classification run's gate).
#: `kftrain run`'s exit status when the run finished but its model failed the quality gate (and
#: was not exported): a script's `kftrain run ... && deploy` stops there.
GATE_FAILED = 3


def _gate_flag(name: str) -> str:
    """The flag of quality gate `name` (`min_accuracy` -> `--min-accuracy`)."""
    return "--" + name.replace("_", "-")


def _check_summary_place(summary: str, root: str, run_id: str) -> None:
    """`--summary` names no folder the run makes on this machine (its output root, any folder above
    it, `runs` and the run's folder there) and nothing inside the run's folder: refused before any
    step (was: the whole run, then `Is a directory`, or a summary the run's own record replaced)."""
    from trainer.config import ConfigError
    from trainer.storage import place_of

    top = place_of(root)
    if top is None or "://" in top:  # an object store's: nothing of it on this machine
        return
    top, path = Path(top), Path(os.path.realpath(summary))
    own = top / "runs" / run_id
    if path == top or path in top.parents or path in (top / "runs", own):
        raise ConfigError(f"--summary {summary}: the run makes that folder (its outputs go under {top}); name a file")
    if own in path.parents:
        raise ConfigError(
            f"--summary {summary}: inside the run's own folder {own}, where it writes its record and log; "
            "name a file elsewhere"
        )


def _check_local_start() -> None:
    """ConfigError where kftrain's local processes cannot start right from here
    (:func:`trainer.launch.local.local_start_problem`)."""
    from trainer.config import ConfigError
    from trainer.launch.local import local_start_problem, temporary_folder_problem

    if problem := local_start_problem() or temporary_folder_problem():
        raise ConfigError(problem)


def _check_gates(args: argparse.Namespace, task: str) -> None:
    """Refuse a quality gate the built-in `task` never reports the metric of (it would be ignored);
    then give the gates not given their defaults."""
    from trainer.checks import GATE_DEFAULTS, gate_ignored
    from trainer.config import ConfigError

    for name in ("min_accuracy", "max_perplexity"):
        value = getattr(args, name)
        if problem := gate_ignored(name, value, task, _gate_flag):
            raise ConfigError(f"{_gate_flag(name)} {value:g}: {problem}")
    args.min_accuracy = GATE_DEFAULTS["min_accuracy"] if args.min_accuracy is None else args.min_accuracy
    args.max_perplexity = args.max_perplexity or 0.0


def _load_with_flags(
    path: str | None,
    flags: dict[str, tuple[str, Any]],
    check: Callable[[Config], None] | None = None,
    recorded: tuple[str, dict[str, Any]] | None = None,
) -> Config:
    """The config at `path` (or the `recorded` one: (where it was read, its tree)) with the flags
    given (`{field: (flag, value)}`, only those the user gave) set over it, and `check`ed; a
    refused value is named by its flag, which is what the user typed."""
    import json

    from trainer.config import ConfigError, load_config, parse_config

    overrides = {field: value for field, (_, value) in flags.items()}
    try:
        if recorded is None:
            cfg = load_config(path, overrides)
        else:
            cfg = parse_config(json.dumps(recorded[1]), overrides, origin=recorded[0])
        if check is not None:
            check(cfg)
        return cfg
    except ConfigError as exc:
        if (message := _named_by_flag(str(exc), flags)) is not None:
            raise ConfigError(message) from None
        raise


def _named_by_flag(message: str, flags: dict[str, tuple[str, Any]]) -> str | None:
    """`message` (an error that starts with a config field) led by the flag that gave that field,
    as that is what the user typed (`--store: store.uri: ...` for a store given with --store), or
    None when no flag gave it. A `--set` names its field once (`--set kubernetes.env.A: ...`); a
    section above the flag's field counts too (`--set job..replicas=2` is refused at `job.`)."""
    lead = message.split(":", 1)[0].rstrip(".")
    named = [(field, flag) for field, (flag, _) in flags.items() if re.match(rf"{re.escape(field)}\b", message)]
    under = [(field, flag) for field, (flag, _) in flags.items() if field.startswith(lead + ".")]
    if not (named or under):
        return None
    field, flag = (named or under)[0]
    if flag.startswith("--set ") and re.match(rf"{re.escape(field)}[:.\[]", message):
        return f"--set {message}"  # the field once: `--set job.replicas: ...`, `--set kubernetes.env.A: ...`
    return f"{flag}: {message}"


def _given(flags: dict[str, tuple[str, Any]]) -> dict[str, tuple[str, Any]]:
    """The flags of `flags` the user gave (argparse's None for one left out; a text flag given
    empty is refused by its type, :func:`_nonempty`)."""
    return {field: (flag, value) for field, (flag, value) in flags.items() if value is not None}


def _cmd_run(args: argparse.Namespace) -> int:
    from pipelines.local_run import DEFAULT_LOCAL_ROOT, check_run_id, new_run_id, run_root, running_alone
    from trainer.checks import check_writes_outside_inputs, with_absolute_paths
    from trainer.config import ConfigError

    if not args.local:
        print("kftrain run: only --local is supported; on a cluster use `kftrain submit`", file=sys.stderr)
        return 2
    _check_local_start()
    flags = _given({"store.uri": ("--store", args.store), "store.endpoint": ("--s3-endpoint", args.s3_endpoint)})
    cfg = _load_with_flags(args.config, flags)
    store = f"{'--store' if args.store else 'store.uri'} {redact_url(cfg.store.uri)}"
    if args.output_dir and cfg.store.uri:
        raise ConfigError(
            f"--output-dir {args.output_dir}: not used when a store is set ({store}: every artifact goes there); "
            "leave out one of them"
        )
    args.output_dir = args.output_dir or DEFAULT_LOCAL_ROOT
    run_id = check_run_id(new_run_id() if args.run_id is None else args.run_id)  # `--run-id ''`: refused
    if args.run_id:
        cfg = _as_started(cfg, args, run_id, flags)
    cfg = with_absolute_paths(cfg)  # what the run records names the same files from any folder
    _check_gates(args, cfg.task)
    if args.summary:
        _check_summary_place(args.summary, cfg.store.uri or args.output_dir, run_id)
        if not _a_stream(Path(args.summary)):
            check_writes_outside_inputs(cfg, {"--summary": args.summary})
    from trainer.checks import unused_endpoint

    if note := unused_endpoint(cfg):
        print(f"kftrain: warning: {note}", file=sys.stderr)
    # Before anything is written for it (its log): a second start of a running run is refused.
    try:
        with running_alone(run_root(cfg, run_id, args.output_dir), run_id):
            return _run_alone(args, cfg, run_id, store)
    except (KftrainError, ValueError) as exc:  # the pre-flight's, naming a field a flag gave: the flag
        if (message := _named_by_flag(str(exc), flags)) is not None:
            raise ConfigError(message) from None
        raise


def _run_alone(args: argparse.Namespace, cfg: Any, run_id: str, store: str) -> int:
    """`kftrain run --local`, once no other start of run `run_id` runs on this machine."""
    from pipelines.console import StepConsole, capturing
    from pipelines.local_run import (
        STOPPED_STORE_BUDGET_S,
        PipelineFailed,
        RunStopped,
        has_finished,
        keep_left_logs,
        keep_log,
        logs_left_by_others,
        newest_checkpoint,
        nothing_left_to_stop,
        open_log,
        run_checkpoints,
        run_local,
        run_log,
        run_scope,
        run_started,
    )
    from trainer.storage import shorten_deadline

    existed = bool(args.run_id) and run_started(cfg, run_id, args.output_dir)
    if args.run_id and not existed:
        where = store if cfg.store.uri else f"--output-dir {args.output_dir}"
        print(
            f"kftrain: no run {run_id} under {where} yet: it starts "
            + ("from checkpoint.resume_from" if cfg.checkpoint.resume_from else "from the beginning")
            + " (a run that wrote elsewhere "
            "continues with that --output-dir or --store; `kftrain runs --store ...` lists a store's runs)",
            file=sys.stderr,
        )
    # A continuation given a config with resume_from (its start record's is not this command's), of a
    # run that will train on: resume_from starts a run; its own checkpoints continue it (was: dropped unsaid).
    if existed and args.config and cfg.checkpoint.resume_from and cfg.checkpoint.enabled:
        own = None if has_finished(cfg, run_id, args.output_dir) else newest_checkpoint(cfg, run_id, args.output_dir)
        if own is not None:
            print(
                f"kftrain: note: checkpoint.resume_from {redact(cfg.checkpoint.resume_from)!r} is not read: run "
                f"{run_id} goes on from its own newest checkpoint, step {own} (resume_from starts a run only)",
                file=sys.stderr,
            )
    resume = _resume_command(args.argv, run_id)
    # A continuation's, even where the store lost the run's folder (was: its logs left here for good).
    for uri in keep_left_logs(cfg, run_id, args.output_dir) if args.run_id else ():
        print(
            f"kftrain: the full log an earlier start of run {run_id} left on this machine is now at {uri}",
            file=sys.stderr,
        )
    for path in logs_left_by_others(cfg, run_id, args.output_dir) if args.run_id else ():
        print(
            f"kftrain: note: {path} is the full log an earlier start of run {run_id} by another user left on this "
            "machine; only that user (or root) can read it: their next start of the run uploads it",
            file=sys.stderr,
        )
    log_uri, log_path = run_log(cfg, run_id, args.output_dir)

    console = StepConsole(lambda: open_log(log_uri, log_path), sys.stdout, sys.stderr, verbose=args.verbose)
    outcome: BaseException | None = None
    summary: dict[str, Any] | None = None
    started: list[bool] = []  # whether the run got past its pre-flight (and so has an id to continue)

    def on_start() -> None:
        started.append(True)
        console.say(f"kftrain: run {run_id} (stopped or killed, it continues with: {resume})")
        # Said, not silent: a run whose checkpoints were deleted (or never written) trains anew.
        own = existed and cfg.checkpoint.enabled and not cfg.checkpoint.resume_from
        try:
            none = own and newest_checkpoint(cfg, run_id, args.output_dir, strict=True) is None
        except (KftrainError, OSError, ValueError):  # could not look: the run's own checks say why
            none = False
        if none:
            console.say(
                f"kftrain: run {run_id} has no complete checkpoint in "
                f"{redact_url(run_checkpoints(cfg, run_id, args.output_dir))}: its training starts from step 0"
            )

    with _stop_handlers_kept():
        try:
            # Once the run's processes have ended, a stop signal stops nothing until this returns.
            with run_scope(run_id, on_stop=console.stopping, after=nothing_left_to_stop), capturing(console):
                summary = run_local(
                    cfg,
                    local_root=args.output_dir,
                    min_accuracy=args.min_accuracy,
                    max_perplexity=args.max_perplexity,
                    run_id=run_id,
                    # Once it passed the pre-flight: a refused run has nothing to continue.
                    on_start=on_start,
                )
        except (PipelineFailed, RunStopped) as exc:
            outcome = exc
            if isinstance(exc, RunStopped):
                # Whoever stopped it wants out: what the run still asks of its store (its log, where it
                # stopped) gives up within seconds, a hung store too (was: minutes of read timeouts
                # and retries); a log not uploaded stays on this machine for the next start. Until
                # _stop_handlers_kept ends.
                shorten_deadline(STOPPED_STORE_BUDGET_S, "the stop's")
        finally:  # a run stopped before its first step (bad config, unreachable store) wrote no log
            # An uploaded log stays here too, to end as the terminal does (below); then it goes.
            full_log = keep_log(cfg, log_uri, log_path, keep_here=True) if console.log is not None else ""
        try:
            with _logged_too(log_path if full_log else None):
                return _how_it_ended(
                    args, cfg, run_id, resume, console, outcome, summary, full_log, bool(started), existed
                )
        finally:
            # Uploaded (or in the run's local folder, where this does nothing): again, with the lines above.
            if full_log == log_uri and (kept := keep_log(cfg, log_uri, log_path)) != log_uri:
                print(
                    f"kftrain: the full log's last lines could not be uploaded to {redact_url(log_uri)} (the copy "
                    f"there ends before them): the whole log is at {kept}, which the run's next start uploads in its "
                    "place",
                    file=sys.stderr,
                )


@contextlib.contextmanager
def _stop_handlers_kept() -> Iterator[None]:
    """The stop signals' handlers as they were once this block ends: inside it the run sets its
    own, then, every process of the run having ended, one that only says so while its closing
    lines print and its log uploads (was: SIGTERM's default action cut the lines, and the log,
    short; SIGINT's KeyboardInterrupt said "interrupted" for a finished run)."""
    from pipelines.local_run import stop_signals
    from trainer.storage import deadline_kept

    before = {sig: signal.getsignal(sig) for sig in stop_signals()}
    try:
        with deadline_kept():  # and the store deadline a late signal's handler shortens
            yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


class _Tee:
    """A standard stream whose every write also goes, colour codes removed, to the file `log`."""

    def __init__(self, stream: Any, log: TextIO) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        from pipelines.console import plain

        with contextlib.suppress(OSError, ValueError):  # the log is a record: the terminal is what counts here
            self._log.write(plain(text))
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _logged_too(path: Path | None) -> Iterator[None]:
    """What the block prints (how the run ended: its error, artifacts, metrics, gate) also at the
    end of its full log at `path` (None: no log), which held only the steps' lines before."""
    try:
        log = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115 (closed below)
    except OSError:  # its folder removed meanwhile, say: the terminal's lines still count
        log = None
    if log is None:
        yield
        return
    with log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err


def _how_it_ended(
    args: argparse.Namespace,
    cfg: Any,
    run_id: str,
    resume: str,
    console: Any,
    outcome: BaseException | None,
    summary: dict[str, Any] | None,
    full_log: str,
    started: bool,
    existed: bool,
) -> int:
    """Say how the local run ended (stopped, failed, finished: its artifacts, metrics and gate);
    return the command's exit code."""
    from pipelines.console import plain
    from pipelines.local_run import PipelineFailed, RunStopped, summary_json

    see_log = f"; see full log: {full_log}" if full_log else ""
    if isinstance(outcome, PipelineFailed):
        from trainer.launch.local import NOTHING_TO_FIX

        # The last line says what to fix: the failed step's own error line, or where the bug is.
        # A rank stopped from outside after its checkpoint (a SIGTERM to it alone) has none.
        fix = "" if NOTHING_TO_FIX in (console.failure_line or "") else "after fixing the cause, "
        print(f"kftrain: run {run_id} did not finish; {fix}resume it: {resume}", file=sys.stderr)
        if full_log:
            print(f"kftrain: see full log: {full_log}", file=sys.stderr)
        if console.failure_line:
            print(f"kftrain: error: step {console.failed_step}: {console.failure_line}", file=sys.stderr)
        elif console.os_error:
            print(
                f"kftrain: error: step {console.failed_step}: {redact(console.os_error)}: a file in the way, a folder "
                "gone, a permission, a full disk or a path too long on this machine; fix that, then resume",
                file=sys.stderr,
            )
        elif console.resource_error:
            print(
                f"kftrain: error: step {console.failed_step}: {redact(console.resource_error)}: this machine ran out "
                "of memory, threads or open files, or a limit on them (`ulimit -v`, `-u`, `-n`, a container's memory) "
                "was reached; give the step more, or make the job smaller, then resume",
                file=sys.stderr,
            )
        elif console.failed_step:
            where = f"the traceback is in the full log: {full_log}" if full_log else "run again with --verbose"
            print(
                f"kftrain: error: step {console.failed_step} failed with an unexpected error (its last lines are "
                f"above; {where}); it is a bug in kftrain or in a custom task, please report it",
                file=sys.stderr,
            )
        else:
            print(f"kftrain: error: the pipeline failed: {redact(plain(str(outcome)))}", file=sys.stderr)
        return 1
    if isinstance(outcome, RunStopped):
        left = _stopped(cfg, args, run_id, started, existed)
        print(
            f"kftrain: run {run_id} stopped by {outcome}; {left}{see_log}. {_then(cfg, args, run_id, started)}",
            file=sys.stderr,
        )
        return 128 + outcome.signum
    unwritten = None
    if args.summary:  # before the terminal lines: a closed terminal must not lose it
        try:
            write_output("--summary", args.summary, summary_json(summary), *SUMMARY_FILE)
        except OutputError as exc:  # the run is done all the same: its lines below, then this
            unwritten = exc
    if summary.get("already_finished"):
        print(f"kftrain: run {run_id} had already finished; nothing to do. Its summary:")
    print("\nkftrain: run finished. Artifacts:")
    for name, uri in summary["artifacts"].items():
        # A finished run's summary is its record: a local artifact deleted since is said, not listed as there.
        gone = summary.get("already_finished") and "://" not in uri and not os.path.exists(uri)
        print(f"  {name:9s} {uri}{'  (deleted since: start a new run to make it again)' if gone else ''}")
    print("Metrics:")
    metrics = summary["metrics"]
    per_class = sorted(k for k in metrics if k.startswith("test_class_"))
    for name in sorted(metrics.keys() - set(per_class)):
        value = metrics[name]
        # Counts (test_rows, test_tokens) come back from KFP's metrics as floats: 360, not 360.0000.
        shown = f"{value:.0f}" if name.endswith(("_rows", "_tokens")) and float(value).is_integer() else f"{value:.4f}"
        print(f"  {name:20s} {shown}")
    if per_class:  # precision, recall and F1 of every class: the report's table, and the summary JSON
        print(f"  (and {len(per_class)} per-class measures: see the report)")
    verdict = "passed" if summary["exported"] else "FAILED: the model was not exported"
    print(f"Quality gate {verdict} ({summary['quality_gate']})")
    if args.summary and not unwritten:
        print(f"summary written to {args.summary}")
    if full_log:
        print(f"full log: {full_log}")
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()  # a file's buffer fails only now
        if isinstance(getattr(sys.stdout, "failed", None), OSError | ValueError) and not isinstance(
            sys.stdout.failed, BrokenPipeError
        ):  # where the lines above could not go (not a reader gone on purpose, `| head`): where they are
            print(f"kftrain: run {run_id} finished; its full log: {full_log}", file=sys.stderr)
    if unwritten:
        again = _resume_command(args.argv, run_id, drop=("--summary",))
        print(
            f"kftrain: error: {unwritten} (the run finished; its summary is kept with it: `{again} --summary PATH` "
            "writes it again)",
            file=sys.stderr,
        )
        return 1 if summary["exported"] else GATE_FAILED  # a failed gate's code stays what a script checks
    return 0 if summary["exported"] else GATE_FAILED


def _as_started(cfg: Config, args: argparse.Namespace, run_id: str, flags: dict[str, tuple[str, Any]]) -> Config:
    """`--run-id` continues the run with the config (when `--config` is left out) and quality
    gates (each flag left out) it was last started with (its start record), the flags given now
    set over them; a gate given now that differs is said. `cfg` for a run without that record.
    Before, the built-in defaults ran in its name: a run stopped before its first checkpoint
    trained the demo, and a gate left out went back to its default in silence."""
    from pipelines.local_run import run_root, run_started, started_settings
    from trainer.checks import GATE_DEFAULTS, gate_ignored
    from trainer.runs import STARTED_RECORD
    from trainer.storage import join_uri

    defaults = "the built-in defaults apply; give --config with the config it ran with"
    started = started_settings(cfg, run_id, args.output_dir)
    if started is None:
        # A run whose folder holds other things (its log, checkpoints) lost its start record.
        if args.config is None and run_started(cfg, run_id, args.output_dir):
            record = redact_url(join_uri(run_root(cfg, run_id, args.output_dir), STARTED_RECORD))
            print(
                f"kftrain: run {run_id}: no start record ({record}: deleted, or the run predates them): {defaults}",
                file=sys.stderr,
            )
        return cfg
    uri, config, gates = started
    if args.config is None and config is None:
        print(
            f"kftrain: run {run_id}: its start record ({redact_url(uri)}) holds no config (damaged, or written before "
            f"kftrain kept one): {defaults}",
            file=sys.stderr,
        )
    elif args.config is None:
        cfg = _load_with_flags(None, flags, recorded=(f"run {run_id}'s recorded config {redact_url(uri)}", config))
        print(
            f"kftrain: run {run_id}: with the config it was last started with ({redact_url(uri)}); "
            "--config gives another",
            file=sys.stderr,
        )
    for name in ("min_accuracy", "max_perplexity"):
        value, given, flag = gates.get(name), getattr(args, name), _gate_flag(name)
        # The recorded gates include the defaults: the one the task has no metric for stays unset.
        if not isinstance(value, int | float) or isinstance(value, bool) or gate_ignored(name, value, cfg.task):
            continue
        if given is None:
            setattr(args, name, value)
            if value != GATE_DEFAULTS[name]:
                print(f"kftrain: run {run_id}: {flag} {value:g}, as it was last started with", file=sys.stderr)
        elif given != value:
            print(f"kftrain: run {run_id}: {flag} {given:g} (it was last started with {value:g})", file=sys.stderr)
    return cfg


def _stopped(cfg, args: argparse.Namespace, run_id: str, started: bool, existed: bool) -> str:
    """What a stopped local run leaves: nothing before its pre-flight passed (what earlier starts
    left when it `existed`), else its newest committed checkpoint (none when checkpoints are off)."""
    from pipelines.local_run import newest_checkpoint

    if not started:
        earlier = " (what its earlier starts committed stays)" if existed else ""
        return f"it was stopped before this start began, so nothing of it ran{earlier}"
    if not cfg.checkpoint.enabled:
        return "every process of it has ended (checkpoint.enabled is off: no training step was saved)"
    from pipelines.console import plain
    from trainer.storage import StoreError

    try:
        step = newest_checkpoint(cfg, run_id, args.output_dir, strict=True)
    except (StoreError, OSError, ValueError) as exc:  # "none" only when the store said so
        kept = f"its store could not be read for its newest checkpoint: {redact(plain(str(exc)))}"
    else:
        kept = "no checkpoint committed yet" if step is None else f"its newest committed checkpoint is step {step}"
    return f"every process of it has ended ({kept})"


def _then(cfg, args: argparse.Namespace, run_id: str, started: bool) -> str:
    """What to run next after a stop: the same command (a run that never started, unless it was
    already a continued one), else the command that continues it."""
    if not started and args.run_id is None:
        return f"Start it again: {_resume_command(args.argv, None)}"
    if started and not cfg.checkpoint.enabled:
        return f"Continue it (its training starts over from step 0): {_resume_command(args.argv, run_id)}"
    return f"Resume it: {_resume_command(args.argv, run_id)}"


def _cmd_runs(args: argparse.Namespace) -> int:
    import json

    from trainer.config import ConfigError
    from trainer.runs import LOCAL_RUNS, list_runs, runs_as_json, runs_table, stores_under
    from trainer.storage import (
        StoreError,
        answer_within,
        endpoint_problem,
        file_uri_problem,
        join_uri,
        open_store,
        parse_uri,
    )

    root = args.store
    if problem := file_uri_problem(root):
        raise ConfigError(f"--store {root!r} {problem}")
    if args.s3_endpoint and (problem := endpoint_problem(args.s3_endpoint)):
        raise StoreError(f"--s3-endpoint {redact_url(args.s3_endpoint)!r} {problem}")
    try:
        if not parse_uri(root).is_remote:  # absolute: the checkpoints listed are what resume_from takes
            if args.s3_endpoint:
                raise ConfigError(
                    f"--s3-endpoint: --store {root} is a folder on this machine, which the endpoint is not for; "
                    "drop --s3-endpoint, or give --store the s3:// store it serves"
                )
            folder = parse_uri(root).key
            if not os.path.isdir(folder):
                what = "a file, not a folder" if os.path.exists(folder) else "no such folder"
                raise StoreError(f"--store {root}: {what}; pass --store with the store the runs wrote to")
            root = folder
        store = open_store(root, args.s3_endpoint or "")
        try:
            answer_within(store, join_uri(root, "runs"))  # a wrong endpoint fails in seconds
        except StoreError as exc:
            raise type(exc)(f"--store: {exc}") from None
        runs = list_runs(store, root)
    except ConfigError:
        raise  # a flag that does not go with --store, named
    except ValueError as exc:  # a malformed URI
        raise StoreError(f"--store: {exc}") from None
    except StoreError:
        raise  # named already (an object gone in the listing is an OSError too)
    except OSError as exc:  # a local folder the listing cannot read all of (`--store /`)
        raise StoreError(
            f"--store {root}: cannot read {exc.filename or root} ({exc.strerror or exc}); pass --store with the "
            "store the runs wrote to (the --store or --output-dir of `kftrain run`)"
        ) from None
    if args.json:
        print(json.dumps(runs_as_json(runs), indent=2))
    elif not runs:
        nested = stores_under(store, root)
        shown = ", ".join(nested[:5]) + (f", and {len(nested) - 5} more" if len(nested) > 5 else "")
        hint = f"; it holds stores with runs: pass one as --store: {shown}" if nested else ""
        parent, _, last = root.rstrip("/").rpartition("/")
        if not hint and last == LOCAL_RUNS and parent and list_runs(store, parent):
            hint = f"; the store is the folder that holds {LOCAL_RUNS}/: pass --store {parent}"
        print(f"no runs under {root}{hint}")
    else:
        print(runs_table(runs))
    return 0


def _cmd_job_manifest(args: argparse.Namespace) -> int:
    import yaml

    from trainer.config import ConfigError, dotted_fields, load_yaml
    from trainer.launch.job import check_cluster_locations, training_job
    from trainer.launch.jobkind import BY_NAME
    from trainer.launch.spec import require_object_store

    def overlaps(a: str, b: str) -> bool:  # one field, or a section and a field in it
        return a == b or a.startswith(b + ".") or b.startswith(a + ".")

    flags = _given({"job.kind": ("--kind", args.kind), "kubernetes.namespace": ("--namespace", args.namespace)})
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. kubernetes.backoff_limit=3")
        # As a YAML key twice or a repeated --param: the last would win without a word. A mapping
        # for a section sets its fields, each compared on its own.
        for field, item in dotted_fields(key, load_yaml(value, f"--set {key}")).items():
            if other := next((f"--set {k}" for k in overrides if overlaps(field, k)), None) or next(
                (flag for f, (flag, _) in flags.items() if overlaps(field, f)), None
            ):
                raise ConfigError(f"--set {key}: {field} is also set by {other}; give each field once")
            overrides[field] = item
    cfg = _load_with_flags(args.config, {**{k: (f"--set {k}", v) for k, v in overrides.items()}, **flags})
    if cfg.job.kind not in BY_NAME:  # `auto` is answered by a cluster's API discovery
        raise ConfigError(
            f"job.kind: {cfg.job.kind!r} is resolved by the cluster at run time; pass --kind pytorchjob or "
            "--kind trainjob to print one"
        )
    note = ""  # said once the job is known to be valid: before an error, it is noise
    if args.dataset_uri is None or args.model_uri is None:
        from trainer.storage import join_uri, parse_uri

        # A local store.uri is no place for pods (the check would blame a --dataset-uri not given).
        remote = bool(cfg.store.uri) and parse_uri(cfg.store.uri).is_remote
        base = cfg.store.uri if remote else "s3://kftrain"
        args.dataset_uri = args.dataset_uri or join_uri(base, "dataset")
        args.model_uri = args.model_uri or join_uri(base, "model")
        note = (
            f"kftrain: note: the job reads the dataset at {redact_url(args.dataset_uri)} and writes the model to "
            f"{redact_url(args.model_uri)}, under {'store.uri' if remote else 'a placeholder store'}; pass "
            "--dataset-uri and --model-uri for the job you will apply"
        )
    require_object_store({"--dataset-uri": args.dataset_uri, "--model-uri": args.model_uri})
    spec = training_job(cfg, args.name, args.dataset_uri, args.model_uri)
    check_cluster_locations(cfg)  # as `kftrain submit` checks them
    kind = BY_NAME[cfg.job.kind]
    manifest = kind.build(spec, cfg.kubernetes.namespace, None)
    kind.validate(manifest)
    if note:
        print(note, file=sys.stderr)
    sys.stdout.write(yaml.safe_dump(manifest, sort_keys=False, width=1000))
    return 0


def _cmd_job_status(args: argparse.Namespace) -> int:
    from trainer.launch.kubernetes import job_status

    print(job_status(args.name, args.namespace or "", args.kind))
    return 0


def _cmd_horovod_run(args: argparse.Namespace) -> int:
    from trainer.horovod.run import main as horovod_main

    if args.script is None:
        args.parser.error("the following arguments are required: script")
    # The script's arguments as typed after it (argparse would drop a `--` among them, which
    # `python script.py -- ...` and horovodrun pass on).
    # After the subcommand's own word: a script may be named `horovod-run` too.
    after = args.argv.index("horovod-run") + 1 if "horovod-run" in args.argv else 0
    rest = (
        args.argv[args.argv.index(args.script, after) + 1 :] if args.script in args.argv[after:] else args.script_args
    )
    return horovod_main([args.script, *rest])


#: Where `kftrain example-model` writes, and configs/finetune-tiny.yaml reads.
EXAMPLE_DIR = "kftrain-outputs/example"
#: Steps `kftrain plan --probe` runs when --probe-steps is left out, and the most it may run.
PROBE_STEPS = 5
MAX_PROBE_STEPS = 1000


def _cmd_example_model(args: argparse.Namespace) -> int:
    from trainer.example_model import write_example

    with _writing("example-model"):
        folder, chat = write_example(args.out_dir)
    print(f"a tiny Llama-shaped model (random weights, ChatML chat template): {folder}")
    print(f"chat data to fine-tune it on: {chat}")
    print("fine-tune it: kftrain run --local --config configs/finetune-tiny.yaml")
    if Path(args.out_dir).resolve() != Path(EXAMPLE_DIR).resolve():  # the config reads the default folder
        print(f"  (that config reads {EXAMPLE_DIR}/: in a copy of it, set model.init_from: {folder}")
        print(f"   and data.source: {chat})")
    return 0


def _prepared_dataset(cfg: Any, uri: str) -> dict[str, Any]:
    """The manifest of the prepared dataset `--dataset` names, for the task `cfg` trains;
    ConfigError naming the flag when there is none, or it was prepared for another task."""
    from trainer.config import ConfigError
    from trainer.pipeline_steps import store_for
    from trainer.shards import MANIFEST, DataError, dataset_format, read_manifest
    from trainer.storage import ObjectNotFound, StoreError

    if uri.rstrip("/").endswith(f"/{MANIFEST}") or uri.rstrip("/") == MANIFEST:
        folder = uri.rstrip("/")[: -len(MANIFEST)].rstrip("/") or "."
        raise ConfigError(f"--dataset {uri}: names the dataset's {MANIFEST}; pass its folder: --dataset {folder}")
    try:
        return read_manifest(store_for(cfg, uri), uri, dataset_format(cfg))
    except ConfigError:
        raise
    except ObjectNotFound:
        raise ConfigError(
            f"--dataset {uri}: no prepared dataset there (no manifest.json); pass the folder data prep wrote "
            "(the pipeline's dataset artifact)"
        ) from None
    except (ValueError, DataError, StoreError) as exc:  # a malformed URI, a manifest, the store's answer
        raise ConfigError(f"--dataset: {exc}") from None


def _cmd_plan(args: argparse.Namespace) -> int:
    import json

    from trainer.checks import check_plan_gpu, check_writes_outside_inputs
    from trainer.config import ConfigError
    from trainer.pipeline_steps import PlanRefused, plan_run, refuse_if_strict

    if args.probe_steps is not None and not args.probe:
        raise ConfigError("--probe-steps: given without --probe, which it is for; add --probe (or drop --probe-steps)")
    cfg = _load_with_flags(
        args.config,
        _given(
            {
                "plan.gpu": ("--gpu", args.gpu),
                "kubernetes.gpu_memory_gb": ("--gpu-memory", args.gpu_memory),
                "plan.nodes": ("--nodes", args.nodes),
                "plan.price_per_gpu_hour": ("--price", args.price),
                "plan.network_gbits": ("--network", args.network),
            }
        ),
        check_plan_gpu,
    )
    if args.output and not _a_stream(Path(args.output)):
        check_writes_outside_inputs(cfg, {"--output": args.output})
    manifest = _prepared_dataset(cfg, args.dataset) if args.dataset else None  # before a probe spends minutes
    probe = None
    if args.probe:
        from trainer.local_probe import probe_locally

        _check_local_start()
        steps = args.probe_steps or PROBE_STEPS
        print(f"kftrain: probing {steps} steps on {cfg.job.world_size} process(es)", file=sys.stderr)
        (probe,) = probe_locally(cfg, steps=steps, manifest=manifest)
    plan = plan_run(cfg, probe, manifest=manifest)
    text = plan.markdown()
    if args.output:
        write_output("--output", args.output, text, *PLAN_FILE)
    print(json.dumps(plan.to_dict(), indent=2, sort_keys=True) if args.json else text)
    strict = args.strict or cfg.plan.strict
    try:
        refuse_if_strict(cfg, plan, strict, switch="--strict" if args.strict else "plan.strict")
    except PlanRefused as exc:
        print(f"kftrain: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_submit(args: argparse.Namespace) -> int:
    import datetime
    import tempfile
    from pathlib import Path

    from pipelines.compile import compile_all
    from pipelines.submit import (
        SubmitError,
        ca_bundle,
        follow,
        kfp_errors,
        make_client,
        parse_params,
        submit,
        succeeded,
    )
    from trainer.config import load_yaml, read_config_file

    if args.timeout is not None and not args.wait:
        raise SubmitError("--timeout: limits how long --wait follows the run; add --wait, or leave out --timeout")
    ca = ca_bundle(args.ca_cert, args.host)
    pairs = list(args.param)
    if args.config is not None:  # `--config "$UNSET"` is refused as an unreadable file, not ignored
        if any(pair.partition("=")[0] == "config" for pair in pairs):
            raise SubmitError("--config and --param config= both give the run's config: give one of them")
        text = read_config_file(args.config)
        load_yaml(text, args.config)  # YAML's mistakes named by the file, as `run` names them
        pairs.append(f"config={text}")  # the text: the pods cannot read this file
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(args.package) if args.package else compile_all(tmp)[0]
        params = parse_params(pairs, package)  # SubmitError when --package is no compiled pipeline
        run_name = (
            args.run_name or f"{args.pipeline_name} {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S}"
        )
        with kfp_errors(args.host, ca):
            client = make_client(args.host, args.namespace, ca)
            result = submit(
                client,
                args.host,
                package,
                args.pipeline_name,
                args.experiment,
                run_name,
                params,
                namespace=args.namespace,
            )
    print(f"pipeline {args.pipeline_name} version {result.version_name}")
    print(f"run {result.run_id}: {result.run_url}", flush=True)
    if not args.wait:
        return 0
    try:
        follow(client, args.host, result, args.timeout or 24 * 3600, args.poll_seconds, log=_print_now)
    except KeyboardInterrupt:  # the run is KFP's: stopping to watch it does not stop it
        print(f"\nkftrain: stopped following; {result.left_running()}", file=sys.stderr)
        return 128 + signal.SIGINT
    if result.state == "TIMEOUT":
        print(f"run {result.state}: {result.error}")
    else:
        print(f"run finished: {result.state}" + (f" ({result.error})" if result.error else ""))
    return 0 if succeeded(result) else 1


def _print_now(line: str) -> None:
    print(line, flush=True)


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None


def _gate(name: str):
    """An argparse type for the quality gate's `name` (argparse names the flag when it raises)."""

    def parse(text: str) -> float:
        from trainer.checks import gate_problem

        value = _number(text)
        if problem := gate_problem(name, value):
            raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    """A positive number of seconds, at most the config's longest duration."""
    from trainer.config import MAX_SECONDS

    value = _number(text)
    if not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, at most {MAX_SECONDS} (366 days), got {text!r}"
        )
    return value


def _gpu_type(text: str) -> str:
    """A GPU type of the planner's table (`trainer.plan.hardware`), as the table names it."""
    from trainer.plan.hardware import GPUS, AmbiguousGpu, HardwareError, MigSlice, gpu_spec

    try:
        return gpu_spec(text).name
    except AmbiguousGpu as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except MigSlice as exc:
        example = f", e.g. --gpu-memory {exc.gib}" if exc.gib else ""
        raise argparse.ArgumentTypeError(f"{exc}; give its memory with --gpu-memory instead{example}") from None
    except HardwareError:
        raise argparse.ArgumentTypeError(
            f"unknown GPU type {text!r}; known: {', '.join(GPUS)} (another GPU: --gpu-memory GIB)"
        ) from None


def _gibibytes(text: str) -> float:
    """A positive amount of GPU memory in GiB (as nvidia-smi's MiB / 1024), at most
    kubernetes.gpu_memory_gb's bound."""
    from trainer.config import MAX_GPU_MEMORY_GB

    value = _number(text)
    if not sys.float_info.min <= value <= MAX_GPU_MEMORY_GB:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of GiB, at most {MAX_GPU_MEMORY_GB:g}, e.g. 80, got {text!r}"
        )
    return value


def _node_counts(text: str) -> list[int]:
    """`N[,M...]`: positive node counts."""
    from trainer.config import MAX_PLAN_NODES

    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and 1 <= int(p) <= MAX_PLAN_NODES for p in parts):
        raise argparse.ArgumentTypeError(
            f"must be positive whole numbers of nodes up to {MAX_PLAN_NODES} separated by commas, e.g. 1,2,4, "
            f"got {text!r}"
        )
    return [int(p) for p in parts]


def _price(text: str) -> float:
    """A price per GPU-hour, >= 0 (0: no cost, as `plan.price_per_gpu_hour: 0`)."""
    from trainer.config import MAX_GPU_HOUR_PRICE

    value = _number(text)
    if not 0 <= value <= MAX_GPU_HOUR_PRICE:
        raise argparse.ArgumentTypeError(
            f"must be a price >= 0 per GPU-hour, at most {MAX_GPU_HOUR_PRICE:g}, e.g. 3.5, got {text!r}"
        )
    return value


def _steps(text: str) -> int:
    """A positive number of steps, at most :data:`MAX_PROBE_STEPS`."""
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_PROBE_STEPS:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of steps from 1 to {MAX_PROBE_STEPS} (the probe times a few steps; the training "
            f"run is the long one), got {text!r}"
        )
    return int(text)


def _namespace(text: str) -> str:
    """A namespace's name, checked before any cluster is asked (which answered a bad one with a
    connection error, or a 404 naming neither)."""
    from trainer.k8s_formats import namespace_problem

    if problem := namespace_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def _object_name(what: str):
    """An argparse type for `what`, the name of a Kubernetes object, checked before any request."""

    def parse(text: str) -> str:
        from trainer.k8s_formats import object_name_problem

        if problem := object_name_problem(text, what):
            raise argparse.ArgumentTypeError(problem)
        return text

    return parse


def _nonempty(text: str) -> str:
    """Text that is not empty (an unset shell variable), which would be read as left out."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty; give a value, or leave the flag out for its default")
    return text


def _place(text: str) -> str:
    """A non-empty file's path or an object store's URI, to read; `~` is the home folder, quoted or not."""
    return os.path.expanduser(_nonempty(text))


def _path(text: str) -> str:
    """A non-empty path on this machine, a folder's or a file's (an empty one would mean the
    working directory, a URI a folder named like its scheme: `s3:`); `~` is the home folder,
    quoted or not."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty (an empty path would write into the working directory)")
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text):
        raise argparse.ArgumentTypeError(
            f"{redact_url(text)!r} is a URI: this takes a path on this machine (a plain one; an object store is "
            "--store, where the command has it)"
        )
    from trainer.k8s_formats import show
    from trainer.storage import hidden_character_problem, local_path_problem

    path = os.path.expanduser(text)
    if problem := hidden_character_problem(text) or local_path_problem(os.path.abspath(path)):
        raise argparse.ArgumentTypeError(f"{show(text, limit=200)} {problem}")
    try:
        os.path.realpath(path, strict=True)
    except OSError as exc:  # a path not made yet is fine; a loop of links names nothing
        if exc.errno == errno.ELOOP:
            raise argparse.ArgumentTypeError(
                f"{text}: its symbolic links form a loop, so it names no file or folder; fix the links, or name "
                "another path"
            ) from None
    return path


class _Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), whose usage errors are one line, as kftrain's
    other errors are (not argparse's usage block above it), and, as they repeat what was typed,
    never print a password a mistyped URL holds."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._argv = list(sys.argv[1:] if args is None else args)  # what an "unrecognized" error is read against
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        argv = getattr(self, "_argv", [])
        if message.startswith(prefix) and (joined := _cut_by_the_shell(argv, message[len(prefix) :])):
            message += f"; the shell split a value at its spaces: quote the whole of it, {joined}"
        else:
            message += f" (`{self._command(argv)} --help` lists the options)"
        self.exit(2, f"{self.prog}: error: {redact(message)}\n")

    def _command(self, argv: list[str]) -> str:
        """The (sub)command `argv` names below this parser, as its `prog`: argparse reports arguments
        no subcommand took from the top parser, whose own help would not list them."""
        parser: argparse.ArgumentParser = self
        for word in argv:
            actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if actions and word in actions[0].choices:
                parser = actions[0].choices[word]
        return parser.prog


def _cut_by_the_shell(argv: list[str], unrecognized: str) -> str:
    """`--set 'KEY=VALUE WITH SPACES'` when the arguments argparse did not recognise
    (`unrecognized`) begin right after a `--set` or `--param` of `argv`: the rest of its value,
    which the shell split off at a space; else "". A value that may be a credential is not shown
    (`'KEY=...'`): a passphrase's words are no token for redact() to find."""
    import yaml

    from trainer.credentials import credential_in

    for k in range(len(argv) - 2):
        option, value, after = argv[k : k + 3]
        if (
            option in ("--set", "--param")
            and "=" in value
            and not after.startswith("-")
            and unrecognized.startswith(after)
        ):
            end = next((m for m in range(k + 2, len(argv)) if argv[m].startswith("-")), len(argv))
            key, _, first = value.partition("=")
            whole = " ".join([first, *argv[k + 2 : end]])
            name = key.rsplit(".", 1)[-1]
            if {"env", "extra_env"} & set(key.split(".")) or any(
                credential_in(name, w) for w in [whole, *whole.split()]
            ):
                return f"{option} '{key}=...' (the whole value inside the quotes)"
            if option == "--set":  # a YAML value: its own quotes, which the shell took away, are not known here
                try:
                    yaml.safe_load(whole)
                except yaml.YAMLError:
                    return (
                        f"{option} '{key}=...' with the whole value inside the quotes (and any YAML quotes of "
                        'its own kept inside them: `{note: "a: b"}`)'
                    )
            return f"{option} {shlex.quote(f'{key}={whole}')}"
    return ""


def _api_url(text: str) -> str:
    """An http(s) URL without a user or password (which KFP's client would not use, and a log
    would print): the token travels in $KFP_TOKEN."""
    from urllib.parse import urlsplit

    from trainer.errors import has_userinfo

    if has_userinfo(text):
        raise argparse.ArgumentTypeError(
            "a user or password in the URL is not used (and would be printed): remove it and set $KFP_TOKEN"
        )
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
        raise argparse.ArgumentTypeError(f"must be a URL starting with http:// or https://, got {redact_url(text)!r}")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{redact(text)!r} holds a space or a control character")
    try:
        urlsplit(text).port  # noqa: B018 (it checks the port: a number from 0 to 65535)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{redact(text)!r}: the port must be a number from 1 to 65535 (an IPv6 host is written in brackets, "
            "http://[::1]:8888)"
        ) from None
    return text


def _output_file(what: str, earlier: Callable[[str], bool]) -> Callable[[str], str]:
    """The argparse type of a file the command writes: checked as the command starts, not after
    the run it records: not a folder, under a folder that exists or can be made, writable, and
    new or an earlier `what` (`earlier(text)`): a file of anything else (the config itself, say)
    is never overwritten."""

    def check(text: str) -> str:
        path = Path(_path(text))
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder; name a file")
        # The folders that are missing are made when the file is written (through a link to a
        # folder not made yet too: that folder is made). `_path` refused a loop of links; `seen`
        # ends the walk all the same.
        folder, seen = path.parent, set()
        while not folder.exists() and folder not in seen:
            seen.add(folder)
            folder = Path(os.path.realpath(folder)) if folder.is_symlink() else folder.parent
        if not folder.is_dir():
            raise argparse.ArgumentTypeError(f"{folder} is a file, so {text} cannot be made; name a file in a folder")
        target = path if path.exists() else folder
        if not os.access(target, os.W_OK):
            raise argparse.ArgumentTypeError(
                f"{target} cannot be written (permission denied); name a file you can write"
            )
        if _would_destroy(path, earlier):
            raise argparse.ArgumentTypeError(
                f"{text} exists and is not {what}: it would be overwritten; name a new file, or remove that one"
            )
        _FOUND_AT_START[str(path)] = _file_state(path)
        return str(path)

    return check


#: Each output file as the command found it (:func:`_file_state`), by the path it was named by.
_FOUND_AT_START: dict[str, tuple[int, ...] | None] = {}


def _file_state(path: Path) -> tuple[int, ...] | None:
    """Which file `path` is and when it last changed (None: no file there): whether another
    command made or rewrote it meanwhile."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


#: The most of an existing output file read to tell an earlier output from anything else.
_OUTPUT_READ_LIMIT = 64 << 20


def _own_stream(path: Path) -> Any:
    """``sys.stdout`` or ``sys.stderr`` where `path` is that stream's file (`/dev/stdout`, or its
    file by name), else None: written through a handle of its own, a file the shell opened for it
    (`> out`) got two write positions, and the lines printed later overwrote what that wrote."""
    try:
        st = path.stat()
    except OSError:
        return None
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a stream with no file (a test's)
            own = os.fstat(stream.fileno())
            if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
                return stream
    return None


def _a_stream(path: Path) -> bool:
    """A process's stream (`/dev/stdout`, `/dev/fd/1`, `/proc/self/fd/1`) or a device, pipe or
    socket: written to, never read, and never truncated, even where it is a file the shell
    redirected to (`/dev/shm/x` is a file like any other)."""
    if re.match(r"/dev/(std(in|out|err)|fd/)|/proc/[^/]+/fd/", os.path.abspath(path)):
        return True
    try:
        return not stat.S_ISREG(path.stat().st_mode) and not path.is_dir()
    except OSError:
        return False


def _holds_data(path: Path) -> bool:
    """A regular file with something in it: what an output could destroy (not a device, a pipe,
    `/dev/stdout`, which are written to, never read; not an empty file, `mktemp`'s)."""
    if _a_stream(path):
        return False
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def _would_destroy(path: Path, earlier: Callable[[str], bool]) -> bool:
    """Whether writing `path` would destroy data that is not an `earlier` output of the command."""
    return _holds_data(path) and not earlier(_text_of(path))


def _text_of(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(_OUTPUT_READ_LIMIT).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _is_summary(text: str) -> bool:
    import json

    from pipelines.local_run import is_summary

    try:
        return is_summary(json.loads(text))
    except ValueError:
        return False


def _is_plan(text: str) -> bool:
    return text.startswith("# Training plan\n")


#: What each output file is, and how an earlier one of it is told from a user's file.
SUMMARY_FILE = ("a run summary", _is_summary)
PLAN_FILE = ("a training plan", _is_plan)


def write_output(flag: str, path: str, text: str, what: str, earlier: Callable[[str], bool]) -> None:
    """Write `text` to the file `flag` names, checked as the command started (:func:`_output_file`)
    and again now, which may be hours later: a file made or rewritten there meanwhile is another
    command's (another run given the same `--summary`, say: was overwritten, though it was `what`),
    a file that is not `what` is no earlier output; either is kept, and OutputError says so. A new
    file is created exclusively, so one made between that check and the write is never replaced."""
    target = Path(path)
    with _writing(flag):
        if _a_stream(target):  # the log it may be redirected to keeps what the run printed
            own = _own_stream(target)
            if own is not None:  # through it: a second handle's writes and its own overwrote each other
                own.write(text)
                own.flush()
                return
            with open(target, "a", encoding="utf-8") as out:
                out.write(text)
            return
        Path(os.path.realpath(target.parent)).mkdir(parents=True, exist_ok=True)  # through a link too
        try:
            out = open(target, "x", encoding="utf-8")  # noqa: SIM115 (closed below)
        except FileExistsError:
            found = _FOUND_AT_START.get(path, _file_state(target))  # unchecked at the start: as it is now
            other = _would_destroy(target, earlier)
            if other or _file_state(target) != found:
                made = "made" if found is None else "rewritten"
                whose = f"and is not {what}" if other else "by another command (a second run given the same file, say)"
                raise OutputError(
                    f"{flag}: {path} was {made} while the command ran {whose}: it is kept, not overwritten; name a new "
                    "file"
                ) from None
            out = open(target, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        with out:
            out.write(text)


@contextlib.contextmanager
def _writing(flag: str) -> Iterator[None]:
    """An OS error writing what `flag` names, as an error naming the flag and what to do."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or "it"
        raise OutputError(f"{flag}: cannot write {where}: {exc.strerror or exc}; name a folder you can write") from None


class OutputError(KftrainError):
    """What a command writes on this machine cannot be written there."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    from trainer.checks import GATE_DEFAULTS

    parser = _Parser(prog="kftrain", description="Distributed PyTorch training on Kubeflow.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile every pipeline to YAML")
    p.add_argument("--output-dir", type=_path, default="compiled", help="folder for the YAML files (default: compiled)")
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("run", help="run the training pipeline")
    p.add_argument("--local", action="store_true", help="on this machine through kfp.local")
    p.add_argument("--config", type=os.path.expanduser, help="kftrain YAML config (default: built-in defaults)")
    p.add_argument("--store", type=_nonempty, help="artifact root, e.g. s3://bucket/prefix (overrides store.uri)")
    p.add_argument("--s3-endpoint", type=_nonempty, help="S3 endpoint URL (overrides store.endpoint)")
    p.add_argument(
        "--output-dir",
        type=_path,
        help="local artifact root, when no store is given (default: kftrain-outputs)",
    )
    p.add_argument(
        "--summary",
        type=_output_file(*SUMMARY_FILE),
        help="write artifact URIs and final metrics to this JSON file (new, or an earlier summary)",
    )
    p.add_argument(
        "--min-accuracy",
        type=_gate("min_accuracy"),
        help=f"quality gate for classification, in [0, 1] (default {GATE_DEFAULTS['min_accuracy']:g})",
    )
    p.add_argument(
        "--max-perplexity", type=_gate("max_perplexity"), help="quality gate for causal_lm (default 0: none)"
    )
    p.add_argument(
        "--run-id",
        default=None,
        help="continue run ID from its latest checkpoint (nothing to do if it finished); default: a new run",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show kfp.local's whole output (default: step lines, replica lines and the summary; all in the full log)",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser(
        "plan", help="predict memory per rank, step time, ETA, scaling and cost of a run before it starts"
    )
    p.add_argument("--config", type=os.path.expanduser, help="kftrain YAML config (default: built-in defaults)")
    p.add_argument("--gpu", type=_gpu_type, help="GPU type to plan for, e.g. H100 (overrides plan.gpu)")
    p.add_argument(
        "--gpu-memory",
        type=_gibibytes,
        metavar="GIB",
        help="memory of one GPU in GiB, as nvidia-smi's MiB / 1024 (overrides kubernetes.gpu_memory_gb)",
    )
    p.add_argument(
        "--nodes",
        type=_node_counts,
        metavar="N[,M...]",
        help="node counts to predict scaling at (overrides plan.nodes)",
    )
    p.add_argument(
        "--price",
        type=_price,
        metavar="PER_GPU_HOUR",
        help="price of a GPU-hour (overrides plan.price_per_gpu_hour; 0: no cost)",
    )
    p.add_argument(
        "--network",
        type=_number,
        metavar="GBITS",
        help="Gb/s between nodes per node, its NICs together, e.g. 3200 for 8x400 (overrides plan.network_gbits)",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="measure a short run here first (job.replicas x job.nproc_per_node local processes) and predict from it",
    )
    p.add_argument("--probe-steps", type=_steps, help=f"steps the probe runs (default: {PROBE_STEPS})")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when the run cannot fit or cannot finish within job.timeout_seconds (as plan.strict: true)",
    )
    p.add_argument(
        "--dataset",
        type=_place,
        metavar="URI",
        help="a prepared dataset (data prep's output): the model's real shape and the epoch's length (the ETA)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of Markdown")
    p.add_argument(
        "--output",
        type=_output_file(*PLAN_FILE),
        metavar="FILE.md",
        help="also write the Markdown plan to this file (new, or an earlier plan)",
    )
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("submit", help="upload the pipeline (a new version) to KFP and start a run")
    p.add_argument(
        "--host", required=True, type=_api_url, help="KFP API endpoint, e.g. http://localhost:8080 (token: $KFP_TOKEN)"
    )
    p.add_argument(
        "--ca-cert",
        type=_path,
        metavar="FILE.pem",
        help="CA bundle the KFP API's TLS certificate is checked against (default: $SSL_CERT_FILE, "
        "$REQUESTS_CA_BUNDLE, else the usual roots)",
    )
    p.add_argument("-n", "--namespace", type=_namespace, help="profile namespace (multi-user Kubeflow)")
    p.add_argument("--experiment", type=_nonempty, default="kftrain", help="experiment name (created if missing)")
    p.add_argument("--run-name", type=_nonempty, help="run name (default: pipeline name and UTC time)")
    p.add_argument("--pipeline-name", type=_nonempty, default="kftrain-training", help="pipeline to add the version to")
    p.add_argument("--package", type=_path, help="compiled pipeline YAML (default: compile training_pipeline now)")
    p.add_argument(
        "--config", type=os.path.expanduser, help="kftrain YAML config: its text is the run's `config` parameter"
    )
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter")
    p.add_argument("--wait", action="store_true", help="follow the run; exit 1 unless it succeeds")
    p.add_argument(
        "--timeout", type=_seconds, help="with --wait: how long to follow the run, in seconds (default: a day)"
    )
    p.add_argument("--poll-seconds", type=_seconds, default=10, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_submit)

    p = sub.add_parser(
        "horovod-run",
        help="run a Horovod PyTorch script unchanged, on torch.distributed",
        usage="%(prog)s [-h] script ...",
    )
    # `script` optional to argparse, required by the command: with a REMAINDER after it, argparse
    # would call the script's arguments required too.
    p.add_argument(
        "script", nargs="?", help="the script (under torchrun: python -m torch.distributed.run -m trainer.horovod.run)"
    )
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(func=_cmd_horovod_run, parser=p)

    p = sub.add_parser(
        "example-model",
        help="write a tiny pretrained-shaped Hugging Face model and chat data (the fine-tuning demo; no download)",
    )
    p.add_argument("out_dir", nargs="?", type=_path, default=EXAMPLE_DIR, help="where (default: %(default)s)")
    p.set_defaults(func=_cmd_example_model)

    p = sub.add_parser(
        "runs", help="list a store's runs: state, last step, latest checkpoint (what checkpoint.resume_from takes)"
    )
    p.add_argument(
        "--store",
        default="kftrain-outputs",
        help="store root: s3://bucket/prefix (store.uri of the runs) or a local folder (default: %(default)s)",
    )
    p.add_argument("--s3-endpoint", type=_nonempty, help="S3 endpoint URL of the store")
    p.add_argument("--json", action="store_true", help="print one JSON array, an object per run")
    p.set_defaults(func=_cmd_runs)

    job = sub.add_parser("job", help="inspect the training job").add_subparsers(dest="job_command", required=True)
    p = job.add_parser("manifest", help="print the validated PyTorchJob or TrainJob YAML (no cluster needed)")
    p.add_argument("--config", type=os.path.expanduser, help="kftrain YAML config (default: built-in defaults)")
    p.add_argument("--name", default="kftrain-job", help="job name (a DNS-1035 label)")
    p.add_argument("-n", "--namespace", type=_nonempty, help="namespace (default: kubernetes.namespace, else none)")
    p.add_argument(
        "--dataset-uri",
        type=_nonempty,
        help="prepared dataset URI (default: STORE/dataset, STORE the config's store.uri)",
    )
    p.add_argument("--model-uri", type=_nonempty, help="where rank 0 writes the model (default: STORE/model)")
    p.add_argument(
        "--kind", choices=("pytorchjob", "trainjob"), help="the job to print (default: job.kind of the config)"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field (YAML value)"
    )
    p.set_defaults(func=_cmd_job_manifest)
    p = job.add_parser("status", help="print a running job's state and the progress rank 0 reports to it")
    p.add_argument("name", type=_object_name("a job's name"), help="the job's name (the training step's log names it)")
    p.add_argument(
        "-n",
        "--namespace",
        type=_namespace,
        help="namespace (default: the kubeconfig context's, in a pod its own)",
    )
    p.add_argument(
        "--kind",
        choices=("auto", "pytorchjob", "trainjob"),
        default="auto",
        help="the job's kind (default: auto, TrainJob first)",
    )
    p.set_defaults(func=_cmd_job_status)
    return parser


def _stdout_closed() -> bool:
    """Whether standard output's reader went away (its pipe reports an error)."""
    import select

    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        return True
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError):
        return False


class _GuardedOutput:
    """A standard stream whose first failed write (the reader gone, a full disk, a hung-up
    terminal) is kept in `failed`. With `keep_going` (a run's, whose lines are a view of it; and
    stderr's, whose last words must not end the command either) later writes are dropped and the
    command goes on, :func:`main` saying what it means once it is done (was: a run stopped half-way
    by `> log` on a full disk, its outcome lost); else the failure is raised, as a command whose
    output is its product stops there (`kftrain submit --wait | head -1` stops following)."""

    def __init__(self, inner: Any, keep_going: bool = True) -> None:
        self.inner, self.keep_going = inner, keep_going
        self.failed: OSError | ValueError | None = None
        #: Whether the stream was closed as the command started (`>&-`): /dev/null since.
        self.closed_at_start = False

    def _guarded(self, call: Callable[[], Any]) -> None:
        if self.failed is not None:
            return
        try:
            call()
        except (OSError, ValueError) as exc:  # ValueError: a closed file
            self.failed = exc
            if not self.keep_going:
                raise

    def write(self, text: str) -> int:
        self._guarded(lambda: self.inner.write(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._guarded(self.inner.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _standard_streams_usable() -> set[str]:
    """A standard stream closed as the command starts (`>&-`) becomes /dev/null (Python left it
    None, a traceback at the first print; and the first file the command opened would have taken
    its descriptor, for every child process to write into); text the output's encoding has no
    character for is escaped, not an error (`PYTHONIOENCODING=ascii` and a path with an 'é').
    Returns the names of those that were closed."""
    closed = set()
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(name)
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False))  # noqa: SIM115
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")
    return closed


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kftrain` console script."""
    closed = _standard_streams_usable()
    out, err = _GuardedOutput(sys.stdout, keep_going=False), _GuardedOutput(sys.stderr)
    out.closed_at_start = "stdout" in closed
    sys.stdout, sys.stderr = out, err
    try:
        code, is_run = _main(sys.argv[1:] if argv is None else argv, out)
        with contextlib.suppress(OSError, ValueError):
            out.flush()  # what is still buffered for a pipe: a reader gone away shows here
        if out.failed is None:
            return code
        gone = isinstance(out.failed, BrokenPipeError) or _stdout_closed()
        if gone:  # the exit's own flush must not fail
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.inner.fileno())
        if is_run:  # a run's lines are a view of it: its outcome stands, all of it in its full log
            if not gone:
                print(
                    f"kftrain: warning: standard output could not be written ({_said(out.failed)}); the run's "
                    "lines are in its full log",
                    file=sys.stderr,
                )
            return code
        if code not in (0, STDOUT_FAILED):  # the command's own failure, said already
            return code
        if gone:  # the reader went away (`| head`): as a command killed by SIGPIPE, quietly
            return 128 + signal.SIGPIPE
        print(f"kftrain: error: cannot write standard output: {_said(out.failed)}", file=sys.stderr)
        return 1
    finally:
        sys.stdout, sys.stderr = out.inner, err.inner


def _prints_its_result(args: argparse.Namespace) -> bool:
    """Whether what the command is for is what it prints: a listing, a manifest, a job's status,
    a plan not written to `--output` (a run, a compile, a model or plan written to files are not)."""
    return args.func in (_cmd_runs, _cmd_job_manifest, _cmd_job_status) or (
        args.func is _cmd_plan and not getattr(args, "output", None)
    )


#: What :func:`_main` returns for a command that stopped because its standard output failed.
STDOUT_FAILED = -1


def _main(argv: list[str], out: _GuardedOutput) -> tuple[int, bool]:
    """The command's exit code (:data:`STDOUT_FAILED` when standard output, `out`, failed under
    it), and whether it is `kftrain run` (whose output is a view of the run, not its product)."""
    parser = build_parser()
    if argv[:1] == ["horovod-run"] and argv[1:2] and argv[1].startswith("-") and argv[1] not in ("-h", "--help", "--"):
        # horovodrun's flags (`-np 4`), or a script named `-x.py`, where the script goes: argparse
        # would call them unknown options; the runner says which.
        args = argparse.Namespace(func=_cmd_horovod_run, script=argv[1], script_args=argv[2:], parser=parser)
    else:
        args = parser.parse_args(argv)
    args.argv = list(argv)
    is_run = args.func is _cmd_run
    out.keep_going = is_run
    if out.closed_at_start and _prints_its_result(args):  # nothing done for nobody to see
        print("kftrain: error: standard output is closed (`>&-`): give the command a file or a pipe", file=sys.stderr)
        return 1, is_run
    from pipelines.console import warnings_on_stderr

    try:
        with warnings_on_stderr():
            return args.func(args), is_run
    # What the user can fix: one line, no traceback (an OSError names the local file it is about).
    except (KftrainError, ValueError, OSError) as exc:
        if exc is out.failed:
            return STDOUT_FAILED, is_run
        print(f"kftrain: error: {redact(_said(exc))}", file=sys.stderr)
        return 2, is_run
    except KeyboardInterrupt:  # Ctrl-C outside `run --local` (which stops its run itself)
        print("\nkftrain: interrupted; what it started on this machine has stopped", file=sys.stderr)
        return 128 + signal.SIGINT, is_run


def _said(exc: BaseException) -> str:
    """The error's line: an OS error as its file and what the system said of it, not Python's
    `[Errno 2] No such file or directory: '/proc/x'`."""
    if isinstance(exc, OSError) and not isinstance(exc, KftrainError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}" + (f" (-> {exc.filename2})" if exc.filename2 else "")
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
