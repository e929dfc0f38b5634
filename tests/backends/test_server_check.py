"""The once-at-start reachability check of OpenAI-compatible servers (``check_server``)."""

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from rollforge.backends.config import BackendConfig
from rollforge.backends.openai_compat import check_server
from rollforge.backends.opening import open_backend
from rollforge.errors import BackendError
from rollforge.testing import free_port


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_any_answer_counts_and_silence_is_one_clear_error(tiny_model_dir):
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=f"^no OpenAI-compatible server answers at {down} \\(ConnectError"):
        check_server(down, timeout=2)
    server = HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        check_server(url + "/v1/")  # a 404 is an answer: a server is up
        open_backend(BackendConfig(kind="openai", model=str(tiny_model_dir), base_url=url, check_reachable=True))
        with pytest.raises(BackendError, match=f"answers at {down}"):  # each replica is checked
            open_backend(
                BackendConfig(kind="openai", model=str(tiny_model_dir), base_url=f"{url},{down}", check_reachable=True)
            )
    finally:
        server.shutdown()
        server.server_close()
