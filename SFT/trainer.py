"""Supervised warm start: a LoRA adapter trained on teacher trajectories (``train_sft.py``).

:class:`VLMTrainer` is a ``transformers.Trainer`` whose training batches are grouped by image count
(:class:`~SFT.data.ModalityGroupedBatchSampler`); the loss is the model's own causal-LM loss on the
collator's labels, which are set only on the assistant's tokens. The model is wrapped with the
same LoRA configuration as the PPO policy (:func:`a2c_ppo_acktr.policy.model.build_lora_config`), so checkpoints hold the
adapter only and ``main_vsi.py --sft-adapter OUTPUT_DIR/adapter`` continues from it.

Outputs under ``sft.output_dir``: ``checkpoint-<step>/`` (adapter, optimizer, scheduler and
trainer state; ``sft.resume=auto`` continues from the latest), ``adapter/`` (the final adapter:
``adapter_config.json`` + ``adapter_model.safetensors``), ``config.yaml`` and ``train_log.json``.
A fresh start in a directory that holds an SFT run is refused unless ``sft.overwrite`` (the old run is
moved aside, never deleted), and one process at a time trains in a directory (its lock,
:class:`a2c_ppo_acktr.run.rundir.RunLock`).
"""
from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

from transformers import Trainer, TrainingArguments, set_seed

from a2c_ppo_acktr.config.arguments import ConfigError, RunConfig
from a2c_ppo_acktr.policy.loading import record_base_model
from a2c_ppo_acktr.policy.model import build_lora_config, enable_gradient_checkpointing
from SFT.data import ModalityGroupedBatchSampler, SFTCollator, SFTDataset, resolve_data_files

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
TRAIN_LOG = "train_log.json"  # the Trainer's log history (loss per logging step, eval loss)


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

    def get_train_dataloader(self):
        if not self.group_by_modality:
            return super().get_train_dataloader()
        from torch.utils.data import DataLoader

        ds = self.train_dataset
        if not isinstance(ds, SFTDataset):
            raise TypeError(f"group_by_modality needs an SFTDataset (image counts per row), got {type(ds).__name__}")
        sampler = ModalityGroupedBatchSampler(ds.image_counts(), ds.text_lengths(), self.args.per_device_train_batch_size, seed=self.args.seed)
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
        raise ConfigError("sft.data_path is not set; pass the folder written by vlm_traj_preprocess.py (train.jsonl, val.jsonl)")
    if not cfg.model.use_lora:
        raise ConfigError("SFT trains a LoRA adapter for the policy; set model.use_lora=true")
    if cfg.model.train_vision != "none":
        raise ConfigError(f"SFT trains the LoRA adapter only; model.train_vision={cfg.model.train_vision!r} is not supported here, set it to none")
    if cfg.dist.zero_stage > 0 and cfg.dist.deepspeed_config is None:
        raise ConfigError(f"dist.zero_stage={cfg.dist.zero_stage} needs dist.deepspeed_config (e.g. scripts/ds_config.json)")


def resume_checkpoint(cfg: RunConfig) -> Optional[str]:
    """The checkpoint to resume from: None, the latest under ``sft.output_dir`` (``auto``) or a path."""
    from transformers.trainer_utils import get_last_checkpoint

    if cfg.sft.resume is None:
        return None
    if cfg.sft.resume == "auto":
        out = Path(cfg.sft.output_dir)
        return get_last_checkpoint(str(out)) if out.is_dir() else None
    if not Path(cfg.sft.resume).is_dir():
        raise ConfigError(f"sft.resume={cfg.sft.resume!r} is not a directory; pass a checkpoint-<step> folder, 'auto' or null")
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


def run_sft(cfg: RunConfig, loaded: Any = None) -> Path:
    """Train the SFT adapter and save it to ``sft.output_dir/adapter``; returns that path."""
    from a2c_ppo_acktr.run.rundir import check_output_path, run_lock

    out = Path(cfg.sft.output_dir)
    check_output_path(out, [cfg.sft.data_path] if cfg.sft.data_path else [], "sft.output_dir")  # before its lock file is made
    # The trainer sets up the process group later; the launcher's RANK says which process is the main
    # one. When the main one stops here (a used or locked directory), the launcher ends the others.
    is_main = int(os.environ.get("RANK", "0")) == 0
    lock = run_lock(out, is_main)
    try:
        if is_main:
            _claim_sft_dir(cfg)
        trainer = build_trainer(cfg, loaded=loaded)
        if trainer.is_world_process_zero():
            cfg.save(out / "config.yaml")
        trainer.train(resume_from_checkpoint=resume_checkpoint(cfg))
        adapter = out / ADAPTER_DIR
        trainer.save_model(str(adapter))  # PeftModel.save_pretrained: adapter weights and config only
        if trainer.is_world_process_zero():
            record_base_model(adapter)  # an absolute base path, so the adapter loads from any directory
            (out / TRAIN_LOG).write_text(json.dumps(trainer.state.log_history, indent=1), encoding="utf-8")
    finally:
        lock.release()
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
            f"sft.output_dir {out} already holds an SFT run ({', '.join(found[:4])}); continue it with --sft.resume auto, start over with "
            f"--sft.overwrite true (moves it to {out.name}.old-<time>, nothing is deleted), or choose another sft.output_dir"
        )
    claim_output_dir(out, overwrite=True, inputs=inputs, option="sft.output_dir", overwrite_hint="sft.overwrite", used=lambda p: bool(found))
