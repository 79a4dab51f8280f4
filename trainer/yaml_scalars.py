"""What YAML made of a plain scalar where another type was meant, in one user's words.

The config, and the pod-spec settings inside it (`kubernetes.tolerations`, `kubernetes.volumes`,
...), are read with YAML 1.2's core schema (trainer/config.py): `true`, `8` and `2026-01-01`
unquoted are a boolean, a number and a date, and `0400` is text, not octal. Every check that
wants text, or a number, says so in the same words.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

#: Text a kubectl user writes as an octal number (`defaultMode: 0400`), which YAML 1.2 keeps as text.
_LEADING_ZERO = re.compile(r"0[0-7]+")


def unquoted_problem(value: Any, show_value: bool = True) -> str | None:
    """Why `value`, where text was meant, is YAML's (or a JSON parameter's) reading of unquoted
    text (a boolean, a number, a date), with the text to write instead (`quote it` where the value
    is not shown); None for anything else."""
    if isinstance(value, bool):
        kind, written = "boolean", str(value).lower()
    elif isinstance(value, datetime.date):
        kind, written = "date", value.isoformat()
    elif isinstance(value, int):
        kind, written = "number", str(value)
    elif isinstance(value, float):
        kind, written = "number", ""  # `1.20` reads as 1.2, `1e9` as 1000000000.0: the text written is gone
    else:
        return None
    # Double quotes: the fix reads the same in a YAML file and in a KFP parameter's JSON.
    fix = "quote it" if not show_value else f'write "{written}"' if written else "quote it as written"
    return f"must be a string (unquoted, YAML and JSON read it as a {kind}: {fix})"


def octal_text_problem(value: Any) -> str | None:
    """Why text such as `0400`, where a number was meant, is not one (kubectl's YAML 1.1 reads it
    as octal, YAML 1.2 as text), with what to write; None for anything else."""
    if isinstance(value, str) and _LEADING_ZERO.fullmatch(value):
        return (
            f"must be a number: {value!r} is text here (YAML 1.2 reads no octal in a leading 0); "
            f"write 0o{value.lstrip('0')} or {int(value, 8)}"
        )
    return None
