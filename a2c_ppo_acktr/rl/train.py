"""The PPO training loop: collect -> advantages -> update -> log -> checkpoint.

:func:`run_training` builds everything from a :class:`~a2c_ppo_acktr.config.arguments.RunConfig` and runs
``ppo.num_iterations`` iterations; each phase is one call and is timed (``time/*`` metrics). The
loop reads top to bottom in :func:`run_training`; the helpers below it build objects, compute the
learning-rate schedule, gather rollout statistics and write/read checkpoints.

Reproducibility: every random stream (python, numpy, torch, the PPO minibatch shuffler, the envs'
generators and scene/question cursors) is seeded from ``cfg.seed`` (offset by the process rank where
ranks must differ) and saved in every checkpoint, so that on CPU a run of 4 iterations equals 2
iterations + resume + 2 iterations, weight for weight.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Optional

import numpy as np
import torch

from a2c_ppo_acktr.common.atomic import publish_dir
from a2c_ppo_acktr.common.sameness import find_equal, unique_rows
from a2c_ppo_acktr.algo.schedule import build_optimizer, lr_factor
from a2c_ppo_acktr.config.arguments import PPOConfig, RunConfig
from a2c_ppo_acktr.run.distributed import (
    build_accelerator,
    full_trainable,
    gather_lists,
    gathered_for_rollout,
    reduce_mean,
)
from a2c_ppo_acktr.run.logger import RunLogger
from a2c_ppo_acktr.run.preemption import STOP_FILE, Preempted, StopOnSignal, remove_stop_file
from a2c_ppo_acktr.rl.saved_rollouts import rollout_rows, write_rollouts
from a2c_ppo_acktr.run.rundir import check_output_path, check_shared_directory, confirm_run_lock, run_lock
from a2c_ppo_acktr.rl.run_state import Run, RunState, pre_rollout_state, restore_pre_rollout_state
from a2c_ppo_acktr.algo.storage import BOOTSTRAPPING_ESTIMATORS
from a2c_ppo_acktr.policy.vision_cache import vision_cache_of
from a2c_ppo_acktr.eval.validation import BestPolicy, run_validation

logger = logging.getLogger(__name__)

# Env seeds of different processes are this far apart, so their scene/question streams never overlap.
RANK_SEED_STRIDE = 100_003


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------ rollout
@dataclass
class RolloutStats:
    """What one rollout saw, per process (reduced across processes before logging)."""

    episodes: list[dict] = field(default_factory=list)  # info["episode"] of every finished episode
    valid: int = 0
    turns: int = 0
    reward_sum: float = 0.0
    temperature_sum: float = 0.0
    act_seconds: float = 0.0  # policy.act (processor, generate, log-probs)
    env_seconds: float = 0.0  # envs.step (parsing, moving, rendering, resets)
    value_seconds: float = 0.0  # the one batched value forward (truncated final observations, V(s_T))
    value_rows: int = 0  # observations it valued (0: no forward)
    # (N,) V(s_T) of the observations after the last step where an episode goes on; NaN elsewhere
    # (never read there); None when the estimator reads no bootstrap.
    next_value: Optional[torch.Tensor] = None


def _bootstrap_values(
    policy, storage, finals: list[tuple[int, int, dict]], observations: list[dict], stats: RolloutStats
) -> None:
    """The values GAE reads, in one batched pass (one processor run; forwards of at most num_envs
    rows): V(final observation) of every truncated step of the rollout (into ``storage``) and V(s_T)
    of the envs still mid-episode (``stats.next_value``). Equal observations are valued once. No
    row, no forward."""
    mid = [n for n, going_on in enumerate(storage.needs_bootstrap.tolist()) if going_on]
    batch = [obs for _, _, obs in finals] + [observations[n] for n in mid]
    stats.next_value = torch.full((len(observations),), float("nan"))
    if not batch:
        return
    t0 = time.perf_counter()
    unique, where = unique_rows(batch)
    with torch.no_grad():
        # At most num_envs rows per forward: never a larger batch than act's prefill, which fits.
        values = policy.get_values(unique, max_rows=len(observations))[torch.tensor(where, dtype=torch.long)]
    stats.value_seconds += time.perf_counter() - t0
    stats.value_rows += len(unique)
    k = len(finals)
    if k:
        storage.set_final_values([t for t, _, _ in finals], [n for _, n, _ in finals], values[:k])
    stats.next_value[mid] = values[k:]


def collect_rollout(
    policy,
    envs,
    storage,
    observations: list[dict],
    num_steps: int,
    gather: Callable[[], ContextManager] = contextlib.nullcontext,
    bootstrap: bool = True,
) -> tuple[list[dict], RolloutStats]:
    """Step the envs ``num_steps`` times with the policy, filling ``storage``.

    Args:
        gather: context manager factory entered once per step around acting (and, at the last
            step, the values below): :func:`~a2c_ppo_acktr.run.distributed.gathered_for_rollout` under
            ZeRO-3 gathers the weights once per step, not once per decoded token, and forwards inside
            are local, so ranks may run different forwards there.
        With grouped envs (``rollout.group_size`` > 1) the rollout starts with ``envs.resync``:
        every group restarts on one common episode (the episodes cut there were bootstrapped, or
        incomplete for rloo/grpo, in the previous rollout).
        bootstrap: compute the values of states after a step that GAE reads (the estimator is in
            :data:`~a2c_ppo_acktr.algo.storage.BOOTSTRAPPING_ESTIMATORS`): V(final observation) of every
            truncated step and V(s_T) of every env still mid-episode after the last step, in ONE
            batched pass per rollout (one forward unless there are more than num_envs of them),
            inside the last step's gathered block. False (rloo, grpo: nothing reads them) computes
            none.

    Returns:
        The observations after the last step (the next rollout starts from them) and statistics
        (with ``next_value`` when ``bootstrap``).
    """
    stats = RolloutStats()
    # Grouped envs restart every group on one episode (siblings compared); a no-op otherwise.
    observations, restarted = envs.resync(observations)
    if restarted:
        storage.starts_episode[:] = True
    with vision_cache_of(policy):
        observations = _steps(policy, envs, storage, observations, num_steps, gather, bootstrap, stats)
    return observations, stats


def _steps(
    policy,
    envs,
    storage,
    observations: list[dict],
    num_steps: int,
    gather: Callable[[], ContextManager],
    bootstrap: bool,
    stats: RolloutStats,
) -> list[dict]:
    """:func:`collect_rollout`'s ``num_steps`` steps; returns the observations after the last."""
    finals: list[tuple[int, int, dict]] = []  # (step, env, final observation) of truncated steps
    for t in range(num_steps):
        with gather():
            t0 = time.perf_counter()
            with torch.no_grad():
                act = policy.act(observations)
            acted = observations
            t1 = time.perf_counter()
            observations, rewards, terminated, truncated, infos = envs.step(act.texts)
            stats.act_seconds += t1 - t0
            stats.env_seconds += time.perf_counter() - t1
            terminated, truncated = np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)
            # A turn limit the observations announced ends that MDP: no value is bootstrapped there (TextEnv).
            announced = truncated & np.array(
                [bool(info.get("time_limit_announced", False)) for info in infos], dtype=bool
            )
            terminated, truncated = terminated | announced, truncated & ~announced
            group_ids = [info["group_id"] for info in infos] if all("group_id" in i for i in infos) else None
            storage.insert(act, rewards, terminated, truncated, group_ids=group_ids, defer_final_values=True)
            if bootstrap:
                # A step cut on the state act has just valued (a one-turn episode cut at its reply,
                # an illegal move that changed nothing) takes act's value: no forward.
                known: list[tuple[int, float]] = []
                for n in np.flatnonzero(truncated).tolist():
                    final = infos[n]["final_observation"]
                    j = find_equal(final, acted)
                    if j is None:
                        finals.append((t, n, final))
                    else:
                        known.append((n, float(act.values[j])))
                if known:
                    storage.set_final_values(
                        [t] * len(known), [n for n, _ in known], torch.tensor([v for _, v in known])
                    )
                if t == num_steps - 1:
                    _bootstrap_values(policy, storage, finals, observations, stats)
        for info in infos:
            stats.valid += int(bool(info.get("valid", False)))
            if "episode" in info:
                stats.episodes.append(dict(info["episode"]))
        stats.turns += len(infos)
        stats.reward_sum += float(np.sum(rewards))
        stats.temperature_sum += float(act.temperatures.float().sum())
    return observations


