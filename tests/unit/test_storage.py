import errno
import os
import re

import pytest

from trainer import storage
from trainer.storage import (
    LocalStore,
    Location,
    ObjectNotFound,
    S3Store,
    StoreError,
    StoreSettingError,
    _cause,
    file_place,
    join_uri,
    parse_uri,
    same_place,
)

# Every S3 test here runs on moto and on Ceph's RADOS Gateway (tests/conftest.py).
pytestmark = pytest.mark.s3_servers("moto", "rgw")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://my-bucket/a/b.txt", Location("s3", "my-bucket", "a/b.txt")),
        ("minio://mlpipeline/v2/artifacts", Location("minio", "mlpipeline", "v2/artifacts")),
        ("s3://my-bucket", Location("s3", "my-bucket", "")),
        ("file:///tmp/x/y", Location("file", "", "/tmp/x/y")),
        ("file:///tmp/x/a#1?v.txt", Location("file", "", "/tmp/x/a#1?v.txt")),  # was: cut at the '#'
        ("s3://bucket/a?x=1#2", Location("s3", "bucket", "a?x=1#2")),  # a key's own characters (was: refused)
        ("file://localhost/tmp/x", Location("file", "", "/tmp/x")),
        ("/tmp/x", Location("file", "", "/tmp/x")),
    ],
)
def test_parse_uri(uri, expected):
    assert parse_uri(uri) == expected


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_uri("out/x").key == os.path.join(str(tmp_path), "out/x")
    assert parse_uri("./s3:x").key == os.path.join(str(tmp_path), "s3:x")  # a folder so named, written so
    assert parse_uri("run:1/x").key == os.path.join(str(tmp_path), "run:1/x")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "empty storage URI"),
        ("gs://bucket/x", "unsupported storage URI scheme 'gs'"),
        ("s3://ab/x", "invalid bucket name 'ab'"),
        ("s3://Bucket/x", "invalid bucket name 'Bucket'"),
        ("s3:///x", "invalid bucket name ''"),
        ("s3://a.-b/x", "invalid bucket name 'a.-b'"),
        ("s3://ab-.cd/x", "invalid bucket name 'ab-.cd'"),
        ("s3://10.0.0.1/x", "invalid bucket name '10.0.0.1'"),
        ("s3://bucket/a//b", "empty path segment"),
        # Right after the bucket too (was: taken as s3://bucket/x, and `kftrain runs` of it cut
        # the first letter off every run id it listed).
        ("s3://bucket//x", "empty path segment"),
        ("s3://bucket//", "empty path segment"),
        # urlsplit drops them: was another key, another object's where one exists
        ("s3://bucket/d/tab\tname.txt", "holds a tab or a line end, which URLs leave out; rename the object"),
        ("s3://bucket/d/line\nend.txt", "holds a tab or a line end"),
        ("file://host/x", "names a host"),
        # A slash short is not a local folder named `s3:` (every flag and field reads URIs here).
        # The fix once, not again as a list of forms (was: "write s3://bucket/key; use s3://bucket/key, ...").
        ("s3:/my-bucket/prefix", "lacks the '//' after 's3:' (write s3://bucket/key; a local folder whose name"),
        ("s3:my-bucket/x", "lacks the '//' after 's3:'"),
        ("MINIO:/b/x", "lacks the '//' after 'minio:' (write minio://bucket/key;"),
        ("file:/tmp/x", "lacks the '//' after 'file:' (write file:///absolute/path;"),
        ("file://?x", "names no absolute path; use file:///absolute/path"),  # was: ./?x
        ("file://#x", "names no absolute path"),
        ("gs:/b/x", "lacks the '//' after 'gs:' (and is no store kftrain reads;"),
    ],
)
def test_malformed_uris_are_rejected_with_the_accepted_forms(uri, message):
    with pytest.raises(ValueError, match=None) as info:
        parse_uri(uri)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("st", "./st/", True),
        ("st", "{tmp}/st", True),
        ("st", "link", True),  # a link to it
        ("st", "file://{tmp}/st", True),
        ("st", "st2", False),
        ("s3://bk1/x", "s3://bk1/x/", True),
        ("s3://bk1/x", "s3://bk1/y", False),
        ("s3://bk1/x", "s3://bk2/x", False),
        ("s3://bk1/x", "minio://bk1/x", False),  # KFP's store, or the endpoint's: not told apart here
        ("hf://org/m", "hf://org/m/", False),  # no store place: equal as written only
    ],
)
def test_same_place_reads_one_place_however_it_is_written(tmp_path, monkeypatch, a, b, same):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "st").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "st")
    a, b = a.format(tmp=tmp_path), b.format(tmp=tmp_path)
    assert same_place(a, b) is same and same_place(b, a) is same
    assert same_place(a, a)


