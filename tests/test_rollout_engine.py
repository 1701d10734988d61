"""The rollout-engine seam (``rollout.engine=vllm``) through a loopback server speaking vLLM's
OpenAI-compatible protocol, backed by the tiny model: the engine's contract (per-row temperature,
adapter versions, stale replies, token ids, prompt alignment, a dead server), the policy's three-step
act, and training through it (ratio 1, exact resume, a server dying mid-run)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.algo.surrogate import policy_loss, tis_weights
from a2c_ppo_acktr.config.arguments import ConfigError, load_config
from a2c_ppo_acktr.run.logger import read_metrics
from a2c_ppo_acktr.policy.loopback_server import LoopbackServer
from a2c_ppo_acktr.policy.model import VLMPolicy
from a2c_ppo_acktr.policy.rollout_engine import (
    BadReplyError,
    EngineError,
    EngineRow,
    EngineStopped,
    EngineUnavailable,
    StaleAdapterError,
    TokenAlignmentError,
    VLLMServerEngine,
    adapter_name,
    parse_reply,
)
from a2c_ppo_acktr.algo.storage import RolloutStorage
from helpers import QUESTIONS, free_port, fresh_policy, observation_rows, run_overrides, tiny_model_cfg
from numerics import recorded_forwards


# ------------------------------------------------------------------------------ pure parts
def test_tis_weights_and_the_weighted_surrogate_match_their_closed_form():
    old = torch.tensor([0.0, -1.0, -2.0, -1.0])
    engine = torch.tensor([-0.5, -1.0, 0.0, float("nan")])
    w = tis_weights(old, engine, cap=1.5)
    # exp(0.5) = 1.65 -> capped at 1.5; exp(0) = 1; exp(-2); an unscored turn weighs 1.
    assert w.tolist() == pytest.approx([1.5, 1.0, math.exp(-2.0), 1.0])
    new = torch.tensor([0.3, -1.2, -1.9, -0.7], requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    ones = torch.ones(4, 1)
    loss, _ = policy_loss(
        new[:, None],
        old[:, None],
        adv,
        ones.bool(),
        ones,
        level="sequence",
        clip_low=0.2,
        clip_high=0.2,
        sample_weights=w,
    )
    ratio = (new - old).exp()
    per = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    assert float(loss.detach()) == pytest.approx(float((per * w).mean().detach()), rel=1e-6)
    loss.backward()
    assert new.grad is not None and float(new.grad[0]) == pytest.approx(
        0.0
    )  # ratio e^0.3 > 1.2 with A > 0: clipped, no gradient
    assert torch.equal(tis_weights(old, None, 2.0), torch.ones(4))


def test_parse_reply_reads_ids_and_log_probs_and_appends_an_unlisted_stop_token():
    data = {
        "model": "policy-v3",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "token_ids": [7, 8],
                "finish_reason": "stop",
                "stop_reason": 99,
                "logprobs": {
                    "content": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:8", "logprob": -1.0}]
                },
            }
        ],
    }
    r = parse_reply(data, stop_ids=[99, 100])
    assert (r.token_ids, r.model, r.prompt_ids) == ([7, 8, 99], "policy-v3", [1, 2, 3])
    assert r.token_log_probs[:2] == [-0.5, -1.0] and math.isnan(r.token_log_probs[2])
    # The stop token already there: nothing appended; log-probs naming other tokens are not trusted.
    data["choices"][0]["token_ids"] = [7, 99]
    data["choices"][0]["logprobs"]["content"][1]["token"] = "token_id:8"
    r = parse_reply(data, stop_ids=[99])
    assert r.token_ids == [7, 99] and r.token_log_probs is None
    with pytest.raises(EngineError, match="return_token_ids"):
        parse_reply({"model": "x", "choices": [{"message": {"content": "hi"}}]})
    # vLLM keeps an EOS it stopped on in token_ids, one not among stop_ids included (stop_reason None): nothing
    # appended.
    eos = {"model": "m", "choices": [{"token_ids": [7, 42], "finish_reason": "stop", "stop_reason": None}]}
    assert parse_reply(eos, stop_ids=[99]).token_ids == [7, 42]
    # A reply cut for want of context (vLLM 0.33 shortens max_tokens to what --max-model-len leaves) is refused.
    cut = {"model": "m", "choices": [{"token_ids": [7, 8, 9], "finish_reason": "length"}]}
    assert parse_reply(cut, max_tokens=3).token_ids == [7, 8, 9]
    with pytest.raises(BadReplyError, match="--max-model-len"):
        parse_reply(cut, max_tokens=16)


def test_engine_settings_are_checked_in_one_line():
    with pytest.raises(ConfigError, match="engine_url"):
        load_config(preset="debug", overrides=["rollout.engine=vllm"])
    with pytest.raises(ConfigError, match="rollout.engine"):
        load_config(preset="debug", overrides=["rollout.engine=sglang"])
    with pytest.raises(ConfigError, match="tis_cap"):
        load_config(preset="debug", overrides=["ppo.tis_cap=2.0"])
    with pytest.raises(ConfigError, match="max_temperature"):
        load_config(
            preset="debug",
            overrides=["rollout.engine=vllm", "rollout.engine_url=http://x:1", "model.max_temperature=3"],
        )
    with pytest.raises(ConfigError, match="train_vision"):
        load_config(
            preset="debug",
            overrides=["rollout.engine=vllm", "rollout.engine_url=http://x:1", "model.train_vision=projector"],
        )


# ------------------------------------------------------------------------------ through the loopback server
@pytest.fixture(scope="module")
def server(tiny_model_path):
    with LoopbackServer(tiny_model_cfg(tiny_model_path)) as srv:
        yield srv


def _policy(loaded, path) -> VLMPolicy:
    pol = fresh_policy(loaded, path)
    with torch.no_grad():  # rows get different temperatures and the adapter is not the base model's
        for p in pol.temp_predictor.parameters():
            p.add_(0.5 * torch.randn_like(p))
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    return pol


def _spread_temperatures(pol: VLMPolicy, observations) -> None:
    """Set the temperature head so that the rows of ``observations`` get the temperatures of the
    pre-sigmoid outputs -1, 0 and 1 (0.77, 1.0, 1.23): apart by construction, where random head
    weights saturate on some builds and give two rows nearly the same temperature.

    One hidden unit reads the rows' hidden states (the head's input) along the direction that puts
    them at -1, 0 and 1 about their mean (exactly: three distinct prompts' states span a plane);
    the output layer passes it on.
    """
    inputs = []
    handle = pol.temp_predictor.register_forward_pre_hook(lambda _module, args: inputs.append(args[0].detach().float()))
    try:
        with torch.no_grad():
            pol.act(observations)
    finally:
        handle.remove()
    hidden = inputs[0]
    centre = hidden.mean(0)
    direction = torch.linalg.pinv(hidden - centre) @ torch.linspace(-1.0, 1.0, len(hidden))
    first, last = pol.temp_predictor.mlp[0], pol.temp_predictor.mlp[-1]
    with torch.no_grad():
        for layer in (first, last):
            layer.weight.zero_()
            layer.bias.zero_()
        first.weight[0] = direction
        first.bias[0] = -(direction @ centre)
        last.weight[0, 0] = 1.0 / math.tanh(1.0)


def _engine(pol, url, tmp_path, **over) -> VLLMServerEngine:
    kw = dict(
        max_new_tokens=pol.cfg.max_new_tokens,
        stop_ids=pol.eos_ids,
        forbidden_ids=pol.forbidden_ids.tolist(),
        retries=1,
        backoff_s=0.0,
        timeout_s=60.0,
    )
    return VLLMServerEngine(url, tmp_path / "adapters", **{**kw, **over})


def _observations(n=3, step=0):
    texts = [QUESTIONS[i % 3] for i in range(n)]
    return observation_rows(np.random.default_rng(step), texts, [1 + (i + step) % 2 for i in range(n)])


def test_act_through_the_engine_keeps_the_contract(loaded, tiny_model_path, server, tmp_path):
    pol = _policy(loaded, tiny_model_path)
    _spread_temperatures(pol, _observations())
    eng = _engine(
        pol, server.url, tmp_path, max_concurrency=1
    )  # one request at a time: the server's log is in row order
    assert "base" in eng.check_health()
    eng.sync_adapter(pol.save_pretrained, 1)
    before = len(server.requests)
    torch.manual_seed(3)
    with pol.with_engine(eng):
        out = pol.act(_observations())
    sent = server.requests[before:]
    # Per-row temperature reaches the server (the head predicted them before sampling): the rows'
    # temperatures lie farther apart than this comparison's tolerance, so one sent for another row fails it.
    temps = out.temperatures.tolist()
    assert [r["temperature"] for r in sent] == pytest.approx(temps, rel=1e-5)
    assert min(abs(a - b) for i, a in enumerate(temps) for b in temps[i + 1 :]) > 2e-5 * max(temps)
    assert all(r["model"] == adapter_name(1) and r["return_token_ids"] and r["logprobs"] for r in sent)
    assert sent[0]["stop_token_ids"] == pol.eos_ids and sent[0]["max_tokens"] == pol.cfg.max_new_tokens
    assert set(sent[0]["logit_bias"]) == {str(i) for i in pol.forbidden_ids.tolist()} and set(
        sent[0]["logit_bias"].values()
    ) == {-100}
    # Token ids round-trip: the ids the server sampled are the ones the policy stores and decodes.
    assert [g.tolist() for g in out.generated_ids] == server.replies[before:]
    assert out.texts == pol.tokenizer.batch_decode(server.replies[before:], skip_special_tokens=True)
    # Ratio 1 on the first minibatch: the update's forward of the stored turns gives the rollout's log-probs.
    st = RolloutStorage(1, 3)
    st.insert(out, torch.zeros(3), torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool))
    st.compute_returns(torch.zeros(3))
    (mb,) = list(st.ordered_minibatches(3))
    with torch.no_grad(), recorded_forwards(VLMPolicy) as forwards:
        ev = pol.evaluate_actions(mb)
    # Each pair computes the same turns in another batch layout: rounding only (numerics.forward_bounds).
    assert (ev.log_probs - mb.old_log_probs).abs().max() < forwards[0].log_prob
    # The log-probs are the policy's own (recomputed), and the server's match them (same model, each row alone).
    assert torch.isfinite(out.engine_log_probs).all()
    assert torch.allclose(out.engine_log_probs, out.log_probs, atol=forwards[0].log_prob, rtol=0)
    assert torch.equal(mb.engine_log_probs, out.engine_log_probs)
    # The same torch seed draws the same per-row seeds: the same replies (what makes resume exact),
    # also with the rows' requests in flight together (replies come back in row order).
    concurrent = _engine(pol, server.url, tmp_path / "c", max_concurrency=8)
    concurrent.sync_adapter(pol.save_pretrained, 1)
    torch.manual_seed(3)
    with pol.with_engine(concurrent):
        again = pol.act(_observations())
    assert [g.tolist() for g in again.generated_ids] == [g.tolist() for g in out.generated_ids]


def test_adapter_versions_advance_and_a_stale_reply_is_refused(loaded, tiny_model_path, server, tmp_path):
    pol = _policy(loaded, tiny_model_path)
    eng = _engine(pol, server.url, tmp_path)
    loads = len(server.loads)
    eng.sync_adapter(pol.save_pretrained, 1)
    eng.sync_adapter(pol.save_pretrained, 2)
    assert adapter_name(2) in server.adapters and adapter_name(1) not in server.adapters  # the old one unloaded
    assert server.loads[loads:] == [
        adapter_name(1),
        adapter_name(2),
    ]  # plain-text replies read as success: no retried load
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == [
        eng.adapter_path(2).name
    ]  # only the loaded version kept
    assert eng.adapter_path(2).name.startswith(adapter_name(2) + "-") and eng.stats.retries == 0
    with pol.with_engine(eng):
        pol.act(_observations(1))
    assert server.requests[-1]["model"] == adapter_name(2)
    server.answer_as = adapter_name(1)
    try:
        with pol.with_engine(eng), pytest.raises(StaleAdapterError, match="stale"):
            pol.act(_observations(1))
    finally:
        server.answer_as = None
    eng.sync_adapter(pol.save_pretrained, 3)  # leave the shared server without this test's adapter 2
    assert adapter_name(2) not in server.adapters


def test_one_adapter_per_iteration_serves_every_rank_of_a_server(loaded, tiny_model_path, server, tmp_path):
    """Two ranks on one server (a tensor-parallel group): rank 0 saves the adapter once, the group's
    first rank loads it, the other only asks for it by the same name. The server loads one adapter
    per iteration and never changes its batch's adapter within one; a second launch of the run
    (another session) replaces the name from a fresh path."""
    pol = _policy(loaded, tiny_model_path)
    kw = dict(tag="policy-shared", session="s1")
    loader, user = (
        _engine(pol, server.url, tmp_path, **kw),
        _engine(pol, server.url, tmp_path, loads_adapter=False, **kw),
    )
    assert not user.loads_adapter and user.adapter_path(1) == loader.adapter_path(1)  # one path for every rank
    loads, swaps, before = len(server.loads), server.adapter_swaps, len(server.requests)
    for version in (1, 2):
        loader.publish_adapter(pol.save_pretrained, version)
        loader.load_adapter(version)
        user.use_adapter(version)
        loader.discard_adapters(keep=version)
        for eng in (loader, user, loader, user):  # the ranks' requests interleave
            with pol.with_engine(eng):
                pol.act(_observations(2, step=version))
    names = [adapter_name(v, "policy-shared") for v in (1, 2)]
    assert server.loads[loads:] == names
    assert {r["model"] for r in server.requests[before : before + 8]} == {names[0]}
    assert server.adapter_swaps - swaps <= 1  # into v1 from an earlier test's adapter at most: never between the ranks
    relaunch = _engine(pol, server.url, tmp_path, tag="policy-shared", session="s2")
    relaunch.publish_adapter(pol.save_pretrained, 2)
    relaunch.load_adapter(2)  # "already loaded": unloaded and loaded again from the new path
    assert server.adapters[names[1]] == str(relaunch.adapter_path(2)) != str(loader.adapter_path(2))
    relaunch.discard_adapters(keep=2)
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == [relaunch.adapter_path(2).name]
    relaunch.sync_adapter(pol.save_pretrained, 3)
    assert names[1] not in server.adapters
    # What one adapter per rank would cost: with --max-loras 1 every alternation changes the batch's adapter.
    per_rank = [_engine(pol, server.url, tmp_path / f"r{r}", tag=f"policy-shared-r{r}") for r in (0, 1)]
    for eng in per_rank:
        eng.sync_adapter(pol.save_pretrained, 3)
    for max_loras, expected in ((1, 4), (2, 0)):
        server.max_loras, server.batch_adapters, swaps = max_loras, [], server.adapter_swaps
        try:
            for eng in per_rank * 2 + per_rank[:1]:
                with pol.with_engine(eng):
                    pol.act(_observations(1))
        finally:
            server.max_loras = 1
        assert server.adapter_swaps - swaps == expected
    for eng in per_rank:  # leave the shared server without them
        eng._request("POST", "/v1/unload_lora_adapter", {"lora_name": adapter_name(3, eng.tag)}, text_reply=True)


def test_the_loopback_server_refuses_what_vllm_refuses(loaded, tiny_model_path, server, tmp_path):
    """The ranks vLLM 0.33 accepts; an adapter above --max-lora-rank (a 500 that is not retried, and
    named); a prompt plus max_tokens over --max-model-len (400); a temperature above 2 (400); the
    version check of GET /version; plain-text replies of the LoRA routes."""
    import json
    import urllib.request

    with pytest.raises(ValueError, match="invalid choice"):
        LoopbackServer(tiny_model_cfg(tiny_model_path), max_lora_rank=4)
    pol = _policy(loaded, tiny_model_path)  # LoRA rank 4
    eng = _engine(pol, server.url, tmp_path, retries=3)
    server.max_lora_rank = 1
    try:
        with pytest.raises(EngineError, match="LoRA rank 4 is greater than max_lora_rank 1.*--max-lora-rank") as e:
            eng.sync_adapter(pol.save_pretrained, 1)
        assert "\n" not in str(e.value) and eng.stats.retries == 0
    finally:
        server.max_lora_rank = 16
    eng.sync_adapter(pol.save_pretrained, 1)
    row = EngineRow(messages=[{"role": "user", "content": "How many chairs?"}], prompt_ids=[], temperature=2.5, seed=0)
    with pytest.raises(EngineError, match=r"HTTP 400: .*temperature must be in \[0, 2\]"):
        eng.generate([row])
    row.temperature = 1.0
    server.max_model_len = 20
    try:
        with pytest.raises(EngineError, match="HTTP 400: .*maximum context length is 20 tokens"):
            eng.generate([row])
    finally:
        server.max_model_len = None
    body = json.dumps({"lora_name": "plain", "lora_path": str(eng.adapter_path(1))}).encode()
    req = urllib.request.Request(
        server.url + "/v1/load_lora_adapter", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.read() == b"Success: LoRA adapter 'plain' added successfully." and resp.headers[
            "Content-Type"
        ].startswith("text/plain")
    eng._request("POST", "/v1/unload_lora_adapter", {"lora_name": "plain"}, text_reply=True)
    for version, refused in (
        ("0.33.0", None),
        ("0.10.2", None),
        ("0.10.1", "return_token_ids needs >= 0.10.2"),
        ("0.34.1", "checked up to 0.33"),
    ):
        server.version = version
        try:
            if refused is None:
                assert "base" in eng.check_health()
            else:
                with pytest.raises(EngineError, match=refused):
                    eng.check_health()
        finally:
            server.version = "0.33.0"
    eng.sync_adapter(pol.save_pretrained, 2)  # leave the shared server without this test's adapter 1


def test_a_prompt_the_server_tokenises_differently_stops_naming_the_chat_template(
    loaded, tiny_model_path, server, tmp_path
):
    pol = _policy(loaded, tiny_model_path)
    eng = _engine(pol, server.url, tmp_path, chat_template="the chat template of TINY")
    eng.sync_adapter(pol.save_pretrained, 1)
    proc = server.policy.processor
    template = proc.chat_template
    proc.chat_template = template.replace("<|im_start|>assistant", "<|im_start|>assistant answer:")
    try:
        with pol.with_engine(eng), pytest.raises(TokenAlignmentError, match="chat template of TINY"):
            pol.act(_observations(1))
    finally:
        proc.chat_template = template


def test_a_dead_server_is_one_engine_error(loaded, tiny_model_path, tmp_path):
    pol = _policy(loaded, tiny_model_path)
    srv = LoopbackServer(tiny_model_cfg(tiny_model_path)).start()
    url = srv.url
    srv.stop()
    eng = _engine(pol, url, tmp_path, retries=2, timeout_s=5.0)
    with pytest.raises(EngineUnavailable, match="did not answer GET /health after 2 tries") as e:
        eng.check_health()
    assert "\n" not in str(e.value) and "--resume auto" in str(e.value)


# ------------------------------------------------------------------------------ training through it
def _overrides(out, url, **extra):
    defaults = {
        "log.save_interval": "1",
        "log.keep_checkpoints": "3",
        "ppo.num_iterations": "2",
        "env.max_turns": "2",
        "model.max_new_tokens": "16",
        "rollout.engine": "vllm",
        "rollout.engine_url": url,
        "rollout.engine_retries": "1",
        "rollout.engine_timeout_s": "60",
    }
    return run_overrides(out, defaults, extra)


@pytest.mark.slow
def test_training_through_the_engine_resumes_exactly_after_the_server_dies(tmp_path):
    """2 iterations uninterrupted, against 2 where the server stops answering in iteration 2: the run
    writes the checkpoint of iteration 1, stops with exit code 69, and its resumption through a new
    server at another URL (a changed rollout.engine_url is allowed on resume) ends with the same
    weights and metrics."""
    from a2c_ppo_acktr.rl.train import run_training

    cfg = load_config(preset="debug")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LoopbackServer(cfg.model) as srv:
            full = run_training(load_config(preset="debug", overrides=_overrides(tmp_path / "full", srv.url)))
            rows = read_metrics(tmp_path / "full" / "metrics.jsonl")
            per_iteration = len(srv.requests) // 2
            srv.fail_after = len(srv.requests) + per_iteration + 1  # dies one request into iteration 2's rollout
            with pytest.raises(EngineStopped) as stopped:
                run_training(load_config(preset="debug", overrides=_overrides(tmp_path / "split", srv.url)))
            assert stopped.value.exit_code == 69 and stopped.value.checkpoint.name.endswith("000001")
        with LoopbackServer(cfg.model) as fresh:
            resumed = run_training(
                load_config(
                    preset="debug", overrides=_overrides(tmp_path / "split", fresh.url, **{"log.resume": "auto"})
                )
            )
    finally:
        torch.set_num_threads(threads)
    assert [r["engine/adapter_version"] for r in rows] == [1.0, 2.0]
    for r in rows:
        assert r["debug/first_minibatch_ratio_max_dev"] < 1e-4  # ratio 1 on the first minibatch
        assert r["engine/logp_gap_max"] < 1e-3 and r["engine/requests"] > 0
    a, b = torch.load(full / "trainable.pt"), torch.load(resumed / "trainable.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    split = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["iteration"] for r in split] == [1, 2]

    def same(row):
        return {k: v for k, v in row.items() if not k.startswith(("time/", "engine/retries"))}

    assert [same(r) for r in split] == [same(r) for r in rows]
    shutil.rmtree(tmp_path)


# ------------------------------------------------------------------------------ several ranks
def _run_ranks(tmp_path, urls: str, extra=()) -> tuple[list[int], list[str]]:
    """main_vsi.py on 2 ranks (gloo, started as torchrun starts them: one node, local ranks 0 and 1)
    rolling out through the servers ``urls``; returns their exit codes and stderr."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    port = free_port()
    args = [
        sys.executable,
        str(repo / "main_vsi.py"),
        "--preset",
        "debug",
        "--log.output_dir",
        str(tmp_path / "out"),
        "--log.progress_bar",
        "false",
        "--log.tensorboard",
        "false",
        "--ppo.num_iterations",
        "2",
        "--model.max_new_tokens",
        "16",
        "--env.max_turns",
        "2",
        "--rollout.engine",
        "vllm",
        "--rollout.engine_url",
        urls,
        "--rollout.engine_retries",
        "1",
        *extra,
    ]
    # Each worker leads its own session, as torchrun's may: out of a timeout's reach, so killed here by group.
    procs = [
        subprocess.Popen(
            args,
            cwd=repo,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1",
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for r in (0, 1)
    ]
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=300)[1])
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
        pytest.fail("the ranks hung: " + " | ".join(p.communicate()[1][-2000:] for p in procs))
    return [p.returncode for p in procs], errs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_ranks_share_one_adapter_per_iteration(tmp_path):
    """2 ranks, each with the loopback server of its GPU (rollout.engine_url lists the node's two):
    every iteration rank 0 saves one adapter and each server loads exactly that one, under the same
    name, before any rank samples; each rank samples its own rows on its own server, and no server
    ever serves two adapters in turn."""
    cfg = load_config(preset="debug")
    with LoopbackServer(cfg.model) as s0, LoopbackServer(cfg.model) as s1:
        codes, errs = _run_ranks(tmp_path, f"{s0.url},{s1.url}")
    assert codes == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    assert len(s0.loads) == 2 and s1.loads == s0.loads  # one load per server and iteration, one name for every rank
    assert s0.loads[0].endswith("-v1") and s0.loads[1].endswith("-v2")
    turns = cfg.rollout.num_envs * cfg.rollout.num_steps * 2
    assert len(s0.requests) == len(s1.requests) == turns
    for srv in (s0, s1):
        assert [r["model"] for r in srv.requests] == [s0.loads[0]] * (turns // 2) + [s0.loads[1]] * (turns // 2)
        assert srv.adapter_swaps == 0  # v1 is unloaded before v2 is asked for, and no two adapters ever alternate
    assert not {r["seed"] for r in s0.requests} & {r["seed"] for r in s1.requests}  # each rank its own rows
    # Saved once (by rank 0), into a fresh directory per version; only the last one is kept.
    (kept,) = (tmp_path / "out" / "engine_adapters").iterdir()
    assert kept.name.startswith(s0.loads[1] + "-")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_ranks_stop_together_when_one_ranks_server_dies(tmp_path):
    """2 ranks, each with its own loopback server; rank 1's server refuses every chat request. Both
    ranks stop after the failed rollout with exit 69 and one checkpoint of the iterations done (none:
    checkpoint-000000), instead of rank 0 going on to the update's all-reduce alone and hanging."""
    cfg = load_config(preset="debug")
    with LoopbackServer(cfg.model) as s0, LoopbackServer(cfg.model) as s1:
        s1.fail_after = 0
        codes, errs = _run_ranks(tmp_path, f"{s0.url},{s1.url}")
    assert codes == [69, 69], errs[1][-3000:]
    assert "another process" in errs[0] and "HTTP 503" in errs[1]
    assert (tmp_path / "out" / "checkpoints" / "checkpoint-000000" / "COMPLETE").is_file()
    assert len(s0.requests) > 0  # rank 0 rolled out through its own server
