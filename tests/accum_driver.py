"""Runs PPO updates on one fixed rollout under one backend and records what the optimizer did.

Used by ``tests/test_accumulation.py``, in-process (``plain``) or as a script under ``torchrun``
(``ddp``: accelerate with 2 CPU processes and gloo; ``zero2``/``zero3``: DeepSpeed on 2 CPU ranks):

    torchrun --nproc_per_node 2 tests/accum_driver.py BACKEND STORAGE.pkl OUT_DIR

Every process loads the same pickled :class:`RolloutStorage` and shuffles it with the same seed, so
the gradient averaged over processes equals the single-process gradient and every backend must end
with the plain run's weights. Scenarios, each from the same fresh policy (seeded LoRA/head init):

- ``gas1``/``gas2``/``gas4``: 2 updates with ``ppo.grad_accum_steps`` 1, 2, 4;
- ``nan_all``: gas 2, every loss of the first update non-finite (nothing may change), then 1 clean update;
- ``nan_some``: gas 2, losses 1 (the boundary of window 0), 2 and 3 (all of window 1) non-finite.

Rank r writes ``OUT_DIR/rank{r}.json`` (per scenario: optimizer steps per update, SHA-256 of the
trainable weights and of the optimizer state before/after each update); rank 0 also writes the final
trainable weights to ``OUT_DIR/{scenario}.pt``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
DS_JSON = {2: REPO / "scripts" / "ds_config.json", 3: REPO / "scripts" / "ds_config_zero3.json"}
SCENARIOS = {
    "gas1": (1, ()),
    "gas2": (2, ()),
    "gas4": (4, ()),
    "nan_all": (2, tuple(range(8))),
    "nan_some": (2, (1, 2, 3)),
}
UPDATES = 2
NUM_ENVS, NUM_STEPS, MINI_BATCH, EPOCHS = 2, 4, 2, 2  # 4 minibatches per epoch, 8 per update


def config(backend: str, gas: int, zero3_json: str | None = None):
    """The run config of one scenario (debug preset, fp32, CPU)."""
    from a2c_ppo_acktr.config.arguments import load_config

    overrides = [
        f"rollout.num_envs={NUM_ENVS}",
        f"rollout.num_steps={NUM_STEPS}",
        f"ppo.mini_batch_size={MINI_BATCH}",
        f"ppo.ppo_epochs={EPOCHS}",
        f"ppo.grad_accum_steps={gas}",
        "ppo.lr=0.003",
        "ppo.max_grad_norm=0.5",
        "model.max_new_tokens=16",
        "env.max_turns=2",
        "log.progress_bar=false",
        "log.tensorboard=false",
    ]
    if backend in ("zero2", "zero3"):
        stage = 2 if backend == "zero2" else 3
        overrides += [
            f"dist.zero_stage={stage}",
            f"dist.deepspeed_config={zero3_json if stage == 3 and zero3_json else DS_JSON[stage]}",
        ]
    return load_config(preset="debug", overrides=overrides)


def collect(path: Path) -> None:
    """One rollout with the initial policy, advantages computed, pickled to ``path``."""
    from a2c_ppo_acktr.envs.batch import VSIBatchEnv
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.algo.storage import RolloutStorage
    from a2c_ppo_acktr.rl.train import collect_rollout, compute_advantages, seed_everything

    cfg = config("plain", 1)
    seed_everything(cfg.seed)
    policy = VLMPolicy(cfg.model)
    envs = VSIBatchEnv(cfg.env, NUM_ENVS, seed=cfg.seed)
    storage = RolloutStorage(NUM_STEPS, NUM_ENVS)
    stats = collect_rollout(policy, envs, storage, envs.reset(), NUM_STEPS)[1]
    compute_advantages(storage, stats.next_value, cfg.ppo)
    path.write_bytes(pickle.dumps(storage))


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _trainable(module) -> dict[str, torch.Tensor]:
    """Full trainable tensors by name (gathered under ZeRO-3)."""
    from a2c_ppo_acktr.run.distributed import full_trainable
    from a2c_ppo_acktr.rl.run_state import trainable_state

    with full_trainable(module):
        return trainable_state(module)


def _optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Every tensor of the optimizer state this process holds: Adam moments and step counts, and
    under ZeRO the fp32 master partitions."""
    out: list[torch.Tensor] = []
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):  # ZeRO-2, ZeRO-3
        out += [t.detach() for t in getattr(optimizer, name, None) or []]
    inner = optimizer
    while hasattr(inner, "optimizer"):  # accelerate wrapper -> ZeRO optimizer -> torch AdamW
        inner = inner.optimizer
    for state in inner.state.values():  # ZeRO-3 empties param_groups between steps: read the state itself
        for key in sorted(state):
            value = state[key]
            out.append(value if torch.is_tensor(value) else torch.tensor(float(value)))
    return out


