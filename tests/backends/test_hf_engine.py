"""The hf rollout engine: log-probs, sampling parameters, batching, weight updates."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pettingllms_verl.backends.hf.engine import HFGenerationEngine, SamplingSpec

from support.reference import LORA, reference_log_probs

LOGPROB_ATOL = 1e-4  # fp32: padded batched vs unpadded single forward differ by ~1e-6 on CPU


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture()
def model(tiny_model_dir, device):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa").to(device)


@pytest.fixture()
def engine(model, tokenizer):
    return HFGenerationEngine(model, tokenizer)



def test_log_probs_equal_direct_forward_in_a_padded_batch(engine, model, chat_ids):
    prompts = [chat_ids(t) for t in ("Sum 1 2", "Go from (0,0) to (3,4) on a grid with walls", "x")]
    assert len({len(p) for p in prompts}) == 3  # different lengths: rows are left-padded
    torch.manual_seed(1)
    outs = engine.generate(prompts, [SamplingSpec(max_tokens=12, temperature=0.7)] * 3)
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == len(out.log_probs) > 0
        expected = reference_log_probs(model, prompt, out.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_temperature_zero_is_greedy(engine, model, chat_ids):
    prompt = chat_ids("Continue: 1 2 3")
    out = engine.generate([prompt], [SamplingSpec(max_tokens=8, temperature=0.0)])[0]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(len(out.token_ids)):
            ids.append(int(model(torch.tensor([ids], device=model.device)).logits[0, -1].argmax()))
    assert out.token_ids == ids[len(prompt) :]
    # Greedy is deterministic whatever the RNG state.
    torch.manual_seed(123)
    assert engine.generate([prompt], [SamplingSpec(max_tokens=8, temperature=0.0)])[0].token_ids == out.token_ids


def test_identical_prompts_share_one_prefill_and_still_sample_apart(engine, model, chat_ids):
    """K branches of a tree node (one prompt) plus another prompt: the prefill runs over the two
    distinct prompts only; each row still samples on its own, with exact log-probs."""
    node, other = chat_ids("Go from (0,0) to (3,4) on a grid with walls"), chat_ids("Sum 1 2")
    forwards = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    torch.manual_seed(1)
    outs = engine.generate([node, node, other, node], [SamplingSpec(max_tokens=12, temperature=1.0)] * 4)
    hook.remove()
    assert forwards[0] == (2, len(node) - 1)  # one prefill row per distinct prompt (all columns but the last)
    assert forwards[1] == (4, 1)  # then every row on its own, from the copied cache
    assert len({tuple(out.token_ids) for out in (outs[0], outs[1], outs[3])}) > 1  # independent samples
    for prompt, out in zip([node, node, other, node], outs):
        expected = reference_log_probs(model, prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)
    # greedy: a shared prefill gives what each prompt alone gives
    greedy = SamplingSpec(max_tokens=10, temperature=0.0)
    together = engine.generate([node, other, node], [greedy] * 3)
    alone = [engine.generate([p], [greedy])[0] for p in (node, other)]
    assert [o.token_ids for o in together] == [alone[0].token_ids, alone[1].token_ids, alone[0].token_ids]


RULES = "Plan-Path rules: move from @ to G on the grid; a wall # blocks you; answer with moves. " * 2


def common_prefix(prompts):
    n = 0
    while all(len(p) > n + 1 and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def test_a_long_common_prefix_is_computed_once_and_log_probs_stay_exact(engine, model, chat_ids):
    """Episodes of one role start alike (system prompt, rules): that prefix runs once for the batch,
    the rest of each distinct prompt once, and every row samples with exact log-probs."""
    prompts = [chat_ids(RULES + tail) for tail in ("Grid: ..#\n#..", "Grid: #....#..#", "C", "C")]  # the last two: one node's branches
    common = common_prefix(prompts)
    assert common >= 32
    forwards = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    torch.manual_seed(3)
    outs = engine.generate(prompts, [SamplingSpec(max_tokens=10, temperature=1.0)] * 4)
    hook.remove()
    rest = max(len(p) for p in prompts) - common
    assert forwards[:3] == [(1, common), (3, rest - 1), (4, 1)]  # prefix once, 3 distinct rests, then every row
    for prompt, out in zip(prompts, outs):
        expected = reference_log_probs(model, prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)
    greedy = SamplingSpec(max_tokens=10, temperature=0.0)
    together = engine.generate(prompts[:3], [greedy] * 3)
    assert [o.token_ids for o in together] == [engine.generate([p], [greedy])[0].token_ids for p in prompts[:3]]


def test_short_common_prefixes_are_not_shared(engine, model, chat_ids):
    prompts = [chat_ids("Sum 1 2"), chat_ids("Go from (0,0) to (3,4)")]
    assert common_prefix(prompts) < 16
    forwards = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    engine.generate(prompts, [SamplingSpec(max_tokens=2, temperature=0.0)] * 2)
    hook.remove()
    assert forwards[0] == (2, max(map(len, prompts)))  # plain generate: one left-padded prefill
    engine.share_prefill = False  # the switch (benchmarks' baseline): nothing shared, not even one node's prompt
    forwards.clear()
    hook = model.register_forward_hook(lambda module, args, kwargs, out: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    node = chat_ids(RULES)
    engine.generate([node] * 3, [SamplingSpec(max_tokens=2, temperature=0.0)] * 3)
    hook.remove()
    assert forwards[0] == (3, len(node))


def test_max_tokens_per_request_in_one_batch(engine, model, chat_ids):
    """Three budgets in one generate call: each reply is cut at its own budget."""
    engine.eos_token_ids = [len(engine.tokenizer) + 1]  # never sampled: every reply runs to its budget
    batch_sizes = []
    hook = model.register_forward_hook(lambda module, args, kwargs, out: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    specs = [SamplingSpec(max_tokens=n, temperature=1.0) for n in (1, 3, 7)]
    outs = engine.generate([chat_ids("Count"), chat_ids("Count to ten"), chat_ids("x")], specs)
    hook.remove()
    assert [(len(out.token_ids), out.finish_reason) for out in outs] == [(1, "length"), (3, "length"), (7, "length")]
    assert [len(out.log_probs) for out in outs] == [1, 3, 7]
    assert batch_sizes == [3] * 7  # one batch: every forward carries the three rows, 7 steps for the longest


def test_top_k_one_matches_greedy(engine, chat_ids):
    prompt = chat_ids("Plan the path")
    greedy = engine.generate([prompt], [SamplingSpec(max_tokens=6, temperature=0.0)])[0]
    top1 = engine.generate([prompt], [SamplingSpec(max_tokens=6, temperature=1.0, top_k=1)])[0]
    assert top1.token_ids == greedy.token_ids


def test_every_call_hands_the_memory_it_freed_back_even_when_it_fails(engine, chat_ids, monkeypatch):
    from pettingllms_verl.backends.hf import engine as engine_module

    trims = []
    monkeypatch.setattr(engine_module, "_MALLOC_TRIM", trims.append)
    engine.generate([chat_ids("hi"), chat_ids("there")], [SamplingSpec(max_tokens=4)] * 2)
    assert trims == [0]  # malloc_trim(0): every arena, once per call
    monkeypatch.setattr(engine, "_generate_group", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        engine.generate([chat_ids("hi")], [SamplingSpec(max_tokens=4)])
    assert trims == [0, 0]


def test_stop_string_ends_generation(engine, tokenizer, chat_ids):
    prompt = chat_ids("Say something")
    free = engine.generate([prompt], [SamplingSpec(max_tokens=16, temperature=0.0)])[0]
    assert len(free.token_ids) >= 4, "greedy reply too short to place a stop string inside it"
    text = tokenizer.decode(free.token_ids)
    stop = tokenizer.decode(free.token_ids[2:4]).strip() or text[-2:]
    cut = engine.generate([prompt], [SamplingSpec(max_tokens=16, temperature=0.0, stop=(stop,))])[0]
    assert cut.finish_reason == "stop"
    assert stop in tokenizer.decode(cut.token_ids)
    assert stop not in tokenizer.decode(cut.token_ids[:-1])
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)]


def test_sampling_spec_from_verl_caps_max_tokens():
    spec = SamplingSpec.from_verl({"temperature": 0, "top_k": -1, "max_tokens": 500, "stop": "\n\n"}, default_max_tokens=32)
    assert spec.max_tokens == 32 and spec.greedy and spec.stop == ("\n\n",)
    assert SamplingSpec.from_verl({}, default_max_tokens=5).max_tokens == 5


def test_weight_update_makes_next_token_distribution_equal_the_updated_model(engine, chat_ids, updated_actor):
    # One optimiser step on a separate copy (the "actor"); push its weights into the engine.
    prompt = chat_ids("update me")
    actor = updated_actor(prompt)

    def next_token_log_probs(model):
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([prompt], device=model.device)).logits[0, -1], -1).cpu()

    before = next_token_log_probs(engine.model)
    assert (before - next_token_log_probs(actor)).abs().max() > 1e-2  # the update really moved the policy
    loaded = engine.load_weights(dict(actor.state_dict()))
    assert loaded == len(actor.state_dict())
    torch.testing.assert_close(next_token_log_probs(engine.model), next_token_log_probs(actor), atol=1e-6, rtol=0)


def test_weight_update_rejects_unknown_names(engine):
    with pytest.raises(KeyError, match="not in the rollout model"):
        engine.load_weights({"model.layers.99.mlp.up_proj.weight": torch.zeros(1)})


def test_weight_update_rejects_a_partial_update(engine):
    weights = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    del weights["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match="leaves 1 parameters stale.*layers.1.mlp.up_proj"):
        engine.load_weights(weights)


@pytest.mark.gpu
def test_bf16_on_cuda_log_probs_track_a_bf16_forward(tiny_model_dir, tokenizer, chat_ids):
    """The GPU default dtype: batched bf16 generation vs an unpadded bf16 forward (loose: bf16 rounding)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").to("cuda")
    engine = HFGenerationEngine(model, tokenizer)
    prompts = [chat_ids(t) for t in ("Sum 1 2", "Go from (0,0) to (3,4) on a grid with walls", "x")]
    torch.manual_seed(1)
    for prompt, out in zip(prompts, engine.generate(prompts, [SamplingSpec(max_tokens=12, temperature=1.0)] * 3)):
        diff = (torch.tensor(out.log_probs) - reference_log_probs(model, prompt, out.token_ids)).abs()
        assert diff.mean() < 0.02 and diff.max() < 0.1, diff



