"""pipeline/cpu_features.py reads /proc/cpuinfo's flags: an x86 CPU with AVX2 and no VNNI is one whose int8 dot
products saturate; one with AVX512-VNNI or AVX-VNNI, an ARM CPU (no x86 flags line) or an unreadable file is not."""

from __future__ import annotations

import pytest

from pipeline.cpu_features import cpu_flags, int8_dot_products_saturate

X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma {extra}\n\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(("cpuinfo", "saturates"), [
    (X86.format(extra=""), True),
    (X86.format(extra="avx512f avx512_vnni avx512_bf16"), False),
    (X86.format(extra="avx_vnni"), False),
    (ARM, False),
])
def test_int8_saturates_on_x86_with_avx2_and_without_vnni_only(tmp_path, cpuinfo, saturates):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert int8_dot_products_saturate(cpu_flags(path)) is saturates


def test_a_missing_cpuinfo_claims_nothing(tmp_path):
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert not int8_dot_products_saturate(frozenset())
