"""trainer/yaml_scalars.py: what YAML made of a plain scalar where text or a number was meant,
with what to write instead; the config's fields and the pod-spec settings' schema check say it alike."""

from __future__ import annotations

import datetime

import pytest

from trainer.yaml_scalars import octal_text_problem, unquoted_problem


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (True, 'must be a string (unquoted, YAML and JSON read it as a boolean: write "true")'),
        (False, 'must be a string (unquoted, YAML and JSON read it as a boolean: write "false")'),
        (8, 'must be a string (unquoted, YAML and JSON read it as a number: write "8")'),
        # A float's text is gone (`1.20` reads as 1.2): the fix must not name another (was: write "1.2").
        (0.5, "must be a string (unquoted, YAML and JSON read it as a number: quote it as written)"),
        (1.2, "must be a string (unquoted, YAML and JSON read it as a number: quote it as written)"),
        (datetime.date(2026, 1, 2), 'must be a string (unquoted, YAML and JSON read it as a date: write "2026-01-02")'),
        ("text", None),
        (None, None),
        ([1], None),
    ],
)
def test_unquoted_text_names_the_type_yaml_read_and_the_text_to_write(value, said):
    assert unquoted_problem(value) == said


def test_a_value_not_shown_is_only_asked_to_be_quoted():
    assert (
        unquoted_problem(12345678, show_value=False)
        == "must be a string (unquoted, YAML and JSON read it as a number: quote it)"
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0400", "must be a number: '0400' is text here (YAML 1.2 reads no octal in a leading 0); write 0o400 or 256"),
        ("0644", "must be a number: '0644' is text here (YAML 1.2 reads no octal in a leading 0); write 0o644 or 420"),
        ("0", None),  # YAML reads it as the number
        ("0800", None),  # no octal number: the schema's own words
        ("400", None),
        (256, None),
    ],
)
def test_kubectl_s_octal_is_named_with_both_numbers_to_write(value, said):
    assert octal_text_problem(value) == said
