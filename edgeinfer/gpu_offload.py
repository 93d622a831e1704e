"""What layer offload (``n_gpu_layers``) put on the Vulkan device, and why.

The native engine fits the offload to the device's free memory before it allocates anything
(simd/gpu_vulkan/offload.h): it measures what each layer's weights and KV cache, the output
and the compute buffers would take, as the device's memory requirements give them, and keeps
the plan. ``n_gpu_layers="auto"`` takes as many of the last layers as fit in the free memory
less a margin; an explicit number that does not fit is refused with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = -1  # n_gpu_layers as the native engine takes "auto" (EI_GPU_AUTO)

# where the free memory came from, by EI_GPU_BUDGET_*
BUDGET_SOURCES = (
    "none",
    "VK_EXT_memory_budget",
    "the heap's size: no VK_EXT_memory_budget, other programs' use unknown",
    "EDGEINFER_VULKAN_BUDGET",
)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


@dataclass(frozen=True)
class OffloadPlan:
    """The layers on the device (``n_gpu_layers`` as llama.cpp counts them: the output and the
    last ``n_gpu_layers - 1`` layers), the device, the free memory the plan was fitted to, and
    the bytes of each part; ``reason`` says why fewer than every layer went (auto), or why
    none did."""

    n_gpu_layers: int
    n_layer: int
    device: int | None  # the Vulkan device's index; None: no device used
    device_name: str
    budget_source: str
    free_bytes: int
    margin_bytes: int  # what auto left free (0 for an explicit number)
    weights_bytes: int  # the device layers' and the output's weights
    cache_bytes: int  # the device layers' KV cache, for the whole context
    buffer_bytes: int  # activations, attention scratch, logits, staging
    held_bytes: int  # the device memory its buffers hold now
    reason: str = ""

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.cache_bytes + self.buffer_bytes

    @property
    def gpu_layers(self) -> range:
        """The layer indices on the device."""
        first = self.n_layer + 1 - self.n_gpu_layers if self.n_gpu_layers else self.n_layer
        return range(first, self.n_layer)

    def describe(self) -> str:
        """The plan in a few lines, as the CLI prints it."""
        if not self.n_gpu_layers:
            return f"GPU offload: none ({self.reason or 'n_gpu_layers 0'})"
        layers = self.gpu_layers
        span = f"{layers.start}" if len(layers) == 1 else f"{layers.start}-{layers.stop - 1}"
        what = (
            f"layer{'s' if len(layers) > 1 else ''} {span} of {self.n_layer} and the output"
            if len(layers)
            else "the output only"
        )
        lines = [
            f"GPU offload: {what} (n_gpu_layers {self.n_gpu_layers}) on {self.device_name} "
            f"(Vulkan device {self.device})",
            f"  weights {_mib(self.weights_bytes)}, KV cache {_mib(self.cache_bytes)}, "
            f"buffers {_mib(self.buffer_bytes)}: {_mib(self.total_bytes)} of "
            f"{_mib(self.free_bytes)} free ({self.budget_source})"
            + (f", {_mib(self.margin_bytes)} kept as a margin" if self.margin_bytes else ""),
        ]
        if self.reason:
            lines.append(f"  {self.reason}")
        return "\n".join(lines)
