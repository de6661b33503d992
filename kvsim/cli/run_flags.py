"""`kvsim run`'s flags checked against the one flag table (`kvsim.planning.flag_table`) before any work:
a flag the user gave (not a default) that cannot apply to this run (one engine, replicas or a P/D split;
the allocator; a hybrid model or not) is refused naming it and why; one vLLM accepts and ignores is kept
with a one-line note on stderr."""

from __future__ import annotations

#: `run`'s parameter names that differ from the table's flag names.
_NAMES = {"bal_abs": "router_balance_abs", "bal_rel": "router_balance_rel", "cache_thr": "router_cache_threshold"}


def given_flags() -> dict:
    """The running command's parameters the user gave on the command line, by the table's names (enum
    values as their strings)."""
    from kvsim.cli.vllm_args import get_current_context
    try:
        from typer._click.core import ParameterSource
    except ImportError:  # pragma: no cover - older typer runs on click itself
        from click.core import ParameterSource
    ctx = get_current_context(silent=True)
    if ctx is None:
        return {}
    out = {}
    for name, value in ctx.params.items():
        if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            out[_NAMES.get(name, name)] = getattr(value, "value", value)
    return out


def check_run_flags(cfg) -> None:
    """ValueError naming the first flag given that cannot apply to `cfg`'s run; notes on stderr."""
    import typer

    from kvsim.planning.flag_table import check_flags, setup_of

    given = given_flags()
    flags = {**given, "allocator": cfg.cache.allocator}
    for note in check_flags(given, setup_of(flags, hybrid=cfg.deployment.model.is_hybrid)):
        typer.echo(note, err=True)
