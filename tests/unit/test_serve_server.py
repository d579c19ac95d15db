"""pipeline/runtime/serve/server.py's socket: its connections get TCP_NODELAY from asyncio (without it, every response
after the first on a keep-alive connection waited for the client's delayed ACK), and a taken address is an
error naming it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pipeline.runtime.errors import PipelineError
from pipeline.runtime.serve.server import bind


def test_connections_to_the_bound_socket_are_tcp_nodelay():
    async def accepted_nodelay() -> int:
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        listener = bind("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        reader, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        value = await asyncio.wait_for(seen, 10)
        writer.close()
        server.close()
        await server.wait_closed()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


def test_an_address_in_use_is_an_error_naming_it():
    taken = bind("127.0.0.1", 0)
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(PipelineError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            bind("127.0.0.1", port)
    finally:
        taken.close()
