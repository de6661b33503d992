"""`gpus_for_rate` (issue 41): every TP degree whose single replica fits within the fewest GPUs found is
searched (TP 4 x 1 is compared with TP 2 x 2), a single-replica search already made is reused (one rate
per TP in both tables), and progress says what is tried and why a degree is dropped. One replica's
search is faked (its answers set by hand); the TP configurations are real."""

from types import SimpleNamespace

from kvsim.planning.rate import gpus as rate_gpus


def fake(rates: dict[int, float], calls: list):
    def max_rate(slo, cfg, **kw):
        calls.append(cfg.deployment.tp)
        return SimpleNamespace(rate_rps=rates[cfg.deployment.tp], limit_key="kv_memory", note="")
    return max_rate


def test_every_tp_within_the_fewest_gpus_is_compared_and_a_known_search_reused(monkeypatch):
    calls, said = [], []
    monkeypatch.setattr(rate_gpus, "max_rate", fake({1: 3.0, 2: 5.0, 4: 20.0, 8: 40.0}, calls))
    known = {1: SimpleNamespace(rate_rps=3.95, limit_key="kv_memory", note="")}
    df = rate_gpus.gpus_for_rate(20.0, {"ttft_p99": 2}, model="llama-3-8b", gpu="h100-80gb",
                                 known=known, progress=said.append).set_index("tp")
    # TP 1: 3.95 (reused, not searched) -> 6 replicas = 6 GPUs; TP 2: 5 -> 4 x 2 = 8 GPUs, tried (2 <= 6);
    # TP 4: 20 -> 1 replica = 4 GPUs, tried (4 <= 6), now the fewest; TP 8 > 4: not tried
    assert calls == [2, 4]
    assert df.max_rate_rps[1] == 3.95 and df.replicas[1] == 6 and df.gpus[1] == 6
    assert df.gpus[2] == 8 and df.gpus[4] == 4 and df.best[4] and not df.best[1]
    assert df.note[8] == "not tried: 4 GPUs already suffice, fewer than one replica of TP 8"
    assert said[0] == ("gpus-for: TP 1 (1 of 4): the highest rate one replica serves under the SLO "
                       "(from the rate search above)")
    assert "gpus-for: TP 4: 20 req/s per replica -> 1 replica(s) = 4 GPUs" in said
    assert said[-1] == "gpus-for: TP 8 (4 of 4): not tried: 4 GPUs already suffice, fewer than one replica of TP 8"


def test_a_tie_in_gpus_keeps_both_rows_and_marks_the_smaller_tp(monkeypatch):
    calls = []
    monkeypatch.setattr(rate_gpus, "max_rate", fake({1: 10.0, 2: 20.0, 4: 20.0, 8: 20.0}, calls))
    df = rate_gpus.gpus_for_rate(20.0, {"ttft_p99": 2}, model="llama-3-8b", gpu="h100-80gb").set_index("tp")
    assert calls == [1, 2] and df.gpus[1] == 2 and df.gpus[2] == 2 and df.best[1] and not df.best[2]
    assert df.note[4].startswith("not tried")
