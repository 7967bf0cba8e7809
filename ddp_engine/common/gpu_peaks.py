"""Peak dense FLOP/s of GPUs by model and precision, what model FLOPs utilization (MFU) is
measured against (standard library only: the app imports this).

MFU = the model's FLOPs per step / step time / the GPU's peak. The peak is the vendor's
figure for the math the step's matrix multiplies run in:

- ``bf16``, ``fp16``: tensor cores with FP32 accumulate (what PyTorch's autocast uses; the
  GeForce cards' FP16-accumulate figures are twice these and do not apply);
- ``tf32``: fp32 training with TF32 matmuls allowed (``torch.set_float32_matmul_precision``
  "high" or "medium");
- ``fp32``: plain FP32 on the CUDA cores (PyTorch's default, "highest").

Always the dense figure: the datasheets' headline numbers (marked "with sparsity") assume 2:4
structured sparsity, which training does not use, and are twice these.

Sources, the vendor's own documents (TFLOP/s dense; H100/H200 SXM, for instance: FP32 67,
TF32 494.7 (989 sparse), BF16/FP16 989.4 (1,979 sparse)):

- NVIDIA H100 Tensor Core GPU datasheet (SXM, PCIe, NVL columns) and the Hopper
  architecture whitepaper's table of H100 SXM5 peaks.
- NVIDIA H200 Tensor Core GPU datasheet (H200 SXM, H200 NVL columns).
- NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe share the peaks).
- NVIDIA Ada GPU architecture whitepaper, appendix tables: GeForce RTX 4090 (BF16/FP16 with
  FP32 accumulate 165.2, TF32 82.6, FP32 82.6) and RTX 6000 Ada Generation (364.2, 182.1,
  91.1).
- NVIDIA L40S, L40 and L4 datasheets; NVIDIA A10 datasheet.
- NVIDIA Ampere GA102 whitepaper: GeForce RTX 3090 (71, 35.6, 35.6) and RTX A6000 (154.8,
  77.4, 38.7).
- NVIDIA V100 and T4 datasheets (no BF16 tensor cores: no bf16 peak).

A GPU that is not in the table has no peak: the dashboard then says "peak unknown for <its
NVML name>" rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32")
"""The math a step's matrix multiplies run in, as the ``flops`` event names it."""

_T = 1e12


@dataclass(frozen=True)
class Peak:
    """One GPU model's peak for one precision."""

    model: str
    """The table's name for it, "H100 SXM"."""
    precision: str
    flops_per_s: float
    """Dense FLOP/s."""

    @property
    def words(self) -> str:
        """"989 TFLOP/s (H100 SXM, bf16 dense)"."""
        return f"{self.flops_per_s / _T:,.0f} TFLOP/s ({self.model}, {self.precision} dense)"


# (pattern on NVML's name, the model, {precision: dense TFLOP/s}); the first match counts, so
# a variant comes before the name it extends (H100 NVL before H100).
_TABLE: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"\bH100\b.*\bNVL\b", "H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5,
                                        "fp32": 60.0}),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0,
                                          "fp32": 51.0}),
    (r"\bH100\b", "H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5,
                                        "fp32": 60.0}),
    (r"\bH200\b", "H200 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"\bA100\b", "A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"\bL40S\b", "L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    (r"\bL40\b", "L40", {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5}),
    (r"\bL4\b", "L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bA10\b", "A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"\bRTX 6000 Ada\b", "RTX 6000 Ada", {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1,
                                           "fp32": 91.1}),
    (r"\bRTX A6000$", "RTX A6000", {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4,
                                    "fp32": 38.7}),
    (r"\bRTX 4090$", "RTX 4090", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"\bRTX 3090$", "RTX 3090", {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6}),
    (r"\bV100-SXM", "V100 SXM2", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bV100-PCIE", "V100 PCIe", {"fp16": 112.0, "fp32": 14.0}),
    (r"\bT4$", "T4", {"fp16": 65.0, "fp32": 8.1}),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), model, peaks) for p, model, peaks in _TABLE)


def gpu_model(name: str) -> str | None:
    """The table's model for a GPU's NVML name ("NVIDIA H100 80GB HBM3" -> "H100 SXM"),
    None when the table does not know it."""
    for pattern, model, _peaks in _COMPILED:
        if pattern.search(name.strip()):
            return model
    return None


def peak_flops(name: str, precision: str) -> Peak | None:
    """The dense peak of the GPU NVML calls ``name`` in ``precision`` (one of PRECISIONS);
    None for a GPU the table does not know, or a precision it has no peak for (bf16 on a
    V100). A precision outside PRECISIONS is a bug of the caller: ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    for pattern, model, peaks in _COMPILED:
        if pattern.search(name.strip()):
            tflops = peaks.get(precision)
            return None if tflops is None else Peak(model, precision, tflops * _T)
    return None


def flops_words(flops_per_s: float) -> str:
    """FLOP/s in the unit that reads best: "12.3 GFLOP/s", "412 TFLOP/s"."""
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"),
                        (1e6, "MFLOP/s")):
        if flops_per_s >= scale:
            value = flops_per_s / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{flops_per_s:.3g} FLOP/s"
