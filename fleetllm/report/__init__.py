"""Run reports: the series a run keeps in run.json (series.py) and `fleetllm report OUT` (html.py)."""
