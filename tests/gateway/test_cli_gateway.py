"""``rollforge gateway`` as a user runs it: the tiny model on the HF backend, a free port on
127.0.0.1, one request through the OpenAI SDK, the session's trajectory, a clean stop on SIGINT."""

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import openai
import pytest


@pytest.mark.timeout(180)
def test_the_gateway_command_serves_records_and_stops(tiny_model_dir, tmp_path):
    record = tmp_path / "sessions.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rollforge.cli.main",
            "gateway",
            "--model",
            str(tiny_model_dir),
            "--port",
            "0",
            "--max-new-tokens",
            "5",
            "--seed",
            "1",
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline()
        base = re.search(r"on (http://127\.0\.0\.1:\d+)/v1;", line)
        assert base, line + process.stderr.read() if process.poll() is not None else line
        api = openai.OpenAI(base_url=f"{base.group(1)}/sessions/cli/v1", api_key="unused", max_retries=0, timeout=60)
        reply = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 5
        trajectory = httpx.get(f"{base.group(1)}/sessions/cli/trajectory", timeout=30).json()
        assert trajectory["session"] == "cli" and trajectory["turns"] == 1
        assert sum(trajectory["loss_mask"]) == reply.usage.completion_tokens
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    [saved] = [json.loads(line) for line in record.read_text().splitlines()]
    assert saved["token_ids"] == trajectory["token_ids"]
