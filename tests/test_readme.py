"""The README is the front door: short, every link resolves, every example runs as written."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 250
    assert len(PAGES) >= 6  # the manual lives in docs/


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links or page.name != "README.md"
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.name}: {link} does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M)
            assert anchor in {slug(h) for h in headings}, f"{page.name}: no heading for #{anchor} in {path.name}"


def test_readme_yaml_is_the_example_it_names():
    (block,) = blocks(README, "yaml")
    assert yaml.safe_load(block) == yaml.safe_load((ROOT / "examples" / "custom_env.yaml").read_text())


def test_readme_commands_exist():
    from rollforge.cli.main import build_parser

    commands = set(build_parser()._subparsers._group_actions[0].choices)
    named = re.findall(r"\brollforge ([a-z][a-z-]+)", README.read_text())
    assert named and set(named) <= commands, set(named) - commands


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as in a terminal, where a bad exit shows


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(blocks(README, "python"))))
def test_readme_python_runs_as_written(index, tmp_path):
    """Each Python block, as a script in a copy of the repository's examples, with SIGINT at its
    default handler (as in a terminal): it runs and exits 0."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    script = tmp_path / "example.py"
    script.write_text(blocks(README, "python")[index])
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=_default_sigint,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), done.stderr[-3000:]
