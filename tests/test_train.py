"""The PPO training loop end to end on CPU with the tiny model (debug preset).

One module-scoped fixture runs the three trainings the tests inspect (~30 s on a quiet 2-core box):
``full`` runs 4 iterations; ``split`` runs the same config stopped after 2 iterations, then resumes
with ``--resume auto`` (past a planted incomplete checkpoint) for the last 2. ``split`` also saves its
rollouts every iteration (the newest 3 kept), so its equality with ``full`` shows that saving them
changes nothing.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from a2c_ppo_acktr.config.arguments import ConfigError, PPOConfig, RunConfig, load_config
from a2c_ppo_acktr.run.checkpoint import checkpoint_name, latest_checkpoint, list_checkpoints
from a2c_ppo_acktr.run.logger import read_metrics
from numerics import recorded_forwards, widest
from helpers import run_overrides

REQUIRED_KEYS = (
    "rollout/episode_score_mean",
    "rollout/valid_action_rate",
    "rollout/episodes",
    "rollout/mean_turns",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/skipped_minibatches",
    "debug/first_minibatch_ratio_max_dev",
    "charts/learning_rate",
    "charts/temperature_mean",
    "time/collect",
    "time/collect_act",
    "time/collect_env",
    "time/advantages",
    "time/update",
    "time/checkpoint",
    "debug/param_rank_max_dev",
)


def _overrides(out: Path, **extra: str) -> list[str]:
    # max_turns 2 with 2 steps/iteration: episodes end (and auto-reset) inside the run, so the
    # resumed half must restore envs mid-stream.
    defaults = {
        "log.save_interval": "1",
        "log.keep_checkpoints": "2",
        "ppo.num_iterations": "4",
        "env.max_turns": "2",
        "model.max_new_tokens": "24",
    }
    return run_overrides(out, defaults, extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.rl.train import run_training

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: thread start-up costs more than it saves on a shared box
    try:
        root = tmp_path_factory.mktemp("train")
        full_dir, split_dir = root / "full", root / "split"
        full_last = run_training(load_config(preset="debug", overrides=_overrides(full_dir)))
        saving = {"log.save_rollouts_every": "1", "log.keep_rollouts": "3"}
        with recorded_forwards(VLMPolicy) as forwards:
            first_last = run_training(
                load_config(
                    preset="debug", overrides=_overrides(split_dir, **saving, **{"log.stop_after_iterations": "2"})
                )
            )
        snapshot = root / "after_two"
        shutil.copytree(split_dir, snapshot)
        # An incomplete later checkpoint (crash mid-write) must be ignored by --resume auto.
        planted = split_dir / "checkpoints" / checkpoint_name(3)
        planted.mkdir()
        (planted / "trainer_state.json").write_text("{}")
        resumed_last = run_training(
            load_config(preset="debug", overrides=_overrides(split_dir, **saving, **{"log.resume": "auto"}))
        )
    finally:
        torch.set_num_threads(threads)
    return {
        "full": full_dir,
        "full_last": full_last,
        "first_half": snapshot,
        "first_last": first_last,
        "first_bounds": widest(forwards),
        "split": split_dir,
        "resumed_last": resumed_last,
    }


def test_two_iterations_write_metrics_config_and_checkpoint(runs):
    out = runs["first_half"]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2]
    for row in rows:
        missing = [k for k in REQUIRED_KEYS if k not in row]
        assert not missing, f"metrics.jsonl lacks {missing}"
        assert 0.0 <= row["rollout/valid_action_rate"] <= 1.0
        assert math.isfinite(row["losses/policy_loss"]) and math.isfinite(row["losses/value_loss"])
        # The rollout/update agreement invariant (docs/CONTRACTS.md, Policy and PPO): ratio 1 on the first
        # minibatch, to the
        # rounding of the widest training forward of those iterations (numerics.forward_bounds).
        assert row["debug/first_minibatch_ratio_max_dev"] < runs["first_bounds"].ratio
        assert row["losses/skipped_minibatches"] == 0
        # act and env stepping are parts of collect (the rest: storage inserts, bootstrap values).
        assert 0 < row["time/collect_act"] and 0 < row["time/collect_env"]
        assert row["time/collect_act"] + row["time/collect_env"] <= row["time/collect"]
    # Episodes of at most 2 turns end within 2 iterations of 2 steps x 2 envs.
    assert sum(r["rollout/episodes"] for r in rows) >= 2
    # Cosine schedule spans ppo.num_iterations=4 even though this invocation stopped after 2.
    cfg = PPOConfig(num_iterations=4, lr=1e-3)
    from a2c_ppo_acktr.algo.schedule import lr_factor

    assert [r["charts/learning_rate"] for r in rows] == pytest.approx([1e-3 * lr_factor(i, cfg) for i in (0, 1)])
    saved = RunConfig.from_yaml(out / "config.yaml")
    assert saved.log.stop_after_iterations == 2 and saved.ppo.num_iterations == 4
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == checkpoint_name(2) and ckpt.name == runs["first_last"].name
    for name in (
        "policy/adapter_model.safetensors",
        "policy/heads.safetensors",
        "trainable.pt",
        "optimizer.pt",
        "scheduler.pt",
        "rank000.pkl",
        "config.yaml",
    ):
        assert (ckpt / name).is_file(), name


def test_weights_moved_during_training(runs):
    before = torch.load(runs["first_half"] / "checkpoints" / checkpoint_name(1) / "trainable.pt")
    after = torch.load(runs["first_half"] / "checkpoints" / runs["first_last"].name / "trainable.pt")
    assert before.keys() == after.keys() and len(before) > 0
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    # LoRA B matrices start at zero and every adapter/head tensor gets gradient in PPO.
    assert len(moved) == len(before), f"unchanged after an update: {sorted(set(before) - set(moved))[:5]}"


def test_resume_equals_uninterrupted_run(runs):
    full = torch.load(runs["full_last"] / "trainable.pt")
    resumed = torch.load(runs["resumed_last"] / "trainable.pt")
    assert runs["full_last"].name == runs["resumed_last"].name == checkpoint_name(4)
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), f"{name} differs after resume"
    opt_full = torch.load(runs["full_last"] / "optimizer.pt")
    opt_resumed = torch.load(runs["resumed_last"] / "optimizer.pt")
    for key, state in opt_full["state"].items():
        for k, v in state.items():
            assert torch.equal(v, opt_resumed["state"][key][k])
    rows_full = read_metrics(runs["full"] / "metrics.jsonl")
    rows_split = read_metrics(runs["split"] / "metrics.jsonl")
    assert [r["iteration"] for r in rows_split] == [1, 2, 3, 4]

    def no_time(row):
        return {k: v for k, v in row.items() if not k.startswith("time/")}

    for a, b in zip(rows_full, rows_split):
        assert no_time(a) == no_time(b), f"iteration {a['iteration']} differs"


def test_resume_auto_skips_incomplete_and_prunes(runs):
    kept = list_checkpoints(runs["split"] / "checkpoints")
    assert [p.name for p in kept] == [checkpoint_name(3), checkpoint_name(4)]  # keep_checkpoints=2
    # The planted incomplete checkpoint-000003 was replaced by the real one (it has the marker now).
    assert (runs["split"] / "checkpoints" / checkpoint_name(3) / "trainable.pt").is_file()


def test_lr_schedule_closed_form():
    from a2c_ppo_acktr.algo.schedule import lr_factor

    cos = PPOConfig(num_iterations=7, warmup_iterations=2, min_lr_ratio=0.1, lr_schedule="cosine")
    got = [lr_factor(i, cos) for i in range(7)]
    # warmup 1/2, 2/2; then cosine over 5 iterations from 1 to 0.1: 0.1 + 0.9 * (1 + cos(pi k / 4)) / 2
    want = [0.5, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert got == pytest.approx(want)
    const = PPOConfig(num_iterations=5, warmup_iterations=1, lr_schedule="constant")
    assert [lr_factor(i, const) for i in range(5)] == [1.0] * 5


def test_optimizer_param_groups_use_head_lr():
    from a2c_ppo_acktr.algo.schedule import build_optimizer

    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(2, 2)
            self.value_head = torch.nn.Linear(2, 1)
            self.frozen = torch.nn.Linear(2, 2).requires_grad_(False)

        def head_parameters(self):
            return list(self.value_head.parameters())

    opt = build_optimizer(Fake(), PPOConfig(lr=1e-5, head_lr=1e-3))
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["body"]["lr"] == 1e-5 and groups["heads"]["lr"] == 1e-3
    assert len(groups["body"]["params"]) == 2 and len(groups["heads"]["params"]) == 2  # frozen left out


def test_cli_maps_sft_adapter_and_resume(tmp_path):
    import main_vsi

    cfg = main_vsi.parse_config(
        ["--preset", "debug", "--sft-adapter", str(tmp_path), "--resume", "auto", "--ppo.lr", "2e-3", "seed=7"]
    )
    assert cfg.model.sft_adapter == str(tmp_path) and cfg.log.resume == "auto"
    assert cfg.ppo.lr == 2e-3 and cfg.seed == 7 and cfg.preset == "debug"
    with pytest.raises(ConfigError, match="ppo.lrr"):
        main_vsi.parse_config(["--preset", "debug", "--ppo.lrr", "1"])


def test_resume_from_explicit_incomplete_path_is_refused(tmp_path):
    from a2c_ppo_acktr.run.checkpoint import CheckpointError
    from a2c_ppo_acktr.rl.train import run_training

    bad = tmp_path / "checkpoints" / checkpoint_name(1)
    bad.mkdir(parents=True)
    cfg = load_config(preset="debug", overrides=_overrides(tmp_path, **{"log.resume": str(bad)}))
    with pytest.raises(CheckpointError, match="COMPLETE"):
        run_training(cfg)


def test_crash_during_checkpoint_write_then_resume_auto(tmp_path, monkeypatch):
    """A crash while checkpoint 2 is written leaves checkpoint 1 loadable; --resume auto uses it."""
    import a2c_ppo_acktr.rl.run_state as run_state
    import a2c_ppo_acktr.rl.train as train

    real_save = run_state.save_pickle
    calls = []

    def crash_on_second(obj, path):
        calls.append(path)
        if len(calls) == 2:
            real_save(obj, path)  # part of the checkpoint is on disk when the process dies
            raise KeyboardInterrupt("simulated kill during the checkpoint write")
        real_save(obj, path)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        overrides = _overrides(tmp_path, **{"ppo.num_iterations": "2", "model.max_new_tokens": "16"})
        monkeypatch.setattr(run_state, "save_pickle", crash_on_second)
        with pytest.raises(KeyboardInterrupt):
            train.run_training(load_config(preset="debug", overrides=overrides))
        ckpts = tmp_path / "checkpoints"
        assert [p.name for p in list_checkpoints(ckpts)] == [checkpoint_name(1)]
        torn = ckpts / f".tmp-{checkpoint_name(2)}"
        assert not torn.exists()  # an interrupt mid-write removes its own debris
        torn.mkdir()  # what a SIGKILL mid-write leaves instead: a torn write, never published
        (torn / "rank000.pkl").write_bytes(b"torn")
        rows_before = read_metrics(tmp_path / "metrics.jsonl")
        assert [r["iteration"] for r in rows_before] == [1, 2]
        monkeypatch.setattr(run_state, "save_pickle", real_save)
        last = train.run_training(load_config(preset="debug", overrides=overrides + ["log.resume=auto"]))
    finally:
        torch.set_num_threads(threads)
    assert last.name == checkpoint_name(2)
    # Iteration 2 was redone from checkpoint 1: the row logged before the crash was replaced by an
    # identical one (same rollout, same update), not appended.
    rows_after = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in rows_after] == [1, 2]
    drop_time = lambda row: {k: v for k, v in row.items() if not k.startswith("time/")}  # noqa: E731
    assert drop_time(rows_after[1]) == drop_time(rows_before[1])
    assert not (tmp_path / "checkpoints" / f".tmp-{checkpoint_name(2)}").exists()


def test_sft_adapter_is_loaded_before_training(runs, tmp_path, monkeypatch):
    """--sft-adapter: the SFT LoRA weights are in the policy when the first rollout starts."""
    from a2c_ppo_acktr.rl import train
    from safetensors.torch import load_file

    adapter = runs["first_half"] / "checkpoints" / checkpoint_name(2) / "policy"
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    seen = {}
    real_collect = train.collect_rollout

    def spy_collect(policy, *args, **kwargs):
        if not seen:
            seen["lora"] = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
        return real_collect(policy, *args, **kwargs)

    monkeypatch.setattr(train, "collect_rollout", spy_collect)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train.run_training(
            load_config(
                preset="debug",
                overrides=_overrides(
                    tmp_path,
                    **{"ppo.num_iterations": "1", "model.max_new_tokens": "8", "model.sft_adapter": str(adapter)},
                ),
            )
        )
    finally:
        torch.set_num_threads(threads)
    lora = seen["lora"]
    assert len(lora) == len(saved) > 0
    # peft names saved tensors without the adapter name ("default"); match on that.
    for name, value in saved.items():
        matches = [
            v for n, v in lora.items() if n.replace(".default", "").endswith(name.replace("base_model.model.", "", 1))
        ]
        assert len(matches) == 1, name
        assert torch.equal(matches[0], value), name


def test_kl_ref_is_measured_every_kl_ref_interval_updates_and_values_are_timed(runs):
    """debug preset: kl_coef = 0, log.kl_ref_interval = 10 (default): the reference forward runs on
    the first update only; the others log NaN (identically in the resumed run: the update count is
    checkpointed). The rollout's one batched value forward is timed inside collect."""
    for out in ("full", "split"):
        rows = read_metrics(runs[out] / "metrics.jsonl")
        kl = [float(r["losses/kl_ref"]) for r in rows]
        assert math.isfinite(kl[0]) and all(math.isnan(v) for v in kl[1:]), (out, kl)
        for r in rows:
            assert (
                0
                <= r["time/collect_values"]
                <= r["time/collect"] - r["time/collect_act"] - r["time/collect_env"] + 1e-6
            )


