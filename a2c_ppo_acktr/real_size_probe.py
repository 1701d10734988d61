"""What the real-size stage of ``scripts/gpu_smoke.sh`` measures on a model built by
:mod:`a2c_ppo_acktr.real_size`: decoding speed of the policy's ``act`` against a bare batched
``generate``, and the peak memory of a rollout plus two training steps against
:mod:`a2c_ppo_acktr.memory`'s formula at the shapes that ran. The checks on these numbers live in
:mod:`a2c_ppo_acktr.gpu_smoke`; this module only measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

# Warm-up length of each decoder before timing: CUDA kernels, cuBLAS handles and the allocator's
# first blocks are paid here, not in the timed call.
WARMUP_TOKENS = 2


@dataclass(frozen=True)
class DecodeTiming:
    """One batched turn through ``act`` and through a bare ``generate`` on the same prompts.

    Attributes:
        act_seconds, bare_seconds: wall time of each call (device synchronised).
        act_positions, bare_positions: decoding steps each call ran (the batch's longest reply).
    """

    act_seconds: float
    act_positions: int
    bare_seconds: float
    bare_positions: int

    @property
    def act_per_token(self) -> float:
        return self.act_seconds / max(self.act_positions, 1)

    @property
    def bare_per_token(self) -> float:
        return self.bare_seconds / max(self.bare_positions, 1)

    @property
    def ratio(self) -> float:
        """Seconds per decoded position of ``act`` over the bare ``generate``'s."""
        return self.act_per_token / self.bare_per_token


def _synchronised(device: Any) -> Callable[[], None]:
    import torch

    if torch.device(device).type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def decode_timing(policy: Any, observations: Sequence[dict]) -> DecodeTiming:
    """Time ``policy.act(observations)`` against ``model.generate`` on the same encoded prompts.

    The bare call is what a user would write: the processor's inputs, ``max_new_tokens`` and plain
    sampling, with no logits processor or warper at all (temperature 1, no top-k or top-p, no
    forbidden ids). ``act`` adds its own work on top (the prompt forward for the value and the
    temperature, its logits processor, and with ``model.rollout_log_probs=recompute`` a re-scoring
    forward). Each is warmed up with a :data:`WARMUP_TOKENS`-token call first.
    """
    cfg = policy.cfg
    sync = _synchronised(policy.device)

    act, bare = decoders(policy, observations)
    act(WARMUP_TOKENS)
    bare(WARMUP_TOKENS)
    act_positions, act_seconds = _timed(lambda: act(cfg.max_new_tokens), sync)
    bare_positions, bare_seconds = _timed(lambda: bare(cfg.max_new_tokens), sync)
    return DecodeTiming(act_seconds, act_positions, bare_seconds, bare_positions)


def kept_frames_timing(policy: Any, observations: Sequence[dict]) -> tuple[float, float]:
    """Seconds of a greedy ``act`` on ``observations`` whose frames the tower encodes, then of the same
    ``act`` with those frames' tower outputs kept (:meth:`~a2c_ppo_acktr.policy.model.VLMPolicy.vision_cache`:
    an episode's later turns showing its sweep again). The difference is the tower's share of a turn."""
    sync = _synchronised(policy.device)
    policy.act(observations, greedy=True)  # warm-up
    with policy.vision_cache():
        _, encoded = _timed(lambda: policy.act(observations, greedy=True), sync)
        _, kept = _timed(lambda: policy.act(observations, greedy=True), sync)
    return encoded, kept


def decoders(policy: Any, observations: Sequence[dict]) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """``(act, bare)``: each decodes ``tokens`` positions for ``observations`` and returns the batch's
    longest reply; ``act`` through the policy, ``bare`` through a plain ``model.generate`` of the same
    prompts (temperature 1, no warper, no logits processor)."""
    import torch

    cfg = policy.cfg
    texts, images = policy._prompts_and_images(observations, blind=False)

    def bare(tokens: int) -> int:
        enc = policy._encode(texts, images)
        with torch.no_grad():
            seqs = policy.model.generate(
                **enc, max_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0
            )
        return int(seqs.shape[1] - enc["input_ids"].shape[1])

    def act(tokens: int) -> int:
        full, cfg.max_new_tokens = cfg.max_new_tokens, tokens
        try:
            return max(len(g) for g in policy.act(observations).generated_ids)
        finally:
            cfg.max_new_tokens = full

    return act, bare


def profile_decoders(policy: Any, observations: Sequence[dict], tokens: int, path: str, rows: int = 30) -> None:
    """Profile one ``act`` and one bare ``generate`` of ``tokens`` positions (``torch.profiler``, CPU
    and, on CUDA, device time) and write both operator tables to ``path``: where ``act``'s extra time
    per decoded token goes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    act, bare = decoders(policy, observations)
    on_cuda = torch.device(policy.device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
    sync = _synchronised(policy.device)
    act(WARMUP_TOKENS)
    bare(WARMUP_TOKENS)
    parts = []
    for name, fn in (("act", act), ("bare generate", bare)):
        sync()
        with profile(activities=activities) as prof:
            fn(tokens)
            sync()
        parts.append(
            f"== {name}, {tokens} positions, sorted by {sort}\n"
            + prof.key_averages().table(sort_by=sort, row_limit=rows)
        )
        parts.append(
            f"== {name}, sorted by cpu_time_total (Python-side work shows here)\n"
            + prof.key_averages().table(sort_by="cpu_time_total", row_limit=rows)
        )
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join(parts) + "\n")


def training_steps(policy: Any, minibatch: Any, lr: float, steps: int = 2) -> None:
    """``steps`` PPO-shaped steps on ``minibatch``: the training forward, an unclipped surrogate plus
    the value loss, backward and an AdamW step over the trainable weights. From the second step on,
    the optimizer's moments exist during forward and backward, as in training (the first step
    allocates them only in ``step``)."""
    import torch

    policy.train()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        out = policy.evaluate_actions(minibatch, with_kl=False)
        device = out.log_probs.device
        ratio = (out.log_probs - minibatch.old_log_probs.to(device)).exp()
        loss = (
            -(ratio * minibatch.advantages.to(device)).mean()
            + 0.5 * (out.values - minibatch.returns.to(device)).pow(2).mean()
        )
        loss.backward()
        optimizer.step()
        del out, ratio, loss


def measured_shapes(policy: Any, storage: Any, mini_batch_size: int, max_new_tokens: int) -> Any:
    """:class:`~a2c_ppo_acktr.memory.Shapes` of what a rollout held: its longest prompt, and its
    images and visual tokens per turn counted in the prompts' token ids (one vision-start token per
    image; pixel values per visual token as Qwen-VL's processor makes them)."""
    from a2c_ppo_acktr.memory import Shapes

    tok = policy.tokenizer
    start, pad = tok.convert_tokens_to_ids("<|vision_start|>"), tok.convert_tokens_to_ids("<|image_pad|>")
    prompts = [p for p in storage.prompt_ids if p is not None]
    images = max(int((p == start).sum()) for p in prompts)
    image_tokens = max(int((p == pad).sum()) for p in prompts) // max(images, 1)
    vision = policy.model.config.vision_config
    # Each visual token merges merge^2 patches of temporal x patch^2 x 3 values.
    pixels = image_tokens * vision.spatial_merge_size**2 * vision.temporal_patch_size * vision.patch_size**2 * 3
    longest = max(len(p) for p in prompts)
    return Shapes(
        batch=mini_batch_size,
        prompt_tokens=longest,
        response_tokens=max_new_tokens,
        padded=mini_batch_size > 1,
        num_envs=storage.num_envs,
        images=images,
        image_tokens=image_tokens,
        pixel_values=pixels,
        text_tokens=longest - images * image_tokens,
        text_exact=True,
    )


