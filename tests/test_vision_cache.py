"""An episode's repeated frames pass the frozen vision tower once per rollout (``model.vision_cache_images``):
inside ``VLMPolicy.vision_cache`` the tower runs only on images the block has not encoded, what the
policy computes is what it computes without the cache (up to the rounding of another batch), the
update still runs no tower and starts at ratio 1, and the cache is split, served and bounded exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.config.arguments import ModelConfig
from a2c_ppo_acktr.policy.loading import load_vlm
from a2c_ppo_acktr.policy.model import VISION_MODULES, VLMPolicy
from a2c_ppo_acktr.policy.vision_cache import VisionOutputCache, vision_cache_of
from a2c_ppo_acktr.algo.storage import RolloutStorage
from a2c_ppo_acktr.rl.train import collect_rollout
from helpers import NUM_ENVS, fresh_policy, tiny_model_cfg
from numerics import recorded_forwards, widest

SIDE = 40  # every frame the same size: the tower's input rows per image are then one constant


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)


def _episode_step(step: int) -> list[dict]:
    """NUM_ENVS envs at turn ``step`` of their episodes: two sweep frames repeated at every turn
    (envs 0 and 1 share a scene's, with other questions) and the view of this turn."""
    scene = [0, 0] + list(range(1, NUM_ENVS - 1))
    return [
        {
            "images": [_frame(100 * scene[n]), _frame(100 * scene[n] + 1), _frame(1000 + 10 * n + step)],
            "text": f"Env {n}: how far is the sofa from the door? turn {step}" + " look" * n,
        }
        for n in range(NUM_ENVS)
    ]


class TowerRows:
    """Rows (patches, or whole images for a CLIP tower) the vision tower's top module receives."""

    def __init__(self, policy: VLMPolicy) -> None:
        name = VISION_MODULES[policy.family]["tower"][0]
        self.tower = next(m for n, m in policy.base_model.named_modules() if n == name or n.endswith("." + name))
        self.rows: list[int] = []

    def __enter__(self) -> list[int]:
        def hook(_module, args, kwargs):
            first = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
            self.rows.append(int(first.shape[0]))

        self.handle = self.tower.register_forward_pre_hook(hook, with_kwargs=True)
        return self.rows

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _rows_per_frame(policy: VLMPolicy) -> int:
    with TowerRows(policy) as rows:
        policy.get_values([{"images": [_frame(7)], "text": "one frame"}])
    return sum(rows)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl", "llava"])
def test_an_episodes_repeated_frames_pass_the_tower_once_and_change_nothing(tiny_family_path, family):
    path = tiny_family_path(family)
    loaded = load_vlm(tiny_model_cfg(path))
    cached = fresh_policy(loaded, path, max_new_tokens=4, rollout_log_probs="recompute")
    plain = fresh_policy(loaded, path, max_new_tokens=4, rollout_log_probs="recompute")
    per_frame = _rows_per_frame(cached)
    distinct_sweeps = 2 * (NUM_ENVS - 1)  # envs 0 and 1 show one scene
    encoded, outputs = [], []
    with cached.vision_cache() as cache, recorded_forwards(VLMPolicy) as forwards:
        assert cache is not None and len(cache) == 0
        for step in range(3):
            with TowerRows(cached) as rows:
                outputs.append(
                    (cached.act(_episode_step(step), greedy=True), plain.act(_episode_step(step), greedy=True))
                )
            encoded.append(sum(rows) // per_frame)
        bounds = widest(forwards)
    # Step 0: the distinct sweep frames and every view; later steps: the new views only.
    assert encoded == [distinct_sweeps + NUM_ENVS, NUM_ENVS, NUM_ENVS]
    assert (cache.misses, cache.hits) == (
        distinct_sweeps + 3 * NUM_ENVS,
        3 * 3 * NUM_ENVS - distinct_sweeps - 3 * NUM_ENVS,
    )
    for with_cache, without in outputs:
        assert with_cache.texts == without.texts
        torch.testing.assert_close(with_cache.log_probs, without.log_probs, atol=bounds.log_prob, rtol=0)
        torch.testing.assert_close(with_cache.values, without.values, atol=bounds.value, rtol=0)
    with TowerRows(cached) as rows:
        cached.act(_episode_step(1), greedy=True)
    assert sum(rows) == per_frame * 3 * NUM_ENVS  # the block closed: every frame of the call again


def test_a_shared_prefill_is_served_from_the_cache_too(loaded, tiny_model_path):
    """A group's siblings repeat one prompt (one prefill of the distinct prompts): the cache gets the
    distinct prompts' frames in their order, and a later turn showing them again runs no tower."""
    cached = fresh_policy(loaded, tiny_model_path, max_new_tokens=4, rollout_log_probs="recompute")
    plain = fresh_policy(loaded, tiny_model_path, max_new_tokens=4, rollout_log_probs="recompute")
    group = [o for o in _episode_step(0)[1:] for _ in range(2)]  # 2 distinct prompts x 2 siblings
    again = [{**o, "text": o["text"] + " Answer now."} for o in group]  # the same frames, new text
    per_frame = _rows_per_frame(cached)
    with cached.vision_cache() as cache, recorded_forwards(VLMPolicy) as forwards:
        with TowerRows(cached) as rows:
            first = cached.act(group, greedy=True)
        assert sum(rows) == per_frame * 6  # the 2 distinct prompts' 3 frames each, once
        with TowerRows(cached) as rows:
            second = cached.act(again, greedy=True)
        assert rows == []
        bounds = widest(forwards)
    for got, prompts in ((first, group), (second, again)):
        want = plain.act(prompts, greedy=True)
        assert got.texts == want.texts
        torch.testing.assert_close(got.log_probs, want.log_probs, atol=bounds.log_prob, rtol=0)
    assert cache.misses == 6


def test_inside_the_cache_the_update_runs_no_tower_and_starts_at_ratio_one(loaded, tiny_model_path):
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=6)
    st = RolloutStorage(3, NUM_ENVS)
    torch.manual_seed(5)
    with policy.vision_cache():
        for step in range(3):
            act = policy.act(_episode_step(step))
            st.insert(
                act,
                torch.linspace(-1, 1, NUM_ENVS),
                torch.zeros(NUM_ENVS, dtype=torch.bool),
                torch.zeros(NUM_ENVS, dtype=torch.bool),
            )
    st.compute_returns(torch.zeros(NUM_ENVS))
    mb = next(st.minibatches(3 * NUM_ENVS, torch.Generator().manual_seed(0)))
    policy.train()
    with TowerRows(policy) as rows, recorded_forwards(VLMPolicy) as forwards:
        out = policy.evaluate_actions(mb)
    assert rows == []
    assert ((out.log_probs - mb.old_log_probs).exp() - 1).abs().max() < widest(forwards).ratio


def test_a_rollout_opens_one_cache_and_its_steps_share_it(loaded, tiny_model_path, monkeypatch):
    policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=4)
    opened = []
    original = VLMPolicy.vision_cache
    monkeypatch.setattr(VLMPolicy, "vision_cache", lambda self: opened.append(1) or original(self))

    class Frames:  # step 1 shows step 0's sweep frames again
        def resync(self, obs):
            return obs, False

        def reset(self):
            return _episode_step(0)

        def step(self, texts):
            n = len(texts)
            return _episode_step(1), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), [{} for _ in range(n)]

    envs = Frames()
    per_frame = _rows_per_frame(policy)
    with TowerRows(policy) as rows:
        collect_rollout(policy, envs, RolloutStorage(2, NUM_ENVS), envs.reset(), 2, bootstrap=False)
    assert opened == [1]
    assert sum(rows) == per_frame * (2 * (NUM_ENVS - 1) + 2 * NUM_ENVS)  # the sweeps once, each step's views
    assert policy.vision.cache is None  # closed with the rollout


