"""Time and cost estimates: the throughput model (model.py), what engine calls tell it (observe.py),
profiles and output lengths kept under $FLEETLLM_HOME (store.py), and the estimate of a job, its
range, its ETA and its deadline (estimate.py, deadline.py). Imports nothing of fleetllm.batch: the
batch package feeds it (fleetllm/batch/reports/estimate_job.py, estimate_probe.py, estimate_live.py)."""
