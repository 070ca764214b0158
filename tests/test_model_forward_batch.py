"""`forward_batch` (paged KV, SSM/conv state pools, in-pass captures) against the plain `logits()`.

Torch backend, the "tiny" (Bamba) and "granite-tiny" (GraniteMoeHybrid: MoE, full-head RoPE,
muP multipliers) presets, fp32. Chunking changes only summation order (scan chunk cuts,
attention blocks), so every comparison uses one tolerance, `LOGIT_ATOL` (max abs, the main
experiment's warm == cold criterion), and states use `STATE_ATOL`.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from model import SequenceChunk, SSMState, from_preset
from model.batch import pack_rows
from model.engine import ModelRunner, cut_at_captures, run_in_passes
from model_helpers import max_abs, one_thread, tokens  # noqa: F401  (one_thread: autouse)

LOGIT_ATOL = 1e-4  # fp32 logits, max abs
STATE_ATOL = 1e-5  # fp32 SSM / conv states, max abs (states are O(0.1 .. 1) here)



@pytest.fixture(scope="module", params=["tiny", "granite-tiny"])
def tiny(request):
    return from_preset(request.param, backend="torch", seed=0)


def _assert_states_close(a: SSMState, b: SSMState, what: str) -> None:
    assert len(a.conv) == len(b.conv) == len(a.ssm) == len(b.ssm) > 0
    for layer, (ca, cb, sa, sb) in enumerate(zip(a.conv, b.conv, a.ssm, b.ssm)):
        assert max_abs(ca, cb) <= STATE_ATOL, f"{what}: conv state of Mamba layer {layer}"
        assert max_abs(sa, sb) <= STATE_ATOL, f"{what}: ssm state of Mamba layer {layer}"
        assert sa.abs().max() > 1e-3  # not two zero states


# ---- chunked == whole ------------------------------------------------------------------------------

def _run_random_schedule(model, seqs, block_size, rng, capture=False):
    """Advance every sequence by random chunks, several rows a batch, in random row order; decode rows
    (n = 1) mix with prefill rows. Returns per sequence its logits by position and its captures."""
    need = [-(-len(s) // block_size) for s in seqs]
    num_blocks = sum(need) + 3
    ids = list(range(num_blocks))
    rng.shuffle(ids)  # scattered, non-contiguous block ids
    tables, k = [], 0
    for n in need:
        tables.append(ids[k:k + n])
        k += n
    slots = rng.sample(range(len(seqs) + 2), len(seqs))
    cache = model.allocate_cache(num_blocks, block_size, len(seqs) + 2)
    pos = [0] * len(seqs)
    logits = [[] for _ in seqs]
    captured = [dict() for _ in seqs]
    steps = 0
    while any(p < len(s) for p, s in zip(pos, seqs)):
        rows, who = [], []
        for s in rng.sample(range(len(seqs)), len(seqs)):
            left = len(seqs[s]) - pos[s]
            if left == 0 or rng.random() < 0.2:
                continue
            n = 1 if rng.random() < 0.35 else min(left, rng.randint(2, 13))
            n = min(n, left)
            offs = tuple(sorted(rng.sample(range(1, n), min(2, n - 1)))) if capture and n > 2 else ()
            rows.append(SequenceChunk(seqs[s][pos[s]:pos[s] + n], pos[s], tables[s], slots[s],
                                      capture_offsets=offs, all_logits=True))
            who.append(s)
        if not rows:
            continue
        out = model.forward_batch(rows, cache)
        assert len(out.logits) == len(out.captured) == len(rows)
        for s, row, lg, caps in zip(who, rows, out.logits, out.captured):
            assert lg.shape == (row.num_tokens, model.config.vocab_size)
            logits[s].append(lg)
            assert len(caps) == len(row.capture_offsets)
            for o, st in zip(row.capture_offsets, caps):
                captured[s][pos[s] + o] = st
            pos[s] += row.num_tokens
        steps += 1
    return [torch.cat(lg) for lg in logits], captured, cache, tables, slots, steps


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_chunkings_match_whole_sequence_logits(tiny, block_size, seed):
    rng = random.Random(seed)
    seqs = [tokens(n, seed * 10 + i) for i, n in enumerate([37, 23, 50])]
    logits, _, _, _, _, steps = _run_random_schedule(tiny, seqs, block_size, rng)
    assert steps >= 4
    for s, seq in enumerate(seqs):
        err = max_abs(logits[s], tiny.logits(seq))
        assert err <= LOGIT_ATOL, f"sequence {s}: max abs {err:.3g}"


def test_last_token_logits_and_final_slot_state(tiny):
    seq = tokens(29, 5)
    cache = tiny.allocate_cache(8, 16, 3)
    first = tiny.forward_batch([SequenceChunk(seq[:20], 0, [3, 1], 2)], cache)
    assert first.logits[0].shape == (tiny.config.vocab_size,) and first.captured == [[]]
    second = tiny.forward_batch([SequenceChunk(seq[20:], 20, [3, 1], 2)], cache)
    whole = tiny.logits(seq)
    assert max_abs(first.logits[0], whole[19]) <= LOGIT_ATOL
    assert max_abs(second.logits[0], whole[-1]) <= LOGIT_ATOL
    # the slot now holds the state after token 28: continuing from a copy in another slot agrees
    other = tiny.allocate_cache(8, 16, 3)
    one_pass = tiny.forward_batch([SequenceChunk(seq, 0, [3, 1], 0)], other)
    _assert_states_close(cache.read_state(2), other.read_state(0), "final state, 2 chunks vs 1")
    assert max_abs(one_pass.logits[0], whole[-1]) <= LOGIT_ATOL


def test_decode_from_position_zero_and_mixed_batches(tiny):
    """A one-token row at position 0 starts from zero state even in a slot holding another sequence's state."""
    a, b = tokens(12, 7), tokens(9, 8)
    cache = tiny.allocate_cache(8, 4, 2)
    tiny.forward_batch([SequenceChunk(a, 0, [0, 1, 2], 0)], cache)  # leaves a non-zero state in slot 0
    got = []
    for i in range(len(b)):  # b decodes token by token in slot 0, batched with a's decode row in slot 1
        rows = [SequenceChunk(b[i:i + 1], i, [5, 6, 7], 0)]
        if i < 3:
            rows.insert(0, SequenceChunk(a[i:i + 1], i, [0, 1, 2], 1))  # a from scratch, overwriting its KV
        got.append(tiny.forward_batch(rows, cache).logits[-1])
    assert max_abs(torch.stack(got), tiny.logits(b)) <= LOGIT_ATOL


