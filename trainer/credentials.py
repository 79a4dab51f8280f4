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
    `*_PASSWORD`, `*_ACCESS_KEY*`, ...), `value` (an AWS key id, a private key, a known token
    format, a URL with a password), or '' when neither does."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    pairs = set(zip(words, words[1:], strict=False))
    # A name ending in KEY (`WANDB_KEY`, `OPENAI_KEY`) holds one; one starting with it (`KEY_COLUMN`) need not.
    last_key = len(words) > 1 and words[-1] == "KEY"
    if "SECRET" in name.upper() or _CREDENTIAL_WORDS & set(words) or _CREDENTIAL_PAIRS & pairs or last_key:
        return "name"
    if isinstance(value, str) and any(p.search(value) for p in _CREDENTIAL_VALUES):
        return "value"
    return ""


#: A long run of letters, digits and base64 signs, without the separators of names (`-`, `_`, `.`),
#: mixing upper case, lower case and digits (an AWS secret access key, a random token).
_TOKEN_LIKE = re.compile(r"(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])[A-Za-z0-9/+=]{20,}")


def looks_like_credential(value: Any) -> bool:
    """Whether `value` (text) looks like a credential by itself: a known key or token format, a
    URL with a password or a signature, or a long random-looking token. An error message that
    would show such a value shows `***` instead (a token pasted where a name goes)."""
    if not isinstance(value, str):
        return False
    return any(p.search(value) for p in _CREDENTIAL_VALUES) or bool(_TOKEN_LIKE.fullmatch(value.strip()))
