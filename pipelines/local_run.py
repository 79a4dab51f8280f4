"""Run the training pipeline on this machine through `kfp.local` (no cluster).

Each step runs as a subprocess of this Python environment (KFP's SubprocessRunner); the
training step starts its replicas as local process groups with the Training Operator's
environment. Artifacts go to the configured store, or to a local directory by default.

A local run is a unit: it has a run id, its checkpoints live under
``<store or output dir>/runs/<run id>/checkpoints`` (unless `checkpoint.uri` is set), and
``runs/<run id>/run.json`` marks it finished; ``runs/<run id>/log-<start time>.txt`` is the full log of
each start of it (kfp.local's records and every step's output). Running again with the same id resumes it from
its latest complete checkpoint, or does nothing when it had finished. Every process of the run
carries a marker in its environment; a watchdog stops them all when the `kftrain` process
dies, however it dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from stat import S_ISREG
from typing import Any, TextIO

from trainer.config import Config, ConfigError, config_to_json, flatten_config, is_uri, same_setting, to_dict
from trainer.errors import KftrainError, redact
from trainer.runs import RUN_RECORD, STARTED_RECORD
from trainer.storage import (
    CorruptObject,
    ObjectNotFound,
    StoreError,
    identity_of,
    join_uri,
    parse_uri,
    place_of,
    read_json,
    same_place,
    under_setting,
)

DEFAULT_LOCAL_ROOT = "kftrain-outputs"
# Beside the run record, STARTED_RECORD is written at each start of a run: where the run keeps its
# checkpoints (its first start's), and the config and quality gates it was last started with.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class PipelineFailed(RuntimeError):
    """A step of the local run failed; its last lines, shown above, and the full log say why."""


class RunStopped(BaseException):
    """SIGTERM or SIGINT reached the `kftrain` process (a BaseException: nothing may swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def new_run_id() -> str:
    """A fresh run id: sortable by start time, unique by a random suffix."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def check_run_id(run_id: str) -> str:
    """`run_id` if usable as one folder name in a store, else ConfigError naming --run-id."""
    if not _RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise ConfigError(
            f"--run-id: must be 1-63 letters, digits, '.', '_' or '-', starting alphanumeric, got {run_id!r}"
        )
    return run_id


def run_root(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> str:
    """Where run `run_id` keeps its checkpoints and its run record."""
    base = cfg.store.uri or str(Path(local_root).expanduser().resolve())
    return join_uri(base, "runs", run_id)


def with_run_checkpoints(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> Config:
    """`cfg` with a run-scoped `checkpoint.uri` unless the user chose one, and the run id as the
    checkpoints' owner (:func:`check_owner` refuses another): rerunning the same run id then finds
    the same checkpoints and owns them (the pipeline's own output folders and KFP ids are new each time)."""
    prefix = cfg.checkpoint.uri or join_uri(run_root(cfg, run_id, local_root), "checkpoints")
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, uri=prefix, owner=run_id))


def check_owner(cfg: Config, run_id: str) -> None:
    """A local run owns its checkpoints as its run id: `checkpoint.owner` naming another identity
    is refused. It would make this run that one, free to continue and prune its checkpoints, which
    a config copied from a run's records (`training.json`, `model_card.json`) does in silence:
    they hold the owner the run had. `--run-id` is how a local run continues another start."""
    owner = cfg.checkpoint.owner
    if owner and owner != run_id:
        raise ConfigError(
            f"checkpoint.owner: {owner!r} is not this run's id ({run_id}): a local run owns its checkpoints as "
            f"its run id, and as {owner!r} it would continue and prune that run's; drop checkpoint.owner, and "
            f"checkpoint.uri with it if it is that run's (a config copied from a run's records holds both), or "
            f"continue that run with --run-id {owner}"
        )