def rollout_metrics(accelerator, stats: RolloutStats) -> dict[str, float]:
    """Rollout statistics over all processes (episodes gathered, counts summed)."""
    episodes = gather_lists(accelerator, stats.episodes)
    counts = torch.tensor(
        [stats.valid, stats.turns, stats.reward_sum, stats.temperature_sum],
        dtype=torch.float64,
        device=accelerator.device,
    )
    if accelerator.num_processes > 1:
        counts = accelerator.reduce(counts, reduction="sum")
    valid, turns, reward_sum, temp_sum = counts.tolist()
    nan = float("nan")
    return {
        "rollout/episodes": float(len(episodes)),
        "rollout/episode_score_mean": float(np.mean([e["score"] for e in episodes])) if episodes else nan,
        "rollout/episode_reward_mean": float(np.mean([e["reward"] for e in episodes])) if episodes else nan,
        "rollout/mean_turns": float(np.mean([e["turns"] for e in episodes])) if episodes else nan,
        "rollout/valid_action_rate": valid / turns,
        "rollout/reward_mean": reward_sum / turns,
        "charts/temperature_mean": temp_sum / turns,
    }


def param_rank_max_dev(accelerator, module: torch.nn.Module) -> float:
    """Largest difference between this run's processes in (sum, sum of squares) of the trainable
    weights; 0.0 when every process holds the same weights (what DDP/DeepSpeed must guarantee).

    Cheap (two float64 reductions on the device), so it is logged every iteration as a tripwire.
    """
    if accelerator.num_processes == 1:
        return 0.0
    with torch.no_grad(), full_trainable(module) as params:
        sums = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
        for _, p in params:
            x = p.detach().to(torch.float64)
            sums[0] += x.sum()
            sums[1] += (x * x).sum()
    gathered = accelerator.gather(sums.reshape(1, 2))  # (num_processes, 2)
    return float((gathered - gathered[0]).abs().max())