# A mount table as Linux writes it (/proc/self/mountinfo): the host's `/srv/data` bind-mounted
# at /mnt/view and, as in a container given one host folder twice, at /job/a and /job/b; a
# folder with a space (written \040); another filesystem at /scratch, mounted over; /data with
# /data/deep in it, then /data mounted again over both (hiding /data/deep).
MOUNTINFO = """\
21 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
30 21 8:1 /srv/data /mnt/view rw,relatime - ext4 /dev/sda1 rw
31 21 8:1 /srv/data /job/a rw,relatime - ext4 /dev/sda1 rw
32 21 8:1 /srv/data /job/b rw,relatime - ext4 /dev/sda1 rw
33 21 8:1 /srv/my\\040data /job/my\\040view rw - ext4 /dev/sda1 rw
40 21 0:50 / /scratch rw - tmpfs tmpfs rw
41 40 0:51 / /scratch rw - tmpfs tmpfs rw
50 21 0:60 / /data rw - tmpfs tmpfs rw
51 50 0:61 / /data/deep rw - tmpfs tmpfs rw
52 21 0:62 / /data rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("/srv/data/runs/r", "/mnt/view/runs/r", True),  # a bind mount: two real paths, one place
        ("/job/a/runs/r", "/job/b/runs/r", True),
        ("/srv/data", "/mnt/view", True),
        ("/srv/my data/x", "/job/my view/x", True),
        ("/srv/data/runs/r", "/mnt/view/runs/s", False),
        ("/srv/data/runs/r", "/srv/other/runs/r", False),
        ("/scratch/r", "/r", False),  # another filesystem, the same path within it
        ("/scratch/r", "/scratch/r", True),  # mounted over: the last mount's
    ],
)
def test_a_folder_reached_through_two_mounts_is_one_file_place(tmp_path, a, b, same):
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    assert (file_place(a, str(table)) == file_place(b, str(table))) is same
    assert file_place("/scratch/r", str(table)) == "0:51:/r"
    assert file_place("/data/deep/f", str(table)) == "0:62:/deep/f"  # /data mounted again, over /data/deep
    assert file_place("/x/y", str(tmp_path / "none")) == "/x/y"  # no table: the real path


@pytest.mark.parametrize(
    "write",
    [
        lambda store, uri, src: store.put_bytes(uri, b"x"),
        lambda store, uri, src: store.put_bytes_if_absent(uri, b"x"),
        lambda store, uri, src: store.put_file(uri, src),
    ],
    ids=["put_bytes", "put_bytes_if_absent", "put_file"],
)
@pytest.mark.parametrize("depth", ["runs/r1/checkpoints/owner", "runs/owner"], ids=["deeper", "the parent"])
def test_a_local_write_blocked_by_a_file_where_a_folder_goes_names_that_file(tmp_path, write, depth):
    """Was: `[Errno 20] Not a directory` (or `[Errno 17] File exists`) of the object's path, the
    user's file that stands in the way unnamed."""
    (tmp_path / "runs").write_text("mine\n")
    (tmp_path / "src").write_text("data")
    with pytest.raises(StoreError, match=rf"{tmp_path / 'runs'} is a file, not a folder: move it, or write elsewhere"):
        write(LocalStore(), str(tmp_path / depth / "x.json"), tmp_path / "src")
    assert (tmp_path / "runs").read_text() == "mine\n"


def test_join_uri():
    assert join_uri("s3://b/prefix/", "run", "/model/") == "s3://b/prefix/run/model"


