"""Studies that answer one question across layouts: hybrid models under each KV cache
manager, and the fleet section of a report (routers and P/D splits).

May import the rest of planning, the fleet and the engine; never the CLI.
"""