# ------------------------------------------------------------------------------------ the run
@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[f"time/{name}"] = time.perf_counter() - start


def _build_run(cfg: RunConfig, accelerator) -> Run:
    from a2c_ppo_acktr.algo.ppo import PPO
    from a2c_ppo_acktr.envs.batch import BatchEnv
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.algo.storage import RolloutStorage

    rank = accelerator.process_index
    # Same seed on every rank for the weights (LoRA/head init), so ranks start identical.
    seed_everything(cfg.seed)
    module = VLMPolicy(cfg.model)
    if cfg.model.sft_adapter is not None:
        module.load_adapter(cfg.model.sft_adapter)  # its settings were adopted by _train before the config was saved
    optimizer = build_optimizer(module, cfg.ppo)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: lr_factor(it, cfg.ppo))
    policy, prepared_optimizer = accelerator.prepare(module, optimizer)
    module = accelerator.unwrap_model(policy)
    if cfg.reference_copies_weights:  # ema, or start after a warm start: a copy of the weights the run starts with
        module.init_ema_reference()
    # From here on ranks must differ (sampling, shuffles): offset by rank.
    seed_everything(cfg.seed + rank)
    envs = BatchEnv(
        cfg.env, cfg.rollout.num_envs, seed=cfg.seed + rank * RANK_SEED_STRIDE, group_size=cfg.rollout.group_size
    )
    observations = envs.reset()
    ppo = PPO(
        policy, prepared_optimizer, cfg.ppo, accelerator, seed=cfg.seed + rank, kl_ref_interval=cfg.log.kl_ref_interval
    )
    storage = RolloutStorage(cfg.rollout.num_steps, cfg.rollout.num_envs)
    best = BestPolicy(cfg.log.output_dir, accelerator.is_main_process)
    return Run(
        cfg,
        accelerator,
        policy,
        module,
        optimizer,
        prepared_optimizer,
        scheduler,
        ppo,
        storage,
        envs,
        observations,
        best,
    )


