"""The tracked tree stays small enough to travel (issue 33): a GPU lease carries at most 64 MiB of
working tree, and peers' wheels travel beside it, so the committed files stay under 32 MiB.

Per-request data in `results/` is committed gzip'd (`experiments.common.compact`); on 2026-12-04 the
conversion took the tracked tree from 55.7 MiB to 24.3 MiB. Sizes are those of the files in the
working tree that `git ls-files` lists (what a lease's copy carries); outside a git checkout (an
sdist, a copied folder) there is nothing to measure and the tests skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TREE_LIMIT = 32 * 2**20  # the ceiling: half the lease's 64 MiB
FILE_LIMIT = 2**20  # one record file; the largest plain ones are ~0.57 MB (mutation/report.json), a per-request
                    # file written plain is 1.5-2.8 MB (the old ttft.json, traces.csv, sweep parts)


def tracked_files() -> list[Path]:
    """The files of this checkout that git tracks and that exist in the working tree."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout ({done.stderr.decode().strip()[:80]})")
    paths = [REPO / p for p in done.stdout.decode().split("\0") if p]
    if not paths:
        pytest.skip("git tracks no file here")
    return [p for p in paths if p.is_file() and not p.is_symlink()]  # a deleted, uncommitted file carries nothing


def test_the_tracked_tree_is_under_32_mib():
    files = tracked_files()
    total = sum(p.stat().st_size for p in files)
    biggest = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:5]
    assert total < TREE_LIMIT, (
        f"tracked tree {total / 2**20:.1f} MiB >= {TREE_LIMIT / 2**20:.0f} MiB; largest: "
        + ", ".join(f"{p.relative_to(REPO)} {p.stat().st_size / 1e6:.2f} MB" for p in biggest)
        + " (per-request data goes into a .gz: results/README.md)")


def test_no_record_file_is_over_1_mib():
    """A per-request file committed plain (1.5-2.8 MB each before) fails here before it fills the tree."""
    big = [f"{p.relative_to(REPO)} ({p.stat().st_size / 1e6:.2f} MB)" for p in tracked_files()
           if p.relative_to(REPO).parts[0] == "results" and p.stat().st_size > FILE_LIMIT]
    assert not big, f"record files over 1 MiB (write them as .gz: experiments.common.compact): {big}"


def test_committed_gzip_files_are_byte_stable():
    """Every tracked .gz under results/ was written by `compact` (mtime 0, no stored name), so a rerun
    that writes the same data leaves git with nothing to commit."""
    gz = [p for p in tracked_files() if p.relative_to(REPO).parts[0] == "results" and p.name.endswith(".gz")]
    if not gz:
        pytest.skip("no gzip'd record files")
    bad = []
    for p in gz:
        head = p.read_bytes()[:10]
        flags, mtime = head[3], int.from_bytes(head[4:8], "little")
        if head[:2] != b"\x1f\x8b" or mtime != 0 or flags & 0x08:  # 0x08: FNAME, a stored file name
            bad.append(f"{p.relative_to(REPO)} (magic {head[:2].hex()}, mtime {mtime}, flags {flags:#x})")
    assert not bad, f"not written by experiments.common.compact: {bad}"
