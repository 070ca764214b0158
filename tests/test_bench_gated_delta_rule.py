"""The gated delta rule bench (experiments/bench/gated_delta_rule.py): its GPU step in the GPU script,
its CPU dry run end to end, and the peer gate that keeps a wrong peer's time out (fla's layout fed our
inputs, against our fp64 oracle)."""

import csv
import math

import pytest
import torch

from experiments.bench import gated_delta_rule as bench
from experiments.bench import gpu_check as gc
from experiments.bench import peers

SHAPE = bench.Shape(HK=2, HV=4, K=8, V=6)  # HK < HV: the adapters must repeat each key head over 2 value heads
FETCHED = (peers.peers_dir() / "VERSIONS").is_file()


def delta_recurrence(q, k, v, beta, g, scale=None, initial_state=None, output_final_state=True):
    """The gated delta rule by its definition, in fla's naive layout (q/k/v (1, T, H, D), beta/g (1, T, H),
    state (1, H, K, V)), one head per value head: S = e^g S; S += k (x) beta (v - S^T k); o = S^T (scale q)."""
    S = initial_state[0].double().clone()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = []
    for t in range(q.shape[1]):
        kt, qt = k[0, t].double(), q[0, t].double() * scale
        S = torch.exp(g[0, t].double())[:, None, None] * S
        delta = beta[0, t].double()[:, None] * (v[0, t].double() - torch.einsum("hkv,hk->hv", S, kt))
        S = S + kt[:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hkv,hk->hv", S, qt))
    return torch.stack(out)[None].float(), S[None].float()


# ---- the GPU script's step ---------------------------------------------------------------------------

def test_the_step_is_in_the_gpu_script():
    step = next(s for s in gc.STEPS if s.name == "gdn")
    assert gc.STEP_NAMES.index("gdn") == gc.STEP_NAMES.index("ssd") + 1  # beside the other scan
    run = gc.Run(gc.Path("/w"), gc.Path("/o"), False, None)
    argv = step.argv(run)
    assert argv[1:3] == ["-m", "experiments.bench.gated_delta_rule"] and "--device" not in argv
    assert "8192,32768" in argv and argv[argv.index("--out") + 1] == "/w/gdn"
    dry = step.dry_argv(run)
    assert dry[dry.index("--device") + 1] == "cpu" and dry[dry.index("--model") + 1] == "qwen3-next-tiny"
    assert step.archive == "ssd" and step.min_s <= step.budget_s  # one tarball fewer: 8 files come back


def test_a_step_sharing_a_tarball_is_packed_beside_the_other(tmp_path):
    """ssd then gdn: ssd.tar.gz holds both folders (and ssd's alone after the first)."""
    import sys
    import tarfile
    import time

    def argv(r):
        return [sys.executable, "-c", "print('ran')"]

    run = gc.Run(tmp_path / "w", tmp_path, dry=False, ceilings=None)
    for name in ("ssd", "gdn"):
        shared = next(s for s in gc.STEPS if s.name == name)
        rec = gc.run_step(gc.Step(name, 20, 1, argv, argv, shared.archive), run, time.monotonic() + 60)
        assert rec["status"] == "ok" and rec["archive"] == "ssd.tar.gz"
        with tarfile.open(tmp_path / "ssd.tar.gz") as tar:
            logs = {n for n in tar.getnames() if n.endswith("log.txt")}
        assert logs == ({"ssd/log.txt"} if name == "ssd" else {"ssd/log.txt", "gdn/log.txt"})
    assert not (tmp_path / "gdn.tar.gz").exists()


# ---- the CPU dry run ---------------------------------------------------------------------------------

def test_the_dry_run_works_on_the_cpu(tmp_path):
    step = next(s for s in gc.STEPS if s.name == "gdn")
    argv = step.dry_argv(gc.Run(tmp_path, tmp_path, True, None))
    bench.main(argv[3:])  # the step's own flags, in this process
    with open(tmp_path / "gdn" / bench.CSV_NAME) as f:
        rows = list(csv.DictReader(f))
    assert (tmp_path / "gdn" / bench.PNG_NAME).is_file()
    assert [r["variant"] for r in rows] == ["none", "capture1", "capture4", "two_pass"]
    by = {r["variant"]: r for r in rows}
    assert all(float(r["median_ms"]) > 0 and r["overhead_vs"] == "none" for r in rows)
    assert (by["none"]["captures"], by["capture1"]["captures"], by["capture4"]["captures"]) == ("0", "1", "4")
    four = [int(o) for o in by["capture4"]["offsets"].split()]
    assert len(set(four)) == 4 and all(0 < o < 97 for o in four) and int(by["capture1"]["offsets"]) == max(four)
    # qwen3-next-tiny's mixer: 2 key heads, 4 value heads of 16; fp32 (4 B); bytes by the docstring's rule
    r = by["capture4"]
    assert (r["shape"], r["HK"], r["HV"], r["K"], r["V"], r["dtype"], r["chunk_size"]) == (
        "qwen3-next-tiny", "2", "4", "16", "16", "float32", "32")
    T = 97
    assert int(r["bytes"]) == 4 * (2 * T * 2 * 16 + 2 * T * 4 * 16) + 4 * 2 * T * 4 + 4 * 4 * 16 * 16 * (1 + 1 + 4)


def test_a_model_without_deltanet_layers_is_one_line(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--model", "bamba-9b", "--out", "/nonexistent/never"])
    err = capsys.readouterr().err.strip().splitlines()
    assert "--model" in err[-1] and "bamba-9b has no Gated DeltaNet layer" in err[-1]


def test_the_correctness_gate_refuses_a_wrong_scan():
    """A scan that forgets the decay (g = 0) does not pass the gate before timing."""
    def no_decay(**kw):
        return bench.gated_delta_rule_chunked(**{**kw, "g": torch.zeros_like(kw["g"])})

    with pytest.raises(AssertionError, match="correctness gate"):
        bench.check_correctness(no_decay, SHAPE, torch.float32, "cpu", 16)
    bench.check_correctness(bench.gated_delta_rule_chunked, SHAPE, torch.float32, "cpu", 16)


# ---- the peer gate -----------------------------------------------------------------------------------

def test_the_naive_adapter_feeds_the_definition_our_problem():
    inp = bench.make_inputs([45], SHAPE, torch.float32, "cpu", seed=5)
    ok, note = bench.check_peer(bench.fla_naive_call(delta_recurrence, inp), inp, torch.float32)
    assert ok, note


def test_the_chunk_adapter_passes_fla_its_layout():
    """fla's chunk call gets a batch axis of 1, q/k raw with its in-kernel L2 norm on, the initial
    state, and its (o, final) come back in our layout: a stand-in computing by the definition passes."""
    seen = {}

    def chunk_stand_in(q, k, v, g, beta, *, initial_state, output_final_state, use_qk_l2norm_in_kernel):
        seen.update(q=q.shape, v=v.shape, final=output_final_state, l2=use_qk_l2norm_in_kernel)
        rep = v.shape[2] // q.shape[2]
        norm = (lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)) if use_qk_l2norm_in_kernel else None
        return delta_recurrence(norm(q).repeat_interleave(rep, 2), norm(k).repeat_interleave(rep, 2), v, beta, g,
                                initial_state=initial_state)

    inp = bench.make_inputs([33], SHAPE, torch.float32, "cpu", seed=8)
    ok, note = bench.check_peer(bench.fla_call(chunk_stand_in, inp), inp, torch.float32)
    assert ok, note
    assert seen == dict(q=(1, 33, 2, 8), v=(1, 33, 4, 6), final=True, l2=True)


def test_a_peer_mismatch_is_caught_and_not_timed():
    """The gate can fail: the same recurrence fed un-normalised q/k computes another function; a peer
    that raises is recorded as failed; an absent one keeps its note; the right one keeps its call."""
    def wrong(inp):
        return bench.fla_naive_call(delta_recurrence, inp, l2norm=False)

    def raises(inp):
        def run():
            raise RuntimeError("no kernel for this shape")
        return run

    gated = bench.gate_peers({"wrong": (wrong, "n"), "right": (lambda inp: bench.fla_naive_call(delta_recurrence, inp),
                                                                "n"),
                              "raises": (raises, "n"), "absent": (None, "fla: not fetched")},
                             SHAPE, torch.float32, "cpu")
    assert gated["wrong"][0] is None and "WRONG vs the oracle" in gated["wrong"][1]
    assert gated["raises"][0] is None and "failed: RuntimeError" in gated["raises"][1]
    assert gated["absent"] == (None, "fla: not fetched")
    assert gated["right"][0] is not None and "max abs err" in gated["right"][1]
    err = float(gated["right"][1].split("o max abs err ")[1].split(",")[0])
    assert math.isfinite(err) and err < 1e-3


@pytest.mark.skipif(not FETCHED, reason="peers/ not fetched (bash scripts/fetch_peers.sh)")
def test_fla_loads_and_its_own_recurrence_matches_through_the_adapter():
    make, note = bench.load_fla(cuda=False)
    assert make is None and "interpreter" in note  # its kernels need a GPU; the CPU times no peer
    naive, why = bench.load_fla_naive()
    assert naive is not None, why
    inp = bench.make_inputs([45], SHAPE, torch.float32, "cpu", seed=7)
    ok, note = bench.check_peer(bench.fla_naive_call(naive, inp), inp, torch.float32)
    assert ok, note
    ok, _ = bench.check_peer(bench.fla_naive_call(naive, inp, l2norm=False), inp, torch.float32)
    assert not ok


def test_loader_says_not_fetched_without_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PEERS_DIR", str(tmp_path))
    make, note = bench.load_fla(cuda=True)
    assert make is None and "not fetched" in note and "fetch_peers.sh" in note
