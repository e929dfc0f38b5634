"""The manual's pages say whole things: the agents page's example is a complete file that runs (as
the README's blocks are tested), the SFT page names every environment with an expert, and no
paragraph stops mid-sentence or is left over from an edit."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollforge.envs.library import ENV_NAMES, get_env_spec

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), flags=re.DOTALL | re.MULTILINE)


def paragraphs(path: Path) -> list[str]:
    """The page's paragraphs outside fenced code, headings and tables."""
    text = re.sub(r"^```.*?^```\n?", "\n", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    found = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return [p for p in found if not p.startswith(("#", "|", "<"))]


def test_the_agents_page_shows_the_example_file_whole():
    (example, *_) = blocks(DOCS / "agents.md", "python")
    assert example == (ROOT / "examples" / "agent_openai.py").read_text()
    assert "def run_tool(" in example and "TOOLS = [" in example  # what the page's fragment used undefined


@pytest.mark.slow
def test_the_agent_example_runs_as_written(tiny_model_dir, tmp_path):
    """As the README's blocks run: a script in a fresh directory, SIGINT at its default handler."""
    script = tmp_path / "agent_openai.py"
    shutil.copy(ROOT / "examples" / "agent_openai.py", script)
    done = subprocess.run(
        [sys.executable, str(script), str(tiny_model_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()]
    assert len(rows) == 3 and all(float(row[0]) in (0.0, 1.0) and int(row[1]) >= 1 for row in rows), done.stdout


def test_the_sft_page_names_every_environment_with_an_expert():
    text = " ".join((DOCS / "sft.md").read_text().split())
    named = re.search(r"\*\*Expert demonstrations\.\*\* (.*?) have an expert", text).group(1)
    assert set(re.findall(r"`(\w+)`", named)) == {name for name in ENV_NAMES if get_env_spec(name).expert}


def test_no_paragraph_of_the_manual_stops_mid_sentence():
    for page in sorted(DOCS.glob("*.md")):
        found = paragraphs(page)
        for paragraph, after in zip(found, [*found[1:], ""]):
            leads_a_list = re.match(r"[-*] |\d+\. ", after) is not None
            assert leads_a_list or re.search(r"[.:!?)`*]$", paragraph), f"{page.name}: ...{paragraph[-80:]!r}"


def test_the_rollouts_page_has_no_fragment_after_the_full_disk_paragraph():
    text = (DOCS / "rollouts.md").read_text()
    full_disk = text.index("keeps every episode written before it.")
    assert text[full_disk:].split("\n\n")[1].startswith("## Export to a dataset")
