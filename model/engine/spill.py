"""Snapshots spilled to disk for real: one safetensors file per state, read back with a checksum, and
found again by a later process through an index beside the files.

`FileSpill(folder)` is a `planner.snapshot_tiers.Spill`: the snapshot store hands it a state when it
demotes the snapshot to the disk tier, and asks for it back (checked) when a request would restore
it. A state is the model's `SSMState` (per Mamba layer its conv and SSM tensors; written as
`conv.<i>` / `ssm.<i>`), a snapshot stored in a smaller dtype
(`model.engine.snapshot_codec.QuantizedState`: its tensors as stored, fp8 ones with their scales
`conv_scale.<i>` / `ssm_scale.<i>`) or the placeholder runner's `PlaceholderState` (its three
integers, as tensors). The handle keeps the file's sha256: a missing, truncated or altered file raises
`SpillError`, the store drops the snapshot with one log line, and the request recomputes: a wrong
state is never restored.

Restart. The engine binds the spill to what its states mean before its store exists (`bind`,
`state_identity`: a digest of the model's config, dtype and every weight's bytes, and of the KV
block the keys' hashes are chained over). Each identity has its own index in the folder,
`index-<id16>.log`, and its own files, `<id16>-<random>.safetensors`: engines of other checkpoints
may share a folder and never read each other's states. The index is an append-only log of JSON
lines, each ending in a tab and a checksum of itself:

    put   the file, the sha256 and length of its bytes, and its `SpillEntry` (position, anchor, tail, ...)
    drop  the file

A put line is appended only after its file is written and fsynced, a drop line before its file is
unlinked. A log rather than an index rewritten through a temp file + fsync + os.replace: a spill
appends one line, where the rewrite costs O(snapshots held) on every spill, inside an engine step.
The log itself is rewritten that way (so atomically) when it is opened, which also clears a torn
last line before anything is appended after it, and when its dead lines outnumber the live ones
4 to 1 (`COMPACT_RATIO`).

Opening replays the log: a torn or altered line (a crash mid-append) is ignored; a put whose file is
missing or of another length (a stale line) is forgotten; a file of this identity that no live line
names (a crash before its put line) is removed. What is left is `recorded()`, which the store adopts
as disk-tier residents. Nothing read back is trusted without the sha256 its put line holds (`get`):
a file swapped for another snapshot's, or altered in place, raises SpillError and the request
recomputes. So a crash at any point loses at most the snapshot being written and never yields a
wrong state (tests/test_disk_restart.py stops writers at every file operation and kills them at
random times). The fsyncs make the same hold across a power loss.

One engine per folder and identity at a time: `bind` takes an exclusive lock (flock on
`index-<id16>.lock`; released by `close` or when the process dies) and refuses a held one.
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from kernels.checks import require
from model.cache import SSMState
from model.engine.placeholder_runner import PlaceholderRunner, PlaceholderState
from model.engine.snapshot_codec import DEFAULT_SNAPSHOT_DTYPE, QuantizedState
from planner.snapshot_tiers import SpillEntry, SpillError

LOG = logging.getLogger(__name__)

INDEX_VERSION = 1  # in every identity: a new index format never reads an old one's states
COMPACT_RATIO = 4  # rewrite the log when its lines exceed this many per live one (plus COMPACT_SLACK)
COMPACT_SLACK = 64


@dataclasses.dataclass(frozen=True)
class SpilledState:
    """Where a state was written and what its bytes hashed to."""

    path: Path
    sha256: str
    nbytes: int  # the state's, as the store counts it


def to_tensors(state: Any) -> dict[str, torch.Tensor]:
    if isinstance(state, QuantizedState):
        scales = {f"{kind}_scale.{i}": s.reshape(()).cpu() for kind, kind_scales in
                  (("conv", state.conv_scale), ("ssm", state.ssm_scale)) for i, s in enumerate(kind_scales)
                  if s is not None}
        return to_tensors(SSMState(state.conv, state.ssm)) | scales
    if isinstance(state, SSMState):
        return {**{f"conv.{i}": t.contiguous().cpu() for i, t in enumerate(state.conv)},
                **{f"ssm.{i}": t.contiguous().cpu() for i, t in enumerate(state.ssm)}}
    if isinstance(state, PlaceholderState):
        return {"placeholder": torch.tensor([state.position, state.hash, state.nbytes], dtype=torch.int64)}
    raise TypeError(f"cannot spill a {type(state).__name__}")


def from_tensors(tensors: dict[str, torch.Tensor], device: torch.device | str) -> Any:
    if "placeholder" in tensors:
        position, hash_, nbytes = (int(x) for x in tensors["placeholder"])
        return PlaceholderState(position, hash_, nbytes)
    layers = len([k for k in tensors if k.startswith("conv.")])
    if any("_scale." in k for k in tensors):  # an fp8 snapshot: dequantised on restore, not here
        scale = lambda kind, i: tensors[f"{kind}_scale.{i}"].to(device) if f"{kind}_scale.{i}" in tensors else None
        return QuantizedState([tensors[f"conv.{i}"].to(device) for i in range(layers)],
                              [tensors[f"ssm.{i}"].to(device) for i in range(layers)],
                              [scale("conv", i) for i in range(layers)], [scale("ssm", i) for i in range(layers)])
    return SSMState([tensors[f"conv.{i}"].to(device) for i in range(layers)],
                    [tensors[f"ssm.{i}"].to(device) for i in range(layers)])


def state_identity(runner: Any, block_size: int, snapshot_dtype: str = DEFAULT_SNAPSHOT_DTYPE) -> str:
    """What a runner's snapshot states mean, as a hex digest: the hybrid model's config, dtype and
    every weight's bytes (a fine-tune of the same config differs), or the placeholder's state size;
    the KV block, which the keys' chained hashes are over; and a snapshot dtype other than the
    default (an engine never adopts states stored less precisely than it asked; the default's
    digest is the one it always was). Hashing the weights reads them once:
    the 14.4M-parameter `small` preset (58 MB) in ~0.1 s here; a 9B bf16 model's 18 GB in tens of s."""
    h = hashlib.sha256(f"spill-v{INDEX_VERSION} block_size={block_size}\n".encode())
    if snapshot_dtype != DEFAULT_SNAPSHOT_DTYPE:
        h.update(f"snapshot_dtype={snapshot_dtype}\n".encode())
    model = getattr(runner, "model", None)
    if model is not None:
        h.update(json.dumps(dataclasses.asdict(model.config), sort_keys=True, default=str).encode())
        h.update(f"\n{model.dtype}\n".encode())
        for name, t in sorted(model.state_dict().items()):
            h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
            h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    elif isinstance(runner, PlaceholderRunner):
        h.update(f"placeholder nbytes={runner.snapshot_nbytes}".encode())
    else:
        raise TypeError(f"runner: cannot name the states of a {type(runner).__name__} (a model or the placeholder)")
    return h.hexdigest()


