"""bench/bench_text_conditional.py: its references by hand and one tiny end-to-end run (2 steps)."""

from __future__ import annotations


import pytest
import torch


from bench_helpers import bench_module


@pytest.fixture(scope="module")
def tc():
    yield from bench_module("bench_text_conditional")


def test_questions_and_mean_mra_by_hand(tc):
    qs = tc.questions([0], 2)
    assert len(qs) == 2 and all(q.question_type == tc.QTYPE for q in qs)
    assert tc.mean_mra([float(qs[0].ground_truth), None], qs) == 0.5  # exact, then no answer


def test_trainable_sets(tc, tiny_model_path):
    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.loading import load_vlm

    base = load_vlm(ModelConfig(model_path=tiny_model_path, device="cpu")).model
    before = {n: (p.requires_grad, p.detach().clone()) for n, p in base.named_parameters()}
    names = {s: [n for n, p in tc.trainable_model(base, s).named_parameters() if p.requires_grad] for s in tc.SETTINGS}
    assert names["lora"] and all("lora_" in n for n in names["lora"]) and not any("embed" in n for n in names["lora"])
    assert any("lora_embedding_A" in n for n in names["lora+embed"])
    assert any("embed_tokens" in n for n in names["full"]) and not any("visual" in n for n in names["full"])
    assert set(names["full-embed"]) == {n for n in names["full"] if "embed_tokens" not in n}
    for n, p in base.named_parameters():  # each setting works on a copy: the loaded model is untouched
        assert p.requires_grad == before[n][0] and torch.equal(p, before[n][1]), n


def test_two_steps_end_to_end(tc, tiny_model_path, capsys):
    text = tc.main(
        [
            "--settings",
            "lora",
            "--steps",
            "2",
            "--eval-every",
            "2",
            "--model-path",
            tiny_model_path,
            "--train-scenes",
            "4",
        ]
    )
    assert "| lora |" in text and "step 2" in text
    assert "Best constant answer" in text and "per-category oracle" in text


def test_category_cosines_by_hand(tc):
    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return type("Enc", (), {"input_ids": [9, {" a": 0, " b": 1, " c": 2}[text]]})()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e = torch.nn.Embedding(3, 2)
            self.e.weight.data = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])

        def get_input_embeddings(self):
            return self.e

    mean, low, high = tc.category_cosines(Model(), Tok(), ["a", "b", "c"])
    s = 2**-0.5  # a.b = 0, a.c = b.c = cos 45 degrees
    assert (mean, low, high) == pytest.approx(((0 + s + s) / 3, 0.0, s))
