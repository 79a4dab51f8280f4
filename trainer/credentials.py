"""What looks like a credential in a plain (non-secret) environment variable.

Plain environment ends up in pipeline parameters, compiled YAML, the job object and `kubectl
describe`: a key there is a leaked key. The config (`kubernetes.env`) and the BYO launcher
(`env`) refuse what this module flags (:func:`trainer.config.check_plain_env`).
"""

from __future__ import annotations

import re
from typing import Any

#: A URL's query parameter that carries a credential (a presigned S3 or GCS URL's signature, an
#: API key or token): the one pattern of :func:`trainer.errors.redact` and of the value check here.
QUERY_CREDENTIAL = (
    r"(?i)([?&](?:X-Amz-(?:Signature|Credential|Security-Token)|X-Goog-(?:Signature|Credential)|AWSAccessKeyId"
    r"|Signature|sig|token|access_token|api_key|apikey|key|password|secret)=)[^&#\s'\"]+"
)

#: Words of an environment variable's name that mark a credential (`HF_TOKEN`, `DB_PASSWORD`);
#: whole words, so `TOKENIZERS_PARALLELISM` stays allowed.
_CREDENTIAL_WORDS = frozenset(
    {
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "CREDENTIAL",
        "CREDENTIALS",
        "APIKEY",
        "AUTH",
        "AUTHORIZATION",
        "COOKIE",
    }
)
#: Parts of a name that mark a credential wherever they stand, within a word too (`PGPASSWORD`).
_CREDENTIAL_PARTS = ("SECRET", "PASSWORD", "PASSWD")
#: Last words of a name of two or more words that mark a credential.
_CREDENTIAL_LAST_WORDS = frozenset({"KEY", "PASS", "PWD", "PAT"})
_CREDENTIAL_PAIRS = frozenset(
    {("ACCESS", "KEY"), ("API", "KEY"), ("PRIVATE", "KEY"), ("SESSION", "KEY"), ("SSH", "KEY"), ("SIGNING", "KEY")}
)
#: A user and password before a host with no scheme (`app:S3cret@db.example.com:5432/x`, a DSN
#: without its `postgres://`; the password up to the last '@' of the word), at the start of a
#: value or after a space, '@', '=' or a quote. Not a port (`minio:9000/x@v1`), an image's digest
#: (`pytorch:24.01@sha256:...`), nor a URI whose part after ':' is a user or principal (`mailto:`,
#: Google IAM's `serviceAccount:sa@proj.iam.gserviceaccount.com`).
BARE_USERINFO = re.compile(
    r"""(?:^|(?<=[\s@='"(\[,]))"""
    r"""(?!(?:mailto|sip|sips|tel|xmpp|urn|news|data|magnet|serviceAccount|group|domain|principal|principalSet"""
    r"""|deleted):)[A-Za-z0-9._%+~-]+:(?!/)(?!\d+[/@])[^\s'"]*@(?!sha\d+:)(?=[A-Za-z0-9\[])"""
)
#: A JSON Web Token (three base64url parts, the first two JSON: `eyJ`).
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.")
#: Values that are credentials whatever the variable is called.
_CREDENTIAL_VALUES = (
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),  # an AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY( BLOCK)?-----"),  # PEM, OpenSSH, PGP
    # GitHub tokens: 36 letters and digits after the prefix (`gho_customer_value` is a column), or a
    # fine-grained one's long `github_pat_...`.
    re.compile(r"\b(ghp|gho|ghs|ghu|ghr)_[A-Za-z0-9]{36}\b|\bgithub_pat_[A-Za-z0-9_]{50,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face tokens
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    # OpenAI-style API keys: random letters of both cases and digits (`sk-hynix-memory-ml` is a name).
    re.compile(r"\bsk-(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Z])(?=[A-Za-z0-9_-]*[a-z])[A-Za-z0-9_-]{20,}"),
    re.compile(r"\b(sk|rk|pk)_live_[A-Za-z0-9]{16,}"),  # Stripe keys
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),  # GitLab personal access tokens
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),  # Google API keys
    re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}"),  # Google OAuth access tokens
    re.compile(r"\bnpm_[A-Za-z0-9]{36}"),  # npm tokens
    re.compile(r"hooks\.slack\.com/services/[A-Za-z0-9/]{20,}"),  # Slack webhooks
    re.compile(r"(?i)\b(AccountKey|SharedAccessKey|SharedAccessSignature)=[^;\s]{16,}"),  # Azure connection strings
    # A connection string's or mount option's password (`Server=db;Pwd=...`, libpq's `host=db
    # password=...`, `user=bob,password=...`).
    re.compile(r"(?i)(^|[;,\s])(password|passwd|pwd)\s*=\s*(?!\$[({])[^;,\s/]"),
    # A JSON document's credential member (`"password": ...`, an OAuth client's), not a reference
    # to one (`"${HF_TOKEN}"`); a Docker config's `"auth"`, which is base64 of `user:password`.
    re.compile(r'(?i)"(password|passwd|client_secret|access_token|refresh_token|api_?key)"\s*:\s*"[^"$]'),
    re.compile(r'"auth"\s*:\s*"[A-Za-z0-9+/]{8,}={0,2}"'),
    # An HTTP Authorization value: the scheme and one token of 16 or more characters with a digit or
    # a base64 sign in it, and nothing else (`Basic questions about colours` is text); in lower case
    # (a header as curl prints it), the token's base64 in both cases and with a digit
    # (`basic resnet50-imagenet-baseline` is text).
    re.compile(r"^\s*(Bearer|Basic|Token)\s+(?=\S*[0-9=+/])[A-Za-z0-9._~+/=-]{16,}\s*$"),
    re.compile(r"^\s*(?i:bearer|basic|token)\s+(?=\S*[0-9])(?=\S*[a-z])(?=\S*[A-Z])[A-Za-z0-9+/]{16,}={0,2}\s*$"),
    _JWT,
    re.compile(QUERY_CREDENTIAL),  # a signed or keyed URL
    BARE_USERINFO,
)