@pytest.fixture()
def adapters(tiny_model_dir, device):
    """A peft reference model with two random (non-zero) adapters, and each adapter's tensors."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    torch.manual_seed(3)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    reference = get_peft_model(base, LoraConfig(**LORA), adapter_name="planner")
    reference.add_adapter("coder", LoraConfig(**LORA))
    reference = reference.to(device).eval()
    tensors = {name: get_peft_model_state_dict(reference, adapter_name=name) for name in ("planner", "coder")}
    return reference, tensors


def with_adapters(engine, tensors):
    for name, named in tensors.items():
        assert engine.load_adapter(name, named, LORA) == len(named)
    return engine


def test_a_mixed_adapter_batch_equals_each_adapter_alone(engine, adapters, chat_ids):
    reference, tensors = adapters
    engine = with_adapters(engine, tensors)
    assert engine.adapters == ["coder", "planner"]
    prompt = chat_ids("Go from (0,0) to (3,4)")
    greedy = SamplingSpec(max_tokens=8, temperature=0.0)
    mixed = engine.generate([prompt] * 3, [greedy] * 3, adapters=["planner", "coder", None])
    alone = [engine.generate([prompt], [greedy], adapters=[a])[0] for a in ("planner", "coder", None)]
    assert [m.token_ids for m in mixed] == [a.token_ids for a in alone]
    assert mixed[0].token_ids != mixed[1].token_ids or mixed[0].log_probs != mixed[1].log_probs  # adapters matter
    for out, adapter in zip(mixed, ("planner", "coder")):  # greedy = argmax of that adapter's own forward
        reference.set_adapter(adapter)
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(len(out.token_ids)):
                ids.append(int(reference(torch.tensor([ids], device=reference.device)).logits[0, -1].argmax()))
        assert out.token_ids == ids[len(prompt):]


def test_a_shared_prefill_keeps_each_rows_adapter(engine, adapters, chat_ids):
    """Identical prompts are shared only within one adapter: (prompt, adapter) is the unit."""
    reference, tensors = adapters
    engine = with_adapters(engine, tensors)
    prompt = chat_ids("Go from (0,0) to (3,4)")
    torch.manual_seed(2)
    names = ["coder", "planner", "coder", "planner"]
    outs = engine.generate([prompt] * 4, [SamplingSpec(max_tokens=10, temperature=0.7)] * 4, adapters=names)
    for out, adapter in zip(outs, names):
        reference.set_adapter(adapter)
        expected = reference_log_probs(reference, prompt, out.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_common_prefixes_are_shared_per_adapter(engine, adapters, chat_ids):
    """The prefix's KV depends on the adapter: one prefix row per adapter, exact log-probs for each."""
    reference, tensors = adapters
    engine = with_adapters(engine, tensors)
    prompts = [chat_ids(RULES + tail) for tail in ("A", "BB", "A", "CCC")]
    names = ["coder", "coder", "planner", "planner"]
    forwards = []
    hook = engine.base_model.register_forward_hook(lambda module, args, kwargs, out: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    torch.manual_seed(4)
    outs = engine.generate(prompts, [SamplingSpec(max_tokens=8, temperature=0.7)] * 4, adapters=names)
    hook.remove()
    assert forwards[0][0] == 2 and forwards[1][0] == 4  # a prefix row per adapter, then the 4 distinct (prompt, adapter) rests
    for prompt, out, adapter in zip(prompts, outs, names):
        reference.set_adapter(adapter)
        expected = reference_log_probs(reference, prompt, out.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_a_call_with_one_adapter_runs_it_as_the_active_adapter(engine, adapters, chat_ids, monkeypatch):
    """peft's per-row mixed batch is for calls with several adapters; one adapter (or the base alone)
    takes peft's plain forward, with the same log-probs."""
    reference, tensors = adapters
    engine = with_adapters(engine, tensors)
    prompts = [chat_ids(RULES + tail) for tail in ("A", "BB", "CCC")]
    activated, activate = [], engine.model.set_adapter
    monkeypatch.setattr(engine.model, "set_adapter", lambda name: (activated.append(name), activate(name))[1])
    for name in ("coder", None):
        torch.manual_seed(5)
        outs = engine.generate(prompts, [SamplingSpec(max_tokens=8, temperature=0.7)] * 3, adapters=[name] * 3)
        for prompt, out in zip(prompts, outs):
            if name is None:
                with reference.disable_adapter():
                    expected = reference_log_probs(reference, prompt, out.token_ids, temperature=0.7)
            else:
                reference.set_adapter(name)
                expected = reference_log_probs(reference, prompt, out.token_ids, temperature=0.7)
            torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)
    assert activated == ["coder"]  # the base alone ran with the adapters disabled, not activated


def test_a_folded_adapter_samples_as_the_adapter_with_no_adapter_matmul_and_leaves_the_base_intact(engine, adapters, chat_ids):
    """merge_adapters: a one-adapter call runs on W + scale * B @ A (no lora_A/lora_B forward), with
    that adapter's log-probs; the base weights are the base's again after the call, and a refreshed
    adapter is folded anew."""
    from peft import set_peft_model_state_dict

    reference, tensors = adapters
    engine = with_adapters(engine, tensors)
    engine.merge_adapters = True
    prompts = [chat_ids(RULES + tail) for tail in ("A", "BB", "CCC")]
    base = {name: t.clone() for name, t in engine._base_state().items()}
    lora_calls = []
    hooks = [m.register_forward_hook(lambda *_: lora_calls.append(1)) for n, m in engine.model.named_modules() if n.endswith("lora_A.coder")]
    assert hooks

    def check(adapter_reference):
        torch.manual_seed(6)
        outs = engine.generate(prompts, [SamplingSpec(max_tokens=8, temperature=0.7)] * 3, adapters=["coder"] * 3)
        for prompt, out in zip(prompts, outs):
            expected = reference_log_probs(adapter_reference, prompt, out.token_ids, temperature=0.7)
            torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)

    reference.set_adapter("coder")
    check(reference)
    assert not lora_calls
    assert all(torch.equal(base[name], t) for name, t in engine._base_state().items())
    update = {name: t * 3.0 for name, t in tensors["coder"].items()}  # the adapter after a training step
    engine.load_adapter("coder", update, LORA)
    set_peft_model_state_dict(reference, update, adapter_name="coder")
    check(reference)
    assert not lora_calls
    mixed = engine.generate(prompts[:2], [SamplingSpec(max_tokens=2)] * 2, adapters=["coder", "planner"])
    assert len(mixed) == 2 and lora_calls  # several adapters in a call: peft's per-row forward, as before


