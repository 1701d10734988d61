"""Edges of ``distributions.py`` that the mutation run (scripts/mutation.sh) found untested: the
default chunk size, a reference head of its own, the no-grad and empty paths of
``chunked_token_stats``, masked means along other dimensions, and special tokens before the thoughts.
Every expected value is a naive full-tensor computation or a closed form."""

import math

import pytest
import torch

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.policy.distributions import (
    LOGITS_CHUNK_ELEMENTS,
    REPLACEMENT_CHAR,
    chunked_token_stats,
    logits_chunk_tokens,
    masked_mean,
    masked_sum,
    process_logits,
    response_token_weights,
    thought_token_mask,
    token_char_ends,
    token_entropy,
    token_kl,
    token_log_probs,
)
from helpers import PieceTokenizer
from numerics import f32_tolerance, logit_terms


def _case(seed=0, B=2, R=3, H=4, V=11):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, R, H, generator=g)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    temps = torch.tensor([0.7, 1.3][:B])
    tokens = torch.randint(1, V, (B, R), generator=g)
    mask = torch.ones(B, R, dtype=torch.bool)
    mask[1, -1] = False
    return hidden, head, temps, tokens, mask


def test_logits_chunk_tokens_closed_form():
    assert LOGITS_CHUNK_ELEMENTS == 2**23
    assert logits_chunk_tokens(2**20) == 8
    assert logits_chunk_tokens(151_936) == 55  # Qwen's vocabulary: 55 positions per 32 MB chunk
    assert logits_chunk_tokens(2**24) == 1  # never 0 positions, however large the vocabulary


def test_default_chunk_size_comes_from_the_head_or_the_logits():
    """Without ``chunk_tokens`` the vocabulary is read from ``head.out_features`` (or from raw logits);
    the numbers are those of any explicit chunk size. A head that does not tell its size is refused."""
    hidden, head, temps, tokens, mask = _case()
    one = chunked_token_stats(hidden, tokens, temps, None, mask, head=head, chunk_tokens=1)
    auto = chunked_token_stats(hidden, tokens, temps, None, mask, head=head)
    logits = head(hidden).detach()
    from_logits = chunked_token_stats(logits, tokens, temps, None, mask)
    scale = float((logits / temps[:, None, None]).abs().max()) + 1.0
    atol = f32_tolerance(
        logit_terms(head.in_features, head.out_features), scale
    )  # lm_head over 1 or all positions at once
    for a, b, c in zip(one, auto, from_logits):
        if a is not None:
            torch.testing.assert_close(a, b, atol=atol, rtol=0)
            torch.testing.assert_close(a, c, atol=atol, rtol=0)
    with pytest.raises(
        ValueError,
        match=r"^cannot tell the vocabulary size of head function; pass chunk_tokens=logits_chunk_tokens\(V\)$",
    ):
        chunked_token_stats(hidden, tokens, temps, None, mask, head=lambda x: head(x))
    with pytest.raises(ValueError, match="^chunk_tokens=0 must be >= 1$"):
        chunked_token_stats(hidden, tokens, temps, None, mask, head=head, chunk_tokens=0)


@pytest.mark.parametrize("bad", ["mask", "inputs"])
def test_shapes_must_agree_on_batch_and_length(bad):
    hidden, head, temps, tokens, mask = _case()
    if bad == "mask":
        mask = mask[:, :2]
    else:
        hidden = hidden[:, :2]
    with pytest.raises(
        ValueError, match=r"^inputs \(2, \d, 4\), tokens \(2, 3\) and mask \(2, \d\) must agree on \(B, R\)$"
    ):
        chunked_token_stats(hidden, tokens, temps, None, mask, head=head, chunk_tokens=2)


def test_kl_uses_the_reference_head_and_reference_logits():
    """The reference side goes through ``ref_head`` when one is given (LoRA on lm_head: the original
    layer), and reads raw reference logits when there is no head at all."""
    hidden, head, temps, tokens, mask = _case(seed=1)
    ref_head = torch.nn.Linear(4, 11, bias=False)
    ref = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(5))
    got = chunked_token_stats(
        hidden, tokens, temps, None, mask, head=head, ref_inputs=ref, ref_head=ref_head, chunk_tokens=2
    )
    with torch.no_grad():
        want = token_kl(process_logits(head(hidden), temps, None), process_logits(ref_head(ref), temps, None))
    with torch.no_grad():
        scale = (
            max(float((h(x) / temps[:, None, None]).abs().max()) for h, x in ((head, hidden), (ref_head, ref))) + 1.0
        )
    atol = f32_tolerance(logit_terms(4, 11), scale)
    torch.testing.assert_close(got.kl[mask], want[mask], atol=atol, rtol=0)
    own = chunked_token_stats(hidden, tokens, temps, None, mask, head=head, ref_inputs=ref, chunk_tokens=2)
    assert (own.kl[mask] - got.kl[mask]).abs().max() > 1e-3  # the default reference head is ``head``
    logits, ref_logits = head(hidden).detach(), ref_head(ref).detach()
    raw = chunked_token_stats(logits, tokens, temps, None, mask, ref_inputs=ref_logits, chunk_tokens=2)
    torch.testing.assert_close(raw.kl[mask], want[mask], atol=atol, rtol=0)


