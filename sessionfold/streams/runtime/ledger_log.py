"""The ledger's log (seeds/002, "The log"): one JSON record a line, codes and counts only.

Records carry codes, ids, counts and lengths, never message text, rule words, narrative lines
or tool output: they are built from a pass's span record by picking numbers and codes, never
by copying strings a model or a user wrote. Each names its session (id, working directory,
the diff model), which is enough to identify a project, so `sessionfold report` hashes paths
and ids before anything is pasted into an issue.

The file is written safely or not at all:
- `0600`, and every directory it creates `0700` (an existing directory is left as it is);
- below its root (the state directory, `$XDG_STATE_HOME` or `~/.local/state`, for a log under
  it; else the nearest existing directory above the log's own) every directory is opened one at
  a time relative to the one before, without following a symlink (`O_NOFOLLOW|O_DIRECTORY`), so
  a symlinked directory on the way is refused, and nothing is written outside the root;
- never through a symlink (`O_NOFOLLOW`), never into anything but a regular file (a FIFO, a
  device or a directory is refused without blocking), and never into a file with another hard
  link (`st_nlink > 1`: the same bytes would show under a name someone else chose);
- at 5 MB it rotates to one `.1` backup (a second rotation replaces it);
- a failed or refused write is counted, warned about once with a reason code (`symlink`,
  `hard-linked`, `not-a-directory`, `not-regular`, or the errno name), and swallowed: it never
  affects a pass.

The path is `SESSIONFOLD_LEDGER_LOG` (one file for every run), or an off value (`off`,
`none`, `0`, `false`, `no`, or empty) to disable it; unset, one file per session:
`$XDG_STATE_HOME/sessionfold/ledger/<session id>.jsonl` (default `~/.local/state/...`; an id
that is not a plain file name is hashed). Before there was one file per session, the default
was `.../sessionfold/ledger.jsonl`; `sessionfold report` still reads it beside the directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

import sessionfold
from sessionfold.streams.private_dirs import make_private_dirs

log = logging.getLogger(__name__)

ENV_LOG = "SESSIONFOLD_LEDGER_LOG"
#: Values of `SESSIONFOLD_LEDGER_LOG` that turn the log off (a path is anything else).
OFF_VALUES = frozenset({"", "off", "none", "0", "false", "no"})
#: The file rotates before it would grow past this.
ROTATE_BYTES = 5 * 1024 * 1024
#: Record format version.
LOG_VERSION = 1
#: An error keeps this much of its message (home as ~), and only for sessionfold's own
#: exceptions, whose messages are codes by convention.
ERROR_CHARS = 200

_OPEN_FLAGS = (
    os.O_WRONLY
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO without a reader fails instead of blocking
    | getattr(os, "O_CLOEXEC", 0)
)
_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
#: Reason codes of refused writes, by errno.
_REASONS = {
    errno.ELOOP: "symlink",
    errno.EMLINK: "hard-linked",
    errno.ENOTDIR: "not-a-directory",
    errno.EPERM: "not-regular",
}


def state_root(env: Mapping[str, str] | None = None) -> Path:
    """The per-user state directory: `$XDG_STATE_HOME`, else `~/.local/state`."""
    env = os.environ if env is None else env
    state = env.get("XDG_STATE_HOME", "").strip()
    return Path(state) if state else Path.home() / ".local" / "state"


def default_log_path(env: Mapping[str, str] | None = None) -> Path:
    """The one log file every run wrote to before the log was per session (still read)."""
    return state_root(env) / "sessionfold" / "ledger.jsonl"


def default_log_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the per-session logs go when `SESSIONFOLD_LEDGER_LOG` is unset."""
    return state_root(env) / "sessionfold" / "ledger"


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def session_log_name(session_id: str | None) -> str:
    """A session's log file name: its id when that is a plain file name, else a hash of it."""
    if session_id is None:
        return "no-session.jsonl"
    if _PLAIN_NAME.fullmatch(session_id) and not session_id.endswith(".1"):
        return f"{session_id}.jsonl"
    return f"s-{hashlib.sha256(session_id.encode()).hexdigest()[:16]}.jsonl"


def read_path(env: Mapping[str, str] | None = None) -> Path | None:
    """What `sessionfold report` reads: the file `SESSIONFOLD_LEDGER_LOG` names, else the
    per-session directory (and the older single file beside it); None when the log is off."""
    env = os.environ if env is None else env
    return default_log_dir(env) if ENV_LOG not in env else log_path(env)


def trusted_root(path: Path, env: Mapping[str, str] | None = None) -> Path:
    """The directory below which the log's directories must be real ones: the state root for a
    log under it, else the nearest existing directory above the log's own."""
    absolute = Path(os.path.abspath(path))
    root = Path(os.path.abspath(state_root(env)))
    if absolute.parent.is_relative_to(root):
        return root
    for ancestor in absolute.parent.parents:
        if ancestor.is_dir():
            return ancestor
    return Path(absolute.anchor)


