"""A training run's state on disk: the run's objects, its checkpoints (write and restore), what a
resumption may change, and the output directory's safety rules.

The training loop (:mod:`a2c_ppo_acktr.rl.train`) builds a :class:`Run` and asks one
:class:`RunState` where the run resumes from, when to write a checkpoint and how; the checkpoint
format itself (atomic directories, checksums, pruning) is :mod:`a2c_ppo_acktr.run.checkpoint`'s. A
checkpoint holds, besides the weights and optimizer state, every random stream and each rank's envs
and observations, so a resumed run continues exactly where the saved one stopped.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from a2c_ppo_acktr.algo.schedule import lr_factor
from a2c_ppo_acktr.config.arguments import RunConfig
from a2c_ppo_acktr.run.checkpoint import (
    CHECKPOINT_PREFIX,
    CheckpointError,
    capture_rng_state,
    checkpoint_iteration,
    find_generators,
    list_checkpoints,
    load_pickle,
    restore_rng_state,
    save_pickle,
)
from a2c_ppo_acktr.run.distributed import full_trainable, is_deepspeed
from a2c_ppo_acktr.run.logger import METRICS_FILE, check_metrics_file, read_metrics
from a2c_ppo_acktr.run.rundir import confirm_lock, free_name, move_aside

logger = logging.getLogger(__name__)

CHECKPOINTS_SUBDIR = "checkpoints"
EMA_FILE = "ema_reference.pt"


@dataclass
class Run:
    """The objects of one run (built once, used by the loop and the checkpoint writer/reader)."""

    cfg: RunConfig
    accelerator: Any
    policy: Any  # as prepared by accelerate (DDP/DeepSpeed engine or the module itself)
    module: Any  # the VLMPolicy itself
    optimizer: torch.optim.Optimizer  # the raw AdamW (its param_groups carry the learning rates)
    prepared_optimizer: Any
    scheduler: torch.optim.lr_scheduler.LambdaLR
    ppo: Any
    storage: Any
    envs: Any
    observations: list[dict]
    best: Any = None  # validation.BestPolicy (log.val_interval > 0)
    wandb_run_id: Optional[str] = None
    engine: Any = None  # rollout_engine.VLLMServerEngine (rollout.engine != hf), else None


def trainable_state(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every trainable tensor by name (what resume restores and tests compare)."""
    return {n: p.detach().cpu().clone() for n, p in policy.named_parameters() if p.requires_grad}


