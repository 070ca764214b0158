"""Triton kernels (paged attention, Mamba-2 SSD scan, causal conv1d, gated delta rule), their oracles and CPU paths.

Kernel files follow one layout: `@triton.jit` kernel(s), a launcher that checks shapes and
launches, then the public function; `compile_variants()` declares what the compile check builds
(`kernels.variants`). Beside them: `contracts/` (argument checks, output types, chunk tables:
what every implementation agrees on), `reference/` (plain fp32 oracles, the executable spec) and
`torch_cpu/` (the fast PyTorch paths the model's `torch` backend runs).

Grouped by role, not by op (decided in issue 19; flash-linear-attention groups by op: one folder
holding an op's kernel, contract, reference and CPU path). We keep the role folders because:

* the unit that grows is a *variant* of an op that already has its contract and oracle, and a
  variant touches at most three files either way: its kernel file (`@triton.jit` kernel,
  launcher, public function, `compile_variants()`; a new tile table entry instead goes in
  `ssd_configs.py`), its test file (checked against the op's oracle in `reference/`), and,
  if a backend is to run it, that op's line in the backend's entry of `model/backends.py`.
  A new op is six in both layouts (contract, oracle, CPU path, kernel, backend line, test);
  grouping by op would move files, not remove one;
* the role folders carry rules a folder per op would spread out: `torch_cpu/`, `reference/` and
  `contracts/` never import Triton (the `torch` backend and the oracles run without it), the
  compile check finds kernels as the top-level modules here, and `contracts/` holds what
  several ops share (tensor checks, varlen chunk tables, packed step tables);
* moving would rewrite 79 imports in 31 files for no file saved.

How a backend runs differently from another (state pools read in-launch, the config's scan
chunk, conv kernels of one width) is declared by the backend (`model.backends.Capabilities`),
never inferred from its name.
"""
