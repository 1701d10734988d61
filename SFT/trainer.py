"""Supervised warm start: a LoRA adapter trained on teacher trajectories (``train_sft.py``).

:class:`VLMTrainer` is a ``transformers.Trainer`` whose training batches are grouped by image count
(:class:`~SFT.data.ModalityGroupedBatchSampler`); the loss is the model's own causal-LM loss on the
collator's labels, which are set only on the assistant's tokens. The model is wrapped with the
same LoRA configuration as the PPO policy (:func:`a2c_ppo_acktr.policy.model.build_lora_config`), so checkpoints hold
the
adapter only and ``main_vsi.py --sft-adapter OUTPUT_DIR/adapter`` continues from it.

Outputs under ``sft.output_dir``: ``checkpoint-<step>/`` (adapter, optimizer, scheduler and
trainer state; ``sft.resume=auto`` continues from the latest complete one), ``adapter/`` (the final
adapter: ``adapter_config.json`` + ``adapter_model.safetensors``), ``config.yaml`` and
``train_log.json``. A checkpoint and the final adapter are written into a hidden temporary sibling
and renamed into place, so an interrupted write never leaves a ``checkpoint-<step>/`` that resuming
would trip on. A fresh start in a directory that holds an SFT run is refused unless
``sft.overwrite`` (the old run is moved aside, never deleted), and one process at a time trains in a
directory (its lock, :class:`a2c_ppo_acktr.run.rundir.RunLock`, confirmed before every checkpoint).

SIGTERM, SIGINT or a ``STOP`` file in ``sft.output_dir`` end the run as they end a PPO run
(:mod:`a2c_ppo_acktr.run.preemption`): the step in progress finishes, a checkpoint is written, and the
run exits with code 75; ``--sft.resume auto`` continues it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

from a2c_ppo_acktr.common import atomic
from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig
from a2c_ppo_acktr.run.preemption import STOP_FILE, Preempted, StopOnSignal, remove_stop_file
from a2c_ppo_acktr.policy.loading import record_base_model
from a2c_ppo_acktr.policy.model import build_lora_config, enable_gradient_checkpointing
from SFT.data import ModalityGroupedBatchSampler, SFTCollator, SFTDataset, resolve_data_files

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
TRAIN_LOG = "train_log.json"  # the Trainer's log history (loss per logging step, eval loss)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # the Trainer's checkpoint directories
_STAGING = ".tmp-"  # prefix of the temporary siblings checkpoints and the adapter are written into


class VLMTrainer(Trainer):
    """``Trainer`` with modality-grouped training batches.

    Args:
        group_by_modality: Batch samples of equal image count together (see
            :class:`~SFT.data.ModalityGroupedBatchSampler`); False uses the Trainer's sampler.
        *args, **kwargs: As for ``transformers.Trainer``.
    """

    def __init__(self, *args: Any, group_by_modality: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group_by_modality = group_by_modality
        self._staging_root: Optional[Path] = None

    def _get_output_dir(self, trial: Any) -> str:
        # While a checkpoint is written, the Trainer's run directory is the staging folder.
        return str(self._staging_root) if self._staging_root is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The Trainer's checkpoint, written whole into a hidden staging folder, then renamed into place.

        Every process writes into ``.tmp-checkpoint-<step>/`` (a DeepSpeed engine writes its shards
        from every rank); the main process confirms the run's lock, renames the finished
        ``checkpoint-<step>`` beside the others and keeps the newest ``sft.save_total_limit``.
        """
        from a2c_ppo_acktr.run.rundir import confirm_lock, confirm_run_lock
        from transformers.trainer_utils import rotate_checkpoints

        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staging = run_dir / f"{_STAGING}{name}"
        main = self.args.should_save
        confirm_run_lock(run_dir, self.is_world_process_zero(), self.accelerator.num_processes)
        if main:
            shutil.rmtree(staging, ignore_errors=True)  # left by an interrupted write
            staging.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        self._staging_root = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()
        if main:
            confirm_lock(run_dir)  # another run may have taken the directory while this one wrote
            atomic.publish_dir(staging / name, run_dir / name)
            staging.rmdir()
            for debris in run_dir.glob(f"{_STAGING}checkpoint-*"):  # of writes a crash interrupted
                shutil.rmtree(debris, ignore_errors=True)
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        self.accelerator.wait_for_everyone()

    def get_train_dataloader(self):
        if not self.group_by_modality:
            return super().get_train_dataloader()
        from torch.utils.data import DataLoader

        ds = self.train_dataset
        if not isinstance(ds, SFTDataset):
            raise TypeError(f"group_by_modality needs an SFTDataset (image counts per row), got {type(ds).__name__}")
        sampler = ModalityGroupedBatchSampler(
            ds.image_counts(), ds.text_lengths(), self.args.per_device_train_batch_size, seed=self.args.seed
        )
        loader = DataLoader(
            ds,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        # accelerate shards whole batches across processes, so every batch keeps one image count.
        return self.accelerator.prepare(loader)

    def _save(self, output_dir: Optional[str] = None, state_dict: Optional[dict] = None) -> None:
        """As the Trainer's, but a LoRA adapter never carries a copy of the base embedding matrix.

        peft's ``save_embedding_layers="auto"`` copies the whole (unchanged) embedding into the adapter
        when ``embed_tokens`` is a LoRA target; the Trainer cannot pass ``False`` through, so the
        unwrapped model's ``save_pretrained`` gets it for the duration of the save.
        """
        from peft import PeftModel

        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if not isinstance(model, PeftModel):
            return super()._save(output_dir, state_dict)
        model.save_pretrained = functools.partial(PeftModel.save_pretrained, model, save_embedding_layers=False)
        try:
            return super()._save(output_dir, state_dict)
        finally:
            del model.save_pretrained


def deepspeed_config(cfg: RunConfig) -> dict:
    """The DeepSpeed JSON of ``dist.deepspeed_config`` with batch, clipping and precision set to ``auto``.

    The shared JSON pins ``train_micro_batch_size_per_gpu`` for the PPO loop; here the Trainer
    fills those from the ``sft`` section, and rejects a pinned value that disagrees.
    """
    import json

    path = Path(cfg.dist.deepspeed_config)
    if not path.is_file():
        raise ConfigError(f"dist.deepspeed_config={str(path)!r} does not exist; use scripts/ds_config.json (ZeRO-2)")
    ds = json.loads(path.read_text(encoding="utf-8"))
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"):
        ds[key] = "auto"
    # DeepSpeed derives the global batch from micro batch x accumulation x world size itself; the
    # Trainer's "auto" fill of it can use a world size of 1 before the process group exists.
    ds.pop("train_batch_size", None)
    stage = ds.get("zero_optimization", {}).get("stage")
    if stage != cfg.dist.zero_stage:
        raise ConfigError(f"{path} sets ZeRO stage {stage} but dist.zero_stage={cfg.dist.zero_stage}; make them agree")
    return ds


def training_arguments(cfg: RunConfig, has_eval: bool) -> TrainingArguments:
    """``TrainingArguments`` from the run config (every value from ``cfg``)."""
    sft = cfg.sft
    on_cpu = cfg.model.device == "cpu"
    return TrainingArguments(
        output_dir=sft.output_dir,
        num_train_epochs=sft.num_epochs,
        max_steps=sft.max_steps,
        per_device_train_batch_size=sft.per_device_batch_size,
        per_device_eval_batch_size=sft.per_device_batch_size,
        gradient_accumulation_steps=sft.grad_accum_steps,
        learning_rate=sft.lr,
        weight_decay=sft.weight_decay,
        warmup_steps=sft.warmup_ratio,
        lr_scheduler_type="cosine",
        max_grad_norm=sft.max_grad_norm,  # never ppo.max_grad_norm: PPO presets clip far tighter
        logging_steps=sft.logging_steps,
        save_strategy="steps",
        save_steps=sft.save_steps,
        save_total_limit=sft.save_total_limit,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=sft.save_steps if has_eval else None,
        seed=cfg.seed,
        bf16=cfg.model.dtype == "bfloat16" and not on_cpu,
        fp16=cfg.model.dtype == "float16" and not on_cpu,
        # model.gradient_checkpointing is enabled by build_trainer (enable_gradient_checkpointing), not by
        # the Trainer: the Trainer's would hook every input embedding, the frozen vision tower's included.
        activation_checkpointing=False,
        use_cpu=on_cpu,
        # gloo for multi-process CPU runs; naming a backend in a single process would make
        # accelerate look for a process group that does not exist.
        ddp_backend="gloo" if on_cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        deepspeed=deepspeed_config(cfg) if cfg.dist.zero_stage > 0 else None,
        remove_unused_columns=False,  # rows hold messages and images for the collator
        label_names=["labels"],
        report_to=[] if cfg.log.wandb_mode == "disabled" else ["wandb"],
        disable_tqdm=not cfg.log.progress_bar,
        dataloader_num_workers=0,
    )


def _check(cfg: RunConfig) -> None:
    if cfg.sft.data_path is None:
        raise ConfigError(
            "sft.data_path is not set; pass the folder written by vlm_traj_preprocess.py (train.jsonl, val.jsonl)"
        )
    if not cfg.model.use_lora:
        raise ConfigError("SFT trains a LoRA adapter for the policy; set model.use_lora=true")
    if cfg.model.train_vision != "none":
        raise ConfigError(
            f"SFT trains the LoRA adapter only; model.train_vision={cfg.model.train_vision!r} is not supported here, "
            "set it to none"
        )
    if cfg.dist.zero_stage > 0 and cfg.dist.deepspeed_config is None:
        raise ConfigError(
            f"dist.zero_stage={cfg.dist.zero_stage} needs dist.deepspeed_config (e.g. scripts/ds_config.json)"
        )


def checkpoint_problem(path: Path) -> Optional[str]:
    """What keeps ``path`` from being resumed (a file the Trainer writes missing or unreadable), or None.

    Checkpoints are published whole (:meth:`VLMTrainer._save_checkpoint`); this catches the ones an
    interrupted write of an older version left, and files damaged since.
    """
    state = path / "trainer_state.json"
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "it holds no trainer_state.json (its write was interrupted)"
    except (OSError, ValueError) as e:
        return f"its trainer_state.json cannot be read ({type(e).__name__})"
    if not isinstance(data, dict) or "global_step" not in data:
        return "its trainer_state.json is not a trainer state"
    if not any((path / n).is_file() for n in ("adapter_model.safetensors", "adapter_model.bin", "model.safetensors")):
        return "it holds no weights (adapter_model.safetensors)"
    return None


def resume_checkpoint(cfg: RunConfig) -> Optional[str]:
    """The checkpoint to resume from: None, the newest resumable one under ``sft.output_dir``
    (``auto``; each newer one that is not is skipped with a warning saying why) or a path.

    Raises:
        ConfigError: an explicit path that is not a resumable checkpoint, or ``auto`` where every
            checkpoint is unresumable.
    """
    if cfg.sft.resume is None:
        return None
    if cfg.sft.resume == "auto":
        out = Path(cfg.sft.output_dir)
        found = (
            sorted((int(m.group(1)), p) for p in out.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir())
            if out.is_dir()
            else []
        )
        for _, path in reversed(found):
            problem = checkpoint_problem(path)
            if problem is None:
                return str(path)
            logger.warning("skipping %s: %s; falling back to an earlier checkpoint", path, problem)
        if found:
            raise ConfigError(
                f"no checkpoint under {out} can be resumed (see the warnings above); move them away and start afresh "
                "with "
                "--sft.overwrite true, or restore one from a backup"
            )
        return None
    if not Path(cfg.sft.resume).is_dir():
        raise ConfigError(
            f"sft.resume={cfg.sft.resume!r} is not a directory; pass a checkpoint-<step> folder, 'auto' or null"
        )
    problem = checkpoint_problem(Path(cfg.sft.resume))
    if problem is not None:
        raise ConfigError(
            f"sft.resume={cfg.sft.resume!r} cannot be resumed: {problem}; pass an earlier checkpoint or --sft.resume "
            "auto"
        )
    return cfg.sft.resume


def build_trainer(cfg: RunConfig, loaded: Any = None) -> VLMTrainer:
    """The trainer for ``cfg``: model + LoRA, datasets, collator, arguments.

    Args:
        cfg: Run config (``sft``, ``model``, ``dist``, ``log``).
        loaded: An already loaded ``LoadedVLM`` (tests); None loads ``cfg.model``.
    """
    from peft import get_peft_model

    _check(cfg)
    train_path, val_path = resolve_data_files(cfg.sft.data_path)
    train = SFTDataset(train_path, strict_images=cfg.sft.strict_images)
    val = SFTDataset(val_path, strict_images=cfg.sft.strict_images) if val_path is not None else None
    if loaded is None:
        from a2c_ppo_acktr.policy.loading import load_vlm

        loaded = load_vlm(cfg.model)
    # LoRA A matrices are drawn from torch's global RNG: seed it so runs repeat whatever ran before.
    set_seed(cfg.seed)
    model = get_peft_model(loaded.model, build_lora_config(cfg.model))
    if cfg.model.gradient_checkpointing:
        # Non-reentrant: LoRA inside a checkpointed block gets its gradient without input hooks, so a
        # frozen vision tower stays out of autograd (no recompute, no backward through it).
        enable_gradient_checkpointing(loaded.model)
    collator = SFTCollator(loaded.processor, max_length=cfg.sft.max_length)
    return VLMTrainer(
        model=model,
        args=training_arguments(cfg, has_eval=val is not None),
        train_dataset=train,
        eval_dataset=val,
        data_collator=collator,
        group_by_modality=cfg.sft.group_by_modality,
    )


class _StopCallback(TrainerCallback):
    """Asks the Trainer for a checkpoint and a stop after the step in which a signal or the stop file
    arrived (every process agrees, :meth:`StopOnSignal.agreed`)."""

    def __init__(self, stop: StopOnSignal, trainer: Trainer) -> None:
        self.stop = stop
        self.trainer = trainer
        self.reason: Optional[str] = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        reason = self.stop.agreed(self.trainer.accelerator)
        if reason:
            self.reason = reason
            control.should_save = True
            control.should_training_stop = True
        return control


def run_sft(cfg: RunConfig, loaded: Any = None) -> Path:
    """Train the SFT adapter and save it to ``sft.output_dir/adapter``; returns that path.

    Raises:
        Preempted: a signal or the ``STOP`` file ended the run early, after a checkpoint (exit 75).
    """
    from a2c_ppo_acktr.run.rundir import check_output_path, run_lock

    out = Path(cfg.sft.output_dir)
    check_output_path(
        out, [cfg.sft.data_path] if cfg.sft.data_path else [], "sft.output_dir"
    )  # before its lock file is made
    # The trainer sets up the process group later; the launcher's RANK says which process is the main
    # one. When the main one stops here (a used or locked directory), the launcher ends the others.
    is_main = int(os.environ.get("RANK", "0")) == 0
    lock = run_lock(out, is_main)
    try:
        if is_main:
            _claim_sft_dir(cfg)
            for debris in out.glob(f"{_STAGING}*"):  # writes an earlier invocation did not finish
                shutil.rmtree(debris, ignore_errors=True)
            if os.path.lexists(out / STOP_FILE):
                logger.warning(
                    "removing %s, left by an earlier invocation (this one stops on a new one)", out / STOP_FILE
                )
                remove_stop_file(out / STOP_FILE)
        trainer = build_trainer(cfg, loaded=loaded)
        if trainer.is_world_process_zero():
            cfg.save(out / "config.yaml")
        with StopOnSignal(out / STOP_FILE) as stop:
            stopper = _StopCallback(stop, trainer)
            trainer.add_callback(stopper)
            trainer.train(resume_from_checkpoint=resume_checkpoint(cfg))
        if stopper.reason and trainer.state.global_step < trainer.state.max_steps:
            stop.consume(trainer.is_world_process_zero())
            raise Preempted(
                stopper.reason,
                trainer.state.global_step,
                out / f"checkpoint-{trainer.state.global_step}",
                unit="step",
                resume="--sft.resume auto",
            )
        return _save_adapter(trainer, out)
    finally:
        lock.release()


def _save_adapter(trainer: VLMTrainer, out: Path) -> Path:
    """The final adapter and the log history, each written whole (a temporary sibling, then renamed)."""
    from a2c_ppo_acktr.run.rundir import confirm_lock

    adapter = out / ADAPTER_DIR
    staging = out / f"{_STAGING}{ADAPTER_DIR}"
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))  # PeftModel.save_pretrained: adapter weights and config only
    trainer.accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        record_base_model(staging)  # an absolute base path, so the adapter loads from any directory
        confirm_lock(out)
        atomic.publish_dir(staging, adapter)
        atomic.write_json(trainer.state.log_history, out / TRAIN_LOG, indent=1)
    return adapter


