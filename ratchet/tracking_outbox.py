"""A stage's tracking messages, written to its worker by a thread of their own. A store that
stalls (its lock held, a server that stopped answering) stops the worker reading; a blocking
write into the full pipe or socket would then stall the stage's own work with no bound. Here
the stage only queues; past MAX_QUEUED_BYTES it drops and counts, and says so at its end."""

from __future__ import annotations

import collections
import contextlib
import threading

MAX_QUEUED_BYTES = 64 << 20  # a training's metrics are kilobytes a step


class Outbox:
    def __init__(self, stream):
        self.stream = stream
        self.error: BaseException | None = None  # what stopped the writes (the worker went away)
        self.dropped = 0
        self._lines: collections.deque[str] = collections.deque()
        self._bytes = 0
        self._closing = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._drain, name="ratchet-tracking-outbox", daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        """Queue one message (a line); never blocks on the worker."""
        with self._ready:
            if self._closing or self.error is not None:
                return
            if self._bytes + len(line) > MAX_QUEUED_BYTES:
                self.dropped += 1
                return
            self._lines.append(line)
            self._bytes += len(line)
            self._ready.notify()

    def close(self, timeout_s: float) -> bool:
        """Write what is queued, then close the stream; False if that did not end within
        `timeout_s` (the caller then stops the worker, which ends the blocked write)."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        with contextlib.suppress(OSError, ValueError):
            self.stream.close()
        return True

    def _drain(self) -> None:
        while True:
            with self._ready:
                while not self._lines and not self._closing:
                    self._ready.wait()
                if not self._lines:
                    return
                batch = "".join(self._lines)  # in order, one write for what piled up
                self._lines.clear()
                self._bytes = 0
            try:
                self.stream.write(batch)
                self.stream.flush()
            except (OSError, ValueError) as e:  # a broken pipe, a reset or timed-out socket, a closed file
                with self._ready:
                    self.error = e
                    self._lines.clear()
                return
