"""One small store interface over URIs: S3-compatible object storage or a local directory.

URIs are plain strings because an artifact location is a remote URI on a cluster and a local
path on a laptop. Accepted forms:

- ``s3://bucket/key`` and ``minio://bucket/key`` (KFP's name for its own MinIO/SeaweedFS store);
- ``file:///abs/path`` and plain paths (``/abs/path``, ``relative/path``).

Credentials never pass through here as arguments: the S3 store reads ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``) from the environment, which a Kubernetes Secret
fills on a cluster.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import logging
import os
import random
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit
from xml.etree import ElementTree

from trainer.errors import KftrainError, has_userinfo, redact_url
from trainer.progress import ProgressLine

REMOTE_SCHEMES = ("s3", "minio")
#: `minio://` names KFP's own artifact store; without a configured endpoint it is the in-cluster
#: one (SeaweedFS from KFP 2.16; `http://minio-service.kubeflow:9000` before).
KFP_STORE_ENDPOINT = "http://seaweedfs.kubeflow:9000"
#: Multipart part size: files above it upload in parallel-safe parts, smaller ones in one PUT.
PART_SIZE = 8 * 1024 * 1024
#: Parts of a multipart upload minio sends at once (its default), from threads of its own.
MINIO_PARALLEL_PARTS = 3
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_IPV4_RE = re.compile(r"\d+\.\d+\.\d+\.\d+")
#: S3 error codes that mean "try again later", not "no".
TRANSIENT_S3_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "Throttling",
        "RequestLimitExceeded",
        # AWS: another conditional write to the key is in flight; retried, it gets a definite answer.
        "ConditionalRequestConflict",
    }
)
#: The time limit of an up-front store check (`store.check`, the data source check): every
#: request and retry of it ends by then, whatever `store.*_timeout_seconds` and the retry budget say.
CHECK_BUDGET_S = 5.0
#: A local write in progress is a file named `.kftrain-<random>.tmp` beside its destination.
TEMP_PREFIX, TEMP_SUFFIX = ".kftrain-", ".tmp"
_deadline = threading.local()
log = logging.getLogger("kftrain.storage")
T = TypeVar("T")


class StoreError(KftrainError, RuntimeError):
    """The object store refused or failed an operation; the message says what to fix."""


class StoreSettingError(StoreError):
    """A setting of the store (its endpoint, its region: a config field or an environment
    variable, which the message names) is wrong, whatever URI it was to serve."""


def under_setting(setting: str, exc: StoreError) -> StoreError:
    """`exc` naming first the `setting` that chose its store (`setting: ...`); a
    :class:`StoreSettingError` as it is, as it names its own setting (was: "store.uri: $AWS_REGION: ...")."""
    return exc if isinstance(exc, StoreSettingError) else type(exc)(f"{setting}: {exc}")


class ObjectNotFound(StoreError, FileNotFoundError):
    """No object (or file) at the URI."""


class ObjectChanged(StoreError):
    """An object another writer replaced while it was read in parts: what was read mixes two
    versions of it."""


class CorruptObject(StoreError):
    """An object exists but its content does not parse (truncated, overwritten, not what it should be)."""


def decode_object(uri: str, raw: bytes, parse: Callable[[bytes], T], kind: str) -> T:
    """`parse(raw)`, or :class:`CorruptObject` naming `uri` and what it should have been.

    The one error path for store objects that fail to parse (manifests, shards, commit records).
    """
    try:
        return parse(raw)
    except Exception as exc:
        raise CorruptObject(
            f"{uri} is not a valid {kind} ({type(exc).__name__}: {exc}; {len(raw)} bytes): it is corrupt or "
            "truncated; delete it and rerun the step that writes it"
        ) from None


def read_json(store: ObjectStore, uri: str) -> Any:
    """A JSON object from the store; :class:`CorruptObject` naming `uri` when it does not parse."""
    return decode_object(uri, store.get_bytes(uri), json.loads, "JSON document")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How the S3 store rides out outages: per-request timeouts and one retry budget per operation."""

    budget_s: float = 120.0
    """Seconds one operation may spend retrying transient failures before it fails (`store.retry_budget_seconds`)."""
    connect_timeout_s: float = 10.0
    """Seconds a TCP connection may take before the attempt fails (`store.connect_timeout_seconds`)."""
    read_timeout_s: float = 60.0
    """Seconds without a byte from the store before the attempt fails (`store.read_timeout_seconds`)."""
    first_backoff_s: float = 0.5
    """Pause before the first retry; each later one doubles it, with jitter."""
    max_backoff_s: float = 10.0
    """Longest pause between two attempts."""


@dataclass(frozen=True, slots=True)
class Location:
    """A parsed URI: `scheme` is ``s3``, ``minio`` or ``file``; `bucket` is empty for ``file``."""

    scheme: str
    bucket: str
    key: str

    @property
    def is_remote(self) -> bool:
        """True for object-store URIs."""
        return self.scheme in REMOTE_SCHEMES


#: The longest file or folder name Linux file systems take (NAME_MAX), in bytes.
NAME_MAX_BYTES = 255
#: The longest local path a user may give: PATH_MAX (4096) less room for what kftrain adds below it.
LOCAL_PATH_MAX_BYTES = 3072
#: The longest object key S3 takes, in bytes.
KEY_MAX_BYTES = 1024


#: Invisible characters that make a name read otherwise than it is: the bidirectional overrides,
#: embeddings and isolates (`\u202e` shows `evil.txt` for `txt.live`), the zero-width space and word
#: joiner, a byte-order mark. The zero-width (non-)joiners and the soft hyphen are spelling in
#: Persian, Indic scripts and emoji sequences: they stay.
_MISLEADING = frozenset("\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff")


#: S3 error codes of something switched off on the store (Ceph RGW's, AWS's), and what to do.
_USER_OFF = (
    "the store's user or account of these credentials is suspended or disabled; ask the store's administrator "
    "to enable it, or set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY to another user's"
)
_SWITCHED_OFF = {
    "UserSuspended": _USER_OFF,
    "AccountProblem": _USER_OFF,
    "AllAccessDisabled": "access to this bucket or object is disabled on the store; ask the store's administrator",
}


def hidden_character_problem(text: str) -> str:
    """Why `text` does not name what it shows, or "": it holds a control character (a NUL, a line
    end, a terminal escape) or an invisible one that reads it otherwise (:data:`_MISLEADING`)."""
    for at, ch in enumerate(text):
        if ch in _MISLEADING or (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0):
            return f"holds the control or invisible character {ch!r} at position {at}: retype it"
    return ""


