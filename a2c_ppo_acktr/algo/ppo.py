"""The PPO update (Schulman et al. 2017) for a VLM policy, as CleanRL writes it, with LLM-RL extras.

Losses are pure functions returning ``(loss, metrics)``. :meth:`PPO.update` runs ``ppo_epochs`` x
minibatches of a :class:`~a2c_ppo_acktr.algo.storage.RolloutStorage`: re-forward prompt+action through the
policy's ``forward`` (= ``evaluate_actions``; going through ``forward`` keeps DDP/DeepSpeed wrappers'
hooks working), clipped surrogate, optionally clipped value loss, entropy bonus, KL penalty to the
reference (adapter disabled, or the adapter's moving average with ``ppo.reference=ema``), gradient clipping, and an
optimizer step every ``grad_accum_steps``
minibatches.

Guards: a minibatch whose loss is not finite on any process is skipped on every process (one
reduced flag, so collectives stay matched) and counted; it does no backward. Optimizer steps are
taken by :class:`~a2c_ppo_acktr.algo.accumulation.AccumulationWindow`, once per window of
``grad_accum_steps`` minibatches on every backend (plain, accelerate/DDP, DeepSpeed), and not at all
for a window whose every minibatch was skipped (weights and optimizer state untouched).
``optim/steps`` counts the steps actually taken, over the whole run.

No forward whose result nothing reads: the reference forward (adapter disabled) runs on
every minibatch when the KL is in the loss (``kl_coef > 0``; the adaptive controller needs
``kl_coef > 0`` too), and otherwise only on the first minibatch of every ``kl_ref_interval``-th
update, for the ``losses/kl_ref`` monitor (NaN on the other updates). The decision depends only on
the update count and ``kl_coef``, which every process holds alike, so all ranks run the same forwards
(under ZeRO-3 a forward is a collective).

Host syncs: metrics are summed on the device and read once at the end of the update. What stays is
what must be decided on the host before going on: whether a minibatch's loss is finite on every
process (one read per minibatch, before its backward), whether a window's gradient norm is finite
(one per optimizer window, before its step), and, with ``target_kl``, the epoch's mean KL (one per
epoch).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from a2c_ppo_acktr.algo.accumulation import AccumulationWindow
from a2c_ppo_acktr.algo.kl import KLControl
from a2c_ppo_acktr.algo.surrogate import aggregate, policy_loss, tis_weights
from a2c_ppo_acktr.algo.tally import UpdateTally
from a2c_ppo_acktr.config.arguments import PPOConfig
from a2c_ppo_acktr.algo.storage import BOOTSTRAPPING_ESTIMATORS, Minibatch, RolloutStorage


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip_coef: float, clip_vloss: bool
) -> tuple[Tensor, dict[str, Tensor]]:
    """Half squared error to the returns, optionally clipped around the rollout values (CleanRL).

    All inputs ``(B,)``. Returns ``(loss, {"value_clipfrac"})``.
    """
    unclipped = (values - returns) ** 2
    if clip_vloss:
        clipped_values = old_values + (values - old_values).clamp(-clip_coef, clip_coef)
        loss = 0.5 * torch.max(unclipped, (clipped_values - returns) ** 2).mean()
    else:
        loss = 0.5 * unclipped.mean()
    with torch.no_grad():
        frac = (
            ((values - old_values).abs() > clip_coef).float().mean()
            if clip_vloss
            else torch.zeros((), device=values.device)
        )
    return loss, {"value_clipfrac": frac}


def temperature_loss(temperatures: Tensor, entropy: Tensor, target_entropy: float) -> Tensor:
    """The temperature head's own objective (``ppo.temperature_loss=entropy_target``), SAC-style
    (Haarnoja et al. 2018, automatic entropy tuning): ``mean(log T * (H - target))`` with the entropy
    ``H`` detached. Its gradient in ``log T`` is ``H - target``: rows above the target entropy lower
    their temperature, rows below raise it; nothing in it rewards a collapse to the minimum.

    Args:
        temperatures: ``(B,)`` the head's temperatures (with gradient into the head only).
        entropy: ``(B,)`` mean per-token entropy of each response at its temperature.
        target_entropy: nats per token.
    """
    return (temperatures.log() * (entropy.detach() - target_entropy)).mean()


def ppo_loss(
    out: Any, mb: Minibatch, cfg: PPOConfig, kl_coef: float, max_tokens: int = 1
) -> tuple[Tensor, dict[str, Tensor]]:
    """Total loss ``pg + vf_coef * v - ent_coef * H + kl_coef * KL (+ temp_coef * temperature loss)``
    and its parts.

    ``pg`` is :func:`~a2c_ppo_acktr.algo.surrogate.policy_loss` at ``ppo.ratio_level`` against the
    minibatch's per-token old log-probs (``ppo.loss_agg``, ``clip_low``/``clip_high``,
    ``clip_ratio_c``; TIS weights with ``ppo.tis_cap``; replies cut by ``max_new_tokens`` left out with
    ``ppo.mask_truncated_replies``). At the token level the entropy and the KL are aggregated over
    tokens the same way; the sequence levels average each reply's mean per-token entropy and KL.

    The value term is left out (``v`` still logged) for an estimator that reads no value
    (``rloo``, ``grpo``: not in :data:`~a2c_ppo_acktr.algo.storage.BOOTSTRAPPING_ESTIMATORS`). The value
    head sits on the policy's hidden states, so its regression onto episode returns would move the
    shared LoRA weights for nothing, and an update whose advantages are all 0 could still change the
    policy.

    ``H`` is the per-token entropy (``ppo.entropy_bonus=token``) or the response's entropy
    (``sequence``: ``out.seq_entropy``). The KL is in the loss only with ``ppo.kl_penalty=loss``.

    Args:
        out: the policy's :class:`~a2c_ppo_acktr.policy.model.EvalOutput` for ``mb`` (per-token
            ``token_log_probs``, ``token_mask``, ``token_entropy``, ``token_kl``; per-turn ``values``,
            ``entropy``, ``kl``, ``seq_entropy``, ``temperatures``).
        mb: the minibatch (old per-token log-probs, token weights, advantages, returns, old values).
        cfg: :class:`PPOConfig`.
        kl_coef: the KL coefficient now.
        max_tokens: ``model.max_new_tokens`` (Dr. GRPO's constant of ``seq-mean-token-sum-norm``).
    """
    dev = out.token_log_probs.device
    mask = out.token_mask
    width = mask.shape[1]
    if mb.old_token_log_probs is None:
        raise ValueError(
            "the minibatch holds no per-token old log-probs: fill them (ppo.old_log_probs=update) or store act's"
        )
    old = mb.padded("old_token_log_probs", width).to(dev)
    weights = mb.padded("token_weights", width).to(dev)
    pg_mask = mask
    if cfg.mask_truncated_replies and mb.reply_cut is not None:
        pg_mask = mask & ~mb.reply_cut.to(dev)[:, None]
    sample_weights = (
        tis_weights(mb.old_log_probs.to(dev), mb.engine_log_probs, cfg.tis_cap) if cfg.tis_cap else None
    )  # 0: off
    low, high = cfg.clip_range
    pg, pg_m = policy_loss(
        out.token_log_probs,
        old,
        mb.advantages.to(dev),
        pg_mask,
        weights,
        level=cfg.ratio_level,
        loss_agg=cfg.loss_agg or "token-mean",
        clip_low=low,
        clip_high=high,
        clip_ratio_c=cfg.clip_ratio_c,
        max_tokens=max_tokens,
        sample_weights=sample_weights,
    )
    if sample_weights is not None:
        pg_m = {
            **pg_m,
            "tis_weight": sample_weights.mean(),
            "tis_capped_frac": (sample_weights >= cfg.tis_cap).float().mean(),
        }
    v, v_m = value_loss(out.values, mb.old_values.to(dev), mb.returns.to(dev), cfg.clip_coef, cfg.clip_vloss)
    per_token = cfg.ratio_level == "token"
    ent = aggregate(out.token_entropy, mask, cfg.loss_agg, max_tokens) if per_token else out.entropy.mean()
    bonus = ent
    if cfg.entropy_bonus == "sequence":
        seq = getattr(out, "seq_entropy", None)
        if seq is None:
            raise ValueError("ppo.entropy_bonus=sequence needs the policy's seq_entropy (EvalOutput.seq_entropy)")
        bonus = seq.mean()
    vf_coef = cfg.vf_coef if cfg.advantage_estimator in BOOTSTRAPPING_ESTIMATORS else 0.0
    loss = pg + vf_coef * v - cfg.ent_coef * bonus
    kl_mean = None
    if out.kl is not None:
        kl_mean = aggregate(out.token_kl, mask, cfg.loss_agg, max_tokens) if per_token else out.kl.mean()
    if kl_coef > 0 and cfg.kl_penalty == "loss":
        if kl_mean is None:
            raise ValueError(
                "kl_coef > 0 but the policy returned no KL; evaluate_actions must be called with with_kl=True"
            )
        loss = loss + kl_coef * kl_mean
    metrics = {"policy_loss": pg.detach(), "value_loss": v.detach(), "entropy": ent.detach(), **pg_m, **v_m}
    if cfg.entropy_bonus == "sequence":
        metrics["seq_entropy"] = bonus.detach()
    if cfg.temperature_loss == "entropy_target":
        t_loss = temperature_loss(out.temperatures, out.entropy, cfg.target_entropy)
        loss = loss + cfg.temp_coef * t_loss
        metrics["temperature_loss"] = t_loss.detach()
    if kl_mean is not None:
        metrics["kl_ref"] = kl_mean.detach()
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)``; NaN when the returns have no variance."""
    var_y = returns.float().var(unbiased=False)
    if var_y == 0:
        return float("nan")
    return float(1.0 - (returns.float() - values.float()).var(unbiased=False) / var_y)


@torch.no_grad()
def forward_in_storage_order(
    policy: Any, storage: RolloutStorage, mini_batch_size: int, options: Callable[[int], dict[str, Any]]
) -> Iterator[tuple[Minibatch, Any]]:
    """``(minibatch, policy(minibatch, with_kl=True, **options(k)))`` for the k-th chunk of the stored
    turns in storage order: the no-grad passes over a finished rollout (the KL reward penalty, the
    perception pass), in eval mode (restored after). Every process runs as many forwards (same
    storage size), which ZeRO-3 needs."""
    was_training = policy.training
    policy.eval()
    try:
        for k, mb in enumerate(storage.ordered_minibatches(mini_batch_size)):
            yield mb, policy(mb, with_kl=True, **options(k))
    finally:
        policy.train(was_training)


class PPO:
    """PPO over a :class:`RolloutStorage` of VLM turns.

    Args:
        policy: the policy module (a :class:`~a2c_ppo_acktr.policy.model.VLMPolicy`, possibly wrapped by
            ``accelerator.prepare``); called as ``policy(minibatch, with_kl=bool)`` -> ``EvalOutput``.
        optimizer: optimizer over the trainable parameters (prepared by the accelerator if one is used).
        cfg: :class:`PPOConfig`.
        accelerator: an ``accelerate.Accelerator`` or None (plain ``loss.backward()``). When given,
            its ``gradient_accumulation_steps`` must be ``cfg.grad_accum_steps`` (accelerate scales
            the loss by it and DeepSpeed steps at that boundary).
        seed: seeds the minibatch shuffles (add the process rank for multi-process runs).
        kl_ref_interval: with ``kl_coef == 0``, measure ``losses/kl_ref`` (one reference forward, on
            the first minibatch) on every ``kl_ref_interval``-th update, the first included
            (``log.kl_ref_interval``); 1 measures it on every update.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: PPOConfig,
        accelerator: Any = None,
        seed: int = 0,
        kl_ref_interval: int = 1,
    ) -> None:
        self.policy, self.optimizer, self.cfg, self.accelerator = policy, optimizer, cfg, accelerator
        self.kl = KLControl(cfg, kl_ref_interval)
        if accelerator is not None and accelerator.gradient_accumulation_steps != cfg.grad_accum_steps:
            raise ValueError(
                f"Accelerator(gradient_accumulation_steps={accelerator.gradient_accumulation_steps}) differs from "
                f"ppo.grad_accum_steps={cfg.grad_accum_steps}; create the Accelerator with "
                "gradient_accumulation_steps=cfg.ppo.grad_accum_steps"
            )
        self.generator = torch.Generator().manual_seed(int(seed))
        self.num_updates = 0
        self.optimizer_steps = 0  # optimizer steps actually taken, over the whole run (optim/steps)
        self.window = AccumulationWindow(
            policy, optimizer, cfg.grad_accum_steps, cfg.max_grad_norm, accelerator, deepspeed=self._deepspeed
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Controller state to checkpoint (the optimizer is checkpointed by the caller)."""
        return {
            "kl_coef": self.kl_coef,
            "generator": self.generator.get_state(),
            "num_updates": self.num_updates,
            "optimizer_steps": self.optimizer_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_coef = float(state["kl_coef"])
        self.generator.set_state(state["generator"])
        self.num_updates = int(state["num_updates"])
        self.optimizer_steps = int(state.get("optimizer_steps", 0))

    # ------------------------------------------------------------------ helpers
    @property
    def kl_coef(self) -> float:
        """The KL coefficient now (it adapts with ``ppo.kl_adaptive``)."""
        return self.kl.coef

    @kl_coef.setter
    def kl_coef(self, value: float) -> None:
        self.kl.coef = float(value)

    @property
    def kl_in_loss(self) -> bool:
        return self.kl.in_loss

    @property
    def _deepspeed(self) -> bool:
        return self.accelerator is not None and str(self.accelerator.distributed_type).upper().endswith("DEEPSPEED")

    @property
    def _has_reference(self) -> bool:
        return bool(getattr(self._module, "has_reference", False))

    def _all_finite(self, loss: Tensor) -> bool:
        flag = torch.isfinite(loss.detach()).all().float().reshape(1)
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            flag = self.accelerator.gather(flag.to(self.accelerator.device)).min()
        return bool(flag.item() > 0)

    def _forward_options(self) -> dict[str, Any]:
        """Keyword options of the policy's forward, only where they differ from its defaults (so a
        policy without them still works with the default config)."""
        options: dict[str, Any] = self.kl.forward_options()
        if self.cfg.temperature_loss == "entropy_target":
            options["detach_temperature"] = True
        if self.cfg.reference != "start":
            options["reference"] = self.cfg.reference
        return options

    @property
    def _module(self) -> Any:
        return self.accelerator.unwrap_model(self.policy) if self.accelerator is not None else self.policy

    def _mean_across(self, x: float) -> float:
        if self.accelerator is None or self.accelerator.num_processes == 1:
            return x
        t = torch.tensor([x], dtype=torch.float32, device=self.accelerator.device)
        return float(self.accelerator.reduce(t, reduction="mean").item())

    # ------------------------------------------------------------------ KL as a reward penalty
    def reward_kl(self, storage: RolloutStorage) -> Tensor:
        """``(T, N)`` KL of every stored response to the reference (``ppo.kl_estimator`` per token,
        summed over the response), for ``ppo.kl_penalty=reward``: one no-grad pass over the rollout
        in storage order, minibatch by minibatch (every process runs as many: under ZeRO-3 a forward
        is a collective). Call after the rollout and before the advantages."""
        kl = torch.zeros(storage.num_steps * storage.num_envs)
        options = {k: v for k, v in self._forward_options().items() if k in ("kl_estimator", "reference")}
        for mb, out in forward_in_storage_order(self.policy, storage, self.cfg.mini_batch_size, lambda _k: options):
            kl[mb.indices] = out.kl_sum.detach().float().cpu()
        return kl.view(storage.num_steps, storage.num_envs)

    # ------------------------------------------------------------------ update
    def update(self, storage: RolloutStorage) -> dict[str, float]:
        """Run the PPO epochs over ``storage`` (after ``compute_returns``). Returns logged metrics."""
        cfg = self.cfg
        total = storage.num_steps * storage.num_envs
        if total % cfg.mini_batch_size != 0:
            raise ValueError(f"ppo.mini_batch_size={cfg.mini_batch_size} must divide num_steps*num_envs={total}")
        num_mb = total // cfg.mini_batch_size
        if num_mb % cfg.grad_accum_steps != 0:
            raise ValueError(
                f"{num_mb} minibatches per epoch is not a multiple of ppo.grad_accum_steps={cfg.grad_accum_steps}; "
                "pick mini_batch_size and grad_accum_steps so that (num_envs*num_steps/mini_batch_size) % "
                "grad_accum_steps == 0"
            )
        self.policy.train()
        self.optimizer.zero_grad()
        options = self._forward_options()
        tally = UpdateTally()
        has_reference = self._has_reference
        max_tokens = int(getattr(getattr(self._module, "cfg", None), "max_new_tokens", 1))
        first_order = storage.shuffled_order(self.generator)
        old_seconds = self.recompute_old_policy(storage, first_order) if cfg.old_log_probs == "update" else 0.0
        for epoch in range(cfg.ppo_epochs):
            epoch_kl: Optional[Tensor] = None
            epoch_counted = 0
            order = first_order if epoch == 0 else storage.shuffled_order(self.generator)
            for k, mb in enumerate(
                storage.minibatches(
                    cfg.mini_batch_size, adv_norm=cfg.adv_norm, std_floor=cfg.adv_std_floor, order=order
                )
            ):
                with_kl = self.kl.with_reference(epoch == 0 and k == 0, self.num_updates, has_reference)
                out = self.policy(mb, with_kl=with_kl, **options)
                loss, m = ppo_loss(out, mb, cfg, self.kl_coef, max_tokens)
                if epoch == 0 and k == 0:
                    tally.first_dev = m["ratio_max_dev"]
                if self._all_finite(loss):  # the one host read per minibatch: skipping is decided before backward
                    self.window.backward(loss)
                    tally.add(m)
                    epoch_kl = m["approx_kl"] if epoch_kl is None else epoch_kl + m["approx_kl"]
                    epoch_counted += 1
                else:
                    tally.skipped += 1
                    self.window.skip()
                del out, loss  # free the graph before the next forward
                ended = self.window.end_minibatch()
                if ended is not None:
                    tally.end_window(*ended)
                    self.optimizer_steps += int(ended[0])
            if (
                cfg.target_kl is not None
                and epoch_counted
                and self._mean_across(float(epoch_kl) / epoch_counted) > cfg.target_kl
            ):
                break
        mean, kl_ref, first = tally.read()  # the one read of the metrics
        if tally.kl_ref_count and self.kl.adapts:
            self.kl.adapt(self._mean_across(kl_ref))
        if cfg.reference == "ema" and cfg.ema_decay < 1.0:  # the reference trails the weights this update ended with
            self._module.update_ema_reference(cfg.ema_decay)
        self.num_updates += 1
        metrics = update_metrics(mean, kl_ref, first, tally, storage, self.kl_coef, self.optimizer_steps)
        metrics["time/old_log_probs"] = old_seconds
        return metrics

    @torch.no_grad()
    def recompute_old_policy(self, storage: RolloutStorage, order: Tensor) -> float:
        """``ppo.old_log_probs=update``: score every stored turn with the policy as it is now, before
        any step, in the minibatches the first epoch will use (``order``, same rows, same padding,
        same mode), and store the per-token log-probs, their weighted sums and the values as the
        update's old ones (verl recomputes ``old_log_prob`` the same way). The first epoch's
        forward of a minibatch then repeats this one bit for bit until the first optimizer step, so
        its ratio is exactly 1 in any dtype and at any depth. Costs one no-grad forward per
        minibatch (every process the same number: under ZeRO-3 a forward is a collective). Returns
        the seconds it took."""
        start = time.perf_counter()
        for mb in storage.minibatches(self.cfg.mini_batch_size, order=order):
            out = self.policy(mb, with_kl=False)
            storage.set_old_policy(mb.indices, out.token_log_probs, out.token_mask, out.log_probs, out.values)
        return time.perf_counter() - start


def update_metrics(
    mean: dict[str, float],
    kl_ref: float,
    first: float,
    tally: UpdateTally,
    storage: RolloutStorage,
    kl_coef: float,
    optimizer_steps: int,
) -> dict[str, float]:
    """The logged metrics of one update (``losses/*``, ``adv/*``, ``optim/*``, the ratio check)."""
    nan = float("nan")
    loss_keys = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "value_clipfrac")
    out = {f"losses/{k}": mean.get(k, nan) for k in loss_keys}
    out.update(
        {
            "losses/explained_variance": explained_variance(storage.values.flatten(), storage.returns.flatten()),
            "losses/grad_norm": tally.mean_grad_norm(),
            "losses/skipped_minibatches": float(tally.skipped),
            "losses/kl_ref": kl_ref,
            "losses/kl_coef": kl_coef,
        }
    )
    out.update(
        {
            f"losses/{k}": mean.get(k, nan)
            for k in ("seq_entropy", "temperature_loss", "tis_weight", "tis_capped_frac", "dual_clipfrac")
        }
    )
    out.update(
        {
            "adv/compared_fraction": float(storage.adv_mask.float().mean()) if storage.adv_mask is not None else nan,
            "adv/raw_std": float(storage.advantages.float().std(unbiased=False)),
            "debug/first_minibatch_ratio_max_dev": first,
            "optim/steps": float(optimizer_steps),
            # windows without a step: every minibatch skipped, or a non-finite gradient norm
            "optim/skipped_windows": float(tally.windows - tally.window_steps),
        }
    )
    return out
