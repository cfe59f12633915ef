"""``lm view RUN --serve``: the run's page from a local HTTP server (the standard library's),
where typed text is sent back to ``/data`` and the maps come back as JSON. It binds to loopback
unless told otherwise, holds the model in memory, writes nothing (into the run or anywhere), and
stops on Ctrl-C."""

from __future__ import annotations

import errno
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lm.config.errors import LMError
from lm.explorer.gather import prompt_ids, run_page, task_examples
from lm.explorer.make import kind_of, run_name
from lm.explorer.page import render
from lm.runs.load import LoadedRun, load_run


class Served:
    """One run, its name, its task examples and first page (gathered once), and a lock: one
    request at a time uses the model."""

    def __init__(self, run: LoadedRun, name: str):
        self.run, self.name = run, name
        self.task: list[dict[str, Any]] | None = None
        self.page = b""
        self.lock = threading.Lock()

    def start(self, prompt: str) -> None:
        self.task = task_examples(self.run)
        self.page = render(self.data(prompt), serve=True).encode()

    def data(self, prompt: str) -> dict[str, Any]:
        with self.lock:
            return run_page(self.run, prompt, self.name, self.task)


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/":
                self._send(200, "text/html; charset=utf-8", served.page)
            elif url.path == "/data":
                prompt = parse_qs(url.query, keep_blank_values=True).get("prompt", [""])[0]
                try:
                    answer = served.data(prompt)
                except LMError as e:
                    answer = {"error": str(e)}
                body = json.dumps(answer, ensure_ascii=False).encode()
                self._send(200, "application/json; charset=utf-8", body)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a request per keystroke: the terminal keeps only lm's lines

    return Handler


def listen(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """The server bound to ``host:port``; one line when the port is taken or the host is not
    this machine's."""
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise LMError(
                f"--port {port}: already in use on {host}; choose another, or --port 0 for any "
                "free one"
            ) from None
        raise LMError(f"--host {host}: cannot listen there ({e.strerror or e})") from None
    server.daemon_threads = True
    return server


def serve(
    path: str | Path,
    prompt: str | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "cpu",
) -> None:
    """Serve a run's page until Ctrl-C; the first line on standard output is its address."""
    path = Path(path)
    if kind_of(path) != "run":
        raise LMError(f"--serve: serves one run; {path} is a comparison (write its page instead)")
    if prompt is None:
        raise LMError("--prompt: --serve starts from a text; give one")
    served = Served(load_run(path, device=device), run_name(path))
    prompt_ids(served.run, prompt)  # a bad prompt or port is said before the slow work
    server = listen(host, port, _handler(served))
    try:
        served.start(prompt)
    except BaseException:
        server.server_close()
        raise
    where = server.server_address
    print(f"http://{where[0]}:{where[1]}/", flush=True)
    print(f"lm: serving {path} on http://{where[0]}:{where[1]}/ (Ctrl-C stops)", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("lm: stopped", file=sys.stderr)
    finally:
        server.server_close()
