"""The HTTP server of the metrics port (a node's console and `/metrics`, a learner's `/metrics`):
wsgiref's threading server, as prometheus_client's own, serving from a daemon thread."""

from __future__ import annotations

import socketserver
import ssl
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer


class _Server(ThreadingWSGIServer):
    def server_bind(self) -> None:
        """As wsgiref's, without asking DNS for the listening address's name (`socket.getfqdn`, only for
        SERVER_NAME): on a host where no DNS server answers, that reverse lookup took 10 s, and a node's
        start with it (found when every node got a host of its own, `raftkv.dev.netns`)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
        self.setup_environ()


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # no line per request on stderr
        pass


def serve(app: Callable, host: str, port: int, https: ssl.SSLContext | None = None) -> _Server:
    """Listen now (an OSError when the port is taken) and serve from a daemon thread; HTTPS with the
    node's certificate when given ([tls] metrics = true: `Tls.https_context`)."""
    server = make_server(host, port, app, _Server, handler_class=_Quiet)
    if https is not None:
        server.socket = https.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="metrics http", daemon=True).start()
    return server
