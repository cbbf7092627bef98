"""The gloo abort shuts only the sockets a process group opened (issue 37, item 9): a socket
the process opened before (a store client, NCCL's bootstrap) or after (the user's W&B or S3
connection) stays usable; the group's own connection is shut down, its listener never."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from resilient_slurm.training.gloo_abort import SocketAbort


@contextmanager
def _pair() -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    """A listener and both ends of one TCP connection to it, on loopback."""
    lst = socket.create_server(("127.0.0.1", 0))
    cli = socket.create_connection(lst.getsockname())
    srv, _ = lst.accept()
    try:
        yield lst, cli, srv
    finally:
        for s in (cli, srv, lst):
            s.close()


def _usable(a: socket.socket, b: socket.socket) -> bool:
    try:
        a.sendall(b"x")
        b.settimeout(5)
        return b.recv(1) == b"x"
    except OSError:
        return False


def test_only_the_recorded_groups_sockets_are_shut() -> None:
    abort = SocketAbort()
    with _pair() as (_, before_cli, before_srv):  # a store client opened earlier
        group = _pair()
        with abort.recording():  # around the "process group"'s creation
            glisten, gcli, gsrv = group.__enter__()
        try:
            with _pair() as (_, after_cli, after_srv):  # the user's S3 or W&B, opened later
                assert abort.shutdown() == 2  # both ends of the group's connection
                assert not _usable(gcli, gsrv)
                assert _usable(before_cli, before_srv) and _usable(after_cli, after_srv)
                assert glisten.getsockname()  # the listener is left alone
        finally:
            group.__exit__(None, None, None)
    abort.forget()
    assert abort.shutdown() == 0
