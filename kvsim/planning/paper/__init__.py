"""The vLLM paper's experiments replayed: the runs, the report beside the published figures,
and the differences table.

May import the rest of planning (runs, sweep, rate, reports) and the engine; never the CLI.
"""