def test_an_evaluation_opens_its_policys_cache_and_a_policy_without_one_needs_none():
    from a2c_ppo_acktr.config.arguments import load_config
    from a2c_ppo_acktr.eval import evaluation

    class Policy:
        def __init__(self):
            self.inside, self.acts_inside = False, []

        def vision_cache(self):
            import contextlib

            @contextlib.contextmanager
            def block():
                self.inside = True
                try:
                    yield None
                finally:
                    self.inside = False

            return block()

        def act(self, observations, **_):
            self.acts_inside.append(self.inside)
            return type("Out", (), {"texts": ["<answer>1</answer>"] * len(observations)})()

    cfg = load_config(preset="debug", overrides=["--eval.num_episodes", "2"])
    policy = Policy()
    evaluation.run_episodes(
        evaluation.PolicyAgent(policy),
        evaluation.procedural_specs(cfg),
        evaluation.eval_env_config(cfg),
        2,
        progress=False,
    )
    assert policy.acts_inside and all(policy.acts_inside) and not policy.inside
    with vision_cache_of(object()) as nothing:  # a teacher, a stub: no cache to open
        assert nothing is None


def test_no_cache_where_the_tower_trains_or_the_size_is_zero(loaded, tiny_model_path):
    for over in ({"vision_cache_images": 0}, {"reuse_vision_outputs": False}, {"train_vision": "projector"}):
        policy = fresh_policy(loaded, tiny_model_path, max_new_tokens=2, **over)
        with policy.vision_cache() as cache:
            assert cache is None
            with TowerRows(policy) as rows:
                policy.act(_episode_step(0), greedy=True)
                policy.act(_episode_step(0), greedy=True)
            assert rows and sum(rows[: len(rows) // 2]) == sum(
                rows[len(rows) // 2 :]
            )  # the second act encodes all again
    with pytest.raises(ValueError, match="vision_cache_images"):
        ModelConfig(vision_cache_images=-1)


# ----------------------------------------------------------------- the cache on a fake encoder


class Encoded:
    def __init__(self, pooled, deepstack=None):
        self.pooler_output = pooled
        self.deepstack_features = deepstack


def qwen_like(calls):
    """An encoder with Qwen-VL's interface: patch rows and ``image_grid_thw``; an image's encoding
    is its patch rows' sum times 2, and a deepstack layer the sum plus 1."""

    def get_image_features(pixel_values, image_grid_thw=None, **kwargs):
        calls.append(image_grid_thw.clone())
        parts = torch.split(pixel_values, image_grid_thw.prod(-1).tolist())
        return Encoded(
            tuple(2 * p.sum(0, keepdim=True) for p in parts), [tuple(p.sum(0, keepdim=True) + 1 for p in parts)]
        )

    return get_image_features


def _images(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    grid = torch.tensor([[1, 1, s] for s in sizes])
    return torch.randn(sum(sizes), 3, generator=g), grid


def test_cached_encodings_equal_the_encoder_on_the_whole_call_and_run_only_the_missing_images():
    calls: list[torch.Tensor] = []
    encoder = qwen_like(calls)
    cache = VisionOutputCache(8)
    pixels, grid = _images([2, 3, 1])
    first = cache.encode(encoder, (pixels, grid), {"return_dict": True}, ["a", "b", "c"])
    whole = encoder(pixels, grid)
    for got, want in zip(first.pooler_output, whole.pooler_output):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(first.deepstack_features[0][1], whole.deepstack_features[0][1], rtol=0, atol=0)
    # "b" again (same rows), a new "d", and "d" twice in one call: the encoder sees "d" once.
    b_rows = pixels[2:5]
    d_rows = torch.full((2, 3), 0.5)
    out = cache.encode(
        encoder,
        (torch.cat([b_rows, d_rows, d_rows]),),
        {"image_grid_thw": torch.tensor([[1, 1, 3], [1, 1, 2], [1, 1, 2]])},
        ["b", "d", "d"],
    )
    assert calls[-1].tolist() == [[1, 1, 2]]
    torch.testing.assert_close(out.pooler_output[0], whole.pooler_output[1], rtol=0, atol=0)
    torch.testing.assert_close(out.pooler_output[1], 2 * d_rows.sum(0, keepdim=True), rtol=0, atol=0)
    assert out.pooler_output[2] is out.pooler_output[1] or torch.equal(out.pooler_output[2], out.pooler_output[1])
    assert (cache.misses, cache.hits) == (4, 2)
    calls.clear()
    cache.encode(encoder, (pixels, grid), {}, ["a", "b", "c"])
    assert calls == []  # all kept: no encoder call at all


def test_the_cache_keeps_the_most_recently_used_and_serves_a_call_larger_than_itself():
    calls: list[torch.Tensor] = []
    encoder = qwen_like(calls)
    cache = VisionOutputCache(2)
    pixels, grid = _images([1, 1, 1])
    out = cache.encode(encoder, (pixels, grid), {}, ["a", "b", "c"])
    assert len(out.pooler_output) == 3 and len(cache) == 2 and "a" not in cache and "b" in cache and "c" in cache
    cache.get("b")  # b used last: d evicts c
    cache.put("d", {"pooled": torch.zeros(1, 3)})
    assert "b" in cache and "d" in cache and "c" not in cache
    with pytest.raises(ValueError, match="at least one image"):
        VisionOutputCache(0)


def test_a_call_the_cache_cannot_split_is_left_to_the_encoder():
    calls: list[torch.Tensor] = []
    encoder = qwen_like(calls)
    cache = VisionOutputCache(8)
    pixels, grid = _images([2, 2])
    assert cache.encode(encoder, (pixels, grid), {}, ["a"]) is None  # two images, one key
    assert cache.encode(encoder, (pixels[:3], grid), {}, ["a", "b"]) is None  # rows do not add up

    def with_sizes(pixel_values, image_sizes, **kwargs):  # another per-image tensor (LLaVA-NeXT)
        return Encoded(tuple(pixel_values))

    assert cache.encode(with_sizes, (torch.zeros(2, 3), torch.ones(2, 2)), {}, ["a", "b"]) is None

    def clip_like(pixel_values, vision_feature_layer=-1, **kwargs):  # one row per image (LLaVA)
        calls.append(pixel_values.shape[0])
        return Encoded(tuple(p[None] * 3 for p in pixel_values))

    images = torch.arange(12.0).reshape(3, 4)
    out = cache.encode(clip_like, (images,), {"vision_feature_layer": -2}, ["x", "y", "x"])
    assert calls[-1] == 2 and torch.equal(out.pooler_output[2], images[0][None] * 3) and len(cache) == 2