# ---- captures: in-pass == two-pass, restore == uninterrupted --------------------------------------

def test_in_pass_captures_equal_two_pass_states(tiny):
    seqs = [tokens(41, 20), tokens(30, 21), tokens(6, 22)]
    offsets = [(3, 10, 17), (14,), ()]
    starts = [9, 4, 5]
    tables = [[0, 1, 2], [3, 4], [5]]

    def fresh_cache():  # each sequence's prefix [0, start) prefilled, same in both caches
        cache = tiny.allocate_cache(8, 16, 4)
        tiny.forward_batch([SequenceChunk(s[:st], 0, t, slot) for slot, (s, st, t) in
                            enumerate(zip(seqs, starts, tables))], cache)
        return cache

    in_pass_cache, two_pass_cache = fresh_cache(), fresh_cache()
    rows = [SequenceChunk(s[st:], st, t, slot, capture_offsets=o, all_logits=True)
            for slot, (s, st, t, o) in enumerate(zip(seqs, starts, tables, offsets))]
    rows.append(SequenceChunk(tokens(1, 23), 0, [6], 3))  # a decode row in the same batch
    out = tiny.forward_batch(rows, in_pass_cache)
    # the two-pass fallback on the same batch: segment k of every row runs in pass k
    ref, passes = run_in_passes(ModelRunner(tiny, two_pass_cache), rows)
    assert passes == 1 + max(len(o) for o in offsets)
    assert max_abs(out.logits[3], ref.logits[3]) <= LOGIT_ATOL  # the decode row
    for r, row in enumerate(rows[:3]):
        assert len(out.captured[r]) == len(ref.captured[r]) == len(row.capture_offsets)
        for o, got, want in zip(row.capture_offsets, out.captured[r], ref.captured[r]):
            _assert_states_close(got, want, f"row {r} capture at in-chunk offset {o}")
        assert max_abs(out.logits[r], ref.logits[r]) <= LOGIT_ATOL
        assert max_abs(out.logits[r], tiny.logits(seqs[r])[starts[r]:]) <= LOGIT_ATOL
        _assert_states_close(in_pass_cache.read_state(r), two_pass_cache.read_state(r), f"row {r} final state")


