"""Small edges of the command line, each a line: a misspelled flag gets the nearest one, a Python
file is not a chat template, and ``env serve --port 0`` means a free port (as ``gateway --port 0``)."""

from __future__ import annotations

import pytest

from rollforge.cli.main import main


def test_a_misspelled_flag_gets_the_nearest_flag_of_its_command(capsys):
    assert main(["rollout", "--env", "echo", "--episods", "3", "--out", "runs/x"]) == 2
    assert capsys.readouterr().err == (
        "rollforge rollout: error: unrecognized arguments: --episods 3; did you mean '--episodes'? "
        "(see rollforge rollout --help)\n"
    )
    assert main(["train", "c.yaml", "--resmue"]) == 2
    assert "did you mean '--resume'?" in capsys.readouterr().err
    assert main(["view", "run", "--zzzzzz"]) == 2  # nothing near: the plain message
    assert capsys.readouterr().err == "rollforge: error: unrecognized arguments: --zzzzzz (see rollforge --help)\n"


@pytest.mark.parametrize(
    "name, text, why",
    [
        ("env.py", "class Counter:\n    pass\n", "a .py file"),
        ("notes.txt", "hello {name}\n", "no Jinja {{ ... }} in it"),
        ("weights.bin", b"\x80\x81\xfe\xff", "not UTF-8 text"),
    ],
)
def test_a_file_that_is_not_a_chat_template_says_so(tmp_path, capsys, name, text, why):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert main(["check-template", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"rollforge: error: {str(path)!r} is not a chat template ({why}): expected a Jinja chat template (.jinja), "
        "a tokenizer_config.json with 'chat_template', or a model\n"
    )


def test_env_serve_port_0_serves_on_a_free_port(monkeypatch):
    import rollforge.envs.openenv.serve as served

    calls = []
    monkeypatch.setattr(served, "serve", lambda name, **where: calls.append((name, where)))
    assert main(["env", "serve", "echo", "--port", "0"]) == 0
    ((name, where),) = calls
    assert name == "echo" and where["host"] == "127.0.0.1" and 1024 <= where["port"] < 65536
    assert main(["env", "serve", "echo", "--port", "8123"]) == 0 and calls[-1][1]["port"] == 8123
    assert main(["env", "serve", "echo", "--port", "-1"]) == 2


def test_env_serve_on_a_host_that_is_not_this_machine_says_so_in_one_line(monkeypatch, capsys):
    import rollforge.envs.openenv.serve as served

    monkeypatch.setattr(served, "serve", lambda name, **where: pytest.fail("served on a host it cannot bind"))
    assert main(["env", "serve", "echo", "--port", "0", "--host", "192.0.2.1"]) == 2  # TEST-NET-1: never local
    err = capsys.readouterr().err
    assert err.startswith("rollforge: error: --host '192.0.2.1': cannot bind a port there (") and err.count("\n") == 1
