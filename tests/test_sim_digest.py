"""Speed work on the trace simulator keeps every row (issue 32, item 1: "Speed, same results").

Each point of `tests/sim_digest_points.py` (ten configurations: every eviction, a 256 GB host tier,
a 3 GB KV pool that forces retried admissions and preemptions, the optimum) is simulated on the
first N Mooncake conversation requests and its digest (every request's record, TTFT included
bit-exact, and every metric but wall time) compared with the one recorded before the speed work
(commit c446d57, with the store's `observe_lookup` that its scheduler calls). Any change to any row
fails. N is 120 by default (~30 s on one core); `SIM_DIGEST_LIMIT=200` checks every point on 200
requests, `=1000` six of them on 1,000 (~80 s of CPU after the speed work, ~230 s before; recorded
by `experiments.bench.simulator` on c446d57). One long window (`LONG_POINT`: ours-plus 4 GB on 3,000
requests) runs always. Points added later were recorded on the commit before the change they guard
(named beside them). A change that is meant to change results re-records
with `.venv/bin/python -m tests.sim_digest_points --limit 120 --limit 200 --limit 1000`, and says so.
"""

import dataclasses
import math
import os

import pytest

from experiments.traces.simulate import RequestRecord
from tests.sim_digest_points import LONG_POINT, POINTS, digest, run_point

DIGESTS = {
    120: {
        "vllm-align-unbounded": "1fe22d16b6576b2c574f07bf8d55132698867e35654d50626c190f67ddd61fb9",
        "ours-plus-4gb-shadow_best": "fa1ef1f419b4cb3ce02b0c22d2787627b3a83e589d65ed3cd27cc7557b0bf3f0",
        "ours-plus-4gb-shadow_best-kvpool3": "fc846bdc3ea43d232962fddc516749f4263da6b923105b7641bbe4da87893229",
        "ours-plus-4gb-learned_value-host256": "476acccc9dc786feb09f8abc234aabe9eb6d5dedadda8f28f2c4452bab62b168",
        "ours-plus-4gb-shadow_best-host256": "08f7e515574e9a551a819fc8f0dddd4fef8b94ae22538d5355029d118ed8dd33",
        "marconi-0.25gb-seglen": "38dc014066849f7223c0d002c9fd88e3b72f85fd686417e90592c8394c0108b1",
        "marconi-0.25gb-seglen-kvpool3": "709e8f7987b6c9b33855fe80a455c7b860a6b18a920236fd5366531f20fa6073",
        "vllm-junction-0.25gb-flop_aware-host256": "8cd6903c35eac1eccb0ad95979f860d905bb983ef3bba71247902f8010c02aa7",
        "trtllm-0.25gb-lru": "a34b2d4c85a86acfeae129a4e36d00f82261e40d5b83ae3e9ee6456cc033e509",
        "optimum-4gb": "2688025aaeb4336e8b22037bd010b6a9c17c2756c036f8f8f6d8cc04dd426168",
        "optimum-4gb-kvpool3": "f2e3bf564d97fa6bc04cac9ead4cc5aa99b7ce574616f83c8f728ba42fd454dd",
        "sglang-0.25gb-lru-kvpool2": "f4bf29665838c4bced0c32e9a00bd6400944c6530b6f14a108e9f9dce7dadcb0",
    },
    200: {
        "vllm-align-unbounded": "17d6a09bec273e810db79632630b034941ababd75eefe90535a094a382e0a5cd",
        "ours-plus-4gb-shadow_best": "ecb791728f2e62c69d27778a452a3999f3d41614393bf42c9b5f70caa0d2634d",
        "ours-plus-4gb-shadow_best-kvpool3": "eb4d1ae88a8e2e14d4463e3c518a02f406612615138159952e93558ae9152c87",
        "ours-plus-4gb-learned_value-host256": "fa01da1954fa39d5ccafb589dca4faef3ceb688e80ff01184c37b69a894d2ee5",
        "ours-plus-4gb-shadow_best-host256": "dbfefed017dec2f55c070523d8b0f2855276643419347eeb6b22d7819eeead18",
        "marconi-0.25gb-seglen": "cd56fc23b0dcd64fc477d17778876730e33c38ecd71413ad7b2665cf57a35339",
        "marconi-0.25gb-seglen-kvpool3": "18db2d3a1cff8b93d91bf49a999226f3895909dbc8e96ec9a2f86d7b41633caf",
        "vllm-junction-0.25gb-flop_aware-host256": "bb81a48f962b6616d1c2d6a053535c76f8f479e1d11670290f2d9da8801e6d58",
        "trtllm-0.25gb-lru": "96a58805ae76b101d411f86577bc410a74b8fa09219d52e32f0fad5bd517a0a9",
        "optimum-4gb": "f52a26a23ea3b0c87580e830ebf10b8261db884659b95b0b978c9e3885b364e1",
        "optimum-4gb-kvpool3": "9f96a3229e026210f5f792aa5af5ab9110009ac75ebc1863bccb35275da17a4e",
        "sglang-0.25gb-lru-kvpool2": "1d817b6e746a9c5a20900a3446bebfe4b8534996d3421baca4d99f21f44717e0",
    },
    1000: {
        "vllm-align-unbounded": "2ed419d33a645fa01f22e21f647bd9d539b13e274d0ce8d733cb3cb321b00505",
        "ours-plus-4gb-shadow_best": "b31f7e2ee2e36ff3d15968de9b140d09d7abe77b94258b4cfe5b0bcb68819ebf",
        "ours-plus-4gb-shadow_best-host256": "74d678ebf989d198085a90fa5a57cef015fe675bb93da3a78d3283dd2b5704fa",
        "ours-plus-4gb-learned_value-host256": "87df3f8d0202fd2c9dd5dc0c811b85780602def4237fcda526901264fba63877",
        "marconi-0.25gb-seglen": "dde7420026f63823ad5169a3ebd251ab2f35068b1911dea21f502d6b51a7bbba",
        "vllm-junction-0.25gb-flop_aware-host256": "4cd708b238c1b03f4aa74cfe9e3ac46ad6183ecea5915d82556cf6fc297c4d94",
    },
    3000: {  # recorded on ad068c8, before the decode fast path (39.6 s of CPU there)
        "ours-plus-4gb-shadow_best": "9ba7e1d608438885bcdb4dae8e2730af2fcf3113bac8256eb35bbd99b25a97c4",
    },
}