def local_path_problem(path: str) -> str:
    """Why the local `path` is one no file system takes, or "": a folder or file name longer than
    :data:`NAME_MAX_BYTES`, or a path longer than :data:`LOCAL_PATH_MAX_BYTES`."""
    size = len(os.fsencode(path))
    long_name = next((n for n in path.split("/") if len(os.fsencode(n)) > NAME_MAX_BYTES), None)
    if long_name is not None:
        return (
            f"has a folder or file name of {len(os.fsencode(long_name))} bytes ({long_name[:20]}...); a file system "
            f"takes at most {NAME_MAX_BYTES}"
        )
    if size > LOCAL_PATH_MAX_BYTES:
        return f"is {size} bytes long; a local path may be at most {LOCAL_PATH_MAX_BYTES}"
    return ""


def typed_location_problem(text: str) -> str:
    """Why `text`, a store URI or local path a user typed, cannot name the place meant, or "":
    :func:`hidden_character_problem`, :func:`local_path_problem`, or an S3 key longer than
    :data:`KEY_MAX_BYTES`. A malformed URI raises ValueError (:func:`parse_uri`)."""
    if problem := hidden_character_problem(text):
        return problem
    loc = parse_uri(text)
    if loc.scheme == "file":
        return local_path_problem(loc.key)
    size = len(loc.key.encode("utf-8", "surrogatepass"))
    if size > KEY_MAX_BYTES:
        return f"has a key of {size} bytes; S3 takes keys of at most {KEY_MAX_BYTES}"
    return ""


def file_uri_problem(uri: str) -> str:
    """Why a `file://` URI a user typed would not name the folder meant, or "": kftrain reads the
    path after `file://` as it is written (a listed file's name may hold any character, `?` and
    `#` too), so a percent-escape (`%20`, as `Path.as_uri()` writes a space) stays three
    characters."""
    if not uri.lower().startswith("file://"):
        return ""
    if re.search(r"%[0-9A-Fa-f]{2}", uri):
        return (
            "holds a percent-escape, which kftrain does not decode: write the path itself (a plain path, or "
            "file:// and the path with its spaces and characters as they are)"
        )
    return ""


def parse_uri(uri: str) -> Location:
    """Parse a store URI; raise ValueError naming the URI and the accepted forms when malformed.

    A plain path may start with `~` or `~user` (expanded, as a shell would: quoted in a YAML file
    or a flag, it would otherwise be a folder named `~`)."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"empty storage URI {uri!r}: use s3://bucket/key, minio://bucket/key or a path")
    if uri != uri.strip():  # a pasted space: a folder or key with it is never what was meant
        raise ValueError(f"storage URI {redact_url(uri)!r} starts or ends with whitespace: remove it")
    if "://" not in uri:  # a path: `~` is the user's home, as in a shell
        scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
        if scheme in (*REMOTE_SCHEMES, "file", "gs", "http", "https"):  # `s3:/b/k`: a slash short, not a folder
            form = {"file": "file:///absolute/path"}.get(scheme, f"{scheme}://bucket/key")
            fix = (
                f"write {form}"
                if scheme in (*REMOTE_SCHEMES, "file")
                else "and is no store kftrain reads; use s3://bucket/key, minio://bucket/key or a path"
            )
            raise ValueError(
                f"storage URI {redact_url(uri)!r} lacks the '//' after '{scheme}:' ({fix}; a local folder whose name "
                f"starts with '{scheme}:' is written ./{redact_url(uri)})"
            )
        if has_userinfo(uri):  # `user:password@bucket/key`: a URL without its scheme, not a folder
            raise ValueError(
                f"storage URI {redact_url(uri)!r} reads as a user and password before a host, with no scheme: "
                "a store URI is never where credentials go; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY and "
                "write s3://bucket/key (a local folder whose name holds a ':' before an '@' is written with ./ "
                "before it)"
            )
        return Location("file", "", os.path.abspath(os.path.expanduser(uri)))
    if any(c in uri for c in "\t\r\n"):  # urlsplit drops them: another key, maybe another object's
        raise ValueError(
            f"storage URI {redact_url(uri)!r} holds a tab or a line end, which URLs leave out; rename the object"
        )
    credentials = has_userinfo(uri)
    try:
        parts = urlsplit(uri)
    except ValueError as exc:  # `s3://[b/k`: read as an IPv6 host whose bracket is not closed
        raise ValueError(f"storage URI {redact_url(uri)!r} is not a URL ({exc}): use s3://bucket/key") from None
    scheme = parts.scheme.lower()
    # What follows `scheme://` as written: a file's name or an object's key may hold '?' and '#',
    # where urlsplit would end the path (was: a listed `a#b.txt` read as `a`, or refused).
    written = uri.split("://", 1)[1]
    uri = redact_url(uri)  # every message below shows the URI, never a password in it
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URI {uri!r} names a host; use file:///absolute/path")
        path = written[len(parts.netloc) :] or "/"
        if not path.startswith("/"):  # `file://?x`: no path at all, not one relative to here
            raise ValueError(f"file URI {uri!r} names no absolute path; use file:///absolute/path")
        return Location("file", "", os.path.abspath(path))
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(
            f"unsupported storage URI scheme {parts.scheme!r} in {uri!r}: "
            "use s3://bucket/key, minio://bucket/key, file:///path or a plain path"
        )
    if credentials:
        raise ValueError(
            f"storage URI {uri!r} holds a user or password: a store URI is never where credentials go (they "
            "would be printed and recorded); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the store "
            "Secret on a cluster) and write s3://bucket/key"
        )
    bucket, _, key = written.partition("/")  # the one '/' after the bucket; `s3://b//k` keeps its empty segment
    if ":" in bucket:
        raise ValueError(
            f"storage URI {uri!r}: {scheme}://{bucket}/... names a host, not a bucket; write {scheme}://bucket/key "
            "and the server in store.endpoint (--s3-endpoint)"
        )
    # S3's rules, which real servers (RGW, AWS) enforce: moto and some gateways accept more.
    if not _BUCKET_RE.fullmatch(bucket) or any(s in bucket for s in ("..", ".-", "-.")) or _IPV4_RE.fullmatch(bucket):
        raise ValueError(
            f"invalid bucket name {bucket!r} in {uri!r}: 3-63 characters of lower-case letters, "
            "digits, '.' and '-', starting and ending with a letter or digit, with no '..', '.-' or '-.' "
            "and not an IP address"
        )
    if "//" in key or key.startswith("/"):
        raise ValueError(f"storage URI {uri!r} has an empty path segment ('//')")
    if any(seg in (".", "..") for seg in key.split("/")):
        raise ValueError(f"storage URI {uri!r} has a '.' or '..' path segment: object keys are not paths; remove it")
    return Location(scheme, bucket, key)


def place_of(uri: str) -> str | None:
    """One spelling of the place a store URI or path names, for telling whether two settings name
    the same one (`st`, `./st/`, its absolute path and a link to it; `s3://b/x` and `s3://b/x/`):
    a local path absolute with its links resolved, an object-store URI without a trailing '/'.
    None where `uri` is no store URI (an `hf://` id, a malformed one)."""
    try:
        loc = parse_uri(uri)
    except ValueError:
        return None
    if loc.is_remote:
        key = loc.key.rstrip("/")
        return f"{loc.scheme}://{loc.bucket}" + (f"/{key}" if key else "")
    return os.path.realpath(loc.key)


def same_place(a: str, b: str) -> bool:
    """Whether store URIs or paths `a` and `b` name one place (:func:`place_of`; for two paths of
    this machine, :func:`file_place`: a folder bind-mounted at two paths is one place)."""
    if a == b:
        return True
    place = identity_of(a)
    return place is not None and place == identity_of(b)


def identity_of(uri: str) -> str | None:
    """One name of the place a store URI or path names however it is written or reached: an
    object store's :func:`place_of`, a path's :func:`file_place` (links and bind mounts alike);
    None where `uri` is no store URI."""
    place = place_of(uri)
    return place if place is None or "://" in place else file_place(place)


#: The mount table of this process (Linux): mount point, the folder of its filesystem mounted
#: there (`/` but for a bind mount), the filesystem's device number.
MOUNTINFO = "/proc/self/mountinfo"


def _mounts(table: str) -> list[tuple[str, str, str]]:
    """(mount point, folder of the filesystem mounted there, device) of each line of `table`,
    in its order; none where it cannot be read."""

    def plain(field: str) -> str:  # the table writes a space as \040, a tab \011, a '\' \134
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)

    try:
        with open(table, encoding="utf-8", errors="surrogateescape") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    return [(plain(r[4]), plain(r[3]), r[2]) for r in rows if len(r) > 4]


def file_place(path: str, table: str = MOUNTINFO) -> str:
    """One name of the place a path of this machine is, whichever mount it is reached through:
    the filesystem's device and the path within that filesystem (`8:1:/srv/out/runs/r`). A folder
    bind-mounted at a second path (`mount --bind`, or one host folder in a container at two
    paths) has two real paths and one file place; the folder need not exist. Where the mount
    table cannot be read, the real path."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    for point, root, device in _mounts(table):
        # The table lists mounts in the order they were made: of those over `real`, the last is
        # the one reached, whether deeper than the others or over a folder above them (hiding them).
        if real == point or real.startswith(point.rstrip("/") + "/"):
            best = (point, root, device)
    if best is None:
        return real
    point, root, device = best
    inside = os.path.normpath(os.path.join(root, os.path.relpath(real, point)))
    return f"{device}:{inside}"


