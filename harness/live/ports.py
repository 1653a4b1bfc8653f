"""Free ports on 127.0.0.1 for servers started by tests and benchmarks
(``latroute serve`` needs ``n`` consecutive ones: instance k on base + k)."""
from __future__ import annotations

import socket
import threading

_LOCK = threading.Lock()
_HANDED: set[int] = set()  # bases already handed out by this process: two callers never race for one


def free_port_base(n: int = 1, tries: int = 200) -> int:
    """A base port with ``n`` consecutive ports free now on 127.0.0.1 (the
    kernel picks the base), never one this process handed out before."""
    with _LOCK:
        for _ in range(tries):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                base = s.getsockname()[1]
            if base in _HANDED or base + n - 1 > 65535:
                continue
            socks = []
            try:
                for k in range(n):
                    sock = socket.socket()
                    socks.append(sock)
                    sock.bind(("127.0.0.1", base + k))
            except OSError:
                continue
            finally:
                for sock in socks:
                    sock.close()
            _HANDED.add(base)
            return base
    raise RuntimeError("no free ports on 127.0.0.1")