def test_a_failed_folded_call_restores_the_base_and_a_base_update_is_folded_anew(engine, adapters, updated_actor, chat_ids):
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    _, tensors = adapters
    engine = with_adapters(engine, tensors)
    engine.merge_adapters = True
    prompts = [chat_ids(RULES + tail) for tail in ("A", "BB")]
    spec = SamplingSpec(max_tokens=6, temperature=0.7)
    base = {name: t.clone() for name, t in engine._base_state().items()}

    def fail(*_):
        raise RuntimeError("forward failed")

    hook = engine.base_model.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="forward failed"):
            engine.generate(prompts, [spec] * 2, adapters=["coder"] * 2)
    finally:
        hook.remove()
    assert all(torch.equal(base[name], t) for name, t in engine._base_state().items())  # the folded tensors swapped back out

    engine.generate(prompts, [spec] * 2, adapters=["coder"] * 2)  # folded on the old base
    actor = updated_actor(prompts[0])
    engine.load_weights(dict(actor.state_dict()))
    reference = get_peft_model(actor, LoraConfig(**LORA), adapter_name="coder").eval()
    set_peft_model_state_dict(reference, tensors["coder"], adapter_name="coder")
    reference = reference.to(engine.device)
    torch.manual_seed(9)
    outs = engine.generate(prompts, [spec] * 2, adapters=["coder"] * 2)
    for prompt, out in zip(prompts, outs):
        expected = reference_log_probs(reference, prompt, out.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_an_adapter_that_does_not_fold_runs_as_the_active_adapter(engine, tiny_model_dir, chat_ids, monkeypatch):
    """An embedding LoRA has no linear delta to fold: merge_adapters leaves it to peft's forward."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    lora = {**LORA, "target_modules": ["embed_tokens", "q_proj"]}
    torch.manual_seed(7)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    reference = get_peft_model(base, LoraConfig(**lora), adapter_name="coder").eval()
    engine.load_adapter("coder", get_peft_model_state_dict(reference, adapter_name="coder", save_embedding_layers=False), lora)
    engine.merge_adapters = True
    activated, activate = [], engine.model.set_adapter
    monkeypatch.setattr(engine.model, "set_adapter", lambda name: (activated.append(name), activate(name))[1])
    prompt = chat_ids(RULES + "A")
    torch.manual_seed(8)
    out = engine.generate([prompt] * 2, [SamplingSpec(max_tokens=8, temperature=0.7)] * 2, adapters=["coder"] * 2)[0]
    assert activated == ["coder"]
    expected = reference_log_probs(reference.to(engine.device), prompt, out.token_ids, temperature=0.7)
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_adapters_on_bf16_or_tied_weights_are_not_folded(engine, adapters, tiny_model_dir):
    """Folding rounds into the weight's dtype (bf16 would lose a young adapter's small delta) and
    swaps the weight tensor (a tied weight would change its twin): both keep peft's forward."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    _, tensors = adapters
    engine = with_adapters(engine, tensors)
    assert engine._folded("coder")  # fp32, untied: folded
    engine.model.to(torch.bfloat16)
    engine._folded_weights.clear()
    assert engine._folded("coder") is None
    tied = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tied.lm_head.weight = tied.get_input_embeddings().weight  # as a model with tie_word_embeddings holds them
    engine = HFGenerationEngine(tied, AutoTokenizer.from_pretrained(tiny_model_dir), merge_adapters=True)
    lora = {**LORA, "target_modules": ["q_proj", "lm_head"]}
    source = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), LoraConfig(**lora), adapter_name="coder")
    engine.load_adapter("coder", get_peft_model_state_dict(source, adapter_name="coder"), lora)
    assert engine._folded("coder") is None