def join_uri(base: str, *parts: str) -> str:
    """Append path segments to a store URI or path."""
    out = base.rstrip("/")
    for p in parts:
        p = p.strip("/")
        if p:
            out = f"{out}/{p}"
    return out


def has_suffix(uri: str, *suffixes: str) -> bool:
    """Whether the last segment of `uri` ends with one of `suffixes`, compared case-blind
    (`CORPUS.JSONL` is JSON Lines): every dispatch on a file's kind goes through here."""
    name = uri.rstrip("/").rsplit("/", 1)[-1].lower()
    return name.endswith(tuple(s.lower() for s in suffixes))


class ObjectStore(Protocol):
    """What kftrain needs from storage. URIs passed in are full URIs of this store's kind."""

    def put_bytes(self, uri: str, data: bytes) -> None:
        """Write an object atomically (readers see the old object or the whole new one)."""

    def put_bytes_if_absent(self, uri: str, data: bytes) -> bool:
        """Create an object only if there is none at `uri` (compare-and-swap on absence, whole or
        not at all); True when this call created it, or an earlier attempt of this call did (the
        object holds exactly `data`), False when another writer's object is there."""

    def get_bytes(self, uri: str, offset: int = 0, length: int = 0, version: str = "") -> bytes:
        """Read an object (or `length` bytes from `offset`; 0: to the end); :class:`ObjectNotFound` when absent.
        With `version` (a :meth:`version` token), only that version: :class:`ObjectChanged` when
        the object is another one now."""

    def size(self, uri: str) -> int:
        """The object's size in bytes; :class:`ObjectNotFound` when absent."""

    def version(self, uri: str) -> str:
        """A token that changes whenever the object does, `SIZE:TAG` (its size in bytes, then its
        ETag; a local file's modification time); :class:`ObjectNotFound` when absent."""

    def put_file(self, uri: str, path: str | Path) -> None:
        """Upload a local file (multipart for large files)."""

    def get_file(self, uri: str, path: str | Path) -> None:
        """Download an object to a local file."""

    def exists(self, uri: str) -> bool:
        """Whether an object exists at `uri`."""

    def list(self, prefix: str) -> list[str]:
        """Full URIs of all objects in the folder `prefix` (recursively), sorted. A folder, not a
        string prefix: listing `runs/exp1` never returns `runs/exp10/...`, another run's objects."""

    def versions(self, prefix: str) -> dict[str, str]:
        """:meth:`list`'s objects, each with its :meth:`version`, from the listing itself (one
        request per thousand objects, not one per object)."""

    def delete(self, uri: str) -> None:
        """Delete one object; no error when absent."""

    def check(self, uri: str) -> None:
        """Preflight: raise :class:`StoreError` saying what to fix if `uri` cannot be written."""


def drop_empty_folders(store: ObjectStore, prefix: str) -> None:
    """Remove the folders left empty at and under `prefix` once its objects are deleted: in an
    object store no folder outlives its objects, and a local one should look the same. Only for
    a folder nothing writes to any more (a pruned checkpoint step)."""
    if not isinstance(store, LocalStore):
        return
    top = store._path(prefix)
    if not top.is_dir():
        return
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: something else lives there, and stays
            folder.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def version_size(version: str) -> int:
    """The size in bytes an :meth:`ObjectStore.version` token gives."""
    return int(version.split(":", 1)[0])


def read_chunks(
    store: ObjectStore, uri: str, chunk_bytes: int, progress: str = "", version: str = ""
) -> Iterator[bytes]:
    """The object at `uri` in consecutive ranged reads of `chunk_bytes` (the last may be shorter),
    so a reader holds one chunk however large the object. Every read is of one version, `version`
    (a reader passing over the object twice gives the first pass's), else the one the object has
    at the first read: one another writer replaces meanwhile is :class:`ObjectChanged` (was: read
    on in the new version, a dataset of two). With `progress` (what the reading is for, e.g.
    ``data prep pass 1/2``), logs how far it got every few seconds and when done."""
    version = version or store.version(uri)
    size = version_size(version)
    chunks = (
        store.get_bytes(uri, offset, min(chunk_bytes, size - offset), version=version)
        for offset in range(0, size, chunk_bytes)
    )
    if progress:
        chunks = ProgressLine(f"{progress}: reading {uri}", total=size).track(chunks)
    yield from chunks


