"""Causal depthwise conv1d (width 4, optional SiLU), varlen, with conv-state capture in the launch.

    y_t = act( w_0 u_{t-3} + w_1 u_{t-2} + w_2 u_{t-1} + w_3 u_t + bias )

u is the sequence's input preceded by its initial conv state (the last W-1 = 3 inputs, oldest
first; zeros when none is given). One launch has two kinds of programs:

* token tiles (BLOCK_T tokens of one sequence x BLOCK_D channels): the conv itself. A tile never
  spans two sequences (the host splits each sequence into tiles), so the three inputs before the
  tile come from the same sequence or from its initial state.
* state programs, appended to the grid after the tiles: one per final state and per capture.
  The conv state after tokens [0, o) is u_{o-3}, u_{o-2}, u_{o-1}: three input rows gathered and
  stored. A capture therefore costs 3 x D reads and writes (25 KB at D = 8448, bf16) and no
  extra pass over the tokens; the final state is the same gather at o = len.

States are kept in x's dtype (raw inputs: lossless). x (T, D) may be a strided view.

Pool mode (`state_pool`, `state_slots`): sequence s starts from `state_pool[state_slots[s]]` and
its final state goes back there, with no gather before or scatter after (each would read and
write 3 x D x 2 B = 51 KB a sequence at D = 8448, bf16, in a launch of its own). The final state
cannot be written by the main launch: the token tiles and captures at o < 3 of the same sequence
read that slot as their initial state, and a sequence shorter than 3 tokens keeps part of it in
its final state, so a state program writing the slot would race them. The finals are written by
a second small launch instead (`_causal_conv1d_final_kernel`: one program per sequence x BLOCK_D
channels; it reads the slot's old state and x's last inputs, then writes the slot), ordered after
every tile by the stream. A slot of -1 is a pad row: zero initial state, no final written.

The tile and state tables are built on the host: by the call itself from `cu_seqlens` (one sync,
one upload), or once per model step by `plan_causal_conv1d` (passed as `plan=`: neither).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from kernels.checks import require
from kernels.contracts.conv1d import Conv1dOutput, check_conv1d_args
from kernels.contracts.packed import IntTables, Table
from kernels.contracts.varlen import build_chunk_table, check_capture_offsets, check_host_seqlens, check_state_pool
from kernels.variants import KernelVariant, aligned_args

__all__ = ["causal_conv1d", "Conv1dOutput", "Conv1dPlan", "plan_causal_conv1d"]

WIDTH = 4


@triton.jit
def _load_u_row(x_seq, init_seq, pos, o_d, m_d, m_init, stride_x_t, stride_x_d, W: tl.constexpr,
                HAS_INIT: tl.constexpr):
    """u at one sequence position (a scalar) for channels o_d: x for pos >= 0, the initial state's
    column W-1+pos for -(W-1) <= pos < 0 where m_init holds, zero elsewhere. Returns x's dtype."""
    m_x = m_d & ((o_d * 0 + pos) >= 0)  # the scalar test broadcast explicitly (the interpreter needs it)
    # int64: pos (int32) times the token stride passes 2^31 at 128K tokens of a 16768-wide projection view
    b_u = tl.load(x_seq + pos.to(tl.int64) * stride_x_t + o_d * stride_x_d, mask=m_x, other=0.0)
    if HAS_INIT:
        b_i = tl.load(init_seq + o_d * (W - 1) + (W - 1 + pos), mask=m_init & ~m_x, other=0.0)
        b_u = tl.where(m_x, b_u, b_i)
    return b_u


@triton.jit
def _initial_state_row(initial_states, state_slots, i_s, o_d, m_d, D, W: tl.constexpr, POOL: tl.constexpr):
    """Where sequence i_s's initial state starts, and the channels it may be read for: row i_s of
    initial_states, or row state_slots[i_s] of the pool (a pad slot -1 reads nothing: zeros)."""
    i_row = i_s
    if POOL:
        i_row = tl.load(state_slots + i_s).to(tl.int64)
    m_init = m_d & ((o_d * 0 + i_row) >= 0)  # broadcast: the interpreter needs the scalar test as a tensor
    return initial_states + tl.maximum(i_row, 0) * D * (W - 1), m_init


