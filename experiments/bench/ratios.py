"""Ratio columns shared by the benches: each peer's time over ours at the same config, and a
measured rate as a share of the device ceilings (`experiments.bench.ceilings`: copy GB/s, GEMM TFLOP/s)."""

from __future__ import annotations

from pathlib import Path


def load_ceilings(path: Path | None) -> dict | None:
    """The ceilings JSON written by `python -m experiments.bench.ceilings`, or None when no path is given."""
    if path is None:
        return None
    from experiments.common.inputs import read_json

    return read_json(Path(path), ("copy_gbps", "gemm_tflops"), what="a ceilings JSON (experiments.bench.ceilings)")


def add_peer_ratios(rows: list[dict], key: tuple[str, ...], ours: str, impl: str = "impl", ms: str = "ms",
                    peers: tuple[str, ...] | None = None) -> list[dict]:
    """Sets `peer_over_ours` (peer ms / our ms: above 1, ours is faster) on every row whose config
    (the `key` columns) also has a timed row of impl `ours`; ours gets 1.0. Only rows whose `impl`
    is in `peers` (when given) or `ours` get one; rows without a time get none. Returns `rows`."""
    def timed(r):
        try:
            return float(r.get(ms, "")) > 0
        except (TypeError, ValueError):
            return False

    base = {tuple(str(r.get(k, "")) for k in key): float(r[ms]) for r in rows if r.get(impl) == ours and timed(r)}
    for r in rows:
        ref = base.get(tuple(str(r.get(k, "")) for k in key))
        wanted = peers is None or r.get(impl) in peers or r.get(impl) == ours
        if ref is not None and timed(r) and wanted:
            # 4 significant digits, not 4 decimals: a peer 1,765x faster is 0.0005667, not 0.0006
            r["peer_over_ours"] = float(f"{float(r[ms]) / ref:.4g}")
    return rows


def pct_of(rate: float, ceiling: float | None) -> str:
    """`rate` as a percentage of `ceiling` (same units), '' without a ceiling."""
    return "" if not ceiling else f"{100 * rate / ceiling:.1f}"
