"""The shared-prefix forward in verl's own FSDP engine equals verl's plain forward: per-token
log-probs, entropy and parameter gradients within 1e-5 in fp32, for groups with ragged replies,
padding-like duplicate rows, singletons and micro-batches holding several groups."""

from __future__ import annotations

import pytest
import torch

from pettingllms_verl.registration import register

register()  # the CPU platform before verl resolves its device
from support.local_engine import local_engine, no_padding_batch  # noqa: E402
from pettingllms_verl.trainer.shared_prefix import (  # noqa: E402
    SharedPrefixFSDPEngine,
    identical_prompt_groups,
    pack,
    partition,
    prompt_lengths,
    ranks_of_groups,
    read_positions,
    split_to,
)


# ------------------------------------------------------------------ pure functions


def _rank_of(partitions):
    return {row: rank for rank, rows in enumerate(partitions) for row in rows}


def test_ranks_get_whole_groups_the_same_row_count_and_balanced_work():
    # 4 groups of K = 4 (workloads 8, 6, 5, 3 per row) over 2 ranks: whole groups, 8 rows each
    groups = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    work = [8.0] * 4 + [6.0] * 4 + [5.0] * 4 + [3.0] * 4
    partitions = ranks_of_groups(groups, work, 2)
    assert sorted(r for rows in partitions for r in rows) == list(range(16)) and [len(p) for p in partitions] == [8, 8]
    rank = _rank_of(partitions)
    assert all(len({rank[r] for r in group}) == 1 for group in groups)  # no group spread over ranks
    assert sorted(sum(work[r] for r in rows) for rows in partitions) == [44.0, 44.0]  # 8+3 | 6+5, per row x 4
    for rows in partitions:  # a group's rows adjacent within its rank
        for group in groups:
            at = [rows.index(r) for r in group if r in rows]
            assert at == list(range(at[0], at[0] + len(at))) if at else True


def test_verl_row_balancing_would_spread_groups_over_ranks():
    """Why the trainer balances groups, not rows: verl's balancing (equal-size partitions by
    workload) puts one group's rows on several ranks, where their prompt is computed again."""
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    groups = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    work = [8, 8, 8, 7, 6, 6, 6, 5, 5, 5, 4, 4, 3, 3, 3, 2]
    verl = _rank_of(get_seqlen_balanced_partitions(work, k_partitions=2, equal_size=True))
    ours = _rank_of(ranks_of_groups(groups, [float(w) for w in work], 2))
    assert sum(len({verl[r] for r in group}) > 1 for group in groups) > 0
    assert sum(len({ours[r] for r in group}) > 1 for group in groups) == 0


def test_a_group_no_rank_has_room_for_is_cut_over_the_least_loaded_ranks():
    # 3 groups of 4 over 2 ranks of 6 rows: two fit whole, the third is cut 2 + 2
    groups = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    partitions = ranks_of_groups(groups, [3.0] * 4 + [2.0] * 4 + [1.0] * 4, 2)
    assert [len(p) for p in partitions] == [6, 6]
    rank = _rank_of(partitions)
    assert rank[0] == rank[3] and rank[4] == rank[7] and rank[0] != rank[4]
    assert sorted(partitions[rank[0]][-2:] + partitions[rank[4]][-2:]) == [8, 9, 10, 11]
    with pytest.raises(ValueError, match="7 rows do not split evenly over 2 ranks"):
        ranks_of_groups([[0, 1, 2, 3], [4, 5, 6]], [1.0] * 7, 2)


def test_partition_keeps_groups_whole_and_counts_a_shared_prompt_once():
    prompt = [100] * 6
    seq = [110, 110, 110, 110, 105, 105]  # a group of 4 replies of 10 tokens, then a pair of 5
    # group 0 runs as 140 tokens (not 440), group 1 as 110
    assert partition([[0, 1, 2, 3], [4, 5]], prompt, seq, max_tokens=250) == [[0, 1, 2, 3, 4, 5]]
    assert partition([[0, 1, 2, 3], [4, 5]], prompt, seq, max_tokens=249) == [[0, 1, 2, 3], [4, 5]]


