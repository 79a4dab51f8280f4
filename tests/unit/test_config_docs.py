"""The configuration reference is generated from the config docstrings, and the page is exactly it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from trainer.config import Config
from trainer.config_docs import BEGIN, END, PAGE, REGENERATE, generated_block, reference, render, sections, yaml_value

REPO = Path(__file__).resolve().parents[2]


def _leaf_fields(obj, prefix=""):
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaf_fields(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


def test_the_docs_page_holds_exactly_the_generated_reference():
    page = (REPO / PAGE).read_text()
    block = generated_block(page)
    assert block, (
        f"{PAGE} has lost its generated block: restore the {BEGIN!r} and {END!r} lines, then run `{REGENERATE}`"
    )
    expected = reference()
    assert block == expected, (
        f"{PAGE} differs from the field docstrings in trainer/config.py. Edit the docstrings (not the page), "
        f"then regenerate it with `{REGENERATE}` and commit the result."
    )


def test_every_field_has_exactly_one_row_in_declaration_order():
    rows = [r.name for _, _, fields in sections() for r in fields]
    assert sorted(rows) == sorted(_leaf_fields(Config()))
    assert len(rows) == len(set(rows))
    block = reference()
    for name in rows:
        assert block.count(f"| `{name}` |") == 1, name


def test_a_row_shows_the_type_the_yaml_default_and_the_docstring():
    rows = {r.name: r for _, _, fields in sections() for r in fields}
    block = reference()
    shm = rows["kubernetes.shm_size"]
    assert f"| `kubernetes.shm_size` | `str` | `2Gi` | {shm.doc} |" in block
    assert "| `model.hidden_sizes` | `list[int]` | `[128, 64]` |" in block
    assert "| `checkpoint.enabled` | `bool` | `true` |" in block
    assert "| `store.uri` | `str` | `''` |" in block
    assert "### `kubernetes.elastic`" in block
    assert yaml_value({"accesskey": "AWS_ACCESS_KEY_ID"}) == "{accesskey: AWS_ACCESS_KEY_ID}"


def test_a_pipe_in_a_docstring_does_not_break_the_table():
    assert "`<\\|endoftext\\|>`" in reference()


def test_a_field_without_a_docstring_is_an_error_naming_it():
    source = (REPO / "trainer" / "config.py").read_text()
    holed = re.sub(r'(    epochs: int = \d+\n)    """Passes over the training split[^\n]*"""\n', r"\1", source, count=1)
    assert holed != source
    with pytest.raises(ValueError, match=r"TrainConfig\.epochs has no docstring"):
        sections(holed)


def test_render_replaces_only_the_block():
    page = f"# Title\n\nprose before\n\n{BEGIN}\nstale\n{END}\n\nprose after\n"
    out = render(page)
    assert out.startswith("# Title\n\nprose before\n\n")
    assert out.endswith(f"{END}\n\nprose after\n")
    assert out == render(out)
