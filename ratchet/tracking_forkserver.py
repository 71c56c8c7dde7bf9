"""A warm parent for the stages' tracking workers. Started once per pipeline (the Snakefile's
onstart), it imports MLflow and its SQL store once and forks a worker for each stage that
connects to its socket: a stage's writes then start without MLflow's seconds of imports, which
every rule paid again (the tiny default spent more than a third of its wall time on them on
two cores).

The stage sends its stdout and stderr, working directory and environment first, so the forked
worker writes to the stage's log and tags the stage's machine and code exactly as a worker the
stage started itself would; then the worker protocol (tracking_worker.serve) runs over the
socket (tracking.connect_forkserver). A stage that finds no server here (run by hand, on another
host of a cluster, under another interpreter) starts its own worker process as before. The server ends when its stdin
closes (the Snakemake process that started it has ended); workers already forked finish.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from pathlib import Path

def serve_forever(path: str) -> None:
    """Accept stages on the socket at `path` until stdin closes; a forked worker for each."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # before the imports: a stage that connects meanwhile waits in the backlog
    listener.listen(128)
    import mlflow.entities  # noqa: F401  (what every forked worker needs, imported once here)

    from ratchet import tracking_worker  # noqa: F401
    from ratchet.tracking import import_sql_store

    import_sql_store()  # mlflow.tracking and its SQL store
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [])
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                return
            if listener in ready:
                conn, _ = listener.accept()
                if os.fork() == 0:
                    listener.close()
                    os._exit(_work(conn))
                conn.close()
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)


def _work(conn: socket.socket) -> int:
    """In the forked worker: become the stage's worker, then serve its messages."""
    from ratchet import tracking_worker

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    head, fds, _, _ = socket.recv_fds(conn, 8, 2)
    size = int.from_bytes(head, "little")
    hello = b""
    while len(hello) < size:
        chunk = conn.recv(size - len(hello))
        if not chunk:
            return 1
        hello += chunk
    hello = json.loads(hello)
    for fd, target in zip(fds, (1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(hello["cwd"])
    os.environ.clear()
    os.environ.update(hello["env"])
    with conn, conn.makefile("r") as lines, conn.makefile("w") as reply:
        code = tracking_worker.work(lines, reply)
    sys.stdout.flush()
    return code


def main(argv: list[str]) -> int:
    serve_forever(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
