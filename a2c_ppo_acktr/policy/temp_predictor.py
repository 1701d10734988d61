"""The temperature head: a small MLP from the last prompt token's hidden state to a sampling temperature.

Output ``T = min_T + (max_T - min_T) * sigmoid(mlp(h))`` stays inside ``[min_T, max_T]`` by
construction. The last layer starts at zero with its bias at ``logit((T0 - min_T) / (max_T - min_T))``,
so at initialisation every state gets exactly the configured temperature ``T0`` and learning starts
from the plain fixed-temperature policy. The temperature enters the action log-prob (logits / T), so
the policy gradient trains it.
"""
from __future__ import annotations

import math
import types

import torch
from torch import Tensor, nn


def compute_in_float32(module: nn.Module) -> nn.Module:
    """Make every ``nn.Linear`` in ``module`` compute in float32 whatever its parameters' dtype: under
    DeepSpeed bf16 the engine casts every parameter, the heads' included (its optimizer keeps float32
    masters), and a value or a temperature computed in bf16 carries 2-3 significant digits.

    Each Linear's ``forward`` is replaced (its weight and input cast to float32 at every call), not its
    call, so module hooks still run around it: ZeRO-3 gathers a partitioned weight before ``forward``
    and for its backward. Gradients reach the parameters in their own dtype through the casts.
    Returns ``module``.
    """
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            # A bound method, not a closure: a deep copy of the module then computes with its own weights.
            layer.forward = types.MethodType(_float32_linear_forward, layer)
    return module


def _float32_linear_forward(self: nn.Linear, x: Tensor) -> Tensor:
    bias = None if self.bias is None else self.bias.float()
    return nn.functional.linear(x.float(), self.weight.float(), bias)


class TempPredictor(nn.Module):
    """Per-state sampling temperature in ``[min_temperature, max_temperature]``.

    Args:
        hidden_size: size of the input hidden state (the model's text hidden size).
        head_hidden: width of the MLP's hidden layer.
        init_temperature: the temperature output for every input at initialisation.
        min_temperature, max_temperature: output range (``min < init < max`` strictly).
    """

    def __init__(self, hidden_size: int, head_hidden: int, init_temperature: float, min_temperature: float, max_temperature: float) -> None:
        super().__init__()
        if not min_temperature < init_temperature < max_temperature:
            raise ValueError(
                f"the temperature predictor needs min_temperature < temperature < max_temperature strictly, got "
                f"{min_temperature} < {init_temperature} < {max_temperature}; widen model.min_temperature/model.max_temperature "
                "or set model.use_temp_predictor=false for a fixed temperature"
            )
        self.min_temperature = float(min_temperature)
        self.max_temperature = float(max_temperature)
        self.mlp = compute_in_float32(nn.Sequential(nn.Linear(hidden_size, head_hidden), nn.Tanh(), nn.Linear(head_hidden, 1)))
        frac = (init_temperature - min_temperature) / (max_temperature - min_temperature)
        last = self.mlp[-1]
        nn.init.zeros_(last.weight)
        nn.init.constant_(last.bias, math.log(frac / (1.0 - frac)))

    def forward(self, hidden: Tensor) -> Tensor:
        """``(B, H)`` hidden states (any dtype) -> ``(B,)`` float32 temperatures."""
        x = self.mlp(hidden.float()).squeeze(-1)
        return self.min_temperature + (self.max_temperature - self.min_temperature) * torch.sigmoid(x)