@triton.jit
def _causal_conv1d_kernel(
    # pointers
    x, weight, bias, initial_states, state_slots, tile_start, tile_len, tile_pos, tile_seq,
    state_seq, state_end, cu_seqlens, y, final_states, captured_states,
    # sizes
    D, n_tiles, S,
    # strides
    stride_x_t, stride_x_d,
    # meta
    W: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_INIT: tl.constexpr, SILU: tl.constexpr, POOL: tl.constexpr,
):
    """Token tiles, then state programs: finals (not in POOL mode, see the module docstring), captures.
    POOL: initial_states is the state pool, read at row state_slots[s]."""
    i_j, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    if i_j < n_tiles:
        # ---- conv over one tile of tokens: a rolling 4-row window, each input row loaded once
        # (a 2-D (tokens x D) tile with 4 shifted loads ran out of registers and spilled KBs)
        bos = tl.load(tile_start + i_j).to(tl.int64)  # global index of the tile's first token
        n = tl.load(tile_len + i_j)
        pos0 = tl.load(tile_pos + i_j)  # its position inside the sequence
        i_s = tl.load(tile_seq + i_j).to(tl.int64)
        x_seq = x + (bos - pos0) * stride_x_t  # the sequence's token 0
        if HAS_INIT:
            init_seq, m_init = _initial_state_row(initial_states, state_slots, i_s, o_d, m_d, D, W, POOL)
        else:
            init_seq, m_init = x_seq, m_d  # never read
        b_w0 = tl.load(weight + o_d * W + 0, mask=m_d, other=0.0).to(tl.float32)
        b_w1 = tl.load(weight + o_d * W + 1, mask=m_d, other=0.0).to(tl.float32)
        b_w2 = tl.load(weight + o_d * W + 2, mask=m_d, other=0.0).to(tl.float32)
        b_w3 = tl.load(weight + o_d * W + 3, mask=m_d, other=0.0).to(tl.float32)
        if HAS_BIAS:
            b_b = tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
        else:
            b_b = tl.zeros([BLOCK_D], dtype=tl.float32)
        b_u0 = _load_u_row(x_seq, init_seq, pos0 - 3, o_d, m_d, m_init, stride_x_t, stride_x_d, W, HAS_INIT)
        b_u1 = _load_u_row(x_seq, init_seq, pos0 - 2, o_d, m_d, m_init, stride_x_t, stride_x_d, W, HAS_INIT)
        b_u2 = _load_u_row(x_seq, init_seq, pos0 - 1, o_d, m_d, m_init, stride_x_t, stride_x_d, W, HAS_INIT)
        b_u0, b_u1, b_u2 = b_u0.to(tl.float32), b_u1.to(tl.float32), b_u2.to(tl.float32)
        p_x = x + bos * stride_x_t + o_d * stride_x_d
        p_y = y + bos * D + o_d
        for _ in range(0, n):
            b_u3 = tl.load(p_x, mask=m_d, other=0.0).to(tl.float32)
            b_acc = b_b + b_w0 * b_u0 + b_w1 * b_u1 + b_w2 * b_u2 + b_w3 * b_u3
            if SILU:
                b_acc = b_acc * tl.sigmoid(b_acc)
            tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=m_d)
            b_u0, b_u1, b_u2 = b_u1, b_u2, b_u3
            p_x += stride_x_t
            p_y += D
    else:
        # ---- one conv state: u_{e-3}, u_{e-2}, u_{e-1} of sequence s (finals first, then captures;
        # in POOL mode the S finals are the second launch's, so the state programs start at the captures)
        i_k = i_j - n_tiles
        if POOL:
            i_k += S
        i_ks = tl.load(state_seq + i_k).to(tl.int64)
        e = tl.load(state_end + i_k)
        x_s = x + tl.load(cu_seqlens + i_ks).to(tl.int64) * stride_x_t
        if HAS_INIT:
            init_s, m_init = _initial_state_row(initial_states, state_slots, i_ks, o_d, m_d, D, W, POOL)
        else:
            init_s, m_init = x_s, m_d  # never read
        if i_k < S:
            p_st = final_states + i_k * D * (W - 1) + o_d * (W - 1)
        else:
            p_st = captured_states + (i_k - S) * D * (W - 1) + o_d * (W - 1)
        for c in tl.static_range(W - 1):
            b_st = _load_u_row(x_s, init_s, e - (W - 1) + c, o_d, m_d, m_init, stride_x_t, stride_x_d, W, HAS_INIT)
            tl.store(p_st + c, b_st.to(p_st.dtype.element_ty), mask=m_d)


