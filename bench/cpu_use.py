"""CPU seconds a process has used, and which limit binds a pipeline run (bench helpers).

- A process's CPU seconds: utime + stime of /proc/PID/stat (every thread of it), in seconds.
- The pid listening on a local TCP port, found through /proc/net/tcp{,6} and /proc/*/fd: how a
  broker that this bench did not start is measured.
- What binds a run, derived from its figures: the whole machine's CPUs, the fold worker's CPU
  (its cost per event), or neither (the worker waits: latency-bound).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Clock ticks per second, the unit of /proc/PID/stat's utime and stime.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: A share of CPU (of one core, or of the machine) from which that CPU counts as the limit:
#: scheduling, interrupts and the bench's own scrapes keep a busy process a little below 100%.
BUSY_SHARE = 0.85
#: /proc/net/tcp's state code for a listening socket.
TCP_LISTEN = "0A"


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` in seconds, or None if it is gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat.rsplit(")", 1)[1].split()
    # Fields 14 and 15 of the man page; fields[0] is field 3 (the state).
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float | None:
    """`cpu_seconds` of `pid` and of every live process under it (serve's fold process), or
    None if `pid` is gone."""
    own = cpu_seconds(pid)
    if own is None:
        return None
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return own
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            own += tree_cpu_seconds(int(child)) or 0.0
    return own


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on `port` (any local address, IPv4 or IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == TCP_LISTEN:
                inodes.add(fields[9])
    return inodes


def listening_pid(port: int) -> int | None:
    """The pid of the process listening on local TCP `port`, or None if none is visible."""
    targets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not targets:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            descriptors = list((proc / "fd").iterdir())
        except OSError:
            continue  # gone, or another user's
        for descriptor in descriptors:
            try:
                if os.readlink(descriptor) in targets:
                    return int(proc.name)
            except OSError:
                continue
    return None


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds each process of one run used between two instants, `wall` seconds apart."""

    wall: float
    folds: list[float]  # per fold worker
    summarizer: float
    broker: float | None  # None: not measured
    bench: float

    @property
    def pipeline(self) -> float:
        """CPU seconds of every measured process together."""
        return sum(self.folds) + self.summarizer + (self.broker or 0.0) + self.bench

    @property
    def cpus_used(self) -> float:
        """How many CPUs the pipeline kept busy on average."""
        return self.pipeline / self.wall if self.wall > 0 else 0.0

    def utilisation(self) -> list[float]:
        """Each fold worker's CPU seconds per wall second (1.0: one core busy)."""
        return [s / self.wall if self.wall > 0 else 0.0 for s in self.folds]

    def fold_us_per_event(self, events: int) -> float:
        """Fold workers' CPU microseconds per event folded, all workers together."""
        return sum(self.folds) * 1e6 / events if events else 0.0


def snapshot(pids: list[int]) -> list[float | None]:
    """CPU seconds of each of `pids` now."""
    return [cpu_seconds(pid) for pid in pids]


def used(before: float | None, after: float | None) -> float | None:
    """CPU seconds between two readings of one process, None if either is missing."""
    return None if before is None or after is None else after - before


def binding_limit(cpu: CpuUse, events: int, embedded_us: float, cpus: int) -> str:
    """Which limit a run hit, in one clause: the machine's CPUs, the fold worker's CPU, or none
    (the fold worker waits), with the figure that says so."""
    if cpu.cpus_used >= BUSY_SHARE * cpus:
        return f"pipeline used {cpu.cpus_used:.1f} of {cpus} CPUs: CPU-bound on this machine"
    busiest = max(cpu.utilisation(), default=0.0)
    cost = cpu.fold_us_per_event(events)
    per_event = f"{cost:,.0f} us/event against the embedded fold's {embedded_us:,.0f}"
    if busiest >= BUSY_SHARE:
        return f"fold worker at {busiest:.0%} CPU: fold-CPU-bound ({per_event})"
    return f"fold worker at {busiest:.0%} CPU: latency-bound, it waits ({per_event})"
