"""The OpenAI Batch API's objects: uploaded files and batch records in a folder or object-store prefix
(store.py), and the validation of a batch file (validate.py). The routes are fleetllm.serve.batch_routes;
the runner, which runs each batch as a fleetllm job, is fleetllm.batch.api_service (docs/batch-api.md)."""