def _reset_accelerate() -> None:
    """Let one process build several Accelerators in turn (accelerate keeps global state)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def run_scenario(
    backend: str, storage, gas: int, nan_calls: tuple[int, ...], zero3_json: str | None = None
) -> tuple[dict[str, Any], dict[str, torch.Tensor], int]:
    """Fresh policy, ``UPDATES`` PPO updates on ``storage``; returns (record, final weights, rank)."""
    import a2c_ppo_acktr.algo.ppo as ppo_mod
    from a2c_ppo_acktr.algo.ppo import PPO
    from a2c_ppo_acktr.run.distributed import build_accelerator, is_deepspeed
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.algo.schedule import build_optimizer
    from a2c_ppo_acktr.rl.train import seed_everything

    cfg = config(backend, gas, zero3_json)
    accelerator = None
    if backend != "plain":
        _reset_accelerate()
        accelerator = build_accelerator(cfg)
    seed_everything(cfg.seed)
    module = VLMPolicy(cfg.model)
    optimizer = build_optimizer(module, cfg.ppo)
    policy, prepared = module, optimizer
    if accelerator is not None:
        policy, prepared = accelerator.prepare(module, optimizer)
        module = accelerator.unwrap_model(policy)
    deepspeed = accelerator is not None and is_deepspeed(accelerator)
    ppo = PPO(policy, prepared, cfg.ppo, accelerator, seed=0)  # the same shuffles on every process

    calls = [0]
    real_loss = ppo_mod.ppo_loss

    def loss_with_nans(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        calls[0] += 1
        if calls[0] - 1 in nan_calls:
            loss = loss + float("nan")
        return loss, metrics

    ppo_mod.ppo_loss = loss_with_nans
    record: dict[str, Any] = {"steps": [], "weights": [], "optimizer": [], "skipped": []}
    try:
        record["weights"].append(_digest(list(_trainable(module).values())))
        record["optimizer"].append(_digest(_optimizer_tensors(policy.optimizer if deepspeed else optimizer)))
        for _ in range(UPDATES):
            metrics = ppo.update(storage)
            record["steps"].append(int(metrics["optim/steps"]))
            record["skipped"].append(int(metrics["losses/skipped_minibatches"]))
            record["weights"].append(_digest(list(_trainable(module).values())))
            record["optimizer"].append(_digest(_optimizer_tensors(policy.optimizer if deepspeed else optimizer)))
    finally:
        ppo_mod.ppo_loss = real_loss
    rank = accelerator.process_index if accelerator is not None else 0
    return record, _trainable(module), rank


def main(backend: str, storage_path: str, out_dir: str, zero3_json: str | None = None) -> int:
    storage = pickle.loads(Path(storage_path).read_bytes())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, Any] = {}
    rank = 0
    for name, (gas, nan_calls) in SCENARIOS.items():
        records[name], weights, rank = run_scenario(backend, storage, gas, nan_calls, zero3_json)
        if rank == 0:
            torch.save(weights, out / f"{name}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(records, indent=1))
    if backend != "plain":
        from a2c_ppo_acktr.run.distributed import shutdown

        shutdown()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sys.exit(main(*sys.argv[1:]))
