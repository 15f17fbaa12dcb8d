"""The fault proxy itself: forward, hold, black-hole, cut and drop-the-reply, each
against a small echo server on the loopback interface."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.support.proxy import FaultProxy, Mode


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: EchoServer = self.server  # type: ignore[assignment]
        try:
            while data := self.request.recv(65536):
                server.received.append(data)
                server.got_data.set()
                self.request.sendall(data)
        except ConnectionResetError:
            pass  # what a cut does


class EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.received: list[bytes] = []
        self.got_data = threading.Event()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(echo.server_address[1]) as started:
        yield started


def client(proxy: FaultProxy, timeout: float = 5) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_it_forwards_both_ways(proxy, echo):
    with client(proxy) as sock:
        sock.sendall(b"hello")
        assert recv_exactly(sock, 5) == b"hello"
    assert proxy.stats.accepted == 1
    assert proxy.stats.bytes_up == 5
    assert proxy.stats.bytes_down == 5


def test_a_hold_keeps_the_bytes_until_forwarding_resumes(proxy, echo):
    with client(proxy) as sock:
        sock.sendall(b"a")
        assert recv_exactly(sock, 1) == b"a"
        proxy.hold()
        sock.sendall(b"held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert b"held" not in b"".join(echo.received)
        proxy.forward()
        sock.settimeout(5)
        assert recv_exactly(sock, 4) == b"held"
    assert proxy.mode is Mode.FORWARD


def test_a_black_hole_drops_bytes_and_keeps_the_connection_open(proxy, echo):
    with client(proxy) as sock:
        proxy.black_hole()
        sock.sendall(b"lost")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert proxy.open_links == 1
        proxy.forward()
        sock.settimeout(5)
        sock.sendall(b"after")
        assert recv_exactly(sock, 5) == b"after"
    assert b"lost" not in b"".join(echo.received)
    assert proxy.stats.dropped_bytes == 4


def test_a_cut_resets_every_open_connection(proxy, echo):
    with client(proxy) as first, client(proxy) as second:
        for sock in (first, second):
            sock.sendall(b"x")
            assert recv_exactly(sock, 1) == b"x"
        assert proxy.cut() == 2
        for sock in (first, second):
            with pytest.raises(ConnectionResetError):
                sock.recv(10)
    # New connections are forwarded again.
    with client(proxy) as sock:
        sock.sendall(b"z")
        assert recv_exactly(sock, 1) == b"z"


def test_drop_reply_forwards_the_commit_and_resets_before_its_reply(proxy, echo):
    with client(proxy) as other:
        proxy.drop_reply(b"COMMIT")
        with client(proxy) as sock:
            sock.sendall(b"BEGIN")
            assert recv_exactly(sock, 5) == b"BEGIN"
            sock.sendall(b"Q\x00\x00\x00\x0bCOMMIT\x00")
            assert proxy.reply_dropped.wait(5)
            with pytest.raises(ConnectionResetError):
                sock.recv(10)
        assert b"COMMIT" in b"".join(echo.received)  # the server got it
        assert proxy.stats.replies_dropped == 1
        # Armed once: the next COMMIT, on another connection, goes through.
        other.sendall(b"COMMIT")
        assert recv_exactly(other, 6) == b"COMMIT"


def test_it_refuses_any_address_but_the_loopback():
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        FaultProxy(5432, target_host="10.0.0.1")
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        FaultProxy.for_url("postgres://u@db.example.com:5432/x")


def test_url_points_a_database_url_at_the_proxy(proxy):
    assert proxy.url("postgres://postgres@127.0.0.1:5999/ledon") == (
        f"postgres://postgres@127.0.0.1:{proxy.port}/ledon"
    )


def test_drop_reply_after_a_write_waits_for_its_commit(proxy, echo):
    proxy.drop_reply(b"COMMIT", after=b"INSERT INTO inbox")
    with client(proxy) as sock:
        sock.sendall(b"COMMIT")  # before the write: forwarded, answered
        assert recv_exactly(sock, 6) == b"COMMIT"
        sock.sendall(b"INSERT INTO inbox")
        assert recv_exactly(sock, 17) == b"INSERT INTO inbox"
        sock.sendall(b"COMMIT")
        assert proxy.reply_dropped.wait(5)
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
    assert proxy.stats.patterns_seen == [b"COMMIT"]
