"""Validation during PPO (``log.val_interval``) and the ``best`` policy kept by validation score.

Every ``log.val_interval`` iterations the policy answers ``log.val_episodes`` fixed questions
greedily: the evaluation's own question set (:func:`~a2c_ppo_acktr.eval.evaluation.eval_specs`: the
deals of a game env, or for VSI :func:`~a2c_ppo_acktr.eval.evaluation.procedural_specs`, the
question types of ``env.question_types`` in turn) in procedural scenes seeded from ``log.val_seed``,
apart from the training scenes and from the eval set, with the training env's settings (image size,
turns, frames). The same questions every time, so validation scores of a run are comparable with
each other; they are never the test questions of ``eval_vsi.py``.

With several processes each evaluates every P-th question and the scores are gathered; under ZeRO-3
the weights are gathered once for the whole validation (:func:`gathered_for_rollout`), so the
processes' different numbers of forwards do not hang. Validation draws no random number from the
run's streams (greedy decoding, seeded envs) and is wrapped in an RNG snapshot anyway, so a run with
validation trains exactly as the same run without it.

The best policy (highest ``val/score``; the earlier iteration on ties) is written to
``output_dir/best``: ``policy/`` (what ``eval_vsi.py --adapter`` loads) and ``val.json`` (score,
iteration, per-type scores), replaced atomically. The best score so far travels in every checkpoint,
so a resumed run keeps comparing against it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

import numpy as np

from a2c_ppo_acktr.config.arguments import RunConfig
from a2c_ppo_acktr.common.atomic import publish_dir
from a2c_ppo_acktr.run.checkpoint import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)

BEST_DIR = "best"
BEST_FILE = "val.json"


def validation_config(cfg: RunConfig) -> RunConfig:
    """The config whose procedural question set is the validation set (``eval.seed = log.val_seed``,
    ``eval.num_episodes = log.val_episodes``, greedy) on procedural scenes with the training env's
    settings."""
    env = dataclasses.replace(cfg.env, scene_source="procedural", scene_seed=cfg.log.val_seed)
    ev = dataclasses.replace(cfg.eval, seed=cfg.log.val_seed, num_episodes=cfg.log.val_episodes, greedy=True)
    log = dataclasses.replace(cfg.log, val_interval=0)  # this config is the validation set itself
    return dataclasses.replace(cfg, env=env, eval=ev, log=log)


def run_validation(
    module: Any,
    cfg: RunConfig,
    rank: int = 0,
    num_processes: int = 1,
    gather_lists: Callable[[list], list] = lambda items: list(items),
    gather_weights: Callable[[], ContextManager] = contextlib.nullcontext,
    picture_dir: Optional[Path] = None,
) -> dict[str, Any]:
    """Answer the validation questions with ``module`` (a :class:`~a2c_ppo_acktr.policy.model.VLMPolicy`).

    Args:
        picture_dir: Where to draw the trajectory picture of this process's first question (for
            the run's logger); None draws none.

    Returns:
        ``{"score", "valid_rate", "answered", "episodes", "seconds", "per_type"}`` over all processes,
        plus this process's ``records`` (:class:`~a2c_ppo_acktr.reports.EpisodeRecord`) and
        ``pictures`` (paths), which are not JSON: drop them before writing the result.
    """
    from a2c_ppo_acktr.eval.evaluation import PolicyAgent, eval_specs, run_episodes

    vcfg = validation_config(cfg)
    specs = eval_specs(vcfg)[rank::num_processes]
    rng = capture_rng_state()
    t0 = time.perf_counter()
    was_training = module.training
    module.eval()
    try:
        with gather_weights():
            result = run_episodes(
                PolicyAgent(module, greedy=True),
                specs,
                vcfg.env,
                vcfg.eval.batch_size,
                progress=False,
                picture_dir=picture_dir,
                num_pictures=int(picture_dir is not None),
            )
    finally:
        module.train(was_training)
        restore_rng_state(rng)
    mine = [
        (r.episode_id, r.question_type, float(r.score), r.turns, r.num_invalid, r.answer is not None)
        for r in result.records
    ]
    rows = sorted(gather_lists(mine))
    if not rows:
        raise RuntimeError(f"validation answered no question ({len(result.skipped)} skipped); check env.question_types")
    per_type: dict[str, list[float]] = defaultdict(list)
    for _, qtype, score, *_ in rows:
        per_type[qtype].append(score)
    turns = sum(r[3] for r in rows)
    return {
        "score": float(np.mean([r[2] for r in rows])),
        "valid_rate": 1.0 - sum(r[4] for r in rows) / max(turns, 1),
        "answered": float(np.mean([r[5] for r in rows])),
        "episodes": len(rows),
        "seconds": time.perf_counter() - t0,
        "per_type": {k: float(np.mean(v)) for k, v in sorted(per_type.items())},
        "records": result.records,
        "pictures": result.pictures,
    }


class BestPolicy:
    """Keeps ``output_dir/best`` at the policy with the highest validation score so far.

    Args:
        output_dir: the run directory.
        is_main: only the main process writes.
    """

    def __init__(self, output_dir: str | Path, is_main: bool = True) -> None:
        self.dir = Path(output_dir) / BEST_DIR
        self.is_main = is_main
        self.score: Optional[float] = None
        self.iteration: Optional[int] = None

    def state(self) -> dict[str, Any]:
        return {"score": self.score, "iteration": self.iteration}

    def load_state(self, state: Optional[dict[str, Any]]) -> None:
        state = state or {}
        self.score, self.iteration = state.get("score"), state.get("iteration")

    def is_better(self, score: float) -> bool:
        return self.score is None or score > self.score

    def update(self, iteration: int, result: dict[str, Any], save_policy: Callable[[Path], None]) -> bool:
        """Publish ``save_policy``'s export as the best policy when ``result`` beats the best so far.

        ``save_policy(dir)`` is called on every process when the policy is better (under ZeRO-3 the
        export gathers the weights: a collective); only the main process publishes. Returns whether
        the policy became the best.
        """
        if not self.is_better(result["score"]):
            return False
        self.score, self.iteration = float(result["score"]), int(iteration)
        tmp = self.dir.parent / f".tmp-{BEST_DIR}"
        if self.is_main:
            import shutil

            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        save_policy(tmp / "policy")
        if self.is_main:
            info = {"iteration": int(iteration), **{k: v for k, v in result.items() if k != "seconds"}}
            (tmp / BEST_FILE).write_text(json.dumps(info, indent=1, sort_keys=True), encoding="utf-8")
            publish_dir(tmp, self.dir)
            logger.info(
                "iteration %d: validation score %.4f is the best so far; policy written to %s",
                iteration,
                self.score,
                self.dir,
            )
        return True


def read_best(output_dir: str | Path) -> dict[str, Any]:
    """``val.json`` of a run's best policy.

    Raises:
        FileNotFoundError: the run kept no best policy (validation off, or no validation yet).
    """
    path = Path(output_dir) / BEST_DIR / BEST_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; the run keeps a best policy only with log.val_interval > 0")
    return json.loads(path.read_text(encoding="utf-8"))
