"""Token log-probs under temperature and masks, the thought/action weighting, entropy and KL."""

import math

import pytest
import torch
from helpers import PieceTokenizer
from numerics import f32_tolerance, logit_terms

from a2c_ppo_acktr.common import prompts
from a2c_ppo_acktr.policy.distributions import (
    masked_mean,
    process_logits,
    response_token_weights,
    sequence_log_prob,
    thought_token_mask,
    token_char_ends,
    token_entropy,
    token_kl,
    token_log_probs,
    token_weights,
)


class ByteTokenizer:
    """Byte-level: ids are UTF-8 bytes; an incomplete trailing character decodes to U+FFFD."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")

    def batch_decode(self, batch, skip_special_tokens=True):
        return [self.decode(ids) for ids in batch]


def test_thought_coef_weights_exactly_the_thought_tokens():
    # tokens:      '{"t": '  '"ab'  'c"'  ', "a": '  '{"x": 1}'  '}'  <eos>
    char_ends = [6, 9, 11, 18, 26, 27, 27]
    thought_span = (6, 11)  # the string literal "abc" with its quotes
    mask = thought_token_mask(char_ends, thought_span)
    assert mask.tolist() == [False, True, True, False, False, False, False]
    w = token_weights(char_ends, thought_span, 0.25)
    logp = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, 99.0]])  # last one is padding
    valid = torch.tensor([[True] * 7 + [False]])
    weights = torch.cat([w, torch.ones(1)])[None]
    got = sequence_log_prob(logp, weights, valid)
    assert got.item() == pytest.approx(0.25 * (-2 - 3) + (-1 - 4 - 5 - 6 - 7))
    # no thought span (text did not parse): every token weighs 1
    assert token_weights(char_ends, None, 0.25).tolist() == [1.0] * 7


def test_char_ends_with_special_tokens_and_split_characters():
    tok = PieceTokenizer({0: '{"thoughts": "', 1: "hi", 2: '", "action": {"answer": "B"}}', 3: "<eos>"}, special={3})
    assert token_char_ends(tok, [0, 1, 2, 3]) == [14, 16, 45, 45]
    # "é" is two bytes: the first byte covers no character, the second carries it.
    ids = list("aé b".encode())
    ends = token_char_ends(ByteTokenizer(), ids)
    assert ends == [1, 1, 2, 3, 4]


def test_response_token_weights_uses_prompts_spans():
    text = prompts.format_response("look left", prompts.Answer("B"))
    # one character per token, plus an end token that decodes to nothing
    pieces = {i: ch for i, ch in enumerate(text)}
    eos = len(text)
    pieces[eos] = "<eos>"
    tok = PieceTokenizer(pieces, special={eos})
    w = response_token_weights(tok, list(range(len(text))) + [eos], 0.5)
    t0, t1 = prompts.response_spans(text)[0]
    expect = torch.ones(len(text) + 1)
    expect[t0:t1] = 0.5
    assert torch.equal(w, expect)
    # a truncated response ('{"t') has no thoughts value: all tokens weigh 1
    assert response_token_weights(tok, [0, 1, 2], 0.5).tolist() == [1.0, 1.0, 1.0]


def test_process_logits_temperature_and_forbidden_ids():
    logits = torch.tensor([[[1.0, 2.0, 3.0, 4.0]], [[0.0, 0.0, 0.0, 0.0]]])
    temps = torch.tensor([2.0, 0.5], requires_grad=True)
    out = process_logits(logits, temps, torch.tensor([3]))
    assert torch.isneginf(out[..., 3]).all()
    torch.testing.assert_close(out[0, 0, :3], torch.tensor([0.5, 1.0, 1.5]))
    lp = token_log_probs(out, torch.tensor([[2], [0]]))
    expect0 = 1.5 - math.log(math.exp(0.5) + math.exp(1.0) + math.exp(1.5))
    assert lp[0, 0].item() == pytest.approx(expect0, rel=1e-6)
    assert lp[1, 0].item() == pytest.approx(-math.log(3), rel=1e-6)
    lp.sum().backward()
    assert temps.grad is not None and temps.grad[0] != 0  # gradients reach the temperature
    with pytest.raises(ValueError, match="temperatures must have shape"):
        process_logits(logits, torch.ones(3), None)


def test_entropy_and_kl_with_forbidden_ids_are_finite_and_exact():
    logits = torch.zeros(1, 2, 5, requires_grad=True)
    forbid = torch.tensor([0, 4])
    p = process_logits(logits, torch.ones(1), forbid)
    ent = token_entropy(p)
    torch.testing.assert_close(ent, torch.full((1, 2), math.log(3)))
    kl_same = token_kl(p, p.detach())
    assert kl_same.abs().max() < 1e-7
    q_logits = torch.tensor([[[0.0, 1.0, 0.0, 0.0, 0.0]] * 2])
    q = process_logits(q_logits, torch.ones(1), forbid)
    kl = token_kl(p, q)
    z = math.e + 2
    expect = sum((1 / 3) * (math.log(1 / 3) - math.log(pq)) for pq in (math.e / z, 1 / z, 1 / z))
    assert kl[0, 0].item() == pytest.approx(expect, rel=1e-5)
    (ent.sum() + kl.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_masked_mean_ignores_padding_values():
    x = torch.tensor([[1.0, 3.0, float("nan")], [0.0, 0.0, 0.0]])
    m = torch.tensor([[True, True, False], [False, False, False]])
    assert masked_mean(x, m).tolist() == [2.0, 0.0]


def _naive_stats(inputs, tokens, temps, forbid, head, ref_inputs):
    """The unchunked computation the training forward used to do: full (B, R, V) float32 logits."""
    z = process_logits(head(inputs) if head is not None else inputs, temps, forbid)
    with torch.no_grad():
        zr = process_logits(head(ref_inputs) if head is not None else ref_inputs, temps.detach(), forbid)
    return token_log_probs(z, tokens), token_entropy(z), token_kl(z, zr)


def _stats_case(seed=0, B=3, R=7, H=6, V=17):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, R, H, generator=g, requires_grad=True)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    temps = torch.tensor([0.3, 1.0, 1.7][:B], requires_grad=True)  # per-row temperature, with grad
    forbid = torch.tensor([0, 5, V - 1])
    tokens = torch.randint(1, V - 1, (B, R), generator=g)
    tokens[tokens == 5] = 4  # generated tokens are never forbidden
    lengths = torch.tensor([R, 3, 1][:B])  # rows of different lengths (right padding)
    mask = torch.arange(R)[None] < lengths[:, None]
    ref = torch.randn(B, R, H, generator=g)
    return hidden, head, temps, forbid, tokens, mask, ref


@pytest.mark.parametrize("chunk_tokens", [1, 4, 1000])
def test_chunked_token_stats_equal_the_naive_values_and_gradients(chunk_tokens):
    """Values and gradients (hidden states, temperatures, lm_head weight) agree with the full-logits
    computation for any chunk size: one position per chunk, chunks across rows, one chunk."""
    from a2c_ppo_acktr.policy.distributions import chunked_token_stats

    hidden, head, temps, forbid, tokens, mask, ref = _stats_case()
    got = chunked_token_stats(hidden, tokens, temps, forbid, mask, head=head, ref_inputs=ref, chunk_tokens=chunk_tokens)
    want = _naive_stats(hidden, tokens, temps, forbid, head, ref)
    # Chunking changes the matmul's blocking: each statistic sums H products per logit, then V terms.
    with torch.no_grad():
        scale = max(float((head(x) / temps[:, None, None]).abs().max()) for x in (hidden, ref)) + 1.0
    atol = f32_tolerance(logit_terms(head.in_features, head.out_features), scale)
    for g, w in zip(got, want):
        torch.testing.assert_close(g[mask], w[mask], atol=atol, rtol=0)
        assert (g[~mask] == 0).all()  # padding is not computed
    # A loss of the kind PPO builds: weighted sums over the valid positions of all three.
    coef = torch.randn(3, *tokens.shape, generator=torch.Generator().manual_seed(1))
    params = [hidden, temps, head.weight]
    grads = torch.autograd.grad(sum((c * s * mask).sum() for c, s in zip(coef, got)), params)
    naive = torch.autograd.grad(sum((c * torch.where(mask, s, 0.0)).sum() for c, s in zip(coef, want)), params)
    # Chunking reorders float32 sums: a gradient entry gathers up to B * R position terms (the lm_head
    # weight's), each one rounded to eps of the largest magnitude involved, so the two computations may
    # differ by about (B * R) * eps * max|grad|, whatever the CPU's kernels (a fixed 1e-6 failed on one).
    eps = torch.finfo(torch.float32).eps
    for g, w in zip(grads, naive):
        assert g.abs().max() > 0
        torch.testing.assert_close(g, w, atol=tokens.numel() * eps * float(w.abs().max()), rtol=0)


def test_chunked_token_stats_from_logits_and_without_reference():
    """``head=None`` reads raw logits; no reference gives ``kl=None``; a forbidden token scores -inf."""
    from a2c_ppo_acktr.policy.distributions import chunked_token_stats

    hidden, head, temps, forbid, tokens, mask, _ = _stats_case(seed=2)
    logits = head(hidden).detach().requires_grad_(True)
    tokens = tokens.clone()
    tokens[0, 0] = 5  # forbidden: log-prob -inf, exactly as token_log_probs gives
    got = chunked_token_stats(logits, tokens, temps, forbid, mask, chunk_tokens=3)
    assert got.kl is None and torch.isneginf(got.log_probs[0, 0])
    z = process_logits(logits, temps, forbid)
    want_lp, want_ent = token_log_probs(z, tokens), token_entropy(z)
    finite = z.detach()[torch.isfinite(z.detach())]
    atol = f32_tolerance(logit_terms(0, logits.shape[-1]), float(finite.abs().max()) + 1.0)  # no matmul here: V terms
    torch.testing.assert_close(got.log_probs[mask], want_lp[mask], atol=atol, rtol=0)
    torch.testing.assert_close(got.entropy[mask], want_ent[mask], atol=atol, rtol=0)
    keep = mask.clone()
    keep[0, 0] = False
    g1 = torch.autograd.grad((got.log_probs[keep].sum() + got.entropy[mask].sum()), [logits, temps])
    g2 = torch.autograd.grad((want_lp[keep].sum() + want_ent[mask].sum()), [logits, temps])
    for a, b in zip(g1, g2):  # a temperature's gradient sums every position's V terms
        torch.testing.assert_close(
            a,
            b,
            atol=f32_tolerance(tokens.numel() * logit_terms(0, logits.shape[-1]), float(b.abs().max()) + 1.0),
            rtol=0,
        )


def test_chunked_token_stats_keep_no_vocabulary_sized_tensor_for_backward():
    """What autograd keeps between forward and backward is O(B*R*H), never a (.., V) tensor, and
    ``lm_head`` only ever sees ``chunk_tokens`` positions, in forward and in the backward recompute."""
    from a2c_ppo_acktr.policy.distributions import chunked_token_stats

    B, R, H, V, chunk = 2, 16, 4, 512, 5
    hidden, head, temps, forbid, tokens, mask, ref = _stats_case(seed=3, B=2, R=R, H=H, V=V)
    rows_seen = []
    head.register_forward_hook(lambda _m, args, _o: rows_seen.append(args[0].shape[0]))
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stats = chunked_token_stats(hidden, tokens, temps, forbid, mask, head=head, ref_inputs=ref, chunk_tokens=chunk)
        loss = stats.log_probs.sum() + stats.entropy.sum() + stats.kl.sum()
    n_valid = int(mask.sum())
    assert saved and not any(V in s for s in saved), saved
    assert max(math.prod(s) for s in saved) <= B * R * H  # nothing bigger than the hidden states
    loss.backward()
    n_chunks = -(-n_valid // chunk)
    # policy and reference heads per chunk, in forward and again in the backward's recompute (the
    # reference log-probs are needed by the KL's gradient; storing them would be the (B, R, V) tensor)
    assert len(rows_seen) == 4 * n_chunks and max(rows_seen) == chunk
    # the naive computation keeps (B, R, V) float32 tensors alive for backward
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _naive_stats(hidden, tokens, temps, forbid, head, ref)
    assert (B, R, V) in saved


def test_extra_empty_chunks_change_nothing_but_the_number_of_head_calls():
    """``num_chunks`` (every ZeRO-3 rank the same number of lm_head collectives): the padded-out chunks
    call the policy and reference heads in the forward and the backward's recompute like any other,
    and the statistics and gradients are bit-identical to the unpadded ones."""
    from a2c_ppo_acktr.policy.distributions import chunked_token_stats

    hidden, head, temps, forbid, tokens, mask, ref = _stats_case(seed=4)
    chunk = 3
    needed = -(-int(mask.sum()) // chunk)
    calls = []
    head.register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    results = []
    for num_chunks in (None, needed + 2):
        calls.clear()
        stats = chunked_token_stats(
            hidden, tokens, temps, forbid, mask, head=head, ref_inputs=ref, chunk_tokens=chunk, num_chunks=num_chunks
        )
        grads = torch.autograd.grad(
            stats.log_probs.sum() + stats.entropy.sum() + stats.kl.sum(), [hidden, temps, head.weight]
        )
        results.append((stats, grads, list(calls)))
    (plain, plain_grads, plain_calls), (padded, padded_grads, padded_calls) = results
    assert len(plain_calls) == 4 * needed  # policy + reference heads, forward + recompute
    assert len(padded_calls) == 4 * (needed + 2) and padded_calls.count(0) == 4 * 2
    for a, b in zip([*plain, *plain_grads], [*padded, *padded_grads]):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="fewer than"):
        chunked_token_stats(hidden, tokens, temps, forbid, mask, head=head, chunk_tokens=chunk, num_chunks=needed - 1)
