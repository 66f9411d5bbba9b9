"""Which process owns something (a folder lock, a temporary folder), told apart even when its pid is
reused: the host, the kernel's boot id and the process's start time (clock ticks since boot, from
/proc/PID/stat) name one process for the life of the machine. A container restarted in place keeps
its hostname and pid (often 1), but not its start time; a rebooted machine keeps neither its boot id.

Temporary folders of a run are named `fleetllm-<kind>-<boot>-<pid>-<start>-<random>` under the
system's temporary folder; `sweep_temp` removes those whose owner is dead (a run SIGKILLed or lost
with its machine), so they do not pile up.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from typing import Any

KINDS = ("prefix", "logs")
OWNED = re.compile(r"^fleetllm-(prefix|logs)-([0-9a-f]{8})-(\d+)-(\d+)-")
LEGACY = re.compile(r"^fleetllm-(prefix|logs)-[a-z0-9_]{8}$")  # tempfile.mkdtemp names of earlier versions
LEGACY_AGE_S = 24 * 3600  # an earlier version's folder untouched this long belongs to no live run


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])  # fields after the command name start at 3


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def me() -> dict[str, Any]:
    """This process: {host, pid, boot_id, start_ticks}."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "boot_id": boot_id(),
            "start_ticks": start_ticks(os.getpid())}


def alive(owner: dict[str, Any]) -> bool | None:
    """Whether the process `owner` names (me()'s keys) still runs: None where this cannot be told
    (another host). A record without a start time (an earlier version's) naming this very pid is
    another process's: this one records its start time."""
    if owner.get("host") != socket.gethostname():
        return None
    try:
        pid = int(owner.get("pid") or 0)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    mine = boot_id()
    if owner.get("boot_id") and mine and owner["boot_id"] != mine:
        return False  # the machine rebooted since
    if owner.get("start_ticks") is None:
        return pid != os.getpid() and pid_alive(pid)
    return start_ticks(pid) == owner["start_ticks"]  # None (gone) or another process's start: dead


def temp_folder(kind: str) -> str:
    """A new temporary folder of this run, named by its owner (swept by a later run once it is dead)."""
    owner = me()
    token = f"{(owner['boot_id'] or '0' * 8)[:8]}-{owner['pid']}-{owner['start_ticks'] or 0}"
    return tempfile.mkdtemp(prefix=f"fleetllm-{kind}-{token}-")


def sweep_temp(root: str | None = None) -> list[str]:
    """Remove the temporary folders of runs that are dead; returns their paths."""
    root = root or tempfile.gettempdir()
    host, boot, removed = socket.gethostname(), boot_id(), []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        path = os.path.join(root, name)
        m = OWNED.match(name)
        if m and m.group(4) == "0":  # no /proc where it was made: its pid is all there is
            dead = not pid_alive(int(m.group(3)))
        elif m:
            owner = {"host": host, "pid": int(m.group(3)), "start_ticks": int(m.group(4)),
                     "boot_id": boot if boot and boot.startswith(m.group(2)) else m.group(2)}
            dead = alive(owner) is False
        else:
            dead = LEGACY.match(name) is not None and _untouched_for(path, LEGACY_AGE_S)
        if dead and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _untouched_for(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > seconds
    except OSError:
        return False
