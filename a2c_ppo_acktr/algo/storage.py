"""Rollout storage and advantage estimators.

:class:`RolloutStorage` keeps ``num_steps x num_envs`` turns: what the update must re-forward (the
rendered prompt, the raw images, the prompt and generated token ids, the token weights, and the
processor output ``act`` forwarded, :class:`~a2c_ppo_acktr.policy.encoding.TurnEncoding`) and the numbers (old
log-prob, value, reward, terminated, truncated, the value after a truncated step). The update
forwards the kept processor output, so each observation's images are processed once.

Memory of the kept pixels: on the CPU, in the model's dtype, one copy per distinct image of the
rollout (:class:`~a2c_ppo_acktr.policy.encoding.ImageFeatureStore`: the sweep frames an episode shows on
every turn are stored once). Qwen2.5-VL turns ``H x W`` pixels into ``H*W/196`` patches of 1176
values: a 448x448 frame is 1024 patches (256 visual tokens), 2.4 MB in bf16. The 3B preset's
rollout (4 envs x 64 steps, 8 sweep frames + 2 views per turn) holds at most 256 x 10 frames =
6.2 GB per process if no frame repeated; with 10-turn episodes the sweep repeats, and about
26 episodes x 8 sweep frames + 256 new views = 464 distinct frames = 1.1 GB. Cleared by
:meth:`RolloutStorage.after_update`.

Advantage estimators are pure functions of ``(T, N)`` tensors registered by name in
:data:`ADVANTAGE_ESTIMATORS`:

* ``gae``: generalized advantage estimation over turns (Schulman et al. 2016). Bootstraps with
  ``V(s_{t+1})`` unless the step terminated; for a truncated step ``next_values[t]`` is the value of
  its final observation. The recursion never crosses an episode end (terminated or truncated).
  The only estimator that reads values of states after a step (:data:`BOOTSTRAPPING_ESTIMATORS`):
  the others need no value forward beyond the ones ``act`` makes anyway.
* ``rloo``: REINFORCE leave-one-out (Ahmadian et al. 2024). Each episode's return (sum of its turn
  rewards) minus the mean return of the OTHER complete episodes of the same group (same question).
* ``grpo``: group-relative (Shao et al. 2024): ``(R - mean_group) / max(std_group, std_floor)`` over
  the complete episodes of a group (unbiased std, as verl; ``ppo.adv_std_floor``, so that a group
  whose returns differ by float noise is not blown up to unit advantages).

Normalisation before the update (:func:`normalize_advantages`, ``ppo.adv_norm``): ``batch`` or
``group`` mean/std, divided by ``max(std, std_floor)``, over the turns that have an advantage at all
(``RolloutStorage.adv_mask``: every turn for ``gae``; for ``rloo``/``grpo`` the turns of complete
episodes compared with at least one other); the other turns keep advantage 0.

For multi-turn episodes, ``rloo`` and ``grpo`` broadcast the episode's advantage to every turn of that
episode, and ``returns`` are the episode return on every turn. Only complete episodes (start and end
both inside the rollout) are compared; turns of an incomplete episode, and of an episode alone in its
group (no baseline exists), get advantage 0 and so no policy gradient. Training passes
``horizon=env.max_turns``: an episode then counts only if it began at least ``horizon`` steps before
the rollout's end, so whether it is compared never depends on how it went. Without that, an episode
that began late completes only when it is short, so with rollouts shorter than an episode only quick
wins would ever be compared and the turns of failing and malformed episodes would get no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from a2c_ppo_acktr.common import choices
from a2c_ppo_acktr.common.choices import check_registry
from a2c_ppo_acktr.policy.encoding import ImageFeatureStore, TurnEncoding


# ---------------------------------------------------------------------------------------------
# Estimators (pure tensor functions)
# ---------------------------------------------------------------------------------------------
def compute_gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over turns.

    Args:
        rewards: ``(T, N)`` reward of step t.
        values: ``(T, N)`` ``V(s_t)``.
        next_values: ``(T, N)`` ``V(s_{t+1})``; for a truncated step the value of its final
            observation; ignored where ``terminated``.
        terminated: ``(T, N)`` bool, the episode ended in a terminal state at step t (no bootstrap).
        truncated: ``(T, N)`` bool, the episode was cut at step t (bootstrap from ``next_values``).
        gamma: discount.
        gae_lambda: GAE lambda.

    Returns:
        ``(advantages, returns)``, both ``(T, N)`` float32, ``returns = advantages + values``.
    """
    _check_same_shape(
        rewards=rewards, values=values, next_values=next_values, terminated=terminated, truncated=truncated
    )
    rewards, values, next_values = rewards.float(), values.float(), next_values.float()
    term = terminated.bool()
    ended = term | truncated.bool()
    # Where terminated, next_values is never read: torch.where keeps a NaN placeholder from leaking.
    bootstrap = torch.where(term, torch.zeros_like(next_values), next_values)
    deltas = rewards + gamma * bootstrap - values
    carry_on = (~ended).float()
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gamma * gae_lambda * carry_on[t] * last
        advantages[t] = last
    return advantages, advantages + values