def test_partition_cuts_a_group_over_the_budget_into_parts_that_fit():
    prompt, seq = [100] * 4, [110] * 4
    assert partition([[0, 1, 2, 3]], prompt, seq, max_tokens=125) == [[0, 1], [2, 3]]
    # one row over the budget stands alone (verl's own micro-batching does the same)
    assert partition([[0, 1, 2, 3]], prompt, seq, max_tokens=50) == [[0], [1], [2], [3]]


def test_split_to_reaches_the_data_parallel_count():
    parts = split_to([[0, 1, 2, 3], [4]], 4)
    assert len(parts) == 4 and sorted(r for p in parts for r in p) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot cut 2 rows into 3"):
        split_to([[0], [1]], 3)


def test_groups_are_found_by_tokens_not_by_tags():
    rows = torch.nested.as_nested_tensor([torch.tensor(r) for r in ([1, 2, 3, 9], [1, 2, 3, 8, 8], [1, 2, 4, 9], [1, 2, 3, 7])], layout=torch.jagged)
    assert identical_prompt_groups(rows, torch.tensor([3, 3, 3, 3])) == [[0, 1, 3], [2]]
    # the same tokens with a different prompt/reply split are different prompts
    assert identical_prompt_groups(rows, torch.tensor([3, 3, 3, 2])) == [[0, 1], [2], [3]]