def log_path(env: Mapping[str, str] | None = None, session_id: str | None = None) -> Path | None:
    """The log's path from the environment (the session's own file when it is unset), or None
    when an off value disables it."""
    env = os.environ if env is None else env
    if ENV_LOG not in env:
        return default_log_dir(env) / session_log_name(session_id)
    value = env[ENV_LOG].strip()
    if value.lower() in OFF_VALUES:
        return None
    return Path(value).expanduser()


def _home() -> str:
    try:
        return str(Path.home())
    except RuntimeError:  # no home directory (a bare container)
        return ""


def scrub_home(text: str, home: str | None = None) -> str:
    """`text` with the home directory written as `~`."""
    home = _home() if home is None else home
    return text.replace(home, "~") if home and home != "/" else text


def error_fields(error: BaseException) -> dict[str, Any]:
    """`errorClass`, and `error` (its first 200 characters, home as ~) for sessionfold's own
    exceptions only: another library's message may quote data, so it is left out."""
    cls = type(error)
    own = cls.__module__.startswith("sessionfold.")
    message = scrub_home(str(error))[:ERROR_CHARS] if own else None
    return {"errorClass": cls.__name__, "error": message}


def reason_code(reason: str | None) -> str | None:
    """A pass's reason as a code: `model-error:DiffModelError`, `schema`, `no-json`."""
    if reason is None:
        return None
    if reason.startswith("the answer does not fit the schema"):
        return "schema"
    if reason.startswith("the answer is a JSON"):
        return "not-an-object"
    return reason.split(" ", 1)[0][:80]


class LedgerLog:
    """Appends records to the log file, safely or not at all (see the module docstring)."""

    def __init__(
        self,
        path: Path | None,
        *,
        root: Path | None = None,
        rotate_bytes: int = ROTATE_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = None if path is None else Path(os.path.abspath(path))
        self.root = root if root is not None or path is None else trusted_root(path)
        self.rotate_bytes = rotate_bytes
        self.clock = clock
        self.written = 0
        self.failed = 0
        self.last_error: str | None = None  # reason code of the last failure

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, session_id: str | None = None
    ) -> LedgerLog:
        """The log `SESSIONFOLD_LEDGER_LOG` names (disabled by an off value), else the
        session's own file."""
        path = log_path(env, session_id)
        return cls(path, root=None if path is None else trusted_root(path, env))

    @property
    def enabled(self) -> bool:
        """False when the log is off."""
        return self.path is not None

    def write(self, record: dict[str, Any]) -> bool:
        """Append one record (with `v` and `time`); False when off or when the write failed."""
        if self.path is None:
            return False
        stamped = {
            "v": LOG_VERSION,
            "time": datetime.fromtimestamp(self.clock(), UTC).isoformat(timespec="milliseconds"),
            **record,
        }
        try:
            line = orjson.dumps(stamped, option=orjson.OPT_SORT_KEYS) + b"\n"
            self._append(self.path, line)
        except Exception as exc:  # a failed write never affects the pass
            self._refused(exc)
            return False
        self.written += 1
        return True

    def _refused(self, error: Exception) -> None:
        self.failed += 1
        code = getattr(error, "errno", None)
        reason = _REASONS.get(code) if isinstance(code, int) else None
        if reason is None:
            reason = errno.errorcode.get(code, type(error).__name__) if code else "error"
        if self.failed == 1:  # once per log: a refused log stays refused
            log.warning("ledger log not written: %s", reason)
        self.last_error = reason

    def _append(self, path: Path, line: bytes) -> None:
        directory = open_below(self.root or path.parent, path.parent)
        try:
            self._append_in(directory, path.name, line)
        finally:
            os.close(directory)

    def _append_in(self, directory: int, name: str, line: bytes) -> None:
        try:
            before = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            before = None
        if before is not None:
            _check_file(before)
            if before.st_size > 0 and before.st_size + len(line) > self.rotate_bytes:
                # One backup: os.replace swaps a symlink at `.1` itself, never its target.
                backup = name + ".1"
                os.replace(name, backup, src_dir_fd=directory, dst_dir_fd=directory)
        fd = os.open(name, _OPEN_FLAGS, 0o600, dir_fd=directory)
        try:
            opened = os.fstat(fd)
            _check_file(opened)  # again: the name may have changed since the stat
            if stat.S_IMODE(opened.st_mode) != 0o600:
                with contextlib.suppress(OSError):  # not ours to change: write anyway
                    os.fchmod(fd, 0o600)
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def _check_file(info: os.stat_result) -> None:
    """Refuse anything but a regular file with no other hard link."""
    if not stat.S_ISREG(info.st_mode):  # a symlink, a FIFO, a directory
        raise OSError(errno.EPERM, "the log path is not a regular file")
    if info.st_nlink > 1:
        raise OSError(errno.EMLINK, "the log file has another hard link")


