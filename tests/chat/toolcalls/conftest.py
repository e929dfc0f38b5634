"""Helpers for the per-family parser tests: real chat templates from TRL's wheel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def trl_template():
    return _trl_template


@pytest.fixture
def rendered_reply():
    return _rendered_reply


def _trl_template(name: str) -> str:
    """The text of ``trl/chat_templates/NAME.jinja`` (skips when TRL is not installed)."""
    trl = pytest.importorskip("trl")
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


def _rendered_reply(template: str, assistant: dict[str, Any], **options: Any) -> str:
    """What ``template`` renders for ``assistant`` after one user turn: the text a model trained
    on the template generates for that message (its header included)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    user = {"role": "user", "content": "Go."}

    def render(messages: list[dict[str, Any]]) -> str:
        rendered = render_jinja_template(conversations=[messages], chat_template=template, **options)
        return rendered[0][0] if isinstance(rendered, tuple) else rendered[0]

    base, full = render([user]), render([user, assistant])
    assert full.startswith(base), "the template must render the user turn the same either way"
    return full[len(base) :]
