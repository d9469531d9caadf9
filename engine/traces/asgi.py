"""An ASGI app (Starlette) served by uvicorn on a thread of this process: the HTTP stack
`collect`'s receiver and the gateway share, so one process can serve both.

The socket is bound on construction (a port in use is one TraceError line, and port 0's
free port is known at once); `start()` serves and returns once uvicorn is listening;
`close()` stops accepting, lets requests in progress finish, and returns."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from engine.traces import TraceError

KEEP_ALIVE = 120  # seconds an idle kept-alive connection stays open (exporters reuse theirs)


def bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; TraceError saying why when it cannot be."""
    # IPPROTO_TCP named, as getaddrinfo names it: asyncio turns Nagle's algorithm off only
    # on sockets that say so, and with it on a reply waits 40 ms for a delayed ACK
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                         socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds at once
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        in_use = exc.errno in (98, 48, 10048)  # EADDRINUSE: Linux, macOS, Windows
        why = "the port is in use (--port to choose another)" if in_use else \
            f"{exc.strerror or exc} (--host to choose another address)"
        raise TraceError(f"cannot listen on {host}:{port}: {why}") from None
    return sock


class Served:
    """`app` on host:port, bound now, served from `start()` until `close()`."""

    def __init__(self, app: Any, host: str, port: int, name: str = "http",
                 lifespan: str = "off") -> None:
        import uvicorn

        self.socket = bound_socket(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        self.name = name
        config = uvicorn.Config(app, log_level="error", access_log=False, lifespan=lifespan,
                                timeout_keep_alive=KEEP_ALIVE)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._failed: list[BaseException] = []

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> threading.Thread:
        def serve() -> None:
            try:
                self.server.run(sockets=[self.socket])
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._failed.append(exc)

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        while not self.server.started:
            if self._failed or not self._thread.is_alive():
                why = self._failed[0] if self._failed else "it stopped"
                raise TraceError(f"cannot serve on {self.url}: {why}")
            time.sleep(0.005)
        return self._thread

    def close(self) -> None:
        if self._thread is not None:
            self.server.should_exit = True
            self._thread.join(30)
            self._thread = None
        self.socket.close()
