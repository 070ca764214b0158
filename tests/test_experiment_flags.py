"""Every experiment checks its flags when parsed: a bad one ends in argparse's usage error (one
line naming the flag and what it accepts, exit code 2), no traceback, nothing written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from experiments.ablations import study as ablations
from experiments.plan_incident import study as plan_incident
from experiments.warm_restore import study as warm_restore
from experiments.multiturn import cli as multiturn
from model.families import PRESETS, config_to_hf

REPO = Path(__file__).resolve().parents[1]
MAINS = {
    "warm_restore": lambda out, *a: warm_restore.main(["--out", str(out), *a]),
    "ablations": lambda out, *a: ablations.main(["budget", "--out", str(out), *a]),
    "multiturn": lambda out, *a: multiturn.main(["--out", str(out), *a]),
    "plan_incident": lambda out, *a: plan_incident.main(["--out", str(out), *a]),
}


def absent_cuda_device() -> str:
    """A CUDA device this machine does not have: `cuda` on a CPU-only machine, else one past the last."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


def corrupt_checkpoint(folder: Path) -> Path:
    """A checkpoint folder with a valid config.json and a model.safetensors that is not one."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_to_hf(PRESETS["tiny"])))
    (folder / "model.safetensors").write_bytes(b"\x00\x01 this is not a safetensors file " * 40)
    return folder


def usage_error(capsys, run) -> str:
    """Run `run()`, expect argparse's exit 2 with no traceback; return the last stderr line."""
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert ": error: " in lines[-1] and lines[-2].startswith(("usage:", " "))  # argparse's usage, then the error
    return lines[-1]


@pytest.mark.parametrize("name", ["warm_restore", "ablations", "multiturn", "plan_incident"])
def test_block_size_zero(tmp_path, capsys, name):
    out = tmp_path / "out"
    line = usage_error(capsys, lambda: MAINS[name](out, "--block-size", "0"))
    assert "argument --block-size: must be an integer >= 1, got '0'" in line
    assert not out.exists()


@pytest.mark.parametrize("name, low", [("warm_restore", 21), ("ablations", 1), ("plan_incident", 1)])
def test_prompt_len_zero(tmp_path, capsys, name, low):
    out = tmp_path / "out"
    line = usage_error(capsys, lambda: MAINS[name](out, "--prompt-len", "0"))
    assert f"argument --prompt-len: must be an integer >= {low}, got '0'" in line
    assert not out.exists()


@pytest.mark.parametrize("name", ["warm_restore", "ablations", "multiturn"])
def test_a_device_this_machine_lacks(tmp_path, capsys, name):
    out, dev = tmp_path / "out", absent_cuda_device()
    line = usage_error(capsys, lambda: MAINS[name](out, "--device", dev))
    assert f"argument --device: '{dev}'" in line and ("no CUDA device" in line or "index must be in" in line)
    assert not out.exists()


@pytest.mark.parametrize("name", ["warm_restore", "ablations", "multiturn"])
def test_a_corrupt_checkpoint_file_is_named(tmp_path, capsys, name):
    out, ckpt = tmp_path / "out", corrupt_checkpoint(tmp_path / "ckpt")
    line = usage_error(capsys, lambda: MAINS[name](out, "--model", str(ckpt)))
    assert f"argument --model: {ckpt / 'model.safetensors'}: not a readable safetensors file" in line
    assert not out.exists()


def test_a_checkpoint_missing_tensors_fails_at_load_naming_the_folder(tmp_path, capsys):
    from safetensors.torch import save_file

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config_to_hf(PRESETS["tiny"])))
    save_file({"unrelated": torch.zeros(3)}, ckpt / "model.safetensors")  # readable, but not this model's
    out = tmp_path / "out"
    line = usage_error(capsys, lambda: MAINS["warm_restore"](out, "--model", str(ckpt)))
    assert f"argument --model: {ckpt}: checkpoint does not load:" in line and "missing tensor" in line
    assert not out.exists()


@pytest.mark.parametrize("args, flag", [
    (["--repeats", "0"], "--repeats"), (["--interval", "-1"], "--interval"), (["--threads", "-2"], "--threads"),
    (["--model", "no-such-preset"], "--model"), (["--policy", "legacy"], "--policy"),
    (["--seed", "x"], "--seed"),
    (["--block-size", "16", "--prefill-budget", "8"], "--prefill-budget")])
def test_warm_restore_other_flags(tmp_path, capsys, args, flag):
    out = tmp_path / "out"
    assert f"argument {flag}:" in usage_error(capsys, lambda: MAINS["warm_restore"](out, *args))
    assert not out.exists()


@pytest.mark.parametrize("args, flag", [
    (["--prefill-budget", "16,0"], "--prefill-budget"), (["--shard", "2/2"], "--shard"), (["--policy", "nope"], "--policy")])
def test_ablations_other_flags(tmp_path, capsys, args, flag):
    out = tmp_path / "out"
    assert f"argument {flag}:" in usage_error(capsys, lambda: MAINS["ablations"](out, *args))
    assert not out.exists()


@pytest.mark.parametrize("args, flag", [
    (["--eviction", "lru,random"], "--eviction"), (["--branch-fraction", "1.5"], "--branch-fraction"),
    (["--configs", "aligned,nope"], "--configs"), (["--turns-min", "5", "--turns-max", "3"], "argument --turns-min: must be <= --turns-max (3), got 5"),
    (["--quick", "--user-min", "50"], "argument --user-min: must be <= --user-max (40), got 50")])
def test_multiturn_other_flags(tmp_path, capsys, args, flag):
    out = tmp_path / "out"
    assert flag in usage_error(capsys, lambda: MAINS["multiturn"](out, "--runner", "placeholder", *args))
    assert not out.exists()


@pytest.mark.parametrize("module", ["experiments.warm_restore.study", "experiments.multiturn"])
def test_the_command_line_ends_in_one_usage_line(tmp_path, module):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", module, "--block-size", "0", "--out", str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and res.stdout == ""
    last = res.stderr.strip().splitlines()[-1]
    assert last.endswith("error: argument --block-size: must be an integer >= 1, got '0'")
    assert not out.exists()


@pytest.mark.parametrize("name", ["warm_restore", "ablations", "multiturn", "plan_incident"])
def test_an_offline_policy_is_refused_where_no_oracle_marks_exist(tmp_path, capsys, name):
    """optimum needs each request's future matches; only the trace studies compute them (issue 34 item 3:
    elsewhere it ran as a degraded policy under the optimum's name)."""
    out = tmp_path / "out"
    line = usage_error(capsys, lambda: MAINS[name](out, "--policy", "optimum"))
    assert "argument --policy: optimum is offline" in line and "python -m experiments.traces" in line
    assert not out.exists()


def test_the_simulator_refuses_an_offline_policy_without_its_marks():
    from experiments.traces.simulate import SimConfig, simulate
    with pytest.raises(ValueError, match="marks: policy 'optimum' is offline"):
        simulate([], SimConfig("optimum", shape="bamba-9b", budget_gb=4.0))
