"""The peak table MFU is measured against: NVML's names find the right model (a variant is not
taken for the name it extends), dense figures, and no peak rather than a guess."""

from __future__ import annotations

import pytest

from ddp_engine.common.gpu_peaks import flops_words, gpu_model, peak_flops


@pytest.mark.parametrize(("name", "model", "bf16_tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200 SXM", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("NVIDIA A10", "A10", 125.0),
    ("NVIDIA L40S", "L40S", 362.05),
    ("NVIDIA L40", "L40", 181.05),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", 364.2),
    ("NVIDIA RTX A6000", "RTX A6000", 154.8),
])
def test_nvml_names_find_their_dense_bf16_peak(name: str, model: str, bf16_tflops: float) -> None:
    peak = peak_flops(name, "bf16")
    assert peak is not None and gpu_model(name) == model
    assert (peak.model, peak.precision) == (model, "bf16")
    assert peak.flops_per_s == pytest.approx(bf16_tflops * 1e12)


def test_each_precision_has_its_own_peak_and_the_words_say_which() -> None:
    tflops = {p: peak_flops("NVIDIA H200", p).flops_per_s / 1e12  # type: ignore[union-attr]
              for p in ("bf16", "fp16", "tf32", "fp32")}
    assert tflops == pytest.approx({"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9})
    assert peak_flops("NVIDIA H200", "bf16").words == "989 TFLOP/s (H200 SXM, bf16 dense)"  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU",
                                  "NVIDIA A10G", "NVIDIA Imaginary X1", ""])
def test_a_gpu_not_in_the_table_has_no_peak(name: str) -> None:
    assert peak_flops(name, "bf16") is None and gpu_model(name) is None


def test_a_precision_a_gpu_lacks_has_no_peak() -> None:
    """A V100 has no BF16 tensor cores: no bf16 peak, though the GPU is known."""
    assert gpu_model("Tesla V100-SXM2-16GB") == "V100 SXM2"
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-16GB", "fp16").flops_per_s == 125e12  # type: ignore[union-attr]


def test_an_unknown_precision_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"precision must be one of bf16, fp16, tf32, fp32, "
                                         r"got 'int8'"):
        peak_flops("NVIDIA H200", "int8")


def test_flop_rates_are_worded_in_the_unit_that_reads_best() -> None:
    assert flops_words(3.915776e6) == "3.92 MFLOP/s"
    assert flops_words(12.34e9) == "12.3 GFLOP/s"
    assert flops_words(381.8e12) == "382 TFLOP/s"
    assert flops_words(1.5e15) == "1.5 PFLOP/s"
    assert flops_words(512.0) == "512 FLOP/s"