def test_pack_lets_each_reply_see_the_prompt_and_itself_only():
    rows = torch.nested.as_nested_tensor([torch.tensor([5, 6, 1, 2]), torch.tensor([5, 6, 3])], layout=torch.jagged)
    positions = torch.nested.as_nested_tensor([torch.arange(4), torch.arange(3)], layout=torch.jagged)
    packed = pack(rows, positions, torch.tensor([2, 2]), [[0, 1]])
    assert packed.input_ids.tolist() == [[5, 6, 1, 2, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert packed.allowed[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # the second reply: the prompt and itself, not the first reply
    ]
    assert packed.index.tolist() == [0, 1, 2, 3, 0, 1, 4]
    assert packed.tokens == 5  # 4 + 3 tokens of verl's rows


def test_pack_puts_groups_back_to_back_and_no_group_sees_another():
    rows = torch.nested.as_nested_tensor([torch.tensor([5, 6, 1]), torch.tensor([7, 2]), torch.tensor([7, 3, 3])], layout=torch.jagged)
    positions = torch.nested.as_nested_tensor([torch.arange(3), torch.arange(2), torch.arange(3)], layout=torch.jagged)
    packed = pack(rows, positions, torch.tensor([2, 1, 1]), [[0], [1, 2]])
    assert packed.input_ids.tolist() == [[5, 6, 1, 7, 2, 3, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 1, 2]]
    assert packed.allowed[0, 0, 3].tolist() == [False, False, False, True, False, False, False]  # group 2's prompt
    assert packed.allowed[0, 0, 6].tolist() == [False, False, False, True, False, True, True]  # its reply 2
    assert packed.index.tolist() == [0, 1, 2, 3, 4, 3, 5, 6]
    assert packed.tokens == 7


def test_the_positions_read_are_each_rows_last_prompt_token_and_its_reply_but_the_last():
    # rows of 5 (prompt 3) and 4 (prompt 2) tokens, and one with an empty reply
    offsets, prompt_lens = torch.tensor([0, 5, 9, 11]), torch.tensor([3, 2, 2])
    assert read_positions(offsets, prompt_lens).tolist() == [2, 3, 6, 7]


# ------------------------------------------------------------------ verl's engine, plain vs shared


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def engine(request, tiny_model_dir):
    """verl's FSDP2 engine (EngineRegistry, initialize()) on the tiny model, fp32, one gloo rank,
    with each attention implementation the shared forward supports (a bool mask / an additive one)."""
    return local_engine(tiny_model_dir, engine_cls=SharedPrefixFSDPEngine, attn_implementation=request.param, lr=1e-3)


def _batch(prompts, replies, **meta):
    batch = no_padding_batch(prompts, replies, **meta)
    batch["weights"] = torch.randn(len(prompts), batch["responses"].shape[1], generator=torch.Generator().manual_seed(1))
    return batch


def _case(vocab: int):
    """Two groups of ragged replies (one with a duplicate row, as verl's padding makes), a long
    multi-turn-like prompt group and two singletons."""
    g = torch.Generator().manual_seed(0)
    tok = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    p1, p2, p3 = tok(40), tok(25), tok(90)
    prompts = [p1, p1, p1, p1, p2, tok(30), p2, p2, p3, p3, tok(12), tok(3)]
    replies = [tok(7), tok(3), tok(11), tok(1), tok(5), tok(9), tok(5), tok(2), tok(6), tok(14), tok(4), tok(2)]
    replies[7] = list(replies[4])  # the same prompt and reply twice
    prompts[7] = list(p2)
    return prompts, replies


def _weighted_loss(model_output, data, dp_group=None):
    """A loss with a different weight on every reply token (``weights``, carried by the rows), on
    verl's response layout: any gradient misrouted between rows or tokens shows."""
    from verl.workers.utils.padding import no_padding_2_padding

    mask = data["response_mask"].float() * data["weights"]
    value = (no_padding_2_padding(model_output["log_probs"], data) * mask).sum()
    value = value + 0.1 * (no_padding_2_padding(model_output["entropy"], data) * mask).sum()
    return value, {}


def assert_same_where_read(shared, plain, data):
    """The reply positions (what verl's losses and log-probs read, ``no_padding_2_padding``) agree
    within 1e-5; the shared forward left others, a prompt's predictions of itself, at zero (a
    micro-batch of singletons runs verl's plain forward: it computes them)."""
    from verl.workers.utils.padding import no_padding_2_padding

    mask = data["response_mask"].bool()
    torch.testing.assert_close(no_padding_2_padding(shared, data)[mask], no_padding_2_padding(plain, data)[mask], atol=1e-5, rtol=0)
    read = read_positions(data["input_ids"].offsets(), prompt_lengths(data))
    unread = torch.ones(shared.values().shape[0], dtype=torch.bool)
    unread[read] = False
    assert (shared.values()[unread] == 0).any() and plain.values()[unread].all()


def _run(engine, data, share: bool, loss=None):
    engine.share_prefix = share
    engine.optimizer_zero_grad()
    output = engine.forward_backward_batch(data, loss_function=loss, forward_only=loss is None)
    grads = {n: p.grad.detach().clone() for n, p in engine.module.named_parameters() if p.grad is not None}
    return output, grads


@pytest.mark.parametrize(
    "budget",
    [
        dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=4, use_remove_padding=False),
        dict(use_dynamic_bsz=True, max_token_len_per_gpu=120, use_remove_padding=False),
        dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=6, use_remove_padding=True),
    ],
    ids=["rows-padded", "tokens-padded", "rows-packed"],
)
def test_shared_forward_equals_verl_plain_forward(engine, budget):
    vocab = engine.module.config.vocab_size
    prompts, replies = _case(vocab)

    plain_out, _ = _run(engine, _batch(prompts, replies, **budget), share=False)
    shared_out, _ = _run(engine, _batch(prompts, replies, **budget), share=True)
    data = _batch(prompts, replies, **budget)
    for key in ("log_probs", "entropy"):
        a, b = plain_out["model_output"][key], shared_out["model_output"][key]
        assert [t.shape for t in a.unbind()] == [t.shape for t in b.unbind()]
        assert_same_where_read(b, a, data)
    frac = shared_out["metrics"]["shared_prefix/token_frac"][0]
    assert frac < 0.75  # the groups' prompts were processed once

    _, plain_grads = _run(engine, _batch(prompts, replies, **budget), share=False, loss=_weighted_loss)
    _, shared_grads = _run(engine, _batch(prompts, replies, **budget), share=True, loss=_weighted_loss)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
    assert any(g.abs().sum() > 0 for g in plain_grads.values())