def test_adapter_log_probs_equal_a_direct_forward_with_that_adapter(engine, adapters, chat_ids):
    reference, tensors = adapters
    engine = with_adapters(engine, tensors)
    prompts = [chat_ids("Sum 1 2"), chat_ids("x")]
    torch.manual_seed(1)
    outs = engine.generate(prompts, [SamplingSpec(max_tokens=10, temperature=0.7)] * 2, adapters=["coder", "planner"])
    for prompt, out, adapter in zip(prompts, outs, ("coder", "planner")):
        assert len(out.token_ids) == len(out.log_probs) > 0  # the recorder sat on the base model's forward
        reference.set_adapter(adapter)
        expected = reference_log_probs(reference, prompt, out.token_ids, temperature=0.7)
        torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_refreshing_one_adapter_leaves_the_base_and_the_other_adapter_untouched(engine, adapters):
    _, tensors = adapters
    engine = with_adapters(engine, tensors)
    before = {name: t.clone() for name, t in engine.model.state_dict().items()}
    update = {name: t + 1.0 for name, t in tensors["coder"].items()}
    engine.load_adapter("coder", update, LORA)
    after = engine.model.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(".coder." in name for name in changed)
    assert len(changed) == len(update)


def test_adapter_updates_must_be_whole_and_requests_must_name_a_loaded_adapter(engine, adapters, chat_ids):
    _, tensors = adapters
    engine = with_adapters(engine, tensors)
    partial = dict(tensors["coder"])
    partial.pop(next(iter(partial)))
    with pytest.raises(KeyError, match="adapter 'coder': the update leaves 1 tensors stale"):
        engine.load_adapter("coder", partial, LORA)
    with pytest.raises(KeyError, match="no adapter 'judge' loaded"):
        engine.generate([chat_ids("x")], [SamplingSpec(max_tokens=2)], adapters=["judge"])


