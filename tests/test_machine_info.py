"""experiments/common/machine.py: the machine every record names (CPU model, ISA, cores, builds),
read from a cpuinfo written here, and its place in `results_io.environment`."""

import torch

from experiments.common import machine
from experiments.common.results_io import environment

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni
processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni
"""
SAPPHIRE = EPYC.replace("AuthenticAMD", "GenuineIntel").replace("AMD EPYC 9B14", "Intel(R) Xeon(R) Platinum 8481C") \
    .replace("avx512_vnni", "avx512_vnni avx512_fp16 amx_tile amx_bf16 amx_int8")
LAPTOP = "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Core(TM) i7-8550U\nflags\t\t: fpu sse2 avx avx2 fma\n"


def test_the_record_names_cpu_model_isa_cores_and_builds(tmp_path):
    (tmp_path / "cpuinfo").write_text(EPYC)
    info = machine.machine_info(str(tmp_path / "cpuinfo"))
    assert (info["cpu_model"], info["cpu_vendor"]) == ("AMD EPYC 9B14", "AuthenticAMD")
    assert info["isa"]["avx512f"] and info["isa"]["avx512_bf16"] and not info["isa"]["amx_bf16"]
    assert info["cpu_label"] == f"AMD EPYC 9B14, avx2, avx512f, avx512_bf16, {info['cores']} cores"
    assert info["torch"] == torch.__version__ and len(info["loadavg"]) == 3
    for name, text, shown in (("spr", SAPPHIRE, "avx2, avx512f, avx512_bf16, avx512_fp16, amx_bf16"),
                              ("laptop", LAPTOP, "avx2")):
        (tmp_path / name).write_text(text)
        assert machine.machine_info(str(tmp_path / name))["cpu_label"].split(", ", 1)[1].startswith(shown)


def test_missing_cpuinfo_still_names_the_machine(tmp_path):
    info = machine.machine_info(str(tmp_path / "absent"))
    assert info["cpu_model"] and info["isa"] == {} and "no AVX2" in info["cpu_label"]


def test_build_versions_are_read_from_torchs_build_summary():
    shown = ("  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64\n"
             "  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd69a3df32adcccb623b12cd7baa22)\n")
    assert machine._build_versions(shown) == {"onednn": "3.12.0", "mkl": "2024.2"}
    assert machine._build_versions("no BLAS here") == {"onednn": None, "mkl": None}


def test_every_environment_record_carries_the_machine_and_the_cpu_routes():
    env = environment("cpu")
    assert env["machine"]["cpu_model"] in env["device_name"] and env["machine"]["cores"] >= 1
    assert set(env["cpu_routes"]["routes"]) >= {"fp32_matmul", "bf16_matmul", "bf16_attention", "allocator"}