def _sft_run_files(out: Path) -> list[str]:
    """What in ``out`` shows that an SFT run used it."""
    if not out.is_dir():
        return []
    names = [n for n in (ADAPTER_DIR, "config.yaml", TRAIN_LOG) if (out / n).exists()]
    return names + sorted(p.name for p in out.glob("checkpoint-*"))


def _claim_sft_dir(cfg: RunConfig) -> None:
    """A fresh start never writes over an earlier SFT run: refused, or moved aside with ``sft.overwrite``
    (main process; the others write nothing before their first checkpoint)."""
    from a2c_ppo_acktr.run.rundir import claim_output_dir

    out = Path(cfg.sft.output_dir)
    inputs = [cfg.sft.data_path] if cfg.sft.data_path else []
    found = _sft_run_files(out) if cfg.sft.resume is None else []
    if found and not cfg.sft.overwrite:
        raise ConfigError(
            f"sft.output_dir {out} already holds an SFT run ({', '.join(found[:4])}); continue it with --sft.resume "
            "auto, start over with "
            f"--sft.overwrite true (moves it to {out.name}.old-<time>, nothing is deleted), or choose another "
            "sft.output_dir"
        )
    claim_output_dir(
        out,
        overwrite=True,
        inputs=inputs,
        option="sft.output_dir",
        overwrite_hint="sft.overwrite",
        used=lambda p: bool(found),
    )
