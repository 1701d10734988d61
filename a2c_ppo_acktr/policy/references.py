"""What the training forward's KL compares the policy with: one class per reference.

A reference gives, without gradients, the final hidden states at the response's positions
(:meth:`Reference.hidden`) and the output layer that turns them into logits (:meth:`Reference.head`);
the policy's forward then computes the KL chunk by chunk against them.

* ``start`` (:class:`StartingPolicy`, the default): the policy the run started from. After a warm
  start that is the SFT adapter, kept as a frozen copy (:class:`EMAWeights` that never move); without
  one it is the adapter-disabled model, no copy (LoRA's ``B`` starts at zero, so the adapter adds
  nothing at the start). A KL to it keeps what SFT taught (the reply format) instead of pulling the
  policy back to the model before SFT;
* ``base`` (:class:`AdapterDisabled`): the policy with its LoRA adapter disabled, no copy (needs LoRA);
* ``ema`` (:class:`MovingAverage`): the policy with the adapter's exponential moving average
  (``ppo.reference=ema``; the averaged weights are :class:`EMAWeights`, checkpointed with the run).

The perception probes are not references of the KL penalty but use the same machinery: the policy
itself with every image replaced by the processor's mean image (``masked_images``: zeros after
normalisation) or by standard normal pixels (``noised_images``); the KL to them is each token's
visual dependency (``ppo.perception_weighting``).

A new reference is one class with a ``name``, registered in :data:`REFERENCES` and named in
:data:`a2c_ppo_acktr.common.choices.REFERENCES` (the config's list; the two are checked against each other).
"""

from __future__ import annotations

import contextlib
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor, nn

from a2c_ppo_acktr.common import choices
from a2c_ppo_acktr.common.choices import check_registry


def masked_images(inputs: dict[str, Tensor], noise: bool = False, seed: int = 0) -> dict[str, Tensor]:
    """``inputs`` with every processed image tensor (keys ``pixel_values*``) replaced: zeros (after
    the processor's normalisation: the mean image) or, with ``noise``, standard normal values from a
    generator seeded with ``seed``. Token ids, masks and image grids are unchanged, so the masked
    forward is the same sequence with uninformative pixels."""
    out = dict(inputs)
    gen = torch.Generator().manual_seed(int(seed)) if noise else None
    keys = [k for k in inputs if k.startswith("pixel_values") and torch.is_tensor(inputs[k])]
    if not keys:
        raise ValueError(
            "the batch holds no image tensor (pixel_values*) to mask; perception weighting needs image observations"
        )
    for k in keys:
        v = inputs[k]
        out[k] = (
            torch.randn(v.shape, generator=gen).to(device=v.device, dtype=v.dtype) if noise else torch.zeros_like(v)
        )
    return out


def base_layer(head: nn.Module) -> nn.Module:
    """The output layer as the adapter-disabled model applies it.

    With the default LoRA targets ``lm_head`` carries no adapter and this is ``head`` itself; if a
    user's targets or ``modules_to_save`` wrap it, the reference must use the original layer, which
    is what peft's ``disable_adapter`` would run.
    """
    original = getattr(head, "original_module", None)  # peft ModulesToSaveWrapper
    if isinstance(original, nn.Module):
        return original
    get_base = getattr(head, "get_base_layer", None)  # peft tuner layers (LoRA on lm_head)
    return get_base() if callable(get_base) else head


class EMAWeights:
    """Float32 moving averages of the policy's trainable VLM weights (the adapter and any
    ``train_vision`` copies; not the heads: a reference has no value or temperature)."""

    def __init__(self, params: list[tuple[str, nn.Parameter]]) -> None:
        self.avg = {n: p.detach().float().clone() for n, p in params}

    @torch.no_grad()
    def update(self, params: list[tuple[str, nn.Parameter]], decay: float) -> None:
        """``ema <- decay * ema + (1 - decay) * weights`` (after a PPO update)."""
        for n, p in params:
            self.avg[n].mul_(decay).add_(p.detach().float(), alpha=1.0 - decay)

    def state(self) -> dict[str, Tensor]:
        """CPU copies by name (checkpointed with the run)."""
        return {n: t.detach().cpu().clone() for n, t in self.avg.items()}

    def load(self, state: dict[str, Tensor], params: list[tuple[str, nn.Parameter]]) -> None:
        """Restore :meth:`state`; the names must be the policy's trainable weights."""
        own = dict(params)
        if set(own) != set(state):
            raise ValueError(
                f"the saved EMA reference holds {len(state)} tensors for {len(own)} trainable weights here; resume "
                "with the same model and LoRA settings"
            )
        self.avg = {n: state[n].to(device=own[n].device, dtype=torch.float32).clone() for n in own}

    def as_params(self, params: list[tuple[str, nn.Parameter]]) -> dict[str, Tensor]:
        """The averages in each weight's dtype, for ``torch.func.functional_call``: the reference
        forward reads them in place of the trained weights without touching them."""
        own = dict(params)
        return {n: t.to(own[n].dtype) for n, t in self.avg.items()}