class FileOps:
    """The file operations a FileSpill makes, one method each: the crash tests replace them to stop a
    writer between any two or halfway through a write. `durable=False` skips the fsyncs: a killed
    process loses nothing the kernel holds, only a power loss does (an fsync took ~13 ms on this
    2-core machine's overlay disk under load, two per spill)."""

    def __init__(self, durable: bool = True):
        self.durable = durable

    def write_file(self, path: Path, data: bytes) -> None:
        """A new file holding `data`, fsynced (an existing name is refused: names are never reused)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self.write(fd, data)
        finally:
            os.close(fd)

    def write(self, fd: int, data: bytes) -> None:
        """All of `data` at `fd`, fsynced."""
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if self.durable:
            os.fsync(fd)

    def replace(self, src: Path, dst: Path) -> None:
        """`src` renamed over `dst`, the folder fsynced so the new name holds."""
        os.replace(src, dst)
        if not self.durable:
            return
        fd = os.open(dst.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)


def encode_line(record: dict) -> bytes:
    body = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return body + b"\t" + hashlib.sha256(body).hexdigest()[:16].encode() + b"\n"


def decode_line(line: bytes) -> dict | None:
    """A log line's record; None for a torn or altered one (its checksum does not match)."""
    body, _, check = line.rpartition(b"\t")
    if not body or hashlib.sha256(body).hexdigest()[:16].encode() != check:
        return None
    try:
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def entry_record(entry: SpillEntry) -> dict:
    tokens = entry.prefix_tokens
    return {"position": entry.position, "anchor": entry.anchor.hex() if entry.anchor is not None else None,
            "tail": list(entry.tail), "nbytes": entry.nbytes, "origin": entry.origin,
            "flops_saved": entry.flops_saved,
            "prefix_tokens": None if tokens is None
            else base64.b64encode(np.asarray(tokens, dtype="<i8").tobytes()).decode()}


