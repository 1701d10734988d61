"""Run logging: ``metrics.jsonl`` (always), tensorboard and wandb (optional, imported lazily).

Metrics are flat dicts with namespaced keys (``charts/``, ``losses/``, ``rollout/``, ``time/``,
``debug/``), one dict per iteration. Only the main process writes; other processes get a logger whose
methods do nothing, so the training loop needs no ``if is_main`` around every call.

Beside scalars, :meth:`RunLogger.log_images` and :meth:`RunLogger.log_text_table` send pictures (e.g.
a trajectory picture) and tables (question, reply, reward) to tensorboard (``add_image``, ``add_text``
with a markdown table) and wandb (``wandb.Image``, ``wandb.Table``); ``metrics.jsonl`` keeps numbers only.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from a2c_ppo_acktr.config.arguments import RunConfig
from a2c_ppo_acktr.common.atomic import open_atomic
from a2c_ppo_acktr.common.errors import UserError
from a2c_ppo_acktr.common.jsonl import read_log
from a2c_ppo_acktr.run.rundir import confirm_lock

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class MetricsFileError(RuntimeError, UserError):
    """``metrics.jsonl`` is not a file, or writing it failed (a full disk, a quota, permissions)."""


def check_metrics_file(path: str | os.PathLike) -> None:
    """Refuse a ``metrics.jsonl`` path that holds something other than a file (a directory).

    Raises:
        MetricsFileError: naming the path and the fix.
    """
    path = Path(path)
    if os.path.lexists(path) and not path.is_file():
        raise MetricsFileError(
            f"{path} is not a file (a directory?); a run appends its metrics there: move it away, then run again"
        )


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a training ``metrics.jsonl`` (one JSON object per logged iteration), in order.

    A torn last line (a run killed while writing it, or a live run mid-write) is ignored with a
    warning (:func:`a2c_ppo_acktr.common.jsonl.read_log`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a line other than the last is not a JSON object (naming its line number).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"metrics file {str(path)!r} does not exist; pass the metrics.jsonl a training run wrote"
        )
    return read_log(path, fix="metrics.jsonl holds one JSON object per line")


def _json_value(v: Any) -> Any:
    # JSON has no NaN/inf; keep them readable and round-trippable as strings.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def _md_cell(value: Any) -> str:
    # One line, no pipe or backtick breaking the table (tensorboard renders the text as markdown).
    return " ".join(str(value).split()).replace("|", "\\|").replace("`", "'")


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``columns`` and ``rows`` as a markdown table (what :meth:`RunLogger.log_text_table` sends to tensorboard)."""
    lines = ["| " + " | ".join(_md_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


class RunLogger:
    """Writes one row per iteration to ``metrics.jsonl``, tensorboard and wandb.

    Args:
        cfg: the resolved run config (logged as the wandb config and tensorboard text).
        output_dir: run directory; ``metrics.jsonl`` and ``tensorboard/`` go here, wandb under ``wandb/``.
        is_main: only the main process writes anything.
        start_iteration: iterations already done (resume). Rows of ``metrics.jsonl`` and tensorboard
            events past it are dropped: a run that crashed after its last checkpoint logged
            iterations that the resumed run will redo.
        wandb_run_id: id of the wandb run to continue (from the checkpoint), or None for a new run.
    """

    def __init__(
        self,
        cfg: RunConfig,
        output_dir: str | os.PathLike,
        is_main: bool = True,
        start_iteration: int = 0,
        wandb_run_id: Optional[str] = None,
    ):
        self.cfg = cfg
        self.output_dir = Path(output_dir)
        self.is_main = is_main
        self.metrics_path = self.output_dir / METRICS_FILE
        self._tb = None
        self._wandb_run = None
        self.wandb_run_id: Optional[str] = wandb_run_id
        if not is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        check_metrics_file(self.metrics_path)
        self._truncate_metrics(start_iteration)
        if cfg.log.tensorboard:
            # Lazy: tensorboard's import is slow and the package is optional for users of jsonl only.
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a crashed run wrote past the checkpoint we resume from.
            self._tb = SummaryWriter(
                log_dir=str(self.output_dir / "tensorboard"),
                purge_step=start_iteration + 1 if start_iteration > 0 else None,
            )
            self._tb.add_text("config", "```\n" + cfg.to_yaml() + "\n```", global_step=0)
        if cfg.log.wandb_mode != "disabled":
            import wandb  # lazy: importing wandb is slow and starts nothing until init

            self._wandb_run = wandb.init(
                project=cfg.log.wandb_project,
                name=cfg.log.run_name,
                dir=str(self.output_dir),
                mode=cfg.log.wandb_mode,
                config=cfg.to_dict(),
                id=wandb_run_id,
                resume="allow" if wandb_run_id else None,
            )
            self.wandb_run_id = self._wandb_run.id

    def _set_aside_path(self) -> Path:
        """The first free ``metrics.jsonl.old-<k>``: rows set aside are never overwritten."""
        k = 1
        while os.path.lexists(candidate := self.metrics_path.with_name(f"{METRICS_FILE}.old-{k}")):
            k += 1
        return candidate

    def _truncate_metrics(self, start_iteration: int) -> None:
        """Rows of iterations this run redoes leave ``metrics.jsonl`` for a numbered
        ``metrics.jsonl.old-<k>`` (all of them for a fresh start in place, those after the
        checkpoint on resume: a crashed tail or an abandoned branch); nothing is deleted."""
        if not self.metrics_path.is_file():
            return
        confirm_lock(self.output_dir)  # nothing is moved in a directory another run has taken
        if start_iteration == 0:
            # A fresh run in a used directory: keep the old rows apart rather than mixing runs.
            aside = self._set_aside_path()
            os.replace(self.metrics_path, aside)
            logger.warning("the rows already in %s were moved to %s", self.metrics_path, aside)
            return
        rows = read_metrics(self.metrics_path)
        keep = [r for r in rows if r.get("iteration", 0) <= start_iteration]
        dropped = [r for r in rows if r.get("iteration", 0) > start_iteration]
        if dropped:
            aside = self._set_aside_path()
            with open(aside, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in dropped)
            logger.warning(
                "resuming at iteration %d: the %d later row(s) of %s were moved to %s",
                start_iteration,
                len(dropped),
                self.metrics_path,
                aside,
            )
        with open_atomic(self.metrics_path) as f:
            for r in keep:
                f.write(json.dumps(r) + "\n")

    def log(self, metrics: Mapping[str, Any], iteration: int) -> None:
        """Log one iteration's metrics (numbers; non-numbers go to jsonl only)."""
        if not self.is_main:
            return
        row = {"iteration": iteration, **{k: _json_value(v) for k, v in metrics.items()}}
        try:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:
            # A torn row the failed write may leave is dropped when the run resumes (read_log).
            raise MetricsFileError(
                f"writing iteration {iteration}'s row to {self.metrics_path} failed: {e.strerror or e}; free space or "
                "fix the directory's "
                "permissions, then continue with --resume auto (from the last checkpoint; later iterations are redone)"
            ) from e
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, global_step=iteration)
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(scalars, step=iteration)

    @property
    def wants_media(self) -> bool:
        """Whether images and tables go anywhere (tensorboard or wandb on, main process): callers
        skip drawing them otherwise."""
        return self._tb is not None or self._wandb_run is not None

    def log_images(self, tag: str, images: Sequence[np.ndarray], step: int) -> None:
        """Log pictures (``uint8`` RGB arrays, ``(H, W, 3)``) under ``tag`` at ``step``.

        Tensorboard gets one image per tag (``tag/0``, ``tag/1``, ... when there are several, since
        their sizes may differ); wandb gets the list under ``tag``.
        """
        if not self.wants_media or not images:
            return
        arrays = [np.ascontiguousarray(np.asarray(im, dtype=np.uint8)) for im in images]
        for im in arrays:
            if im.ndim != 3 or im.shape[2] != 3:
                raise ValueError(f"log_images({tag!r}) takes (H, W, 3) uint8 RGB arrays, got shape {im.shape}")
        if self._tb is not None:
            for i, im in enumerate(arrays):
                self._tb.add_image(tag if len(arrays) == 1 else f"{tag}/{i}", im, global_step=step, dataformats="HWC")
            self._tb.flush()
        if self._wandb_run is not None:
            import wandb

            self._wandb_run.log({tag: [wandb.Image(im) for im in arrays]}, step=step)

    def log_text_table(self, tag: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        """Log a table (e.g. question, reply, reward per episode) under ``tag`` at ``step``.

        Tensorboard gets it as a markdown table (``add_text``; cells on one line, pipes escaped);
        wandb as a ``wandb.Table``.
        """
        if not self.wants_media:
            return
        columns = [str(c) for c in columns]
        for row in rows:
            if len(row) != len(columns):
                raise ValueError(
                    f"log_text_table({tag!r}): a row has {len(row)} cells for {len(columns)} columns {columns}"
                )
        if self._tb is not None:
            self._tb.add_text(tag, markdown_table(columns, rows), global_step=step)
            self._tb.flush()
        if self._wandb_run is not None:
            import wandb

            self._wandb_run.log({tag: wandb.Table(columns=columns, data=[list(r) for r in rows])}, step=step)

    def close(self) -> None:
        """Flush and close the sinks (idempotent)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None
