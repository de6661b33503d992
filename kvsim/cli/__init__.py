"""The `kvsim` command line: the typer app (`app`), commands loaded on first use (`lazy`), the error
policy (`errors`: one line, exit 2), console tables and result folders (`output`), and one module per
command group. Imports anything in kvsim; nothing in kvsim imports it. Kept empty so that
`kvsim --help` loads only what it needs.
"""
