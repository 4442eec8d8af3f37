"""A subscriber's HTTP endpoint on loopback for tests: records every request and answers from a
script (the `receiver` fixture)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A local HTTP server: records every request and answers each path from a script of
    (status, headers) pairs, then 200."""

    port: int = 0
    requests: list[ReceivedRequest] = field(default_factory=list)
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, path: str, *responses: tuple[int, dict[str, str]]) -> None:
        self.script.setdefault(path, []).extend(responses)

    def next_answer(self, path: str) -> tuple[int, dict[str, str]]:
        queue = self.script.get(path) or []
        return queue.pop(0) if queue else (200, {})


def _handler_for(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            receiver.requests.append(
                ReceivedRequest(
                    method=self.command,
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
            )
            status, headers = receiver.next_answer(self.path)
            text = b"ok" if status < 400 else b"nope"
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        do_POST = _handle
        do_GET = _handle

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A subscriber's endpoint on 127.0.0.1 (a loopback address: subscriptions reach it only
    with `allow_private_network`)."""
    receiver = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(receiver))
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
