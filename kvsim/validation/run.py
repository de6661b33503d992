"""`MeasuredRun`: one measured run as the readers (`kvsim.validation.measured`, `kvsim.validation.bench`)
give it. Times in the measured dicts are milliseconds, throughput requests per second."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The clients whose metric definitions kvsim follows (`kvsim.validation.metrics`).
CLIENTS = ("inference-perf", "vllm-engine", "vllm-bench-serve")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run. `server`: the `server.json` object (model, hf_config, gpu, TP/DP, flags);
    `workload`: how to regenerate the requests (`kvsim.validation.workload`); `requests`: per-request
    rows when the client sent a known list (arrival_s, prompt_tokens, output_tokens, measured times);
    `measured`: {stage index: {metric: value}} with -1 the whole run (metric names of
    `kvsim.validation.metrics.METRICS`); `client`: one of CLIENTS; `client_output_mean`: the client's own
    mean count of output tokens (inference-perf re-tokenizes the stream) where it differs from what the
    server generated; `published`: other simulators' predictions of this run ({simulator: {key: value}})."""

    name: str
    source: str
    server: dict
    workload: dict
    measured: dict
    client: str
    requests: tuple = ()
    overloaded: bool = False
    client_output_mean: float | None = None
    published: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ValueError(f"{self.source}: unknown client {self.client!r}; known: {', '.join(CLIENTS)}")
        if -1 not in self.measured:
            raise ValueError(f"{self.source}: no whole-run measurements (stage_index -1)")
