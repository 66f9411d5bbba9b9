"""A job's `environment:` reaches its engine replica for real: env_vars and working_dir through Ray's
runtime_env. The working_dir holds a sitecustomize.py (on the workers' sys.path, run at their start)
that records, in the process that loads the model's weights (the engine replica: it opens the
model's generation_config.json), the env var it sees. pip installs cannot reach
PyPI in a test; tests/unit/test_environment.py checks their rendering."""

import json

from test_cli_run import fleetllm, write_job

SITECUSTOMIZE = '''
import os, sys
def _hook(event, args):
    if event == "open" and str(args[0]).endswith("generation_config.json"):
        with open(os.environ["FLEETLLM_TEST_RECORD"], "a") as fh:
            fh.write(f"{os.getpid()} {os.environ.get('FLEETLLM_TEST_MARK')}\\n")
sys.addaudithook(_hook)
'''


def test_env_vars_and_working_dir_reach_the_replica(tmp_path, tiny_model):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "instruction": f"Say {i}"}) + "\n"
                                               for i in range(3)))
    code = tmp_path / "code"
    code.mkdir()
    (code / "sitecustomize.py").write_text(SITECUSTOMIZE)
    record = tmp_path / "record.txt"
    env = {"env_vars": {"FLEETLLM_TEST_MARK": "from-the-spec", "FLEETLLM_TEST_RECORD": str(record)},
           "working_dir": str(code), "pip": []}
    job = write_job(tmp_path, model={"source": tiny_model}, sampling={"max_tokens": 3},
                    compute={"cpus_per_replica": 1})
    text = job.read_text() + "environment: " + json.dumps(env) + "\n"
    job.write_text(text)
    dry = fleetllm("run", str(job), "--dry-run", timeout=300)
    assert "environment env_vars ['FLEETLLM_TEST_MARK', 'FLEETLLM_TEST_RECORD']; working_dir" in dry.stdout
    proc = fleetllm("run", str(job), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = record.read_text().split("\n")
    replica = [ln.split() for ln in lines if ln]
    assert replica and all(mark == "from-the-spec" for _, mark in replica)
