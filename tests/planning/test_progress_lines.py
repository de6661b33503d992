"""Progress lines on stderr (`kvsim.planning.progress_lines`): counts, the throttle, the last line."""

from kvsim.planning.progress_lines import Lines


def test_lines_count_and_throttle(capsys):
    every = Lines("sweep", 3, every_s=0.0)
    every.advance(what="rate 2")
    every.advance()
    every.advance()
    err = capsys.readouterr().err.splitlines()
    assert [e.split(",")[0] for e in err] == ["sweep: 1 of 3 runs done (rate 2)", "sweep: 2 of 3 runs done",
                                              "sweep: 3 of 3 runs done"]
    assert "left" in err[0] and "left" not in err[2]
    quiet = Lines("paper", 4, "points", every_s=3600.0)      # the first and the last line only
    for _ in range(4):
        quiet.advance()
    err = capsys.readouterr().err.splitlines()
    assert [e.split(",")[0] for e in err] == ["paper: 1 of 4 points done", "paper: 4 of 4 points done"]