class Reference:
    """One reference of the KL (or perception probe)."""

    name: ClassVar[str] = ""
    # The pass changes the pixels themselves, so it needs them (and runs the vision tower) even when
    # the policy's forward takes the rollout's vision encodings instead.
    reads_pixels: ClassVar[bool] = False

    def forward(self, policy: Any, kwargs: dict[str, Any], noise_seed: int) -> tuple[Any, Any, dict[str, Any]]:
        """``(forward, context, kwargs)``: how the no-grad reference pass calls the model."""
        raise NotImplementedError

    def head(self, policy: Any, head: nn.Module) -> Any:
        """The output layer as this reference applies it."""
        return head

    def hidden(self, policy: Any, inputs: dict[str, Tensor], R: int, noise_seed: int = 0) -> Tensor:
        """``(B, R, H)`` final hidden states of the reference (no grad) at the R generated positions."""
        forward, context, kwargs = self.forward(
            policy, {**inputs, "use_cache": False, "logits_to_keep": R + 1}, noise_seed
        )
        with torch.no_grad(), context, policy._catch_lm_head_input(skip_logits=True) as caught:
            forward(**kwargs)
        # A copy: the slice would keep the reference's whole (B, T, H) final hidden states alive.
        return caught[0][:, :R].clone()


class AdapterDisabled(Reference):
    name = "base"

    def forward(self, policy: Any, kwargs: dict[str, Any], noise_seed: int) -> tuple[Any, Any, dict[str, Any]]:
        if not policy.has_reference:
            raise ValueError(
                "KL to the reference needs LoRA (model.use_lora=true): the reference is the adapter-disabled model"
            )
        return policy.model, policy.model.disable_adapter(), kwargs

    def head(self, policy: Any, head: nn.Module) -> Any:
        return base_layer(head)


class MovingAverage(Reference):
    name = "ema"

    def forward(self, policy: Any, kwargs: dict[str, Any], noise_seed: int) -> tuple[Any, Any, dict[str, Any]]:
        params = _ema_params(policy)
        return (
            (lambda **kw: torch.func.functional_call(policy.model, params, (), kw, strict=False)),
            contextlib.nullcontext(),
            kwargs,
        )

    def head(self, policy: Any, head: nn.Module) -> Any:
        """``head`` itself when it has no trained weights (the default targets), else a no-grad
        function of ``head`` with its averaged weights (a LoRA'd ``lm_head``, as in cpu-demo)."""
        prefix = next((name for name, m in policy.model.named_modules() if m is head), None)
        if prefix is None or not any(p.requires_grad for p in head.parameters()):
            return head
        params = {n[len(prefix) + 1 :]: t for n, t in _ema_params(policy).items() if n.startswith(prefix + ".")}

        def apply(x: Tensor) -> Tensor:
            with torch.no_grad():
                return torch.func.functional_call(head, params, (x,), strict=False)

        apply.out_features = getattr(head, "out_features", None)  # type: ignore[attr-defined]
        return apply


class ImageProbe(Reference):
    """The policy itself on uninformative images (a perception probe, not a KL reference)."""

    reads_pixels = True

    def __init__(self, name: str, noise: bool) -> None:
        self.name, self.noise = name, noise  # type: ignore[misc]

    def forward(self, policy: Any, kwargs: dict[str, Any], noise_seed: int) -> tuple[Any, Any, dict[str, Any]]:
        return policy.model, contextlib.nullcontext(), masked_images(kwargs, noise=self.noise, seed=noise_seed)


class StartingPolicy(Reference):
    """The weights the run started from: the frozen copy :meth:`VLMPolicy.init_ema_reference` made
    of a warm start's adapter, or, with no copy (no warm start), the adapter-disabled model, which is
    the same function."""

    name = "start"

    def _same_as(self, policy: Any) -> Reference:
        return REFERENCES["ema"] if policy.has_ema_reference else REFERENCES["base"]

    def forward(self, policy: Any, kwargs: dict[str, Any], noise_seed: int) -> tuple[Any, Any, dict[str, Any]]:
        return self._same_as(policy).forward(policy, kwargs, noise_seed)

    def head(self, policy: Any, head: nn.Module) -> Any:
        return self._same_as(policy).head(policy, head)


def _ema_params(policy: Any) -> dict[str, Tensor]:
    ema: Optional[EMAWeights] = policy._ema
    if ema is None:
        raise RuntimeError("the EMA reference was not initialised (ppo.reference=ema: call init_ema_reference)")
    return ema.as_params(policy.averaged_parameters())


REFERENCES: dict[str, Reference] = {"start": StartingPolicy(), "base": AdapterDisabled(), "ema": MovingAverage()}
check_registry("ppo.reference", REFERENCES, choices.REFERENCES)
PERCEPTION_PROBES: dict[str, Reference] = {
    "masked_images": ImageProbe("masked_images", noise=False),
    "noised_images": ImageProbe("noised_images", noise=True),
}


def reference_named(name: str) -> Reference:
    """The reference (or perception probe) called ``name``.

    Raises:
        ValueError: For an unknown name (the message lists the known ones).
    """
    found = REFERENCES.get(name) or PERCEPTION_PROBES.get(name)
    if found is None:
        raise ValueError(f"reference={name!r} is not one of {list(REFERENCES) + list(PERCEPTION_PROBES)}")
    return found
