"""One number per quantity (issue 41): the start-up lines follow --kv-gib and --num-blocks, `kvsim run`
keeps its start-up lines and notes on stderr (the summary alone on stdout), and `--allocator jenga`
names itself with the one capacity its summary reports, in its own unit."""

import re

from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.planning.reports.ledger import ledger_lines, memory_ledger
from kvsim.planning.runs import make_config
from kvsim.trace.synthetic import generate
from kvsim.trace.jsonl import write_jsonl


def test_startup_lines_say_which_flag_sized_the_cache():
    auto = ledger_lines(memory_ledger(make_config(model="llama-3-8b", gpu="h100-80gb")))
    assert "the rest of the memory reserved for KV Cache is 54.59GiB." in auto[2] and "Not what" not in auto[2]
    assert auto[3] == "Available KV cache memory: 54.59 GiB"
    fixed = ledger_lines(memory_ledger(make_config(model="llama-3-8b", gpu="h100-80gb", kv_gib=2)))
    assert fixed[2].endswith("is 54.59GiB. (Not what this run uses: --kv-gib sets the KV cache, below.)")
    # 2 GiB / (2 x 32 layers x 8 heads x 128 x 2 bytes = 128 KiB per token) = 16,384 tokens
    assert fixed[3:5] == ["Available KV cache memory: 2.00 GiB (set by --kv-gib)",
                          "GPU KV cache size: 16,384 tokens (1,024 blocks of 16)"]
    blocks = ledger_lines(memory_ledger(make_config(model="llama-3-8b", gpu="h100-80gb", num_blocks=500)))
    assert "--num-blocks (--num-gpu-blocks-override) sets the KV cache" in blocks[2]
    assert blocks[4] == "GPU KV cache size: 8,000 tokens (500 blocks of 16)"


