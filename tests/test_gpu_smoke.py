"""scripts/gpu_smoke.sh and a2c_ppo_acktr/gpu_smoke.py: the checks fail on what they must catch, and
the script's CPU mode runs every stage end to end (no GPU exists on the build machine)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from a2c_ppo_acktr.config.arguments import load_config
from a2c_ppo_acktr.gpu_smoke import (
    FAILED,
    RATIO_BOUNDS,
    SmokeFailure,
    ratio_bound,
    check_ppo_run,
    check_sft_run,
    main,
    summary_table,
)

REPO = Path(__file__).resolve().parent.parent


def _run_dir(tmp_path: Path, rows: list[dict], dtype: str = "float32", old_log_probs: str = "rollout") -> Path:
    run = tmp_path / "run"
    run.mkdir()
    load_config(preset="debug", overrides={"model": {"dtype": dtype}, "ppo": {"old_log_probs": old_log_probs}}).save(
        run / "config.yaml"
    )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _row(it: int, ratio: float = 1e-6, rank: float = 0.0, seconds: float = 0.5) -> dict:
    return {
        "iteration": it,
        "debug/first_minibatch_ratio_max_dev": ratio,
        "debug/param_rank_max_dev": rank,
        "time/iteration": seconds,
    }


def test_check_ppo_run_passes_a_good_run_and_reports_speed(tmp_path):
    run = _run_dir(tmp_path, [_row(1, seconds=3.0), _row(2, ratio=5e-5, seconds=0.5)])
    result = check_ppo_run(run, iterations=2)
    assert result["ratio_max_dev"] == 5e-5 and result["param_rank_max_dev"] == 0.0 and result["processes"] == 1
    # The first iteration (warm-up) is left out of the speed; debug preset: 2 envs x 2 steps per iteration.
    assert result["seconds_per_iteration"] == 0.5 and result["env_steps_per_s"] == pytest.approx(4 / 0.5)
    assert result["rollout_log_probs"] == "generate" and result["bound"] == RATIO_BOUNDS["float32"]


def test_the_low_precision_bound_is_a_fraction_of_the_clip_range():
    assert ratio_bound("float32", 0.1) == RATIO_BOUNDS["float32"] == 1e-4
    assert ratio_bound("bfloat16", 0.1) == pytest.approx(0.08) and ratio_bound("float16", 0.2) == pytest.approx(0.16)
    with pytest.raises(ValueError, match="int8"):
        ratio_bound("int8", 0.1)


@pytest.mark.parametrize(
    "rows, dtype, message",
    [
        ([_row(1), _row(2, rank=1e-7)], "float32", "param_rank_max_dev"),  # ranks' weights differ: must be exactly 0
        ([_row(1), _row(2, ratio=2e-4)], "float32", "first_minibatch_ratio_max_dev"),  # over fp32's 1e-4
        ([_row(1), _row(2, ratio=float("nan"))], "float32", "first_minibatch_ratio_max_dev"),
        # bf16: a fraction of the run's clip range (the debug preset's ppo.clip_coef)
        (
            [_row(1, ratio=ratio_bound("bfloat16", load_config(preset="debug").ppo.clip_coef) * 1.01), _row(2)],
            "bfloat16",
            "first_minibatch_ratio_max_dev",
        ),
        ([_row(1)], "float32", "expected 2 iterations"),
    ],
)
def test_check_ppo_run_fails_on_mismatch(tmp_path, rows, dtype, message):
    with pytest.raises(SmokeFailure, match=message):
        check_ppo_run(_run_dir(tmp_path, rows, dtype), iterations=2)


def test_failed_stage_prints_the_banner_and_exits_1(tmp_path, capsys):
    run = _run_dir(tmp_path, [_row(1), _row(2, rank=0.5)])
    assert main(["check-ppo", "--device", "cpu", "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{FAILED}: check-ppo: ") and "param_rank_max_dev" in err


def test_check_sft_run(tmp_path):
    out = tmp_path / "sft"
    with pytest.raises(SmokeFailure, match="train_log.json"):
        check_sft_run(out)
    (out / "adapter").mkdir(parents=True)
    (out / "train_log.json").write_text(json.dumps([{"loss": 6.3, "step": 1}]))
    with pytest.raises(SmokeFailure, match="adapter_config.json"):
        check_sft_run(out)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (out / "adapter" / name).write_text("{}")
    assert check_sft_run(out) == {"steps": 1, "loss": 6.3}
    (out / "train_log.json").write_text(json.dumps([{"loss": math.nan, "step": 1}]))
    with pytest.raises(SmokeFailure, match="finite"):
        check_sft_run(out)


def _script(tmp_path: Path, device: str, timeout: int, **extra: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        GPU_SMOKE_DEVICE=device,
        GPU_SMOKE_DIR=str(tmp_path / "smoke"),
        OMP_NUM_THREADS="1",
        DS_ACCELERATOR="cpu",
        **extra,
    )
    return subprocess.run(
        ["bash", "scripts/gpu_smoke.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_script_is_valid_bash_and_fails_loudly_without_a_gpu(tmp_path):
    import torch

    assert subprocess.run(["bash", "-n", "scripts/gpu_smoke.sh"], cwd=REPO).returncode == 0
    bad = _script(tmp_path, "tpu", timeout=60)
    assert bad.returncode == 2 and f"{FAILED}: GPU_SMOKE_DEVICE=tpu" in bad.stderr
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the no-GPU failure cannot be shown here")
    proc = _script(tmp_path, "cuda", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{FAILED}: info: " in proc.stderr and "sees no GPU" in proc.stderr  # what happened and what to check
    assert "GPU SMOKE PASSED" not in proc.stdout


def test_script_refuses_a_missing_env_overlay(tmp_path):
    bad = _script(tmp_path, "cpu", timeout=60, ENV_CONFIG="configs/envs/no-such-env.yaml")
    assert bad.returncode == 2 and f"{FAILED}: ENV_CONFIG=configs/envs/no-such-env.yaml does not exist" in bad.stderr


def test_ratio_stage_runs_on_the_env_overlay(tmp_path, tiny_model_path, monkeypatch):
    """ENV_CONFIG reaches the ratio stage as --config (and 64 px frames as --set): the rollout it
    re-scores is the overlay's game, not VSI."""
    from a2c_ppo_acktr import gpu_smoke

    seen = []
    real_collect = gpu_smoke.collect

    def spy(policy, env_cfg, *args, **kwargs):
        seen.append((env_cfg.env_id, env_cfg.image_size))
        return real_collect(policy, env_cfg, *args, **kwargs)

    monkeypatch.setattr(gpu_smoke, "collect", spy)
    out = tmp_path / "ratio.json"
    rc = main(
        [
            "ratio",
            "--device",
            "cpu",
            "--seeds",
            "1",
            "--out",
            str(out),
            "--config",
            str(REPO / "configs/envs/numberline.yaml"),
            "--set",
            "env.image_size=64",
            "--set",
            f"model.model_path={tiny_model_path}",
        ]
    )
    assert rc == 0
    assert seen == [("NumberLine-v0", 64)] * 2  # one rollout per temperature setting
    assert all(r["ratio_max_dev"] < RATIO_BOUNDS["float32"] for r in json.loads(out.read_text()))