def episode_ids(
    ended: Tensor, starts_episode: Optional[Tensor] = None, horizon: Optional[int] = None
) -> tuple[Tensor, Tensor]:
    """Number the episode segments of a ``(T, N)`` rollout.

    Args:
        ended: ``(T, N)`` bool, the episode ended at step t (terminated or truncated).
        starts_episode: ``(N,)`` bool, whether step 0 of each env is an episode's first turn
            (default: all true, a rollout right after reset).
        horizon: the most turns an episode can last (``env.max_turns``). Given, an episode counts
            as complete only if it began with at least ``horizon`` steps left in the rollout: it
            was then bound to end inside the rollout whatever the policy did. Without it, an episode
            that began late is complete only when it was short, so the complete episodes
            over-represent short ones (quick wins; not the long, failing or malformed ones) and an
            estimator that compares only complete episodes is biased: see :func:`compared_episodes`.

    Returns:
        ``(ids, complete)``: ``ids`` ``(T, N)`` long, the same id on every turn of one episode and
        distinct across episodes; ``complete`` ``(E,)`` bool per id, true when the episode's first
        and last turns are both in the rollout (and, with ``horizon``, its first turn at step
        ``<= T - horizon``).
    """
    T, N = ended.shape
    if starts_episode is None:
        starts_episode = torch.ones(N, dtype=torch.bool)
    last_start = T if horizon is None else T - horizon  # the latest first step that counts
    ids = torch.empty(T, N, dtype=torch.long)
    complete: list[bool] = []
    for n in range(N):
        begun = bool(starts_episode[n])
        first_step = 0
        current = len(complete)
        complete.append(False)
        for t in range(T):
            ids[t, n] = current
            if bool(ended[t, n]):
                complete[current] = begun and first_step <= last_start
                begun = True
                first_step = t + 1
                if t + 1 < T:
                    current = len(complete)
                    complete.append(False)
    return ids, torch.tensor(complete, dtype=torch.bool)


def _episode_returns(rewards: Tensor, ids: Tensor, num_episodes: int) -> Tensor:
    return torch.zeros(num_episodes, dtype=torch.float32).index_add_(0, ids.flatten(), rewards.float().flatten())


def _episode_groups(group_ids: Tensor, ids: Tensor, num_episodes: int) -> Tensor:
    """The group of each episode; all turns of one episode must share it."""
    groups = torch.full((num_episodes,), -1, dtype=torch.long)
    groups[ids.flatten()] = group_ids.long().flatten()
    if not torch.equal(groups[ids], group_ids.long()):
        raise ValueError("group_ids must be constant within an episode (one question per episode)")
    return groups


def rloo_advantages(returns: Tensor, groups: Tensor, valid: Tensor) -> Tensor:
    """Leave-one-out advantages ``R_e - mean_{j != e, same group} R_j``. All ``(E,)``; invalid -> 0."""
    adv = torch.zeros_like(returns)
    for g in torch.unique(groups[valid]):
        members = valid & (groups == g)
        k = int(members.sum())
        if k < 2:
            continue  # no other episode to form a baseline: advantage stays 0
        r = returns[members]
        adv[members] = r - (r.sum() - r) / (k - 1)
    return adv