def estimated_peak_bytes(run: Any, shapes: Any) -> float:
    """:mod:`a2c_ppo_acktr.memory`'s peak of tensors (no assumed overheads) for ``run`` on one GPU in
    one plain process (no ZeRO: float32 LoRA and Adam moments, as :func:`training_steps` makes them)."""
    import dataclasses

    from a2c_ppo_acktr import memory

    dims = memory.model_dims(run.model)
    setup = dataclasses.replace(memory.setup_from_run(run, 1), zero_stage=0, lora_bytes=4, reduce_bucket_elements=0)
    heads = memory.head_params(
        dims.hidden, run.model.value_head_hidden, run.model.temp_head_hidden, run.model.use_temp_predictor
    )
    return memory.totals(memory.estimate(dims, shapes, setup, heads=heads))["peak"]


def preset_peak_bytes(run: Any) -> float:
    """The peak of tensors ``python -m a2c_ppo_acktr.memory --preset ... --gpus 1`` prints for ``run``:
    the preset's own longest VSI turn and its ZeRO setting (for reference beside the measured shapes)."""
    from a2c_ppo_acktr import memory

    dims = memory.model_dims(run.model)
    heads = memory.head_params(
        dims.hidden, run.model.value_head_hidden, run.model.temp_head_hidden, run.model.use_temp_predictor
    )
    terms = memory.estimate(dims, memory.preset_shapes(run, dims), memory.setup_from_run(run, 1), heads=heads)
    return memory.totals(terms)["peak"]