def compute_advantages(
    storage, next_value: Optional[torch.Tensor], cfg: PPOConfig, horizon: Optional[int] = None
) -> None:
    """Fill advantages/returns from the rollout and its bootstrap ``V(s_T)`` (``(N,)``, read only
    for envs still mid-episode; None when the estimator reads none: see :func:`collect_rollout`).
    ``horizon`` (``env.max_turns``): rloo/grpo compare only episodes bound to end inside the rollout
    (:func:`a2c_ppo_acktr.algo.storage.episode_ids`)."""
    storage.compute_returns(
        next_value, cfg.advantage_estimator, cfg.gamma, cfg.gae_lambda, std_floor=cfg.adv_std_floor, horizon=horizon
    )


def apply_kl_reward(run: "Run") -> dict[str, float]:
    """``ppo.kl_penalty=reward``: subtract ``kl_coef`` x each response's KL to the reference from
    its turn's reward (before the advantages). Returns the penalty's metrics ({} when off)."""
    if run.cfg.ppo.kl_penalty != "reward" or run.ppo.kl_coef <= 0:
        return {}
    kl = run.ppo.reward_kl(run.storage)
    run.storage.rewards -= run.ppo.kl_coef * kl
    return {
        "rollout/kl_reward_penalty": float(run.ppo.kl_coef * kl.mean()),
        "rollout/kl_to_reference": float(kl.mean()),
    }


def apply_perception_weighting(run: "Run", iteration: int) -> dict[str, float]:
    """``ppo.perception_weighting``: reweight the rollout's tokens and advantages by visual
    dependency (:mod:`a2c_ppo_acktr.algo.perception`; after the advantages). {} when off."""
    if not run.cfg.ppo.perception_weighting:
        return {}
    from a2c_ppo_acktr.algo import perception

    return perception.apply(run.module, run.storage, run.cfg.ppo, seed=run.cfg.seed * 1_000_003 + iteration)


def validate(run: "Run", iteration: int, log: Optional[RunLogger] = None) -> dict[str, float]:
    """Validation after iteration ``iteration`` (1-based) when ``log.val_interval`` says so, and the
    best policy kept; ``val/*`` metrics ({} when no validation is due).

    With a ``log`` that sends media (tensorboard or wandb on), the trajectory picture of the first
    validation question (``val/trajectory``) and a table of this process's validation episodes
    (``val/samples``: question, reply, answer, score, reward) are logged too."""
    interval = run.cfg.log.val_interval
    if interval <= 0 or iteration % interval != 0:
        return {}
    acc = run.accelerator
    with tempfile.TemporaryDirectory() as tmp:
        result = run_validation(
            run.module,
            run.cfg,
            acc.process_index,
            acc.num_processes,
            gather_lists=functools.partial(gather_lists, acc),
            gather_weights=functools.partial(gathered_for_rollout, run.policy),
            picture_dir=Path(tmp) if log is not None and log.wants_media else None,
        )
        records, pictures = result.pop("records"), result.pop("pictures")
        if log is not None and log.wants_media:
            from PIL import Image

            from a2c_ppo_acktr.reports.records import sample_table

            log.log_images("val/trajectory", [np.asarray(Image.open(p).convert("RGB")) for p in pictures], iteration)
            log.log_text_table("val/samples", *sample_table(records), iteration)

    def save_policy(target: Path) -> None:
        with full_trainable(run.module):
            if acc.is_main_process:
                run.module.save_pretrained(target)

    improved = run.best.update(iteration, result, save_policy)
    metrics = {f"val/{k}": float(result[k]) for k in ("score", "valid_rate", "answered", "seconds")}
    metrics.update({f"val/score_{t}": v for t, v in result["per_type"].items()})
    metrics["val/best_score"] = float(run.best.score)
    metrics["val/improved"] = float(improved)
    return metrics


def merge_stats(a: RolloutStats, b: RolloutStats) -> RolloutStats:
    """The statistics of two rollouts of one iteration (dynamic sampling's rounds): counts and
    seconds added, episodes joined; the bootstrap values are the later rollout's."""
    return RolloutStats(
        episodes=a.episodes + b.episodes,
        valid=a.valid + b.valid,
        turns=a.turns + b.turns,
        reward_sum=a.reward_sum + b.reward_sum,
        temperature_sum=a.temperature_sum + b.temperature_sum,
        act_seconds=a.act_seconds + b.act_seconds,
        env_seconds=a.env_seconds + b.env_seconds,
        value_seconds=a.value_seconds + b.value_seconds,
        value_rows=a.value_rows + b.value_rows,
        next_value=b.next_value,
    )