#: Objects below a root, and what listing a folder of them returns: a folder, never the
#: neighbours whose names start with the same letters (S3's own LIST matches letters).
LISTED_OBJECTS = ("runs/exp1/a.bin", "runs/exp1/sub/b.bin", "runs/exp10/c.bin", "runs/exp1.json", "other/d.bin")
LISTINGS = [
    ("runs/exp1", ["runs/exp1/a.bin", "runs/exp1/sub/b.bin"]),
    ("runs/exp1/", ["runs/exp1/a.bin", "runs/exp1/sub/b.bin"]),
    ("runs", ["runs/exp1.json", "runs/exp1/a.bin", "runs/exp1/sub/b.bin", "runs/exp10/c.bin"]),
    ("runs/exp", []),
    ("runs/exp1.json", []),  # an object, not a folder
    ("", sorted(LISTED_OBJECTS)),
]


def assert_lists_folders(store, root: str) -> None:
    """`store.list` of each folder of :data:`LISTINGS` under `root` (also run on the S3 servers)."""
    for key in LISTED_OBJECTS:
        store.put_bytes(join_uri(root, key), b"x")
    for folder, expected in LISTINGS:
        uri = join_uri(root, folder) + ("/" if folder.endswith("/") else "")
        assert store.list(uri) == [join_uri(root, k) for k in expected], folder


@pytest.mark.parametrize(
    ("flags", "said"), [(os.ST_RDONLY, "is on a read-only file system"), (0, "is not writable by")]
)
def test_a_folder_that_cannot_be_written_says_whether_its_file_system_is_read_only(tmp_path, monkeypatch, flags, said):
    """(was: "not writable by this user" for a read-only mount, whose permissions are not the cause)"""
    real_statvfs = os.statvfs
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda path: type("S", (), {"f_flag": real_statvfs(path).f_flag | flags})())
    with pytest.raises(StoreError, match=f"cannot write under .*: the folder {re.escape(str(tmp_path))} {said}"):
        LocalStore().check(str(tmp_path / "out"))


@pytest.mark.parametrize("write", ["put_bytes", "put_bytes_if_absent", "put_file"])
def test_a_local_write_the_os_refuses_names_the_file_and_what_to_do(tmp_path, write):
    """(was: the OS's line alone, a full disk's naming no file, and "a bug in kftrain" for a name
    too long). What the OS says of another file (a copy's source) is left as it is."""
    store, source = LocalStore(), tmp_path / "source"
    source.write_bytes(b"x")
    dest = tmp_path / ("n" * 300)

    def put(uri: str, data=b"x"):
        return store.put_file(uri, source) if write == "put_file" else getattr(store, write)(uri, data)

    with pytest.raises(StoreError, match=rf"cannot write {re.escape(str(dest))}: File name too long: write to a shor"):
        put(str(dest))
    if write == "put_file":
        with pytest.raises(FileNotFoundError, match="missing"):
            store.put_file(str(tmp_path / "dest"), tmp_path / "missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]  # no temporary file left


def test_a_folder_that_refuses_this_user_is_named_not_a_file_deep_below_it(tmp_path, monkeypatch):
    """Another user's `runs` folder in a shared output folder (was: "cannot write .../runs/r/
    checkpoints/owner/00000001.json: Permission denied", a file and folders that did not exist).
    The OS's refusal is played here: this test may run as root, whom mode bits do not stop."""
    from pathlib import Path

    shared = tmp_path / "shared"
    (shared / "runs").mkdir(parents=True)
    (shared / "runs").chmod(0o755)

    def refused(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refused)
    dest = shared / "runs" / "f1" / "checkpoints" / "owner" / "00000001.json"
    with pytest.raises(StoreError) as refusal:
        LocalStore().put_bytes(str(dest), b"{}")
    assert str(refusal.value).startswith(
        f"cannot write {dest}: the folder {shared / 'runs'} does not let this user make folders in it (owner "
    )
    assert "mode 755): ask its owner, or write elsewhere" in str(refusal.value)


def test_local_store_lists_folders_not_name_prefixes(tmp_path):
    assert_lists_folders(LocalStore(), str(tmp_path))


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("a-file/x", "a-file is a file, not a folder"),
        # Writable by its mode bits (root's view) and still no folder can be made there (was: passed,
        # then the first write failed with a bare "[Errno 2] No such file or directory: '/proc/x'").
        ("/proc/kftrain-check/x", "a folder in /proc cannot be made (No such file or directory)"),
    ],
)
def test_a_local_folder_no_write_can_happen_in_is_refused_by_its_check(tmp_path, where, said):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreError, match=re.escape(said)):
        LocalStore().check(where if where.startswith("/") else str(tmp_path / where))
    store_root = tmp_path / "fine" / "deeper"
    LocalStore().check(str(store_root))
    assert list(tmp_path.iterdir()) == [tmp_path / "a-file"]  # nothing left behind