@triton.jit
def _causal_conv1d_final_kernel(
    # pointers
    x, state_pool, state_slots, seq_len, cu_seqlens,
    # sizes
    D,
    # strides
    stride_x_t, stride_x_d,
    # meta
    W: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Pool mode's final states, launched after the main kernel: pool[slot_s] <- u_{n-3}, u_{n-2},
    u_{n-1} of sequence s (n = its length; u_{<0} are the slot's own old columns). Each program
    loads all three columns before it stores any (for n < 3 it reads columns it then overwrites);
    no other program touches those elements (distinct slots, disjoint channel blocks)."""
    tl.static_assert(W == 4, "the final-state kernel is written out for width 4")
    i_s, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    slot = tl.load(state_slots + i_s).to(tl.int64)
    if slot < 0:  # a pad row: its slot is no one's
        return
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    n = tl.load(seq_len + i_s)
    x_s = x + tl.load(cu_seqlens + i_s).to(tl.int64) * stride_x_t
    p_st = state_pool + slot * D * (W - 1)
    b_u0 = _load_u_row(x_s, p_st, n - 3, o_d, m_d, m_d, stride_x_t, stride_x_d, W, True)
    b_u1 = _load_u_row(x_s, p_st, n - 2, o_d, m_d, m_d, stride_x_t, stride_x_d, W, True)
    b_u2 = _load_u_row(x_s, p_st, n - 1, o_d, m_d, m_d, stride_x_t, stride_x_d, W, True)
    ty = state_pool.dtype.element_ty
    tl.store(p_st + o_d * (W - 1) + 0, b_u0.to(ty), mask=m_d)
    tl.store(p_st + o_d * (W - 1) + 1, b_u1.to(ty), mask=m_d)
    tl.store(p_st + o_d * (W - 1) + 2, b_u2.to(ty), mask=m_d)


BLOCK_T = 64  # tokens a program walks: 64 x 3 extra input rows re-read at its start (5%)
BLOCK_D = 512  # 4 channels a thread at 4 warps: 16-byte fp32 / 8-byte bf16 accesses


def _empty(shape, dtype, device) -> torch.Tensor:
    """Every output buffer; tests swap in NaN-filled ones."""
    return torch.empty(shape, dtype=dtype, device=device)


@dataclasses.dataclass(frozen=True)
class Conv1dPlan:
    """The host side of one conv launch, from Python ints: token tiles and state programs."""

    seqlens: list[int]
    offsets: list[list[int]]
    num_tiles: int
    num_captures: int
    tile_start: Table
    tile_len: Table
    tile_pos: Table
    tile_seq: Table
    state_seq: Table
    state_end: Table
    cu_seqlens: Table  # int32 (S+1,): where each sequence starts (the state programs read it)


def plan_causal_conv1d(seqlens, capture_offsets, tables: IntTables) -> Conv1dPlan:
    """The tables of a conv over sequences of these host lengths, added to `tables` (uploaded
    later, once, with the rest of the step). Pass the plan as `causal_conv1d(..., plan=)`."""
    seqlens = check_host_seqlens(seqlens)
    offsets = check_capture_offsets(capture_offsets, seqlens)
    S = len(seqlens)
    tiles = build_chunk_table(seqlens, [[] for _ in seqlens], BLOCK_T)
    seq_start = [0]
    for n in seqlens:
        seq_start.append(seq_start[-1] + n)
    tile_pos = [st - seq_start[s] for st, s in zip(tiles.start, tiles.seq)]
    state_seq = list(range(S)) + [s for s, offs in enumerate(offsets) for _ in offs]
    state_end = list(seqlens) + [o for offs in offsets for o in offs]
    return Conv1dPlan(
        seqlens, offsets, len(tiles.start), sum(len(o) for o in offsets),
        tables.add(tiles.start), tables.add(tiles.length), tables.add(tile_pos), tables.add(tiles.seq),
        tables.add(state_seq), tables.add(state_end), tables.add(seq_start))


def causal_conv1d(
    x, weight, bias=None, *, cu_seqlens, initial_states=None, capture_offsets=None, activation="silu",
    plan: Conv1dPlan | None = None, state_pool=None, state_slots=None, pad_slots: bool = False,
) -> Conv1dOutput:
    """x (T, D), weight (D, 4), bias (D,) or None, cu_seqlens (S+1,), initial_states (S, D, 3) in
    x's dtype or None (zeros), capture_offsets as in `ssd_scan`, activation "silu" or None.
    Returns Conv1dOutput(y (T, D), final_states (S, D, 3), captured_states (K, D, 3)), x's dtype.
    `plan`: from `plan_causal_conv1d` for these lengths and offsets (cu_seqlens is then not read).
    `state_pool` (num_slots, D, 3) in x's dtype, contiguous, with `state_slots` (S,) int32/int64:
    sequence s starts from `state_pool[state_slots[s]]` and its final state is written back there
    (initial_states must be None; the returned final_states is the pool). Two launches instead of
    one (see the module docstring). Slots are not read on the host: the caller checked them
    (distinct, in range; -1 = a pad row with `pad_slots`), unless the debug switch is on."""
    if plan is None:
        seqlens, offsets = check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets,
                                             activation)
    else:
        seqlens, offsets = check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets,
                                             activation, plan.seqlens)
        require(offsets == plan.offsets, "plan", f"made for capture offsets {plan.offsets}, called with {offsets}")
    T, D = x.shape
    W = weight.shape[1]
    require(W == WIDTH, "weight", f"the Triton kernel needs width W={WIDTH}, got {W} (the reference takes any W)")
    S = len(seqlens)
    pool = state_pool is not None
    if pool:
        check_state_pool(state_pool, state_slots, (D, W - 1), (x.dtype,), x.device, S, initial_states, pad_slots)
    else:
        require(state_slots is None, "state_slots", "given without state_pool")
    if plan is None:
        tables = IntTables()
        plan = plan_causal_conv1d(seqlens, offsets, tables)
        tables.upload(x.device)  # one host-to-device copy for every table
    dev = x.device
    out = _empty((T, D), x.dtype, dev)
    K = plan.num_captures
    final = state_pool if pool else _empty((S, D, W - 1), x.dtype, dev)
    captured = _empty((K, D, W - 1), x.dtype, dev)
    n_tiles = plan.num_tiles
    init = state_pool if pool else (initial_states.contiguous() if initial_states is not None else None)
    weight = weight.contiguous()
    n_d = triton.cdiv(D, BLOCK_D)

    grid = (n_tiles + (0 if pool else S) + K, n_d)
    if grid[0] > 0:
        _causal_conv1d_kernel[grid](
            x, weight, bias, init, state_slots, plan.tile_start.t, plan.tile_len.t, plan.tile_pos.t,
            plan.tile_seq.t, plan.state_seq.t, plan.state_end.t, plan.cu_seqlens.t, out, final, captured,
            D, n_tiles, S,
            x.stride(0), x.stride(1),
            W=W, BLOCK_D=BLOCK_D,
            HAS_BIAS=bias is not None, HAS_INIT=init is not None, SILU=activation == "silu", POOL=pool,
        )
    if pool:  # after the tiles (stream order): they read the slots this launch overwrites
        # state_end's first S entries are the sequence lengths (finals come first in the plan)
        _causal_conv1d_final_kernel[(S, n_d)](
            x, state_pool, state_slots, plan.state_end.t, plan.cu_seqlens.t,
            D,
            x.stride(0), x.stride(1),
            W=W, BLOCK_D=BLOCK_D,
        )
    return Conv1dOutput(out, final, captured)


_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def compile_variants() -> list[KernelVariant]:
    """fp32/bf16/fp16; D is a runtime size (8448 for Bamba-9B), x's channel stride 1 as the JIT
    specializes it. The main kernel with initial states from a tensor and from the pool (the
    model's path), and the pool mode's final-state kernel."""
    variants = []
    tables = ("tile_start", "tile_len", "tile_pos", "tile_seq", "state_seq", "state_end", "cu_seqlens",
              "state_slots", "seq_len")
    for dtype, td in _TRITON_DTYPE.items():
        types = {a: "*i32" for a in tables}
        types.update({a: f"*{td}" for a in ("x", "weight", "bias", "initial_states", "y", "final_states",
                                             "captured_states", "state_pool")})
        for fn, name, consts in (
            (_causal_conv1d_kernel, f"ssm/causal_conv1d/{td}/w4",
             dict(stride_x_d=1, W=WIDTH, BLOCK_D=BLOCK_D, HAS_BIAS=True, HAS_INIT=True, SILU=True, POOL=False)),
            (_causal_conv1d_kernel, f"ssm/causal_conv1d/pool/{td}/w4",
             dict(stride_x_d=1, W=WIDTH, BLOCK_D=BLOCK_D, HAS_BIAS=True, HAS_INIT=True, SILU=True, POOL=True)),
            (_causal_conv1d_final_kernel, f"ssm/causal_conv1d/final/{td}/w4",
             dict(stride_x_d=1, W=WIDTH, BLOCK_D=BLOCK_D)),
        ):
            sig = {a: "constexpr" if a in consts else types.get(a, "i32") for a in fn.arg_names}
            variants.append(KernelVariant(name, fn, sig, consts, num_warps=4,
                                          divisible_by_16=aligned_args(fn, sig, consts)))
    return variants
