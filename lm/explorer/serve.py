"""``lm view RUN --serve``: the run's page from a local HTTP server (the standard library's),
where typed text is posted back to ``/data`` and the maps come back as JSON. It listens on a
loopback address only and answers only requests addressed to it by a loopback name (a page of
another site that a DNS rebinding points at it is refused), holds the model in memory, writes
nothing (into the run or anywhere), and stops on Ctrl-C."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lm.config.errors import LMError
from lm.explorer.gather import prompt_ids, run_page, task_examples
from lm.explorer.make import kind_of, run_name
from lm.explorer.page import render
from lm.runs.load import LoadedRun, load_run

MAX_BODY = 2**20
"""The longest text a request may post, in bytes: far past any prompt a page can show."""


class Served:
    """One run, its name, its task examples and first page (gathered once), the ``Host``
    headers it answers, and a lock: one request at a time uses the model."""

    def __init__(self, run: LoadedRun, name: str):
        self.run, self.name = run, name
        self.task: list[dict[str, Any]] | None = None
        self.page = b""
        self.hosts: set[str] = set()
        self.lock = threading.Lock()
        self.stopped = False

    def start(self, prompt: str, address: tuple[str, int]) -> None:
        names = {"127.0.0.1", "localhost", "[::1]", netloc(address).rsplit(":", 1)[0]}
        # A browser leaves the port out of Host for port 80 alone: elsewhere it must be there.
        self.hosts = {f"{name}:{address[1]}" for name in names} | (
            names if address[1] == 80 else set()
        )
        self.task = task_examples(self.run)
        self.page = render(self.data(prompt), serve=True).encode()

    def data(self, prompt: str) -> dict[str, Any]:
        with self.lock:
            if self.stopped:
                raise LMError("lm view is stopping")
            # No earlier checkpoint (steps=[]): each typed text is read by the newest alone.
            return run_page(self.run, prompt, self.name, self.task, steps=[])

    def stop(self) -> None:
        """Wait for the request inside the model, if any, and let no other in. The threads still
        waiting for the lock stay there, in no library's code, and end with the process; one
        left inside torch's C++ would be unwound by the interpreter's exit and abort it."""
        self.lock.acquire()
        self.stopped = True


class Handler(BaseHTTPRequestHandler):
    """A request to the server of one :class:`Served` run (``self.server.served``)."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if not self._for_us():
            return
        if url.path == "/":
            self._send(200, "text/html; charset=utf-8", self.server.served.page)
        elif url.path == "/data":
            self._answer(parse_qs(url.query, keep_blank_values=True).get("prompt", [""])[0])
        else:
            self.send_error(404, f"{url.path}: no such page (/ or /data)")

    def do_POST(self) -> None:
        """``/data`` with the text as the body: no length limit of an address applies."""
        if not self._for_us():
            return
        if urlsplit(self.path).path != "/data":
            self.send_error(404, f"{urlsplit(self.path).path}: no such place to post (/data)")
            return
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.send_error(411, "the text: no Content-Length")
            return
        if int(length) > MAX_BODY:
            self.send_error(413, f"the text: over {MAX_BODY} bytes")
            return
        try:
            self._answer(self.rfile.read(int(length)).decode("utf-8"))
        except UnicodeDecodeError as e:
            self.send_error(400, f"the text is not UTF-8 (byte {e.start})")

    def _for_us(self) -> bool:
        """A request named for this server by a loopback name, the port included."""
        host, port = (self.headers.get("Host") or "").lower(), self.server.server_address[1]
        if host in self.server.served.hosts:
            return True
        self.send_error(403, f"Host {host!r}: not 127.0.0.1, localhost or [::1]:{port}")
        return False

    def _answer(self, prompt: str) -> None:
        """The maps, or why the text has none: an answer too (200), not a failed request."""
        try:
            answer = self.server.served.data(prompt)
        except LMError as e:
            answer = {"error": str(e)}
        self._send(200, "application/json; charset=utf-8", _json(answer))

    def send_error(self, code: int, message: str | None = None, explain: str = "") -> None:
        """Every error as ``{"error": one line}``, which the page shows whatever the status
        (the standard library's own, such as 414 for a long address, included)."""
        self.close_connection = True  # what is left of the request goes unread
        line = message or HTTPStatus(code).phrase
        self._send(code, "application/json; charset=utf-8", _json({"error": line}))

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request per keystroke: the terminal keeps only lm's lines


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def netloc(address: tuple) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets)."""
    host = address[0]
    return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"


def loopback(host: str) -> tuple[socket.AddressFamily, str]:
    """``--host``'s address family and address, which must be this machine's loopback (IPv4
    first, as ``localhost`` names both): no other machine may reach the model or the text."""
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise LMError(f"--host {host}: cannot listen there ({e})") from None
    addresses = sorted((family != socket.AF_INET, family, info[0]) for family, *_, info in found)
    if not all(ipaddress.ip_address(address).is_loopback for *_, address in addresses):
        raise LMError(
            f"--host {host}: not a loopback address; lm view serves this machine alone "
            "(127.0.0.1, ::1 or localhost)"
        )
    return addresses[0][1], addresses[0][2]


class Server(ThreadingHTTPServer):
    """The threading server of ``served``, on IPv4 or IPv6; a request's thread never keeps the
    process up."""

    daemon_threads = True

    def __init__(self, family: socket.AddressFamily, address: tuple[str, int], served: Served):
        self.address_family, self.served = family, served
        super().__init__(address, Handler)


def listen(host: str, port: int, served: Served) -> Server:
    """The server bound to ``host:port``; one line when the port is taken or the host is not
    this machine's loopback."""
    family, address = loopback(host)
    try:
        return Server(family, (address, port), served)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise LMError(
                f"--port {port}: already in use on {host}; choose another, or --port 0 for any "
                "free one"
            ) from None
        raise LMError(f"--host {host}: cannot listen there ({e.strerror or e})") from None


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
    loopback(host)  # a bad host, prompt or port is said before the slow work
    served = Served(load_run(path, device=device), run_name(path))
    prompt_ids(served.run, prompt)
    server = listen(host, port, served)
    try:
        served.start(prompt, server.server_address)
        url = f"http://{netloc(server.server_address)}/"
        print(url, flush=True)
        print(f"lm: serving {path} on {url} (Ctrl-C stops)", file=sys.stderr)
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()  # no new connection from here on
        try:
            served.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: leave at once, the thread in torch untouched
            print("lm: stopped while a request was inside the model", file=sys.stderr, flush=True)
            os._exit(
                130
            )  # the interpreter's exit would unwind that thread and abort; nothing to save
        print("lm: stopped", file=sys.stderr)
    finally:
        server.server_close()