def test_no_grad_and_empty_masks():
    """Under ``no_grad`` (the rollout's recompute) the numbers are the same; an all-padding batch
    gives zeros of the right shape and dtype, with no chunk computed."""
    hidden, head, temps, tokens, mask = _case(seed=2)
    with_grad = chunked_token_stats(hidden, tokens, temps, None, mask, head=head, chunk_tokens=2)
    with torch.no_grad():
        without = chunked_token_stats(hidden, tokens, temps, None, mask, head=head, chunk_tokens=2)
    torch.testing.assert_close(with_grad.log_probs.detach(), without.log_probs)
    torch.testing.assert_close(with_grad.entropy.detach(), without.entropy)
    empty = chunked_token_stats(
        hidden, tokens, temps, None, torch.zeros_like(mask), head=head, ref_inputs=hidden, chunk_tokens=2
    )
    for t in empty:
        assert t.shape == (2, 3) and t.dtype == torch.float32 and (t == 0).all()


def test_process_logits_without_forbidden_ids_and_its_shape_message():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(process_logits(logits, torch.tensor([2.0]), None), logits / 2)
    torch.testing.assert_close(
        process_logits(logits, torch.tensor([2.0]), torch.tensor([], dtype=torch.long)), logits / 2
    )
    with pytest.raises(ValueError, match=r"^temperatures must have shape \(B,\) = \(1,\), got \(3,\)$"):
        process_logits(logits, torch.ones(3), None)


def test_token_stats_of_a_forbidden_free_distribution():
    """Entropy and KL are exact where forbidden entries are absent from both sides (no -inf masking)."""
    z = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    assert token_entropy(z).item() == pytest.approx(1.5 * 0.6931471805599453, rel=1e-6)  # 1.5 bits in nats
    q = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    assert token_kl(z, q).item() == pytest.approx(0.5 * 0.6931471805599453 - 0.25 * 0.6931471805599453, rel=1e-6)
    assert token_log_probs(z[:, None], torch.tensor([[1]])).item() == pytest.approx(-2 * 0.6931471805599453, rel=1e-6)


def test_masked_mean_per_row_and_along_another_dimension():
    x = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    mask = torch.tensor([[True, False, False], [True, True, True]])
    # row means over their own counts (1 and 3), a row of one element included
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor([1.0, 20.0]))
    # column means: counts 2, 1, 1
    torch.testing.assert_close(masked_mean(x, mask, dim=0), torch.tensor([5.5, 20.0, 30.0]))
    assert masked_mean(x, torch.zeros_like(mask)).tolist() == [0.0, 0.0]  # empty rows give 0


def test_special_token_before_the_thoughts_shifts_no_weight():
    """Spans are found in the text with special tokens skipped, the same text the token offsets are
    measured in: a special token in front of the reply must not shift the thought tokens."""
    text = prompts.format_response("look left", prompts.Answer("B"))
    pieces = {i: ch for i, ch in enumerate(text)}
    bos = len(text)
    pieces[bos] = "<|im_start|>"
    tok = PieceTokenizer(pieces, special={bos})
    w = response_token_weights(tok, [bos] + list(range(len(text))), 0.5)
    t0, t1 = prompts.response_spans(text)[0]
    expect = torch.ones(len(text) + 1)
    expect[1 + t0 : 1 + t1] = 0.5
    assert expect[0] == 1.0 and w.tolist() == expect.tolist()


class HFDefaultTokenizer(PieceTokenizer):
    """Like a Hugging Face tokenizer, ``decode`` keeps special tokens unless told to skip them."""

    def decode(self, ids, skip_special_tokens=False):
        return super().decode(ids, skip_special_tokens)

    def batch_decode(self, batch, skip_special_tokens=False):
        return super().batch_decode(batch, skip_special_tokens)