#: A host and its port (`minio:9000`), which a URL's '@' after its path does not make a user and password.
_HOST_PORT = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):\d{1,5}")
#: A URL's scheme and the slashes after it, as many as were written: `s3://`, a slash short
#: (`s3:/`), one too many (`s3:///`). What stands after them up to an '@' may be a user and password.
_SCHEME_SLASHES = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*:/+")


def split_userinfo(url: str) -> tuple[str, str, str] | None:
    """`(scheme and slashes, userinfo, the rest after its '@')` of the one URL `url` as the user
    wrote it, or None when it holds no user, password or token before its host. A password may
    hold '/', '@', a quote or a space, where a URL's parser would end the host; an '@' after the
    host (`s3://bucket/key@v1`) is a key's. A URL a slash short or long (`s3:/u:pw@b`,
    `s3:///u:pw@b`) or with no scheme (`u:pw@host`) has one where a ':' before the '@' says so:
    a refusal of such a URL must not print its password."""
    from urllib.parse import urlsplit

    scheme = _SCHEME_SLASHES.match(url)
    start = scheme.end() if scheme else len(url) - len(url.lstrip())
    before_at, at, after = url[start:].rpartition("@")
    if not at:
        return None
    in_netloc = False
    if scheme and scheme.group().endswith("://"):  # two slashes, as a URL's parser reads them
        try:
            in_netloc = "@" in urlsplit(url).netloc
        except ValueError:  # a malformed port or IPv6 host
            pass
    # A ':' (user:password), a space or a quote before the first '/' ends no bucket or host name;
    # `host:9000` is a port.
    head = before_at.split("/", 1)[0]
    marks = r"[:\s'\"]" if scheme else ":"  # with no scheme, a folder's name may hold a space or a quote
    if in_netloc or (re.search(marks, head) and not _HOST_PORT.fullmatch(head)):
        return url[:start], before_at, after
    return None


def url_has_userinfo(url: str) -> bool:
    """Whether the URL `url` holds a user, a password or a token before its host
    (`redis://:pw@db`, `https://token@host`, `s3://user:pass word/x@bucket`,
    :func:`split_userinfo`): the one test of a URL's credentials, for every URL kftrain takes and
    every plain value it checks."""
    return split_userinfo(url) is not None


#: Last words of a variable's name whose value is a place or a setting, not a secret, whatever
#: the words before say (`GOOGLE_APPLICATION_CREDENTIALS_FILE`, `SSH_AUTH_SOCK`, `SECRET_NAME`,
#: `TOKEN_LIMIT`, `AUTH_MODE`).
_SETTING_LAST_WORDS = frozenset(
    {"FILE", "PATH", "DIR", "SOCK", "SOCKET", "URL", "URI", "ENDPOINT", "HOST", "NAME", "LIMIT", "MODE", "TYPE"}
)
#: Values no credential is: a switch, or nothing.
_SWITCH_VALUES = frozenset({"", "true", "false", "yes", "no", "on", "off", "none", "null", "0", "1"})