def dynamic_batch(
    run: Run,
    stats: RolloutStats,
    collect: Callable[[], RolloutStats],
    estimate: Callable[[RolloutStats], dict[str, float]],
) -> tuple[Any, RolloutStats, dict[str, float]]:
    """DAPO's dynamic sampling (``ppo.dynamic_sampling``; Yu et al. 2025): the update's batch from the
    compared turns of groups whose episodes differ (:func:`~a2c_ppo_acktr.algo.storage.informative_turns`),
    collecting more rollouts (``collect`` then ``estimate``, as the first) until it holds
    ``num_steps * num_envs`` of them or ``ppo.dynamic_sampling_max_rounds`` rollouts were made. If the
    rounds run out, the last rollout's other turns fill the batch with no advantage (they take no
    policy gradient and no part in the normalisation). Every process makes as many rounds (the most
    any needs): a rollout step may be a collective (ZeRO-3).

    Returns:
        The batch (a storage the update reads by flat index), the rounds' statistics together, and
        ``rollout/dynamic_rounds``, ``rollout/informative_fraction`` (of all collected turns) and
        ``rollout/uninformative_fill`` (the batch's share filled without an advantage).
    """
    from a2c_ppo_acktr.algo.storage import RolloutStorage, informative_turns

    storage, acc = run.storage, run.accelerator
    size = storage.num_steps * storage.num_envs
    batch = RolloutStorage.batch_like(storage)
    filled, rounds, informative = 0, 1, 0
    while True:
        keep = informative_turns(storage.advantages, storage.adv_mask, storage.group_ids).flatten()
        informative += int(keep.sum())
        take = keep.nonzero().flatten().tolist()[: size - filled]
        batch.copy_turns(storage, take, range(filled, filled + len(take)))
        filled += len(take)
        wanting = torch.tensor([float(filled < size)], device=acc.device)
        if acc.num_processes > 1:
            wanting = acc.reduce(wanting, reduction="sum")
        if float(wanting.item()) == 0.0 or rounds >= run.cfg.ppo.dynamic_sampling_max_rounds:
            break
        storage.after_update()  # the kept turns live on in the batch
        more = collect()
        estimate(more)
        stats = merge_stats(stats, more)
        rounds += 1
    fill = size - filled
    if fill:
        rest = (~keep).nonzero().flatten().tolist()[:fill]
        positions = list(range(filled, size))
        batch.copy_turns(storage, rest, positions)
        at = torch.tensor(positions, dtype=torch.long)
        batch.adv_mask.view(-1)[at] = False
        batch.advantages.view(-1)[at] = 0.0
    return (
        batch,
        stats,
        {
            "rollout/dynamic_rounds": float(rounds),
            "rollout/informative_fraction": informative / (rounds * size),
            "rollout/uninformative_fill": fill / size,
        },
    )


def update_policy(run: Run, iteration: int, batch: Any = None) -> dict[str, float]:
    """PPO epochs over the rollout (or the ``batch`` dynamic sampling gathered), then make room for
    the next rollout and advance the lr schedule."""
    metrics = run.ppo.update(run.storage if batch is None else batch)
    if metrics.get("losses/skipped_minibatches", 0.0) > 0 or metrics.get("optim/skipped_windows", 0.0) > 0:
        logger.warning(
            "iteration %d: %d minibatch(es) skipped for a non-finite loss, %d accumulation window(s) without an "
            "optimizer step "
            "(see losses/skipped_minibatches, optim/skipped_windows)",
            iteration + 1,
            int(metrics.get("losses/skipped_minibatches", 0)),
            int(metrics.get("optim/skipped_windows", 0)),
        )
    run.storage.after_update()
    run.scheduler.step()
    return metrics