def grpo_advantages(
    returns: Tensor, groups: Tensor, valid: Tensor, eps: float = 1e-6, std_floor: float = 0.0
) -> Tensor:
    """Group-normalised advantages ``(R_e - mean_g) / (std_g + eps)``, or ``/ max(std_g, std_floor)``
    when ``std_floor > 0``. All ``(E,)``; invalid -> 0."""
    adv = torch.zeros_like(returns)
    for g in torch.unique(groups[valid]):
        members = valid & (groups == g)
        if int(members.sum()) < 2:
            continue
        r = returns[members]
        adv[members] = (r - r.mean()) / (r.std().clamp_min(std_floor) if std_floor > 0 else r.std() + eps)
    return adv


def compared_episodes(groups: Tensor, complete: Tensor) -> Tensor:
    """``(E,)`` bool: complete episodes whose group holds at least one other complete episode (the
    only ones rloo/grpo give an advantage)."""
    keys = groups[complete]
    out = torch.zeros_like(complete)
    if keys.numel():
        uniq, counts = torch.unique(keys, return_counts=True)
        shared = uniq[counts >= 2]
        out = complete & torch.isin(groups, shared)
    return out


def _episode_estimator(per_episode: Callable[..., Tensor], takes_std_floor: bool = False):
    """An estimator over whole episodes from ``per_episode(returns, groups, complete)`` (``(E,)`` each),
    given ``std_floor=`` too when ``takes_std_floor``."""

    def estimator(
        *,
        rewards: Tensor,
        terminated: Tensor,
        truncated: Tensor,
        group_ids: Optional[Tensor],
        starts_episode: Optional[Tensor] = None,
        std_floor: float = 0.0,
        horizon: Optional[int] = None,
        **_: Any,
    ) -> tuple[Tensor, Tensor]:
        if group_ids is None:
            raise ValueError(
                "this advantage estimator compares episodes of the same question: pass group_ids "
                "(T, N) to RolloutStorage.insert (e.g. the question's index), or use advantage_estimator='gae'"
            )
        ids, complete = episode_ids(terminated.bool() | truncated.bool(), starts_episode, horizon)
        num = complete.shape[0]
        ep_returns = _episode_returns(rewards, ids, num)
        groups = _episode_groups(group_ids, ids, num)
        extra = {"std_floor": std_floor} if takes_std_floor else {}
        ep_adv = per_episode(ep_returns, groups, complete, **extra)
        return ep_adv[ids], ep_returns[ids]

    estimator.__doc__ = per_episode.__doc__
    return estimator


def _gae_estimator(
    *,
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    gae_lambda: float,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    return compute_gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda)


# name -> fn(*, rewards, values, next_values, terminated, truncated, group_ids, starts_episode,
#            gamma, gae_lambda, std_floor, horizon) -> (advantages (T, N), returns (T, N))
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "gae": _gae_estimator,
    "rloo": _episode_estimator(rloo_advantages),
    "grpo": _episode_estimator(grpo_advantages, takes_std_floor=True),
}
check_registry("ppo.advantage_estimator", ADVANTAGE_ESTIMATORS, choices.ADVANTAGE_ESTIMATORS)


# Estimators that read ``next_values`` (the value of a truncated step's final observation and the
# bootstrap V(s_T)); for the others the rollout computes neither (no forward whose result nothing reads).
BOOTSTRAPPING_ESTIMATORS = frozenset({"gae"})


def advantage_mask(
    estimator: str,
    terminated: Tensor,
    truncated: Tensor,
    group_ids: Optional[Tensor],
    starts_episode: Optional[Tensor] = None,
    horizon: Optional[int] = None,
) -> Tensor:
    """``(T, N)`` bool: turns that get an advantage from ``estimator`` (all of them for gae; for
    rloo/grpo the turns of :func:`compared_episodes`, complete as :func:`episode_ids` with ``horizon`` says)."""
    if estimator in BOOTSTRAPPING_ESTIMATORS or group_ids is None:
        return torch.ones(terminated.shape, dtype=torch.bool)
    ids, complete = episode_ids(terminated.bool() | truncated.bool(), starts_episode, horizon)
    groups = _episode_groups(group_ids, ids, complete.shape[0])
    return compared_episodes(groups, complete)[ids]


