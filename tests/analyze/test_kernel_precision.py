"""The data type of a kernel read from its name: every kernel of the real traces, and the library naming schemes
the traces do not hold (Volta/Turing half GEMMs, fp16 cuBLASLt, Tensile half and bfloat16)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import kineto_fixture
from xstack.analyze._kernel_precision import kernel_precision


def _kernels(import_store: Any, trace: str) -> list[str]:
    store = import_store(kineto_fixture(trace))
    return [str(r[0]) for r in store.query("SELECT DISTINCT name FROM spans WHERE level = 'kernel' ORDER BY 1")]


@pytest.mark.parametrize("trace", ["h100_bert_small_infer_full.json.gz", "h100_vit_image_cls_infer_full.json.gz"])
def test_bf16_models_kernels_are_16_bit_or_untyped(import_store: Any, trace: str) -> None:
    # the bf16 models: every kernel that moves floating-point data moves bf16, even where it names float too
    # (layer norm's accumulator, cuDNN's scale); the others move bool, long or opaque bytes
    found = {name: kernel_precision(name) for name in _kernels(import_store, trace)}
    assert {p for p in found.values()} <= {"16-bit", None}
    assert all(p == "16-bit" for n, p in found.items() if "bf16" in n.lower() or "bfloat16" in n.lower())
    untyped = [n for n, p in found.items() if p is None]
    assert all(any(t in n for t in ("<bool", "<long", "OpaqueType")) for n in untyped), untyped


@pytest.mark.parametrize(
    "trace", ["a100_alexnet_train_sync.json.gz", "a100x8_nccl_allreduce_train.json.gz", "mi250_toy_train_rocm.json.gz"]
)
def test_fp32_models_kernels_are_fp32_or_untyped(import_store: Any, trace: str) -> None:
    # fp32 training: float templates, sgemm/scudnn, TF32 tensor-op GEMMs (s1688, tf32f32), Tensile's S type
    found = {name: kernel_precision(name) for name in _kernels(import_store, trace)}
    assert "16-bit" not in found.values() and "fp64" not in found.values()
    assert all(p == "fp32" for n, p in found.items() if "float" in n or "sgemm" in n or "s1688" in n or "tf32" in n)
    assert sum(p == "fp32" for p in found.values()) >= 0.75 * len(found)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("volta_h884gemm_256x128_ldg8_nn", "16-bit"),
        ("turing_h1688gemm_128x128_ldg8_relu_nn", "16-bit"),
        ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "16-bit"),  # fp16 data, fp32 accumulation
        ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_stage4_warpsize2x2x1_kernel", "16-bit"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::Half>>(int)", "16-bit"),
        ("void layer_norm_kernel<__half, float>(__half const*, float*)", "16-bit"),
        ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_K1", "16-bit"),
        ("Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI32x32x4x2_SN_K1", "16-bit"),
        ("Cijk_Ailk_Bljk_SB_MT64x64x16_SN_K1", "fp32"),
        ("Cijk_Ailk_Bljk_DB_MT64x64x16_SN_K1", "fp64"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)", "fp32"),
        ("ampere_dgemm_64x64_tn", "fp64"),
        ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_cublas", "8-bit"),
        ("triton_poi_fused_add_cos_sin_0", None),
        ("Memcpy HtoD (Pageable -> Device)", None),
    ],
)
def test_library_naming_schemes(name: str, expected: str | None) -> None:
    assert kernel_precision(name) == expected