@pytest.mark.slow
def test_script_cpu_mode_runs_every_stage(tmp_path, tiny_model_path):
    """GPU_SMOKE_DEVICE=cpu: info, the tiny model's ratio check, 2 PPO iterations, labels + one SFT
    step, the real-checkpoint stage (the tiny model's directory standing in), the summary table,
    PASSED (~30-60 s on the 2-core build box)."""
    proc = _script(tmp_path, "cpu", timeout=300, GPU_SMOKE_MODEL=tiny_model_path, GPU_SMOKE_PRESET="debug")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("GPU SMOKE PASSED")
    work = tmp_path / "smoke"
    ratio = json.loads((work / "ratio.json").read_text())
    assert {r["setting"] for r in ratio} == {"preset", "gpu-preset (T=0.2 in [0.1, 1])"}
    assert all(r["dtype"] == "float32" and r["ratio_max_dev"] < 1e-4 and r["peak_memory_gib"] is None for r in ratio)
    ppo = json.loads((work / "ppo.json").read_text())
    assert ppo["iterations"] == 2 and ppo["param_rank_max_dev"] == 0.0 and ppo["env_steps_per_s"] > 0
    sft = json.loads((work / "sft.json").read_text())
    assert sft["steps"] == 1 and math.isfinite(sft["loss"])
    real = json.loads((work / "real.json").read_text())
    assert real["turns"] == 4 and real["ratio_max_dev"] < 1e-4 and real["share_outside_clip"] == 0.0
    assert 0 < real["prompt_tokens_max"] < real["context_limit"] and set(real["phase_seconds"]) == {
        "load",
        "collect",
        "rescore",
    }
    table = summary_table(work, "cpu")
    assert "| PPO debug/param_rank_max_dev | 0 | 0 |" in table and table in proc.stdout
    assert "| real checkpoint: longest prompt + new tokens |" in table


