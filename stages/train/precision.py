"""`train.precision: auto`: bf16 autocast (fp32 master weights) where the device computes bf16 natively, fp32
elsewhere, and the reason for the choice, which the run logs and records in metrics/train.json.

Native means the hardware multiplies bf16 itself: CUDA GPUs of compute capability 8.0 (Ampere) or newer; x86 CPUs
with AVX512-BF16 or AMX (AMD Zen 4 and later, Intel Sapphire Rapids and later); ARM CPUs with the BF16 extension
(oneDNN's own check). Without it bf16 is emulated, and an emulated bf16 autocast runs slower than fp32 (1.8x on an
AVX512 CPU without AVX512-BF16), so `auto` stays in fp32 there. The check asks torch about the machine it runs on;
nothing is inferred from a CPU's or GPU's name.
"""

from __future__ import annotations

import platform

import torch

X86 = ("x86_64", "amd64", "i386", "i686")


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """Whether `device` computes bf16 natively, and what says so."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if major >= 8:
            return True, f"{name} (compute capability {major}.{minor}) has bf16 tensor cores"
        return False, f"{name} (compute capability {major}.{minor}) has no bf16 tensor cores (Ampere, 8.0, has)"
    if device.type != "cpu":
        return False, f"no bf16 check for a {device.type} device"
    if platform.machine().lower() in X86:
        features = [name for name, present in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                                               ("AMX", torch.cpu._is_amx_tile_supported())) if present]
        if features:
            return True, f"the CPU has {' and '.join(features)}"
        return False, "the CPU has neither AVX512-BF16 nor AMX: bf16 would be emulated, slower than fp32"
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return True, f"oneDNN reports native bf16 on this {platform.machine()} CPU"
    return False, f"oneDNN reports no native bf16 on this {platform.machine()} CPU"


def resolve_precision(setting: str, device: torch.device) -> tuple[str, str]:
    """(the precision a run trains in, why): `auto` becomes bf16 or fp32 by native_bf16; an explicit setting is
    kept as asked."""
    if setting != "auto":
        return setting, "train.precision"
    native, reason = native_bf16(device)
    return ("bf16" if native else "fp32"), f"train.precision auto: {reason}"