def normalize_advantages(
    advantages: Tensor,
    mode: str,
    std_floor: float = 0.0,
    group_ids: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
) -> Tensor:
    """``(a - mean) / max(std, std_floor)`` over the batch or within each group, on the ``mask``ed
    entries (the others become 0). All inputs share one shape; returns that shape.

    Args:
        mode: ``batch``, ``group`` (needs ``group_ids``) or ``none`` (returned unchanged, masked).
        std_floor: the smallest divisor (population std); 0 divides by ``std + 1e-8``.
    """
    mask = torch.ones_like(advantages, dtype=torch.bool) if mask is None else mask.bool()
    adv = advantages.float()
    out = torch.zeros_like(adv)
    if mode == "none":
        return torch.where(mask, adv, out)
    if mode == "batch":
        keys = torch.zeros_like(adv, dtype=torch.long)
    elif mode == "group":
        if group_ids is None:
            raise ValueError("adv_norm='group' needs the rollout's group ids (rollout.group_size >= 2)")
        keys = group_ids.long()
    else:
        raise ValueError(f"unknown advantage normalisation {mode!r}; use batch, group or none")
    for key in torch.unique(keys[mask]):
        members = mask & (keys == key)
        a = adv[members]
        std = a.std(unbiased=False)
        scale = std.clamp_min(std_floor) if std_floor > 0 else std + 1e-8
        out[members] = (a - a.mean()) / scale
    return out


def informative_turns(advantages: Tensor, adv_mask: Tensor, group_ids: Optional[Tensor]) -> Tensor:
    """``(T, N)`` bool: the compared turns of groups whose episodes do not all score alike (DAPO's
    dynamic sampling keeps only those: a group of equal returns has every advantage 0 under rloo and
    grpo, and teaches nothing). A group counts when any of its compared turns has a non-zero
    advantage; all of its compared turns are kept then, zero-advantage ones included."""
    if group_ids is None:
        return adv_mask.clone()
    moving = adv_mask & (advantages != 0)
    keys = group_ids[moving].unique()
    return adv_mask & torch.isin(group_ids, keys)