def credential_name(name: str) -> bool:
    """Whether the variable `name` holds a credential by its name (`*SECRET*`, `*_TOKEN`,
    `*_PASSWORD`, `*_ACCESS_KEY*`, `*_KEY`, `*_PWD`, ...), unless its last word names a place or a
    setting (`*_FILE`, `*_PATH`, `*_NAME`, `*_MODE`, ...); or the name is a token itself."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    pairs = set(zip(words, words[1:], strict=False))
    # A name ending in KEY (`WANDB_KEY`, `OPENAI_KEY`), PASS, PWD or PAT holds one (`DB_PASS`,
    # `MYSQL_PWD`, `GITHUB_PAT`); one starting with it (`KEY_COLUMN`), or `PWD` alone, need not.
    last_word = len(words) > 1 and words[-1] in _CREDENTIAL_LAST_WORDS
    within = any(part in name.upper() for part in _CREDENTIAL_PARTS)  # `PGPASSWORD`, `AWS_SECRET_ACCESS_KEY`
    by_name = within or _CREDENTIAL_WORDS & set(words) or _CREDENTIAL_PAIRS & pairs or last_word
    place = len(words) > 1 and words[-1] in _SETTING_LAST_WORDS
    return bool(by_name and not place) or looks_like_credential(name)  # a token pasted as the name is one too


#: Mappings of a pod spec whose keys are free names and whose values free text, which a driver
#: reads (a CSI volume's `volumeAttributes`, a flexVolume's `options`): judged by name as well.
_FREE_MAPS = frozenset({"volumeAttributes", "options"})
#: Last words of a free map's key that say its value is a secret (`password`, `clientSecret`,
#: `sasToken`; not `secretName` or `secretProviderClass`, which name where one is kept).
_SECRET_KEY_LAST_WORDS = frozenset(
    {"PASSWORD", "PASSWD", "PASS", "PWD", "SECRET", "TOKEN", "KEY", "APIKEY", "CREDENTIAL", "CREDENTIALS", "AUTH"}
)


def _free_key_holds_secret(key: str) -> bool:
    """Whether a free map's key (camelCase or snake_case) ends in a word that names a secret."""
    words = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", key)
    return bool(words) and words[-1].upper() in _SECRET_KEY_LAST_WORDS


def credential_path(value: Any, path: str) -> tuple[str, str] | None:
    """`(where, what)` of the first key or text in `value` (a config field's value: a mapping, a
    list, a pod-spec fragment) that looks like a credential (:func:`looks_like_credential`; a key
    in any of its parts, `example.com/<token>`), or of a free map's entry whose name says it holds
    one (`volumeAttributes: {password: ...}`): `where` is its path below `path`, a credential in a
    key written `***`; `what` is `key` or `value`. None when nothing does."""
    if isinstance(value, dict):
        for key, item in value.items():
            shown = masked_parts(str(key))
            where = f"{path}.{shown}" if path else shown
            if shown != str(key):
                return where, "key"
            if path.rsplit(".", 1)[-1] in _FREE_MAPS and _free_key_holds_secret(str(key)) and item:
                return where, "value"
            if found := credential_path(item, where):
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if found := credential_path(item, f"{path}[{i}]"):
                return found
    elif looks_like_credential(value):
        return path, "value"
    return None


def _names_a_file(text: str) -> bool:
    """Whether `text` is a file's path (`/var/secrets/key.json`, `./sa.json`, `~/.aws/credentials`):
    from the root, home or the working folder, of two or more parts or with a file's extension
    (`/Summer2024` is no path)."""
    if not text.startswith(("/", "~/", "./", "../")) or any(c.isspace() for c in text):
        return False
    name = text.rstrip("/").rsplit("/", 1)
    return text.strip("/").count("/") >= 1 or "." in name[-1]


def credential_in(name: str, value: Any) -> str:
    """What of the variable `name=value` looks like a credential: `name` (:func:`credential_name`),
    unless the value is a path (`GOOGLE_APPLICATION_CREDENTIALS=/var/secrets/key.json` names a
    file) or a switch (`USE_AUTH=false`); `value` (:func:`looks_like_credential`: an AWS key id or
    secret key, a private key, a known token format, a URL with a password, a random-looking
    token); or '' when neither does."""
    if looks_like_credential(value):
        return "value"
    if credential_name(name):
        text = value.strip() if isinstance(value, str) else None
        harmless = text is not None and (text.lower() in _SWITCH_VALUES or _names_a_file(text))
        return "" if harmless and not looks_like_credential(name) else "name"
    return ""