def test_an_embedding_adapter_update_must_be_whole_too(engine, tiny_model_dir):
    """peft names embedding LoRA tensors ``...embed_tokens.lora_embedding_A.<name>`` (no trailing
    dot): they count as the adapter's, so an update without one of them is refused."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    lora = {**LORA, "target_modules": ["embed_tokens", "q_proj"]}
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tensors = get_peft_model_state_dict(get_peft_model(base, LoraConfig(**lora), adapter_name="coder"), adapter_name="coder",
                                        save_embedding_layers=False)
    partial = {key: t for key, t in tensors.items() if "lora_embedding_B" not in key}
    assert len(partial) == len(tensors) - 1
    with pytest.raises(KeyError, match="adapter 'coder': the update leaves 1 tensors stale"):
        engine.load_adapter("coder", partial, lora)

def test_base_weight_updates_still_apply_under_adapters(engine, adapters, updated_actor, chat_ids):
    _, tensors = adapters
    engine = with_adapters(engine, tensors)
    actor = updated_actor(chat_ids("x"))
    engine.load_weights(dict(actor.state_dict()))  # transformers names, mapped past peft's base_layer
    for name, tensor in actor.state_dict().items():
        assert torch.equal(engine._base_state()[name].cpu(), tensor), name


def test_the_cpu_rollout_attention_leaves_grouped_kv_heads_unrepeated_and_equals_sdpa(tmp_path, chat_ids, monkeypatch):
    """A grouped-query model (2 query heads, 1 KV head), a batch whose mask has holes (rows of
    different lengths behind a shared prefix): the CPU rollout's attention gives transformers' sdpa
    tokens and log-probs, and torch receives K/V with their own head count (sdpa repeats them)."""
    from pettingllms_verl.backends.hf import attention
    from pettingllms_verl.models.tiny import build

    path = build(str(tmp_path / "gqa"), seed=0, num_key_value_heads=1)
    tokenizer = AutoTokenizer.from_pretrained(path)
    rules = "Rules: move on the grid with U D L R, never into a wall; answer in <answer>...</answer>. "
    prompts = [chat_ids(rules + task) for task in ("Sum 1 2", "Go from (0,0) to (3,4) on a grid with walls", "x")]
    kv_heads = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: kv_heads.append(k.shape[1]) or sdpa(q, k, v, **kw))
    outs = {}
    for name in ("sdpa", attention.register()):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=name)
        engine = HFGenerationEngine(model, tokenizer)
        kv_heads.clear()
        torch.manual_seed(1)
        outs[name] = engine.generate(prompts * 2, [SamplingSpec(max_tokens=10, temperature=0.8)] * 6)
        assert (2 in kv_heads) if name == "sdpa" else set(kv_heads) == {1}  # sdpa repeats K/V under a mask
    for ours, theirs in zip(outs[attention.NAME], outs["sdpa"]):
        assert ours.token_ids == theirs.token_ids
        torch.testing.assert_close(torch.tensor(ours.log_probs), torch.tensor(theirs.log_probs), atol=1e-5, rtol=0)