def test_local_store_round_trip(tmp_path):
    store = LocalStore()
    root = str(tmp_path / "root")
    store.check(root)
    store.put_bytes(join_uri(root, "a/b.bin"), b"hello")
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    store.put_file(join_uri(root, "c.bin"), src)
    assert store.get_bytes(join_uri(root, "a/b.bin")) == b"hello"
    assert store.list(root) == [join_uri(root, "a/b.bin"), join_uri(root, "c.bin")]
    store.get_file(join_uri(root, "c.bin"), tmp_path / "dl.bin")
    assert (tmp_path / "dl.bin").read_bytes() == b"x" * 1000
    store.delete(join_uri(root, "c.bin"))
    assert not store.exists(join_uri(root, "c.bin"))
    with pytest.raises(ObjectNotFound):
        store.get_bytes(join_uri(root, "missing"))


CREDENTIAL_CASES = [
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_KEY": "b"}, ""),  # minio's AWS provider reads the short names too
    ({"AWS_ACCESS_KEY": "a", "AWS_SECRET_ACCESS_KEY": "b"}, ""),
    ({"AWS_ACCESS_KEY_ID": "a", "MINIO_ACCESS_KEY": "m", "MINIO_SECRET_KEY": "s"}, ""),  # one pair is whole
    ({"AWS_ACCESS_KEY_ID": "a"}, "AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY"),
    ({"AWS_SECRET_KEY": "b"}, "AWS_SECRET_KEY without AWS_ACCESS_KEY_ID"),
    ({"MINIO_ACCESS_KEY": "m"}, "MINIO_ACCESS_KEY without MINIO_SECRET_KEY"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}, ""),  # IRSA: the web identity's
]


@pytest.mark.parametrize(("env", "refused"), CREDENTIAL_CASES)
def test_s3_credentials_are_refused_only_when_no_provider_has_a_pair(monkeypatch, env, refused):
    for keys, secrets in storage._CREDENTIAL_PAIRS:
        for name in (*keys, *secrets):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if not refused:
        S3Store(endpoint="http://127.0.0.1:1")
        return
    with pytest.raises(StoreError) as info:
        S3Store(endpoint="http://127.0.0.1:1")
    assert str(info.value).startswith(refused) and "set both" in str(info.value)


def test_s3_without_credentials_says_which_variables(monkeypatch):
    for keys, secrets in storage._CREDENTIAL_PAIRS:
        for name in (*keys, *secrets):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE", raising=False)
    with pytest.raises(StoreError, match="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        S3Store(endpoint="http://127.0.0.1:1")


#: (store.endpoint, store.region, environment, what the error names): every way the settings
#: of an S3 store are wrong, from the config or the environment, named by where they came from.
S3_SETTINGS = [
    ("http://h:9000/some/path", "", {}, "store.endpoint: S3 endpoint 'http://h:9000/some/path' has a path"),
    ("http://h:9000?x=1", "", {}, "store.endpoint: S3 endpoint 'http://h:9000?x=1' has a path, query"),
    ("", "", {"AWS_ENDPOINT_URL": "https://h/bucket"}, "$AWS_ENDPOINT_URL: S3 endpoint 'https://h/bucket' has a"),
    ("", "", {"AWS_ENDPOINT_URL_S3": "h:9000"}, "$AWS_ENDPOINT_URL_S3: S3 endpoint 'h:9000' must be a URL"),
    ("http://u:pw@h:9000", "", {}, "store.endpoint: S3 endpoint 'http://***@h:9000' holds a user or password"),
    ("http://u:p/w@h:9000", "", {}, "store.endpoint: S3 endpoint 'http://***@h:9000' holds a user or password"),
    ("http://h:abc", "", {}, "store.endpoint: S3 endpoint 'http://h:abc' has a port that is not a number"),
    ("", "", {"AWS_ENDPOINT_URL": "http://h:99999"}, "$AWS_ENDPOINT_URL: S3 endpoint 'http://h:99999' has a port"),
    ("http://h:9000", "bad region!", {}, "store.region: 'bad region!' is not a region name"),
    ("http://h:9000", "", {"AWS_REGION": "bad region!"}, "$AWS_REGION: 'bad region!' is not a region name"),
    ("http://h:9000", "", {"AWS_DEFAULT_REGION": "x/y"}, "$AWS_DEFAULT_REGION: 'x/y' is not a region name"),
]


@pytest.mark.parametrize(("endpoint", "region", "env", "named"), S3_SETTINGS)
def test_s3_settings_are_checked_naming_where_they_came_from(monkeypatch, endpoint, region, env, named):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "akid")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StoreError) as info:
        S3Store(endpoint=endpoint, region=region)
    assert named in str(info.value)
    assert "pw" not in str(info.value) and "secret" not in str(info.value)