def test_saved_rollouts_hold_every_turn_and_read_back(runs, capsys):
    """log.save_rollouts_every 1, keep 3: the newest 3 iterations' files, each with every turn's
    prompt (images as digests), reply, parsed action and numbers; the show command prints episodes."""
    from a2c_ppo_acktr.rl.saved_rollouts import main as rollouts_main
    from a2c_ppo_acktr.rl.saved_rollouts import read_rollouts

    files = sorted((runs["split"] / "rollouts").glob("iter-*-rank0.jsonl.gz"))
    assert [f.name for f in files] == [f"iter-00000{i}-rank0.jsonl.gz" for i in (2, 3, 4)]
    assert not list((runs["split"] / "rollouts").glob(".*tmp*"))
    cfg = RunConfig.from_yaml(runs["split"] / "config.yaml")
    rows = read_rollouts(files[-1])
    assert len(rows) == cfg.rollout.num_envs * cfg.rollout.num_steps
    assert [(r["step"], r["env"]) for r in rows] == [
        (t, n) for t in range(cfg.rollout.num_steps) for n in range(cfg.rollout.num_envs)
    ]
    for r in rows:
        assert r["iteration"] == 4 and r["env_id"] == cfg.env.env_id and r["prompt"] and r["images"]
        assert all(len(im["digest"]) == 32 and len(im["shape"]) == 3 for im in r["images"])
        assert (
            isinstance(r["reply"], str)
            and math.isfinite(r["advantage"])
            and math.isfinite(r["return"])
            and r["log_prob"] < 0
        )
        if r["action"] is not None:  # the reply's own "action" field, as the JSON parses
            assert json.loads(r["reply"])["action"] == r["action"]
    from a2c_ppo_acktr.rl.saved_rollouts import parsed_action

    assert (
        parsed_action('{"thoughts": "t", "action": {"answer": "B"}}') == {"answer": "B"}
        and parsed_action('{"thoughts": "t"') is None
    )
    ended = [r for r in rows if r["terminated"] or r["truncated"]]
    assert ended  # max_turns 2 with 2 steps: episodes end inside the rollout, and the next one gets a new id
    later = [r for r in rows if r["env"] == ended[0]["env"] and r["step"] > ended[0]["step"]]
    assert all(r["episode"] != ended[0]["episode"] for r in later)
    assert rollouts_main(["show", str(files[-1]), "--chars", "60"]) == 0
    text = capsys.readouterr().out
    assert text.count("=== episode ") == len({r["episode"] for r in rows}) and "reply: " in text and "advantage" in text
