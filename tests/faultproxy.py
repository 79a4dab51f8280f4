"""A TCP proxy under the test's control, between the trainer and the S3 server, to inject outages.

Modes:

- ``pass``: bytes flow both ways;
- ``refuse``: the listening socket is closed (new connections get ECONNREFUSED) and open
  connections are reset (RST);
- ``hang``: new connections are accepted but nothing is forwarded, and open connections stop
  forwarding: the client sees a silent peer until its read timeout.

Going back to ``pass`` listens again on the same port; connections held in ``hang`` then flow
again, as after a network partition heals.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time

MODES = ("pass", "refuse", "hang")


class FaultProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to `upstream` ("host:port")."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.mode = "pass"
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._stop = threading.Event()
        self._held: socket.socket | None = None
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    def _listen(self, port: int, bound: socket.socket | None = None) -> socket.socket:
        s = bound or _bound(port)
        s.listen(64)
        s.settimeout(0.1)
        return s

    def set_mode(self, mode: str) -> None:
        """Switch to `mode` (one of MODES) at once."""
        assert mode in MODES, mode
        with self._lock:
            old, self.mode = self.mode, mode
            if mode == "refuse":
                self._drop_all()
                # Bound, not listening: connections are refused, and no other process takes the port.
                self._held = _bound(self.port)
            elif old == "refuse":
                held, self._held = self._held, None
                self._listener = self._listen(self.port, held)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._drop_all()
            if self._held is not None:
                self._held.close()

    def _drop_all(self) -> None:
        """Stop listening and reset every open connection (call with the lock held)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for pair in self._conns:
            for s in pair:
                _reset(s)
        self._conns.clear()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                listener = self._listener
            if listener is None:
                time.sleep(0.05)
                continue
            try:
                client, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._conns.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stop.is_set():
                if self.mode == "hang":
                    time.sleep(0.05)  # hold every byte: the peer sees silence
                    continue
                if self.mode == "refuse":
                    return
                readable, _, _ = select.select([a, b], [], [], 0.1)
                for s in readable:
                    if self.mode != "pass":
                        break
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except OSError:
            return
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._conns.remove((a, b))
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


def _reset(s: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER 0)."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.close()


def _bound(port: int) -> socket.socket:
    """A socket bound to `port`, retried for a moment: a listener just closed while the accept
    loop's poll held it lets go of the port within that poll's 0.1 s."""
    deadline = time.monotonic() + 5
    while True:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
