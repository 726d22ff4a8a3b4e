"""What each checkpoint backend can execute, with the reason for every entry.

The planner asks :func:`format_refusal` before any memory arithmetic: a
checkpoint whose format the device's backend cannot execute is refused while
planning, not after the engine's start-up and a stack trace.
Entries are data (one row per backend × format), not branches per vendor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.core.profile import Device


@dataclass(frozen=True)
class FormatRule:
    backend: str
    weight_format: str
    supported: bool
    reason: str
    min_cc: float | None = None
    """Lowest NVIDIA compute capability that has the kernel (inclusive)."""
    max_cc: float | None = None
    """Compute capability from which the kernel is missing (exclusive)."""


FORMAT_RULES: tuple[FormatRule, ...] = (
    # vLLM, CUDA
    FormatRule("vllm-cuda", "bf16", True, "bf16 GEMMs need Ampere or newer", min_cc=8.0),
    FormatRule("vllm-cuda", "fp16", True, "fp16 GEMMs run on every supported GPU"),
    FormatRule("vllm-cuda", "fp32", True, "fp32 runs everywhere (slowly)"),
    FormatRule(
        "vllm-cuda",
        "fp8",
        True,
        "fp8 weights use fp8 tensor cores (Ada, cc 8.9) or the Marlin fallback from Ampere",
        min_cc=8.0,
    ),
    FormatRule(
        "vllm-cuda",
        "int8",
        True,
        "w8a8 int8 goes through cutlass scaled_mm, which has int8 kernels up to Hopper (cc 9.0); "
        "the c3x kernels for cc >= 10.0 (Blackwell) have no int8 scaled_mm, so the first forward raises",
        min_cc=7.5,
        max_cc=10.0,
    ),
    FormatRule(
        "vllm-cuda",
        "awq-4bit",
        True,
        "AWQ runs through the Marlin/AWQ kernels from Turing (cc 7.5)",
        min_cc=7.5,
    ),
    FormatRule(
        "vllm-cuda",
        "gptq-4bit",
        True,
        "GPTQ runs through the Marlin/exllama kernels from Turing (cc 7.5)",
        min_cc=7.5,
    ),
    FormatRule(
        "vllm-cuda",
        "gptq-8bit",
        True,
        "GPTQ 8-bit runs through Marlin from Turing (cc 7.5)",
        min_cc=7.5,
    ),
    FormatRule(
        "vllm-cuda", "bnb-4bit", True, "bitsandbytes 4-bit is supported on CUDA", min_cc=7.0
    ),
    FormatRule("vllm-cuda", "gguf", True, "vLLM loads GGUF checkpoints (experimental)", min_cc=6.0),
    # vLLM, CPU
    FormatRule(
        "vllm-cpu",
        "bf16",
        True,
        "bf16 runs on the CPU backend (native with AVX512-BF16/AMX, emulated on AVX2)",
    ),
    FormatRule("vllm-cpu", "fp32", True, "fp32 runs on the CPU backend"),
    FormatRule(
        "vllm-cpu",
        "fp16",
        True,
        "fp16 checkpoints are run by the CPU backend (computed in a wider type)",
    ),
    FormatRule(
        "vllm-cpu", "int8", True, "w8a8 int8 runs through oneDNN int8 GEMMs on the CPU backend"
    ),
    FormatRule(
        "vllm-cpu",
        "awq-4bit",
        True,
        "AWQ 4-bit runs on the CPU backend through its dequantizing kernels",
    ),
    FormatRule(
        "vllm-cpu",
        "gptq-4bit",
        True,
        "GPTQ 4-bit runs on the CPU backend through its dequantizing kernels",
    ),
    FormatRule(
        "vllm-cpu",
        "fp8",
        False,
        "the CPU backend has no fp8 weight GEMMs (fp8 is accepted for the KV cache only)",
    ),
    FormatRule("vllm-cpu", "bnb-4bit", False, "bitsandbytes quantization is CUDA-only in vLLM"),
    FormatRule("vllm-cpu", "bnb-8bit", False, "bitsandbytes quantization is CUDA-only in vLLM"),
    FormatRule(
        "vllm-cpu",
        "gguf",
        False,
        "GGUF loading is not supported by the CPU backend; materialize the GGUF as safetensors",
    ),
    # llama.cpp (llama-cpp-python): GGUF files as they are, every quant type the file holds; nothing else
    *(
        FormatRule(
            b, "gguf", True, "llama.cpp loads the GGUF as it is (every ggml quant type it holds)"
        )
        for b in ("llamacpp-cpu", "llamacpp-vulkan")
    ),
    *(
        FormatRule(b, f, False, "llama.cpp loads GGUF files only")
        for b in ("llamacpp-cpu", "llamacpp-vulkan")
        for f in (
            "bf16",
            "fp16",
            "fp32",
            "int8",
            "fp8",
            "awq-4bit",
            "gptq-4bit",
            "gptq-8bit",
            "bnb-4bit",
            "bnb-8bit",
        )
    ),
    # transformers' own modules (stages.ar_decode.hf_runner): unquantized weights only; the
    # quantized formats need kernels (autoawq, gptq, bitsandbytes, fp8) omni-edge does not install
    *(
        FormatRule(b, f, True, f"{f} runs through torch's own kernels")
        for b in ("transformers-cpu", "transformers-cuda")
        for f in ("fp32", "bf16", "fp16")
    ),
    *(
        FormatRule(
            b,
            f,
            False,
            "the transformers backend here runs unquantized weights (fp32, bf16, fp16) only: "
            f"{f} needs quantization kernels omni-edge does not install",
        )
        for b in ("transformers-cpu", "transformers-cuda")
        for f in (
            "int8",
            "fp8",
            "awq-4bit",
            "gptq-4bit",
            "gptq-8bit",
            "bnb-4bit",
            "bnb-8bit",
            "gguf",
        )
    ),
)

ARCHITECTURE_RULES: tuple[tuple[frozenset[str], str], ...] = (
    (
        frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"}),
        "vLLM rejects Qwen2/Qwen3 models whose layers mix sliding-window and full attention "
        "('Sliding window for some but all layers is not supported')",
    ),
)


def _cc(device: Device) -> float | None:
    return float(device.compute_capability) if device.compute_capability else None


def format_refusal(backend: str, device: Device, weight_format: str) -> str | None:
    """None when ``backend`` on ``device`` executes ``weight_format``, else the reason."""
    rules = [r for r in FORMAT_RULES if r.backend == backend and r.weight_format == weight_format]
    if not rules:
        known = sorted(
            {r.weight_format for r in FORMAT_RULES if r.backend == backend and r.supported}
        )
        return f"{backend} has no kernel path for {weight_format} weights (it executes {', '.join(known)})"
    rule = rules[0]
    if not rule.supported:
        return rule.reason
    cc = _cc(device)
    if cc is not None and rule.min_cc is not None and cc < rule.min_cc:
        return f"{rule.reason}; {device.id} has compute capability {device.compute_capability}"
    if cc is not None and rule.max_cc is not None and cc >= rule.max_cc:
        return f"{rule.reason}; {device.id} ({device.name}) has compute capability {device.compute_capability}"
    return None


def supported_formats(backend: str, device: Device) -> list[str]:
    return sorted(
        r.weight_format
        for r in FORMAT_RULES
        if r.backend == backend and format_refusal(backend, device, r.weight_format) is None
    )


def architecture_refusal(text_config: dict[str, Any], layer_kinds: list[str]) -> str | None:
    """None when vLLM accepts this layer layout, else why not (any device)."""
    model_type = str(text_config.get("model_type", ""))
    mixed = "sliding_attention" in layer_kinds and "full_attention" in layer_kinds
    for types, reason in ARCHITECTURE_RULES:
        if model_type in types and mixed:
            return reason
    return None