def open_below(root: Path, directory: Path) -> int:
    """A descriptor of `directory`, reached from `root` one real directory at a time.

    `root` is created (with any missing parent) `0700` if absent; each component below it is
    opened relative to the one before without following a symlink, and created `0700` when
    missing. A symlink on the way is `ELOOP`, a file `ENOTDIR`: nothing is opened outside.
    """
    root = Path(os.path.abspath(root))
    parts = Path(os.path.abspath(directory)).relative_to(root).parts
    make_private_dirs(root)
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.fchmod(child, 0o700)  # mkdir's mode passes through the umask
            except NotADirectoryError:  # Linux says ENOTDIR for a symlink too: name it
                if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, "a directory of the log is a symlink") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- records ------------------------------------------------------------------------------------


def _ints(mapping: Any) -> dict[str, int]:
    """The int values of a mapping whose keys are codes (what counts and dropped hold)."""
    if not isinstance(mapping, dict):
        return {}
    return {
        str(k)[:40]: v for k, v in mapping.items() if isinstance(v, int) and not isinstance(v, bool)
    }


def compaction_record(payload: dict[str, Any], duration_ms: int | None) -> dict[str, Any]:
    """A `compaction` record of a pass result: codes and counts picked from its span record,
    never its narrative, Now or summary text."""
    record = payload.get("record") or {}
    return {
        "event": "compaction",
        "span": payload.get("span"),
        "request": payload.get("request"),
        "trigger": record.get("trigger"),
        "entry": record.get("entry"),
        "model": record.get("model"),
        "narrative": {
            "kind": record.get("narrativeKind"),
            "calls": record.get("calls", 0),
            "accepted": len(payload.get("events") or []),
            "dropped": _ints(record.get("dropped")),
            "chunks": record.get("chunks", 1),
            "missing": [n for n in record.get("missing", []) if isinstance(n, int)],
            "reason": reason_code(record.get("reason")),
        },
        "counts": _ints(record.get("counts")),
        "summaryChars": len(payload.get("summary") or ""),
        "capFit": _ints(record.get("capFit")),
        "world": len(record["world"]) if isinstance(record.get("world"), dict) else None,
        "carried": len(record.get("carried") or []),
        "takeover": record.get("takeover") is not None,
        "durationMs": duration_ms,
    }


class LogObserver:
    """A `PassObserver` that writes `compaction`, `fallback` and `aborted` records.

    `session` names the session in every record: its id, working directory and the diff
    model; `clock` (monotonic seconds) times each pass.
    """

    def __init__(
        self,
        log: LedgerLog,
        session: dict[str, Any],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.session = session
        self.clock = clock
        self.current: dict[str, Any] | None = None
        self.started_at = 0.0

    def _write(self, record: dict[str, Any]) -> None:
        self.log.write({**record, "session": self.session})

    def started(self, request: dict[str, Any]) -> None:
        """Remember the pass and when it began."""
        self.current = request
        self.started_at = self.clock()

    def finished(self, request: dict[str, Any], payload: dict[str, Any]) -> None:
        """A `compaction` record, or nothing for a fallback (`failed` wrote that)."""
        self.current = None
        if payload.get("record") is None:
            return
        elapsed = int((self.clock() - self.started_at) * 1000)
        self._write(compaction_record(payload, elapsed))

    def failed(self, request: dict[str, Any], error: BaseException) -> None:
        """A `fallback` record: the pass threw and answered nothing."""
        self._write(
            {
                "event": "fallback",
                "span": request.get("span"),
                "request": request.get("request"),
                "reason": "pass-error",
                **error_fields(error),
            }
        )

    def aborted(self, error: BaseException, reason: str = "interrupted") -> None:
        """An `aborted` record when a run is cancelled mid-pass (or between passes)."""
        request = self.current or {}
        self._write(
            {
                "event": "aborted",
                "span": request.get("span"),
                "request": request.get("request"),
                "reason": reason,
                **error_fields(error),
            }
        )

    def compacted(self, entry: dict[str, Any], ours: bool) -> None:
        """A `compacted` record for a compaction entry folded: whose, how long, how big."""
        summary = entry.get("summary")
        tokens = entry.get("tokensBefore")
        self._write(
            {
                "event": "compacted",
                "entry": entry.get("id") if isinstance(entry.get("id"), str) else None,
                "fromExtension": ours,
                "summaryChars": len(summary) if isinstance(summary, str) else None,
                "tokensBefore": tokens if isinstance(tokens, int) else None,
            }
        )

    def run(self, command: str) -> None:
        """A `run` record: a command started (which, with which sessionfold)."""
        self._write({"event": "run", "command": command, "version": sessionfold.__version__})