def load_trainable_state(policy: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable tensors into ``policy``.

    Raises:
        CheckpointError: the saved names differ from the policy's trainable parameters.
    """
    params = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise CheckpointError(
            f"checkpoint trainable parameters do not match the policy (missing {missing[:5]}, unexpected {extra[:5]}); "
            "resume with the same model and LoRA settings as the run that wrote it"
        )
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state[n].to(device=p.device, dtype=p.dtype))


def restore_env_state(envs, state: dict[str, Any]) -> None:
    """Restore the batch env's state (:meth:`~a2c_ppo_acktr.envs.batch.BatchEnv.set_state`).

    Raises:
        CheckpointError: the checkpoint holds a different number of envs.
    """
    try:
        envs.set_state(state)
    except ValueError as e:
        raise CheckpointError(f"checkpoint: {e}") from None


def owned_generators(run: Run) -> dict[str, Any]:
    """Generators held by the storage (PPO's shuffler is saved with ``ppo.state_dict``)."""
    return find_generators(run.storage, "storage")


def rank_file(rank: int) -> str:
    return f"rank{rank:03d}.pkl"


def write_checkpoint(run: Run, iteration: int, tmp: Path) -> None:
    """Write this process's share of checkpoint ``iteration`` into ``tmp`` (see :mod:`checkpoint`)."""
    acc = run.accelerator
    # Adapter + heads in the policy's own format: what eval_vsi.py and a warm start load.
    # Under ZeRO-3 the trainable weights are gathered (a collective: every rank enters) to export them whole.
    with full_trainable(run.module):
        if acc.is_main_process:
            run.module.save_pretrained(tmp / "policy")
    if acc.is_main_process:
        if not is_deepspeed(acc):
            torch.save(trainable_state(run.module), tmp / "trainable.pt")
            torch.save(run.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(run.scheduler.state_dict(), tmp / "scheduler.pt")
        if run.module.has_ema_reference:
            torch.save(run.module.ema_reference_state(), tmp / EMA_FILE)
        run.cfg.save(tmp / "config.yaml")
        state = {
            "iteration": iteration,
            "wandb_run_id": run.wandb_run_id,
            "num_processes": acc.num_processes,
            "best_val": run.best.state(),
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    if is_deepspeed(acc):
        # ZeRO partitions the optimizer state across ranks: the engine writes each rank's shard
        # (collective call). Frozen base weights are excluded: the checkpoint holds what training changed.
        run.policy.save_checkpoint(str(tmp / "deepspeed"), tag="state", exclude_frozen_parameters=True)
    per_rank = {
        "rng": capture_rng_state(owned_generators(run)),
        "ppo": run.ppo.state_dict(),
        "env": run.envs.get_state(),
        "observations": run.observations,
        "storage_starts_episode": run.storage.starts_episode.clone(),
    }
    save_pickle(per_rank, tmp / rank_file(acc.process_index))


# What each process's state file holds (written by :func:`write_checkpoint`).
RANK_STATE_KEYS = ("rng", "ppo", "env", "observations", "storage_starts_episode")


def _torch_file(path: Path) -> Any:
    """``torch.load`` of a checkpoint's tensor file; a missing, truncated or foreign file is one
    :class:`CheckpointError`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"checkpoint file {path} cannot be read ({type(e).__name__}: {first}); it is truncated or damaged: resume "
            "from an earlier checkpoint"
        ) from e


def load_checkpoint(run: Run, path: Path) -> int:
    """Restore ``run`` from checkpoint directory ``path``; returns the iterations already done."""
    acc = run.accelerator
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path / 'trainer_state.json'} cannot be read ({type(e).__name__}: {e}); resume from an earlier checkpoint"
        ) from e
    if not isinstance(state, dict) or not {"num_processes", "iteration"} <= set(state):
        raise CheckpointError(
            f"{path / 'trainer_state.json'} is not a trainer state (num_processes and iteration expected); resume from "
            "an earlier checkpoint"
        )
    if state["num_processes"] != acc.num_processes:
        raise CheckpointError(
            f"checkpoint {path} was written by {state['num_processes']} processes, this run has {acc.num_processes}; "
            "resume with the same number of processes (each rank's envs and generators are saved separately)"
        )
    if is_deepspeed(acc):
        load_path, _ = run.policy.load_checkpoint(
            str(path / "deepspeed"),
            tag="state",
            load_module_strict=False,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )
        if load_path is None:
            raise CheckpointError(f"DeepSpeed found no engine state under {path / 'deepspeed'}")
    else:
        load_trainable_state(run.module, _torch_file(path / "trainable.pt"))
        run.optimizer.load_state_dict(_torch_file(path / "optimizer.pt"))
    run.scheduler.load_state_dict(_torch_file(path / "scheduler.pt"))
    if run.module.has_ema_reference:
        if not (path / EMA_FILE).is_file():
            raise CheckpointError(
                f"{path} holds no {EMA_FILE}: it was written without ppo.reference=ema; resume with the run's own "
                "ppo.reference"
            )
        run.module.load_ema_reference_state(_torch_file(path / EMA_FILE))
    run.best.load_state(state.get("best_val"))
    per_rank_path = path / rank_file(acc.process_index)
    per_rank = load_pickle(per_rank_path)
    if not isinstance(per_rank, dict) or not set(RANK_STATE_KEYS) <= set(per_rank):
        what = (
            f"lacks {sorted(set(RANK_STATE_KEYS) - set(per_rank))}"
            if isinstance(per_rank, dict)
            else f"holds a {type(per_rank).__name__}"
        )
        raise CheckpointError(
            f"{per_rank_path} is not this run's per-process state (it {what}; expected a mapping of "
            f"{list(RANK_STATE_KEYS)}); resume from an earlier checkpoint"
        )
    try:
        run.ppo.load_state_dict(per_rank["ppo"])
        restore_env_state(run.envs, per_rank["env"])
        run.observations = per_rank["observations"]
        run.storage.starts_episode = per_rank["storage_starts_episode"].clone()
        restore_rng_state(per_rank["rng"], owned_generators(run))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        # The file's contents come from disk (a shared or damaged checkpoint): a wrong shape is the file's fault.
        raise CheckpointError(
            f"{per_rank_path} does not hold the state this run saves ({type(e).__name__}: {e}); resume from an earlier "
            "checkpoint"
        ) from e
    run.wandb_run_id = state.get("wandb_run_id")
    apply_resumed_rates(run)
    return int(state["iteration"])


# Fields that may differ between a run and its resumption without changing the results.
_RESUME_FREE_KEYS = {
    "log.resume",
    "log.overwrite",
    "log.val_interval",
    "log.val_episodes",
    "log.stop_after_iterations",
    "log.progress_bar",
    "log.wandb_mode",
    "log.output_dir",
    "model.sft_adapter",
    "log.save_rollouts_every",
    "log.keep_rollouts",
}
# Fields that define the run: a resumption that changes one would continue another run's state, so it
# is refused. (Everything else, e.g. ppo.lr or ppo.num_iterations, is applied and recorded.)
_RUN_DEFINING_PREFIXES = ("model.", "env.", "rollout.")
_RUN_DEFINING_KEYS = {"seed", "ppo.advantage_estimator", "ppo.reference"}
_RUN_DEFINING_EXCEPT = {
    "model.sft_adapter",
    "model.device",
    "model.attn_implementation",
    "model.gradient_checkpointing",
    "model.logits_chunk_tokens",
    # how replies are sampled, not what the run is: a resumed run may use another server or engine
    "rollout.engine",
    "rollout.engine_url",
    "rollout.engine_timeout_s",
    "rollout.engine_retries",
    "rollout.engine_max_concurrency",
}
RESUME_HISTORY = "resume_history.jsonl"


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _defines_run(key: str) -> bool:
    return key not in _RUN_DEFINING_EXCEPT and (key in _RUN_DEFINING_KEYS or key.startswith(_RUN_DEFINING_PREFIXES))


def config_changes(path: Path, cfg: RunConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (checkpoint's value, this run's)}`` for every field that differs from checkpoint
    ``path``'s config, logging fields aside.

    Raises:
        CheckpointError: a field that defines the run differs (all of them listed).
    """
    old = _flatten(RunConfig.from_yaml(path / "config.yaml").to_dict())
    new = _flatten(cfg.to_dict())
    changed = {
        k: (old.get(k), new.get(k))
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k) and k not in _RESUME_FREE_KEYS
    }
    defining = {k: v for k, v in changed.items() if _defines_run(k)}
    if defining:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in defining.items())
        raise CheckpointError(
            f"cannot resume {path} with a different run definition ({listed}); resume with the checkpoint's values "
            "(its config.yaml), or start a new run in another log.output_dir"
        )
    if changed:
        logger.warning("resuming %s with changed settings, applied from here on (old -> new): %s", path, changed)
    return changed


def record_resume(out: Path, path: Path, iteration: int, changed: dict[str, tuple[Any, Any]]) -> None:
    """One line per resumption in ``RESUME_HISTORY``: when, from which checkpoint, what changed."""
    row = {
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "checkpoint": str(path),
        "iteration": iteration,
        "changed": {k: [a, b] for k, (a, b) in changed.items()},
    }
    with open(out / RESUME_HISTORY, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")


def apply_resumed_rates(run: "Run") -> None:
    """The learning rates of this run's config from the restored schedule position: the scheduler's
    state carries the checkpoint's base rates, which a changed ``ppo.lr``/``ppo.head_lr`` replaces."""
    head_lr = run.cfg.ppo.head_lr if run.cfg.ppo.head_lr is not None else run.cfg.ppo.lr
    bases = [run.cfg.ppo.lr if g.get("name") == "body" else head_lr for g in run.optimizer.param_groups]
    run.scheduler.base_lrs = bases
    factor = lr_factor(run.scheduler.last_epoch, run.cfg.ppo)
    for group, base in zip(run.optimizer.param_groups, bases):
        group["initial_lr"] = base
        group["lr"] = base * factor


def existing_run(out: Path) -> list[str]:
    """What in ``out`` shows that a run already used it: checkpoint directories (complete or not)
    and ``metrics.jsonl``; [] for a new or empty directory."""
    found = []
    ckpt_root = out / CHECKPOINTS_SUBDIR
    if ckpt_root.is_dir():
        found += sorted(p.name for p in ckpt_root.iterdir() if p.name.startswith(CHECKPOINT_PREFIX))
    if (out / METRICS_FILE).is_file():
        found.append(METRICS_FILE)
    return found


def prepare_output_dir(cfg: RunConfig, resume_from: Optional[Path], accelerator) -> None:
    """Nothing a user made is deleted or overwritten by surprise (call before anything is written).

    * A fresh start (``log.resume`` unset) in a directory holding a run is refused with a
      :class:`CheckpointError` that names the fix, unless ``log.overwrite``: the old run is then
      renamed to ``OUTPUT_DIR.old-<time>``, never deleted.
    * ``log.resume=auto`` with nothing complete to resume starts afresh in place (what ``auto`` asks
      for; the logger keeps the old rows as a numbered ``metrics.jsonl.old-<k>``).
    * Resuming from an explicit checkpoint older than the directory's newest moves the newer ones
      into ``checkpoints/abandoned-<time>/``: they belong to the branch being replaced, and pruning or a
      later ``--resume auto`` must not take them for this run's.
    * A checkpoint of another run directory starts a new run only in a fresh directory (an import);
      into a used one it is refused, so the two runs' metrics and checkpoints never mix.
    """
    out = Path(cfg.log.output_dir)
    check_metrics_file(out / METRICS_FILE)  # before minutes of loading, not at the first row
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if resume_from is not None and Path(resume_from).resolve().parent != (out / CHECKPOINTS_SUBDIR).resolve():
        found = existing_run(out)
        if found:
            raise CheckpointError(
                f"{resume_from} is another run's checkpoint and {out} already holds a run ({', '.join(found[:4])}); "
                "to continue from it, import it into a fresh log.output_dir (a new or empty directory)"
            )
        return
    if resume_from is not None:
        newer = [
            p
            for p in list_checkpoints(out / CHECKPOINTS_SUBDIR)
            if checkpoint_iteration(p) > checkpoint_iteration(resume_from)
        ]
        if newer and accelerator.is_main_process:
            confirm_lock(out)  # nothing is moved in a directory another run has taken
            aside = free_name(out / CHECKPOINTS_SUBDIR / f"abandoned-{stamp}")
            aside.mkdir(parents=True)
            for p in newer:
                os.rename(p, aside / p.name)
            # The branch's metrics rows go with its checkpoints (the logger sets them aside too).
            branch = [
                r for r in read_metrics(out / METRICS_FILE) if r.get("iteration", 0) > checkpoint_iteration(resume_from)
            ]
            if branch:
                (aside / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in branch), encoding="utf-8")
            logger.warning(
                "resuming from %s: the newer checkpoints %s were moved to %s",
                resume_from,
                [p.name for p in newer],
                aside,
            )
        accelerator.wait_for_everyone()
        return
    if cfg.log.resume == "auto":
        return
    found = existing_run(out)
    if not found:
        return
    if not cfg.log.overwrite:
        raise CheckpointError(
            f"{out} already holds a run ({', '.join(found[:4])}{', ...' if len(found) > 4 else ''}); continue it with "
            f"--resume auto, or start over with --log.overwrite true (moves it to {out.name}.old-<time>), or choose "
            "another log.output_dir"
        )
    accelerator.wait_for_everyone()  # every process has looked before the main one moves it
    if accelerator.is_main_process:
        aside = move_aside(out)  # confirms this run's lock first
        logger.warning("log.overwrite: the run that was in %s was moved to %s", out, aside)
    accelerator.wait_for_everyone()


def pre_rollout_state(run: Run) -> bytes:
    """What a rollout changes besides the storage (generators, envs, observations, episode starts),
    pickled before a rollout through a server: a server that dies mid-rollout leaves the run as it
    was after the last iteration, so the checkpoint then written resumes exactly."""
    state = {
        "rng": capture_rng_state(owned_generators(run)),
        "env": run.envs.get_state(),
        "observations": run.observations,
        "starts": run.storage.starts_episode.clone(),
    }
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def restore_pre_rollout_state(run: Run, blob: bytes) -> None:
    state = pickle.loads(blob)  # noqa: S301 - our own bytes from pre_rollout_state, never a file
    restore_rng_state(state["rng"], owned_generators(run))
    restore_env_state(run.envs, state["env"])
    run.observations = state["observations"]
    run.storage.step = 0  # the partial rollout is dropped
    run.storage.starts_episode = state["starts"]


class RunState:
    """A run's life on disk, the one object the training loop asks: where it resumes from and what
    the resumption changed (decided before minutes of model loading), the output directory's rules,
    restoring the checkpoint into the run's objects, which iterations end in a checkpoint, and
    writing them (the last ``log.keep_checkpoints`` kept).

    Args:
        cfg: the run's config (``log.output_dir``, ``log.resume``, ``log.save_interval``, ...).
        accelerator: the run's accelerate ``Accelerator`` (rank 0 writes; every rank waits for it).
    """

    def __init__(self, cfg: RunConfig, accelerator: Any) -> None:
        import functools

        from a2c_ppo_acktr.run.checkpoint import CheckpointManager, resolve_resume

        self.cfg, self.accelerator = cfg, accelerator
        self.out = Path(cfg.log.output_dir)
        root = self.out / CHECKPOINTS_SUBDIR
        self.resume_from: Optional[Path] = resolve_resume(cfg.log.resume, root)
        self.changed = config_changes(self.resume_from, cfg) if self.resume_from is not None else {}
        prepare_output_dir(cfg, self.resume_from, accelerator)
        self.last: Optional[Path] = self.resume_from  # the newest checkpoint of this run
        # Before each checkpoint the run confirms that its lock file is still its own.
        self.checkpoints = CheckpointManager(
            root,
            cfg.log.keep_checkpoints,
            accelerator.is_main_process,
            accelerator.wait_for_everyone,
            guard=functools.partial(confirm_lock, self.out),
        )

    def restore(self, run: Run) -> int:
        """Load the checkpoint the run resumes from into ``run`` (none: a fresh start), record the
        resumption, and write the run's ``config.yaml``. Returns the first iteration to run."""
        start = 0
        if self.resume_from is not None:
            start = load_checkpoint(run, self.resume_from)
            logger.info("resumed from %s at iteration %d", self.resume_from, start)
            if self.accelerator.is_main_process:
                record_resume(self.out, self.resume_from, start, self.changed)
        if self.accelerator.is_main_process:
            self.cfg.save(self.out / "config.yaml")
        return start

    def end(self, start: int) -> int:
        """The iteration this invocation stops after: ``ppo.num_iterations``, or sooner with
        ``log.stop_after_iterations``."""
        log, total = self.cfg.log, self.cfg.ppo.num_iterations
        return total if log.stop_after_iterations is None else min(total, start + log.stop_after_iterations)

    def due(self, iteration: int, end: int, stopping: bool) -> bool:
        """Whether the run writes a checkpoint after ``iteration``: every ``log.save_interval``, at the end, and when
        stopping."""
        return iteration % self.cfg.log.save_interval == 0 or iteration == end or stopping

    def save(self, run: Run, iteration: int) -> Path:
        """Write the checkpoint of ``run`` after ``iteration`` (all ranks; rank 0 publishes it atomically)."""
        self.last = self.checkpoints.save(
            iteration,
            lambda tmp: write_checkpoint(run, iteration, tmp),
            meta={"num_processes": self.accelerator.num_processes},
        )
        return self.last

    def saved(self, iteration: int) -> bool:
        """Whether the newest checkpoint is the one after ``iteration``."""
        return self.last is not None and self.last.name.endswith(f"{iteration:06d}")
