"""The floating-point width a GPU kernel works in, read from its name.

Kernel names carry their data type: C++ template arguments (``<float>``, ``<c10::BFloat16, float>``,
``<__half>``, CUTLASS's ``tfloat32_t`` in mangled names), cuBLAS/cuDNN/CUTLASS tile names (``sgemm``,
``scudnn``, ``s1688gemm`` for fp32 data on the TF32 tensor pipe; ``h884gemm``, ``h1688gemm`` for fp16;
``bf16_s16816gemm`` for bf16 data accumulated in fp32), cuBLASLt/xmma names (``gemm_bf16bf16_bf16f32_f32``,
``tf32f32_tf32f32_f32``) and ROCm Tensile names (``Cijk_Ailk_Bjlk_SB_...``: the letters after the operand
layouts give the type, S single, D double, H half, B bfloat16, then B again for batched). A kernel that names a
narrow type works in it even when it also names ``float`` (the accumulator or a scale): the bytes it moves are
the narrow type's.
"""

from __future__ import annotations

import re
from typing import Final, Literal

Precision = Literal["fp64", "fp32", "16-bit", "8-bit"]

_EDGE = r"(?<![a-z])"
_EIGHT: Final = re.compile(rf"{_EDGE}(fp8|e4m3|e5m2|u?int8|imma|i8816|i16832)")
_SIXTEEN: Final = re.compile(
    rf"bf16|bfloat16|float16|fp16|{_EDGE}f16|half|{_EDGE}h\d{{3,6}}(gemm|fprop|dgrad|wgrad|conv)|hgemm|hcudnn"
)
_DOUBLE: Final = re.compile(rf"{_EDGE}(double|dgemm|zgemm|fp64|f64)")
_SINGLE: Final = re.compile(
    rf"{_EDGE}float(?![a-z])|{_EDGE}(sgemm|scudnn|cgemm|tf32|tfloat32|f32|fp32)|{_EDGE}s\d{{3,6}}(gemm|fprop|dgrad|wgrad|conv)"
)
_ORDER: Final[tuple[tuple[re.Pattern[str], Precision], ...]] = (
    (_EIGHT, "8-bit"), (_SIXTEEN, "16-bit"), (_SINGLE, "fp32"), (_DOUBLE, "fp64")
)  # fmt: skip
"""Narrowest first: the data a kernel moves is of the narrowest type it names."""
_TENSILE: Final = re.compile(r"^Cijk_A[a-z]+_B[a-z]+_([A-Z]+\d*)_")
_TENSILE_TYPES: Final[dict[str, Precision]] = {"S": "fp32", "C": "fp32", "D": "fp64", "Z": "fp64", "H": "16-bit",
                                                "B": "16-bit", "I": "8-bit", "F": "8-bit"}  # fmt: skip


def kernel_precision(name: str) -> Precision | None:
    """``fp64``, ``fp32`` (TF32 included: fp32 data), ``16-bit`` (fp16, bf16) or ``8-bit`` (fp8, int8): the
    narrowest floating-point or integer type a kernel's name shows; None where it shows none (copies, kernels
    over bool or integer indices, generated names such as Triton's)."""
    tensile = _TENSILE.match(name)
    if tensile is not None:
        return _TENSILE_TYPES.get(tensile.group(1)[0])
    lower = name.lower()
    return next((precision for pattern, precision in _ORDER if pattern.search(lower)), None)