#: An AWS secret access key's shape: 40 characters of base64 (letters of both cases, digits, / and +).
_AWS_SECRET_KEY = re.compile(r"(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])[A-Za-z0-9/+]{40}")
#: A run of base64 characters long enough to be a random token.
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9/+=]{31,}")


def _path_like(text: str) -> bool:
    """Whether `text` reads as a path (`/workspace/Src2/Lib`, `Runs2024/Model7Qx/ckpt9Step`): from
    the root, with an empty segment, or of three or more segments. A key's base64 holds a '/' in
    one place of 64."""
    return text.startswith("/") or "//" in text or text.count("/") >= 3


def _random_looking(text: str) -> bool:
    """Whether `text` reads as a random token, not a name: 32 or more base64 characters with both
    cases and three digits, whose kind of character (upper, lower, digit, sign) changes at least
    every other character (random text: about 2 in 3; a CamelCase name with a number: 1 in 3)."""
    if not _TOKEN_CHARS.fullmatch(text) or sum(c.isdigit() for c in text) < 3:
        return False
    if not (any(c.isupper() for c in text) and any(c.islower() for c in text)):
        return False
    return _changes(text) >= 0.45


def _changes(text: str) -> float:
    """How often the kind of character (upper, lower, digit, sign) changes from one to the next."""
    kinds = ["U" if c.isupper() else "L" if c.islower() else "D" if c.isdigit() else "S" for c in text]
    return sum(a != b for a, b in zip(kinds, kinds[1:], strict=False)) / max(len(text) - 1, 1)


def _aws_secret_key(text: str) -> bool:
    """An AWS secret access key's shape, and random (AWS's own example key changes kind at 0.41 of
    its characters; `AvgTransactionAmountLast90DaysNormalized`, a column, at 0.31)."""
    return bool(_AWS_SECRET_KEY.fullmatch(text)) and _changes(text) >= 0.36


def _known_credential(text: str) -> bool:
    """Whether `text` holds a credential of a known format (a key id, a token, a URL with a password)."""
    # Each URL to the end of its word; a value that is one URL, whole (its password may hold a space).
    urls = [text[m.start() :].split(None, 1)[0] for m in _URL_START.finditer(text)]
    if _URL_START.match(text):
        urls.append(text)
    return any(p.search(text) for p in _CREDENTIAL_VALUES) or any(_url_secret(u) for u in urls)


def _url_secret(url: str) -> bool:
    """Whether the URL `url` carries a secret before its host: a password (`user:pw@`), or a user
    that is a token by itself (`https://<token>@host`); a user name alone (`ssh://git@github.com`,
    pip's `git+ssh://git@...`) is none."""
    parts = split_userinfo(url)
    if parts is None:
        return False
    userinfo = parts[1]
    return ":" in userinfo.split("/", 1)[0] or looks_like_credential(userinfo)


#: Where a URL starts in a text (its scheme and at least one slash: `s3:/u:pw@b` is a URL a slash short).
_URL_START = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*:/")


def looks_like_credential(value: Any) -> bool:
    """Whether `value` looks like a credential by itself: text of a known key or token format, a URL
    with a password or a signature, an AWS secret key's shape, a random-looking token; or a list or
    mapping holding such text. An error message that would show it shows `***` instead (a token
    pasted where a name goes), while a mistyped name stays shown, to be fixed."""
    if isinstance(value, str):
        text = value.strip()
        if _known_credential(text):
            return True
        if _path_like(text):  # unless a secret key's 40 random characters, three of them '/'
            return _aws_secret_key(text) and _random_looking(text.replace("/", ""))
        return _aws_secret_key(text) or _random_looking(text)
    if isinstance(value, dict):
        return any(looks_like_credential(k) or looks_like_credential(v) for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return any(looks_like_credential(v) for v in value)
    return False


def masked_parts(text: str) -> str:
    """`text` as it may be printed: each of its parts that looks like a credential written `***`
    (a field path or a key holding a token the user wrote: `train.<token>`,
    `example.com/<token>`), or all of it when it is one credential (a JSON Web Token, dots and
    all)."""
    if not _JWT.search(text):
        masked = ".".join(_masked_part(part) for part in text.split("."))
        if masked != text and not looks_like_credential(masked):
            return masked
    return "***" if looks_like_credential(text) else text


def _masked_part(part: str) -> str:
    """A part of a dotted text with each of its '/'-separated parts that is a credential written
    `***` (`com/<token>`), or `***` when it is one only whole (an AWS secret key, slashes and all)."""
    masked = "/".join("***" if looks_like_credential(p) else p for p in part.split("/"))
    if masked != part and not looks_like_credential(masked):
        return masked
    return "***" if looks_like_credential(part) else part
