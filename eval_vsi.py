"""Evaluate a VLM agent on VSI-Bench-style questions and write the benchmark's reports.

    python eval_vsi.py MODE [options]

Modes (the first word; the flags in brackets are the same and still accepted):
  policy --model-path PATH [--adapter DIR]   a base model (or model.model_path from the config),
                               optionally with an SFT LoRA adapter  [no mode word]
  policy --checkpoint DIR      a PPO checkpoint of main_vsi.py (adapter and heads)  [no mode word]
  oracle                       the privileged oracle teacher  [--oracle]
  dummy                        uniformly random legal actions  [--dummy]
  video --vsibench ROWS --video-root VIDEOS --model-path PATH   the benchmark's own video protocol
                               [--protocol video]
  score PREDS.jsonl            score ready-made predictions (no model, no env)  [--score-file PREDS.jsonl]
  compare A/report.json B/report.json ...   side-by-side table and bar chart  [--compare ...]
      [--paired A B]           ... plus Overall(A) - Overall(B) on the same questions with a paired
                               bootstrap 95% interval (A, B: row names; repeat for more pairs)
  curves METRICS.jsonl         learning curves of a training run only  [--metrics METRICS.jsonl]
Questions: the fixed procedural set (eval.num_episodes, eval.seed), or VSI-Bench rows with
--vsibench ROWS --data-root SCANS. --blind withholds images; --zero-images keeps the prompt and
zeroes every frame (the blind twin of a trained policy). --metrics PATH adds learning curves
(--smooth W draws an exponential moving average over them).
Protocol: --protocol interactive (default) re-renders each scan and lets the agent move; --protocol
video is the benchmark's own on its videos: --vsibench ROWS --video-root VIDEOS (<dataset>/<scene>.mp4),
N frames per video (--num-frames, --frame-sampling; default the reference's for the model family),
the reference prompt, greedy decoding of 16 tokens in batches (--batch-size); it also writes
records.jsonl, which --score-file scores to the same numbers (a2c_ppo_acktr/eval/video_protocol.py).
--prompt agent asks in this project's own answer turn instead (the frames as the agent's views, its
JSON reply read by the training parser, scored by the same rule; a move or unreadable reply scores 0).
Any config key can be overridden: --eval.num_episodes 20, env.image_size=64, --preset cpu-demo
(every key is listed at the end of this help). A --checkpoint is evaluated on the env of the run
that wrote it (its config.yaml) and with its model settings (and its ppo/rollout sections, which an
evaluation does not read, so that they agree with that model); --preset/--config/--env.* change the
env, and each field they change relative to the checkpoint's is logged in one warning.

Examples:
  python eval_vsi.py dummy --preset cpu-demo --out outputs/eval/dummy
  python eval_vsi.py policy --model-path Qwen/Qwen2.5-VL-3B-Instruct --model.dtype bfloat16 --out outputs/eval/base
  python eval_vsi.py policy --checkpoint outputs/run/checkpoints/checkpoint-000010 --out outputs/eval/ppo
  python eval_vsi.py video --vsibench test.parquet --video-root VIDEOS --model-path Qwen/Qwen2.5-VL-3B-Instruct --out
  outputs/eval/video
  python eval_vsi.py video --vsibench test.parquet --video-root VIDEOS --checkpoint CKPT --prompt agent --out
  outputs/eval/video-agent
  python eval_vsi.py score preds.jsonl --out outputs/eval/preds
  python eval_vsi.py compare outputs/eval/*/report.json --out outputs/eval
  python eval_vsi.py compare outputs/eval/{sft,ppo}/report.json --names sft ppo --paired ppo sft --out outputs/eval
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from a2c_ppo_acktr.config.cli import check_flag_typos, config_parser, exit_if_print_config


def build_parser() -> argparse.ArgumentParser:
    """The command line (config overrides are the unknown ``--section.key`` arguments)."""
    p = config_parser(__doc__)
    p.usage = (
        "eval_vsi.py [policy | oracle | dummy | video | score PREDS.jsonl | compare REPORT... | curves METRICS.jsonl] "
        "[options]"
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--checkpoint", default=None, help="PPO checkpoint directory written by main_vsi.py")
    what.add_argument("--oracle", action="store_true", help="evaluate the privileged oracle teacher (upper reference)")
    what.add_argument("--dummy", action="store_true", help="evaluate uniformly random legal actions (chance reference)")
    what.add_argument(
        "--score-file", default=None, help="JSONL of {question_type, prediction, ground_truth[, id]} to score"
    )
    what.add_argument(
        "--compare", nargs="+", default=None, metavar="REPORT", help="report.json files to put side by side"
    )
    p.add_argument(
        "--model-path", default=None, help="base model (HF id, local dir or tiny:<family>); sets model.model_path"
    )
    p.add_argument("--adapter", default=None, help="SFT LoRA adapter directory loaded on top of the base model")
    p.add_argument(
        "--vsibench", default=None, help="VSI-Bench rows (parquet/JSON): evaluate them instead of procedural questions"
    )
    p.add_argument("--data-root", default=None, help="directory with the scans of the VSI-Bench rows")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N VSI-Bench rows")
    p.add_argument(
        "--protocol",
        choices=("interactive", "video"),
        default="interactive",
        help="interactive: re-render the scans and let the agent move; "
        "video: the benchmark's own protocol on its videos",
    )
    p.add_argument(
        "--video-root", default=None, help="--protocol video: directory of the videos (<dataset>/<scene_name>.mp4)"
    )
    p.add_argument(
        "--num-frames", type=int, default=None, help="--protocol video: frames per video (default: the reference's, 32)"
    )
    p.add_argument(
        "--frame-sampling",
        default=None,
        metavar="NAME",
        help=(
            "--protocol video: which frames, a name of video_protocol.FRAME_SAMPLERS (default: the reference's for the "
            "model family)"
        ),
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="--protocol video: questions per generate call (default eval.batch_size)",
    )
    p.add_argument(
        "--prompt",
        default=None,
        metavar="{reference,agent}",
        help="--protocol video: reference, the benchmark's prompt (default); "
        "agent, this project's answer turn and reply "
        "format, the frames as the agent's views, its JSON reply read by the training parser (a move or unreadable "
        "reply scores 0)",
    )
    p.add_argument("--blind", action="store_true", help="withhold images (sets eval.blind): answers from text alone")
    p.add_argument(
        "--zero-images",
        action="store_true",
        help="the blind twin (sets eval.zero_images): the same prompts and tokens with every frame zeroed; "
        "compare it with the sighted row (--paired) to see what the pixels add",
    )
    p.add_argument(
        "--scoring-rule",
        default=None,
        choices=["thinking-in-space", "lmms-eval-0.7"],
        help="how numerical answers are read (sets env.scoring_rule): thinking-in-space, the reference's first word "
        "(default), or lmms-eval-0.7, the first number anywhere, digits or English words; multiple choice is the same",
    )
    p.add_argument("--metrics", default=None, help="training metrics.jsonl: also write learning_curves.png")
    p.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        metavar="W",
        help=(
            "with --metrics: draw an exponential moving average of weight W in [0, 1) over each raw curve (0 = raw "
            "only; 0.6 mild, 0.9 strong)"
        ),
    )
    p.add_argument("--name", default=None, help="row name in tables (default: what was evaluated)")
    p.add_argument("--names", nargs="+", default=None, help="row names for --compare, one per report")
    p.add_argument(
        "--paired",
        nargs=2,
        action="append",
        default=None,
        metavar=("A", "B"),
        help="with --compare: Overall(A) - Overall(B) with a paired bootstrap 95%% interval; A and B are row names "
        "evaluated on the same questions (repeatable)",
    )
    p.add_argument(
        "--best-constant",
        action="store_true",
        help="with --compare: add the row 'best constant (hindsight)', each question type's one answer that scores "
        "best on the first VSI report's questions (--paired may name it)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="output directory for the reports (required, except with --print-config); "
        "a directory that holds an earlier report is refused unless --overwrite",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="move an --out holding an earlier report aside to OUT.old-<time> first (nothing is deleted)",
    )
    return p


# A mode word -> the flags it stands for, and what must follow it (its operands become the flag's),
# as (what, example) for the message when they are missing.
MODES: dict[str, tuple[tuple[str, ...], Optional[tuple[str, str]]]] = {
    "policy": ((), None),
    "oracle": (("--oracle",), None),
    "dummy": (("--dummy",), None),
    "video": (("--protocol", "video"), None),
    "score": (("--score-file",), ("a file", "PREDS.jsonl")),
    "compare": (("--compare",), ("report.json files", "A/report.json B/report.json")),
    "curves": (("--metrics",), ("a file", "METRICS.jsonl")),
}


def expand_mode(argv: Sequence[str], parser: Optional[argparse.ArgumentParser] = None) -> list[str]:
    """``eval_vsi.py MODE ...`` as the flags it stands for (:data:`MODES`); a command line that
    starts with a flag is returned as it is, so the flag forms keep working. Errors go through
    ``parser`` (built here only when one is needed and none is given).

    Raises:
        SystemExit: an unknown first word, a mode word without its operands, or with its own flag's
            contrary (exit 2).
    """
    argv = list(argv)
    if not argv or argv[0].startswith("-"):
        return argv

    def fail(message: str) -> None:
        (parser or build_parser()).error(message)

    mode, rest = argv[0], argv[1:]
    if mode not in MODES:
        fail(f"unknown mode {mode!r}: the first word is one of {', '.join(MODES)}, or a flag (--help lists both)")
    if any(a in ("-h", "--help", "--help-all") or a.startswith("--help-section") for a in rest):
        return rest  # `eval_vsi.py compare --help`: the one help, which lists every mode
    flags, operands = MODES[mode]
    if mode == "policy" and (given := [f for f in ("--oracle", "--dummy", "--score-file", "--compare") if f in rest]):
        fail(
            f"the policy mode evaluates a model; {given[0]} is a mode of its own (eval_vsi.py "
            f"{given[0][2:].split('-')[0]} ...)"
        )
    if mode == "video" and "--protocol" in rest:
        fail("the video mode sets --protocol video itself; drop --protocol")
    if operands and (not rest or rest[0].startswith("-")):
        fail(f"{mode} takes {operands[0]} first: eval_vsi.py {mode} {operands[1]} --out DIR")
    return [*flags, *rest]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse the command line and run one evaluation (see the module docstring)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(expand_mode(sys.argv[1:] if argv is None else argv, parser))
    check_flag_typos(parser, extra)
    if not 0.0 <= args.smooth < 1.0:
        parser.error(f"--smooth={args.smooth} must be in [0, 1) (0 = raw curves, 0.9 = strong smoothing)")
    if args.smooth and not args.metrics:
        parser.error("--smooth smooths the learning curves of --metrics METRICS.jsonl; pass --metrics too")
    if args.paired and not args.compare:
        parser.error("--paired compares rows of a comparison: pass the reports with --compare too")
    if args.best_constant and not args.compare:
        parser.error("--best-constant adds a row to a comparison: pass the reports with --compare too")
    if args.out is None and not args.print_config:
        parser.error("the following arguments are required: --out")
    _check_protocol(parser, args)
    # Imported after parsing: --help and argument errors do not wait for numpy/matplotlib.
    from a2c_ppo_acktr.eval.evaluation import resolve_config, run_cli

    if args.protocol == "video":
        from a2c_ppo_acktr.eval import video_protocol

        if args.print_config:
            exit_if_print_config(parser, args, video_protocol.resolve_config(args, list(extra)))
        video_protocol.run_cli(args, list(extra))
        return 0
    if args.print_config:
        exit_if_print_config(parser, args, resolve_config(args, list(extra)))
    run_cli(args, list(extra))
    return 0


# --prompt of --protocol video (video_protocol.PROMPTS, kept here so that argument errors import nothing heavy).
PROMPTS = ("reference", "agent")


def _check_protocol(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject flag combinations that belong to the other protocol (the message says which to use)."""
    if args.prompt is not None and args.prompt not in PROMPTS:
        parser.error(
            f"--prompt {args.prompt!r} is not one of {', '.join(PROMPTS)} (reference: the benchmark's prompt; agent: "
            "this project's)"
        )
    video_flags = [
        f
        for f, v in (
            ("--video-root", args.video_root),
            ("--num-frames", args.num_frames),
            ("--frame-sampling", args.frame_sampling),
            ("--batch-size", args.batch_size),
            ("--prompt", args.prompt),
        )
        if v is not None
    ]
    if args.data_root is not None and not os.path.isdir(args.data_root):
        parser.error(f"--data-root {args.data_root} is not a directory; pass the folder that holds the scans")
    if args.protocol == "interactive":
        if video_flags:
            parser.error(
                f"{', '.join(video_flags)} belong to --protocol video; add it (the interactive protocol uses "
                "--data-root)"
            )
        return
    if args.compare or args.score_file:
        parser.error(
            "--protocol video evaluates a model on videos; --compare and --score-file take finished reports/predictions"
        )
    if args.vsibench is None or args.video_root is None:
        parser.error("--protocol video needs --vsibench ROWS and --video-root VIDEOS (<dataset>/<scene_name>.mp4)")
    other = [
        f
        for f, v in (
            ("--data-root", args.data_root),
            ("--blind", args.blind),
            ("--zero-images", args.zero_images),
            ("--metrics", args.metrics),
        )
        if v
    ]
    if other:
        parser.error(
            f"{', '.join(other)} belong to the interactive protocol; the video protocol reads frames from --video-root"
        )
    if args.prompt == "agent" and (args.oracle or args.dummy):
        parser.error(
            f"--prompt agent is how a model is asked; {'--oracle' if args.oracle else '--dummy'} answers without one "
            "(drop --prompt)"
        )
    for flag, value in (("--num-frames", args.num_frames), ("--batch-size", args.batch_size), ("--limit", args.limit)):
        if value is not None and value < 1:
            parser.error(f"{flag}={value} must be >= 1")


if __name__ == "__main__":
    from a2c_ppo_acktr.config.cli import run_main

    sys.exit(run_main(main, "eval_vsi.py"))