class BytePieceTokenizer:
    """Byte-level BPE in miniature: each id is a byte string, and a token may end inside a UTF-8
    character (decoded to U+FFFD until the next token completes it)."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=False):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def batch_decode(self, batch, skip_special_tokens=False):
        return [self.decode(ids) for ids in batch]


def test_char_ends_skip_special_tokens_with_hf_defaults():
    """Offsets are measured in the text without special tokens, also with a tokenizer whose default
    keeps them (Hugging Face's): a leading ``<|im_start|>`` must cover nothing and shift nothing. A
    genuine U+FFFD in the text is a character, not a split one."""
    tok = HFDefaultTokenizer({0: "<|im_start|>", 1: "a", 2: REPLACEMENT_CHAR, 3: "b"}, special={0})
    assert token_char_ends(tok, [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert token_char_ends(PieceTokenizer({0: "a", 1: REPLACEMENT_CHAR}), [0, 1]) == [1, 2]


def test_char_ends_token_ending_inside_a_character_keeps_its_complete_ones():
    """'b' plus the first byte of 'é' covers 'b'; the next token, which completes 'é', covers it."""
    tok = BytePieceTokenizer({0: b"a", 1: b"b\xc3", 2: b"\xa9", 3: b"\xc3", 4: b"\xa9c"})
    assert token_char_ends(tok, [0, 1, 2]) == [1, 2, 3]
    assert token_char_ends(tok, [3, 4]) == [0, 2]  # a first token that is only a partial byte covers nothing


def test_thought_mask_from_the_first_character_and_of_empty_tokens():
    """Token 0 covers ``[0, end0)``; tokens covering no character (special tokens, partial bytes)
    are never thought tokens, even inside the span."""
    assert thought_token_mask([1, 2, 3], (0, 2)).tolist() == [True, True, False]
    assert thought_token_mask([1, 3, 3, 5], (0, 5)).tolist() == [True, True, False, True]


def test_response_weights_above_one_and_with_hf_defaults():
    """A thought weight above 1 is applied too (only exactly 1 skips the offsets), and the spans are
    read from the text without special tokens whatever the tokenizer's default."""
    text = prompts.format_response("look", prompts.Answer("B"))
    pieces = {i: ch for i, ch in enumerate(text)}
    bos = len(text)
    pieces[bos] = "<|im_start|>"
    t0, t1 = prompts.response_spans(text)[0]
    for tok in (PieceTokenizer(pieces, special={bos}), HFDefaultTokenizer(pieces, special={bos})):
        w = response_token_weights(tok, [bos] + list(range(len(text))), 2.0)
        expect = torch.ones(len(text) + 1)
        expect[1 + t0 : 1 + t1] = 2.0
        assert w.tolist() == expect.tolist()


def test_default_chunk_of_raw_logits_follows_the_vocabulary(monkeypatch):
    """Without a head the chunk size comes from the logits' last dimension (V), not from the
    sequence length: at V = 2**20 a chunk is 8 positions, so 9 positions take two chunks."""
    import a2c_ppo_acktr.policy.distributions as dist

    calls = []
    real = dist._chunk_stats

    def counting(*args):
        calls.append(args[3].numel())  # rows of this chunk
        return real(*args)

    monkeypatch.setattr(dist, "_chunk_stats", counting)
    V = 2**20
    logits = torch.zeros(1, 9, V)
    with torch.no_grad():
        st = chunked_token_stats(
            logits, torch.zeros(1, 9, dtype=torch.long), torch.ones(1), None, torch.ones(1, 9, dtype=torch.bool)
        )
    assert calls == [8, 1]
    torch.testing.assert_close(st.log_probs, torch.full((1, 9), -math.log(V)))


def test_all_padding_batch_is_float32_whatever_the_input_dtype():
    """Stats are float32 (the docstring's contract), also when no position is computed and the inputs
    are bf16 hidden states (mixed precision)."""
    hidden, head, temps, tokens, mask = _case(seed=3)
    empty = chunked_token_stats(
        hidden.bfloat16(), tokens, temps, None, torch.zeros_like(mask), head=head.bfloat16(), chunk_tokens=2
    )
    assert empty.log_probs.dtype == torch.float32 and empty.entropy.dtype == torch.float32


def test_masked_sum_keeps_integer_counts_integer():
    """Summing integer tensors (counts) gives exact integers, not floats."""
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    mask = torch.tensor([[True, False, True], [False, False, False]])
    got = masked_sum(x, mask)
    assert got.dtype == torch.int64 and got.tolist() == [4, 0]
