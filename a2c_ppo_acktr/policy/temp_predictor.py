"""The temperature head: a small MLP from the last prompt token's hidden state to a sampling temperature.

Output ``T = min_T + (max_T - min_T) * sigmoid(mlp(h))`` stays inside ``[min_T, max_T]`` by
construction. The last layer starts at zero with its bias at ``logit((T0 - min_T) / (max_T - min_T))``,
so at initialisation every state gets exactly the configured temperature ``T0`` and learning starts
from the plain fixed-temperature policy. The temperature enters the action log-prob (logits / T), so
the policy gradient trains it.
"""

from __future__ import annotations

import contextlib
import math
import types
from typing import Iterator

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
    return nn.functional.linear(x.float(), float32_weight(self), bias)


# The attribute a Linear keeps its float32 weight copy under while a float32_weight_cache is open.
_CACHE = "_vsi_float32_weight"


def float32_weight(layer: nn.Linear) -> Tensor:
    """``layer.weight`` in float32: the weight itself when it is float32, else a cast.

    Inside :func:`float32_weight_cache`, a no-grad call reuses the cast it made before while the
    weight is the same storage at the same version (an in-place update bumps the version), so a
    decode loop casts a bf16 ``lm_head`` once per ``generate`` instead of once per token. The values
    are the same either way: the cast is exact.
    """
    w = layer.weight
    if w.dtype == torch.float32:
        return w
    cache = layer.__dict__.get(_CACHE)
    if cache is None or torch.is_grad_enabled():
        return w.float()
    key = (w.data_ptr(), w._version, w.device, tuple(w.shape))
    if cache.get("key") != key:
        cache["key"], cache["weight"] = key, w.detach().float()
    return cache["weight"]


@contextlib.contextmanager
def float32_weight_cache(module: nn.Module) -> Iterator[None]:
    """Keep each float32-computing Linear's cast weight (:func:`compute_in_float32`) under ``module``
    between its no-grad calls until the block ends, then free it.

    Meant around ``generate``: the float32 ``lm_head`` then costs one ``V x H`` cast per call instead
    of one per decoded token. The copy's memory is what each token's temporary took before (one
    ``V x H`` float32 array), held for the whole call instead of within each step.
    """
    layers = [
        m
        for m in module.modules()
        if isinstance(m, nn.Linear) and getattr(m.forward, "__func__", None) is _float32_linear_forward
    ]
    for layer in layers:
        layer.__dict__[_CACHE] = {}
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop(_CACHE, None)


class TempPredictor(nn.Module):
    """Per-state sampling temperature in ``[min_temperature, max_temperature]``.

    Args:
        hidden_size: size of the input hidden state (the model's text hidden size).
        head_hidden: width of the MLP's hidden layer.
        init_temperature: the temperature output for every input at initialisation.
        min_temperature, max_temperature: output range (``min < init < max`` strictly).
    """

    def __init__(
        self,
        hidden_size: int,
        head_hidden: int,
        init_temperature: float,
        min_temperature: float,
        max_temperature: float,
    ) -> None:
        super().__init__()
        if not min_temperature < init_temperature < max_temperature:
            raise ValueError(
                f"the temperature predictor needs min_temperature < temperature < max_temperature strictly, got "
                f"{min_temperature} < {init_temperature} < {max_temperature}; widen "
                "model.min_temperature/model.max_temperature "
                "or set model.use_temp_predictor=false for a fixed temperature"
            )
        self.min_temperature = float(min_temperature)
        self.max_temperature = float(max_temperature)
        self.mlp = compute_in_float32(
            nn.Sequential(nn.Linear(hidden_size, head_hidden), nn.Tanh(), nn.Linear(head_hidden, 1))
        )
        frac = (init_temperature - min_temperature) / (max_temperature - min_temperature)
        last = self.mlp[-1]
        nn.init.zeros_(last.weight)
        nn.init.constant_(last.bias, math.log(frac / (1.0 - frac)))

    def forward(self, hidden: Tensor) -> Tensor:
        """``(B, H)`` hidden states (any dtype) -> ``(B,)`` float32 temperatures."""
        x = self.mlp(hidden.float()).squeeze(-1)
        return self.min_temperature + (self.max_temperature - self.min_temperature) * torch.sigmoid(x)
