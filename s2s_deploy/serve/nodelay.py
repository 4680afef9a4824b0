"""uvicorn's h11 protocol with ``TCP_NODELAY`` on every connection.

With ``--workers`` above 1, the connections uvicorn's worker processes accept lacked
``TCP_NODELAY`` (one worker's had it): a response went out as two writes, and Nagle's algorithm
held the second until the client's delayed ACK, about 40 ms later. Measured on loopback with a
bare Starlette app: 44 ms a keep-alive request with two workers, 0.6 ms with one.
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol


class NoDelayH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)
