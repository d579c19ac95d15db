"""`train.precision: auto` (stages/train/precision.py): bf16 where the device computes it natively, fp32 where bf16
would be emulated, an explicit setting kept as asked; the reason names what the machine reported."""

from __future__ import annotations

import pytest
import torch

from stages.train import precision
from stages.train.precision import native_bf16, resolve_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def x86_cpu(monkeypatch, avx512_bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


def gpu(monkeypatch, capability: tuple[int, int], name: str) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


@pytest.mark.parametrize(("avx512_bf16", "amx", "expected"), [
    (True, False, ("bf16", "the CPU has AVX512-BF16")),
    (False, True, ("bf16", "the CPU has AMX")),
    (True, True, ("bf16", "the CPU has AVX512-BF16 and AMX")),
    (False, False, ("fp32", "neither AVX512-BF16 nor AMX: bf16 would be emulated")),
])
def test_auto_on_an_x86_cpu_is_bf16_only_with_the_instructions_that_compute_it(monkeypatch, avx512_bf16, amx,
                                                                                 expected):
    x86_cpu(monkeypatch, avx512_bf16, amx)
    chosen, reason = resolve_precision("auto", CPU)
    assert chosen == expected[0] and expected[1] in reason and reason.startswith("train.precision auto: ")


def test_an_avx512_cpu_without_bf16_instructions_stays_in_fp32_whatever_onednn_emulates(monkeypatch):
    x86_cpu(monkeypatch, avx512_bf16=False, amx=False)
    # oneDNN's own check says yes on any AVX512 core: it emulates bf16 there, slower than fp32.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert resolve_precision("auto", CPU)[0] == "fp32"


@pytest.mark.parametrize(("reported", "expected"), [(True, "bf16"), (False, "fp32")])
def test_auto_on_an_arm_cpu_asks_onednn(monkeypatch, reported, expected):
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: reported)
    chosen, reason = resolve_precision("auto", CPU)
    assert chosen == expected and "aarch64" in reason


@pytest.mark.parametrize(("capability", "expected"), [((8, 0), "bf16"), ((9, 0), "bf16"), ((7, 5), "fp32")])
def test_auto_on_a_gpu_is_bf16_from_ampere_on(monkeypatch, capability, expected):
    gpu(monkeypatch, capability, "NVIDIA Test GPU")
    chosen, reason = resolve_precision("auto", CUDA)
    assert chosen == expected and f"compute capability {capability[0]}.{capability[1]}" in reason


@pytest.mark.parametrize("setting", ["fp32", "bf16", "fp16"])
def test_an_explicit_precision_is_kept_as_asked(monkeypatch, setting):
    x86_cpu(monkeypatch, avx512_bf16=False, amx=False)
    assert resolve_precision(setting, CPU) == (setting, "train.precision")


def test_this_machine_gets_an_answer_with_its_reason():
    native, reason = native_bf16(CPU)
    assert isinstance(native, bool) and reason
