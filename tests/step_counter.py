"""Counts, per decoder layer of one `forward_batch` step, what would stall a GPU's host.

On the CPU there is no device to tell apart, so this counts what *would* be a host sync on one:

* syncs: a tensor converted to Python (`.item()`, `int()`, `float()`, `bool()` through aten's
  `_local_scalar_dense`, `.tolist()`, `.numpy()`) and the ops whose output size depends on data
  (`torch.unique`, `nonzero`, `masked_select`), inside the layers and the kernels' launchers;
* creations: a tensor made from host data (`torch.tensor`, `as_tensor`, `from_numpy`) inside a
  layer: on a GPU each is a blocking host-to-device copy;
* uploads: calls of `kernels.contracts.packed.to_device`, the step's one metadata copy;
* launches: Triton kernel launches by kernel name (the interpreter's `run`, or the JIT's);
* gathers: aten indexing by a tensor (`index`, `index_put_`, `index_select`, `gather`, `scatter`)
  outside the launches: a state pool gathered before a kernel or scattered after it.

Everything a Triton launch does inside the interpreter (it converts its arguments itself) is not
counted: on a GPU that work is the launch.
"""

from __future__ import annotations

import collections
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = {"_local_scalar_dense", "_unique2", "unique_dim", "unique_consecutive", "nonzero", "masked_select",
            "nonzero_static"}
GATHER_OPS = {"index", "index_put", "index_put_", "_index_put_impl_", "index_select", "gather", "scatter", "scatter_"}
STEP = "step"  # events outside every decoder layer (the step's own host work)


class StepCounter(TorchDispatchMode):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.where = STEP
        self.paused = 0
        self.syncs: dict[str, list[str]] = collections.defaultdict(list)
        self.creations: dict[str, list[str]] = collections.defaultdict(list)
        self.launches: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.gathers: dict[str, list[str]] = collections.defaultdict(list)
        self.uploads = 0

    # dispatch-level syncs --------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.overloadpacket.__name__
            if name in SYNC_OPS:
                self.syncs[self.where].append(name)
            if name in GATHER_OPS:
                self.gathers[self.where].append(name)
        return func(*args, **(kwargs or {}))

    def _record_sync(self, what: str):
        if not self.paused:
            self.syncs[self.where].append(what)

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        try:
            import kernels.contracts.packed as packed
        except ImportError:  # a tree from before the step metadata (for the before/after record)
            packed = None

        counter = self
        for i, layer in enumerate(self.model.layers):
            tag = f"{i}:{layer.kind}"
            monkeypatch.setattr(layer, "forward", _tagged(self, tag, layer.forward))

        for meth in ("tolist", "numpy"):
            orig = getattr(torch.Tensor, meth)

            def wrapped(t, *a, _orig=orig, _meth=meth, **k):
                counter._record_sync(_meth)
                counter.paused += 1  # tolist() itself may dispatch _local_scalar_dense: count it once
                try:
                    return _orig(t, *a, **k)
                finally:
                    counter.paused -= 1
            monkeypatch.setattr(torch.Tensor, meth, wrapped)

        for fn in ("tensor", "as_tensor", "from_numpy"):
            orig = getattr(torch, fn)

            def made(*a, _orig=orig, _fn=fn, **k):
                if not counter.paused and counter.where != STEP:
                    counter.creations[counter.where].append(_fn)
                return _orig(*a, **k)
            monkeypatch.setattr(torch, fn, made)

        if packed is not None:
            orig_to_device = packed.to_device

            def to_device(*a, **k):
                counter.uploads += 1
                return orig_to_device(*a, **k)
            monkeypatch.setattr(packed, "to_device", to_device)

        for cls in _launch_classes():
            orig_run = cls.run

            def run(fn_self, *a, _orig=orig_run, **k):
                if not counter.paused:
                    name = getattr(fn_self, "__name__", None) or fn_self.fn.__name__
                    counter.launches[counter.where][name] += 1
                counter.paused += 1
                try:
                    return _orig(fn_self, *a, **k)
                finally:
                    counter.paused -= 1
            monkeypatch.setattr(cls, "run", run)
        with self:
            yield self


def _tagged(counter: StepCounter, tag: str, forward):
    def wrapped(*a, **k):
        prev, counter.where = counter.where, tag
        try:
            return forward(*a, **k)
        finally:
            counter.where = prev
    return wrapped


def _launch_classes():
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:
        pass
    return classes
