"""DuplexSocket (channels/bases/duplex.py): one TLS connection read by one thread while
others write to it, as the IRC and Mumble adapters do. Every byte arrives intact both
ways under concurrent traffic, bytes already decrypted inside the TLS layer are read
without waiting for the network, and shutdown() wakes a reader blocked on an idle socket."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading

import pytest

from agentd.channels.bases.duplex import DuplexSocket

FRAMES, SIZE = 400, 1000


@pytest.fixture(scope="module")
def server_context(tmp_path_factory) -> ssl.SSLContext:
    openssl = shutil.which("openssl") or pytest.skip("openssl is not installed")
    root = tmp_path_factory.mktemp("tls")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem")], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(root / "cert.pem", root / "key.pem")
    return context


def tls_pair(server_context: ssl.SSLContext) -> tuple[DuplexSocket, ssl.SSLSocket]:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[ssl.SSLSocket] = []
    acceptor = threading.Thread(target=lambda: accepted.append(
        server_context.wrap_socket(listener.accept()[0], server_side=True)))
    acceptor.start()
    client_context = ssl.create_default_context()
    client_context.check_hostname, client_context.verify_mode = False, ssl.CERT_NONE
    client = client_context.wrap_socket(socket.create_connection(listener.getsockname()))
    acceptor.join(10)
    listener.close()
    return DuplexSocket(client), accepted[0]


def read_all(reader, total: int) -> bytes:  # type: ignore[no-untyped-def]
    data = b""
    while len(data) < total:
        chunk = reader.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_concurrent_reads_and_writes_arrive_intact(server_context):
    duplex, server = tls_pair(server_context)
    frames = [bytes([65 + i % 26]) * SIZE for i in range(FRAMES)]
    received: dict[str, bytes] = {}
    # The server streams while the client's writer thread sends and its reader thread reads.
    server_reader = threading.Thread(target=lambda: received.update(server=read_all(server, FRAMES * SIZE)))
    client_reader = threading.Thread(target=lambda: received.update(client=read_all(duplex, FRAMES * SIZE)))
    client_writer = threading.Thread(target=lambda: [duplex.sendall(f) for f in frames])
    for thread in (server_reader, client_reader, client_writer):
        thread.start()
    for frame in frames:
        server.sendall(frame)
    for thread in (server_reader, client_reader, client_writer):
        thread.join(30)
    assert received["client"] == b"".join(frames)
    assert received["server"] == b"".join(frames)
    duplex.close()
    server.close()


def test_bytes_already_decrypted_are_read_without_waiting(server_context):
    duplex, server = tls_pair(server_context)
    server.sendall(b"first record")
    assert duplex.recv(5) == b"first"  # the rest of the record stays inside the TLS layer
    # Nothing more comes from the network: a reader that polled the socket would hang here.
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(duplex.recv(100)), daemon=True)
    reader.start()
    reader.join(5)
    assert result == [b" record"]
    duplex.close()
    server.close()


def test_shutdown_wakes_a_blocked_reader_and_writers_then_fail(server_context):
    duplex, server = tls_pair(server_context)
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(duplex.recv(100)), daemon=True)
    reader.start()
    reader.join(0.3)
    assert reader.is_alive()  # idle connection: the reader waits
    duplex.shutdown()
    reader.join(5)
    assert not reader.is_alive() and result == [b""]
    with pytest.raises(OSError):
        duplex.sendall(b"after shutdown")
    duplex.close()
    server.close()
