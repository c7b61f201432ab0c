"""An OpenEnv app served for real over HTTP and WebSocket on 127.0.0.1, on a port the OS picks."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any


@contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn in a thread for the block; yields its base URL (http://...).
    The app's shutdown runs when the block ends."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # proxy_headers off, as the app is to be served (openenv_sessions): the client is the peer
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", proxy_headers=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the OpenEnv app did not start on 127.0.0.1:{port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@asynccontextmanager
async def connected_from(client: Any, source: str) -> AsyncIterator[Any]:
    """`client` (an OpenEnv `EnvClient`) connected from the loopback address `source`
    (`127.0.0.2`, ...), which the server counts as another client than 127.0.0.1: OpenEnv's own
    `connect`, with its WebSocket opened from that address; closed when the block ends."""
    from openenv.core import env_client

    stock = env_client.ws_connect
    env_client.ws_connect = functools.partial(stock, local_addr=(source, 0))
    try:
        await client.connect()
    finally:
        env_client.ws_connect = stock
    try:
        yield client
    finally:
        await client.close()