@pytest.mark.parametrize("name", ["events.out.tfevents.1.host", "rows-00000.npz", "COMMIT.json"])
def test_a_local_write_in_progress_never_looks_like_its_object(tmp_path, name):
    """A writer SIGKILLed mid-write leaves its temporary file behind: it must not be mistaken for
    the object by readers that glob the folder (TensorBoard reads every `*tfevents*` file)."""
    dest = tmp_path / name
    seen = []

    def write(tmp):
        seen.append(tmp.name)
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt  # interrupted mid-write

    with pytest.raises(KeyboardInterrupt):
        LocalStore._replace_atomically(dest, write)
    assert name not in seen[0] and seen[0].startswith(".kftrain-") and seen[0].endswith(".tmp")
    assert list(tmp_path.iterdir()) == []  # cleaned up when it could be
    LocalStore().put_bytes(str(dest), b"whole")
    assert LocalStore().list(str(tmp_path)) == [str(dest)]


@pytest.mark.parametrize(("env", "refused"), [c for c in CREDENTIAL_CASES if "AWS_WEB_IDENTITY_TOKEN_FILE" not in c[0]])
def test_the_store_secret_fills_a_pair_by_the_same_rule(env, refused):
    """What `kubernetes.store_secret_keys` fills is what the pods' store client reads: a half is
    refused when the config loads, not at the pods' first request."""
    from trainer.config import ConfigError, load_config
    from trainer.launch.job import check_job_manifests

    cfg = load_config(overrides={"kubernetes.store_secret_keys": {f"key{i}": name for i, name in enumerate(env)}})
    if not refused:
        check_job_manifests(cfg)
        return
    with pytest.raises(ConfigError, match=f"kubernetes.store_secret_keys: must fill a key and its secret .*{refused}"):
        check_job_manifests(cfg)


