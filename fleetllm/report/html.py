"""`fleetllm report OUT`: OUT/_fleetllm/report.html, one self-contained page (charts as inline SVG drawn with
matplotlib): throughput over time, where the time went, input/output token lengths, errors by kind
with sample rows, and each replica's and node's share of the rows."""

from __future__ import annotations

import html
import io
import posixpath
from typing import Any

import fsspec

from fleetllm.report.data import ReportData, load

COLORS = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2"]


def _figure(width: float = 6.4, height: float = 3.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _svg(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def throughput_chart(run: dict[str, Any]) -> str | None:
    points = (run.get("series") or {}).get("commits", {}).get("points") or []
    if not points:
        return None
    fig, ax = _figure()
    t = [0.0] + [p[0] for p in points]
    rows = [0]
    for p in points:
        rows.append(rows[-1] + p[1])
    ax.step(t, rows, where="post", color=COLORS[0], label="rows committed")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("rows committed", color=COLORS[0])
    ax2 = ax.twinx()
    start = ((run.get("series") or {}).get("time_split_s") or {}).get("start_up", 0.0)  # engine ready
    rates = [p[2] / max(p[0] - max(prev, start), 1e-6) for prev, p in zip(t, points)]
    ax2.plot([p[0] for p in points], rates, "o-", color=COLORS[1], label="output tokens/s")
    ax2.set_ylabel("output tokens/s (per shard)", color=COLORS[1])
    ax2.spines[["top"]].set_visible(False)
    ax.set_title("Throughput over time")
    return _svg(fig)


def time_split_chart(run: dict[str, Any]) -> str | None:
    split = (run.get("series") or {}).get("time_split_s")
    if not split:
        return None
    fig, ax = _figure(height=2.4)
    left = 0.0
    for k, (name, value) in enumerate(split.items()):
        ax.barh([0], [value], left=left, color=COLORS[k % len(COLORS)], label=f"{name.replace('_', '-')} {value:.1f}s")
        left += value
    ax.set_yticks([])
    ax.set_xlabel("seconds")
    ax.legend(ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.set_title("Where the time went")
    return _svg(fig)


def histogram(values: list[int], title: str, color: str) -> str | None:
    if not values:
        return None
    fig, ax = _figure(width=4.6)
    lo, hi = min(values), max(values)
    bins = [b - 0.5 for b in range(lo, hi + 2)] if hi - lo < 30 else 30  # whole tokens when the range is small
    ax.hist(values, bins=bins, color=color, edgecolor="white")
    ax.set_xlabel("tokens")
    ax.set_ylabel("rows")
    ax.set_title(f"{title} (n={len(values)}, median {sorted(values)[len(values) // 2]})")
    return _svg(fig)


def shares_chart(labels: list[str], rows: list[float], title: str) -> str | None:
    if not rows:
        return None
    fig, ax = _figure(width=4.6, height=max(1.6, 0.45 * len(rows) + 1.0))
    total = sum(rows) or 1
    ax.barh(range(len(rows)), rows, color=COLORS[2])
    ax.set_yticks(range(len(rows)), labels)
    for i, r in enumerate(rows):
        ax.text(r, i, f" {r:.0f} ({r / total:.0%})", va="center")
    ax.set_xlabel("rows")
    ax.set_xlim(0, max(rows) * 1.3)
    ax.set_title(title)
    return _svg(fig)


def _errors_table(data: ReportData) -> str:
    if not data.error_counts:
        return "<p>No row failed.</p>"
    out = ["<table><tr><th>kind</th><th>rows</th><th>sample rows</th></tr>"]
    for kind, n in data.error_counts.most_common():
        samples = "".join(f"<div><code>{html.escape(s['row_id'])}</code>: {html.escape(s['error'])}</div>"
                          for s in data.errors[kind])
        out.append(f"<tr><td>{html.escape(kind)}</td><td>{n}</td><td>{samples}</td></tr>")
    return "".join(out) + "</table>"


def _summary(run: dict[str, Any]) -> str:
    model, engine = run.get("model", {}), run.get("engine", {})
    items = [("job", run.get("name")), ("model", f"{model.get('source')} ({model.get('kind')})"),
             ("engine", f"{engine.get('name')} {engine.get('version') or ''}"),
             ("rows", f"{run.get('rows')} ({run.get('rows_computed')} computed, {run.get('rows_skipped')} resumed)"),
             ("errors", f"{run.get('errors')} ({run.get('error_rate', 0):.1%})"),
             ("tokens", f"{run.get('input_tokens')} in, {run.get('output_tokens')} out"),
             ("wall time", f"{run.get('wall_time_s')} s"),
             ("throughput", f"{run.get('rows_per_s')} rows/s, {run.get('output_tokens_per_s')} output tokens/s "
                            f"({run.get('output_tokens_per_s_after_engine_start')} after engine start)"),
             ("replicas", f"{run.get('replicas')} x {run.get('resources_per_replica')}"),
             ("complete", "yes" if run.get("complete") else "no (run it again to resume)")]
    rows = "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in items)
    return "<table class=kv>" + rows + "</table>"


def render(data: ReportData) -> str:
    run = data.run
    replicas = (run.get("series") or {}).get("replicas") or []
    charts = [
        ("Throughput", throughput_chart(run)),
        ("Time split", time_split_chart(run)),
        ("Input tokens", histogram(data.input_tokens, "Input tokens per row", COLORS[0])),
        ("Output tokens", histogram(data.output_tokens, "Output tokens per row", COLORS[1])),
        ("Replicas", shares_chart([f"replica {r['replica']} ({(r['node'] or '?')[:8]})" for r in replicas],
                                  [r["rows"] for r in replicas], "Rows per replica (this run)")),
        ("Nodes", shares_chart([n[:12] for n in data.node_rows], list(data.node_rows.values()), "Rows per node")),
    ]
    figures = "".join(f'<figure class=chart data-chart="{name}">{svg}</figure>' for name, svg in charts if svg)
    missing = [name for name, svg in charts if not svg]
    note = (f"<p class=note>Not recorded for this run: {', '.join(missing)} (older run record, or no rows).</p>"
            if missing else "")
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>fleetllm report: {html.escape(str(run.get('name')))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }}
h1 {{ font-size: 22px; margin-bottom: 4px; }} h2 {{ font-size: 17px; margin-top: 28px; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 4px 10px; border-bottom: 1px solid #ddd;
  vertical-align: top; }}
table.kv th {{ color: #555; font-weight: 600; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }} figure.chart {{ margin: 0; }}
figure.chart svg {{ max-width: 100%; height: auto; }} .note {{ color: #777; }}
</style></head><body>
<h1>fleetllm run report: {html.escape(str(run.get('name')))}</h1>
{_summary(run)}
<h2>Charts</h2><div class=charts>{figures}</div>{note}
<h2>Errors by kind</h2>{_errors_table(data)}
</body></html>
"""


def write_report(out_path: str) -> str:
    """Write OUT/_fleetllm/report.html (where readers of the folder skip it, and a resume knows it);
    returns its location."""
    from fleetllm.batch.output.commit import META, REPORT_PAGE

    page = render(load(out_path))
    fs, root = fsspec.core.url_to_fs(out_path)
    target = posixpath.join(root, META, REPORT_PAGE)
    with fs.open(target, "w") as fh:
        fh.write(page)
    return f"{out_path.rstrip('/')}/{META}/{REPORT_PAGE}"
