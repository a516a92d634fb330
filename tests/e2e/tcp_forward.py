"""A TCP forwarder: `python -m tests.e2e.tcp_forward LISTEN_HOST:PORT TARGET_HOST:PORT`.

The VM node's path to the API server: on the host, from a loopback port qemu's user network
reaches (the guest's 10.0.2.2) to the API server's address; in the guest, from the `kubernetes`
Service address to that port. The standard library only: the guest has no socat.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:  # ends the other direction too; each direction's thread closes its source
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        source.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    listen, target = _address(sys.argv[1]), _address(sys.argv[2])
    server = socket.create_server(listen, reuse_port=False)
    print(f"tcp_forward: {sys.argv[1]} -> {sys.argv[2]}", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError as exc:
            print(f"tcp_forward: {sys.argv[2]}: {exc}", flush=True)
            client.close()
            continue
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    main()
