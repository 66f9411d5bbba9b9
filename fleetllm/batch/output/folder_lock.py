"""The lock of an output folder: one `fleetllm run` writes a folder at a time.

The lock is `_fleetllm/lock.json`, naming its holder (host, pid, boot id, process start time, start
date, a run token).
- Local and network file systems: the file is held with flock(2) for the whole run. The kernel
  (or the NFS server's lease) drops it when the process dies, so a lock left by a dead process is
  simply taken over; a live holder makes the second run refuse, naming it.
- Object stores with a conditional create (S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`, Azure
  `If-None-Match: *`): the lock object is created only if absent. A lock left by a dead process on
  this same host is taken over (checked by boot id, pid and the process's start time, so a reused
  pid does not keep it alive; serialized by a host-local flock); a holder on another host cannot be
  checked from here: the run refuses and says how to remove the lock.
- Other stores: a check followed by a write, verified by reading the lock back; two runs starting
  within the same moment may both pass (docs/storage.md says so).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import tempfile
import uuid

from fleetllm.batch.output import owner, store
from fleetllm.errors import PlanError


class FolderLocked(PlanError):
    """Another fleetllm run holds the output folder."""


def describe(holder: dict | None) -> str:
    if not holder:
        return "a run that is starting (its lock names no holder yet)"
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}"


class FolderLock:
    def __init__(self, fs, path: str, folder_url: str) -> None:
        self.fs, self.path, self.folder_url = fs, path, folder_url
        self.holder = {**owner.me(), "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "run": uuid.uuid4().hex}
        self.took_over: dict | None = None  # the holder of a stale lock this run replaced
        self._fd: int | None = None
        self.held = False

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _refuse(self, holder: dict | None, extra: str = "") -> FolderLocked:
        return FolderLocked(
            f"output folder {self.folder_url!r} is in use by another fleetllm run ({describe(holder)}); "
            f"wait for it to end or choose another output.path{extra}")

    # --- file systems: flock --------------------------------------------------------------

    def _acquire_flock(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _parse(os.pread(fd, 4096, 0))
                os.close(fd)
                raise self._refuse(holder) from None
            try:  # the previous holder unlinks the file on release: lock the file that is there now
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self.took_over = _parse(os.pread(fd, 4096, 0))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.holder).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    # --- object stores: conditional create -----------------------------------------------

    def _read(self) -> dict | None:
        try:
            return _parse(self.fs.cat_file(self.path))
        except FileNotFoundError:
            return None

    def _acquire_object(self) -> None:
        data = json.dumps(self.holder).encode()
        created, atomic = store.create_exclusive(self.fs, self.path, data)
        if not created:
            holder = self._read()
            if holder is None:  # released between our create and our read: try once more
                created, atomic = store.create_exclusive(self.fs, self.path, data)
                holder = None if created else self._read()
            if not created:
                if not self._stale(holder):
                    raise self._refuse(holder, f"; if that run is gone, delete {store.to_url(self.fs, self.path)}")
                created, atomic = self._take_over(holder, data)
                if not created:
                    raise self._refuse(self._read())
        if not atomic and (self._read() or {}).get("run") != self.holder["run"]:
            raise self._refuse(self._read())  # a store without conditional create: another run won

    def _stale(self, holder: dict | None) -> bool:
        """A holder on this host whose process is gone: its pid is free, or now another process's (its
        start time differs: a container restarted in place keeps its hostname and pid), or the machine
        rebooted since (fleetllm.batch.output.owner)."""
        return bool(holder) and holder.get("run") != self.holder["run"] and owner.alive(holder) is False

    def _take_over(self, stale: dict, data: bytes) -> tuple[bool, bool]:
        """Replace a dead local process's lock; runs on this host take turns through a local flock,
        so two of them cannot both delete the stale lock and each create their own."""
        key = hashlib.sha256(store.to_url(self.fs, self.path).encode()).hexdigest()[:16]
        with open(os.path.join(tempfile.gettempdir(), f"fleetllm-takeover-{key}.lock"), "a+") as guard:
            fcntl.flock(guard.fileno(), fcntl.LOCK_EX)
            current = self._read()
            if current is not None and current.get("run") != stale.get("run"):
                return False, True
            if current is not None:
                self.fs.rm(self.path)
            created = store.create_exclusive(self.fs, self.path, data)
        if created[0]:
            self.took_over = stale
        return created

    # --- both ----------------------------------------------------------------------------

    def acquire(self) -> None:
        try:
            if store.is_local(self.fs):
                self._acquire_flock()
            else:
                self._acquire_object()
        except FolderLocked:
            raise
        except OSError as exc:
            raise PlanError(f"cannot write the output folder {self.folder_url!r}: {exc}; "
                            "check output.path and its permissions") from None
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if self._fd is not None:
            try:
                os.unlink(self.path)  # while still locked: a waiting run then locks a fresh file
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None
            return
        if (self._read() or {}).get("run") == self.holder["run"]:
            self.fs.rm(self.path)


def _parse(raw: bytes) -> dict | None:
    try:
        holder = json.loads(raw)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None
