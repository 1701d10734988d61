"""Learning benchmark: does PPO from the SFT adapter learn, per task and advantage estimator, over seeds?

    .venv/bin/python bench/bench_learning.py [--tasks one_scene room_size object_size mix]
        [--estimators gae rloo grpo] [--seeds 3] [--iterations 100] [--no-controls] [--jobs 1]
        [--sft-adapter outputs/quickstart_mix/sft/adapter] [--model-path outputs/quickstart/model]
        [--best-constant room_size=0.41 ...] [--eval-episodes 100] [--out outputs/bench_learning]
        [--rerun] [--extra section.key=value ...]

Every run is one ``main_vsi.py`` process (``--preset cpu-demo``, the SFT adapter of
``bash scripts/quickstart.sh``, :data:`COMMON_OVERRIDES`, the task's overrides, then ``--extra``) writing
into ``OUT/<task>/<estimator>/<lr>/seed<k>/``. Each trained run has a control: the same command with
``ppo.lr=1e-12``, which measures what the rollouts score without learning (sampling noise, the SFT
policy's level); ``--temperature-controls`` adds a second one that trains only the value and
temperature heads (at the run's rate), so a run's gap over it is not a change of sampling temperature.
Every greedy evaluation of a trained run has a blind twin (``eval_vsi.py --zero-images``: the same
prompts and tokens with every frame zeroed) and the ``Blind twin`` lines give sighted - twin per seed.
A run whose ``metrics.jsonl`` is complete for the same command is reused, so an
interrupted bench continues where it stopped; ``--rerun`` trains everything again.

Tasks (:data:`TASKS`) and their targets:
  one_scene    room size in one scene: last-10 score >= 0.95 (memorise one answer)
  room_size    room size over 32 scenes: last-10 score >= the best constant answer's score (and a
               greedy held-out line, as for object_size)
  object_size  object size: last-10 score's 95% CI over seeds above the best constant answer's score;
               also each run's last checkpoint answers the held-out questions greedily, against the
               best constant scored on the same questions (``Greedy held-out`` lines). Its runs start
               from their own SFT adapter, which the bench builds first (OUT/object_size/sft: 400
               oracle-labelled object-size episodes, train_sft.py at lr 1e-3), with LoRA on the input
               embeddings too (:data:`EMBEDDING_LORA`: without it the tiny model cannot tell the
               category names apart; bench/bench_text_conditional.py measures that)
  mix          all 10 types: PPO minus SFT Overall on held-out questions (eval_vsi.py's seeded set,
               paired by question) above 0
  numberline   gym-cards NumberLine (configs/envs/numberline.yaml) from its own SFT adapter
               (ENV_CONFIG=configs/envs/numberline.yaml bash scripts/quickstart.sh outputs/quickstart_numberline):
               greedy success on the held-out deals of each run's last checkpoint, runs minus their
               lr~0 controls (paired by seed) above 0
  ezpoints_headroom  the same protocol on gym-cards EZPoints (configs/envs/ezpoints.yaml) with the
               tiny build that reads its cards (tiny:qwen2_5_vl-ezpoints), SFT stopped at
               EZPOINTS_HEADROOM_SFT_STEPS
  room_size_headroom  VSI's room-size question (one text, an answer that changes from scene to
               scene) on the tiny build that reads a room's floor area from its 4-frame sweep
               (tiny:qwen2_5_vl-rooms), over ROOM_SIZE_HEADROOM_SCENES training scenes, from an SFT
               adapter the bench trains on oracle answers, stopped at ROOM_SIZE_HEADROOM_SFT_STEPS:
               run - SFT and run - its zeroed twin per seed on the held-out questions (paired CIs)
  minigrid_empty  the same on MiniGrid-Empty-Random-6x6 (configs/envs/minigrid-empty.yaml,
               outputs/quickstart_minigrid_empty)
  numberline_headroom  NumberLine from an SFT adapter the bench trains itself on the quickstart's
               oracle labels, stopped at NUMBERLINE_HEADROOM_SFT_STEPS so that PPO has room (the
               quickstart's adapter already wins every deal with the seeing model): greedy success
               >= 0.95 in every seed, and run - SFT per seed (paired CIs)
  numberline9_headroom  the same on a NumberLine no recipe was tuned on: a line of 0..9
               (env.game.max_position=9), 12 turns
Greedy evaluations judge each run's last checkpoint, or with ``--eval-policy best`` the policy the
run's own validation kept (``--extra log.val_interval=K``: greedy on ``log.val_episodes`` deals or
questions seeded apart from the held-out set; ``<run>/best/policy``).
The best constant answer is found on the training distribution (the same scenes, the env's own
questions) unless ``--best-constant TASK=SCORE`` gives its score.

The table: per task, estimator and lr (run or control), the runs that finished, the training
score (``rollout/episode_score_mean``) averaged over the first 5 and the last 10 iterations of each
run then over seeds with a Student-t 95% CI (:func:`a2c_ppo_acktr.common.stats.mean_ci`), the runs that
diverged (valid-action rate below 0.5 for 5 iterations in a row), wall time per run (process, model
load included) and the target. Also written: ``OUT/bench_learning.{md,json,png}`` (curves: one panel
per task, mean over seeds per estimator with its CI shaded, controls dashed).

Unlike the speed benchmarks this one takes hours at the defaults (4 tasks x 3 estimators x 3 seeds x 2
runs of 100 iterations): start small (``--tasks one_scene --estimators gae --seeds 1 --iterations 2``).
rloo and grpo runs add ``rollout.group_size=4`` (envs per group of the same question) and make the
rollout as long as the task's ``env.max_turns`` (they compare only episodes bound to end inside it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.common import stats
from a2c_ppo_acktr.config.arguments import EMBEDDING_LORA_TARGET, load_config
from a2c_ppo_acktr.run.checkpoint import latest_checkpoint
from a2c_ppo_acktr.eval.validation import BEST_DIR

REPO = Path(__file__).resolve().parent.parent  # the entry scripts run from here

PRESET = "cpu-demo"
COMMON_OVERRIDES = (
    "rollout.num_envs=8",
    "rollout.num_steps=4",
    "ppo.mini_batch_size=8",
    "ppo.lr_schedule=constant",
    "env.max_turns=4",
    "log.save_interval=1000",
)
# Estimators that compare episodes of the same question need groups of envs asked the same one.
ESTIMATOR_OVERRIDES = {"gae": (), "rloo": ("rollout.group_size=4",), "grpo": ("rollout.group_size=4",)}
CONTROL_LR = "1e-12"  # > 0 (ppo.lr must be), small enough that no weight moves in float32
SCORE_KEY = "rollout/episode_score_mean"
# Targets whose runs are evaluated greedily on held-out questions (each with its blind twin).
GREEDY_TARGETS = ("best_constant", "beat_best_constant", "game_success", "held_out")
VALID_KEY = "rollout/valid_action_rate"
# Kept per run in the JSON (last-10 means) to explain a score: format, exploration, sampling temperature.
DIAGNOSTIC_KEYS = (VALID_KEY, "losses/entropy", "charts/temperature_mean", "time/iteration")
FIRST, LAST = 5, 10  # iterations averaged at the start and at the end of a run
DIVERGENCE_VALID_RATE, DIVERGENCE_PATIENCE = 0.5, 5
ENV_DEFAULTS = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "DS_ACCELERATOR": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
}


@dataclass(frozen=True)
class Task:
    """One task of the suite.

    Attributes:
        name: Task name (``--tasks``).
        overrides: Config overrides on top of the preset and :data:`COMMON_OVERRIDES`.
        target: ``level`` (last-10 mean >= ``level``), ``best_constant`` (last-10 mean >= the best
            constant's score), ``beat_best_constant`` (last-10 CI lower bound > it) or ``held_out``
            (PPO minus SFT Overall on eval_vsi.py's held-out questions > 0).
        level: The score ``level`` targets need.
        env_config: An env overlay (``configs/envs/*.yaml``) passed as ``--config``; None: VSI.
        adapter: The task's own SFT adapter (a game's quickstart) instead of ``--sft-adapter``;
            ``--adapter TASK=PATH`` overrides it.
        sft: The task's own SFT stage, built by the bench (:func:`build_task_adapters`) instead of
            ``--sft-adapter``: oracle labels of the task's questions, then ``train_sft.py``, with the
            task's overrides and these (``label.*``, ``sft.*``); empty: no own stage.
    """

    name: str
    overrides: tuple[str, ...]
    target: str
    level: Optional[float] = None
    env_config: Optional[str] = None
    adapter: Optional[str] = None
    sft: tuple[str, ...] = ()


# LoRA on the input embeddings too: the tiny model's embeddings of the prompt's words crowd together
# (category names at mean pairwise cosine 0.42), so an adapter on the layers alone cannot read which
# object a question names; with embed_tokens a target, supervised training learns the category sizes
# (docs/TRAINING.md, "Text-conditional answers"). cpu-demo's targets plus embed_tokens.
EMBEDDING_LORA = (
    f"model.lora_target_modules={load_config(preset=PRESET).model.lora_target_modules}|{EMBEDDING_LORA_TARGET}"
)

NUMBERLINE_HEADROOM_SFT_STEPS = 200
EZPOINTS_HEADROOM_SFT_STEPS = 200
ROOM_SIZE_HEADROOM_SFT_STEPS = 50
ROOM_SIZE_HEADROOM_SCENES = 512

TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("one_scene", ("env.num_scenes=1", "env.question_types=[room_size_estimation]"), "level", 0.95),
        Task("room_size", ("env.question_types=[room_size_estimation]", "env.num_scenes=32"), "best_constant"),
        Task(
            "object_size",
            ("env.question_types=[object_size_estimation]", EMBEDDING_LORA),
            "beat_best_constant",
            sft=("label.num_episodes=400", "sft.lr=1e-3"),
        ),
        Task("mix", (), "held_out"),
        Task(
            "numberline",
            ("env.max_turns=10",),
            "game_success",
            env_config="configs/envs/numberline.yaml",
            adapter="outputs/quickstart_numberline/sft/adapter",
        ),
        # PPO needs headroom: the quickstart's SFT adapter already wins every deal with the seeing
        # model. This one is trained on the same oracle labels for NUMBERLINE_HEADROOM_SFT_STEPS only.
        Task(
            "numberline_headroom",
            ("env.max_turns=10",),
            "game_success",
            0.95,
            env_config="configs/envs/numberline.yaml",
            sft=(f"sft.max_steps={NUMBERLINE_HEADROOM_SFT_STEPS}",),
        ),
        # The second image-only game: EZPoints on the build whose vision pre-training reads its cards
        # (tiny:qwen2_5_vl-ezpoints), SFT stopped at EZPOINTS_HEADROOM_SFT_STEPS (35% greedy, 0% with
        # frames zeroed, in the calibration); the best policy from the text alone wins 0.667.
        Task(
            "ezpoints_headroom",
            ("env.max_turns=10", "model.model_path=tiny:qwen2_5_vl-ezpoints"),
            "game_success",
            0.95,
            env_config="configs/envs/ezpoints.yaml",
            sft=(f"sft.max_steps={EZPOINTS_HEADROOM_SFT_STEPS}",),
        ),
        # VSI's room-size question on the build that reads a room's floor area from its sweep
        # (tiny:qwen2_5_vl-rooms), SFT on oracle answers stopped at ROOM_SIZE_HEADROOM_SFT_STEPS.
        Task(
            "room_size_headroom",
            (
                "env.question_types=[room_size_estimation]",
                f"env.num_scenes={ROOM_SIZE_HEADROOM_SCENES}",
                "model.model_path=tiny:qwen2_5_vl-rooms",
            ),
            "held_out",
            sft=(f"sft.max_steps={ROOM_SIZE_HEADROOM_SFT_STEPS}",),
        ),
        # A NumberLine no recipe was tuned on: a line of 0..9 (the vision pre-training reads 0..9), 12
        # turns, SFT stopped at NUMBERLINE_HEADROOM_SFT_STEPS like numberline_headroom's.
        Task(
            "numberline9_headroom",
            ("env.max_turns=12", "env.game={max_position: 9}"),
            "game_success",
            0.95,
            env_config="configs/envs/numberline.yaml",
            sft=(f"sft.max_steps={NUMBERLINE_HEADROOM_SFT_STEPS}",),
        ),
        Task(
            "minigrid_empty",
            ("env.max_turns=20",),
            "game_success",
            env_config="configs/envs/minigrid-empty.yaml",
            adapter="outputs/quickstart_minigrid_empty/sft/adapter",
        ),
    )
}


@dataclass(frozen=True)
class RunSpec:
    """One training process: a task, an estimator, a seed, trained or a control.

    A control trains nothing of the policy (``ppo.lr`` ~0). The plain control freezes the heads too;
    ``temperature_only`` trains the value and temperature heads at the run's rate, so the difference
    run - temperature control is what the policy's own weights learned, not a change of sampling
    temperature.
    """

    task: str
    estimator: str
    seed: int
    control: bool
    temperature_only: bool = False

    @property
    def lr_label(self) -> str:
        if self.temperature_only:
            return "temp_control"
        return "control" if self.control else "run"

    def directory(self, out: Path) -> Path:
        return out / self.task / self.estimator / self.lr_label / f"seed{self.seed}"


@dataclass
class RunResult:
    """What a run left: its metrics rows, process status and wall time, and (mix) its held-out eval."""

    spec: RunSpec
    status: str  # ok | failed
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = float("nan")
    log: Optional[str] = None
    eval_report: Optional[str] = None


# ------------------------------------------------------------------------------ metrics (pure)
def _number(v: Any) -> float:
    """A metrics value as a float; NaN for missing, non-numeric or non-finite ("nan" strings included)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return float("nan")
    return float(v) if math.isfinite(v) else float("nan")


def series(rows: Sequence[dict[str, Any]], key: str) -> np.ndarray:
    """``key`` per iteration, shape ``(len(rows),)``, NaN where an iteration has no finite value."""
    return np.array([_number(r.get(key)) for r in rows], dtype=np.float64)


def window_mean(values: np.ndarray, first: Optional[int] = None, last: Optional[int] = None) -> float:
    """Mean of the finite values among the first ``first`` or the last ``last`` entries (NaN if none).

    A run shorter than the window uses all its iterations.
    """
    part = values[:first] if first is not None else values[-last:] if last is not None else values
    part = part[np.isfinite(part)]
    return float(part.mean()) if part.size else float("nan")


def diverged(
    rows: Sequence[dict[str, Any]], threshold: float = DIVERGENCE_VALID_RATE, patience: int = DIVERGENCE_PATIENCE
) -> bool:
    """Whether the valid-action rate stayed below ``threshold`` for ``patience`` consecutive iterations.

    An iteration without a finite valid rate breaks a streak (it is not evidence either way).
    """
    streak = 0
    for v in series(rows, VALID_KEY):
        streak = streak + 1 if v < threshold else 0
        if streak >= patience:
            return True
    return False


def _ci(values: Sequence[float]) -> tuple[float, float, int]:
    """``(mean, half_width, n)`` over the finite values (NaNs for none)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return float("nan"), float("nan"), 0
    mean, half = stats.mean_ci(finite)
    return mean, half, len(finite)


def summarize(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One summary per (task, estimator, lr) group, in the order the groups first appear.

    Each holds ``runs`` (launched), ``ok`` (finished), the per-seed first-5 and last-10 means and their
    ``(mean, half_width, n)`` over seeds, ``diverged`` (runs), ``wall_s`` (mean over finished runs)
    and ``seconds_per_iteration`` (mean of ``time/iteration``).
    """
    groups: dict[tuple[str, str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.spec.task, r.spec.estimator, r.spec.lr_label), []).append(r)
    out = []
    for (task, estimator, lr), runs in groups.items():
        ok = [r for r in runs if r.status == "ok"]
        first = [window_mean(series(r.rows, SCORE_KEY), first=FIRST) for r in ok]
        last = [window_mean(series(r.rows, SCORE_KEY), last=LAST) for r in ok]
        per_iter = [window_mean(series(r.rows, "time/iteration")) for r in ok]
        per_iter = [v for v in per_iter if math.isfinite(v)]
        out.append(
            {
                "task": task,
                "estimator": estimator,
                "lr": lr,
                "runs": len(runs),
                "ok": len(ok),
                "seeds": [r.spec.seed for r in ok],
                "first": first,
                "last": last,
                "first_ci": _ci(first),
                "last_ci": _ci(last),
                "diverged": sum(diverged(r.rows) for r in ok),
                "wall_s": float(np.mean([r.wall_s for r in ok])) if ok else float("nan"),
                "seconds_per_iteration": float(np.mean(per_iter)) if per_iter else float("nan"),
            }
        )
    return out


def target_cell(
    task: Task, group: dict[str, Any], constant_score: Optional[float], held_out: Optional[dict[str, Any]] = None
) -> tuple[str, str]:
    """``(target, met)`` cells of a trained group's row: what the task asks and whether the runs reach it.

    Args:
        task: The task.
        group: Its summary from :func:`summarize`.
        constant_score: Score of the best constant answer (``best_constant`` targets), None if unknown.
        held_out: ``held_out`` targets: :func:`held_out_summary` of the group's runs.
    """
    mean, half, n = group["last_ci"]
    if task.target == "level":
        if n == 0:
            return f">= {task.level:.2f}", "n/a (no score)"
        return f">= {task.level:.2f}", "yes" if mean >= task.level else "no"
    if task.target in ("best_constant", "beat_best_constant"):
        if constant_score is None:
            return "best constant n/a", "n/a"
        if task.target == "best_constant":
            return f">= best constant {constant_score:.3f}", "n/a (no score)" if n == 0 else (
                "yes" if mean >= constant_score else "no"
            )
        label = f"CI above best constant {constant_score:.3f}"
        if n < 2:
            return label, "n/a (needs 2+ seeds)"
        return label, "yes" if mean - half > constant_score else "no"
    if task.target == "game_success":
        return "greedy success: run - control > 0 (see its line)", "see below"
    if task.target == "held_out":
        if not held_out or held_out["n"] == 0:
            return "PPO - SFT held-out > 0", "n/a (no eval)"
        return f"PPO - SFT held-out > 0: {held_out['text']}", "yes" if held_out["low"] > 0 else "no"
    raise ValueError(f"unknown target {task.target!r}; known: level, best_constant, beat_best_constant, held_out")


def held_out_summary(diffs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-seed paired differences (:func:`a2c_ppo_acktr.reports.paired_overall_ci`, points).

    One seed: its bootstrap interval over questions. Several: the t interval over seeds of their
    differences (seed-to-seed spread, which a single bootstrap does not see).

    Returns:
        ``{"n", "diff", "low", "high", "text"}`` (``n`` = seeds).
    """
    if not diffs:
        return {"n": 0, "diff": float("nan"), "low": float("nan"), "high": float("nan"), "text": "n/a"}
    if len(diffs) == 1:
        d = diffs[0]
        return {
            "n": 1,
            "diff": d["diff"],
            "low": d["low"],
            "high": d["high"],
            "text": f"{d['diff']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] (1 seed, bootstrap over questions)",
        }
    mean, half = stats.mean_ci([d["diff"] for d in diffs])
    return {
        "n": len(diffs),
        "diff": mean,
        "low": mean - half,
        "high": mean + half,
        "text": f"{mean:+.1f} ± {half:.1f} ({len(diffs)} seeds, t over seeds)",
    }


def held_out_lines(args: argparse.Namespace, held: dict[str, Any]) -> list[str]:
    """Per (estimator, lr) of a ``held_out`` task: each seed's run - SFT paired difference on the
    held-out questions with its bootstrap CI, and in how many seeds that CI excludes 0."""
    out = []
    for (estimator, lr), per_seed in sorted(held["diffs"].items()):
        above = sum(1 for c in per_seed if c["low"] > 0)
        cells = ", ".join(f"seed {c['seed']} {_fmt_paired(c)}" for c in per_seed)
        out.append(
            f"{estimator} {lr} - SFT, greedy on {args.eval_episodes} held-out questions (Overall points): {cells}; "
            f"CI above 0 in {above} of {len(per_seed)} seed(s)"
        )
    return out


def _fmt_paired(c: dict[str, Any]) -> str:
    """A paired difference and its interval, ``+12.5 [+4.0, +21.0]``."""
    return f"{c['diff']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]"


def _fmt_ci(ci: tuple[float, float, int]) -> str:
    mean, half, n = ci
    if n == 0:
        return "-"
    return f"{mean:.3f}" if not math.isfinite(half) else f"{mean:.3f} ± {half:.3f}"


def table_markdown(groups: Sequence[dict[str, Any]], targets: dict[tuple[str, str, str], tuple[str, str]]) -> str:
    """The benchmark's table, one row per group (``targets`` keyed by (task, estimator, lr); controls get "-")."""
    header = [
        "task",
        "estimator",
        "lr",
        "runs ok",
        f"first-{FIRST} score",
        f"last-{LAST} score",
        "diverged",
        "wall/run (s)",
        "target",
        "met",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    for g in groups:
        lr = {"run": "run", "temp_control": f"temperature-only control ({CONTROL_LR}, heads trained)"}.get(
            g["lr"], f"control ({CONTROL_LR})"
        )
        target, met = targets.get((g["task"], g["estimator"], g["lr"]), ("-", "-"))
        wall = "-" if not math.isfinite(g["wall_s"]) else f"{g['wall_s']:.0f}"
        cells = [
            g["task"],
            g["estimator"],
            lr,
            f"{g['ok']}/{g['runs']}",
            _fmt_ci(g["first_ci"]),
            _fmt_ci(g["last_ci"]),
            str(g["diverged"]),
            wall,
            target,
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_constant(question_type: str, ground_truths: Sequence[str], grid: int = 400) -> tuple[float, float]:
    """:func:`scoring.best_constant` of numerical questions, the answer as a number: ``(answer, mean score)``."""
    from a2c_ppo_acktr.common.scoring import best_constant as best

    answer, score = best(question_type, ground_truths, grid)
    return float(answer), score


# ------------------------------------------------------------------------------ env (training distribution)
def training_ground_truths(overrides: Sequence[str], samples_per_scene: int = 16) -> tuple[str, list[str]]:
    """Ground truths of the questions a task's training env asks: every scene, ``samples_per_scene`` draws.

    The task must have one question type. Scenes that cannot pose it are left out, as training redraws them.

    Returns:
        ``(question_type, ground truths)``.
    """
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.envs.questions import QuestionUnavailable
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv

    cfg = load_config(preset=PRESET, overrides=list(overrides))
    if len(cfg.env.question_types) != 1:
        raise ValueError(f"a best constant needs one question type, the task has {cfg.env.question_types}")
    qtype = cfg.env.question_types[0]
    env = VSIEnv(cfg.env)
    truths = []
    for k in range(cfg.env.num_scenes):
        for s in range(samples_per_scene):
            try:
                _, info = env.reset(
                    seed=cfg.seed * 100_003 + k * samples_per_scene + s,
                    options={"scene_index": k, "question_type": qtype},
                )
            except QuestionUnavailable:
                break  # the scene cannot pose this type at all
            truths.append(info["ground_truth"])
    env.close()
    return qtype, truths


# ------------------------------------------------------------------------------ processes
def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    for k, v in ENV_DEFAULTS.items():
        env.setdefault(k, v)
    return env


def run_parallel(
    commands: Sequence[tuple[list[str], Path]], jobs: int, on_done: Optional[Callable[[int, int, float], None]] = None
) -> list[tuple[int, float]]:
    """Run ``(argv, log file)`` commands, ``jobs`` at a time; returns ``(returncode, wall seconds)`` each.
    ``on_done(index, returncode, wall)`` is called as each one ends (an interrupted bench keeps those)."""
    pending = list(enumerate(commands))
    running: dict[int, tuple[subprocess.Popen, float, Any]] = {}
    done: dict[int, tuple[int, float]] = {}
    while pending or running:
        while pending and len(running) < jobs:
            i, (argv, log) = pending.pop(0)
            log.parent.mkdir(parents=True, exist_ok=True)
            fh = log.open("w", encoding="utf-8")
            print(f"[bench_learning] start {log.parent}", file=sys.stderr, flush=True)
            running[i] = (
                subprocess.Popen(argv, cwd=REPO, env=_child_env(), stdout=fh, stderr=subprocess.STDOUT),
                time.perf_counter(),
                fh,
            )
        for i, (proc, t0, fh) in list(running.items()):
            if proc.poll() is not None:
                fh.close()
                done[i] = (proc.returncode, time.perf_counter() - t0)
                state = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {commands[i][1]})"
                print(
                    f"[bench_learning] {state} in {done[i][1]:.0f}s: {commands[i][1].parent}",
                    file=sys.stderr,
                    flush=True,
                )
                del running[i]
                if on_done is not None:
                    on_done(i, *done[i])
        time.sleep(0.2)
    return [done[i] for i in range(len(commands))]


MARKER = "bench_run.json"


def _reusable(directory: Path, argv: list[str], complete: bool) -> Optional[dict[str, Any]]:
    """The marker of a finished identical command in ``directory`` whose output is ``complete``, else None."""
    marker = directory / MARKER
    if not complete or not marker.is_file():
        return None
    data = json.loads(marker.read_text(encoding="utf-8"))
    return data if data.get("argv") == argv and data.get("returncode") == 0 else None


def _metrics_complete(directory: Path, iterations: int) -> bool:
    from a2c_ppo_acktr.run.logger import read_metrics

    path = directory / "metrics.jsonl"
    if not path.is_file():
        return False
    rows = read_metrics(path)
    return bool(rows) and rows[-1].get("iteration") == iterations


def run_all(
    named: Sequence[tuple[Path, list[str]]], jobs: int, rerun: bool, complete: Callable[[Path], bool]
) -> dict[Path, dict[str, Any]]:
    """Run each ``(directory, argv)`` not already done there (``complete(directory)``); markers by directory."""
    markers: dict[Path, dict[str, Any]] = {}
    todo = []
    for directory, argv in named:
        reuse = None if rerun else _reusable(directory, argv, complete(directory))
        if reuse is not None:
            markers[directory] = reuse
            continue
        if directory.exists():
            shutil.rmtree(directory)  # a stale or partial run of this bench: start it afresh
        todo.append((directory, argv))

    def mark(i: int, rc: int, wall: float) -> None:  # as each run ends: a killed bench resumes from here
        directory, argv = todo[i]
        markers[directory] = {"argv": argv, "returncode": rc, "wall_s": wall}
        (directory / MARKER).write_text(json.dumps(markers[directory], indent=2), encoding="utf-8")

    run_parallel([(argv, directory / "bench.log") for directory, argv in todo], jobs, on_done=mark)
    return markers


# ------------------------------------------------------------------------------ main
def _config_args(args: argparse.Namespace, task: Task) -> list[str]:
    overlay = ["--config", str(REPO / task.env_config)] if task.env_config else []
    return [
        "--preset",
        PRESET,
        *overlay,
        "--model.model_path",
        str(args.model_path),
        "--log.progress_bar",
        "false",
        *COMMON_OVERRIDES,
        *task.overrides,
        *args.extra,
    ]


def task_adapter(args: argparse.Namespace, task: Task) -> Path:
    """The SFT adapter a task's runs start from: ``--adapter TASK=PATH``, the task's own (a path, or
    the one its ``sft`` stage builds under ``OUT/<task>/sft``), or ``--sft-adapter``."""
    if task.name in args.adapters:
        return args.adapters[task.name]
    if task.adapter:
        return (REPO / task.adapter).resolve()
    return args.out / task.name / "sft" / "train" / "adapter" if task.sft else args.sft_adapter


def builds_adapter(args: argparse.Namespace, task: Task) -> bool:
    """Whether the bench trains ``task``'s adapter itself (its ``sft`` stage, unless ``--adapter`` gives one)."""
    return bool(task.sft) and task.name not in args.adapters


def sft_stage_argv(args: argparse.Namespace, task: Task) -> list[str]:
    """One process that labels the task's questions with the oracle, preprocesses and trains its adapter."""
    d = args.out / task.name / "sft"
    common = _config_args(args, task)
    own = list(task.sft)  # section.key=value overrides, like the task's own
    steps = [
        [
            sys.executable,
            "vlm_traj_label.py",
            *common,
            *own,
            "--label.teacher",
            "oracle",
            "--label.out_dir",
            str(d / "labels"),
        ],
        [
            sys.executable,
            "vlm_traj_preprocess.py",
            *common,
            *own,
            "--label.out_dir",
            str(d / "labels"),
            "--label.dataset_dir",
            str(d / "data"),
        ],
        [
            sys.executable,
            "train_sft.py",
            *common,
            *own,
            "--sft.data_path",
            str(d / "data"),
            "--sft.output_dir",
            str(d / "train"),
        ],
    ]
    return ["bash", "-c", "set -e; " + "; ".join(shlex.join(step) for step in steps)]


def build_task_adapters(args: argparse.Namespace) -> None:
    """Build (or reuse) the SFT adapter of every chosen task that has its own ``sft`` stage."""

    def done(d: Path) -> bool:
        return (d / "train" / "adapter" / "adapter_config.json").is_file()

    jobs = [
        (args.out / t / "sft", sft_stage_argv(args, TASKS[t])) for t in args.tasks if builds_adapter(args, TASKS[t])
    ]
    markers = run_all(jobs, args.jobs, args.rerun, done)
    failed = [str(d) for d, m in markers.items() if m["returncode"] != 0 or not done(d)]
    if failed:
        raise RuntimeError(f"the SFT stage failed in {failed}; see bench.log there")


def train_argv(spec: RunSpec, args: argparse.Namespace) -> list[str]:
    """The ``main_vsi.py`` command of a run."""
    argv = [
        sys.executable,
        "main_vsi.py",
        *_config_args(args, TASKS[spec.task]),
        "--sft-adapter",
        str(task_adapter(args, TASKS[spec.task])),
        "--ppo.num_iterations",
        str(args.iterations),
        "--ppo.advantage_estimator",
        spec.estimator,
        *ESTIMATOR_OVERRIDES[spec.estimator],
        "--seed",
        str(spec.seed),
        "--log.output_dir",
        str(spec.directory(args.out)),
    ]
    if ESTIMATOR_OVERRIDES[spec.estimator] and not any(e.startswith("rollout.num_steps=") for e in args.extra):
        # rloo/grpo compare only episodes bound to end inside the rollout: at least env.max_turns steps
        task = TASKS[spec.task]
        steps = max(int(_setting(task, "rollout.num_steps")), int(_setting(task, "env.max_turns")))
        argv += ["--rollout.num_steps", str(steps)]
    if spec.temperature_only:
        argv += ["--ppo.head_lr", str(run_head_lr(args, TASKS[spec.task]))]
    if spec.control or spec.temperature_only:
        argv += ["--ppo.lr", CONTROL_LR]
    return argv


def run_head_lr(args: argparse.Namespace, task: Task) -> float:
    """The heads' learning rate of a trained run of ``task`` (``ppo.head_lr``, else ``ppo.lr``), from the
    same layers its command is built of: the preset, the task's overlay, the common and task overrides, ``--extra``."""
    config = str(REPO / task.env_config) if task.env_config else None
    cfg = load_config(config=config, preset=PRESET, overrides=[*COMMON_OVERRIDES, *task.overrides, *args.extra])
    return cfg.ppo.head_lr if cfg.ppo.head_lr is not None else cfg.ppo.lr


def _setting(task: Task, key: str) -> str:
    """The value a task's runs give ``key`` (its override, else :data:`COMMON_OVERRIDES`')."""
    values = [o.split("=", 1)[1] for o in (*COMMON_OVERRIDES, *task.overrides) if o.startswith(f"{key}=")]
    return values[-1]


def eval_argv(args: argparse.Namespace, task: Task, what: list[str], name: str, out: Path) -> list[str]:
    """An ``eval_vsi.py`` command on the task's held-out question set."""
    return [
        sys.executable,
        "eval_vsi.py",
        *_config_args(args, task),
        "--eval.num_episodes",
        str(args.eval_episodes),
        *what,
        "--name",
        name,
        "--out",
        str(out),
    ]


def evaluate_held_out(args: argparse.Namespace, results: list[RunResult]) -> dict[str, Any]:
    """Evaluate the SFT adapter and every finished ``held_out`` run on eval_vsi.py's seeded held-out set.

    Returns:
        ``{"sft": report path, "diffs": {(estimator, lr): [per-seed paired_overall_ci]}}``.
    """
    from a2c_ppo_acktr import reports

    jobs = []
    task_runs = [r for r in results if TASKS[r.spec.task].target == "held_out" and r.status == "ok"]
    if not task_runs:
        return {"sft": None, "diffs": {}}
    task = TASKS[task_runs[0].spec.task]  # one held_out task per call (parse_args)
    sft_dir = args.out / task.name / "sft_eval"
    jobs += sighted_and_twin(
        args,
        task,
        ["--adapter", str(task_adapter(args, task))],
        "sft",
        sft_dir,
        args.out / task.name / "sft_eval_zeroed",
    )
    for r in task_runs:
        d = r.spec.directory(args.out)
        jobs += sighted_and_twin(
            args,
            task,
            evaluated_policy(args, r.spec),
            f"{r.spec.estimator}-{r.spec.lr_label}-seed{r.spec.seed}",
            d / HELD_OUT_SIGHTED,
            d / HELD_OUT_ZEROED,
        )
    markers = run_all(jobs, args.jobs, args.rerun, lambda d: (d / "report.json").is_file())
    failed = [str(d) for d, m in markers.items() if m["returncode"] != 0]
    if failed:
        raise RuntimeError(f"held-out evaluation failed in {failed}; see bench.log there")
    sft = reports.load_report(sft_dir)
    diffs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in task_runs:
        r.eval_report = str(r.spec.directory(args.out) / HELD_OUT_SIGHTED / "report.json")
        ppo = reports.load_report(r.eval_report)
        diffs.setdefault((r.spec.estimator, r.spec.lr_label), []).append(
            {"seed": r.spec.seed, **reports.paired_overall_ci(ppo, sft, names=(ppo["name"], "sft"))}
        )
    return {"sft": str(sft_dir / "report.json"), "diffs": diffs}


SIGHTED, ZEROED = "eval_greedy", "eval_greedy_zeroed"  # per-run directories of the greedy evals
HELD_OUT_SIGHTED, HELD_OUT_ZEROED = "eval", "eval_zeroed"  # the same for the held_out (mix) task
ZEROED_SUFFIX = " (zeroed images)"


def sighted_and_twin(
    args: argparse.Namespace, task: Task, what: list[str], name: str, sighted: Path, zeroed: Path
) -> list[tuple[Path, list[str]]]:
    """Two greedy ``eval_vsi.py`` jobs on the task's held-out set: the policy, and its blind twin (the
    same prompts and tokens with every frame zeroed, ``--zero-images``)."""
    return [
        (sighted, eval_argv(args, task, what, name, sighted)),
        (zeroed, eval_argv(args, task, [*what, "--zero-images"], name + ZEROED_SUFFIX, zeroed)),
    ]


def evaluated_policy(args: argparse.Namespace, spec: RunSpec) -> list[str]:
    """The ``eval_vsi.py`` arguments naming the policy a run is judged by: its last checkpoint, or with
    ``--eval-policy best`` the policy its own validation kept (``log.val_interval``: greedy on
    ``log.val_episodes`` deals seeded apart from the held-out set), ``<run>/best/policy``."""
    d = spec.directory(args.out)
    if args.eval_policy == "best":
        best = d / BEST_DIR / "policy"
        if not best.is_dir():
            raise FileNotFoundError(
                f"{d} has no {BEST_DIR}/policy: --eval-policy best needs runs with validation "
                "(--extra log.val_interval=K); see its bench.log"
            )
        return ["--adapter", str(best)]
    ckpt = latest_checkpoint(d / "checkpoints")
    if ckpt is None:
        raise FileNotFoundError(f"{d} finished without a checkpoint; see its bench.log")
    return ["--checkpoint", str(ckpt)]


def greedy_eval_jobs(args: argparse.Namespace, runs: Sequence[RunResult]) -> list[tuple[Path, list[str]]]:
    """``(directory, eval_vsi.py command)`` evaluating each run's policy (:func:`evaluated_policy`)
    greedily into ``<run>/eval_greedy``, and its blind twin into ``<run>/eval_greedy_zeroed``."""
    jobs = []
    for r in runs:
        d = r.spec.directory(args.out)
        jobs += sighted_and_twin(
            args,
            TASKS[r.spec.task],
            evaluated_policy(args, r.spec),
            f"{r.spec.estimator}-{r.spec.lr_label}-seed{r.spec.seed}",
            d / SIGHTED,
            d / ZEROED,
        )
    return jobs


def twin_difference(sighted: Path, zeroed: Path) -> dict[str, Any]:
    """Sighted minus blind twin on the same questions (VSI Overall or game success, points), paired bootstrap 95% CI."""
    from a2c_ppo_acktr import reports

    a, b = reports.load_report(sighted), reports.load_report(zeroed)
    return reports.paired_overall_ci(a, b, names=(a.get("name", "sighted"), b.get("name", "zeroed")))


def blind_twin_lines(args: argparse.Namespace, runs: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Per (task, estimator, lr): each seed's sighted - blind twin difference with its CI, and in how
    many seeds that CI excludes 0 (a policy whose score a blind twin matches does not use the frames)."""
    groups: dict[tuple[str, str, str], list[tuple[int, dict[str, Any]]]] = {}
    for r in runs:
        d = r.spec.directory(args.out)
        sighted, zeroed = (
            (HELD_OUT_SIGHTED, HELD_OUT_ZEROED) if TASKS[r.spec.task].target == "held_out" else (SIGHTED, ZEROED)
        )
        groups.setdefault((r.spec.task, r.spec.estimator, r.spec.lr_label), []).append(
            (r.spec.seed, twin_difference(d / sighted, d / zeroed))
        )
    out = []
    for (task, estimator, lr), per_seed in sorted(groups.items()):
        above = sum(1 for _, c in per_seed if c["low"] > 0)
        cells = ", ".join(f"seed {s} {_fmt_paired(c)}" for s, c in per_seed)
        text = (
            f"{task} {estimator} {lr}: sighted - zeroed images, greedy on {args.eval_episodes} held-out: {cells}; CI "
            f"above 0 in {above} of {len(per_seed)} seed(s)"
        )
        out.append(
            {
                "task": task,
                "estimator": estimator,
                "lr": lr,
                "per_seed": {s: c for s, c in per_seed},
                "above_zero": above,
                "text": text,
            }
        )
    return out


def evaluate_greedy(
    args: argparse.Namespace, results: list[RunResult], best: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """``best_constant`` and ``beat_best_constant`` tasks: each finished run's last checkpoint answers the task's
    held-out
    questions (eval_vsi.py's seeded set, greedy), and the best constant answer (found on the training
    distribution) is scored on the very same questions. Sampled rollout scores pay for exploration; a
    constant answer does not: this is the like-for-like comparison.

    Returns:
        One line per (task, estimator, lr): ``{"task", "estimator", "lr", "scores", "ci", "constant", "met", "text"}``.
    """
    from a2c_ppo_acktr import reports
    from a2c_ppo_acktr.common.scoring import score_prediction

    runs = [
        r for r in results if TASKS[r.spec.task].target in ("best_constant", "beat_best_constant") and r.status == "ok"
    ]
    jobs = greedy_eval_jobs(args, runs)
    markers = run_all(jobs, args.jobs, args.rerun, lambda d: (d / "report.json").is_file())
    failed = [str(d) for d, m in markers.items() if m["returncode"] != 0]
    if failed:
        raise RuntimeError(f"greedy held-out evaluation failed in {failed}; see bench.log there")
    groups: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}
    for r in runs:
        report = reports.load_report(r.spec.directory(args.out) / SIGHTED)
        recs = report["records"]
        answer = best.get(r.spec.task, {}).get("answer")
        const = (
            float(np.mean([score_prediction(x["question_type"], f"{answer:.6g}", x["ground_truth"]) for x in recs]))
            if answer is not None
            else float("nan")
        )
        groups.setdefault((r.spec.task, r.spec.estimator, r.spec.lr_label), []).append(
            (float(report["overall"]) / 100.0, const, top_answer_share(recs))
        )
    out = []
    for (task, estimator, lr), triples in groups.items():
        scores = [p[0] for p in triples]
        shares = [p[2] for p in triples]
        const = triples[0][1]
        mean, half, n = _ci(scores)
        if TASKS[task].target == "best_constant":
            claim = "mean at least it"
            met = "n/a" if not math.isfinite(const) or n == 0 else ("yes" if mean >= const else "no")
        else:
            claim = "CI above it"
            met = (
                "n/a (needs 2+ seeds)"
                if n < 2 or not math.isfinite(const)
                else ("yes" if mean - half > const else "no")
            )
        text = (
            f"{task} {estimator} {lr}: greedy held-out {_fmt_ci((mean, half, n))} over {n} seed(s) "
            f"(per seed {', '.join(f'{v:.3f}' for v in scores)}) vs the best constant "
            f"{best.get(task, {}).get('answer')} scoring {const:.3f} on the same {args.eval_episodes} questions: "
            f"{claim}: {met}; "
            f"the most common answer is given to {', '.join(f'{v:.0%}' for v in shares)} of the questions"
            + (
                " (a near-constant policy: its score does not come from reading the question)"
                if min(shares) > 0.5
                else ""
            )
        )
        out.append(
            {
                "task": task,
                "estimator": estimator,
                "lr": lr,
                "scores": scores,
                "ci": (mean, half, n),
                "constant": const,
                "top_answer_share": shares,
                "met": met,
                "text": text,
            }
        )
    return out


def evaluate_games(args: argparse.Namespace, results: list[RunResult]) -> list[dict[str, Any]]:
    """``game_success`` tasks: each finished run's last checkpoint plays the held-out deals greedily
    (eval_vsi.py's seeded set, ``--eval-episodes``), and so does the task's SFT adapter. Runs and
    controls are paired by seed; the claim is that the mean run - control difference is above 0
    (its t interval over seeds).

    Returns:
        One line per (task, estimator): ``{"task", "estimator", "sft", "run", "control", "diff", "met", "text"}``.
    """
    from a2c_ppo_acktr import reports

    runs = [r for r in results if TASKS[r.spec.task].target == "game_success" and r.status == "ok"]
    jobs = []
    for name in sorted({r.spec.task for r in runs}):
        jobs += sighted_and_twin(
            args,
            TASKS[name],
            ["--adapter", str(task_adapter(args, TASKS[name]))],
            "sft",
            args.out / name / "sft_eval",
            args.out / name / "sft_eval_zeroed",
        )
    jobs += greedy_eval_jobs(args, runs)
    markers = run_all(jobs, args.jobs, args.rerun, lambda d: (d / "report.json").is_file())
    failed = [str(d) for d, m in markers.items() if m["returncode"] != 0]
    if failed:
        raise RuntimeError(f"greedy game evaluation failed in {failed}; see bench.log there")
    success = {d: reports.load_report(d)["agent"]["success_rate"] for d, _ in jobs}
    out = []
    for task, estimator in sorted({(r.spec.task, r.spec.estimator) for r in runs}):
        sft = success[args.out / task / "sft_eval"]
        by = {
            lr: {
                r.spec.seed: success[r.spec.directory(args.out) / SIGHTED]
                for r in runs
                if (r.spec.task, r.spec.estimator, r.spec.lr_label) == (task, estimator, lr)
            }
            for lr in ("run", "control", "temp_control")
        }
        seeds = sorted(set(by["run"]) & set(by["control"]))
        run_ci, control_ci = _ci(list(by["run"].values())), _ci(list(by["control"].values()))
        diff_ci = _ci([by["run"][s] - by["control"][s] for s in seeds])
        met = "n/a (needs 2+ paired seeds)" if diff_ci[2] < 2 else ("yes" if diff_ci[0] - diff_ci[1] > 0 else "no")
        sft_twin = twin_difference(args.out / task / "sft_eval", args.out / task / "sft_eval_zeroed")
        # Per seed, the trained run against the SFT adapter it started from, on the same deals.
        sft_report = reports.load_report(args.out / task / "sft_eval")
        vs_sft = {
            r.spec.seed: reports.paired_overall_ci(
                reports.load_report(r.spec.directory(args.out) / SIGHTED), sft_report, names=("run", "sft")
            )
            for r in runs
            if (r.spec.task, r.spec.estimator, r.spec.lr_label) == (task, estimator, "run")
        }
        above_sft = sum(1 for c in vs_sft.values() if c["low"] > 0)
        level = TASKS[task].level
        level_met = None if level is None or not by["run"] else sum(1 for v in by["run"].values() if v >= level)
        text = (
            f"{task} {estimator}: greedy success on {args.eval_episodes} held-out deals: runs {_fmt_ci(run_ci)} "
            f"(per seed {', '.join(f'{v:.2f}' for v in by['run'].values())}), controls {_fmt_ci(control_ci)} "
            f"(per seed {', '.join(f'{v:.2f}' for v in by['control'].values())}), SFT adapter {sft:.2f} "
            f"(minus its zeroed-image twin {_fmt_paired(sft_twin)} points); "
            f"run - control {_fmt_ci(diff_ci)} over {diff_ci[2]} paired seed(s): above 0: {met}; "
            f"run - SFT per seed {', '.join(_fmt_paired(c) for c in vs_sft.values())} points, "
            f"CI above 0 in {above_sft} of {len(vs_sft)} seed(s)"
            + (
                f"; greedy success >= {level:.2f} in {level_met} of {len(by['run'])} seed(s)"
                if level_met is not None
                else ""
            )
            + (
                f"; temperature-only controls {_fmt_ci(_ci(list(by['temp_control'].values())))} "
                f"(per seed {', '.join(f'{v:.2f}' for v in by['temp_control'].values())})"
                if by["temp_control"]
                else ""
            )
        )
        out.append(
            {
                "task": task,
                "estimator": estimator,
                "sft": sft,
                "sft_twin": sft_twin,
                "run": by["run"],
                "control": by["control"],
                "temp_control": by["temp_control"],
                "vs_sft": vs_sft,
                "vs_sft_above_zero": above_sft,
                "level_met": level_met,
                "diff": diff_ci,
                "met": met,
                "text": text,
            }
        )
    return out


def top_answer_share(records: Sequence[dict[str, Any]]) -> float:
    """Fraction of the questions given the most common answer (no answer counts as one answer)."""
    from collections import Counter

    answers = Counter(str(r.get("answer")) for r in records)
    return max(answers.values()) / max(1, len(records)) if records else float("nan")


def plot_curves(
    results: Sequence[RunResult], tasks: Sequence[str], estimators: Sequence[str], path: Path, levels: dict[str, float]
) -> Path:
    """Training score per iteration: one panel per task; per estimator the mean over seeds, CI shaded, controls
    dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = min(2, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fig = Figure(figsize=(6 * ncols, 4 * nrows), dpi=100)
    FigureCanvasAgg(fig)
    for p, task in enumerate(tasks):
        ax = fig.add_subplot(nrows, ncols, p + 1)
        for e, estimator in enumerate(estimators):
            for label, style in (("run", "-"), ("control", "--"), ("temp_control", ":")):
                control = label != "run"
                curves = [
                    series(r.rows, SCORE_KEY)
                    for r in results
                    if r.status == "ok" and (r.spec.task, r.spec.estimator, r.spec.lr_label) == (task, estimator, label)
                ]
                if not curves:
                    continue
                length = min(len(c) for c in curves)
                grid = np.stack([c[:length] for c in curves])
                x = np.arange(1, length + 1)
                cis = [_ci(grid[:, i]) for i in range(length)]
                mean = np.array([c[0] for c in cis])
                half = np.array([c[1] for c in cis])
                colour = f"C{e}"
                ax.plot(
                    x,
                    mean,
                    color=colour,
                    linestyle=style,
                    linewidth=1.2,
                    label=f"{estimator} ({label}, {len(curves)} seeds)",
                )
                if np.isfinite(half).any():
                    ax.fill_between(
                        x, mean - half, mean + half, color=colour, alpha=0.08 if control else 0.2, linewidth=0
                    )
        if task in levels:
            ax.axhline(levels[task], color="grey", linewidth=0.8, linestyle=":", label=f"target {levels[task]:.3f}")
        ax.set_title(task, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.set_ylabel("episode score", fontsize=8)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tasks",
        nargs="+",
        default=[t for t, task in TASKS.items() if task.env_config is None],
        choices=list(TASKS),
        help="default: the VSI tasks; the game tasks (numberline, minigrid_empty) need their quickstart's adapter",
    )
    p.add_argument("--estimators", nargs="+", default=list(ESTIMATOR_OVERRIDES), choices=list(ESTIMATOR_OVERRIDES))
    p.add_argument("--seeds", type=int, default=3, help="seeds per configuration (1..N)")
    p.add_argument("--iterations", type=int, default=100, help="PPO iterations per run (ppo.num_iterations)")
    p.add_argument("--no-controls", action="store_true", help=f"skip the ppo.lr={CONTROL_LR} control of every run")
    p.add_argument(
        "--temperature-controls",
        action="store_true",
        help=f"also run a temperature-only control per run: ppo.lr={CONTROL_LR} "
        "with the heads trained at the run's rate",
    )
    p.add_argument("--jobs", type=int, default=1, help="training processes at a time (2 fill a 2-core machine)")
    # The VSI tasks start from the adapter of the quickstart's mix block (all question types, the default build):
    # the default quickstart's VSI adapter is trained on the room-reading build, for room size alone.
    p.add_argument("--sft-adapter", type=Path, default=Path("outputs/quickstart_mix/sft/adapter"))
    p.add_argument("--model-path", type=Path, default=Path("outputs/quickstart/model"))
    p.add_argument(
        "--adapter",
        dest="adapters",
        nargs="+",
        default=[],
        metavar="TASK=PATH",
        help="SFT adapter of a task instead of its default (game tasks: outputs/quickstart_<task>/sft/adapter)",
    )
    p.add_argument(
        "--best-constant",
        nargs="+",
        default=[],
        metavar="TASK=SCORE",
        help="score of the best constant answer of a task, instead of finding it on the training distribution",
    )
    p.add_argument("--eval-episodes", type=int, default=100, help="held-out questions of the mix task's evaluations")
    p.add_argument(
        "--eval-policy",
        choices=("last", "best"),
        default="last",
        help="the policy the greedy evaluations judge: each run's last checkpoint, or the one its validation kept "
        "(best/policy; needs --extra log.val_interval=K)",
    )
    p.add_argument("--out", type=Path, default=Path("outputs/bench_learning"))
    p.add_argument("--rerun", action="store_true", help="train and evaluate again even where a complete run exists")
    p.add_argument(
        "--extra", nargs="+", default=[], metavar="section.key=value", help="overrides appended to every run"
    )
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, checked: inputs exist, counts are positive, ``--best-constant`` parsed into a dict."""
    parser = build_parser()
    args = parser.parse_args(argv)
    adapters: dict[str, Path] = {}
    for item in args.adapters:
        name, _, value = item.partition("=")
        if name not in TASKS or not value:
            parser.error(f"--adapter takes TASK=PATH with TASK in {list(TASKS)}, got {item!r}")
        adapters[name] = Path(value).resolve()
    args.adapters = adapters
    args.out, args.sft_adapter, args.model_path = (
        args.out.resolve(),
        args.sft_adapter.resolve(),
        args.model_path.resolve(),
    )
    needed = [(args.model_path, "tiny model")]
    needed += [
        (task_adapter(args, TASKS[name]), f"SFT adapter of task {name}")
        for name in args.tasks
        if not builds_adapter(args, TASKS[name])
    ]
    for path, what in needed:
        if not path.exists():
            parser.error(
                f"the {what} {str(path)!r} does not exist; run `bash scripts/quickstart.sh` first "
                "(the VSI tasks: `VSI_BLOCK=mix bash scripts/quickstart.sh outputs/quickstart_mix`; "
                "a game task: `ENV_CONFIG=configs/envs/<env>.yaml bash scripts/quickstart.sh "
                "outputs/quickstart_<task>`; "
                "or pass --sft-adapter/--adapter/--model-path)"
            )
    if args.seeds < 1 or args.iterations < 1 or args.jobs < 1:
        parser.error("--seeds, --iterations and --jobs must be >= 1")
    held_out = sorted({name for name in args.tasks if TASKS[name].target == "held_out"})
    if len(held_out) > 1:  # evaluate_held_out keeps one set of per-seed differences
        parser.error(f"held-out tasks {held_out} share one set of per-seed differences; run them one --tasks at a time")
    given: dict[str, float] = {}
    for item in args.best_constant:
        name, _, value = item.partition("=")
        if name not in TASKS or not value:
            parser.error(f"--best-constant takes TASK=SCORE with TASK in {list(TASKS)}, got {item!r}")
        given[name] = float(value)
    args.best_constant = given
    return args


def find_best_constants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Score (and answer) of the best constant answer of every task whose target needs one."""
    best: dict[str, dict[str, Any]] = {}
    for name in args.tasks:
        task = TASKS[name]
        if task.target not in ("best_constant", "beat_best_constant"):
            continue
        if name in args.best_constant:
            best[name] = {"score": args.best_constant[name], "answer": None, "source": "--best-constant"}
            continue
        qtype, truths = training_ground_truths([*COMMON_OVERRIDES, *task.overrides, *args.extra])
        answer, score = best_constant(qtype, truths)
        best[name] = {"score": score, "answer": answer, "source": f"training distribution, {len(truths)} questions"}
    return best


def train_all(args: argparse.Namespace) -> list[RunResult]:
    """Train (or reuse) every run of the suite and read what each left."""
    from a2c_ppo_acktr.run.logger import read_metrics

    controls = (False,) if args.no_controls else (False, True)
    specs = [
        RunSpec(t, e, s, c)
        for t in args.tasks
        for e in args.estimators
        for c in controls
        for s in range(1, args.seeds + 1)
    ]
    if args.temperature_controls:
        specs += [
            RunSpec(t, e, s, True, temperature_only=True)
            for t in args.tasks
            for e in args.estimators
            for s in range(1, args.seeds + 1)
        ]
    markers = run_all(
        [(s.directory(args.out), train_argv(s, args)) for s in specs],
        args.jobs,
        args.rerun,
        lambda d: _metrics_complete(d, args.iterations),
    )
    results = []
    for s in specs:
        d = s.directory(args.out)
        ok = markers[d]["returncode"] == 0 and _metrics_complete(d, args.iterations)
        results.append(
            RunResult(
                s,
                "ok" if ok else "failed",
                read_metrics(d / "metrics.jsonl") if ok else [],
                markers[d]["wall_s"],
                str(d / "bench.log"),
            )
        )
    return results


def all_targets(groups: Sequence[dict[str, Any]], best: dict[str, dict[str, Any]], held: dict[str, Any]):
    """``(target cells by (task, estimator, lr), held-out summaries by (estimator, lr))``.

    Trained groups get their task's target; a held-out control gets its control - SFT difference
    (a null check: it should straddle 0).
    """
    targets: dict[tuple[str, str, str], tuple[str, str]] = {}
    held_rows: dict[tuple[str, str], dict[str, Any]] = {}
    for g in groups:
        task = TASKS[g["task"]]
        summary = (
            held_out_summary(held["diffs"].get((g["estimator"], g["lr"]), [])) if task.target == "held_out" else None
        )
        if summary is not None:
            held_rows[(g["estimator"], g["lr"])] = summary
        if g["lr"] == "run":
            targets[(g["task"], g["estimator"], g["lr"])] = target_cell(
                task, g, best.get(g["task"], {}).get("score"), summary
            )
        elif summary is not None and summary["n"]:
            targets[(g["task"], g["estimator"], g["lr"])] = (f"control - SFT: {summary['text']}", "-")
    return targets, held_rows


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run the suite (see the module docstring); returns what ``bench_learning.json`` holds."""
    args = parse_args(argv)
    best = find_best_constants(args)
    build_task_adapters(args)
    results = train_all(args)
    held = evaluate_held_out(args, results)
    greedy = evaluate_greedy(args, results, best)
    games = evaluate_games(args, results)
    twins = blind_twin_lines(
        args, [r for r in results if r.status == "ok" and TASKS[r.spec.task].target in GREEDY_TARGETS]
    )
    groups = summarize(results)
    targets, held_rows = all_targets(groups, best, held)

    machine = (
        f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.platform()}, python "
        f"{platform.python_version()}"
    )
    md = [
        f"# Learning benchmark ({args.iterations} iterations, seeds 1..{args.seeds}, preset {PRESET})",
        "",
        table_markdown(groups, targets),
        "",
        *[f"Greedy held-out: {g['text']}" for g in greedy],
        *[f"Game: {g['text']}" for g in games],
        *[f"Held-out: {line}" for line in held_out_lines(args, held)],
        *[f"Blind twin: {t['text']}" for t in twins],
        "",
        "Best constant answers: "
        + (", ".join(f"{k}: {v['score']:.3f} (answer {v['answer']}, {v['source']})" for k, v in best.items()) or "n/a"),
        f"Machine: {machine}",
        f"Common overrides: {' '.join(COMMON_OVERRIDES)} {' '.join(args.extra)}".rstrip(),
    ]
    failed = [r for r in results if r.status != "ok"]
    if failed:
        md.append(f"Failed runs ({len(failed)}): " + ", ".join(r.log for r in failed))
    text = "\n".join(md) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_learning.md").write_text(text, encoding="utf-8")
    levels = {t: TASKS[t].level for t in args.tasks if TASKS[t].level is not None}
    levels.update({t: v["score"] for t, v in best.items()})
    png = plot_curves(results, args.tasks, args.estimators, args.out / "bench_learning.png", levels)
    summary = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": machine,
        "best_constant": best,
        "groups": groups,
        "greedy_held_out": greedy,
        "games": [{**g, "diff": list(g["diff"])} for g in games],
        "blind_twin": twins,
        "targets": {"/".join(k): list(v) for k, v in targets.items()},
        "held_out": {
            "sft_report": held["sft"],
            "per_seed": {"/".join(k): v for k, v in held["diffs"].items()},
            "summary": {"/".join(k): v for k, v in held_rows.items()},
        },
        "runs": [
            {
                **asdict(r.spec),
                "status": r.status,
                "wall_s": r.wall_s,
                "log": r.log,
                "eval_report": r.eval_report,
                "first": window_mean(series(r.rows, SCORE_KEY), first=FIRST),
                "last": window_mean(series(r.rows, SCORE_KEY), last=LAST),
                "diverged": diverged(r.rows),
                "last_diagnostics": {k: window_mean(series(r.rows, k), last=LAST) for k in DIAGNOSTIC_KEYS},
                "score_curve": series(r.rows, SCORE_KEY).tolist(),
            }
            for r in results
        ],
    }
    from a2c_ppo_acktr.reports import write_json

    write_json(summary, args.out / "bench_learning.json")
    print(f"written: {args.out / 'bench_learning.md'}, {args.out / 'bench_learning.json'}, {png}")
    return summary


if __name__ == "__main__":
    main()
