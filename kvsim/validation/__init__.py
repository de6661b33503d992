"""Real measured runs: read them, regenerate their workload as the client sent it, replay them through
kvsim with the server's flags, compare per metric (absolute percentage error, medians over runs) and fit
a few named profile parameters to them with leave-one-out error.

Modules: `measured` (the run readers: a folder of `real-runs/`, a `vllm bench serve --save-result` JSON,
a per-request JSONL; `inference_perf` an inference-perf report folder), `server` (server flags -> SimConfig), `workload` (Trace regeneration),
`client_path` (the HTTP/tokenization term), `metrics` (each client's metric definitions), `compare`
(errors and medians), `replay` (one run end to end), `fit` (calibration), `report` (reports/sim-to-real).
Imports the public simulator API and `kvsim.specs`, `kvsim.cost`; nothing imports this package but the CLI.
"""
