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
_CREDENTIAL_PAIRS = frozenset(
    {("ACCESS", "KEY"), ("API", "KEY"), ("PRIVATE", "KEY"), ("SESSION", "KEY"), ("SSH", "KEY"), ("SIGNING", "KEY")}
)
#: Values that are credentials whatever the variable is called.
_CREDENTIAL_VALUES = (
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),  # an AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\b(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}"),  # GitHub tokens
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face tokens
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),  # OpenAI-style API keys
    re.compile(r"^[a-z][a-z0-9+.-]*://[^/@:\s]+:[^/@\s]+@"),  # a URL with user:password
    # An HTTP Authorization value: the scheme and one token of 16 or more characters with a digit or
    # a base64 sign in it, and nothing else (`Basic questions about colours` is text).
    re.compile(r"^\s*(Bearer|Basic|Token)\s+(?=\S*[0-9=+/])[A-Za-z0-9._~+/=-]{16,}\s*$"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\."),  # a JSON Web Token
    re.compile(QUERY_CREDENTIAL),  # a signed or keyed URL
)


def credential_in(name: str, value: Any) -> str:
    """What of the variable `name=value` looks like a credential: `name` (`*SECRET*`, `*_TOKEN`,
    `*_PASSWORD`, `*_ACCESS_KEY*`, ...), `value` (:func:`looks_like_credential`: an AWS key id or
    secret key, a private key, a known token format, a URL with a password, a random-looking
    token), or '' when neither does."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    pairs = set(zip(words, words[1:], strict=False))
    # A name ending in KEY (`WANDB_KEY`, `OPENAI_KEY`) holds one; one starting with it (`KEY_COLUMN`) need not.
    last_key = len(words) > 1 and words[-1] == "KEY"
    if "SECRET" in name.upper() or _CREDENTIAL_WORDS & set(words) or _CREDENTIAL_PAIRS & pairs or last_key:
        return "name"
    if isinstance(value, str) and looks_like_credential(value):
        return "value"
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
    kinds = ["U" if c.isupper() else "L" if c.islower() else "D" if c.isdigit() else "S" for c in text]
    changes = sum(a != b for a, b in zip(kinds, kinds[1:], strict=False))
    return changes >= 0.45 * (len(text) - 1)


def _known_credential(text: str) -> bool:
    """Whether `text` holds a credential of a known format (a key id, a token, a URL with a password)."""
    return any(p.search(text) for p in _CREDENTIAL_VALUES)


def looks_like_credential(value: Any) -> bool:
    """Whether `value` looks like a credential by itself: text of a known key or token format, a URL
    with a password or a signature, an AWS secret key's shape, a random-looking token; or a list or
    mapping holding such text. An error message that would show it shows `***` instead (a token
    pasted where a name goes), while a mistyped name stays shown, to be fixed."""
    if isinstance(value, str):
        text = value.strip()
        if _known_credential(text):
            return True
        return not _path_like(text) and (bool(_AWS_SECRET_KEY.fullmatch(text)) or _random_looking(text))
    if isinstance(value, dict):
        return any(looks_like_credential(k) or looks_like_credential(v) for k, v in value.items())
    if isinstance(value, list | tuple | set):
        return any(looks_like_credential(v) for v in value)
    return False