def check_own_checkpoint(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> None:
    """A run continuing from a checkpoint of its own (`--run-id`) continues it with a config that
    can: refused before any step, as `checkpoint.resume_from` is (was: found in the train step,
    after data prep). Its checkpoints are where its first start put them (:data:`STARTED_RECORD`;
    a run that predates the record: its own prefix). A config that would not read them is refused:
    checkpoints or resuming off, or `checkpoint.uri` pointing elsewhere (was: silently trained from
    the beginning). A prefix the user chose is checked by its owner check and the trainer's."""
    from trainer.checkpoint_owner import latest_complete
    from trainer.checks import check_continues
    from trainer.pipeline_steps import store_for
    from trainer.storage import CHECK_BUDGET_S, check_deadline

    now = with_run_checkpoints(cfg, run_id, local_root).checkpoint.uri
    try:
        with check_deadline(CHECK_BUDGET_S):
            prefix = run_checkpoints(cfg, run_id, local_root)
            if cfg.checkpoint.uri and same_place(prefix, now):
                return  # the user's prefix, as at its start
            # Its own steps: a run that took its prefix over commits newer ones there as itself.
            latest = latest_complete(store_for(cfg, prefix), prefix, owner=run_id)
    except StoreError:
        return  # the pre-flight's store check says what is wrong
    if latest is None:
        return  # nothing to continue
    step, record = latest
    if not same_place(prefix, now):
        raise ConfigError(
            f"--run-id {run_id}: its checkpoint of step {step} is in {redact(prefix)}, but checkpoint.uri now "
            f"says {redact(now) if cfg.checkpoint.uri else '(unset: the run folder)'}, where the run would train "
            f"from the beginning: set checkpoint.uri: {redact(prefix)} to continue it, or start a new run "
            "(without --run-id)"
        )
    off = next((f"checkpoint.{k}" for k in ("enabled", "resume") if not getattr(cfg.checkpoint, k)), "")
    if off:
        raise ConfigError(
            f"--run-id {run_id}: {off} is false, so its checkpoint of step {step} would not be read and the run "
            f"would train from the beginning: set {off}: true to continue it, or start a new run (without --run-id)"
        )
    if not isinstance(record.get("config"), dict):
        return  # a record that does not say (the trainer's own check will)
    try:
        check_continues(cfg, record, "start a new run (without --run-id)")
    except KftrainError as exc:
        raise ConfigError(f"--run-id {run_id}: its checkpoint of step {step} ({prefix}): {exc}") from None


def run_checkpoints(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> str:
    """Where run `run_id` keeps its checkpoints: where its first start put them
    (:data:`STARTED_RECORD`), or its run folder's, where it is now, for a run whose record names
    none (its own) or that predates the record."""
    from trainer.pipeline_steps import store_for

    started = join_uri(run_root(cfg, run_id, local_root), STARTED_RECORD)
    try:
        prefix = read_json(store_for(cfg, started), started).get("checkpoint_uri")
    except (ObjectNotFound, CorruptObject, AttributeError):
        prefix = None
    return prefix if isinstance(prefix, str) and prefix else join_uri(run_root(cfg, run_id, local_root), "checkpoints")


def newest_checkpoint(
    cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT, strict: bool = False
) -> int | None:
    """The step of run `run_id`'s newest complete checkpoint (what `--run-id` continues from); None
    for none, or where the store cannot say within the check budget (`strict`: that raises, so a
    caller can tell "none" from "could not look")."""
    from trainer.checkpoint_owner import latest_complete
    from trainer.pipeline_steps import store_for
    from trainer.storage import CHECK_BUDGET_S, check_deadline

    try:
        with check_deadline(CHECK_BUDGET_S):
            prefix = run_checkpoints(cfg, run_id, local_root)
            latest = latest_complete(store_for(cfg, prefix), prefix, owner=run_id)
    except (StoreError, OSError, ValueError):
        if strict:
            raise
        return None
    return None if latest is None else latest[0]


def record_started(
    cfg: Config,
    run_id: str,
    local_root: str = DEFAULT_LOCAL_ROOT,
    given: Config | None = None,
    gates: dict[str, float] | None = None,
) -> None:
    """Note, at each start of run `run_id` (`cfg` is its effective config), where it keeps its
    checkpoints (its first start's: a later start with another `checkpoint.uri` is refused,
    :func:`check_own_checkpoint`), and the config (`given`, as the user gave it) and quality gates
    it was started with: what `--run-id` without `--config` continues with (:func:`started_settings`).
    A record that cannot be read is left as it is (its run keeps its own checkpoint folder)."""
    from trainer.pipeline_steps import store_for

    uri = join_uri(run_root(cfg, run_id, local_root), STARTED_RECORD)
    store = store_for(cfg, uri)
    try:
        record = read_json(store, uri)
    except ObjectNotFound:
        # A prefix the user chose, a local one as an absolute path: a later start from another
        # folder reads it where it is. The run folder's own: none, so that a moved or copied run
        # folder continues from the checkpoints it holds (:func:`run_checkpoints`).
        prefix = parse_uri(cfg.checkpoint.uri)
        chosen = bool((given or cfg).checkpoint.uri)
        record = {"checkpoint_uri": "" if not chosen else cfg.checkpoint.uri if prefix.is_remote else prefix.key}
    except CorruptObject:
        return
    if not isinstance(record, dict):
        return
    record.update(run_id=run_id, config=to_dict(given or cfg), gates=gates or {})
    store.put_bytes(uri, json.dumps(record).encode())


def started_settings(
    cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT
) -> tuple[str, dict | None, dict] | None:
    """Where run `run_id`'s start record is, and the config (None: the record is damaged or
    predates it) and quality gates it was last started with (:func:`record_started`); None for a
    run without that record. A store that fails raises :class:`StoreError` naming the setting."""
    uri = join_uri(run_root(cfg, run_id, local_root), STARTED_RECORD)
    try:
        record = _read_run_file(cfg, uri)
    except ObjectNotFound:
        return None
    except CorruptObject:
        return uri, None, {}
    config = record.get("config") if isinstance(record, dict) else None
    gates = record.get("gates") if isinstance(record, dict) else None
    return uri, config if isinstance(config, dict) else None, gates if isinstance(gates, dict) else {}


def claim_run_checkpoints(cfg: Config, field: str = "") -> None:
    """Claim the run's checkpoint prefix before any step starts: a prefix another run owns is
    refused now, naming that run, not after data prep (trainer.checkpoint.claim_prefix). A store
    error names `field`, the setting that chose the prefix (else the run's store)."""
    if not cfg.checkpoint.enabled:
        return
    from trainer.checkpoint_owner import CheckpointError, claim_prefix
    from trainer.pipeline_steps import continues, store_for

    uri = cfg.checkpoint.uri
    try:
        claim_prefix(
            store_for(cfg, uri), uri, cfg.checkpoint.owner, resume=cfg.checkpoint.resume, can_continue=continues(cfg)
        )
    except CheckpointError as exc:  # the config points at a prefix this run may not use
        raise ConfigError(str(exc)) from None
    except StoreError as exc:  # the first write under it: a file in place of a folder, say
        raise _where_runs_live(cfg, exc, field) from None
    except KftrainError as exc:  # a checkpoint there this config cannot continue
        raise ConfigError(f"checkpoint.uri {redact(uri)}: {exc}") from None


def run_log(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> tuple[str, Path]:
    """Where the full log of this start of run `run_id` goes (beside its run record), and the
    local file to write it to meanwhile: that very file, or a temporary one when the run's
    folder is in an object store (:func:`keep_log` uploads it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = run_root(cfg, run_id, local_root)
    uri = join_uri(root, f"log-{stamp}.txt")
    if not parse_uri(uri).is_remote:
        return uri, Path(parse_uri(uri).key)
    return uri, Path(tempfile.gettempdir()) / f"{_temporary_log_stem(root)}-{stamp}-{secrets.token_hex(4)}.log"


def _temporary_log_stem(root: str) -> str:
    """The start of the temporary log's name of the run whose folder is `root`: its id and a digest
    of where the folder is (one run id may name runs in two stores)."""
    import hashlib

    where = hashlib.sha256((place_of(root) or root).encode()).hexdigest()[:8]
    return f"kftrain-{root.rstrip('/').rsplit('/', 1)[-1]}-{where}"


def keep_left_logs(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> list[str]:
    """Upload the logs earlier starts of run `run_id` left in this machine's temporary folder (a
    start killed outright never uploads its own; the store may have refused one), each to its
    place beside the run record; return where they are now. Only while no other start of the
    run runs here (:func:`running_alone`): a running start's log is still being written. Only
    this user's own files, not links: the temporary folder is everyone's."""
    root = run_root(cfg, run_id, local_root)
    kept = []
    for path, stamp, st in _left_logs(root):
        if st.st_uid == os.getuid() and st.st_nlink == 1:  # a hard link to another file is someone else's doing
            uri = keep_log(cfg, join_uri(root, f"log-{stamp}.txt"), path)
            if uri != str(path):
                kept.append(uri)
    return kept


def logs_left_by_others(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> list[Path]:
    """The logs earlier starts of run `run_id` by other users left in this machine's temporary
    folder, which only they (or root) can read and upload (was: passed over in silence)."""
    return [path for path, _, st in _left_logs(run_root(cfg, run_id, local_root)) if st.st_uid != os.getuid()]


def _left_logs(root: str) -> Iterator[tuple[Path, str, os.stat_result]]:
    """(path, start time, lstat) of each regular file in the temporary folder named as a log of
    the store run at `root` (:func:`run_log`); none for a local run, whose log is in its folder."""
    if not parse_uri(root).is_remote:
        return
    name = re.compile(rf"{re.escape(_temporary_log_stem(root))}-(\d{{8}}-\d{{6}})-[0-9a-f]{{8}}\.log")
    for path in sorted(Path(tempfile.gettempdir()).iterdir()):
        if (found := name.fullmatch(path.name)) and S_ISREG((st := path.lstat()).st_mode):  # not a link
            yield path, found[1], st


def open_log(uri: str, path: Path) -> TextIO:
    """The full log's file at `path` (:func:`run_log`), open to append line by line; a store's log
    waits in the shared temporary folder until it is uploaded, readable by this user alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = 0o600 if parse_uri(uri).is_remote else 0o666  # less the umask, as open() makes files

    def opener(name: str, flags: int) -> int:
        return os.open(name, flags, mode)

    return open(path, "a", encoding="utf-8", buffering=1, opener=opener)  # noqa: SIM115 (the console closes it)


def keep_log(cfg: Config, uri: str, path: Path, keep_here: bool = False) -> str:
    """Put the log written at `path` at `uri` (see :func:`run_log`); return where it now is
    (`path` still, if the store refused it). With `keep_here` the file at `path` stays after the
    upload (more lines to come: a later call puts it again)."""
    if not parse_uri(uri).is_remote:
        return uri
    from trainer.pipeline_steps import store_for

    try:
        store_for(cfg, uri).put_file(uri, path)
    except (StoreError, OSError):
        return str(path)
    if not keep_here:
        path.unlink()
    return uri


def _finished_record(cfg: Config, uri: str) -> dict[str, Any] | None:
    """The run record at `uri` when it says the run finished, else None."""
    try:
        record = _read_run_file(cfg, uri)
    except ObjectNotFound:
        return None
    return record if isinstance(record, dict) and record.get("status") == "finished" else None


def has_finished(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> bool:
    """Whether run `run_id`'s record says it finished (its settings not compared: :func:`finished_run`)."""
    return _finished_record(cfg, join_uri(run_root(cfg, run_id, local_root), RUN_RECORD)) is not None


def finished_run(
    cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT, gates: dict[str, float] | None = None
) -> dict[str, Any] | None:
    """The summary of run `run_id` if it finished, else None; CorruptObject naming the record
    when it says finished without a summary of the form :func:`run_local` writes, ConfigError
    when it finished with another config or quality gate than `cfg` and `gates`
    (:func:`check_same_run`). Within the store check's time limit: an unreachable store fails as
    fast as the pre-flight would."""
    uri = join_uri(run_root(cfg, run_id, local_root), RUN_RECORD)
    record = _finished_record(cfg, uri)
    if record is None:
        return None
    summary = record.get("summary")
    if not is_summary(summary):
        raise CorruptObject(
            f"{uri} says run {run_id} finished but holds no summary of it (artifacts, metrics, exported, "
            "quality_gate): it is damaged; delete it to run the run again from its checkpoints"
        )
    check_same_run(record, cfg, gates or {}, run_id)
    return summary


def check_same_run(record: dict[str, Any], cfg: Config, gates: dict[str, float], run_id: str) -> None:
    """A finished run's summary stands for the config and quality gate it ran with: asked for
    again with others (another `max_steps`, task or `--min-accuracy`), ConfigError naming each
    difference, rather than that summary under the new settings (was: printed as if it were
    theirs). A record that predates these fields is not compared."""
    ran = record.get("config")
    changed: list[str] = []
    if isinstance(ran, dict):
        old, new = flatten_config(ran), flatten_config(to_dict(cfg))
        changed = [
            f"{k} {old.get(k)!r} (now {new.get(k)!r})"
            for k in sorted(old.keys() | new.keys())
            if not same_setting(k, old.get(k), new.get(k))
        ]
    ran_gates = record.get("gates")
    if isinstance(ran_gates, dict):
        changed += [
            f"--{k.replace('_', '-')} {ran_gates.get(k)!r} (now {v!r})"
            for k, v in gates.items()
            if ran_gates.get(k) != v
        ]
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ConfigError(
            f"--run-id {run_id}: that run finished with other settings: {redact(shown)}. Its results are for "
            "those: give the config and flags it ran with to see them again, or start a new run (without "
            f"--run-id; `checkpoint.resume_from: {run_id}` starts it from this run's last checkpoint where the "
            "new settings can continue it: a changed batch size or model cannot)"
        )


def is_summary(summary: Any) -> bool:
    """`summary` has the form of what :func:`run_local` returns (what the CLI prints of it)."""
    return (
        isinstance(summary, dict)
        and isinstance(summary.get("artifacts"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in summary["artifacts"].items())
        and isinstance(summary.get("metrics"), dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in summary["metrics"].values())
        and isinstance(summary.get("exported"), bool)
        and isinstance(summary.get("quality_gate"), str)
    )


def own_checkpoints_first(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> Config:
    """`cfg` without `checkpoint.resume_from` once run `run_id` has a complete checkpoint of its
    own: the run goes on from that (docs/checkpoints.md), so what it first resumed from need not
    exist any more (nor is it looked up again)."""
    if not (cfg.checkpoint.resume_from and cfg.checkpoint.enabled):
        return cfg
    from trainer.checkpoint_owner import latest_complete
    from trainer.pipeline_steps import store_for
    from trainer.storage import CHECK_BUDGET_S, check_deadline

    prefix = with_run_checkpoints(cfg, run_id, local_root).checkpoint.uri
    try:
        with check_deadline(CHECK_BUDGET_S):
            own = latest_complete(store_for(cfg, prefix), prefix, owner=run_id)
    except StoreError:
        return cfg  # the pre-flight's store check says what is wrong
    if own is None:
        return cfg
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, resume_from=""))


def run_started(cfg: Config, run_id: str, local_root: str = DEFAULT_LOCAL_ROOT) -> bool:
    """Whether run `run_id` left anything in its run folder (a log, its record) or, with
    checkpoints on, its checkpoint prefix (`checkpoint.uri` when set). A store that fails the
    request raises (:class:`StoreError` naming the setting); True when a local folder cannot be
    read (the run's own checks say why)."""
    from trainer.pipeline_steps import store_for
    from trainer.storage import CHECK_BUDGET_S, check_deadline

    # Each place with the setting that chose it: a checkpoint.uri of its own is another store.
    places = {run_root(cfg, run_id, local_root): ""}
    if cfg.checkpoint.enabled:  # off, nothing was written there, nor is its store used
        places.setdefault(
            with_run_checkpoints(cfg, run_id, local_root).checkpoint.uri, "checkpoint.uri" if cfg.checkpoint.uri else ""
        )
    try:
        with check_deadline(CHECK_BUDGET_S):
            for place, field in places.items():
                try:
                    if store_for(cfg, place).list(place):
                        return True
                except StoreError as exc:
                    raise _where_runs_live(cfg, exc, field) from None
            return False
    except (OSError, ValueError):
        return True


def _read_run_file(cfg: Config, uri: str) -> Any:
    """The JSON record at `uri` in a run's folder, within the store check's time limit (an
    unreachable store fails as fast as the pre-flight would). ObjectNotFound when it is not
    there; any other store failure, a damaged record (CorruptObject) included, names the setting
    that chose the store."""
    from trainer.pipeline_steps import store_for
    from trainer.storage import CHECK_BUDGET_S, check_deadline

    try:
        with check_deadline(CHECK_BUDGET_S):
            return read_json(store_for(cfg, uri), uri)
    except ObjectNotFound:
        raise
    except StoreError as exc:
        raise _where_runs_live(cfg, exc) from None


def _where_runs_live(cfg: Config, exc: StoreError, field: str = "") -> StoreError:
    """`exc`, from a run's first request to its store, naming the setting that chose the store
    (`field`, else `store.uri` or `--output-dir`). The first request reports: a probe that
    swallowed the failure left the user waiting out the store check's limit once more before
    the next request said the same."""
    return under_setting(field or ("store.uri" if cfg.store.uri else "--output-dir"), exc)


def record_finished(
    cfg: Config,
    run_id: str,
    summary: dict[str, Any],
    local_root: str = DEFAULT_LOCAL_ROOT,
    given: Config | None = None,
    gates: dict[str, float] | None = None,
) -> str:
    """Write the run record that marks run `run_id` finished (the last thing a run writes): its
    summary, and the config (`given`: as the user gave it) and quality `gates` it ran with."""
    from trainer.pipeline_steps import store_for

    uri = join_uri(run_root(cfg, run_id, local_root), RUN_RECORD)
    record = {"run_id": run_id, "status": "finished", "finished_unix_time": time.time(), "summary": summary}
    if given is not None:
        record |= {"config": to_dict(given), "gates": gates or {}}
    store_for(cfg, uri).put_bytes(uri, json.dumps(record, indent=2, sort_keys=True).encode())
    return uri


#: Whether this process is inside kfp.local's run of the pipeline, reading a step's output to the
#: end (see :func:`run_scope`): a stop there lets the step's last lines through.
_reading_steps = threading.Event()
#: Whether the run's last step has ended (see :func:`run_scope`): a stop then stops nothing.
_steps_over = threading.Event()


@contextlib.contextmanager
def _steps_read_to_the_end() -> Iterator[None]:
    _reading_steps.set()
    try:
        yield
    finally:
        # Every step's processes have ended, however the pipeline did (a step that failed too):
        # from here on a stop signal stops nothing, and the run reports how it ended.
        _steps_over.set()
        _reading_steps.clear()


#: What a stopped run still asks of its store (its log, where it stopped) gives up this many
#: seconds after the stop, in all.
STOPPED_STORE_BUDGET_S = 10.0


def nothing_left_to_stop(signum: int, frame: Any = None) -> None:
    """The stop signals' handler once the run's steps are over: a note, and the run goes on to
    record and report its end (every process of it has ended), its store's answers awaited
    :data:`STOPPED_STORE_BUDGET_S` at most from now (was: a hung store's full timeouts and retries
    for the log's upload, minutes, after Ctrl-C)."""
    from trainer.storage import shorten_deadline

    shorten_deadline(STOPPED_STORE_BUDGET_S, "the stop's")
    note = (
        f"\nkftrain: {signal.Signals(signum).name} once the run's steps have ended: nothing left to stop, the run "
        f"records and reports its end (its store's answers awaited {STOPPED_STORE_BUDGET_S:g}s at most)\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, note.encode())  # straight to the descriptor, as run_scope's banner


def stop_signals() -> tuple[int, ...]:
    """The signals that stop a local run cleanly: SIGTERM, SIGINT (Ctrl-C), and SIGHUP (its
    terminal or SSH session closed; was: the run died at once, no checkpoint of the step it was
    at, no resume command) unless ignored (`nohup`: the run is to outlive its terminal)."""
    hangup = () if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hangup)


@contextlib.contextmanager
def run_scope(
    run_id: str,
    grace_s: float = 10.0,
    on_stop: Callable[[int], None] = lambda signum: None,
    after: Any = None,
) -> Iterator[str]:
    """Make this process and everything it starts one stoppable unit.

    Tags the environment (inherited by every descendant) with a run marker, puts every temporary
    file of the run in one folder, starts the watchdog that stops every marked process and removes
    that folder if this process dies, and turns :func:`stop_signals` into :class:`RunStopped` after
    stopping the run's processes (`on_stop(signum)` is called first). Yields the marker.

    A signal while a pipeline step runs does not interrupt the reading of its output: the run's
    processes are stopped, the step's last lines (a rank's "stopped by SIGTERM, checkpoint
    committed") come through to the end, any process started after that is killed at once, and
    the block then ends in RunStopped whatever the pipeline raised (a pipeline that finished all
    the same was signalled after its last step: the run is done).

    Once kfp.local has returned from the steps (finished, or one failed), a stop signal stops
    nothing: the run records and reports its end as it would have (was: a signal while it read the
    outputs or wrote its record ended the finished run "stopped", with no record, and a failed one
    "stopped" instead of failed; one just after the block, the default action cut its summary and
    log short). `after` is what the stop signals are left with when the block ends (None: the
    handlers they had); a caller that only reports the run's end from then on passes
    :func:`nothing_left_to_stop`.
    """
    from trainer.launch.local import RUN_MARKER_ENV, marked_pids, run_marker, stop_marked, stopped_at_exit

    marker = run_marker(run_id)
    stopped: list[int] = []
    done = threading.Event()

    def keep_stopped() -> None:
        while not done.wait(0.1):
            for pid in marked_pids(marker, RUN_MARKER_ENV):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    signals = stop_signals()

    def on_signal(signum: int, frame: Any) -> None:
        if _steps_over.is_set():
            nothing_left_to_stop(signum)
            return
        for sig in signals:  # a second signal, of any kind, must not interrupt the cleanup
            signal.signal(sig, signal.SIG_IGN)
        # Straight to the descriptor: a buffered write here, while the code the signal interrupted
        # was writing to stderr (a step's FAILED line), raised "reentrant call" and stopped nothing.
        banner = f"\nkftrain: {signal.Signals(signum).name}: stopping every process of run {run_id}\n"
        with contextlib.suppress(OSError):
            os.write(2, banner.encode())
        on_stop(signum)
        stop_marked(marker, RUN_MARKER_ENV, grace_s)
        if not _reading_steps.is_set():
            raise RunStopped(signum)
        stopped.append(signum)
        threading.Thread(target=keep_stopped, name="kftrain-keep-stopped", daemon=True).start()

    previous: dict[int, Any] = {}
    tempdir_before = tempfile.tempdir
    _steps_over.clear()
    try:
        os.environ[RUN_MARKER_ENV] = marker
        # Every temporary file of the run in one folder, which goes with the run, SIGKILL included.
        scratch = tempfile.tempdir = tempfile.mkdtemp(prefix=f"kftrain-{run_id}-")
        previous = {sig: signal.signal(sig, on_signal) for sig in signals}
        with stopped_at_exit(marker, RUN_MARKER_ENV, grace_s, remove=scratch):  # nothing of the run outlives it
            try:
                yield marker
            except BaseException:
                if not stopped:
                    raise
                # What the pipeline made of its stopped step does not matter: the run was stopped.
                raise RunStopped(stopped[0]) from None
            finally:
                done.set()
            # A signal after the last step's processes had ended stopped nothing: the run finished.
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if after is None else after)
        _steps_over.clear()
        os.environ.pop(RUN_MARKER_ENV, None)
        if tempfile.tempdir != tempdir_before:
            shutil.rmtree(tempfile.tempdir, ignore_errors=True)  # gone already, unless the block never started
            tempfile.tempdir = tempdir_before


def preflight(cfg: Config, local_root: str = DEFAULT_LOCAL_ROOT) -> Config:
    """Fail before any step starts on whatever can be checked then
    (:func:`trainer.checks.check_before_steps`: the store and checkpoint prefixes,
    `checkpoint.resume_from`, a custom task, `data.source`, the base model, an `hf://` one
    fetched: the steps run here), and when the local output folder
    cannot be written. Return `cfg` with `checkpoint.resume_from` pinned to the checkpoint it
    names (a run id is one of the runs under the store, or under the local output folder)."""
    from trainer.checks import check_before_steps

    flag = "--output-dir" if local_root != DEFAULT_LOCAL_ROOT else f"--output-dir (default: {local_root})"
    if not cfg.store.uri:
        from trainer.storage import LocalStore

        try:
            LocalStore().check(str(Path(local_root).expanduser().resolve()))
        except StoreError as exc:
            raise ConfigError(f"{flag}: {exc}") from None  # the message names the folder
    root = cfg.store.uri or str(Path(local_root).expanduser().resolve())
    pinned = check_before_steps(cfg, root, hub=True, output_flag=flag)
    if cfg.checkpoint.resume_from:
        _check_source_run_ended(cfg, pinned, local_root)
    return pinned


def run_local(
    cfg: Config,
    local_root: str = DEFAULT_LOCAL_ROOT,
    min_accuracy: float = 0.9,
    max_perplexity: float = 0.0,
    run_id: str = "",
    on_start: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Run the whole pipeline as run `run_id` (new when empty); return the artifact URIs, the test
    metrics, the gate's verdict and the run id. `on_start` is called once the run passed its
    pre-flight checks and owns its checkpoints, before the first step.

    With ``cfg.store.uri`` set, every artifact goes there and KFP's own local bookkeeping lives
    in a temporary directory; otherwise KFP's pipeline root `local_root` is the store. A run id
    that already finished is not run again: its recorded summary comes back, with
    ``"already_finished": True``.
    """
    run_id = check_run_id(run_id or new_run_id())
    given, gates = cfg, {"min_accuracy": min_accuracy, "max_perplexity": max_perplexity}
    done = finished_run(cfg, run_id, local_root, gates)
    if done is not None:  # nothing runs, so nothing else is checked: not even what it resumed from
        return {**done, "already_finished": True}
    check_owner(cfg, run_id)
    cfg = preflight(own_checkpoints_first(cfg, run_id, local_root), local_root)
    check_own_checkpoint(cfg, run_id, local_root)
    chosen = "checkpoint.uri" if cfg.checkpoint.uri else ""
    cfg = with_run_checkpoints(cfg, run_id, local_root)
    claim_run_checkpoints(cfg, chosen)
    record_started(cfg, run_id, local_root, given, gates)
    on_start()
    summary = {**_run_pipeline(cfg, local_root, min_accuracy, max_perplexity), "run_id": run_id}
    record_finished(cfg, run_id, summary, local_root, given, gates)
    return summary


#: Where the runs' locks live: one folder of the machine whatever a process's TMPDIR (a run sets
#: its own for its steps), so that every start of a run sees the others'.
LOCK_FOLDER = "/tmp"
#: How a run lock's file name starts (a digest of the run's place follows).
LOCK_STEM = "kftrain-run-"


@contextlib.contextmanager
def running_alone(root: str, run_id: str) -> Iterator[None]:
    """Hold this machine's lock of the run at `root` inside the block; a second start of the same
    run meanwhile is refused (was: both trained into its one checkpoint prefix, each pruning the
    other's steps, and both failed). A file lock the system drops with the process, however it
    ends; the file goes with the block (a killed holder's stays, unlocked, until the next start of
    any run on this machine removes it). Per machine: a start on another machine sharing the store
    is not seen."""
    _remove_unheld_locks(_lock_folder())
    path = _lock_path(root)
    # The folder is everyone's and the name can be foreseen: never through a link another user
    # put there (O_NOFOLLOW; was: the start truncated and wrote whatever file it pointed at).
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    while True:
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | nofollow, 0o666)
            except PermissionError:  # another user's, in a sticky folder: locked all the same read-only
                fd = os.open(path, os.O_RDONLY | nofollow)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EISDIR):
                raise ConfigError(f"--run-id {run_id}: cannot open the run's lock {path} ({exc.strerror})") from None
            fd = -1
        st = os.fstat(fd) if fd >= 0 else None
        if st is not None and S_ISREG(st.st_mode) and st.st_nlink == 0:  # removed meanwhile (a holder left): again
            os.close(fd)
            continue
        if st is None or not S_ISREG(st.st_mode) or st.st_nlink != 1:  # a link, a folder, a hard link to a file
            if fd >= 0:
                os.close(fd)
            raise ConfigError(
                f"--run-id {run_id}: the run's lock {path} is not a plain file of its own (a link or a folder: "
                "another user's doing?): remove it (in a shared /tmp, only its owner or root can)"
            )
        try:
            _lock_within(fd, 1.0)
        except BlockingIOError:
            holder = _lock_holder(os.pread(fd, 200, 0).decode(errors="replace").strip())
            os.close(fd)
            raise ConfigError(
                f"--run-id {run_id}: the run is running already on this machine ({holder}): wait for it to end, "
                "or stop it (Ctrl-C in its terminal); two starts would train into its one checkpoint prefix"
            ) from None
        try:  # the file the lock is on is still the one at `path` (not one a holder removed as it left)
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        with contextlib.suppress(OSError):  # read-only: the holder is not said, the lock holds the same
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"process {os.getpid()}, started {time.strftime('%H:%M:%S')}".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while locked: a start that opened it meanwhile finds it gone, and makes another
        os.close(fd)


def _lock_folder() -> str:
    return LOCK_FOLDER if os.path.isdir(LOCK_FOLDER) else tempfile.gettempdir()


def _lock_path(root: str) -> str:
    """This machine's lock file of the run at `root`: one however the store is written (`st`,
    `./st/`, a link, a bind mount)."""
    import hashlib

    key = identity_of(root) or root
    return os.path.join(_lock_folder(), f"{LOCK_STEM}{hashlib.sha256(key.encode()).hexdigest()[:24]}.lock")


def running_here(root: str) -> str:
    """Who runs the run at `root` on this machine (its lock's holder, in words; any phase of it),
    or '' when no start of it does."""
    import fcntl

    try:
        fd = os.open(_lock_path(root), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return ""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _lock_holder(os.pread(fd, 200, 0).decode(errors="replace").strip()) or "another start"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return ""
    finally:
        os.close(fd)


#: A step folder inside a local run's folder: `<root>/runs/<run id>/checkpoints/step-N`.
_RUN_STEP_FOLDER = re.compile(r"(.*/runs/[^/]+)/checkpoints/step-\d+")


def _check_source_run_ended(cfg: Config, pinned: Config, local_root: str) -> None:
    """ConfigError when `checkpoint.resume_from` (`cfg`'s, as given; `pinned`, the step folder it
    names now) is a run that still runs on this machine: while it trains it deletes its older
    checkpoints as it commits new ones, so the pinned one could be gone before this run's training
    starts (was: a failure in the train step)."""
    value = cfg.checkpoint.resume_from
    if not is_uri(value):
        root = run_root(cfg, value.partition("/")[0], local_root)
    elif found := _RUN_STEP_FOLDER.fullmatch(pinned.checkpoint.resume_from.rstrip("/")):
        root = found.group(1)
    else:  # a checkpoint of no local run's folder: no lock says whether its run still trains
        return
    holder = running_here(root)
    if holder:
        raise ConfigError(
            f"checkpoint.resume_from {value!r}: that run is still running on this machine ({holder}), and while it "
            "trains it deletes its older checkpoints as it commits new ones (checkpoint.keep_last), so the one taken "
            "now could be gone before this run's training starts; start from it once it has finished, or stop it "
            "(it commits a checkpoint as it stops) and start from it then"
        )


def _lock_holder(said: str) -> str:
    """Who holds a run's lock, from what its file says (`process N, started T`): a start that
    could only open it read-only (another user's file) cannot say itself, and the file still
    names the process that wrote it, which may be gone."""
    m = re.match(r"process (\d+)\b", said)
    if m:
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:  # that start is gone: another holds the lock now
            return "another start, maybe another user's"
        except PermissionError:  # alive, another user's
            pass
        return said
    return said or "another process"


def _lock_within(fd: int, seconds: float) -> None:
    """Lock `fd` exclusively, trying for `seconds` (another start sweeping the unheld locks holds
    each for a moment), else BlockingIOError: a start holds it."""
    import fcntl

    end = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= end:
                raise
            time.sleep(0.05)


def _remove_unheld_locks(folder: str) -> None:
    """Remove the run locks in `folder` that no process holds, each while holding it, as a
    holder leaves its own: a start that opened one meanwhile finds it gone, and makes another.
    This user's own files only: others' cannot be opened for writing."""
    import fcntl

    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if not (entry.name.startswith(LOCK_STEM) and entry.name.endswith(".lock")):
                continue
            try:
                fd = os.open(entry.path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.path.samestat(os.fstat(fd), os.stat(entry.path, follow_symlinks=False)):
                    os.unlink(entry.path)
            except OSError:  # held (a running start's), or gone meanwhile
                pass
            finally:
                os.close(fd)


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """Environment variable `name` is `value` inside the block (for every process started in it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _run_pipeline(cfg: Config, local_root: str, min_accuracy: float, max_perplexity: float) -> dict[str, Any]:
    from kfp import local

    from components.params import DEFAULT_HF_TOKEN_SECRET
    from pipelines.training import training_pipeline
    from trainer.checks import CHECKED_CONFIG_ENV, checked_digest

    # kfp.local's notes that do not apply here: display names are UI-only, and the steps'
    # image (the project image) is this very Python environment.
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    with (
        tempfile.TemporaryDirectory(prefix="kftrain-kfp-") as tmp,
        # A short name: the ranks' DataLoader workers make Unix sockets two folders below it.
        tempfile.TemporaryDirectory(prefix="tmp-") as scratch,
        # Every process the run starts makes its temporary files there (removed after the run): each
        # kfp.local step writes its component's code to a `mktemp -d` folder, and torchrun a
        # `torchelastic_*` one, that nothing removes.
        _environ("TMPDIR", scratch),
    ):
        root = tmp if cfg.store.uri else str(Path(local_root).expanduser().resolve())
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
        # The config's own Secrets: the pipeline's defaults would contradict a config naming others.
        mounted = {"store_secret": cfg.kubernetes.store_secret}
        mounted["hf_token_secret"] = cfg.kubernetes.hf_token_secret or DEFAULT_HF_TOKEN_SECRET
        # The config the configure step makes of these, which the pre-flight checked: not again.
        checked = dataclasses.replace(cfg, kubernetes=dataclasses.replace(cfg.kubernetes, **mounted))
        try:
            with _steps_read_to_the_end(), _environ(CHECKED_CONFIG_ENV, checked_digest(checked)):
                task = training_pipeline(
                    config=config_to_json(cfg),
                    **mounted,
                    launcher="local",
                    min_accuracy=min_accuracy,
                    max_perplexity=max_perplexity,
                )
        except RuntimeError as exc:  # how kfp.local reports a failed task
            raise PipelineFailed(str(exc)) from None
        outputs = task.outputs
        artifacts = {name: outputs[name].uri for name in ("dataset", "model", "metrics", "report")}
        if cfg.plan.enabled:  # off, the plan step only says so
            artifacts["plan"] = outputs["plan"].uri
        metrics = {k: v for k, v in outputs["metrics"].metadata.items() if isinstance(v, int | float)}
        # Export sits behind the quality gate (dsl.If), so it is no pipeline output: read what
        # the export task of this very run recorded, if it ran.
        folder = kfp_run_folder(Path(root), artifacts.values())
        exported = _task_output(folder, "export", "exported")
        gate = _task_output(folder, "evaluate", "reason", parameter=True)
    if exported:
        artifacts["exported"] = exported
    return {"artifacts": artifacts, "metrics": metrics, "exported": bool(exported), "quality_gate": gate}


def kfp_run_folder(root: Path, output_uris: Iterable[str]) -> Path:
    """The folder kfp.local gave this pipeline run under its pipeline root `root`.

    kfp.local keeps task T of a run in ``<root>/<pipeline name>-<start time>/T/``, and several
    runs share `root` when it is ``--output-dir``: the run's folder is the one its own outputs
    (`output_uris`) are in. With ``store.uri`` its outputs live in the store, and `root` is a
    temporary folder of this run alone, holding its one run folder.
    """
    root = root.resolve()
    for uri in output_uris:
        path = Path(uri).resolve() if "://" not in uri else None
        if path is not None and path.is_relative_to(root) and path != root:
            return root / path.relative_to(root).parts[0]
    folders = [p for p in root.iterdir() if p.is_dir()]
    if len(folders) != 1:
        raise PipelineFailed(f"cannot tell this run's folder under {root}: it holds {len(folders)} run folders")
    return folders[0]


def _task_output(folder: Path, task: str, name: str, parameter: bool = False) -> str | None:
    """An output recorded by task `task` of the kfp.local run in `folder`; None when it did not run."""
    path = folder / task / "executor_output.json"
    if not path.is_file():
        return None
    out = json.loads(path.read_text())
    if parameter:
        return out.get("parameterValues", {}).get(name)
    artifacts = out.get("artifacts", {}).get(name, {}).get("artifacts", [])
    return artifacts[0]["uri"] if artifacts else None


def summary_json(summary: dict[str, Any]) -> str:
    """The run summary's file text (artifact URIs and final metrics): what `--summary` writes."""
    return json.dumps(summary, indent=2, sort_keys=True) + "\n"
