"""What the CPU this runs on computes natively, from the kernel's /proc/cpuinfo flags (Linux; elsewhere nothing is
known and nothing is claimed). Stdlib only: the export stage's messages and the tests read it without torch."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# AVX512-VNNI (Intel Cascade Lake and later, AMD Zen 4 and later) and AVX-VNNI (Intel Alder Lake and later).
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The feature flags of the first CPU listed; empty where /proc/cpuinfo is missing or has no x86 flags line."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def int8_dot_products_saturate(flags: frozenset[str] | None = None) -> bool:
    """Whether this is an x86 CPU with AVX2 but without VNNI: int8 matrix products then go through 16-bit
    intermediate sums that can saturate (oneDNN's "nuances of int8 computations"), so an int8 model's outputs
    differ more from float32 here than on a CPU with VNNI, where the same model may pass a parity check."""
    flags = cpu_flags() if flags is None else flags
    return "avx2" in flags and not VNNI_FLAGS & flags
