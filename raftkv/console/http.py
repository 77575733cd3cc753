"""The metrics port's HTTP server: Prometheus' `/metrics`, and the console's pages, static files and
`/api/...` (docs/console.md §3). Read-only, served by `raftkv.core.http_server`; an API call is answered on the node's loop (`Console.answer`) and waited for at most ANSWER_SECONDS."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from importlib import resources
from typing import Callable, Iterable
from urllib.parse import parse_qs

from prometheus_client import make_wsgi_app

from raftkv.console.params import PAGES

ANSWER_SECONDS = 2.0
PAGE_PATHS = {"/"} | {f"/{page}" for page in PAGES}
STATIC = {"console.js": "text/javascript", "console.css": "text/css", "index.html": "text/html"}
READ_METHODS = ("GET", "HEAD")



def _static(name: str) -> bytes:
    return resources.files("raftkv.console").joinpath("static", name).read_bytes()


class ConsoleApp:
    def __init__(self, loop: asyncio.AbstractEventLoop, answer: Callable, metrics_app: Callable | None = None):
        self._loop = loop
        self._answer = answer  # async (page, query, authorization) -> (status, body)
        self._metrics = metrics_app or make_wsgi_app()
        self._files = {name: _static(name) for name in STATIC}

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in READ_METHODS:
            return self._send(start_response, 405, {"error": f"{method} is not allowed: the console is read-only"},
                              [("Allow", ", ".join(READ_METHODS))], head=False)
        head = method == "HEAD"
        if path in PAGE_PATHS:
            return self._file(start_response, "index.html", head)
        if path.startswith("/static/") and path[8:] in STATIC:
            return self._file(start_response, path[8:], head)
        if path.startswith("/api/"):
            query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
            status, body = self._call(path[5:], query, environ.get("HTTP_AUTHORIZATION", ""))
            return self._send(start_response, status, body, head=head)
        return self._send(start_response, 404, {"error": f"no such page: {path}"}, head=head)

    def _call(self, page: str, query: dict, authorization: str) -> tuple[int, dict]:
        future = asyncio.run_coroutine_threadsafe(self._answer(page, query, authorization), self._loop)
        try:
            return future.result(ANSWER_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return 504, {"error": f"this node did not answer within {ANSWER_SECONDS:.0f}s; it may be overloaded"}

    def _file(self, start_response: Callable, name: str, head: bool) -> list[bytes]:
        body = self._files[name]
        start_response("200 OK", [("Content-Type", f"{STATIC[name]}; charset=utf-8"),
                                  ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
        return [] if head else [body]

    @staticmethod
    def _send(start_response: Callable, status: int, body: dict, headers: list | None = None,
              head: bool = False) -> list[bytes]:
        data = json.dumps(body).encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
                  405: "Method Not Allowed", 504: "Gateway Timeout"}[status]
        start_response(f"{status} {reason}", [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                                              ("Content-Length", str(len(data)))] + (headers or []))
        return [] if head else [data]