def _new_temp_file(folder: Path) -> tuple[int, str]:
    """A new, empty `.kftrain-*.tmp` file in `folder`: its descriptor (open for writing) and path.

    Every object LocalStore writes starts as one of these and is renamed (or linked) into place,
    keeping this file's mode. It is created as open() creates a file, mode 0o666 less the umask
    (and a folder's default ACL), not 0600 as tempfile.mkstemp makes it: a serving container or a
    colleague under another uid must be able to read an exported model, as they can the inputs."""
    for _ in range(100):
        name = os.path.join(folder, f"{TEMP_PREFIX}{os.urandom(6).hex()}{TEMP_SUFFIX}")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), name
        except FileExistsError:  # another writer's name: draw again
            continue
    raise FileExistsError(f"no free temporary file name in {folder}")


def _changed(uri: str) -> ObjectChanged:
    return ObjectChanged(
        f"{uri} changed while it was read (another writer replaced it): what was read mixes two versions; read it "
        "again once nothing writes to it"
    )


def _file_version(st: os.stat_result) -> str:
    """A local file's :meth:`ObjectStore.version`: its size and modification time."""
    return f"{st.st_size}:{st.st_mtime_ns}"


class LocalStore:
    """A local directory standing in for the object store. Its files get the mode open() gives
    (0o666 less the umask): see :func:`_new_temp_file`."""

    @staticmethod
    def _path(uri: str) -> Path:
        loc = parse_uri(uri)
        if loc.is_remote:
            raise StoreError(f"{uri!r} is an object-store URI, not a local path")
        return Path(loc.key)

    @staticmethod
    def _make_folders(dest: Path) -> None:
        """Make the folders of file `dest`; a file standing in place of one is a StoreError naming
        it (was: `[Errno 20] Not a directory` of `dest`, or `[Errno 17] File exists`)."""
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocker = _nearest_existing(dest.parent)
            if not blocker.is_dir():
                why = f"{blocker} is a file, not a folder: move it, or write elsewhere"
            elif exc.errno in (errno.EACCES, errno.EPERM):  # the folder that refuses, not a file deep below it
                why = f"the folder {blocker} does not let this user make folders in it ({_owner_and_mode(blocker)})" + (
                    ": ask its owner, or write elsewhere (a folder several users share needs group write: "
                    "chmod -R g+ws on it, and umask 002 for their runs)"
                )
            else:
                why = _write_problem(exc)
            raise StoreError(f"cannot write {dest}: {why}") from None

    @staticmethod
    @contextlib.contextmanager
    def _writing(dest: Path) -> Iterator[None]:
        """The OS's refusal to write file `dest` (or its temporary file beside it) as a StoreError
        naming `dest`: a full disk's names no file at all. Errors about another file (the source
        of a copy) pass unchanged."""
        try:
            yield
        except OSError as exc:
            about = Path(exc.filename) if exc.filename else None
            temporary = about is not None and about.parent == dest.parent and about.name.startswith(TEMP_PREFIX)
            if about is not None and about not in (dest, dest.parent) and not temporary:
                raise
            raise StoreError(f"cannot write {dest}: {_write_problem(exc)}") from None

    @staticmethod
    def _replace_atomically(dest: Path, write: Callable[[Path], None]) -> None:
        """Write a temporary file beside `dest`, then rename it over `dest`: readers see the old
        object or the whole new one. The temporary name is neutral (not `dest`'s): a writer
        killed mid-write leaves a `.kftrain-*.tmp` that no reader globbing for `dest`'s kind
        (TensorBoard's `*tfevents*`, shard patterns) mistakes for an object."""
        LocalStore._make_folders(dest)
        with LocalStore._writing(dest):
            fd, name = _new_temp_file(dest.parent)
            os.close(fd)
            tmp = Path(name)
            try:
                write(tmp)
                os.replace(tmp, dest)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise

    def put_bytes(self, uri: str, data: bytes) -> None:
        self._replace_atomically(self._path(uri), lambda tmp: tmp.write_bytes(data))

    def put_bytes_if_absent(self, uri: str, data: bytes) -> bool:
        dest = self._path(uri)
        self._make_folders(dest)
        with self._writing(dest):
            fd, name = _new_temp_file(dest.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                try:
                    # link() creates `dest` only if absent (like O_CREAT|O_EXCL), and with its whole
                    # content: no reader sees a half-written record.
                    os.link(name, dest)
                    return True
                except FileExistsError:
                    return dest.read_bytes() == data
            finally:
                os.unlink(name)

    def get_bytes(self, uri: str, offset: int = 0, length: int = 0, version: str = "") -> bytes:
        path = self._path(uri)
        try:
            with path.open("rb") as f:
                if version and _file_version(os.fstat(f.fileno())) != version:
                    raise _changed(uri)
                f.seek(offset)
                data = f.read(length or -1)
                if version and _file_version(os.fstat(f.fileno())) != version:  # written in place meanwhile
                    raise _changed(uri)
                return data
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):  # a file where a folder is: no object
            raise ObjectNotFound(f"no file at {uri}") from None
        except OSError as exc:  # permission denied, an I/O error: what the OS said, naming the file
            raise StoreError(f"cannot read {uri}: {exc.strerror or exc}") from None

    def size(self, uri: str) -> int:
        return self._stat(uri).st_size

    def version(self, uri: str) -> str:
        return _file_version(self._stat(uri))

    def _stat(self, uri: str) -> os.stat_result:
        path = self._path(uri)
        if not path.is_file():
            raise ObjectNotFound(f"no file at {uri}")
        return path.stat()

    def put_file(self, uri: str, path: str | Path) -> None:
        self._replace_atomically(self._path(uri), lambda tmp: shutil.copyfile(path, tmp))

    def get_file(self, uri: str, path: str | Path) -> None:
        src = self._path(uri)
        if not src.is_file():
            raise ObjectNotFound(f"no file at {uri}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)

    def exists(self, uri: str) -> bool:
        return self._path(uri).is_file()

    def list(self, prefix: str) -> list[str]:
        return sorted(uri for uri, _ in self._files(prefix))

    def versions(self, prefix: str) -> dict[str, str]:
        return {uri: _file_version(st) for uri, st in sorted(self._files(prefix))}

    def linked_folders(self, prefix: str) -> list[str]:
        """The real paths of the folders outside the folder `prefix` that reading it enters
        through its links (:meth:`_folders`), in the order it enters them."""
        return [real for _, _, real in self._folders(prefix) if real is not None]

    def _folders(self, prefix: str) -> Iterator[tuple[str, list[str], str | None]]:
        """(folder, its file names, sorted; the real path a link led into it from, else None) of
        the folder `prefix` and every folder below it, in a fixed order: through linked folders
        that lead out of it (a folder of links to datasets is a folder of data), each real folder
        once, so a link loop ends. A link back into the folder is not entered (what it leads to is
        read under its own name), nor a hidden one (a source's listing leaves hidden paths out:
        the first way in to a folder would have hidden it)."""
        root = self._path(prefix)
        if not root.is_dir():
            return
        real_root = os.path.realpath(root)
        claimed = {real_root}
        linked: dict[str, str] = {}  # folder -> the real path its link led to
        for folder, subfolders, names in os.walk(root, followlinks=True):
            entered = []
            for sub in sorted(subfolders):
                path = os.path.join(folder, sub)
                real = os.path.realpath(path)
                if real in claimed or (
                    os.path.islink(path) and (sub.startswith(".") or os.path.commonpath([real, real_root]) == real_root)
                ):
                    continue
                claimed.add(real)
                entered.append(sub)
                if os.path.islink(path):
                    linked[path] = real
            subfolders[:] = entered
            yield folder, sorted(names), linked.pop(folder, None)

    def _files(self, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
        """(URI, stat) of every file below the folder `prefix` (:meth:`_folders`), but for the
        `.kftrain-*.tmp` files of writes in progress."""
        root, base = self._path(prefix), prefix.rstrip("/")
        for folder, names, _ in self._folders(prefix):
            rel = Path(folder).relative_to(root)
            for name in names:
                if name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX):
                    continue
                try:
                    st = os.stat(os.path.join(folder, name))  # through a link; a broken one is no file
                except OSError:
                    continue
                if S_ISREG(st.st_mode):
                    yield join_uri(base, (rel / name).as_posix()), st

    def file_identity(self, uri: str) -> tuple[int, int]:
        """The file `uri` names, through links: (device, inode), the same for every path to it
        (a symbolic link, a hard link)."""
        st = os.stat(self._path(uri))
        return st.st_dev, st.st_ino

    def delete(self, uri: str) -> None:
        self._path(uri).unlink(missing_ok=True)

    def check(self, uri: str) -> None:
        """Whether a write under `uri` can succeed; leaves nothing behind (the first write makes the
        folders): a folder is made and removed again in the nearest one that exists, as the
        permission bits do not tell (root may write anywhere by them, and not in /proc)."""
        existing = _nearest_existing(self._path(uri))
        if not existing.is_dir():
            raise StoreError(f"cannot write under {uri}: {existing} is a file, not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            why = (
                "is on a read-only file system"
                if os.statvfs(existing).f_flag & os.ST_RDONLY
                else "is not writable by this user"
            )
            raise StoreError(f"cannot write under {uri}: the folder {existing} {why}")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".kftrain-check-", dir=existing))
        except OSError as exc:
            raise StoreError(
                f"cannot write under {uri}: a folder in {existing} cannot be made ({exc.strerror})"
            ) from None