def test_a_model_without_logits_to_keep_gets_its_head_on_every_position_and_the_same_numbers(engine):
    budget = dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=6, use_remove_padding=True)
    prompts, replies = _case(engine.module.config.vocab_size)
    assert engine._takes_logits_to_keep()  # the tiny model's forward: the test above ran the head on the read positions
    plain_out, _ = _run(engine, _batch(prompts, replies, **budget), share=False)
    engine._logits_to_keep = False
    try:
        shared_out, _ = _run(engine, _batch(prompts, replies, **budget), share=True)
    finally:
        del engine._logits_to_keep
    assert_same_where_read(shared_out["model_output"]["log_probs"], plain_out["model_output"]["log_probs"], _batch(prompts, replies, **budget))


def test_a_batch_of_singletons_is_verl_plain_forward(engine):
    prompts, replies = [[5, 6, 7], [5, 6, 8], [9, 9]], [[4], [4, 4], [3]]
    data = _batch(prompts, replies)
    assert identical_prompt_groups(data["input_ids"], prompt_lengths(data)) == [[0], [1], [2]]
    plain_out, _ = _run(engine, _batch(prompts, replies, micro_batch_size_per_gpu=3), share=False)
    shared_out, _ = _run(engine, _batch(prompts, replies, micro_batch_size_per_gpu=3), share=True)
    assert torch.equal(shared_out["model_output"]["log_probs"].values(), plain_out["model_output"]["log_probs"].values())
    assert shared_out["metrics"]["shared_prefix/token_frac"] == [1.0]


def test_an_attention_without_masks_runs_plainly_and_says_why(engine, caplog):
    config = engine.module.config
    before = config._attn_implementation
    config._attn_implementation = "flash_attention_2"
    try:
        engine.share_prefix = True
        assert engine._why_plain(_batch([[5, 6]], [[4]])) == (
            "attn_implementation='flash_attention_2' takes no arbitrary attention mask (use one of ('sdpa', 'eager'))"
        )
        with caplog.at_level("WARNING"):
            assert not engine._sharing(_batch([[5, 6]], [[4]]))
        assert "use_prefix_grouper=True: running verl's plain forward, because of attn_implementation" in caplog.text
    finally:
        config._attn_implementation = before


def test_lora_adapters_share_the_base_forward_with_the_same_numbers(tiny_model_dir):
    """L1: ``MultiLoRAFSDPEngine`` (the shared-prefix engine's subclass) with two adapters, one
    active and non-zero: log-probs and the active adapter's gradients equal the plain forward's,
    the inactive adapter gets none."""
    from pettingllms_verl.config import AdapterConfig
    from pettingllms_verl.trainer.multi_lora import MultiLoRAFSDPEngine

    spec = {**AdapterConfig(rank=4, alpha=8).lora_config(), "path": None, "trainable": True}
    engine = local_engine(tiny_model_dir, engine_cls=MultiLoRAFSDPEngine, lr=1e-3, adapters={"coder": spec, "tester": dict(spec)})
    engine.set_active_adapter("tester")
    with torch.no_grad():  # lora_B starts at zero: give the active adapter an effect to get wrong
        for name, param in engine.module.named_parameters():
            if "lora_B.tester" in name:
                local = param.to_local()  # FSDP2's shard: the whole tensor on one rank
                local.copy_(torch.randn(local.shape, generator=torch.Generator().manual_seed(3)) * 0.05)
    prompts, replies = _case(engine.module.config.vocab_size)
    plain_out, _ = _run(engine, _batch(prompts, replies), share=False)
    shared_out, _ = _run(engine, _batch(prompts, replies), share=True)
    assert_same_where_read(shared_out["model_output"]["log_probs"], plain_out["model_output"]["log_probs"], _batch(prompts, replies))
    _, plain_grads = _run(engine, _batch(prompts, replies), share=False, loss=_weighted_loss)
    _, shared_grads = _run(engine, _batch(prompts, replies), share=True, loss=_weighted_loss)
    assert plain_grads.keys() == shared_grads.keys()
    assert plain_grads and all("lora_" in n and ".tester." in n for n in plain_grads)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