def test_long_chunks_across_scan_chunks(tiny):
    """Chunks longer than the torch scan's 128-token chunk, captures off and on its boundaries."""
    seq = tokens(300, 40)
    table = list(range(19))
    cache, two_pass = tiny.allocate_cache(19, 16, 2), ModelRunner(tiny, tiny.allocate_cache(19, 16, 2))
    rows = [SequenceChunk(seq[:150], 0, table, 1, capture_offsets=(64, 128, 129), all_logits=True),
            SequenceChunk(seq[150:151], 150, table, 1, all_logits=True),
            SequenceChunk(seq[151:], 151, table, 1, capture_offsets=(100,), all_logits=True)]
    whole = tiny.logits(seq)
    got = []
    for row in rows:
        out = tiny.forward_batch([row], cache)
        ref, _ = run_in_passes(two_pass, [row])
        for o, a, b in zip(row.capture_offsets, out.captured[0], ref.captured[0]):
            _assert_states_close(a, b, f"capture at {row.start_pos + o}")
        got.append(out.logits[0])
    err = max_abs(torch.cat(got), whole)
    assert err <= LOGIT_ATOL, err


def test_two_pass_cuts_a_row_at_its_capture_offsets():
    row = SequenceChunk(torch.arange(10), 5, [0, 1], 3, kv_cached_len=7, capture_offsets=(2, 6, 8), all_logits=True)
    segments = cut_at_captures(row)
    assert [s.token_ids.tolist() for s in segments] == [[0, 1], [2, 3, 4, 5], [6, 7], [8, 9]]
    assert [s.start_pos for s in segments] == [5, 7, 11, 13]
    assert all(s.capture_offsets == () for s in segments)
    assert all(s.kv_cached_len == 7 and s.state_slot == 3 and s.block_table == [0, 1] and s.all_logits
               for s in segments)
    for bad in ((10,), (0,), (6, 2)):
        with pytest.raises(ValueError, match="^capture_offsets:"):
            cut_at_captures(dataclasses.replace(row, capture_offsets=bad))


def test_restored_capture_continues_like_the_uninterrupted_run(tiny):
    """Prefill with in-pass captures in a random chunking; restore each capture into a fresh slot and
    replay the rest as a warm request would: its KV prefix already cached (kv_cached_len > start_pos,
    the shared blocks are read, not rewritten), its SSM state from the snapshot."""
    rng = random.Random(3)
    seq = tokens(47, 30)
    block_size = 4
    _, captured, cache, tables, slots, _ = _run_random_schedule(tiny, [seq], block_size, rng, capture=True)
    assert len(captured[0]) >= 3
    whole = tiny.logits(seq)
    kv_match = (len(seq) - 1) // block_size * block_size  # whole blocks, at least one token left to run
    fresh_slot = min(set(range(cache.num_state_slots)) - set(slots))
    for pos, state in sorted(captured[0].items()):
        cache.reset_state(fresh_slot)
        cache.write_state(fresh_slot, state)
        row = SequenceChunk(seq[pos:], pos, tables[0], fresh_slot, kv_cached_len=max(pos, kv_match), all_logits=True)
        err = max_abs(tiny.forward_batch([row], cache).logits[0], whole[pos:])
        assert err <= LOGIT_ATOL, f"restore at {pos}: max abs {err:.3g}"
    # a wrong snapshot is caught: restoring the state of another position changes the logits
    (p1, s1), (p2, _) = sorted(captured[0].items())[:2]
    cache.write_state(fresh_slot, s1)
    row = SequenceChunk(seq[p2:], p2, tables[0], fresh_slot, kv_cached_len=kv_match, all_logits=True)
    assert max_abs(tiny.forward_batch([row], cache).logits[0], whole[p2:]) > 100 * LOGIT_ATOL


