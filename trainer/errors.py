"""kftrain's one error path: the base of every error the user can fix, the one line a failed
step ends with, and the redaction of every URL that is printed.

Every error kftrain raises on purpose (a bad config value, an unreachable store, data it cannot
train on, a failed job) derives from :class:`KftrainError`; its message names the field or the
object and says what to do. Where a pipeline step fails with one, the step's last line is
:func:`error_line` — ``kftrain-error: <step>: <message>`` — after the traceback (which the KFP
step log keeps); `kftrain run --local` recognises the marker (:func:`parse_error_line`) and makes
that line its own last word. Any other exception is a bug: its traceback stays in the log.
"""

from __future__ import annotations

import os
import re

from trainer.credentials import BARE_USERINFO, QUERY_CREDENTIAL, credential_name, masked_parts, split_userinfo
from trainer.credentials import url_has_userinfo as has_userinfo  # noqa: F401 (the one check, for callers)

#: Marks the one line a failed step ends with (see the module docstring).
ERROR_MARKER = "kftrain-error: "
#: The trainer's own failure lines inside a replica's log (a failed job carries them).
REPLICA_FAILURE = "training failed: "
#: The userinfo of a URL (`scheme://user:password@host`; a slash short or long, `s3:/u:pw@b`, as
#: well, where a ':' marks a password), wherever it appears in a text. A
#: password may hold an unencoded '/' (AWS secret keys do) or '@': after a ':' anything up to the
#: last '@' of the word counts, so `http://host:9000/a@b` is redacted too (a lost path beats a
#: printed secret).
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*:/{1,3})(?P<userinfo>[^/@\s'\":]*:[^\s'\"]*|(?<=://)[^/@\s'\"]+)@"
)
#: The same with quotes in the userinfo (a password may hold one): a second pass, before any '/'.
_QUOTED_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*:/{1,3})(?P<userinfo>[^\s/@]*['\"][^\s/]*)@")
#: A URL quoted as Python's repr() quotes it in a message (`{uri!r}`), whose userinfo holds a
#: space (before any '/': after one it is a key's): up to the last '@' before the closing quote
#: (one pattern per quote character).
_SPACED_USERINFO = tuple(
    re.compile(rf"(?P<scheme>{q}[A-Za-z][A-Za-z0-9+.-]*:/{{1,3}})(?=[^{q}\n/]*\s[^{q}\n]*@)[^{q}\n]*@") for q in "'\""
)


#: A credential in a URL's query (`?X-Amz-Signature=...`, `&token=...`): its value is written `***`.
_QUERY_CREDENTIAL = re.compile(QUERY_CREDENTIAL)
#: A word long enough to be a key or a token (the characters of base64, paths and known token formats).
_WORD = re.compile(r"[A-Za-z0-9_./+~-]{16,}")


class KftrainError(Exception):
    """An error the user can fix: the message names the field or the object and what to do."""


def redact(text: str) -> str:
    """`text` with the userinfo of every URL in it (`http://user:secret@host`) written `***`, the
    value of each query parameter that carries a credential (`?X-Amz-Signature=...`), and every
    word that is a credential by itself (:func:`trainer.credentials.looks_like_credential`: a key
    id, a token, an AWS secret key's shape, a random-looking token), wherever a user pasted it.

    Everything kftrain prints that may hold a URL or a pasted value goes through here: endpoints,
    store URIs, the resume command, error messages, the full log of a local run."""
    for secret in _environment_secrets():
        text = text.replace(secret, "***")
    for spaced in _SPACED_USERINFO:
        text = spaced.sub(r"\g<scheme>***@", text)
    text = _QUOTED_USERINFO.sub(r"\g<scheme>***@", _USERINFO.sub(r"\g<scheme>***@", text))
    text = BARE_USERINFO.sub("***@", text)  # a DSN's password, with no scheme before it
    text = _QUERY_CREDENTIAL.sub(r"\1***", text)
    return _WORD.sub(_masked, text)


#: Values shorter than this are not masked as text: a short one (`test`, `password`) would take
#: that word out of every message.
_SHORTEST_SECRET = 10
#: (the environment's variable names when they were found, the names of its credential variables).
_secret_names: tuple[tuple[str, ...] | None, tuple[str, ...]] = (None, ())


def _environment_secrets() -> list[str]:
    """The values of the environment's credential variables (by name: `KFP_TOKEN`,
    `AWS_SECRET_ACCESS_KEY`, `HF_TOKEN`, ...; :func:`trainer.credentials.credential_name`), longest
    first: :func:`redact` masks each wherever it appears, whatever it looks like (a plain
    `MyToken42` has no shape the patterns know, and an API's error page may echo it back). A
    value that is a path (`KUBEFLOW_TRAINER_SERVER_TOKEN`, `GOOGLE_APPLICATION_CREDENTIALS` name
    files) is a place, named in errors. The names are found again when the environment's names
    change (not its size alone: one variable unset and a token set kept the size, and the token
    went unmasked); their values are read on every call (redact runs on each line of a run's log)."""
    global _secret_names
    present = tuple(os.environ)
    if present != _secret_names[0]:
        _secret_names = (present, tuple(name for name in present if credential_name(name)))
    values = {os.environ.get(name) or "" for name in _secret_names[1]}
    return sorted(
        (v for v in values if len(v) >= _SHORTEST_SECRET and not v.startswith(("/", "~", "./", "../"))),
        key=len,
        reverse=True,
    )


def _masked(word: re.Match[str]) -> str:
    """The word, its credential written `***` (a sentence's full stop or a dash around it kept; in
    a field path, each part that is one: :func:`trainer.credentials.masked_parts`)."""
    text = word.group()
    core = text.strip("._-~")
    return text.replace(core, masked_parts(core)) if core else text


def redact_url(url: str) -> str:
    """`url`, one URL as the user gave it (a store URI, an endpoint), as it may be printed: its
    userinfo written `***` whatever it holds (in free text :func:`redact` finds one only up to a
    space or a quote, which a password may hold; a URL a slash short or with no scheme not at
    all), then :func:`redact`."""
    parts = split_userinfo(url)
    if parts is not None:
        url = f"{parts[0]}***@{parts[2]}"
    return redact(url)


def yaml_problem(exc: BaseException) -> str:
    """What a YAML parser's error found and where (line and column), without the lines around it
    that PyYAML's own message quotes: a config's or a kubeconfig's line may be a password or a
    token. Any other exception: its message, on one line."""
    parts = []
    for what, mark in (("context", "context_mark"), ("problem", "problem_mark")):
        text, at = getattr(exc, what, None), getattr(exc, mark, None)
        if text:
            # The parser quotes the tag or alias it read (`!Summer2024` is a password unquoted); what
            # else it quotes (a character, a token's kind: `',' or ']'`) is kept.
            text = str(text)
            if re.search(r"\b(tag|alias|anchor)\b", text):
                text = _YAML_QUOTED.sub("(the text there)", text)
            parts.append(f"{text} (line {at.line + 1}, column {at.column + 1})" if at is not None else text)
    if any("for the tag" in part for part in parts):
        parts.append("a value starting with '!' is read as a YAML tag: quote it")
    return ": ".join(parts) or " ".join(str(exc).split()) or type(exc).__name__


#: A quoted word of three or more characters in a YAML parser's message.
_YAML_QUOTED = re.compile(r"'[^'\n]{3,}'")


def first_and_more(items: list[str], unit: str = "") -> str:
    """`items`' first and how many more there are, for a message naming one of many:
    `model-00001.safetensors and 2 more safetensors files`."""
    rest = len(items) - 1
    return items[0] + (f" and {rest} more" + (f" {unit}" if unit else "") if rest > 0 else "")


def one_line(exc: BaseException) -> str:
    """The message of `exc` as one line: a multi-line message (a failed job and its replicas'
    last log lines) keeps its first line and the trainer's own failure line, if any. Its notes
    (`add_note`: what went wrong on the way out, a job that could not be cancelled) follow it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    notes = [note.strip().splitlines()[0] for note in getattr(exc, "__notes__", None) or [] if note.strip()]
    if not lines:
        return redact("; ".join([type(exc).__name__, *notes]))
    first, rest = lines[0], lines[1:]
    if rest:
        # "Its last log lines:" would announce lines that the one line leaves out.
        first = re.sub(r"\.?\s*[Ii]ts last log lines:?$", "", first).rstrip(" .:;")
        reported = [line.split(REPLICA_FAILURE, 1)[1].strip() for line in rest if REPLICA_FAILURE in line]
        first = f"{first}: {reported[0]}" if reported else f"{first} (the lines above it in the log say more)"
    return redact("; ".join([first, *notes]))


def error_line(step: str, exc: BaseException) -> str:
    """The one line a step failed by `exc` ends with: ``kftrain-error: <step>: <message>``."""
    return f"{ERROR_MARKER}{step}: {one_line(exc)}"


def parse_error_line(line: str) -> tuple[str, str] | None:
    """`(step, message)` from a line :func:`error_line` wrote (leading blanks allowed), else None."""
    text = line.strip()
    if not text.startswith(ERROR_MARKER):
        return None
    step, sep, message = text[len(ERROR_MARKER) :].partition(": ")
    if not sep or not step or " " in step or not message.strip():
        return None
    return step, message.strip()