def iteration_metrics(
    run: Run, stats: RolloutStats, update_metrics: dict[str, float], lrs: list[float], iteration: int
) -> dict[str, float]:
    """One row of metrics, reduced over processes (identical on every process)."""
    acc = run.accelerator
    return {
        **rollout_metrics(acc, stats),
        **reduce_mean(acc, update_metrics),
        "charts/learning_rate": lrs[0],
        "charts/head_learning_rate": lrs[-1],
        "charts/turns": float((iteration + 1) * run.cfg.rollout.batch_size * acc.num_processes),
        "debug/param_rank_max_dev": param_rank_max_dev(acc, run.module),
    }


# ------------------------------------------------------------------------------------ rollout engine
def _save_engine_adapter(module: Any, path: Path) -> None:
    """The policy's adapter written whole into ``path`` (through a temporary sibling, then renamed):
    the server never loads a half-written adapter."""
    import shutil

    tmp = path.with_name(f".tmp-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    module.save_pretrained(tmp)
    publish_dir(tmp, path, durable=False)


def local_world_size(accelerator: Any) -> int:
    """Processes on this node: the launcher's ``LOCAL_WORLD_SIZE`` (torchrun, accelerate), else all of them."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or accelerator.num_processes)


def engine_session(accelerator: Any) -> str:
    """A token naming this launch, the same on every process (rank 0's): the adapters' paths hold it."""
    import secrets

    token = [secrets.token_hex(4)]
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(token, from_process=0)
    return str(token[0])


def engine_metrics(run: Run) -> dict[str, float]:
    """``engine/*``: the adapter version the server answered with, sync and generate seconds,
    requests and retries, and the off-policy gap ``|logp_engine - logp_policy|`` per turn (mean and
    max over the turns the engine scored)."""
    if run.engine is None:
        return {}
    st = run.engine.pop_stats()
    gap = (run.storage.old_log_probs - run.storage.engine_log_probs).abs()
    gap = gap[torch.isfinite(gap)]
    nan = float("nan")
    return {
        "engine/adapter_version": st.version,
        "engine/requests": float(st.requests),
        "engine/retries": float(st.retries),
        "engine/logp_gap_mean": float(gap.mean()) if gap.numel() else nan,
        "engine/logp_gap_max": float(gap.max()) if gap.numel() else nan,
        "time/engine_sync": st.sync_seconds,
        "time/engine_generate": st.generate_seconds,
    }


def run_training(cfg: RunConfig) -> Path:
    """Train with PPO as configured; returns the last checkpoint directory.

    Writes into ``cfg.log.output_dir``: ``config.yaml`` (resolved config), ``metrics.jsonl`` (one
    row per iteration), ``tensorboard/``, ``wandb/`` (unless disabled) and ``checkpoints/``. One run
    at a time holds the directory (:func:`a2c_ppo_acktr.run.rundir.run_lock`). SIGTERM, SIGINT or a
    ``STOP`` file end the run after the current iteration with a checkpoint
    (:class:`a2c_ppo_acktr.run.preemption.Preempted`).
    """
    cfg.validate()
    from a2c_ppo_acktr.envs.registry import game_config

    game_config(cfg.env)  # the game's typed config: a bad env.game stops here, before a model loads
    check_output_path(cfg.log.output_dir, option="log.output_dir")  # not the current directory, not a file
    accelerator = build_accelerator(cfg)
    lock = run_lock(cfg.log.output_dir, accelerator.is_main_process, accelerator.num_processes)
    try:
        check_shared_directory(cfg.log.output_dir, accelerator.is_main_process, accelerator.num_processes)
        stop_file = Path(cfg.log.output_dir) / STOP_FILE
        if accelerator.is_main_process and os.path.lexists(stop_file):
            logger.warning("removing %s, left by an earlier invocation (this one stops on a new one)", stop_file)
            remove_stop_file(stop_file)
        accelerator.wait_for_everyone()
        with StopOnSignal(stop_file) as stop:
            return _train(cfg, accelerator, stop)
    finally:
        lock.release()


def _train(cfg: RunConfig, accelerator, stop: StopOnSignal) -> Path:
    """:func:`run_training` inside the run directory's lock; ``stop`` says when a signal asks to stop."""
    if cfg.model.sft_adapter is not None:
        # The warm start's own rank, alpha and targets, before the config is compared and saved; a base
        # model other than the configured one is warned about, never switched.
        from a2c_ppo_acktr.policy.loading import adopt_adapter_settings

        for note in adopt_adapter_settings(cfg.model, cfg.model.sft_adapter):
            if accelerator.is_main_process:
                logger.warning(note)
    state = RunState(cfg, accelerator)  # where it resumes from, and what changed: before minutes of loading
    out = state.out
    run = _build_run(cfg, accelerator)
    start = state.restore(run)
    from a2c_ppo_acktr.policy.rollout_engine import make_engine

    if cfg.rollout.engine != "hf":
        run.engine = make_engine(
            cfg,
            run.module,
            out,
            accelerator.local_process_index,
            local_world_size(accelerator),
            engine_session(accelerator),
        )
        _check_engine_health(run)
    log = RunLogger(cfg, out, is_main=accelerator.is_main_process, start_iteration=start, wandb_run_id=run.wandb_run_id)
    run.wandb_run_id = log.wandb_run_id
    end = state.end(start)
    from tqdm.auto import tqdm

    bar = tqdm(
        range(start, end),
        initial=start,
        total=cfg.ppo.num_iterations,
        desc="PPO",
        disable=not (accelerator.is_main_process and cfg.log.progress_bar),
    )
    checkpoint_seconds = 0.0  # time spent writing the previous iteration's checkpoint
    try:
        for it in bar:
            timings: dict[str, float] = {"time/checkpoint": checkpoint_seconds}
            lrs = [g["lr"] for g in run.optimizer.param_groups]  # the rates this iteration trains with
            gather = functools.partial(gathered_for_rollout, run.policy)
            bootstrap = cfg.ppo.advantage_estimator in BOOTSTRAPPING_ESTIMATORS

            def collect(it: int = it) -> RolloutStats:
                if run.engine is None:
                    run.observations, collected = collect_rollout(
                        run.module,
                        run.envs,
                        run.storage,
                        run.observations,
                        cfg.rollout.num_steps,
                        gather,
                        bootstrap=bootstrap,
                    )
                    return collected
                return _collect_through_engine(run, it, state, gather, bootstrap)

            def estimate(collected: RolloutStats, it: int = it) -> dict[str, float]:
                # no forward here (but the KL reward's): the rollout made the one batched value pass
                found = apply_kl_reward(run)
                compute_advantages(run.storage, collected.next_value, cfg.ppo, horizon=cfg.env.max_turns)
                found.update(apply_perception_weighting(run, it))
                return found

            with _timed(timings, "collect"):
                stats = collect()
            with _timed(timings, "advantages"):
                extra_metrics = estimate(stats)
            batch = run.storage
            timings["time/dynamic_sampling"] = 0.0
            if cfg.ppo.dynamic_sampling:
                with _timed(timings, "dynamic_sampling"):
                    batch, stats, sampled = dynamic_batch(run, stats, collect, estimate)
                extra_metrics.update(sampled)
            with _timed(timings, "save_rollouts"):
                if (
                    cfg.log.save_rollouts_every and (it + 1) % cfg.log.save_rollouts_every == 0
                ):  # every rank its own envs' turns
                    rows = rollout_rows(batch, run.module.tokenizer, cfg.env.env_id, it + 1, accelerator.process_index)
                    write_rollouts(rows, out, it + 1, accelerator.process_index, keep=cfg.log.keep_rollouts)
            with _timed(timings, "update"):
                update_metrics = update_policy(run, it, batch)
            timings["time/iteration"] = (
                timings["time/collect"]
                + timings["time/advantages"]
                + timings["time/dynamic_sampling"]
                + timings["time/update"]
            )
            timings["time/collect_act"], timings["time/collect_env"] = stats.act_seconds, stats.env_seconds
            timings["time/collect_values"] = stats.value_seconds
            metrics = {
                **iteration_metrics(run, stats, update_metrics, lrs, it),
                **(reduce_mean(accelerator, extra_metrics) if extra_metrics else {}),
            }
            metrics.update(engine_metrics(run))
            with _timed(timings, "validation"):
                metrics.update(validate(run, it + 1, log))
            confirm_run_lock(out, accelerator.is_main_process, accelerator.num_processes)  # before each metrics row too
            log.log({**metrics, **timings}, iteration=it + 1)
            bar.set_postfix(
                score=f"{metrics['rollout/episode_score_mean']:.3f}", kl=f"{metrics['losses/approx_kl']:.2e}"
            )
            checkpoint_seconds = 0.0
            stop_reason = stop.agreed(accelerator)
            if state.due(it + 1, end, bool(stop_reason)):
                t0 = time.perf_counter()
                written = state.save(run, it + 1)
                checkpoint_seconds = time.perf_counter() - t0
                logger.info("checkpoint %s written in %.2fs", written, checkpoint_seconds)
            if stop_reason:
                stop.consume(accelerator.is_main_process)
                if it + 1 < end:
                    raise Preempted(stop_reason, it + 1, state.last)
    finally:
        bar.close()
        log.close()
    if state.last is None:
        raise RuntimeError(
            f"no iteration ran: the run starts at iteration {start} and ends at {end}; raise ppo.num_iterations to "
            "continue"
        )
    return state.last


def _any_failed(acc: Any, error: Optional[BaseException]) -> bool:
    """Whether any process holds an error (one all-reduce, so also a barrier): a process that went on
    alone after another's failure would hang in the next collective."""
    failed = torch.tensor([0.0 if error is None else 1.0], device=acc.device)
    if acc.num_processes > 1:
        failed = acc.reduce(failed, reduction="sum")
    return float(failed.item()) > 0.0


def _check_engine_health(run: Run) -> None:
    """Every process checks its server before the first rollout (a wrong URL or an unsupported server
    stops the run now, not minutes later); a failure on any one stops all of them."""
    from a2c_ppo_acktr.policy.rollout_engine import EngineError

    error: Optional[EngineError] = None
    try:
        served = run.engine.check_health()
        logger.info("rollout engine %s serves %s", run.engine.base, served)
    except EngineError as e:
        error = e
    if _any_failed(run.accelerator, error):
        raise error or EngineError(
            "the rollout server of another process failed its health check (see that process's log)"
        )


def _collect_through_engine(run: Run, it: int, state: RunState, gather: Any, bootstrap: bool) -> RolloutStats:
    """Iteration ``it``'s rollout through the rollout engine, in three steps, each ended by every
    process learning whether one failed (which is also a barrier): rank 0 saves this iteration's
    adapter (``<tag>-v<it+1>``, :func:`~a2c_ppo_acktr.policy.rollout_engine.adapter_name`) once; one
    process per server loads it, the others ask for it by that name; every process rolls out. If a
    step failed anywhere, the run is put back as it was after iteration ``it`` and a checkpoint of it
    is written (unless one exists), then :class:`~a2c_ppo_acktr.policy.rollout_engine.EngineStopped`
    ends the run with one line."""
    from a2c_ppo_acktr.policy.rollout_engine import EngineError, EngineStopped

    acc, engine, version = run.accelerator, run.engine, it + 1
    snapshot = pre_rollout_state(run)
    collected = [RolloutStats()]

    def publish() -> None:
        if acc.is_main_process:
            engine.publish_adapter(lambda path: _save_engine_adapter(run.module, path), version)

    def load() -> None:
        if engine.loads_adapter:
            engine.load_adapter(version)
        else:
            engine.use_adapter(version)

    def rollout() -> None:
        if acc.is_main_process:
            engine.discard_adapters(keep=version)  # every server holds this version now
        with run.module.with_engine(engine):
            run.observations, collected[0] = collect_rollout(
                run.module,
                run.envs,
                run.storage,
                run.observations,
                run.cfg.rollout.num_steps,
                gather,
                bootstrap=bootstrap,
            )

    error: Optional[EngineError] = None
    for step in (publish, load, rollout):
        try:
            step()
        except EngineError as e:
            error = e
        if _any_failed(acc, error):  # all stop after the same step and write the checkpoint together
            break
    else:
        return collected[0]
    restore_pre_rollout_state(run, snapshot)
    if not state.saved(it):
        state.save(run, it)
    reason = (
        str(error) if error is not None else "the rollout server of another process failed (see that process's log)"
    )
    raise EngineStopped(reason, it, state.last) from None
