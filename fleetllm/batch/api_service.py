"""The batch service of `fleetllm serve`: validates created batches and runs each as a fleetllm job.

One thread polls the store (every `poll_s`):
- a `validating` batch is validated (fleetllm.batches.validate): `failed` with errors.data, or `in_progress`;
- the oldest `in_progress` (or `finalizing`) batch runs as `fleetllm run` in a child process (the job of
  fleetllm.batches.job: engine openai against this server, so the rows go through the served replicas'
  engines at batch priority); batches share the replicas first come, first served: the next starts when
  the one before it ends;
- a cancel marker or a passed `expires_at` kills the child at once; the committed shards become the
  output and error files, and the batch `cancelled` or `expired`;
- when the child ends, the job's output.jsonl and errors.jsonl become the batch's output and error files.
The job's commits make a restart resume: a server killed mid-batch starts the same job again, which
computes only the shards not yet committed, so each custom_id is answered exactly once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from fleetllm.batch import api_job as batch_job
from fleetllm.batches.store import TERMINAL, BatchStore
from fleetllm.batches.validate import validate_lines

log = logging.getLogger("fleetllm.batches")
MAX_ATTEMPTS = 3  # a job that fails this many times in a row fails its batch


class BatchService:
    """Runs the store's batches against the server at `base_url` (see the module docstring)."""

    def __init__(self, store: BatchStore, base_url: str, served: dict[str, dict[str, Any]],
                 api_key: str | None = None, shard_rows: int = 100, poll_s: float = 0.5) -> None:
        self.store = store
        self.base_url = base_url
        self.served = served  # model id -> {"task": "generate" | "embed", "max_in_flight": int}
        self.api_key = api_key
        self.shard_rows = shard_rows
        self.poll_s = poll_s
        self.child: subprocess.Popen | None = None
        self.child_batch: str | None = None
        self.attempts: dict[str, int] = {}
        self.workdir = tempfile.mkdtemp(prefix="fleetllm-batches-")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetllm-batches", daemon=True)

    def start(self) -> "BatchService":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and the running job (its batch stays in_progress: the next start resumes it)."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._kill_child()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a bad poll must not end the service
                log.exception("batch service step failed")
            self._stop.wait(self.poll_s)

    def step(self) -> None:
        now = int(time.time())
        for batch in self.store.batches():
            if batch["status"] in TERMINAL:
                continue
            if batch["status"] == "validating":
                self.validate(batch)
            elif self.store.cancel_requested_at(batch["id"]) is not None:
                self.end_early(batch, "cancelled")
            elif now >= batch["expires_at"]:
                self.end_early(batch, "expired")
        self._check_child()
        if self.child is None:
            waiting = [b for b in self.store.batches() if b["status"] in ("in_progress", "finalizing")]
            if waiting:
                self._start_job(waiting[0])
        elif self.child_batch is not None:
            self._update_counts(self.child_batch)

    # --- validation ---

    def validate(self, batch: dict[str, Any]) -> None:
        served = {m: s["task"] for m, s in self.served.items()}
        file_obj = self.store.get_file(batch["input_file_id"])
        now = int(time.time())
        if file_obj is None:
            errors = [{"code": "file_not_found", "message": f"the input file {batch['input_file_id']} was deleted",
                       "param": "input_file_id", "line": None}]
            result = None
        else:
            result = validate_lines(self.store.lines(file_obj), file_obj["bytes"], batch["endpoint"], served)
            errors = result.errors
        if self.store.cancel_requested_at(batch["id"]) is not None:
            batch.update(status="cancelled", cancelling_at=now, cancelled_at=now)
        elif errors:
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
        else:
            batch.update(status="in_progress", in_progress_at=now, _model=result.model, model=result.model,
                         request_counts={"total": result.total, "completed": 0, "failed": 0})
        self.store.save_batch(batch)
        log.info("batch %s: %s", batch["id"], batch["status"])

    # --- running ---

    def spec_of(self, batch: dict[str, Any]):
        model = batch["_model"]
        return batch_job.job_spec(self.store, batch, self.base_url, model, self.shard_rows,
                                  int(self.served[model]["max_in_flight"]))

    def _start_job(self, batch: dict[str, Any]) -> None:
        spec = self.spec_of(batch)
        path = os.path.join(self.workdir, f"{batch['id']}.yaml")
        with open(path, "w") as fh:
            fh.write(batch_job.spec_yaml(spec))
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the job runs without Ray
        env[batch_job.API_KEY_ENV] = self.api_key or "EMPTY"
        logfile = open(os.path.join(self.workdir, f"{batch['id']}.log"), "ab")
        self.child = subprocess.Popen([sys.executable, "-m", "fleetllm", "run", path,
                                       "--max-error-rate", "1"], stdout=logfile,
                                      stderr=subprocess.STDOUT, env=env)
        logfile.close()
        self.child_batch = batch["id"]
        log.info("batch %s: job started (pid %s)", batch["id"], self.child.pid)

    def _check_child(self) -> None:
        if self.child is None or self.child.poll() is None:
            return
        batch = self.store.get_batch(self.child_batch)
        rc, self.child, self.child_batch = self.child.returncode, None, None
        if batch is None or batch["status"] in TERMINAL:
            return
        if rc == 0:
            self.attempts.pop(batch["id"], None)
            batch.update(status="finalizing", finalizing_at=batch.get("finalizing_at") or int(time.time()))
            self.store.save_batch(batch)
            self.finish(batch, "completed")
            return
        self.attempts[batch["id"]] = self.attempts.get(batch["id"], 0) + 1
        if self.attempts[batch["id"]] >= MAX_ATTEMPTS:
            tail = self._log_tail(batch["id"])
            now = int(time.time())
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": [
                {"code": "job_failed", "message": f"the batch job failed {MAX_ATTEMPTS} times; last: {tail}",
                 "param": None, "line": None}]})
            self.store.save_batch(batch)

    def _log_tail(self, batch_id: str) -> str:
        try:
            with open(os.path.join(self.workdir, f"{batch_id}.log"), errors="replace") as fh:
                return fh.read()[-1000:].strip()
        except OSError:
            return "(no log)"

    def _kill_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        self.child, self.child_batch = None, None

    def _update_counts(self, batch_id: str) -> None:
        batch = self.store.get_batch(batch_id)
        if batch is None or batch["status"] in TERMINAL:
            return
        completed, failed = batch_job.committed_counts(self.store, batch_id)
        counts = batch["request_counts"]
        if (counts["completed"], counts["failed"]) != (completed, failed):
            counts.update(completed=completed, failed=failed)
            self.store.save_batch(batch)

    # --- the end ---

    def end_early(self, batch: dict[str, Any], status: str) -> None:
        """Cancel or expire: stop the job now, keep what was committed."""
        if self.child_batch == batch["id"]:
            self._kill_child()
        now = int(time.time())
        if status == "cancelled":
            batch.update(status="cancelling", cancelling_at=self.store.cancel_requested_at(batch["id"]) or now)
            self.store.save_batch(batch)
        if batch.get("_model"):
            batch_job.finalize_partial(self.spec_of(batch))
        self.finish(batch, status)

    def finish(self, batch: dict[str, Any], status: str) -> None:
        """Register the output and error files (None where empty) and record the final status."""
        rel = f"batches/{batch['id']}/job"
        short = batch["id"].removeprefix("batch_")
        completed = batch_job.count_lines(self.store, f"{rel}/output.jsonl")
        failed = batch_job.count_lines(self.store, f"{rel}/errors.jsonl")
        if completed:
            self.store.register_file(f"file-out-{short}", f"{batch['id']}_output.jsonl", "batch_output",
                                     f"{rel}/output.jsonl")
        if failed:
            self.store.register_file(f"file-err-{short}", f"{batch['id']}_error.jsonl", "batch_output",
                                     f"{rel}/errors.jsonl")
        now = int(time.time())
        batch["request_counts"].update(completed=completed, failed=failed)
        batch["usage"] = batch_job.usage(self.store, batch["id"])
        batch.update(status=status, output_file_id=f"file-out-{short}" if completed else None,
                     error_file_id=f"file-err-{short}" if failed else None)
        batch[{"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}[status]] = now
        self.store.save_batch(batch)
        log.info("batch %s: %s (%d completed, %d failed)", batch["id"], status, completed, failed)