def record_entry(record: dict) -> SpillEntry:
    tokens = record["prefix_tokens"]
    return SpillEntry(int(record["position"]), bytes.fromhex(record["anchor"]) if record["anchor"] is not None else None,
                      tuple(int(t) for t in record["tail"]), int(record["nbytes"]), str(record["origin"]),
                      float(record["flops_saved"]),
                      None if tokens is None else np.frombuffer(base64.b64decode(tokens), dtype="<i8").astype(np.int64))


class FileSpill:
    """A folder of spilled snapshot states (`Spill`) and the index that finds them after a restart;
    `device`: where read-back tensors go; `ops`: the file operations (`FileOps`)."""

    def __init__(self, folder: Path | str, device: torch.device | str = "cpu", ops: FileOps | None = None):
        self.folder = Path(folder)
        require(not self.folder.exists() or self.folder.is_dir(), "folder", f"{self.folder} is not a folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.device = device
        self.ops = ops or FileOps()
        self.identity: str | None = None
        self.opened: dict[str, int] = {}  # what `bind` found: live entries, torn lines, stale lines, orphan files
        self._live: dict[str, tuple[dict, SpilledState]] = {}  # file name -> (its put record, handle), log order
        self._lines = 0  # lines in the log now
        self._torn = False  # an append failed partway: rewrite the log before the next one lands on its stub
        self._index_fd: int | None = None
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ the index
    def bind(self, identity: str) -> None:
        """Tie this spill to the states of `identity` (`state_identity`): lock and open its index."""
        if self.identity == identity and self._index_fd is not None:
            return
        require(self.identity in (None, identity), "identity", f"{self.folder}: bound to {self.identity}, not {identity}")
        tag = identity[:16]
        lock = self.folder / f"index-{tag}.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpillError(f"{lock}: another engine of this model holds this folder (one at a time)") from None
        self.identity, self._tag, self._lock_fd = identity, tag, fd
        self._index = self.folder / f"index-{tag}.log"
        self._open_index()

    def _open_index(self) -> None:
        raw = self._index.read_bytes() if self._index.exists() else b""
        puts: dict[str, dict] = {}
        torn = 0
        for line in raw.split(b"\n"):
            if not line:
                continue
            record = decode_line(line)
            if record is None or record.get("id") != self.identity or record.get("op") not in ("put", "drop"):
                torn += 1
            elif record["op"] == "put":
                puts[record["file"]] = record
            else:
                puts.pop(record["file"], None)
        stale, keys = 0, {}
        for name, record in list(puts.items()):
            path = self.folder / name
            size = path.stat().st_size if path.is_file() else None
            key = (record["anchor"], tuple(record["tail"]))
            if size != record["bytes"] or path.parent != self.folder:
                del puts[name]
                stale += 1
                continue
            if key in keys:  # the same prefix twice (never written so, but cheap to refuse): the newer
                del puts[keys[key]]
            keys[key] = name
        self._live = {name: (r, SpilledState(self.folder / name, r["sha256"], int(r["nbytes"])))
                      for name, r in puts.items()}
        orphans = [p for p in self.folder.glob(f"{self._tag}-*.safetensors") if p.name not in self._live]
        for path in orphans:
            self.ops.unlink(path)
        self._compact()
        self.opened = {"found": len(self._live), "torn_lines": torn, "stale_lines": stale, "orphan_files": len(orphans)}
        if raw:
            LOG.info("disk tier %s: %d snapshots found (%d torn lines ignored, %d stale lines, %d orphan files "
                     "removed)", self.folder, len(self._live), torn, stale, len(orphans))

    def _compact(self) -> None:
        """The log rewritten with the live puts only, atomically (a temp file, fsync, os.replace)."""
        tmp = self._index.with_name(self._index.name + ".tmp")
        self.ops.unlink(tmp)  # a crashed compaction's
        self.ops.write_file(tmp, b"".join(encode_line(record) for record, _ in self._live.values()))
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None
        self.ops.replace(tmp, self._index)
        self._index_fd = os.open(self._index, os.O_WRONLY | os.O_APPEND)
        self._lines = len(self._live)

    def _append(self, record: dict) -> None:
        if self._torn:
            self._compact()
        self._torn = True
        self.ops.write(self._index_fd, encode_line(record))
        self._torn = False
        self._lines += 1

    def _require_open(self) -> None:
        if self._index_fd is None:
            raise SpillError(f"{self.folder}: not bound to a model's states (the engine binds it) or closed")

    def recorded(self) -> list[tuple[SpillEntry, SpilledState]]:
        """The snapshots this folder holds for the bound identity, oldest spill first."""
        self._require_open()
        return [(record_entry(record), handle) for record, handle in self._live.values()]

    def close(self) -> None:
        """Release the index and its lock (what a process's death does too)."""
        for name in ("_index_fd", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def __del__(self):
        try:
            self.close()
        except OSError:  # at interpreter exit: the process's end releases the lock anyway
            pass

    # ------------------------------------------------------------------ states
    def put(self, state: Any, entry: SpillEntry) -> SpilledState:
        self._require_open()
        data = save_tensors(to_tensors(state))
        path = self.folder / f"{self._tag}-{secrets.token_hex(8)}.safetensors"
        handle = SpilledState(path, hashlib.sha256(data).hexdigest(), int(state.nbytes))
        record = {"op": "put", "id": self.identity, "file": path.name, "sha256": handle.sha256, "bytes": len(data)} | entry_record(entry)
        try:
            self.ops.write_file(path, data)
            self._append(record)
        except OSError:
            self.ops.unlink(path)  # a full disk: no orphan left behind
            raise
        self._live[path.name] = (record, handle)
        if self._lines > COMPACT_RATIO * len(self._live) + COMPACT_SLACK:
            self._compact()
        return handle

    def get(self, handle: SpilledState) -> Any:
        try:
            data = handle.path.read_bytes()
        except OSError as e:
            raise SpillError(f"{handle.path}: {e.strerror or e}") from None
        if hashlib.sha256(data).hexdigest() != handle.sha256:
            raise SpillError(f"{handle.path}: checksum mismatch ({len(data)} bytes)")
        return from_tensors(load_tensors(data), self.device)

    def drop(self, handle: SpilledState) -> None:
        if self._live.pop(handle.path.name, None) is not None and self._index_fd is not None:
            try:
                self._append({"op": "drop", "id": self.identity, "file": handle.path.name})
            except OSError as e:  # its put line stays; the next open finds the file gone and forgets it
                LOG.warning("disk tier %s: drop of %s not logged (%s)", self.folder, handle.path.name, e)
        self.ops.unlink(handle.path)
