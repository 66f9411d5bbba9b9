"""Run reports: the series a run keeps in its run record (_SUCCESS) (series.py) and `fleetllm report OUT` (html.py)."""