#: Every way LocalStore writes a file: (name, write `data` to `dest` given a scratch folder).
LOCAL_WRITES = {
    "put_bytes": lambda store, dest, scratch: store.put_bytes(str(dest), b"data"),
    "put_bytes over an object": lambda store, dest, scratch: (
        store.put_bytes(str(dest), b"old"),
        os.chmod(dest, 0o600),  # the old object's mode is not the new one's
        store.put_bytes(str(dest), b"data"),
    ),
    "put_bytes_if_absent": lambda store, dest, scratch: store.put_bytes_if_absent(str(dest), b"data"),
    "put_file": lambda store, dest, scratch: (
        (scratch / "src").write_bytes(b"data"),
        os.chmod(scratch / "src", 0o600),  # the source's mode is not copied either
        store.put_file(str(dest), scratch / "src"),
    ),
    "get_file": lambda store, dest, scratch: (
        store.put_bytes(str(scratch / "obj"), b"data"),
        store.get_file(str(scratch / "obj"), dest),
    ),
}


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask-022", "umask-027"])
@pytest.mark.parametrize("write", list(LOCAL_WRITES))
def test_local_store_files_get_the_mode_open_gives_under_the_umask(tmp_path, write, umask):
    """Another uid (a serving container, a colleague) reads a local run's outputs as it reads
    any file this user creates: mode 0o666 less the umask, not the 0600 of a temporary file."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    dest = tmp_path / "out" / "model.safetensors"
    before = os.umask(umask)
    try:
        LOCAL_WRITES[write](LocalStore(), dest, scratch)
    finally:
        os.umask(before)
    assert dest.read_bytes() == b"data"
    assert oct(dest.stat().st_mode & 0o777) == oct(0o666 & ~umask)


@pytest.mark.parametrize(
    ("said", "hint"),
    [
        ("[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)", "write it with http://, not https://"),
        ("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed", "give its CA bundle in SSL_CERT_FILE"),
        ("[SSL: TLSV1_ALERT_INTERNAL_ERROR] tlsv1 alert internal error", ""),
    ],
)
def test_a_tls_failure_says_what_to_fix(said, hint):
    import urllib3.exceptions

    exc = urllib3.exceptions.MaxRetryError(None, "/k", urllib3.exceptions.SSLError(said))
    assert _cause(exc).startswith(f"SSLError: {said}")
    assert _cause(exc).endswith(f"{hint})" if hint else said)


def _replace(path, data: bytes, how: str) -> None:
    """Another writer's new version of a file: renamed into place, or written over in place."""
    if how == "renamed":
        tmp = path.with_name(path.name + ".new")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    else:
        with open(path, "r+b") as f:
            f.write(data)
    os.utime(path, ns=(1, 1))  # a new modification time, however coarse the file system's clock


@pytest.mark.parametrize("how", ["renamed", "in place"])
@pytest.mark.parametrize("size", [3000, 1000, 5000], ids=["same-size", "shorter", "longer"])
def test_a_local_file_replaced_while_read_in_parts_is_refused_not_mixed(tmp_path, how, size):
    """A file another writer replaces between two parts of a read (data prep reads a source in
    1 MiB parts) was read on in its new version: a dataset of two (a probe)."""
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"A" * 3000)
    store, uri = LocalStore(), f"file://{path}"
    assert b"".join(storage.read_chunks(store, uri, 1024)) == b"A" * 3000  # unchanged: read whole
    chunks = storage.read_chunks(store, uri, 1024)
    assert next(chunks) == b"A" * 1024
    _replace(path, b"B" * size, how)
    with pytest.raises(storage.ObjectChanged, match=f"{re.escape(uri)} changed while it was read"):
        list(chunks)


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (StoreError("bucket 'b' does not exist"), "store.uri: bucket 'b' does not exist"),
        (StoreSettingError("$AWS_REGION: 'x y' is not a region name"), "$AWS_REGION: 'x y' is not a region name"),
    ],
)
def test_a_store_error_names_the_setting_that_chose_the_store_unless_it_names_its_own(exc, said):
    from trainer.storage import under_setting

    named = under_setting("store.uri", exc)
    assert str(named) == said and type(named) is type(exc)


@pytest.mark.parametrize(
    ("code", "message", "said"),
    [
        ("UserSuspended", "", "is suspended or disabled; ask the store's administrator to enable it"),  # Ceph RGW
        ("AccountProblem", "There is a problem with your account", "is suspended or disabled"),  # AWS
        ("AllAccessDisabled", "All access to this object has been disabled", "access to this bucket or object is"),
        ("SomethingNew", "", "the store said no more than its code; look the code up"),
        ("SomethingNew", "a reason", "SomethingNew from http://127.0.0.1:1 for s3://b/k: a reason"),
    ],
)
def test_an_s3_answer_is_a_line_that_says_what_to_do_even_without_a_message(monkeypatch, code, message, said):
    """An S3 error code the store sends without a message ended its line in a bare colon (was:
    `UserSuspended from ... for s3://...:`); a user or account switched off is said as such."""
    from minio.error import S3Error

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    store = S3Store(endpoint="http://127.0.0.1:1")
    error = store._error(S3Error(None, code, message, "/b/k", "req", "host"), "s3://b/k", "PUT")
    assert said in str(error) and not str(error).rstrip().endswith(":"), error