def test_run_prints_its_startup_on_stderr_and_jenga_names_its_one_capacity(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_jsonl(generate("sharegpt", rate_rps=2.0, num_requests=20, seed=0), trace)
    r = CliRunner().invoke(app, ["run", str(trace), "--model", "gemma-3-27b", "--gpu", "h100-80gb",
                                 "--allocator", "jenga"])
    assert r.exit_code == 0, r.output
    assert "INFO" not in r.stdout and "INFO Model loading took" in r.stderr
    err = " ".join(r.stderr.split())
    assert "simulated as Jenga's LCM two-level allocator" in err and "vLLM's hybrid KV cache manager:" not in err
    slots = re.search(r"KV capacity ([\d,]+) token slots of ([\d,]+) bytes", err)
    assert slots, err
    summary = re.search(r"KV capacity \(tokens\)\s*│\s*([\d,]+)", r.stdout).group(1)
    assert summary == slots.group(1)


def test_capacity_help_lists_the_vllm_spellings_it_accepts():
    r = CliRunner().invoke(app, ["capacity", "--help"])
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "vLLM flags accepted as `vllm serve` spells them" in text
    for spelling in ("--gpu- memory-utilization (= --gpu-mem-util)", "--num-gpu-blocks-override (= --num-blocks)",
                     "--enable-prefix-caching", "--port"):
        assert spelling.replace("- ", "-") in text.replace("- ", "-"), spelling


def test_a_raised_block_size_comes_with_its_reason():
    from kvsim.engine.config import kv_cache_plan
    plan = kv_cache_plan(make_config(model="qwen3-next-80b-a3b", gpu="h200", tp=2))
    # the Mamba state, 548,864 bytes per GPU, over 1,024 bytes per token of one attention page: 536 tokens,
    # up to a multiple of the kernel's 16: 544
    assert plan.block_size == 16 * -(-(548_864 // 1_024) // 16) == 544
    assert plan.note.startswith("block size 544 tokens, not 16: vLLM raises the attention block size")
    assert "(1,024 bytes per token per GPU x block)" in plan.note and "(548,864 bytes per GPU at TP 2)" in plan.note


def test_a_model_config_is_named_after_the_config_not_its_folder(tmp_path):
    import json
    from pathlib import Path

    from kvsim.specs.hf.config import load_hf_config

    src = sorted((Path(__file__).parents[1] / "data" / "hf_configs").glob("*.json"))[0]
    cfg = {k: v for k, v in json.loads(src.read_text()).items() if k != "_name_or_path"}
    arch = cfg["architectures"][0]
    for folder, file, want in (("cfg", "config.json", arch), ("hf_configs", "config.json", arch),
                               ("Meta-Llama-3-8B", "config.json", "Meta-Llama-3-8B"),
                               ("cfg", "my-model.json", "my-model")):
        path = tmp_path / folder / file
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(cfg))
        assert load_hf_config(path).name == want
    named = tmp_path / "cfg" / "config.json"
    named.write_text(json.dumps({**cfg, "_name_or_path": "org/model-x"}))
    assert load_hf_config(named).name == "org/model-x"


def test_quick_studies_leave_the_shipped_reports_alone(tmp_path, monkeypatch):
    # a clone holds reports/vllm-paper and reports/hybrid-models: --quick writes elsewhere, so it does not
    # stop at "folder exists" (a bad --duration then is the first error it meets)
    monkeypatch.chdir(tmp_path)
    for name in ("vllm-paper", "hybrid-models"):
        (tmp_path / "reports" / name).mkdir(parents=True)
        (tmp_path / "reports" / name / "report.md").write_text("shipped\n")
    r = CliRunner().invoke(app, ["paper", "--quick", "--duration", "-1"])
    assert r.exit_code == 2 and "--duration" in r.output and "exists" not in r.output, r.output
    r = CliRunner().invoke(app, ["hybrid-study", "--quick", "--duration", "-1"])
    assert r.exit_code == 2 and "--duration" in r.output and "exists" not in r.output, r.output


def test_block_sizes_the_kernel_cannot_run_are_flagged():
    from kvsim.planning.kernel_check import kernel_warnings
    got = kernel_warnings([1, 16, 24, 32], [None, "vllm-2023"])
    # vllm-v1's FlashAttention runs multiples of 16; the 2023 paged kernel 8, 16 and 32
    assert [w.split(":")[0] + " " + w.split("(")[1].split(")")[0] for w in got] == [
        "block size 1 vllm-v1", "block size 24 vllm-v1", "block size 1 vllm-2023", "block size 24 vllm-2023"]
    assert kernel_warnings([None], [None]) == [] and kernel_warnings([16], ["no-such-profile"]) == []


def test_block_sizes_within_the_tolerance_say_keep_the_default():
    import pandas as pd

    from kvsim.planning.tune_notes import within_note
    curve = pd.DataFrame({"capacity_tokens_per_s": [990.0, 1000.0, 700.0]}, index=[16, 64, 256])
    # 16 is 1 % below the best (64), inside 2 %: keep the default
    assert within_note(curve, 64, (16, 64), 0.02) == (
        "Block sizes 16 to 64 are within 2% of the best. No difference here worth a change: the default, 16, "
        "is 1.0% below the best, less than this model can tell apart; keep the default.")
    assert within_note(curve, 64, (16, 64), 0.005).startswith("Block sizes 16 to 64") is True
    assert "keep the default" not in within_note(curve, 64, (16, 64), 0.005)   # 1 % > 0.5 %
    assert within_note(curve, 64, (64, 64), 0.02) == "No other block size comes within 2% of it."
    # the headline says the same, not "recommended: 64" above a reason that says keep 16
    from kvsim.planning.tune_notes import headline
    assert headline(curve, 64, (16, 64), 0.02) == ("keep the default block size, 16 tokens: the best, 64, is only "
                                                   "1.0% ahead (within 2%, less than this model can tell apart)")
    assert headline(curve.rename_axis("block_size").reset_index(), 64, (16, 64), 0.005) == (
        "recommended block size: 64 tokens (within 0.5%: 16-64)")


def test_the_fleet_report_counts_the_requests_too_long_for_the_model():
    import numpy as np

    from kvsim.planning.studies.fleet_report import fleet_report
    from kvsim.trace.table import Trace

    # opt-13b's maximum is 2,048 tokens: 2,000 + 100 and 1,500 + 600 are too long, 100 + 10 is not
    tr = Trace.from_arrays(np.array([0.0, 0.5, 1.0]), np.array([100, 2000, 1500]), np.array([10, 100, 600]))
    rep = fleet_report(tr, "", {"model": "opt-13b", "kv_gib": 12, "num_blocks": None}, replicas=[1],
                       routers=["round-robin"], splits=())
    text = rep.markdown()
    assert ("2 of 3 requests are longer than the model's maximum (2,048 tokens, prompt + output): every "
            "layout rejects them, and SLO attainment counts them as misses.") in text
    assert "None" not in text


def test_an_slo_no_layout_meets_is_said_not_to_fit():
    import pandas as pd

    from kvsim.planning.studies.fleet_report import slo_fit_note
    table = pd.DataFrame({"layout": ["4 colocated, round-robin", "1P:3D"], "slo_attainment": [0.07, 0.02],
                          "ttft_s_p50": [0.9, 0.4], "tpot_s_p50": [0.03, 0.02]})
    assert slo_fit_note(table, 0.2, 0.1) == (
        "The SLO is the user's (`--ttft-slo 0.2`, `--tpot-slo 0.1`; DistServe's defaults when not given). It "
        "does not fit this workload: the best layout (4 colocated, round-robin) serves 7% of requests within "
        "it, with TTFT p50 0.9 s and TPOT p50 0.03 s; an SLO near those would compare the layouts.")
    fits = table.assign(slo_attainment=[0.95, 0.9])
    assert slo_fit_note(fits, 0.2, 0.1).endswith("defaults when not given).")
