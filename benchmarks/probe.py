"""Start-time probe for the idle pickup latency measurement.

When ``BENCH_PROBE_PORT`` is set, each no-op handler sends one UDP datagram to the
harness on the loopback interface as it starts: ``<marker> <time.time()>``. Without it
(every throughput run) a handler does nothing at all.
"""

from __future__ import annotations

import os
import socket
import time

_PORT = int(os.environ.get("BENCH_PROBE_PORT") or 0)
_SOCKET = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if _PORT else None


def started(marker: object) -> None:
    if _SOCKET is not None:
        _SOCKET.sendto(f"{marker} {time.time():.6f}".encode(), ("127.0.0.1", _PORT))
