"""The decode-step bench: its floor counts what a step reads and writes (derived here by hand from
the tiny configs), and every timed step decodes the next position."""

import pytest
import torch

from experiments.bench import decode_step as ds
from model import from_preset


def test_floor_of_tiny_by_hand():
    """tiny: layers (mamba, attention, mamba), hidden 64, vocab 256, KV heads 2 x dim 16, Mamba heads
    4 x head dim 32 x state 16, conv_dim 192, conv width 4, untied, fp32 (4 bytes)."""
    model = from_preset("tiny", dtype=torch.float32)
    B, ctx = 3, 37
    table = 256 * 64 * 4
    all_params = sum(p.numel() * 4 for p in model.parameters())
    want = dict(
        weights=all_params - table,  # the embedding table is never read whole ...
        embedding_rows=B * 64 * 4,  # ... only the batch's rows; the untied LM head is in the weights
        kv_read=1 * 2 * B * ctx * 2 * 16 * 4,  # one attention layer: K and V of the context
        kv_write=1 * 2 * B * 2 * 16 * 4,  # one new token's K and V
        ssm_state_rw=2 * 2 * B * 4 * 32 * 16 * 4,  # two Mamba layers, read + write, fp32
        conv_state_rw=2 * 2 * B * 192 * 3 * 4,  # (conv_dim, width - 1) per slot
        logits_write=B * 256 * 4,
    )
    want["total"] = sum(want.values())
    got = ds.step_bytes(model, B, ctx)
    assert got == want
    assert got["total"] != all_params  # the old floor: every parameter, no state, no KV


def test_floor_tied_head_reads_the_table_once_and_moe_reads_top_k_experts():
    """granite-tiny ties its LM head to the embedding and has MoE layers: the table counts once (the
    head reads it whole; the rows are inside it) and each MoE layer reads at least top_k of E experts."""
    from model.moe import SparseMoE

    model = from_preset("granite-tiny", dtype=torch.float32)
    assert model.lm_head.weight is model.embed_tokens.weight
    moes = [m for m in model.modules() if isinstance(m, SparseMoE)]
    assert moes
    E, k = moes[0].experts.gate_up_proj.shape[0], moes[0].router.top_k
    assert k < E
    expert_bytes = sum(p.numel() * 4 for m in moes for p in m.experts.parameters())
    params = sum(p.numel() * 4 for p in model.parameters())  # parameters() yields the tied table once
    got = ds.step_bytes(model, 2, 10)
    assert got["embedding_rows"] == 0
    assert got["weights"] == params - expert_bytes * (E - k) // E


def test_step_clock_advances_one_token_a_step_and_stops_at_capacity():
    clock = ds.StepClock(context=100, capacity=103)
    assert [clock.next(), clock.next(), clock.next()] == [100, 101, 102]
    with pytest.raises(RuntimeError, match="position 103"):
        clock.next()


def test_timed_steps_decode_consecutive_positions():
    """Graph and eager steps share one cache: each decodes the next position (the old bench
    decoded the same position every step)."""
    seen = []

    class Fake:
        def forward(self, rows):
            seen.append(rows)

        def forward_batch(self, rows, cache):
            seen.append(rows)

    repeats = 4
    clock = ds.StepClock(context=50, capacity=50 + ds.steps_needed(repeats))
    ds.time_graph_and_eager(Fake(), Fake(), None, lambda pos: pos, clock, repeats, "cpu")
    assert seen == list(range(50, 50 + 2 * (ds.WARMUP_STEPS + repeats)))
    assert ds.steps_needed(repeats) == len(seen) + 1  # + the correctness step


@pytest.mark.slow
def test_cpu_run_writes_a_row_with_its_floor(tmp_path):
    """The bench end to end on the CPU (the interpreter): one batch, its floor's parts and ratios."""
    import json

    assert ds.main(["--device", "cpu", "--model", "tiny", "--batches", "1", "--context", "5", "--repeats", "1",
                    "--out", str(tmp_path / "o")]) == 0
    row = json.loads((tmp_path / "o" / "decode_step.json").read_text())["rows"][0]
    assert row["steps_run"] == ds.steps_needed(1)
    assert row["floor_bytes"]["total"] == ds.step_bytes(from_preset("tiny", dtype=torch.float32), 1, 5)["total"]
    assert row["graph_over_floor"] == pytest.approx(row["graph_ms"] / row["floor_ms"])