LIMIT = int(os.environ.get("SIM_DIGEST_LIMIT", "120"))


def test_every_point_has_a_digest_at_the_default_window():
    assert set(DIGESTS[120]) == set(POINTS) == set(DIGESTS[200])


@pytest.mark.parametrize("name", sorted(POINTS))
def test_rows_are_unchanged(name):
    assert LIMIT in DIGESTS, f"SIM_DIGEST_LIMIT={LIMIT}: digests are recorded for {sorted(DIGESTS)} requests"
    if name not in DIGESTS[LIMIT]:
        pytest.skip(f"no digest recorded for {name} at {LIMIT} requests")
    assert digest(run_point(name, LIMIT)) == DIGESTS[LIMIT][name]


def test_a_long_window_is_unchanged():
    """A quarter of the trace on one point whatever SIM_DIGEST_LIMIT says (~25 s of CPU): ours-plus over a
    4 GB store, every path the decode fast path and the content index take (block-16 decode rows, a
    decode state every token, token-granular matches ending inside blocks, block reuse past the sweep)."""
    name, limit = LONG_POINT
    assert digest(run_point(name, limit)) == DIGESTS[limit][name]


def test_the_digest_sees_one_bit_of_one_ttft():
    """The digest covers every record field to the last bit (a TTFT one ulp off) and every metric."""
    rec = RequestRecord(3, 100, 48, 32, 68, 2, [64, 100], [64], 0.125, 0)
    out = {"metrics": {"ttft_s_p50": 0.125, "wall_s": 1.0}, "records": [rec]}
    base = digest(out)
    assert digest(out | {"metrics": {"ttft_s_p50": 0.125, "wall_s": 2.0}}) == base  # wall time is not a result
    assert digest(out | {"records": [dataclasses.replace(rec, ttft_s=math.nextafter(0.125, 1.0))]}) != base
    assert digest(out | {"records": [dataclasses.replace(rec, snapshot_positions=[65])]}) != base
    assert digest(out | {"metrics": {"ttft_s_p50": math.nextafter(0.125, 0.0), "wall_s": 1.0}}) != base


def test_a_setting_added_after_the_recording_counts_off_its_recorded_value():
    """`snapshot_dtype` joined `effective_settings` after the digests were recorded: at the value those
    runs had (float32) it is left out, so their digests hold; any other value changes the digest."""
    def out(settings):
        return {"metrics": {"effective_settings": settings}, "records": []}

    base = digest(out({"policy": "ours-plus"}))
    assert digest(out({"policy": "ours-plus", "snapshot_dtype": "float32"})) == base
    assert digest(out({"policy": "ours-plus", "snapshot_dtype": "bfloat16"})) != base
    assert digest(out({"policy": "marconi", "snapshot_dtype": "float32"})) != base


def test_simulate_restores_the_gc_thresholds():
    """`simulate` runs under its own GC thresholds (experiments/traces/simulate.py) and gives the
    process back its own afterwards, whatever they were."""
    import gc

    from experiments.traces import simulate as simulate_module
    from experiments.traces.simulate import GC_THRESHOLDS, SimConfig, simulate
    from experiments.traces.sweep import load_requests

    seen = []
    real = simulate_module._simulate

    def spy(*args):
        seen.append(gc.get_threshold())
        return real(*args)

    before = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:
        simulate_module._simulate = spy
        out = simulate(load_requests("mooncake-conversation", "chains", 3), SimConfig("vllm-align", kv_pool_gb=1.0))
        assert gc.get_threshold() == (1234, 5, 6)
    finally:
        simulate_module._simulate = real
        gc.set_threshold(*before)
    assert seen == [GC_THRESHOLDS] and out["metrics"]["requests"] == 3
