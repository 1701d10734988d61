"""This project's PPO against TRL's GRPO on the same work, side by side.

Both trainers run on the same tiny offline Qwen2.5-VL (float32, sdpa, one CPU thread), the same
prompts (the first observations of ``--num-prompts`` VSI-v0 episodes, cpu-demo env: 4 sweep frames +
1 view, 64x64, one turn), in the same order, ``--group`` completions per prompt and
``--completions`` per step (4 prompts x 4), the same LoRA (r=8 on the language model's projections),
the same sampling (temperature 1, no top-k/top-p, image placeholder tokens suppressed), up to
``--max-new-tokens`` tokens, the same reward function, one AdamW step per step (lr 1e-5, clip 1.0):

* TRL ``GRPOTrainer`` (``num_iterations=1``, ``bf16=False``, no gradient checkpointing, no vLLM), with
  ``beta=0`` and with ``beta=--kl`` (a reference forward per step);
* this project: ``collect_rollout`` -> ``compute_advantages`` -> ``PPO.update`` -> ``after_update``,
  the training loop's phases, with ``ppo.advantage_estimator=grpo`` (groups from the prompt set
  env's ``group_id``), one epoch of one minibatch, fixed temperature 1 (no temperature head: the
  same sampling as TRL), with ``ppo.kl_coef=0`` (the KL monitor every ``log.kl_ref_interval=10``
  updates, its default) and ``ppo.kl_coef=--kl``; and once with ``gae`` (value bootstraps).

The reward of a reply is the env's for a one-turn episode: the VSI-Bench score of an answer,
``env.invalid_penalty`` for unparsable text, ``env.step_cost`` for a move (no move is executed: with
one turn the episode is over). Both trainers call the same function.

Each (trainer, setting) runs in a fresh process per round, rounds interleaved (load drift hits all
alike); per run: ``--warmup`` steps, then ``--steps`` timed steps. Reported: the best round's mean
seconds per step, completions/s, mean reward, and where the time goes, by patching the libraries'
entry points (outermost call only): processor (chat template + tokenizer + image processor),
``generate`` (with the project's prefill of the distinct prompts, ``model.shared_prefill``, which
runs just before it), model forwards outside generate (value, reference: LoRA disabled, training: with
grad), ``Tensor.backward``, optimizer (``AdamW.step`` + gradient clipping), env/reward; "other" is
the rest (log-prob/loss maths, decoding, Python).

Needs TRL, an optional extra: ``pip install -e '.[bench]'`` (trl 1.16.0 was used; installing it adds
datasets, pandas, dill and multiprocess and leaves the pinned torch and transformers alone). Without
it the script says so and exits 0.

Usage: ``python bench/bench_vs_trl.py [--rounds 3] [--steps 20] [--warmup 2] [--kl 0.04] [--shared-prefill 0]``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

PHASES = (
    "processor",
    "generate",
    "value_forward",
    "reference_forward",
    "training_forward",
    "backward",
    "optimizer",
    "env",
)
TRL_INSTALL = "pip install -e '.[bench]'   (or: pip install 'trl>=1.16,<2'; measured with trl 1.16.0)"


# ------------------------------------------------------------------------------------ the work
@dataclass
class Prompt:
    """One benchmark prompt: the env's first observation of an episode and what scores a reply."""

    observation: dict
    question_type: str
    ground_truth: str


def build_prompts(num_prompts: int, env_overrides: dict[str, Any]):
    """The first observations of episodes ``0..num_prompts-1`` of VSI-v0 (cpu-demo env, one turn)."""
    from a2c_ppo_acktr.config.arguments import EnvConfig
    from a2c_ppo_acktr.envs.vsi_env import VSIEnv

    cfg = EnvConfig(**env_overrides)
    env = VSIEnv(cfg)
    out = []
    for k in range(num_prompts):
        obs, _ = env.reset(seed=k)
        out.append(Prompt(obs, env.question.question_type, str(env.question.ground_truth)))
    return cfg, out