def test_real_checkpoint_stage_fails_on_a_prompt_past_the_models_positions(tmp_path, tiny_model_path, capsys):
    import shutil

    path = tmp_path / "short"
    shutil.copytree(tiny_model_path, path)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = 128
    (path / "config.json").write_text(json.dumps(config))
    assert main(["real", "--device", "cpu", "--model", str(path), "--preset", "debug"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(FAILED)]
    assert (
        len(lines) == 1
        and lines[0].startswith(f"{FAILED}: real: a prompt of ")
        and "exceeds the model's 128 positions" in lines[0]
    )
    assert main(["real", "--device", "cpu"]) == 1 and "real needs --model" in capsys.readouterr().err


def test_the_first_ratio_must_be_exactly_one_when_the_update_recomputes_old_log_probs(tmp_path):
    (tmp_path / "a").mkdir()
    ok = check_ppo_run(
        _run_dir(tmp_path / "a", [_row(1, ratio=0.0), _row(2, ratio=0.0)], "bfloat16", "update"), iterations=2
    )
    assert ok["old_log_probs"] == "update" and ok["ratio_max_dev"] == 0.0
    # One ulp of bf16 rounding fails under update (one forward in one layout) but is far inside rollout's bound.
    (tmp_path / "b").mkdir()
    with pytest.raises(SmokeFailure, match=r"not exactly 0 with ppo.old_log_probs=update"):
        check_ppo_run(
            _run_dir(tmp_path / "b", [_row(1, ratio=0.0), _row(2, ratio=2.0**-8)], "bfloat16", "update"), iterations=2
        )
    (tmp_path / "c").mkdir()
    assert (
        check_ppo_run(
            _run_dir(tmp_path / "c", [_row(1, ratio=0.0), _row(2, ratio=2.0**-8)], "bfloat16", "rollout"), iterations=2
        )["ratio_max_dev"]
        == 2.0**-8
    )


def test_real_size_run_reports_its_phases(tmp_path):
    from a2c_ppo_acktr.gpu_smoke import check_real_size_run

    phases = {"time/collect": 3.0, "time/old_log_probs": 0.5, "time/update": 2.0}
    rows = [{**_row(i, ratio=0.0, seconds=s), **phases} for i, s in ((1, 9.0), (2, 5.5))]
    result = check_real_size_run(_run_dir(tmp_path, rows, "bfloat16", "update"), iterations=2)
    assert result["phase_seconds"] == {**phases, "time/iteration": 5.5}  # after the first iteration (warm-up)
    assert (result["ratio_level"], result["turns_per_iteration"]) == ("token", 4)


def test_measured_shapes_count_images_and_visual_tokens_in_the_prompt_ids():
    from types import SimpleNamespace

    import torch

    from a2c_ppo_acktr.real_size_probe import measured_shapes

    ids = {"<|vision_start|>": 7, "<|image_pad|>": 8}
    tokenizer = SimpleNamespace(convert_tokens_to_ids=ids.__getitem__)
    vision = SimpleNamespace(spatial_merge_size=2, temporal_patch_size=2, patch_size=14)
    policy = SimpleNamespace(tokenizer=tokenizer, model=SimpleNamespace(config=SimpleNamespace(vision_config=vision)))

    def prompt(images: int, text: int) -> torch.Tensor:
        return torch.tensor([1] * text + [7, *[8] * 16, 9] * images)

    storage = SimpleNamespace(prompt_ids=[prompt(2, 30), prompt(1, 50), None], num_envs=3)
    shapes = measured_shapes(policy, storage, mini_batch_size=2, max_new_tokens=64)
    # The worst turn of each kind, as the formula takes them: the most images, the longest prompt.
    assert (shapes.images, shapes.image_tokens, shapes.prompt_tokens) == (2, 16, 50 + 18)
    assert shapes.pixel_values == 16 * 4 * 2 * 14 * 14 * 3  # tokens x merged patches x temporal x patch area x RGB
    assert (shapes.text_tokens, shapes.seq, shapes.batch, shapes.padded) == (68 - 2 * 16, 68 + 64, 2, True)


def test_real_size_stages_need_a_preset(tmp_path):
    bad = _script(tmp_path, "cpu", timeout=60, GPU_SMOKE_STAGES="real-size")
    assert (
        bad.returncode == 2 and f"{FAILED}: GPU_SMOKE_STAGES=real-size needs GPU_SMOKE_REAL_SIZE=<preset>" in bad.stderr
    )
    bad = _script(tmp_path, "cpu", timeout=60, GPU_SMOKE_STAGES="tiny")
    assert bad.returncode == 2 and f"{FAILED}: GPU_SMOKE_STAGES=tiny; use all or real-size" in bad.stderr


@pytest.mark.slow
def test_script_real_size_stage_on_cpu(tmp_path):
    """GPU_SMOKE_REAL_SIZE on CPU: a 2-layer float32 proxy of Qwen2.5-VL-3B's architecture (the real
    vocabulary and tower widths) built by python -m a2c_ppo_acktr.real_size, act against a bare
    generate, and 2 PPO iterations of the preset on NumberLine, checked and tabled (~80 s)."""
    proc = _script(
        tmp_path,
        "cpu",
        timeout=400,
        GPU_SMOKE_STAGES="real-size",
        GPU_SMOKE_REAL_SIZE="qwen2.5-vl-3b",
        ENV_CONFIG="configs/envs/numberline.yaml",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.rstrip().endswith("GPU SMOKE PASSED") and "== 2/5" not in proc.stdout
    work = tmp_path / "smoke"
    probe = json.loads((work / "real_size.json").read_text())
    assert probe["build"]["architecture_of"] == "Qwen/Qwen2.5-VL-3B-Instruct" and probe["build"]["vocab_rows"] == 151936
    assert probe["env_id"] == "NumberLine-v0" and probe["act_positions"] >= 1 and probe["bare_positions"] >= 1
    assert probe["act_per_token_s"] > 0 and probe["bare_per_token_s"] > 0 and probe["peak_allocated_gib"] is None
    assert probe["shapes"]["images"] >= 1 and probe["estimate_gib"] > 0 and probe["preset_estimate_gib"] > 0
    assert probe["act_greedy_s"] > 0 and probe["act_greedy_frames_kept_s"] > 0
    ppo = json.loads((work / "real_size_ppo.json").read_text())
    assert ppo["iterations"] == 2 and ppo["dtype"] == "float32" and "time/collect" in ppo["phase_seconds"]
    if ppo["old_log_probs"] == "update":  # the same forward in the same layout: exact on any machine
        assert ppo["ratio_max_dev"] == 0.0
    table = summary_table(work, "cpu")
    assert "| real size PPO (1 process(es), float32" in table and table in proc.stdout
    assert "| real size: greedy act, the tower on every frame / the frames' tower outputs kept" in table


def test_vllm_stage_reads_vllm_python_and_reports_its_version(tmp_path):
    """Stage 3c finds vLLM in its own environment (VLLM_PYTHON): one that cannot import vllm stops the
    script before any stage runs; the engine check's version reaches the summary's rows."""
    bad = _script(tmp_path, "cpu", timeout=60, VLLM_PYTHON="/bin/false")
    assert bad.returncode == 1 and f"{FAILED}: VLLM_PYTHON=/bin/false cannot import vllm" in bad.stderr
    assert "== 1/5" not in bad.stdout
    rows = [
        {
            "iteration": i,
            "engine/adapter_version": float(i),
            "engine/logp_gap_max": 0.01,
            "engine/logp_gap_mean": 0.002,
            "charts/turns": 4.0 * i,
            "time/collect": 0.5,
        }
        for i in (1, 2)
    ]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    assert (
        main(
            [
                "check-engine",
                "--device",
                "cpu",
                "--run-dir",
                str(run),
                "--vllm-version",
                "0.33.1",
                "--out",
                str(work / "engine.json"),
            ]
        )
        == 0
    )
    assert json.loads((work / "engine.json").read_text())["vllm_version"] == "0.33.1"
    assert "| vLLM 0.33.1 engine: max abs(logp_engine - logp_policy) | 0.01 " in summary_table(work, "cpu")
