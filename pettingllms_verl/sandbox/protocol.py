"""The sandbox's wire protocol: length-prefixed ``marshal`` frames over a local socket.

Shared by the fork server, its client and the math grader's child process. ``marshal`` carries
only plain values (no code objects are sent; the server never unmarshals anything a run wrote).
Stdlib only: the fork server imports it before any isolation is in place.
"""

import marshal
import socket
import struct

_FRAME_HEADER = struct.Struct("<I")


def send_frame(sock: socket.socket, obj) -> None:
    body = marshal.dumps(obj)
    sock.sendall(_FRAME_HEADER.pack(len(body)) + body)


def recv_frame(sock: socket.socket):
    (length,) = _FRAME_HEADER.unpack(_recv_exact(sock, _FRAME_HEADER.size))
    return marshal.loads(_recv_exact(sock, length))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    received = 0
    while received < size:
        n = sock.recv_into(view[received:])
        if n == 0:
            raise ConnectionError("sandbox peer closed the connection")
        received += n
    return bytes(buf)


def result(status: str, stdout: bytes, stderr: bytes, returncode, wall_s: float) -> dict:
    """The reply to a run request (``client.SandboxResult`` reads it)."""
    return {"status": status, "stdout": stdout, "stderr": stderr, "returncode": returncode, "wall_s": wall_s}