def _owner_and_mode(path: Path) -> str:
    """`owner alice, mode 755` of a file or folder (the owner's uid where it has no name here)."""
    import pwd

    st = path.stat()
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"owner {owner}, mode {st.st_mode & 0o7777:o}"


def _write_problem(exc: OSError) -> str:
    """What a refused write means and what to do, by the OS's error."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.strerror}: free space there, or write elsewhere"
    if exc.errno == errno.ENAMETOOLONG:
        return f"{exc.strerror}: write to a shorter path (a name has at most 255 bytes, a path 4,096 on Linux)"
    if exc.errno == errno.EROFS:
        return f"{exc.strerror}: write elsewhere"
    return exc.strerror or str(exc)


def _nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def is_transient(exc: BaseException) -> bool:
    """Whether a failed store call may succeed if tried again: the server was unreachable, reset
    the connection, timed out, or answered 5xx / SlowDown. A definite answer (no such key or
    bucket, access denied, bad credentials, not an S3 API) is not."""
    import urllib3.exceptions
    from minio.error import InvalidResponseError, S3Error, ServerError

    if isinstance(exc, S3Error):
        status = getattr(exc.response, "status", 0) or 0
        return exc.code in TRANSIENT_S3_CODES or status >= 500 or status == 429
    if isinstance(exc, ServerError):
        return exc.status_code >= 500 or exc.status_code == 429
    if isinstance(exc, InvalidResponseError):  # e.g. a gateway's HTML 502 page
        return exc._code >= 500 or exc._code == 429  # noqa: SLF001 (minio keeps the status private)
    if isinstance(exc, urllib3.exceptions.SSLError):
        return False  # a certificate problem does not fix itself
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return exc.reason is None or is_transient(exc.reason)
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def _cause(exc: BaseException) -> str:
    import urllib3.exceptions

    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    said = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, urllib3.exceptions.SSLError) and "WRONG_VERSION_NUMBER" in said.upper().replace(" ", "_"):
        # What TLS says to a server that answers in plain HTTP.
        return f"{said} (the endpoint does not speak TLS: write it with http://, not https://)"
    if isinstance(exc, urllib3.exceptions.SSLError) and "CERTIFICATE_VERIFY_FAILED" in said:
        return f"{said} (the endpoint's certificate is not trusted here: give its CA bundle in SSL_CERT_FILE)"
    return said


def _no_bucket(bucket: str, endpoint: str) -> StoreError:
    """A missing bucket, in words (callers prefix the field that named it: store.uri,
    data.source, checkpoint.uri, ...)."""
    return StoreError(
        f"bucket {bucket!r} does not exist at {endpoint}: create it (e.g. `mc mb`), or name a bucket that exists"
    )


@contextlib.contextmanager
def check_deadline(seconds: float = CHECK_BUDGET_S) -> Iterator[None]:
    """Every S3 request this thread makes inside gives up `seconds` from now at the latest: each
    connect and read timeout is cut to the time left and no retry starts after it. A check must
    answer in its stated time even when `store.read_timeout_seconds` is long (a hung endpoint
    would otherwise hold it that long). Nested, the earlier deadline wins."""
    with deadline_kept():
        shorten_deadline(seconds, "the store check's")
        yield


@contextlib.contextmanager
def deadline_kept() -> Iterator[None]:
    """This thread's S3 deadline as it was once the block ends, whatever set it inside."""
    outer = getattr(_deadline, "at", None), getattr(_deadline, "seconds", 0.0), getattr(_deadline, "why", "")
    try:
        yield
    finally:
        _deadline.at, _deadline.seconds, _deadline.why = outer


