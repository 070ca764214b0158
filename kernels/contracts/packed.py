"""Host-built int32 tables of one step, packed into one buffer and uploaded with one copy.

A forward step needs many small index tables (sequence starts, chunk tables, block tables, slots,
token ids). Built on the host from the scheduler's Python integers and uploaded one at a time,
each would be a blocking host-to-device copy; every layer rebuilding them would add a host read
of the device tensors on top. `IntTables` collects them while the step's metadata is built,
`upload` copies them in one transfer (pinned, non-blocking on CUDA), and each `Table` is then a
view into the device buffer shared by every layer of the step. A value outside int32 fails the
upload (torch.tensor raises on the overflow).
"""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.checks import require

ALIGN = 4  # int32 elements: every table starts 16-byte aligned, as the kernels' compile check assumes


class Table:
    """One int32 table inside an `IntTables` buffer: `.t` is its device view once uploaded."""

    __slots__ = ("offset", "shape", "_t")

    def __init__(self, offset: int, shape: tuple[int, ...]):
        self.offset, self.shape, self._t = offset, shape, None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def t(self) -> torch.Tensor:
        require(self._t is not None, "Table", "read before its IntTables was uploaded")
        return self._t


class IntTables:
    """Collects int32 tables (Python int lists or host int tensors) for one upload."""

    def __init__(self):
        self._ints: list[int] = []  # Python ints, in order
        self._parts: list[tuple[int, torch.Tensor]] = []  # host tensors placed after the ints
        self._tables: list[Table] = []
        self._tensor_len = 0
        self.buffer: torch.Tensor | None = None

    def add(self, values: Sequence[int], shape: tuple[int, ...] | None = None) -> Table:
        """A table of Python ints (reshaped to `shape` when given)."""
        values = list(values)
        self._ints.extend([0] * (-len(self._ints) % ALIGN))
        table = Table(len(self._ints), shape if shape is not None else (len(values),))
        require(table.numel == len(values), "shape", f"{shape} does not hold {len(values)} values")
        self._ints.extend(values)
        self._tables.append(table)
        return table

    def add_host_tensor(self, t: torch.Tensor) -> Table:
        """A table from an int tensor already on the host (e.g. token ids), copied as int32."""
        require(t.device.type == "cpu", "t", f"must be a host tensor, got {t.device}")
        table = Table(-1 - len(self._parts), tuple(t.shape))  # placed after the ints at upload
        flat = t.reshape(-1).to(torch.int32)
        pad = -flat.numel() % ALIGN  # the next part starts aligned too
        self._parts.append((len(self._tables), torch.cat([flat, flat.new_zeros(pad)]) if pad else flat))
        self._tables.append(table)
        return table

    def upload(self, device: torch.device | str) -> torch.Tensor:
        """One host buffer, one copy; fills every table's view. Returns the device buffer."""
        require(self.buffer is None, "IntTables", "uploaded twice")
        self._ints.extend([0] * (-len(self._ints) % ALIGN))  # the host parts start aligned
        host = upload_host_buffer(self._ints, [p for _, p in self._parts])
        device = torch.device(device)
        buf = to_device(host, device)
        offset = len(self._ints)
        for index, part in self._parts:
            self._tables[index].offset = offset
            offset += part.numel()
        for table in self._tables:
            table._t = buf[table.offset:table.offset + table.numel].view(table.shape)
        self.buffer = buf
        return buf


def upload_host_buffer(ints: list[int], parts: list[torch.Tensor]) -> torch.Tensor:
    """The step's one host buffer: `ints` then `parts`, int32 (pinned when CUDA is there to use it)."""
    head = torch.tensor(ints, dtype=torch.int32)
    return torch.cat([head, *parts]) if parts else head


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The step's one host-to-device copy: pinned and non-blocking on CUDA, none on the CPU."""
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
