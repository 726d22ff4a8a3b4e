"""Small PyTorch modules for the exporter's tests (factories in the ``omni-edge export`` contract)."""

from __future__ import annotations

from typing import Any


def mlp() -> dict[str, Any]:
    """A two-layer MLP over 16 features, batch dynamic, with eight calibration batches."""
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    gen = torch.Generator().manual_seed(1)
    example = {"x": torch.randn(2, 16, generator=gen)}
    return {
        "module": module,
        "inputs": example,
        "outputs": ["y"],
        "dynamic_axes": {"x": {0: "batch"}, "y": {0: "batch"}},
        "calibration": [{"x": torch.randn(4, 16, generator=gen)} for _ in range(8)],
    }


def nan_module() -> tuple[Any, dict[str, Any]]:
    """A module whose output is NaN wherever its input is negative (log of a negative number)."""
    import torch

    class Log(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.log(x)

    return Log(), {"x": torch.tensor([[1.0, -1.0, 2.0]])}


def not_a_module() -> dict[str, Any]:
    return {"module": "nope", "inputs": {}}


def outlier() -> dict[str, Any]:
    """A linear layer fed one huge channel it ignores: 8-bit activations sized for the outlier round
    every other channel to zero, so int8 loses everything (the shape of a transformer's outliers)."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8, bias=False)
    with torch.no_grad():
        layer.weight[:, 0] = 0.0
    gen = torch.Generator().manual_seed(1)

    def feeds() -> dict[str, Any]:
        x = torch.randn(4, 16, generator=gen)
        x[:, 0] = 1e4
        return {"x": x}

    return {"module": layer, "inputs": feeds(), "calibration": [feeds() for _ in range(4)]}