def get_advantage_estimator(name: str) -> Callable[..., tuple[Tensor, Tensor]]:
    """The estimator registered as ``name``; an unknown name raises listing the known ones."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise KeyError(f"unknown advantage estimator {name!r}; known estimators: {sorted(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name]


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"all inputs must share one (T, N) shape, got {shapes}")


# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------
@dataclass
class Minibatch:
    """Turns for one PPO step. Lists have one entry per turn; tensors are ``(B,)``."""

    prompts: list[str]  # rendered chat-template text (image placeholders unexpanded)
    images: list[list[np.ndarray]]  # raw uint8 HxWx3 images of each prompt
    prompt_ids: list[Tensor]  # (P_i,) prompt token ids as the processor made them in the rollout
    generated_ids: list[Tensor]  # (R_i,) generated ids, padding removed
    token_weights: list[Tensor]  # (R_i,) thought_prob_coef on thought tokens, 1 elsewhere
    old_log_probs: Tensor  # (B,) weighted sums of the old per-token log-probs
    old_values: Tensor  # (B,) the value clip's centre
    advantages: Tensor
    returns: Tensor
    indices: Tensor  # flat index t * num_envs + n of each turn in the storage
    # The processor output each turn was acted on (forwarded as is); None re-processes the images.
    encodings: Optional[list[TurnEncoding]] = None
    # (B,) the rollout engine's log-probs of the replies (NaN where none; None: no engine column).
    engine_log_probs: Optional[Tensor] = None
    # (R_i,) old per-token log-probs of each reply (unweighted); None when the rollout kept none.
    old_token_log_probs: Optional[list[Tensor]] = None
    # (B,) bool: the reply was cut by model.max_new_tokens (no end-of-sequence token); None: unknown.
    reply_cut: Optional[Tensor] = None

    def __len__(self) -> int:
        return len(self.prompts)

    def padded(self, name: str, width: int) -> Tensor:
        """``(B, width)`` float32 of the per-reply list ``name`` (``old_token_log_probs``,
        ``token_weights``), each row right-padded with 0."""
        rows = getattr(self, name)
        out = torch.zeros(len(rows), width, dtype=torch.float32)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row.float()
        return out


class RolloutStorage:
    """``num_steps x num_envs`` turns of one PPO iteration.

    Lifecycle: :meth:`insert` once per step (final values now, or deferred and given to
    :meth:`set_final_values` after the last step), :meth:`compute_returns` with the bootstrap value,
    :meth:`minibatches` during the update, :meth:`after_update` before the next rollout.
    """

    def __init__(self, num_steps: int, num_envs: int) -> None:
        if num_steps < 1 or num_envs < 1:
            raise ValueError(f"num_steps={num_steps} and num_envs={num_envs} must both be >= 1")
        self.num_steps, self.num_envs = num_steps, num_envs
        shape = (num_steps, num_envs)
        self.old_log_probs = torch.zeros(shape)
        self.values = torch.zeros(shape)
        # The value clip's centre: the rollout's values, or the update's recompute (set_old_policy).
        self.old_values = torch.zeros(shape)
        self.reply_cut = torch.zeros(shape, dtype=torch.bool)
        self.rewards = torch.zeros(shape)
        self.terminated = torch.zeros(shape, dtype=torch.bool)
        self.truncated = torch.zeros(shape, dtype=torch.bool)
        self.next_values = torch.zeros(shape)  # V(s_{t+1}); final-observation value where truncated
        self.final_pending = torch.zeros(shape, dtype=torch.bool)  # truncated steps whose final value is deferred
        self.temperatures = torch.zeros(shape)
        # The rollout engine's own weighted log-probs of each reply (NaN: the policy sampled itself, or
        # the engine returned none): what ppo.tis_cap and the off-policy monitor compare with old_log_probs.
        self.engine_log_probs = torch.full(shape, float("nan"))
        self.group_ids: Optional[Tensor] = None
        self.advantages: Optional[Tensor] = None
        self.returns: Optional[Tensor] = None
        self.adv_mask: Optional[Tensor] = None  # (T, N) turns that have an advantage (advantage_mask)
        # Whether step 0 of each env starts an episode (true after reset; carried by after_update).
        self.starts_episode = torch.ones(num_envs, dtype=torch.bool)
        n = num_steps * num_envs
        self.prompts: list[Optional[str]] = [None] * n
        self.images: list[Optional[list[np.ndarray]]] = [None] * n
        self.prompt_ids: list[Optional[Tensor]] = [None] * n
        self.generated_ids: list[Optional[Tensor]] = [None] * n
        self.token_weights: list[Optional[Tensor]] = [None] * n
        self.old_token_log_probs: list[Optional[Tensor]] = [None] * n
        self.encodings: list[Optional[TurnEncoding]] = [None] * n
        self.image_store = ImageFeatureStore()
        self.step = 0

    @property
    def full(self) -> bool:
        return self.step == self.num_steps

    def insert(
        self,
        act: Any,
        rewards: Sequence[float] | Tensor,
        terminated: Sequence[bool] | Tensor,
        truncated: Sequence[bool] | Tensor,
        final_values: Optional[Tensor] = None,
        group_ids: Optional[Sequence[int] | Tensor] = None,
        defer_final_values: bool = False,
    ) -> None:
        """Store one step of all envs.

        Args:
            act: the :class:`a2c_ppo_acktr.policy.model.ActOutput` that chose these actions.
            rewards, terminated, truncated: ``(N,)`` results of ``env.step``.
            final_values: ``(N,)`` value of each env's final observation; read where ``truncated``
                (required if any env truncated, since the bootstrap needs it, unless deferred).
            group_ids: ``(N,)`` question/group key of each env's episode (rloo/grpo).
            defer_final_values: the truncated envs' final values come later, all steps' at once,
                through :meth:`set_final_values` (one batched forward per rollout), or never when
                the estimator does not read them.
        """
        if self.full:
            raise RuntimeError(f"storage is full ({self.num_steps} steps); call after_update() before inserting again")
        t, N = self.step, self.num_envs
        if len(act.texts) != N:
            raise ValueError(f"act holds {len(act.texts)} rows, storage has num_envs={N}")
        trunc = torch.as_tensor(truncated, dtype=torch.bool).reshape(N)
        term = torch.as_tensor(terminated, dtype=torch.bool).reshape(N)
        if bool((trunc & term).any()):
            raise ValueError("a step cannot be both terminated and truncated; the env must report one of them")
        if bool(trunc.any()):
            if final_values is not None:
                self.next_values[t] = torch.where(
                    trunc, final_values.detach().float().cpu().reshape(N), self.next_values[t]
                )
            elif defer_final_values:
                self.final_pending[t] = trunc
            else:
                raise ValueError("some envs truncated: pass final_values (value of their final observation) to insert")
        self.rewards[t] = torch.as_tensor(rewards, dtype=torch.float32).reshape(N)
        self.terminated[t], self.truncated[t] = term, trunc
        self.old_log_probs[t] = act.log_probs.detach().float().cpu()
        self.values[t] = act.values.detach().float().cpu()
        self.old_values[t] = self.values[t]
        cut = getattr(act, "reply_cut", None)
        self.reply_cut[t] = False if cut is None else torch.as_tensor(cut, dtype=torch.bool).reshape(N)
        self.temperatures[t] = act.temperatures.detach().float().cpu()
        engine_lp = getattr(act, "engine_log_probs", None)
        self.engine_log_probs[t] = float("nan") if engine_lp is None else engine_lp.detach().float().cpu().reshape(N)
        if group_ids is not None:
            if self.group_ids is None:
                self.group_ids = torch.full((self.num_steps, N), -1, dtype=torch.long)
            self.group_ids[t] = torch.as_tensor(group_ids, dtype=torch.long).reshape(N)
        encodings = getattr(act, "encodings", None)
        token_lps = getattr(act, "token_log_probs", None)
        for n in range(N):
            i = t * N + n
            self.prompts[i] = act.prompts[n]
            self.images[i] = list(act.images[n])
            self.prompt_ids[i] = act.prompt_ids[n].detach().cpu()
            self.generated_ids[i] = act.generated_ids[n].detach().cpu()
            self.token_weights[i] = act.token_weights[n].detach().float().cpu()
            self.old_token_log_probs[i] = None if token_lps is None else token_lps[n].detach().float().cpu()
            if encodings is not None:
                self.encodings[i] = self.image_store.share(encodings[n], self.images[i])
        self.step += 1

    def set_final_values(self, steps: Sequence[int], envs: Sequence[int], values: Tensor) -> None:
        """Give the deferred final values: ``values[k]`` is V(final observation) of env ``envs[k]``
        truncated at step ``steps[k]``.

        Raises:
            ValueError: a (step, env) pair was not deferred by :meth:`insert`, or lengths differ.
        """
        values = values.detach().float().cpu().reshape(-1)
        if not len(steps) == len(envs) == values.shape[0]:
            raise ValueError(f"{len(steps)} steps, {len(envs)} envs and {values.shape[0]} values must be as many")
        for t, n, v in zip(steps, envs, values.tolist()):
            if not bool(self.final_pending[t, n]):
                raise ValueError(f"step {t} env {n} is not a truncated step whose final value was deferred")
            self.next_values[t, n] = v
            self.final_pending[t, n] = False

    def set_old_policy(
        self, indices: Tensor, token_log_probs: Tensor, mask: Tensor, log_probs: Tensor, values: Tensor
    ) -> None:
        """Replace the old policy's numbers of the turns at flat ``indices`` (``(B,)``) with a
        recompute's (``ppo.old_log_probs=update``): per-token log-probs ``(B, R)`` on ``mask``, their
        weighted sums ``(B,)`` and the values ``(B,)`` (the value clip's centre; the advantages keep
        the rollout's values)."""
        lps = token_log_probs.detach().float().cpu()
        keep = mask.detach().cpu()
        for row, i in enumerate(indices.tolist()):
            self.old_token_log_probs[i] = lps[row][keep[row]].clone()
        self.old_log_probs.view(-1)[indices] = log_probs.detach().float().cpu()
        self.old_values.view(-1)[indices] = values.detach().float().cpu()

    @property
    def needs_bootstrap(self) -> Tensor:
        """``(N,)`` bool: envs whose episode goes on after the last stored step (only those need V(s_T))."""
        if self.step == 0:
            return torch.ones(self.num_envs, dtype=torch.bool)
        last = self.step - 1
        return ~(self.terminated[last] | self.truncated[last])

    def compute_returns(
        self,
        next_value: Optional[Tensor],
        estimator: str = "gae",
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        std_floor: float = 0.0,
        horizon: Optional[int] = None,
    ) -> None:
        """Fill ``advantages`` and ``returns`` ``(T, N)``.

        Args:
            next_value: ``(N,)`` ``V(s_T)`` of the observation after the last step (bootstrap); read
                only where :attr:`needs_bootstrap` and only by :data:`BOOTSTRAPPING_ESTIMATORS`
                (other entries may hold anything, NaN included). None when nothing reads it.
            estimator: a name in :data:`ADVANTAGE_ESTIMATORS`.
            gamma, gae_lambda: discount and GAE lambda (PPOConfig).
            std_floor: grpo's smallest group std (``ppo.adv_std_floor``).
            horizon: rloo/grpo: the most turns an episode lasts (``env.max_turns``); only episodes
                that began at least that many steps before the rollout's end are compared
                (:func:`episode_ids`). None compares every complete episode (biased toward short ones).

        Raises:
            ValueError: a bootstrapping estimator lacks a value it reads (deferred final values
                never given, or ``next_value`` None while an episode goes on).
        """
        if not self.full:
            raise RuntimeError(
                f"storage holds {self.step}/{self.num_steps} steps; insert every step before compute_returns"
            )
        fn = get_advantage_estimator(estimator)
        if estimator in BOOTSTRAPPING_ESTIMATORS:
            if bool(self.final_pending.any()):
                raise ValueError(
                    f"advantage estimator {estimator!r} reads the final values of truncated steps, but "
                    f"{int(self.final_pending.sum())} were deferred and never given; call set_final_values before "
                    "compute_returns"
                )
            if next_value is None and bool(self.needs_bootstrap.any()):
                raise ValueError(
                    f"advantage estimator {estimator!r} needs next_value (N,): V(s_T) of the envs still mid-episode"
                )
        if next_value is None:
            next_value = torch.zeros(self.num_envs)
        nv = self.next_values.clone()
        # V(s_{t+1}) of a step that was not truncated is the value of the next stored step (after a
        # terminated step that is the next episode's first value; compute_gae never reads it there).
        nv[:-1] = torch.where(self.truncated[:-1], nv[:-1], self.values[1:])
        nv[-1] = torch.where(self.truncated[-1], nv[-1], next_value.detach().float().cpu().reshape(self.num_envs))
        self.next_values = nv
        self.advantages, self.returns = fn(
            rewards=self.rewards,
            values=self.values,
            next_values=nv,
            terminated=self.terminated,
            truncated=self.truncated,
            group_ids=self.group_ids,
            starts_episode=self.starts_episode,
            gamma=gamma,
            gae_lambda=gae_lambda,
            std_floor=std_floor,
            horizon=horizon,
        )
        self.adv_mask = advantage_mask(
            estimator, self.terminated, self.truncated, self.group_ids, self.starts_episode, horizon
        )

    def shuffled_order(self, generator: torch.Generator) -> Tensor:
        """A random order of the ``num_steps * num_envs`` stored turns (one epoch's)."""
        return torch.randperm(self.num_steps * self.num_envs, generator=generator)

    def minibatches(
        self,
        mini_batch_size: int,
        generator: Optional[torch.Generator] = None,
        adv_norm: str = "none",
        std_floor: float = 0.0,
        order: Optional[Tensor] = None,
    ) -> Iterator[Minibatch]:
        """Yield shuffled minibatches covering every turn once.

        Args:
            mini_batch_size: turns per minibatch; must divide ``num_steps * num_envs``.
            generator: torch Generator seeded from the run (reproducible shuffles); drawn from
                when no ``order`` is given.
            adv_norm, std_floor: :func:`normalize_advantages` over the whole rollout first (one
                mean/std for all minibatches, so tiny minibatches do not get degenerate statistics).
            order: the turns' order (:meth:`shuffled_order`), when the caller needs the same
                minibatches twice (the old-policy recompute and the first epoch).
        """
        if self.advantages is None or self.returns is None:
            raise RuntimeError("call compute_returns before minibatches")
        total = self.num_steps * self.num_envs
        if total % mini_batch_size != 0:
            raise ValueError(f"mini_batch_size={mini_batch_size} must divide num_steps*num_envs={total}")
        if order is None:
            if generator is None:
                raise ValueError("minibatches needs a generator (to shuffle) or an order")
            order = self.shuffled_order(generator)
        adv = normalize_advantages(self.advantages, adv_norm, std_floor, self.group_ids, self.adv_mask).flatten()
        for start in range(0, total, mini_batch_size):
            yield self._minibatch(order[start : start + mini_batch_size], adv, self.returns.flatten())

    def ordered_minibatches(self, mini_batch_size: int) -> Iterator[Minibatch]:
        """Every stored turn once, in storage order (flat index ``t * num_envs + n``), in chunks of at
        most ``mini_batch_size``; advantages and returns are zeros (read before they exist: the KL
        reward penalty)."""
        total = self.step * self.num_envs
        zeros = torch.zeros(self.num_steps * self.num_envs)
        for start in range(0, total, mini_batch_size):
            yield self._minibatch(torch.arange(start, min(start + mini_batch_size, total)), zeros, zeros)

    def _minibatch(self, idx: Tensor, adv: Tensor, returns: Tensor) -> Minibatch:
        ii = idx.tolist()
        encodings = [self.encodings[i] for i in ii]
        old_tokens = [self.old_token_log_probs[i] for i in ii]
        return Minibatch(
            prompts=[self.prompts[i] for i in ii],
            images=[self.images[i] for i in ii],
            prompt_ids=[self.prompt_ids[i] for i in ii],
            generated_ids=[self.generated_ids[i] for i in ii],
            token_weights=[self.token_weights[i] for i in ii],
            old_log_probs=self.old_log_probs.flatten()[idx],
            old_values=self.old_values.flatten()[idx],
            advantages=adv[idx],
            returns=returns[idx],
            indices=idx,
            encodings=encodings if all(e is not None for e in encodings) else None,
            engine_log_probs=self.engine_log_probs.flatten()[idx],
            old_token_log_probs=old_tokens if all(t is not None for t in old_tokens) else None,
            reply_cut=self.reply_cut.flatten()[idx],
        )

    # Per-turn fields (flat index t * num_envs + n) that :meth:`copy_turns` carries: lists, then (T, N) tensors.
    _TURN_LISTS = (
        "prompts",
        "images",
        "prompt_ids",
        "generated_ids",
        "token_weights",
        "old_token_log_probs",
        "encodings",
    )
    _TURN_TENSORS = (
        "old_log_probs",
        "values",
        "old_values",
        "rewards",
        "terminated",
        "truncated",
        "next_values",
        "temperatures",
        "engine_log_probs",
        "reply_cut",
        "advantages",
        "returns",
        "adv_mask",
        "group_ids",
    )

    @classmethod
    def batch_like(cls, other: "RolloutStorage") -> "RolloutStorage":
        """An empty storage of ``other``'s shape to gather turns of several rollouts into
        (:meth:`copy_turns`): the update reads it like a rollout (flat indices only)."""
        batch = cls(other.num_steps, other.num_envs)
        shape = (other.num_steps, other.num_envs)
        batch.advantages, batch.returns = torch.zeros(shape), torch.zeros(shape)
        batch.adv_mask = torch.zeros(shape, dtype=torch.bool)
        batch.group_ids = torch.full(shape, -1, dtype=torch.long)
        batch.step = other.num_steps
        return batch

    def copy_turns(self, src: "RolloutStorage", indices: Sequence[int], positions: Sequence[int]) -> None:
        """Copy ``src``'s turns at flat ``indices`` (after its advantages) into this storage's flat
        ``positions``, every per-turn field with them (the turns' processed images are shared, not copied)."""
        if src.advantages is None or src.returns is None or src.adv_mask is None:
            raise RuntimeError("copy_turns reads the advantages: call compute_returns on the source first")
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        pos = torch.as_tensor(list(positions), dtype=torch.long)
        for name in self._TURN_LISTS:
            mine, theirs = getattr(self, name), getattr(src, name)
            for i, p in zip(idx.tolist(), pos.tolist()):
                mine[p] = theirs[i]
        for name in self._TURN_TENSORS:
            theirs = getattr(src, name)
            if theirs is None:  # no groups in the source: its turns are groupless
                continue
            getattr(self, name).view(-1)[pos] = theirs.reshape(-1)[idx].to(getattr(self, name).dtype)

    def after_update(self) -> None:
        """Make room for the next rollout; remember which envs start mid-episode."""
        self.starts_episode = (self.terminated[-1] | self.truncated[-1]).clone()
        self.step = 0
        self.advantages = self.returns = self.adv_mask = None
        self.group_ids = None
        self.next_values.zero_()
        self.final_pending.zero_()
        n = self.num_steps * self.num_envs
        self.prompts, self.images = [None] * n, [None] * n
        self.prompt_ids, self.generated_ids, self.token_weights = [None] * n, [None] * n, [None] * n
        self.old_token_log_probs = [None] * n
        self.encodings = [None] * n
        self.image_store.clear()
