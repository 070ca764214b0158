"""The machine a result ran on: CPU model, the ISA extensions that decide CPU speed, cores, load,
and the torch / oneDNN / MKL builds. One function, `machine_info`, recorded by every writer through
`results_io.environment` (a CPU figure without its CPU cannot be compared: issue 35 saw vLLM 3x
faster on an AVX-512 EPYC than on the machine of an earlier record, ours 1.4x)."""

from __future__ import annotations

import os
import platform
import re
from typing import Any

# The extensions that change which CPU route is fast (kernels/torch_cpu/capability.py), as
# /proc/cpuinfo names them.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
             "amx_fp16", "amx_int8")


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str | None, str | None, set[str]]:
    """(model name, vendor id, flags) of the first processor in /proc/cpuinfo; Nones elsewhere."""
    model = vendor = None
    flags: set[str] = set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model is None:
                    model = value
                elif key == "vendor_id" and vendor is None:
                    vendor = value
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if model and vendor and flags:
                    break
    except OSError:
        pass
    return model, vendor, flags


def _build_versions(config: str) -> dict[str, str | None]:
    """oneDNN and MKL versions from torch's build summary (`torch.__config__.show()`)."""
    onednn = re.search(r"(?:MKL-DNN|oneDNN)[^v\n]*v(\d[\w.]*)", config)
    mkl = re.search(r"Math Kernel Library Version (\d[\w.]*)", config)
    return {"onednn": onednn.group(1) if onednn else None, "mkl": mkl.group(1) if mkl else None}


def machine_info(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU and its build environment, as data; `cpu_label` is the short form reports print."""
    import torch

    model, vendor, flags = _cpuinfo(cpuinfo)
    model = model or platform.processor() or platform.machine()
    cores = os.cpu_count()
    isa = {name: name in flags for name in ISA_FLAGS} if flags else {}
    shown = [n for n in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if isa.get(n)]
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # pragma: no cover - torch < 2.1
        capability = None
    return {
        "cpu_model": model,
        "cpu_vendor": vendor,
        "arch": platform.machine(),
        "cores": cores,
        "isa": isa,
        "cpu_label": f"{model}, {', '.join(shown) or 'no AVX2'}, {cores} cores",
        "torch": torch.__version__,
        "torch_cpu_capability": capability,
        **_build_versions(torch.__config__.show()),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
