"""The fold process' handover to serve's API process: what its context answers were made from.

The frames (a length, then a pickle) and their writer, `Handover`, which the fold process' live
API (live_api.py) calls after each answer; the API process (live_front.py) reads them with
`read_frame` and answers caught-up context calls from them. live_front.py's docstring says what
each frame holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import struct
import threading
from typing import Any

from sessionfold.streams.runtime.live import LiveFolds, Rendered

log = logging.getLogger(__name__)

#: A frame's length prefix: 8 bytes, big-endian.
_LENGTH = struct.Struct("!Q")
#: The form an answer's array takes: a patch to pi's array, or the whole array.
PATCH, MESSAGES = "patch", "messages"


def write_frame(fd: int, message: Any) -> None:
    """Write one message to `fd` as a frame (its length, then its pickle)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message of `reader`; IncompleteReadError at the end of the stream."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))  # frames of serve's own fold process


class Handover:
    """The fold process' side: what its context answers were made from, written to `fd` for
    the API process (see the module docstring). Called from the fold process' event loop, its
    render thread, the tailer and the answer pool; one lock orders the frames."""

    def __init__(self, live: LiveFolds, fd: int) -> None:
        self.live = live
        self.fd = fd
        self._lock = threading.Lock()
        #: Per session: the state of the render handed over last and the forms sent of it.
        self._handed: dict[str, tuple[tuple[int, int, int], set[str]]] = {}
        #: Per session: how many of its entries' ids were handed over.
        self._ids_sent: dict[str, int] = {}
        self._broken = False

    def ready(self, sessions: int) -> None:
        """Say the fold process' API answers (and how many sessions it holds, and how many
        files were set aside before it did: the tailer starts first)."""
        with self._lock:
            self._send(("ready", sessions))
            self._send(("set-aside", self.live.set_aside_total))

    def answered(self, session_id: str, patch: bool, rendered: Rendered) -> None:
        """A context answer of the session was made from `rendered` (not stale): hand it over
        while it is the session's state."""
        if not rendered.settled:
            return
        form = PATCH if patch else MESSAGES
        with self._lock:
            session = self.live.sessions.get(session_id)
            # Read without the fold lock: the counters move only once a fold is done, and the
            # fold's `on_lines` (`moved`) comes after, behind this lock.
            if session is None or session.state() != rendered.state:
                return
            handed = self._handed.get(session_id)
            if handed is not None and handed[0] == rendered.state:
                if form not in handed[1]:
                    handed[1].add(form)
                    self._send(("form", session_id, form, _encoded(rendered, form)))
                return
            sent = self._ids_sent.get(session_id, 0)
            upto = rendered.state[1]
            ids = [item.entry.get("id") for item in session.entries[sent:upto]]
            self._ids_sent[session_id] = upto
            pruned = rendered.pruned
            # An unpruned render answers every call without an array: no form is wanted.
            forms = {form: _encoded(rendered, form)} if pruned else {}
            self._handed[session_id] = (rendered.state, {PATCH, MESSAGES} if not pruned else {form})
            render = (rendered.epoch, rendered.tokens, rendered.identities, pruned, forms)
            self._send(("render", session_id, [i for i in ids if isinstance(i, str)], render))

    def moved(self, session_id: str) -> None:
        """The session folded something: the render handed over, if any, answers no more."""
        with self._lock:
            handed = self._handed.get(session_id)
            if handed is None:
                return
            session = self.live.sessions.get(session_id)
            if session is not None and session.state() == handed[0]:
                return
            del self._handed[session_id]
            self._send(("moved", session_id))

    def dropped(self, session_id: str) -> None:
        """The session's state was dropped (its file set aside or replaced): nothing handed
        over of it answers, and its ids start again from its next render."""
        with self._lock:
            self._handed.pop(session_id, None)
            self._ids_sent.pop(session_id, None)
            self._send(("dropped", session_id))

    def set_aside(self) -> None:
        """A file was set aside: the total so far, for the API process' metrics (serve's
        /metrics), which counts what it was not sent yet."""
        with self._lock:
            self._send(("set-aside", self.live.set_aside_total))

    def _send(self, message: Any) -> None:
        if self._broken:
            return
        try:
            write_frame(self.fd, message)
        except OSError as exc:  # the API process is gone: the fold process stops (serve.py)
            self._broken = True
            log.warning("live: the API process left", extra={"error": type(exc).__name__})


def _encoded(rendered: Rendered, form: str) -> bytes:
    return rendered.patch_json if form == PATCH else rendered.messages_json