def reward(prompt: Prompt, text: str, env_cfg) -> float:
    """The one-turn episode's reward (the env's): score an answer, penalise invalid text."""
    from a2c_ppo_acktr.common.prompts import Answer, Move, parse_action
    from a2c_ppo_acktr.common.scoring import score_prediction

    parsed = parse_action(text, max_forward=env_cfg.max_forward)
    if isinstance(parsed, Answer):
        return float(score_prediction(prompt.question_type, parsed.text, prompt.ground_truth))
    if isinstance(parsed, Move):
        return float(env_cfg.step_cost)
    return float(env_cfg.invalid_penalty)


class PromptSetEnv:
    """The project's env interface over the prompt set: each step shows ``group`` copies of the next
    ``num_envs / group`` prompts, in order (what TRL's sampler feeds GRPO with ``num_generations=group``
    and no shuffling). Every episode is one turn: an answer terminates it, anything else truncates it
    (``final_observation`` is the prompt itself). ``info["group_id"]`` is the prompt's index."""

    def __init__(self, prompts: list[Prompt], num_envs: int, group: int, env_cfg, timer: "PhaseTimer") -> None:
        self.prompts, self.num_envs, self.group, self.env_cfg, self.timer = prompts, num_envs, group, env_cfg, timer
        self.cursor = 0
        self.rewards: list[float] = []

    def _next(self) -> list[dict]:
        per_step = self.num_envs // self.group
        self.ids = [(self.cursor + i // self.group) % len(self.prompts) for i in range(self.num_envs)]
        self.cursor = (self.cursor + per_step) % len(self.prompts)
        return [self.prompts[i].observation for i in self.ids]

    def reset(self) -> list[dict]:
        self.cursor = 0
        return self._next()

    def resync(self, observations: list[dict]) -> tuple[list[dict], bool]:
        return observations, False  # every episode is one turn: groups never drift apart

    def step(self, texts: list[str]):
        import numpy as np
        from a2c_ppo_acktr.common.prompts import Answer, Invalid, parse_action

        with self.timer.phase("env"):
            rewards = np.array(
                [reward(self.prompts[i], t, self.env_cfg) for i, t in zip(self.ids, texts)], dtype=np.float32
            )
            parsed = [parse_action(t, max_forward=self.env_cfg.max_forward) for t in texts]
            terminated = np.array([isinstance(p, Answer) for p in parsed])
            infos = [
                {
                    "group_id": i,
                    "valid": not isinstance(p, Invalid),
                    "final_observation": self.prompts[i].observation,
                    "episode": {"score": float(r) if a else 0.0, "reward": float(r), "turns": 1},
                }
                for i, p, r, a in zip(self.ids, parsed, rewards, terminated)
            ]
            self.rewards += rewards.tolist()
            return self._next(), rewards, terminated, ~terminated, infos


# ------------------------------------------------------------------------------------ timing
class PhaseTimer:
    """Seconds per phase, from wrappers on library entry points; only the outermost timed call counts
    (a processor run inside a forward, or a forward inside ``generate``, is not counted twice)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.active: Optional[str] = None
        self._undo: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.active is not None:
            yield
            return
        self.active, t0 = name, time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0
            self.active = None

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        """Time every call of ``owner.attr`` as phase ``name`` (restored by :meth:`close`)."""
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.phase(name):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, original))

    def watch_model(self, model: Any) -> None:
        """Time the forwards of ``model`` (the transformers model) outside any other phase: with grad
        = training, with the LoRA layers disabled = reference, else value (or old log-prob) forwards."""
        lora = next((m for m in model.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")), None)
        started: list[bool] = []

        def pre(_module, _args):
            if self.active is not None:
                started.append(False)
                return
            import torch

            if torch.is_grad_enabled():
                name = "training_forward"
            elif lora is not None and bool(lora.disable_adapters):
                name = "reference_forward"
            else:
                name = "value_forward"
            self.active, self._t0 = name, time.perf_counter()
            started.append(True)

        def post(_module, _args, _out):
            if started.pop():
                self.seconds[self.active] += time.perf_counter() - self._t0
                self.active = None

        handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
        self._undo.append(lambda: [h.remove() for h in handles])

    def instrument(self, processor: Any, model: Any) -> None:
        import torch
        from transformers import GenerationMixin

        self.wrap(type(processor), "__call__", "processor")
        self.wrap(type(processor), "apply_chat_template", "processor")
        self.wrap(GenerationMixin, "generate", "generate")
        self.wrap(torch.Tensor, "backward", "backward")
        self.wrap(torch.optim.AdamW, "step", "optimizer")
        self.wrap(torch.nn.utils, "clip_grad_norm_", "optimizer")
        self.watch_model(model)

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


def _split(timer: PhaseTimer, before: dict[str, float], steps: int) -> dict[str, float]:
    return {p: (timer.seconds.get(p, 0.0) - before.get(p, 0.0)) / steps for p in PHASES}


# ------------------------------------------------------------------------------------ one run
def _reward_stats(rewards: list[float]) -> dict[str, Any]:
    """Mean reward of the timed steps' completions, its standard error and their number."""
    n = len(rewards)
    se = statistics.stdev(rewards) / n**0.5 if n > 1 else float("nan")
    return {"reward": statistics.mean(rewards), "reward_se": se, "n": n}


def _model_config(args: argparse.Namespace):
    from a2c_ppo_acktr.config.arguments import ModelConfig

    # Fixed temperature 1 (no temperature head): exactly TRL's sampling distribution.
    return ModelConfig(
        model_path=args.model_path,
        device="cpu",
        dtype="float32",
        max_new_tokens=args.max_new_tokens,
        lora_r=8,
        lora_alpha=16,
        use_temp_predictor=False,
        temperature=1.0,
        shared_prefill=bool(args.shared_prefill),
    )


def run_project(args: argparse.Namespace, kl: float, estimator: str) -> dict[str, Any]:
    import torch

    from a2c_ppo_acktr.algo.ppo import PPO
    from a2c_ppo_acktr.config.arguments import PPOConfig
    from a2c_ppo_acktr.policy.loading import load_vlm
    from a2c_ppo_acktr.policy.model import VLMPolicy
    from a2c_ppo_acktr.algo.storage import BOOTSTRAPPING_ESTIMATORS, RolloutStorage
    from a2c_ppo_acktr.algo.schedule import build_optimizer
    from a2c_ppo_acktr.rl.train import collect_rollout, compute_advantages

    env_cfg, prompts = build_prompts(args.num_prompts, ENV)
    cfg = _model_config(args)
    torch.manual_seed(args.seed)
    policy = VLMPolicy(cfg, load_vlm(cfg))
    ppo_cfg = PPOConfig(
        ppo_epochs=1,
        mini_batch_size=args.completions,
        lr=1e-5,
        max_grad_norm=1.0,
        clip_coef=0.2,
        kl_coef=kl,
        advantage_estimator=estimator,
        adv_norm="batch" if estimator == "gae" else "none",
    )
    optimizer = build_optimizer(policy, ppo_cfg)
    ppo = PPO(policy, optimizer, ppo_cfg, seed=args.seed, kl_ref_interval=args.kl_ref_interval)
    storage = RolloutStorage(1, args.completions)
    timer = PhaseTimer()
    timer.instrument(policy.processor, policy.base_model)
    timer.wrap(VLMPolicy, "_shared_prefill", "generate")  # the prompts' prefill, shared by repeated rows
    envs = PromptSetEnv(prompts, args.completions, args.group, env_cfg, timer)
    observations = envs.reset()
    bootstrap = estimator in BOOTSTRAPPING_ESTIMATORS
    durations, before = [], {}
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before, envs.rewards = timer.snapshot(), []
        t0 = time.perf_counter()
        observations, stats = collect_rollout(policy, envs, storage, observations, 1, bootstrap=bootstrap)
        compute_advantages(storage, stats.next_value, ppo_cfg)
        ppo.update(storage)
        storage.after_update()
        durations.append(time.perf_counter() - t0)
    measured = durations[args.warmup :]
    return {
        "s_per_step": statistics.mean(measured),
        "split": _split(timer, before, args.steps),
        **_reward_stats(envs.rewards),
    }


def run_trl(args: argparse.Namespace, beta: float) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from PIL import Image
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from a2c_ppo_acktr.common import prompts as fmt
    from a2c_ppo_acktr.policy.loading import forbidden_token_ids, load_vlm
    from a2c_ppo_acktr.policy.model import build_lora_config

    env_cfg, prompts = build_prompts(args.num_prompts, ENV)
    cfg = _model_config(args)
    loaded = load_vlm(cfg)
    timer = PhaseTimer()
    rewards: list[float] = []

    def reward_fn(completions, qid, **_):
        with timer.phase("env"):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            out = [reward(prompts[i], t, env_cfg) for i, t in zip(qid, texts)]
            rewards.extend(out)
            return out

    rows = [
        {
            "prompt": fmt.build_messages(p.observation),
            "images": [Image.fromarray(a) for a in p.observation["images"]],
            "qid": k,
        }
        for k, p in enumerate(prompts)
    ]
    forbidden = forbidden_token_ids(loaded.processor, vocab_size=int(loaded.model.config.get_text_config().vocab_size))
    total = args.warmup + args.steps
    out = tempfile.mkdtemp(prefix="bench_vs_trl_")  # TRL wants an output_dir; nothing is saved (save_strategy="no")
    grpo = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=args.completions,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        learning_rate=1e-5,
        beta=beta,
        epsilon=0.2,
        num_iterations=1,
        max_grad_norm=1.0,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=total,
        shuffle_dataset=False,
        max_steps=total,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        disable_tqdm=True,
        seed=args.seed,
        dataloader_num_workers=0,
        generation_kwargs={"suppress_tokens": forbidden},
    )
    torch.manual_seed(args.seed)
    trainer = GRPOTrainer(
        model=loaded.model,
        reward_funcs=reward_fn,
        args=grpo,
        train_dataset=Dataset.from_list(rows),
        processing_class=loaded.processor,
        peft_config=build_lora_config(cfg),
    )
    timer.instrument(loaded.processor, loaded.model)
    marks: list[float] = []
    state: dict[str, Any] = {}

    class Clock(TrainerCallback):
        def on_step_begin(self, _args, st, control, **kw):
            if not marks:
                marks.append(time.perf_counter())

        def on_step_end(self, _args, st, control, **kw):
            marks.append(time.perf_counter())
            if len(marks) == args.warmup + 1:
                state["before"], state["n_rewards"] = timer.snapshot(), len(rewards)

    trainer.add_callback(Clock())
    try:
        trainer.train()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    steps = [b - a for a, b in zip(marks, marks[1:])][args.warmup :]
    return {
        "s_per_step": statistics.mean(steps),
        "split": _split(timer, state["before"], len(steps)),
        **_reward_stats(rewards[state["n_rewards"] :]),
    }


# One-turn cpu-demo env: 4 sweep frames + 1 view of 64x64 per prompt.
ENV = {"image_size": 64, "num_sweep_frames": 4, "image_history": 1, "max_turns": 1, "num_scenes": 32}

RUNS = {  # key -> (label, trainer, kl (None: --kl), estimator)
    "trl": ("TRL GRPO beta=0", "trl", 0.0, None),
    "trl-kl": ("TRL GRPO beta=KL", "trl", None, None),
    "ppo": ("project PPO grpo kl_coef=0", "project", 0.0, "grpo"),
    "ppo-kl": ("project PPO grpo kl_coef=KL", "project", None, "grpo"),
    "ppo-gae": ("project PPO gae kl_coef=0", "project", 0.0, "gae"),
}
# (numerator, denominator) of the printed ratios; the targets are on the first (<= 0.8x)
# and the third (<= 0.7x: the project's default, no KL in the loss, against TRL with a KL penalty).
RATIOS = (("ppo", "trl"), ("ppo-kl", "trl-kl"), ("ppo", "trl-kl"), ("ppo-gae", "trl"))


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    _, trainer, kl, estimator = RUNS[args.run]
    kl = args.kl if kl is None else kl
    result = run_trl(args, kl) if trainer == "trl" else run_project(args, kl, estimator)
    print("RESULT " + json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-path", default="tiny:qwen2_5_vl")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--group", type=int, default=4, help="completions per prompt (GRPO's G)")
    ap.add_argument("--completions", type=int, default=16, help="completions per step")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kl", type=float, default=0.04, help="TRL beta and project kl_coef of the 'KL' rows")
    ap.add_argument("--kl-ref-interval", type=int, default=10, help="the project's log.kl_ref_interval")
    ap.add_argument(
        "--shared-prefill",
        type=int,
        default=1,
        choices=[0, 1],
        help="the project's model.shared_prefill (1: each distinct prompt prefilled once; 0: every row)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, choices=list(RUNS), help="runs to make (default: all)")
    ap.add_argument("--run", choices=list(RUNS), help=argparse.SUPPRESS)  # child process
    args = ap.parse_args()
    if args.completions % args.group:
        ap.error(f"--completions {args.completions} must be a multiple of --group {args.group}")
    if args.run:
        child(args)
        return
    try:
        import trl
    except ImportError:
        print(f"bench_vs_trl needs TRL, an optional extra; install it with:\n    {TRL_INSTALL}\nskipped.")
        return
    keys = args.only or list(RUNS)
    results: dict[str, list[dict]] = {key: [] for key in keys}
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("only", "run", "rounds")]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for r in range(args.rounds):
        for key in keys:
            out = subprocess.run(
                [sys.executable, __file__, "--run", key, *shared], capture_output=True, text=True, env=env, check=False
            )
            line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if out.returncode != 0 or line is None:
                raise RuntimeError(f"{key} failed (round {r + 1}):\n{out.stderr[-4000:]}")
            results[key].append(json.loads(line[len("RESULT ") :]))
            print(f"round {r + 1}: {key}: {results[key][-1]['s_per_step']:.3f} s/step", file=sys.stderr, flush=True)
    report(args, results, trl.__version__)


def report(args: argparse.Namespace, results: dict[str, list[dict]], trl_version: str) -> None:
    import torch
    import transformers

    best = {key: min(runs, key=lambda x: x["s_per_step"]) for key, runs in results.items()}
    name = {key: RUNS[key][0].replace("KL", str(args.kl)) for key in RUNS}
    load = os.getloadavg()
    print(
        f"\nbench_vs_trl: {args.model_path} fp32, shared_prefill={bool(args.shared_prefill)}, {args.threads} "
        f"thread(s), {args.num_prompts} one-turn prompts "
        f"(5 frames 64x64), {args.completions} completions/step ({args.group} per prompt), <= {args.max_new_tokens} "
        "new tokens, "
        f"LoRA r=8; {args.steps} steps after {args.warmup} warm-up, best of {args.rounds} interleaved rounds; "
        f"trl {trl_version}, transformers {transformers.__version__}, torch {torch.__version__}; "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| run | s/step (best round) | rounds | completions/s | mean reward +- s.e. (completions) |")
    print("|---|---|---|---|---|")
    for key, b in best.items():
        rounds = ", ".join(f"{x['s_per_step']:.3f}" for x in results[key])
        print(
            f"| {name[key]} | {b['s_per_step']:.3f} | {rounds} | {args.completions / b['s_per_step']:.1f} | "
            f"{b['reward']:+.3f} +- {b['reward_se']:.3f} ({b['n']}) |"
        )
    print("\nWhere the time goes, seconds per step (best round):\n")
    print("| phase | " + " | ".join(name[key] for key in best) + " |")
    print("|---|" + "---|" * len(best))
    for p in PHASES + ("other",):
        cells = [
            f"{(b['s_per_step'] - sum(b['split'].values())) if p == 'other' else b['split'][p]:.3f}"
            for b in best.values()
        ]
        print(f"| {p} | " + " | ".join(cells) + " |")
    print()
    for a, b in RATIOS:
        if a in best and b in best:
            print(f"{name[a]} / {name[b]}: {best[a]['s_per_step'] / best[b]['s_per_step']:.2f}x")


if __name__ == "__main__":
    main()