def shorten_deadline(seconds: float, why: str) -> None:
    """From now on, this thread's S3 requests give up `seconds` from now at the latest (as inside
    :func:`check_deadline`), or at the deadline already set where that is earlier; `why`: whose
    limit it is, as an error names it. For a stopped run's end (inside :func:`deadline_kept`): a
    request under way keeps the timeout it started with; its retries and the requests after it are
    cut."""
    at = time.monotonic() + seconds
    if getattr(_deadline, "at", None) is None or at < _deadline.at:
        _deadline.at, _deadline.seconds, _deadline.why = at, seconds, why


def answer_within(store: ObjectStore, uri: str, seconds: float = CHECK_BUDGET_S) -> None:
    """One small request about `uri` (whether an object is there; for a bucket's root, a name in
    it) that must be answered within `seconds`: a wrong endpoint, a hung or unreachable store
    fails in seconds, as :class:`StoreError`, before longer work (the listing of many objects)
    runs under the store's own retry policy."""
    probe = uri.rstrip("/") if parse_uri(uri).key.strip("/") else join_uri(uri, ".kftrain-answer")
    with check_deadline(seconds):
        store.exists(probe)


def _time_left() -> float | None:
    at = getattr(_deadline, "at", None)
    return None if at is None else at - time.monotonic()


def _pool_manager(policy: RetryPolicy, **kw: Any) -> Any:
    """urllib3's pool with `policy`'s timeouts, cut to the time left under :func:`check_deadline`."""
    import urllib3

    class DeadlinePool(urllib3.PoolManager):
        def urlopen(self, method: str, url: str, redirect: bool = True, **kw: Any) -> Any:
            left = _time_left()
            if left is not None:
                left = max(left, 0.01)
                kw["timeout"] = urllib3.Timeout(
                    connect=min(policy.connect_timeout_s, left), read=min(policy.read_timeout_s, left)
                )
            return super().urlopen(method, url, redirect=redirect, **kw)

    return DeadlinePool(
        timeout=urllib3.Timeout(connect=policy.connect_timeout_s, read=policy.read_timeout_s), retries=False, **kw
    )


#: The S3 permission each operation of :class:`S3Store` needs, named when a policy denies it.
_PERMISSIONS = {
    "GET": "s3:GetObject",
    # A HEAD of the bucket (the check) needs s3:ListBucket, and so does one of a key not there
    # (without it, S3 answers 403 rather than 404).
    "HEAD": "s3:GetObject or s3:ListBucket",
    "DOWNLOAD": "s3:GetObject",
    "PUT": "s3:PutObject",
    "DELETE": "s3:DeleteObject",
    "LIST": "s3:ListBucket",
}
#: What S3 answers a request signed for another region than the bucket's (and minio calls a
#: HEAD's bodyless 400 BadRequest, its message naming the region).
_OTHER_REGION = ("AuthorizationHeaderMalformed", "PermanentRedirect", "IllegalLocationConstraintException")


@functools.cache
def _minio_client() -> type:
    """minio's client, but for a bucket's region: without `store.region`, minio asks the server
    (`GetBucketLocation`) before the first request, which needs `s3:GetBucketLocation`, a
    permission a policy granting only the data often leaves out (was: every request refused,
    blamed on the credentials). Refused, the client signs for us-east-1, the region MinIO, Ceph
    and SeaweedFS take by default; a bucket elsewhere on AWS then answers that it is in another
    region, and the error says to set `store.region`."""
    from minio import Minio
    from minio.error import S3Error

    class Client(Minio):
        def _get_region(self, bucket_name: str | None = None) -> str:
            try:
                return super()._get_region(bucket_name)
            except S3Error as exc:
                if exc.code != "AccessDenied" or not bucket_name:
                    raise
                self._region_map[bucket_name] = "us-east-1"
                return "us-east-1"

    return Client


