"""A loopback TCP proxy that tests drive to break one process's database traffic.

``FaultProxy(port)`` listens on 127.0.0.1 (a port of its own) and forwards every
connection to ``127.0.0.1:port``. A process given the proxy's address instead of the
server's can then be cut off on demand, alone:

- :meth:`FaultProxy.forward` — pass bytes both ways (the default; after
  :meth:`~FaultProxy.hold`, the held bytes go on);
- :meth:`FaultProxy.hold` — stop forwarding but keep the bytes: nothing is read, so
  they wait in the kernel's buffers until :meth:`~FaultProxy.forward`;
- :meth:`FaultProxy.black_hole` — read and drop every byte, both ways, while the
  connections stay open (a partition behind something that still acknowledges);
- :meth:`FaultProxy.cut` — reset (RST) every open connection now;
- :meth:`FaultProxy.drop_reply` — the next time a client sends ``pattern`` (by
  default a ``COMMIT``), forward it to the server, then reset that connection before
  the server's reply reaches the client: the client cannot tell whether its commit
  happened; :meth:`FaultProxy.disarm` forgets the triggers that have not fired.

Only the loopback interface is ever used. The proxy runs an asyncio loop on a thread
of its own; the control methods may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"


class Mode(enum.Enum):
    FORWARD = "forward"
    HOLD = "hold"
    BLACK_HOLE = "black-hole"


@dataclass(frozen=True)
class _Trigger:
    """Drop the reply to ``pattern`` (once ``after`` went by on the connection)."""

    pattern: bytes
    after: bytes | None = None


@dataclass(eq=False)
class _Link:
    """One client connection and its connection to the server."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    #: Set once the client sent the armed pattern: the server's next bytes are the
    #: reply to drop.
    cut_on_reply: bool = False
    #: A trigger whose ``after`` went by: its ``pattern`` is awaited on this link.
    waiting_for: _Trigger | None = None
    closed: bool = False


@dataclass
class ProxyStats:
    """What the proxy did (read them after the fact; updated on the proxy's thread)."""

    accepted: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    dropped_bytes: int = 0
    resets: int = 0
    replies_dropped: int = 0
    #: The patterns whose replies were (or are about to be) dropped.
    patterns_seen: list[bytes] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with a reset (RST), not an orderly end (FIN)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``127.0.0.1:target_port``; use it as a
    context manager, or :meth:`start` and :meth:`close`."""

    def __init__(self, target_port: int, *, target_host: str = LOOPBACK) -> None:
        if target_host != LOOPBACK:
            raise ValueError("the fault proxy only forwards to 127.0.0.1")
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        self.stats = ProxyStats()
        #: Set each time a reply was dropped by :meth:`drop_reply`.
        self.reply_dropped = threading.Event()
        self._mode = Mode.FORWARD
        self._links: set[_Link] = set()
        self._armed: list[_Trigger] = []
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )

    @classmethod
    def for_url(cls, url: str) -> FaultProxy:
        """A proxy in front of the PostgreSQL server of ``url`` (postgres://…)."""
        parts = urlsplit(url)
        if parts.hostname not in (LOOPBACK, "localhost"):
            raise ValueError(f"the fault proxy only forwards to 127.0.0.1, not {parts.hostname}")
        return cls(parts.port or 5432)

    def url(self, url: str) -> str:
        """``url`` (postgres://…127.0.0.1:port…) pointed at this proxy instead."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"{LOOPBACK}:{self.port}"
        return parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host).geturl()

    # ------------------------------------------------------------------ life

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                self._close(link)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ control

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def open_links(self) -> int:
        return len(self._links)

    def forward(self) -> None:
        """Forward bytes both ways (held bytes go on)."""
        self._set_mode(Mode.FORWARD)

    def hold(self) -> None:
        """Stop reading from both sides; the bytes wait until :meth:`forward`."""
        self._set_mode(Mode.HOLD)

    def black_hole(self) -> None:
        """Read and drop every byte both ways; connections stay open."""
        self._set_mode(Mode.BLACK_HOLE)

    def cut(self) -> int:
        """Reset every open connection; how many were reset."""

        async def reset_all() -> int:
            links = list(self._links)
            for link in links:
                self._close(link, reset=True)
            return len(links)

        return asyncio.run_coroutine_threadsafe(reset_all(), self._loop).result(timeout=10)

    def drop_reply(
        self, pattern: bytes = b"COMMIT", *, after: bytes | None = None, times: int = 1
    ) -> None:
        """The next ``times`` connections whose client sends ``pattern`` — with
        ``after``, the first ``pattern`` after ``after`` on the same connection (the
        COMMIT of the transaction that wrote something) — have it forwarded, then are
        reset before the server's reply reaches the client."""
        self.reply_dropped.clear()

        def arm() -> None:
            self._armed.extend([_Trigger(pattern, after)] * times)

        self._call(arm)

    def disarm(self) -> int:
        """Forget every armed :meth:`drop_reply` trigger that has not fired yet (also
        one waiting on a connection for its pattern); how many were forgotten."""
        forgotten = [0]

        def clear() -> None:
            waiting = [link for link in self._links if link.waiting_for is not None]
            for link in waiting:
                link.waiting_for = None
            forgotten[0] = len(self._armed) + len(waiting)
            self._armed.clear()

        self._call(clear)
        return forgotten[0]

    # ------------------------------------------------------------------ inside

    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def _set_mode(self, mode: Mode) -> None:
        def change() -> None:
            self._mode = mode
            assert self._flowing is not None
            if mode is Mode.HOLD:
                self._flowing.clear()
            else:
                self._flowing.set()

        self._call(change)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        await asyncio.gather(
            self._pump(link, reader, up_writer, upstream=True),
            self._pump(link, up_reader, writer, upstream=False),
        )

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        assert self._flowing is not None
        try:
            while not link.closed:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data or link.closed:
                    break
                # A hold that began while this read waited keeps its bytes too.
                await self._flowing.wait()
                if self._mode is Mode.BLACK_HOLE:
                    self.stats.dropped_bytes += len(data)
                    continue
                if upstream:
                    self.stats.bytes_up += len(data)
                    self._arm_link(link, data)
                elif link.cut_on_reply:
                    self.stats.dropped_bytes += len(data)
                    self.stats.replies_dropped += 1
                    self._close(link, reset=True)
                    self.reply_dropped.set()
                    break
                else:
                    self.stats.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(link)

    def _arm_link(self, link: _Link, data: bytes) -> None:
        """Whether ``data`` from ``link``'s client fires a trigger: then the server's
        next reply on it is dropped."""
        if link.waiting_for is not None:
            start = data.find(link.waiting_for.after or b"")
            if link.waiting_for.pattern in (data[start:] if start >= 0 else data):
                self.stats.patterns_seen.append(link.waiting_for.pattern)
                link.waiting_for = None
                link.cut_on_reply = True
            return
        for trigger in self._armed:
            if trigger.after is None and trigger.pattern in data:
                self._armed.remove(trigger)
                self.stats.patterns_seen.append(trigger.pattern)
                link.cut_on_reply = True
                return
            if trigger.after is not None and trigger.after in data:
                self._armed.remove(trigger)
                link.waiting_for = trigger
                # The COMMIT may be in the same chunk (a pipeline).
                self._arm_link(link, data)
                return

    def _close(self, link: _Link, *, reset: bool = False) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        if reset:
            self.stats.resets += 1
            _reset(link.client)
            _reset(link.server)
        else:
            link.client.close()
            link.server.close()
