"""Lock staleness that survives pid reuse, on an S3 API server (moto on 127.0.0.1): the lock's
holder is named by host, boot id, pid and the process's start time, so a lock whose pid now belongs
to another live process (a container restarted in place keeps its hostname and pid 1) is taken
over, while a live holder still refuses the second run."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from fleetllm.batch.output.commit import OutputFolder
from fleetllm.batch.output.folder_lock import FolderLocked
from fleetllm.testing.s3_server import S3Server

pytest.importorskip("s3fs", reason="the S3 tests need fleetllm[s3] (s3fs) and moto[server]")

HOLD = ("import sys, time\nfrom fleetllm.batch.output.commit import OutputFolder\n"
        "lock = OutputFolder(sys.argv[1], 'parquet').lock()\nlock.acquire()\nprint('held', flush=True)\n"
        "time.sleep(600)")


@pytest.fixture(scope="module")
def s3():
    import s3fs

    with S3Server.serving("locks"):
        yield s3fs.S3FileSystem()


def record_of_a_killed_holder(fs, url: str) -> dict:
    """The lock record a holder leaves when it is SIGKILLed (a live holder refuses a second run first)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderLocked, match=rf"host {socket.gethostname()}, pid {holder.pid}"):
            OutputFolder(url, "parquet").lock().acquire()
    finally:
        holder.kill()
        holder.wait()
    return json.loads(fs.cat_file(url + "/_fleetllm/lock.json"))


@pytest.fixture
def bystander():
    """Starts a live process unrelated to any lock (the process that got a dead holder's pid, started
    after that holder died); returns its pid."""
    procs = []

    def start() -> int:
        time.sleep(0.05)  # start times are counted in clock ticks (10 ms): this one starts ticks later
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        return procs[-1].pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("case", ["pid now another process's", "container restarted in place (same pid)",
                                  "machine rebooted"])
def test_a_lock_whose_pid_was_reused_is_taken_over(s3, bystander, case):
    url = f"s3://locks/{case.split()[0]}/out"
    stale = record_of_a_killed_holder(s3, url)
    if case.startswith("pid"):
        stale["pid"] = bystander()  # the dead holder's pid now belongs to a live process
    elif case.startswith("container"):
        stale["pid"] = os.getpid()  # this run has the dead one's pid (pid 1 in a container restarted in place)
    else:
        stale.update(pid=bystander(), boot_id="0" * 32)
    s3.pipe_file(url.removeprefix("s3://") + "/_fleetllm/lock.json", json.dumps(stale).encode())
    with OutputFolder(url, "parquet").lock() as lock:
        assert lock.took_over == stale
        assert json.loads(s3.cat_file(url + "/_fleetllm/lock.json"))["run"] == lock.holder["run"]
    assert not s3.exists(url + "/_fleetllm/lock.json")


def test_a_live_holder_and_another_hosts_holder_still_refuse(s3, bystander):
    url = "s3://locks/live/out"
    with OutputFolder(url, "parquet").lock():  # the same process's live run: refused, not taken over
        with pytest.raises(FolderLocked, match=rf"pid {os.getpid()}"):
            OutputFolder(url, "parquet").lock().acquire()
    stale = record_of_a_killed_holder(s3, url)
    s3.pipe_file(url.removeprefix("s3://") + "/_fleetllm/lock.json",
                 json.dumps({**stale, "host": "elsewhere", "pid": bystander()}).encode())
    with pytest.raises(FolderLocked, match="host elsewhere.*if that run is gone, delete s3://locks/live/out"):
        OutputFolder(url, "parquet").lock().acquire()


def test_a_local_lock_record_naming_a_live_pid_does_not_hold_the_folder(tmp_path, bystander):
    """On a file system the lock is an flock, which the kernel drops with its holder: a record left
    behind names a pid, but only the flock counts, whoever has that pid now."""
    lock_file = tmp_path / "_fleetllm" / "lock.json"
    lock_file.parent.mkdir()
    stale = {"host": socket.gethostname(), "pid": bystander(), "started": "earlier", "run": "x"}
    lock_file.write_text(json.dumps(stale))
    with OutputFolder(str(tmp_path), "parquet").lock() as lock:
        assert lock.took_over == stale
