"""A run worth watching: `fleetllm run` is quiet (its own lines only; Ray's and the engine's kept in
OUT/_fleetllm/logs/), and `fleetllm report OUT` writes a page that headless Chromium renders with
its charts."""

import json
import re

import pytest
from test_cli_run import fleetllm, write_job

from fleetllm.testing.browser import chromium, screenshot

NOISE = re.compile(r"ERROR|Traceback|core_worker|INFO \d\d-\d\d|WARNING \d\d-\d\d")  # vLLM log lines: "INFO 12-03 23:41:16 [model.py:733]"


def assert_quiet_and_logged(proc, out):
    terminal = proc.stdout + proc.stderr
    assert not NOISE.search(terminal), terminal[-3000:]
    logs = list((out / "_fleetllm" / "logs").glob("run-*.log"))
    assert logs and f"logs: {out / '_fleetllm' / 'logs'}" in terminal
    if not json.loads((out / "_SUCCESS").read_text()).get("in_process"):  # in process, there is no Ray
        assert list((out / "_fleetllm" / "logs" / "ray").glob("worker-*")), "the Ray workers' logs are kept"


def test_quiet_run_then_a_report_a_browser_renders(tmp_path, tiny_model):
    rows = [{"id": f"r{i}", "instruction": f"Count to {i}."} for i in range(10)] + [{"id": "bad", "other": "x"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(tmp_path, model={"source": tiny_model}, sampling={"max_tokens": 6},
                    output={"shard_rows": 4}, compute={"cpus_per_replica": 1, "batch_size": 4})
    proc = fleetllm("run", str(job), "--max-error-rate", "0.5", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert_quiet_and_logged(proc, out)
    run = json.loads((out / "_SUCCESS").read_text())
    series = run["series"]
    assert [p[1] for p in series["commits"]["points"]] and sum(p[1] for p in series["commits"]["points"]) == 11
    assert sum(r["rows"] for r in series["replicas"]) == 11
    assert set(series["time_split_s"]) == {"start_up", "generation", "commit", "other"}

    rep = fleetllm("report", str(out), timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    page = (out / "_fleetllm" / "report.html").read_text()
    charts = re.findall(r'data-chart="([^"]+)"><svg', page)
    assert charts == ["Throughput", "Time split", "Input tokens", "Output tokens", "Replicas", "Nodes"]
    assert "prompt.template needs column" in page and "<code>bad</code>" in page  # errors by kind, with the row
    assert not re.search(r"<script|<link|<img|src=|@import", page)  # self-contained: nothing fetched

    if chromium() is None:
        pytest.skip("chromium is not installed (make test installs it)")
    png = screenshot(out / "_fleetllm" / "report.html", tmp_path / "report.png")
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))[..., :3].reshape(-1, 3)
    blue = ((abs(pixels[:, 0] - 0x4C / 255) < 0.03) & (abs(pixels[:, 1] - 0x78 / 255) < 0.03)
            & (abs(pixels[:, 2] - 0xA8 / 255) < 0.03)).sum()
    orange = ((abs(pixels[:, 0] - 0xF5 / 255) < 0.03) & (abs(pixels[:, 1] - 0x85 / 255) < 0.03)).sum()
    assert blue > 2000 and orange > 2000, (blue, orange)  # the charts are drawn, not just the text
