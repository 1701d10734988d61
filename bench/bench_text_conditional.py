"""Can the tiny model learn a text-conditional answer at all? Supervised object size, per trainable set.

Usage::

    .venv/bin/python bench/bench_text_conditional.py                      # 600 steps, all four settings
    .venv/bin/python bench/bench_text_conditional.py --settings lora lora+embed --steps 300

The question is whether the learning benchmark's target (c) (object size: beat the best constant
answer, bench/bench_learning.py) is within the tiny model's reach, and with which weights trainable.
No RL and no images: object-size questions of the procedural scenes (``--train-scenes`` scenes,
8 draws each; held-out: 100 other scenes, 2 draws each) in the agent's own prompt (system prompt and
observation text, :mod:`a2c_ppo_acktr.common.prompts`), the oracle's brief reply with the exact answer as the
target, cross-entropy on the reply tokens, batches of 8, AdamW at ``--lr`` (full fine-tuning at
``--full-lr``). Every ``--eval-every`` steps the greedy replies to the held-out questions are scored
with the benchmark's MRA (:func:`a2c_ppo_acktr.common.scoring.mean_relative_accuracy`).

Settings (``--settings``):
  lora         cpu-demo's LoRA (r 32 on the language model's projections and lm_head)
  lora+embed   the same plus LoRA on embed_tokens (what bench_learning's object_size task uses)
  full         every weight of the language model, embeddings included
  full-embed   every weight but the input embeddings

One Markdown table: held-out MRA per setting and step, the share of the most common answer (a
constant policy gives the same answer to every question), then the best constant answer and the
per-category oracle (the best answer per category on the training questions) on the same held-out set.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench scripts (as under `python bench/...`)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from a2c_ppo_acktr.config.arguments import EMBEDDING_LORA_TARGET, ModelConfig, load_config  # noqa: E402
from a2c_ppo_acktr.envs.procedural import make_procedural_scene  # noqa: E402
from a2c_ppo_acktr.envs.questions import Question, QuestionUnavailable, generate_question  # noqa: E402
from a2c_ppo_acktr.common.prompts import SYSTEM_PROMPT, Answer, format_response, observation_text, parse_action  # noqa: E402
from a2c_ppo_acktr.common.scoring import mean_relative_accuracy  # noqa: E402
from a2c_ppo_acktr.envs.oracle import brief_thoughts  # noqa: E402
from bench_learning import best_constant  # noqa: E402

SETTINGS = ("lora", "lora+embed", "full", "full-embed")
QTYPE = "object_size_estimation"


def questions(seeds: Sequence[int], per_scene: int) -> list[Question]:
    """Object-size questions: ``per_scene`` draws from each procedural scene ``seeds``."""
    out = []
    for seed in seeds:
        scene, rng = make_procedural_scene(seed), np.random.default_rng(seed)
        for _ in range(per_scene):
            try:
                out.append(generate_question(scene, QTYPE, rng))
            except QuestionUnavailable:
                break
    return out


def mean_mra(answers: Sequence[Optional[float]], qs: Sequence[Question]) -> float:
    return float(
        np.mean([0.0 if a is None else mean_relative_accuracy(a, float(q.ground_truth)) for a, q in zip(answers, qs)])
    )


def category_cosines(model: torch.nn.Module, tokenizer, labels: Sequence[str]) -> tuple[float, float, float]:
    """Mean, min and max pairwise cosine of the input embeddings of ``labels`` (each label's last
    token, with its leading space as in the question): how far apart the model sees the names."""
    table = model.get_input_embeddings().weight.detach()
    ids = sorted({tokenizer(" " + label, add_special_tokens=False).input_ids[-1] for label in labels})
    unit = torch.nn.functional.normalize(table[ids].float(), dim=1)
    cos = (unit @ unit.T)[~torch.eye(len(ids), dtype=torch.bool)]
    return float(cos.mean()), float(cos.min()), float(cos.max())


def trainable_model(base: torch.nn.Module, setting: str) -> torch.nn.Module:
    """``base`` (deep-copied) with the weights of ``setting`` trainable."""
    from peft import LoraConfig, get_peft_model

    model = copy.deepcopy(base)
    demo = load_config(preset="cpu-demo").model
    if setting.startswith("lora"):
        targets = demo.lora_target_modules + (f"|{EMBEDDING_LORA_TARGET}" if setting == "lora+embed" else "")
        return get_peft_model(model, LoraConfig(r=demo.lora_r, lora_alpha=demo.lora_alpha, target_modules=targets))
    for name, p in model.named_parameters():
        p.requires_grad_("language_model" in name or "lm_head" in name)
        if setting == "full-embed" and "embed_tokens" in name:
            p.requires_grad_(False)
    return model


def main(argv: Optional[Sequence[str]] = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-3, help="LoRA settings (4e-3, cpu-demo's SFT lr, is unstable here)")
    p.add_argument("--full-lr", type=float, default=3e-4)
    p.add_argument("--train-scenes", type=int, default=32, help="cpu-demo's env.num_scenes")
    p.add_argument("--model-path", default="tiny:qwen2_5_vl")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    from a2c_ppo_acktr.policy.loading import load_vlm

    train, test = questions(range(args.train_scenes), 8), questions(range(5000, 5100), 2)
    const = best_constant(QTYPE, [q.ground_truth for q in train])[0]
    by_cat = collections.defaultdict(list)
    for q in train:
        by_cat[q.meta["label"]].append(q.ground_truth)
    per_cat = {k: best_constant(QTYPE, v)[0] for k, v in by_cat.items()}
    oracle = mean_mra([per_cat.get(q.meta["label"], const) for q in test], test)

    loaded = load_vlm(ModelConfig(model_path=args.model_path, dtype="float32", device="cpu"))
    tok = loaded.processor.tokenizer
    cos = category_cosines(loaded.model, tok, sorted(by_cat))

    def prompt(q: Question) -> str:
        # the first turn's text of a cpu-demo episode (4 turns, 4 sweep frames and the current view named)
        text = observation_text(q.question, None, "none yet (this is the start).", 4, num_sweep_frames=4, num_views=1)
        messages = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ]
        return loaded.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    prompts = [tok(prompt(q)).input_ids for q in train]
    replies = [
        tok(
            format_response(brief_thoughts(q), Answer(q.ground_truth)) + "<|im_end|>", add_special_tokens=False
        ).input_ids
        for q in train
    ]

    def evaluate(model) -> tuple[float, float]:
        model.eval()
        answers: list[Optional[float]] = []
        for i in range(0, len(test), 25):
            enc = tok([prompt(q) for q in test[i : i + 25]], return_tensors="pt", padding=True, padding_side="left")
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=40, do_sample=False)
            for o in out:
                action = parse_action(tok.decode(o[enc.input_ids.shape[1] :], skip_special_tokens=True))
                try:
                    answers.append(float(getattr(action, "text", "")))
                except ValueError:
                    answers.append(None)
        model.train()
        share = collections.Counter(answers).most_common(1)[0][1] / len(answers)
        return mean_mra(answers, test), share

    checkpoints = list(range(args.eval_every, args.steps + 1, args.eval_every))
    rows = []
    for setting in args.settings:
        torch.manual_seed(args.seed)
        model = trainable_model(loaded.model, setting)
        params = [q for q in model.parameters() if q.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.full_lr if setting.startswith("full") else args.lr)
        rng, cells, start = np.random.default_rng(args.seed), [], time.time()
        model.train()
        for step in range(1, args.steps + 1):
            idx = rng.choice(len(train), 8)
            length = max(len(prompts[i]) + len(replies[i]) for i in idx)
            ids = torch.full((8, length), tok.pad_token_id)
            labels = torch.full((8, length), -100)
            mask = torch.zeros((8, length), dtype=torch.long)
            for j, i in enumerate(idx):
                seq = prompts[i] + replies[i]
                ids[j, : len(seq)] = torch.tensor(seq)
                mask[j, : len(seq)] = 1
                labels[j, len(prompts[i]) : len(seq)] = torch.tensor(replies[i])
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad()
            if step in checkpoints:
                mra, share = evaluate(model)
                cells.append(f"{mra:.3f} ({share:.0%})")
                print(
                    f"[text-conditional] {setting} step {step}: MRA {mra:.3f}, top answer {share:.0%}",
                    file=sys.stderr,
                    flush=True,
                )
        rows.append(
            f"| {setting} | {sum(q.numel() for q in params):,} | "
            + " | ".join(cells)
            + f" | {time.time() - start:.0f} |"
        )
    head = "| trainable | parameters | " + " | ".join(f"step {s}" for s in checkpoints) + " | wall (s) |"
    text = "\n".join(
        [
            f"# Supervised object size on the tiny model ({len(train)} training questions from {args.train_scenes} "
            "scenes, "
            f"{len(test)} held-out from 100 other scenes, batch 8; LoRA lr {args.lr:g}, full lr {args.full_lr:g})",
            "",
            "Held-out greedy MRA (share of the most common answer)",
            "",
            head,
            "|" + "---|" * (len(checkpoints) + 3),
            *rows,
            "",
            f"Best constant answer {const:g} cm: {mean_mra([const] * len(test), test):.3f}; per-category oracle "
            f"({len(per_cat)} categories): {oracle:.3f}.",
            f"Input embeddings of the category names (last token each): pairwise cosine mean {cos[0]:.2f}, "
            f"min {cos[1]:.2f}, max {cos[2]:.2f}.",
        ]
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