class S3Store:
    """S3-compatible object storage through the minio SDK (AWS S3, MinIO, SeaweedFS).

    Every operation runs under one retry policy: transient failures (refused or reset
    connections, timeouts, 5xx, SlowDown) are retried with capped exponential backoff until
    `policy.budget_s` is spent; definite answers fail at once. The SDK's own retries are off,
    so this is the only policy.
    """

    def __init__(self, endpoint: str = "", region: str = "", policy: RetryPolicy | None = None) -> None:
        import certifi
        from minio.credentials import (
            ChainedProvider,
            EnvAWSProvider,
            EnvMinioProvider,
            IamAwsProvider,
        )

        self.policy = policy or RetryPolicy()
        endpoint, endpoint_from = _setting(endpoint, "store.endpoint", *ENDPOINT_ENV)
        region, region_from = _setting(region, "store.region", *REGION_ENV)
        if endpoint:
            if problem := endpoint_problem(endpoint):
                raise StoreSettingError(f"{endpoint_from}: S3 endpoint {redact_url(endpoint)!r} {problem}")
            parts = urlsplit(endpoint)
            host, secure = parts.netloc, parts.scheme == "https"
        else:
            host, secure = "s3.amazonaws.com", True
        if region and (problem := region_problem(region)):
            raise StoreSettingError(f"{region_from}: {problem}")
        _require_credentials()
        providers = [EnvAWSProvider(), EnvMinioProvider()]
        # Web-identity (IRSA) credentials only when the pod is set up for it: probing the
        # instance metadata service elsewhere would stall every call.
        if os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
            providers.append(IamAwsProvider())
        self.endpoint = f"{'https' if secure else 'http'}://{host}"
        # minio's default client waits 5 minutes for a read and retries on its own; ours waits
        # as long as object storage reasonably needs, and leaves retrying to _call.
        http = _pool_manager(
            self.policy,
            maxsize=10,
            cert_reqs="CERT_REQUIRED",
            ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        )
        self._client = _minio_client()(
            host, secure=secure, region=region or None, credentials=ChainedProvider(providers), http_client=http
        )
        self._jitter = random.Random()  # never the global RNG: training seeds and checkpoints it

    def _loc(self, uri: str) -> Location:
        loc = parse_uri(uri)
        if not loc.is_remote:
            raise StoreError(f"{uri!r} is a local path, not an object-store URI")
        return loc

    def _obj(self, uri: str) -> Location:
        """The location of one object: :class:`StoreError` when `uri` names only a bucket."""
        loc = self._loc(uri)
        if not loc.key:
            raise StoreError(f"{uri!r} names a bucket, not an object: add the object's key after the bucket")
        return loc

    def _call(self, what: str, uri: str, fn: Callable[[], T], budget_s: float | None = None) -> T:
        """Run `fn` under the retry policy; every failure leaves as a StoreError naming `uri`."""
        p = self.policy
        budget = p.budget_s if budget_s is None else min(budget_s, p.budget_s)
        left = _time_left()
        limit = f"retry budget {budget:g}s, store.retry_budget_seconds"
        if left is not None and left < budget:  # under a check's deadline
            budget, limit = max(left, 0.0), f"{_deadline.why} limit of {_deadline.seconds:g}s"
        start = time.monotonic()
        delay, attempt = p.first_backoff_s, 0
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise self._error(exc, uri, what) from None
                spent = time.monotonic() - start
                left = budget - spent
                if left <= 0:
                    raise StoreError(
                        f"cannot reach the object store at {self.endpoint} for {what} {uri}: gave up after "
                        f"{attempt} attempt(s) in {spent:.0f}s ({limit}): {_cause(exc)}"
                    ) from None
                pause = min(delay * (0.5 + self._jitter.random() / 2), left)
                log.warning(
                    "%s %s failed (%s); retry %d in %.1fs, %.0fs of the retry budget left",
                    what,
                    uri,
                    _cause(exc),
                    attempt,
                    pause,
                    left,
                )
                time.sleep(pause)
                delay = min(delay * 2, p.max_backoff_s)

    def _error(self, exc: Exception, uri: str, what: str = "") -> StoreError:
        """Turn an SDK error of the operation `what` (GET, PUT, LIST, ...) into one that says what
        to fix (and never echoes a key)."""
        from minio.error import InvalidResponseError, S3Error

        if isinstance(exc, StoreError):
            return exc
        if isinstance(exc, S3Error):
            code = exc.code
            if code in ("NoSuchKey", "NoSuchObject"):
                return ObjectNotFound(f"no object at {uri}")
            if code == "NoSuchBucket":
                bucket = self._loc(uri).bucket
                return _no_bucket(bucket, self.endpoint)
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
                return StoreError(
                    f"{self.endpoint} rejected the credentials for {uri} ({code}): check "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
                )
            if code == "AccessDenied":
                allowed = f"allowed {_PERMISSIONS[what]} on it" if what in _PERMISSIONS else "allowed this"
                if what in ("HEAD", "DOWNLOAD", ""):  # no body to tell wrong keys from a policy's refusal
                    return StoreError(
                        f"{self.endpoint} rejected the credentials for {uri} (AccessDenied): they are wrong (check "
                        f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or not {allowed} (the user's or the bucket's "
                        "policy)"
                    )
                # Wrong keys get InvalidAccessKeyId or SignatureDoesNotMatch: these are valid.
                return StoreError(
                    f"{self.endpoint} refused {what} {uri} (AccessDenied): the credentials are valid but not "
                    f"{allowed}; grant it in the user's or the bucket's policy"
                )
            if code in _OTHER_REGION or (code == "BadRequest" and "use region" in (exc.message or "")):
                return StoreError(
                    f"{self.endpoint} answered {code} for {uri}: the bucket is in another region than the one the "
                    f"request was signed for ({exc.message}); set store.region (or AWS_REGION) to the bucket's region"
                )
            if code in _SWITCHED_OFF:
                said = f": {exc.message}" if exc.message else ""
                return StoreError(
                    f"{self.endpoint} refused {what or 'the request for'} {uri} ({code}{said}): {_SWITCHED_OFF[code]}"
                )
            said = exc.message or "the store said no more than its code; look the code up in the store's documentation"
            return StoreError(f"{code} from {self.endpoint} for {uri}: {said}")
        if isinstance(exc, InvalidResponseError):
            return self._not_s3(uri, f"HTTP {exc._code}, Content-Type {exc._content_type}")  # noqa: SLF001
        if isinstance(exc, ElementTree.ParseError):
            return self._not_s3(uri, "with a body that is not S3's XML")
        if isinstance(exc, ValueError):  # the SDK refused the request before sending it
            return StoreError(f"cannot send the request for {uri} to {self.endpoint}: {exc or repr(exc)}")
        return StoreError(f"cannot reach the object store at {self.endpoint} for {uri}: {_cause(exc)}")

    def _not_s3(self, uri: str, seen: str) -> StoreError:
        return StoreError(
            f"the endpoint {self.endpoint} is not an S3 API (it answered {seen} for {uri}): is it a web "
            "console's port instead of the API port (MinIO: 9000, not 9001)? Fix store.endpoint / --s3-endpoint"
        )

    def put_bytes(self, uri: str, data: bytes) -> None:
        loc = self._obj(uri)
        self._call("PUT", uri, lambda: self._client.put_object(loc.bucket, loc.key, io.BytesIO(data), len(data)))

    def put_bytes_if_absent(self, uri: str, data: bytes) -> bool:
        """A PUT with ``If-None-Match: *`` (S3 conditional writes; MinIO, Ceph RGW and moto
        honour it too): the store refuses it with 412 PreconditionFailed when the key exists. A
        retried attempt whose first try did land sees its own bytes and counts as created."""
        from minio.error import S3Error

        loc = self._loc(uri)

        def put() -> bool:
            try:
                # The SDK's public put_object turns unknown headers into user metadata
                # (X-Amz-Meta-If-None-Match), so the condition goes through its plain PUT.
                self._client._put_object(  # noqa: SLF001
                    loc.bucket,
                    loc.key,
                    data,
                    headers={"If-None-Match": "*", "Content-Type": "application/octet-stream"},
                )
                return True
            except S3Error as exc:
                if exc.code == "PreconditionFailed":
                    return False
                raise

        return self._call("PUT", uri, put) or self.get_bytes(uri) == data

    def get_bytes(self, uri: str, offset: int = 0, length: int = 0, version: str = "") -> bytes:
        from minio.error import S3Error

        loc = self._obj(uri)
        # Only that version: the answer's ETag must be the version's. Compared here rather than
        # asked of the server (If-Match), which some answer wrongly (SeaweedFS 3.97: 412 to its
        # own ETag); a server that sends no ETag is taken at its word.
        pinned = version.split(":", 1)[1] if version else ""

        def get() -> bytes:
            try:
                resp = self._client.get_object(loc.bucket, loc.key, offset=offset, length=length)
            except S3Error as exc:
                if version and exc.code == "InvalidRange":  # a range past the end of a shorter one
                    raise _changed(uri) from None
                raise
            try:
                etag = resp.headers.get("ETag", "").strip('"')
                if pinned and etag and etag != pinned:
                    raise _changed(uri)
                return resp.read()
            finally:
                resp.close()
                resp.release_conn()

        return self._call("GET", uri, get)

    def size(self, uri: str) -> int:
        loc = self._obj(uri)
        return self._call("HEAD", uri, lambda: self._client.stat_object(loc.bucket, loc.key).size)

    def version(self, uri: str) -> str:
        loc = self._obj(uri)
        stat = self._call("HEAD", uri, lambda: self._client.stat_object(loc.bucket, loc.key))
        return f"{stat.size}:{stat.etag}"

    def put_file(self, uri: str, path: str | Path) -> None:
        loc = self._obj(uri)
        # minio sends a multipart upload's parts from threads of its own, which this thread's deadline
        # (a store check's, a stopped run's) does not reach (was: a hung store held a stopped run's
        # 20 MiB log for the read timeout per part): under a deadline the parts go from this thread.
        parallel = 1 if _time_left() is not None else MINIO_PARALLEL_PARTS
        self._call(
            "PUT",
            uri,
            lambda: self._client.fput_object(
                loc.bucket, loc.key, str(path), part_size=PART_SIZE, num_parallel_uploads=parallel
            ),
        )

    def get_file(self, uri: str, path: str | Path) -> None:
        loc = self._obj(uri)
        # minio asks for the object's size first (a HEAD): a refusal has no body to say why.
        self._call("DOWNLOAD", uri, lambda: self._client.fget_object(loc.bucket, loc.key, str(path)))

    def exists(self, uri: str) -> bool:
        from minio.error import S3Error

        loc = self._obj(uri)

        def stat() -> bool:
            try:
                self._client.stat_object(loc.bucket, loc.key)
                return True
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchObject"):
                    return False
                raise

        return self._call("HEAD", uri, stat)

    def list(self, prefix: str) -> list[str]:
        return list(self.versions(prefix))

    def versions(self, prefix: str) -> dict[str, str]:
        loc = self._loc(prefix)
        folder = loc.key.rstrip("/") + "/" if loc.key.strip("/") else ""  # S3 matches letters, not folders
        listed = self._call(
            "LIST",
            prefix,
            lambda: [
                (o.object_name, f"{o.size}:{(o.etag or '').strip(chr(34))}")
                for o in self._client.list_objects(loc.bucket, prefix=folder, recursive=True)
            ],
        )
        return {f"{loc.scheme}://{loc.bucket}/{k}": v for k, v in sorted(listed)}

    def delete(self, uri: str) -> None:
        loc = self._obj(uri)
        self._call("DELETE", uri, lambda: self._client.remove_object(loc.bucket, loc.key))

    def check(self, uri: str) -> None:
        loc = self._loc(uri)
        # Preflight answers within seconds: a wrong endpoint is a typo far more often than an outage.
        with check_deadline(CHECK_BUDGET_S):
            self._check(uri, loc)

    def _check(self, uri: str, loc: Location) -> None:
        if not self._call("HEAD", uri, lambda: self._client.bucket_exists(loc.bucket)):
            raise _no_bucket(loc.bucket, self.endpoint)
        # bucket_exists passes with read-only keys (and on any web server that answers HEAD with
        # 200): write a probe and read it back to prove this is an S3 API we can write to.
        probe = join_uri(uri, ".kftrain-write-check")
        token = f"kftrain {time.time_ns()}".encode()
        self.put_bytes(probe, token)
        back = self.get_bytes(probe)
        if back != token:
            raise self._not_s3(probe, f"{back[:40]!r} instead of the object just written")
        self.delete(probe)


#: The key and secret variables minio's providers read, each pair's names in its order of preference.
_CREDENTIAL_PAIRS = (
    (("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY"), ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY")),
    (("MINIO_ACCESS_KEY",), ("MINIO_SECRET_KEY",)),
)


def credential_pair_problem(has: Callable[[str], bool]) -> str | None:
    """None when the variables `has` says are set hold a complete key/secret pair of one provider;
    else each half set without its other half ('' when none is set)."""
    halves = []
    for keys, secrets in _CREDENTIAL_PAIRS:
        key, secret = (next((n for n in names if has(n)), "") for names in (keys, secrets))
        if key and secret:
            return None
        if key or secret:
            halves.append(f"{key} without {secrets[0]}" if key else f"{secret} without {keys[0]}")
    return "; ".join(halves)


def _require_credentials() -> None:
    """Refuse, naming the variables, when no provider has credentials: no complete key/secret
    pair and no web identity (a key without its secret is named as such)."""
    if os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return
    halves = credential_pair_problem(lambda name: bool(os.environ.get(name)))
    if halves is None:
        return
    if halves:
        raise StoreError(f"{halves}: set both (on a cluster, from the store Secret; see README 'Credentials')")
    raise StoreError(
        "no object-store credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "(on a cluster, from a Kubernetes Secret; see README 'Credentials')"
    )


#: Where an S3 endpoint comes from when no field or flag gives one: the first set (the AWS SDKs' order).
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
#: The variables an empty `store.region` is read from, in order.
REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
_REGION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def region_problem(region: str) -> str | None:
    """Why `region` is no S3 region name, else None."""
    if _REGION_RE.fullmatch(region):
        return None
    return f"{region!r} is not a region name (letters, digits, '-', '_' and '.', e.g. us-east-1)"


def _setting(value: str, field: str, *env: str) -> tuple[str, str]:
    """A store setting and where it came from: the config `field`, else the first of the
    environment variables `env` that is set (named in an error about its value)."""
    if value:
        return value, field
    for name in env:
        if os.environ.get(name):
            return os.environ[name], f"${name}"
    return "", field


def endpoint_problem(endpoint: str) -> str | None:
    """Why `endpoint` is no S3 endpoint URL (None when it is one): an http(s) URL of a host,
    with no user or password (never used, and printed), and no path, query or fragment (the S3
    API is at the host's root: a path would be dropped, and the objects go elsewhere)."""
    try:
        parts = urlsplit(endpoint)
    except ValueError:  # `http://[::1:9000`: an IPv6 host's bracket not closed
        return "is not a URL (an IPv6 host is written in brackets: http://[::1]:9000)"
    if has_userinfo(endpoint):
        return (
            "holds a user or password, which is not used (and would be printed): remove it (store.endpoint / "
            "--s3-endpoint) and set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (on a cluster, from the store Secret)"
        )
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be a URL starting with http:// (no TLS) or https:// (TLS), e.g. http://host:9000"
    if parts.path.strip("/") or parts.query or parts.fragment:
        return "has a path, query or fragment: the S3 API is at the host's root; write only scheme://host[:port]"
    try:
        parts.port  # noqa: B018 (it parses the port)
    except ValueError:
        return "has a port that is not a number from 0 to 65535; write scheme://host[:port]"
    return None


def open_store(uri: str, endpoint: str = "", region: str = "", policy: RetryPolicy | None = None) -> ObjectStore:
    """The store serving `uri`: :class:`S3Store` for s3:// and minio://, else :class:`LocalStore`."""
    loc = parse_uri(uri)
    if loc.is_remote:
        if loc.scheme == "minio" and not _setting(endpoint, "store.endpoint", *ENDPOINT_ENV)[0]:
            endpoint = KFP_STORE_ENDPOINT
        return S3Store(endpoint=endpoint, region=region, policy=policy)
    return LocalStore()