def test_kv_cached_prefix_is_not_rewritten():
    rows = [SequenceChunk(torch.arange(6), 3, [7, 2, 9], 0, kv_cached_len=8),
            SequenceChunk(torch.arange(2), 10, [4, 5, 6], 1, kv_cached_len=4)]
    batch = pack_rows(rows, 4, torch.device("cpu"))
    # row 0: positions 3..8; 3..7 cached (-1); position 8 -> block 9, offset 0 -> slot 36
    # row 1: positions 10, 11 -> block 6, offsets 2, 3 -> slots 26, 27
    assert batch.attention.slot_mapping.tolist() == [-1, -1, -1, -1, -1, 36, 26, 27]
    assert batch.attention.seq_lens.tolist() == [9, 12]
    assert batch.attention.cu_seqlens_q.tolist() == [0, 6, 8]
    assert batch.positions.tolist() == [3, 4, 5, 6, 7, 8, 10, 11]


def test_snapshot_bytes(tiny):
    cache = tiny.allocate_cache(4, 16, 2)
    cfg = tiny.config
    per_layer = 4 * cfg.conv_dim * (cfg.mamba_d_conv - 1) + 4 * cfg.mamba_n_heads * cfg.mamba_d_head * cfg.mamba_d_state
    assert cache.read_state(1).nbytes == cache.state_bytes_per_slot == per_layer * len(cfg.mamba_layer_indices)


# ---- row validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("field, row", [
    ("token_ids", dict(token_ids=torch.zeros(0, dtype=torch.long))),
    ("token_ids", dict(token_ids=torch.zeros(2, 2, dtype=torch.long))),
    ("token_ids", dict(token_ids=torch.tensor([1, 256]))),
    ("start_pos", dict(start_pos=-1)),
    ("block_table", dict(block_table=[0])),  # 5 + 8 tokens need 4 blocks of 4
    ("block_table", dict(block_table=[0, 1, 2, 99])),
    ("state_slot", dict(state_slot=2)),
    ("kv_cached_len", dict(kv_cached_len=-3)),
    ("capture_offsets", dict(capture_offsets=(0,))),
    ("capture_offsets", dict(capture_offsets=(8,))),
    ("capture_offsets", dict(capture_offsets=(5, 3))),
    ("all_logits", dict(all_logits=1)),
])
def test_invalid_rows_fail_naming_the_field(tiny, field, row):
    cache = tiny.allocate_cache(8, 4, 2)
    base = dict(token_ids=torch.arange(8), start_pos=5, block_table=[0, 1, 2, 3], state_slot=0)
    with pytest.raises(ValueError, match=f"^{field}:"):
        tiny.forward_batch([SequenceChunk(**{**base, **row})], cache)


def test_two_rows_cannot_share_a_state_slot(tiny):
    cache = tiny.allocate_cache(8, 4, 2)
    rows = [SequenceChunk(torch.arange(3), 0, [0], 1), SequenceChunk(torch.arange(3), 0, [1], 1)]
    with pytest.raises(ValueError, match="^state_slot:"):
        tiny.forward_batch(rows, cache)
