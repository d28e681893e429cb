"""The LM head and its loss in chunks of tokens, through the pipeline (issue 39): the rewrite
(aot_partition.split.token_split) on the graphs Dynamo captures from the code people run, loss and
every gradient against eager, under Inductor and nop, dynamic sequence lengths, dropout on; the
"auto" decision (nothing at budget 1.0, a split only where a peak cap needs it, measured under
the cap); and what is left alone, with the reason."""

from __future__ import annotations

import copy
import logging

import aot_pipeline
import pytest
import torch
import torch.nn.functional as F
from aot_partition.memory_models.simulator import measure_peak
from aot_partition.split.token_split import find_split_sites
from aot_pipeline.options import PipelineOptionError
from aot_pipeline.splitting import SplitMatchedNothingWarning
from torch import nn


def _gpt(vocab=96, dim=32, layers=1, seq=16):
    from aot_pipeline.models import build_model

    torch.manual_seed(0)
    return build_model("gpt", vocab=vocab, dim=dim, heads=2, layers=layers, seq=seq).module


def _batch(vocab, batch, seq, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[0, : seq // 3] = -100  # ignored tokens: a prompt
    return ids, labels


def _gpt_step(module):
    def step(ids, labels):
        return F.cross_entropy(module(ids).flatten(0, 1).float(), labels.flatten())
    return step


def _compare(module, eager, call, eager_call, batch, rtol=1e-5, atol=1e-6):
    for m in (module, eager):
        m.zero_grad(set_to_none=True)
    loss = call(*batch)
    loss.backward()
    want = eager_call(*batch)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=rtol, atol=atol)
    grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    wanted = {n: p.grad for n, p in eager.named_parameters() if p.grad is not None}
    assert grads.keys() == wanted.keys()
    for name in wanted:
        torch.testing.assert_close(grads[name], wanted[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("compiler", ["inductor", "nop"])
def test_the_builtin_gpt_split_in_four_equals_eager(compiler):
    torch._dynamo.reset()
    model = _gpt()
    eager = copy.deepcopy(model)
    compiled = aot_pipeline.compile(_gpt_step(model), split=4, compiler=compiler)
    _compare(model, eager, compiled, _gpt_step(eager), _batch(96, 2, 16))
    (decision,) = compiled.recorder.splits
    assert decision.chunks == 4 and decision.site.tokens == 32 and decision.site.vocab == 96
    assert decision.mode == "forward_grads"
    assert ("split into 4 chunks (forward grads), logits 12,288 -> 3,072 bytes a buffer; "
            "about 9,216 bytes off the peak (estimated)"
            in decision.describe())
    forward = compiled.recorder.partitions[0].forward
    assert any("linear_cross_entropy" in str(n.target) for n in forward.graph.nodes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_chunk_body_inside_an_inductor_step_equals_eager(dtype):
    """The chunked op's compiled body (aot_partition.split.chunk_body, forced on: "auto"
    compiles only chunks of 2**18 logits or more) run by the Inductor-compiled step: exact in
    fp32; in bf16 no further from eager than the eager body."""
    from aot_partition.split import chunk_body

    batch = _batch(96, 2, 16)
    errors = {}
    for body in ("eager", "compiled"):
        torch._dynamo.reset()
        model = _gpt().to(dtype)
        eager = copy.deepcopy(model)
        with chunk_body.chunk_body(body):
            chunk_body.clear_cache()
            compiled = aot_pipeline.compile(_gpt_step(model), split=3)
            if dtype == torch.float32:
                _compare(model, eager, compiled, _gpt_step(eager), batch)
            else:
                compiled(*batch).backward()
                _gpt_step(eager)(*batch).backward()
            assert bool(chunk_body._cache) is (body == "compiled")
        errors[body] = max(float((p.grad.float() - q.grad.float()).abs().max())
                           for p, q in zip(model.parameters(), eager.parameters()))
    assert errors["compiled"] <= 2 * errors["eager"] + 1e-3, errors


def _hf_model(kind, dropout=0.0, loss_type="ForCausalLM"):
    """A tiny transformers causal LM; ``loss_type`` None leaves the one transformers derives
    from the class name (GPT2LMHeadModel: None, its loss_function then warns every call)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "gpt2":  # tied: the LM head reads the token embedding's weight
        config = transformers.GPT2Config(
            vocab_size=80, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=dropout,
            embd_pdrop=dropout, attn_pdrop=dropout, use_cache=False, bos_token_id=0,
            eos_token_id=0)
        config._attn_implementation = "eager"
        model = transformers.GPT2LMHeadModel(config)
        assert model.lm_head.weight is model.transformer.wte.weight
    else:  # llama, mistral, qwen2, gemma, gemma2: the same decoder, each model's own code
        name = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "gemma": "Gemma",
                "gemma2": "Gemma2"}[kind]
        extra = {"head_dim": 8, "pad_token_id": 0} if kind.startswith("gemma") else {}
        config = getattr(transformers, f"{name}Config")(
            vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            use_cache=False, bos_token_id=0, eos_token_id=0, **extra)
        config._attn_implementation = "eager"
        model = getattr(transformers, f"{name}ForCausalLM")(config)
    if loss_type is not None:
        model.loss_type = loss_type
    return model.train()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "mistral", "qwen2"])
def test_transformers_models_split_under_inductor_equal_eager(kind):
    """HF's loss: logits.float(), labels padded with -100 and shifted, view(-1, vocab),
    cross_entropy(ignore_index=-100): recognised, split, exact."""
    torch._dynamo.reset()
    model = _hf_model(kind)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_pipeline", options={"split": 3})
    ids, labels = _batch(80, 2, 24)

    def call(module):
        return lambda ids, labels: module(input_ids=ids, labels=labels).loss

    _compare(model, eager, call(compiled), call(eager), (ids, labels))


# Called as the HF Trainer calls them: labels (-100 where ignored), num_items_in_batch (the
# count of labels not -100: the loss is summed, then divided), loss_type as transformers sets it.
# Gemma2 softcaps its logits (tanh(logits / 30) * 30) before the loss: no cross-entropy of the
# projection, left alone.
@pytest.mark.parametrize("kind, left_alone", [
    ("gpt2", None), ("llama", None), ("mistral", None), ("qwen2", None), ("gemma", None),
    ("gemma2", "logits_3 (<built-in function mul>) between the projection and the loss")])
def test_transformers_models_called_as_the_trainer_calls_them_are_one_graph(kind, left_alone):
    """One graph each (GPT-2's loss_function warned through a logger every step: a graph break
    between its LM head and its loss, the split left alone); split in 4 where recognised, or
    left alone with the reason; loss and every gradient equal eager's."""
    torch._dynamo.reset()
    model = _hf_model(kind, loss_type=None)
    eager = copy.deepcopy(model)
    ids, labels = _batch(80, 2, 24)
    count = labels.ne(-100).sum()

    def call(module):
        return lambda ids, labels, n: module(input_ids=ids, labels=labels,
                                             num_items_in_batch=n).loss

    compiled = aot_pipeline.compile(call(model), split=4, compiler="nop")
    _compare(model, eager, compiled, call(eager), (ids, labels, count))
    assert len(compiled.recorder.partitions) == 1  # one graph: no break
    if left_alone is None:
        (decision,) = compiled.recorder.splits
        assert decision.chunks == 4 and decision.site.reduction == "sum"
        assert decision.site.tokens == 48 and compiled.recorder.split_left_alone == []
    else:
        assert compiled.recorder.splits == []
        assert [a.reason for a in compiled.recorder.split_left_alone] == [left_alone]


def test_transformers_gpt2_through_labels_is_split_and_equals_eager():
    """``model(input_ids=ids, labels=labels).loss`` (issue 50, item 4), loss_type as
    transformers sets it (None: GPT2LMHeadModel names no loss): split in 4, exact."""
    torch._dynamo.reset()
    model = _hf_model("gpt2", loss_type=None)
    assert model.loss_type is None
    eager = copy.deepcopy(model)

    def call(module):
        return lambda ids, labels: module(input_ids=ids, labels=labels).loss

    compiled = aot_pipeline.compile(call(model), split=4, compiler="nop")
    _compare(model, eager, compiled, call(eager), _batch(80, 2, 24))
    (decision,) = compiled.recorder.splits
    assert decision.chunks == 4 and decision.site.reduction == "mean"
    assert len(compiled.recorder.partitions) == 1


def test_without_the_ignored_warning_gpt2_breaks_between_head_and_loss_and_says_so(
        monkeypatch):
    """What the pipeline removes: with transformers' modeling_utils warning_once traced as
    Dynamo does by default, GPT-2's step is two graphs, the head in the first; the loss in the
    second is left alone, its logits an input of that graph. Still equal to eager."""
    from aot_pipeline import transformers_logging

    torch._dynamo.reset()
    model = _hf_model("gpt2", loss_type=None)
    eager = copy.deepcopy(model)
    monkeypatch.setattr(transformers_logging, "ignore_loss_warning_in_dynamo", lambda: False)

    def call(module):
        return lambda ids, labels: module(input_ids=ids, labels=labels).loss

    with torch._dynamo.config.patch(ignore_logging_functions=set()):
        compiled = aot_pipeline.compile(call(model), split=4, compiler="nop")
        _compare(model, eager, compiled, call(eager), _batch(80, 2, 24))
    assert compiled.recorder.splits == []
    assert [a.reason for a in compiled.recorder.split_left_alone] == [
        "l_logits_ is an input of this graph: the projection is in another (a graph break "
        "between the projection and the loss)"]
    assert len(compiled.recorder.partitions) == 2
    torch._dynamo.reset()


BY_NAME_CHILD = r"""
import copy, logging
import torch, transformers

class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []
    def emit(self, record):
        self.lines.append(record.getMessage())

lines = Lines()
logging.getLogger("aot_pipeline.splitting").addHandler(lines)
logging.getLogger("aot_pipeline.splitting").setLevel(logging.INFO)
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    vocab_size=80, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
    embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0)).train()
eager = copy.deepcopy(model)
ids = torch.randint(0, 80, (2, 24), generator=torch.Generator().manual_seed(1))
labels = ids.clone()
labels[0, :8] = -100
options = {"split": 4, "compiler": "nop"}

def check(call):
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    lines.lines.clear()
    loss = call(input_ids=ids, labels=labels).loss
    loss.backward()
    want = eager(input_ids=ids, labels=labels).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    print(torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs,
          "|".join(line.split(" (linear")[0] for line in lines.lines))

def loss_only(**kwargs):  # the logits never leave the graph
    return transformers.modeling_outputs.CausalLMOutput(loss=model(**kwargs).loss)

check(torch.compile(loss_only, backend="aot_pipeline", options=options))  # the name's lookup
torch._dynamo.reset()
model.compile(backend="aot_pipeline", options=options)  # the README's Trainer recipe
check(model)
"""


def test_the_registered_name_compiles_transformers_gpt2_with_labels_to_one_graph():
    """``torch.compile(backend="aot_pipeline")`` in a fresh process: the name's lookup makes
    the warning a no-op before Dynamo traces, so GPT-2 through labels= is one graph, equal to
    eager. A step returning only the loss is split; the model compiled itself (the root
    README's Trainer recipe) returns its logits, which the split must then leave whole."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-c", BY_NAME_CHILD], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == [
        "1 split: loss",
        "1 not split: loss (logits is read by logits_1, output: the loss must be its only reader)"]


def test_only_transformers_modeling_utils_warning_once_is_ignored_by_dynamo():
    """The entry the back end adds: that one logger's warning_once, not every logger's."""
    import logging

    pytest.importorskip("transformers")
    import transformers.modeling_utils  # noqa: F401 - the logger the loss_function warns on
    from aot_pipeline import transformers_logging

    aot_pipeline.make_backend({"compiler": "nop"})
    ignored = torch._dynamo.config.ignore_logging_functions
    assert transformers_logging.loss_warning() in ignored
    assert logging.getLogger("transformers.modeling_utils").warning_once in ignored
    assert logging.getLogger("transformers.generation.utils").warning_once not in ignored
    assert logging.Logger.warning_once not in ignored
    assert transformers_logging.ignore_loss_warning_in_dynamo() is False  # once


def test_a_graph_break_between_the_head_and_its_loss_is_named():
    head = _Head()
    seen = []

    def backend(gm, example_inputs):
        seen.append(find_split_sites(gm))
        return gm.forward

    def step(x, t):
        logits = head.proj(x)
        torch._dynamo.graph_break()
        return F.cross_entropy(logits, t)

    torch._dynamo.reset()
    torch.compile(step, backend=backend)(torch.randn(6, 8), torch.randint(0, 10, (6,)))
    assert [left for _, left in seen][0] == []
    (sites, left), = seen[1:]
    assert sites == [] and [a.reason for a in left] == [
        "l_logits_ is an input of this graph: the projection is in another (a graph break "
        "between the projection and the loss)"]


def test_bfloat16_weights_with_the_loss_in_float32_stay_as_close_to_eager_as_unsplit():
    """bf16 parameters, logits cast to fp32 for the loss (as models do): split and unsplit
    compiled steps each against eager; the split may not be further from eager than twice
    what compiling alone costs (bf16 rounding of reordered sums)."""
    batch = _batch(96, 2, 16)
    errors = {}
    for split in (False, 4):
        torch._dynamo.reset()
        model = _gpt().to(torch.bfloat16)
        eager = copy.deepcopy(model)
        compiled = aot_pipeline.compile(_gpt_step(model), split=split)
        compiled(*batch).backward()
        _gpt_step(eager)(*batch).backward()
        errors[split] = max(float((p.grad.float() - q.grad.float()).abs().max())
                            for p, q in zip(model.parameters(), eager.parameters()))
        assert bool(compiled.recorder.splits) is bool(split)
    assert errors[4] <= 2 * errors[False] + 1e-3, errors


def test_gpt2_dropout_on_dynamic_sequence_lengths_equal_eager_at_every_length():
    """One graph for every length (dynamic=True), dropout on (nop compiler: eager's masks),
    split in two: the chunk size follows the length at run time."""
    torch._dynamo.reset()
    model = _hf_model("gpt2", dropout=0.1)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="aot_pipeline", dynamic=True,
                             options={"split": 2, "compiler": "nop"})

    def call(module, seed):
        def run(ids, labels):
            torch.manual_seed(seed)
            return module(input_ids=ids, labels=labels).loss
        return run

    for seed, seq in enumerate((8, 16, 13, 32)):
        batch = _batch(80, 2, seq, seed)
        _compare(model, eager, call(compiled, seed), call(eager, seed), batch, rtol=1e-4)


def test_fsdp2_on_two_ranks_splits_the_head_and_equals_eager():
    """FSDP2 (each block and the root sharded) on 2 gloo ranks, the model compiled with
    split=4 (Inductor and nop): the head and loss end the last graph, are split, and every
    gradient equals one process's eager model over both ranks' batches."""
    from ranks import run_ranks

    variants = [("inductor", 4), ("nop", 4)]
    results = run_ranks("dist_cases_split:fsdp2_split", world_size=2,
                        kwargs={"variants": variants}, timeout=300)
    for rank in results:
        for (compiler, _), result in zip(variants, rank):
            assert result["max_grad_error"] < 1e-5, (compiler, result)
            assert len(result["splits"]) == 1 and "split into 4 chunks" in result["splits"][0]
            assert result["graphs"] == result["partitions"] == 3


def test_budget_one_without_a_cap_splits_nothing_by_default():
    torch._dynamo.reset()
    model = _gpt()
    compiled = aot_pipeline.compile(_gpt_step(model))
    compiled(*_batch(96, 2, 16)).backward()
    assert compiled.recorder.splits == [] and compiled.recorder.split_left_alone == []
    forward = compiled.recorder.partitions[0].forward
    assert not any("linear_cross_entropy" in str(n.target) for n in forward.graph.nodes)


def test_split_false_never_splits_even_when_a_cap_is_unreachable():
    from aot_partition import UnreachableMemoryBudgetError

    torch._dynamo.reset()
    model = _gpt(vocab=4096, dim=16, seq=128)
    compiled = aot_pipeline.compile(_gpt_step(model), memory_budget="0.3 peak", split=False)
    with pytest.raises(Exception) as failure:
        compiled(*_batch(4096, 4, 128)).backward()
    assert "is unreachable" in str(failure.value)
    assert any(isinstance(e, UnreachableMemoryBudgetError)
               for e in (failure.value, failure.value.__cause__,
                         getattr(failure.value, "inner_exception", None)))
    assert compiled.recorder.splits == []


@pytest.fixture
def inductor_graphs(monkeypatch):
    """A list that gets an item for each graph our back end hands Inductor to generate code
    for (through compile_fx_inner: the partitioned forwards and backwards, not the split's
    compiled chunk body)."""
    from aot_pipeline import _compat

    graphs: list[int] = []
    real_inner = _compat.compile_fx_inner

    def counted():
        inner = real_inner()

        def compile_inner(*args, **kwargs):
            graphs.append(1)
            return inner(*args, **kwargs)

        return compile_inner

    monkeypatch.setattr(_compat, "compile_fx_inner", counted)
    return graphs


def test_auto_splits_only_when_a_peak_cap_needs_it_and_the_measured_peak_holds(
        inductor_graphs):
    """vocab 4096, 512 tokens: the fp32 logits (8 MiB) and their gradient make the peak, which
    no recompute lowers. A cap at 45% of the uncapped peak: reachable only split; "auto" splits
    (into the fewest chunks that fit), the step's peak as measured by the profiler is under the
    cap, and the gradients equal eager's. A cap at 95%: reachable whole only by recomputing
    (0.8 ms more than uncapped, estimated), split with none: split, the cheaper way to fit.
    A cap at 150%: the whole graph's uncapped cut fits: not split. Whatever plans are compared,
    Inductor generates code for two graphs only, the kept plan's forward and backward: the
    whole graph compared at 95% is partitioned and priced, never compiled."""
    codegens = inductor_graphs
    ids, labels = _batch(4096, 4, 128)
    model = _gpt(vocab=4096, dim=16, seq=128)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    whole = aot_pipeline.compile(_gpt_step(model))
    whole(ids, labels).backward()
    model.zero_grad(set_to_none=True)
    base = measure_peak(lambda: whole(ids, labels).backward())
    params = sum(p.numel() * 4 for p in model.parameters())
    inputs = params + ids.numel() * 8 * 2

    for share, splits in ((1.5, False), (0.95, True), (0.45, True)):
        torch._dynamo.reset()
        cap = inputs + int(share * base.peak_bytes)
        compiled = aot_pipeline.compile(_gpt_step(model), memory_budget=f"{cap}B peak")
        codegens.clear()
        _compare(model, eager, compiled, _gpt_step(eager), (ids, labels), rtol=1e-4, atol=1e-6)
        assert len(codegens) == 2, (share, len(codegens))  # the kept plan's forward, backward
        assert bool(compiled.recorder.splits) is splits, share
        model.zero_grad(set_to_none=True)
        measured = measure_peak(lambda c=compiled: c(ids, labels).backward())
        assert inputs + measured.peak_bytes <= cap, (share, measured.peak_bytes, cap)
        if splits:  # the loss's split is enough: the GPT's MLP is left whole
            assert all(d.chunks >= 2 and d.site.kind == "loss" for d in compiled.recorder.splits)
            assert measured.peak_bytes < 0.7 * base.peak_bytes


@pytest.mark.parametrize("share", [None, 0.9])
def test_auto_under_a_peak_cap_compiles_transformers_gpt2_whose_joint_holds_tensor_constants(
        share):
    """Under a peak cap "auto" probes the whole graph, keeping a copy of each joint to price its
    uncapped cut; GPT-2's joint holds real tensor constants, which a copy made inside the
    compile's fake mode cannot clone (it crashed every capped GPT-2 compile). An ample cap:
    whole; a cap at 90% of the uncapped peak, met by recomputing more than uncapped: the kept
    joints are partitioned again to price that, and the split is compared; both equal eager.
    ``use_cache`` is left at transformers' default (True): the cache's tensors are the
    constants."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=80, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    model.loss_type = "ForCausalLM"
    eager = copy.deepcopy(model)
    ids, labels = _batch(80, 2, 24)

    def call(module):
        return lambda ids, labels: module(input_ids=ids, labels=labels).loss

    torch._dynamo.reset()
    if share is None:
        budget = f"{10**12}B peak"
    else:
        whole = aot_pipeline.compile(call(copy.deepcopy(model)))
        whole(ids, labels).backward()
        peak = measure_peak(lambda: whole(ids, labels).backward()).peak_bytes
        inputs = sum(p.numel() * 4 for p in model.parameters()) + ids.numel() * 8 * 2
        budget = f"{inputs + int(share * peak)}B peak"
        torch._dynamo.reset()
    compiled = aot_pipeline.compile(call(model), memory_budget=budget)
    _compare(model, eager, compiled, call(eager), (ids, labels), rtol=1e-4, atol=1e-6)
    if share is None:
        assert compiled.recorder.splits == []
    assert compiled.recorder.partitions


def test_auto_splits_the_mlp_too_when_no_split_of_the_loss_fits_and_the_measured_peak_holds():
    """A Llama block whose SwiGLU intermediates (512 tokens x 512, fp32) make the peak and whose
    loss (vocab 64) is small: under a cap at 60% of the uncapped peak neither recompute nor the
    loss's split fits; "auto" then splits the MLP too (the Mini-Sequence Transformer's split),
    the profiler's peak is under the cap and every gradient equals eager's."""
    from aot_pipeline.models import build_model

    torch.manual_seed(0)
    model = build_model("llama", vocab=64, dim=64, heads=2, layers=1, seq=256,
                        hidden=512).module
    eager = copy.deepcopy(model)
    ids, labels = _batch(64, 2, 256)
    torch._dynamo.reset()
    whole = aot_pipeline.compile(_gpt_step(model))
    whole(ids, labels).backward()
    model.zero_grad(set_to_none=True)
    base = measure_peak(lambda: whole(ids, labels).backward())
    inputs = sum(p.numel() * 4 for p in model.parameters()) + ids.numel() * 8 * 2

    torch._dynamo.reset()
    cap = inputs + int(0.6 * base.peak_bytes)
    compiled = aot_pipeline.compile(_gpt_step(model), memory_budget=f"{cap}B peak")
    _compare(model, eager, compiled, _gpt_step(eager), (ids, labels), rtol=1e-4, atol=1e-6)
    kinds = sorted(d.site.kind for d in compiled.recorder.splits)
    assert kinds == ["loss", "mlp"], compiled.recorder.splits
    model.zero_grad(set_to_none=True)
    measured = measure_peak(lambda: compiled(ids, labels).backward())
    assert inputs + measured.peak_bytes <= cap, (measured.peak_bytes, cap)


def test_auto_keeps_the_whole_graph_when_no_split_recomputes_less(
        monkeypatch, caplog, inductor_graphs):
    """The opposite of the 95% case above: when every split compared recomputes more than
    the whole graph (here told so: the whole graph 1 ms beyond its uncapped cut, each split
    2 ms; a real model rarely ties the other way, the split's loss costs less), the whole graph
    is kept. It was compared, not compiled, so it is compiled after, once: two graphs (its
    forward and backward) reach Inductor, nothing is split, and the gradients equal eager's."""
    from aot_pipeline import splitting

    def told(record):
        graph = record.joints[0].joint.graph
        split = any("linear_cross_entropy" in str(n.target) for n in graph.nodes)
        return 2e-3 if split else 1e-3

    monkeypatch.setattr(splitting, "extra_recompute", told)
    codegens = inductor_graphs
    ids, labels = _batch(4096, 4, 128)
    model = _gpt(vocab=4096, dim=16, seq=128)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = aot_pipeline.compile(_gpt_step(model), memory_budget=f"{10**12}B peak")
    with caplog.at_level(logging.INFO, logger="aot_pipeline.splitting"):
        _compare(model, eager, compiled, _gpt_step(eager), (ids, labels), rtol=1e-4, atol=1e-6)
    compared = [r.getMessage() for r in caplog.records if "more than uncapped" in r.getMessage()]
    assert len(compared) == 1, compared
    assert "split in 2: 2 ms" in compared[0] and compared[0].endswith("whole kept"), compared
    assert compiled.recorder.splits == []
    assert len(codegens) == 2


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nll_loss_of_log_softmax_is_split_too_and_equals_eager(reduction):
    torch._dynamo.reset()
    model = _gpt()
    eager = copy.deepcopy(model)

    def step_of(module):
        def step(ids, labels):
            logits = module(ids).flatten(0, 1).float()
            return F.nll_loss(F.log_softmax(logits, dim=-1), labels.flatten(),
                              reduction=reduction)
        return step

    compiled = aot_pipeline.compile(step_of(model), split=4)
    _compare(model, eager, compiled, step_of(eager), _batch(96, 2, 16))
    (decision,) = compiled.recorder.splits
    assert decision.chunks == 4 and decision.site.reduction == reduction


def test_logits_read_elsewhere_are_left_whole_with_the_reason():
    torch._dynamo.reset()
    model = _gpt()

    def step(ids, labels):
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return loss, logits.argmax(-1)  # the logits are also read: nothing to save by chunks

    compiled = aot_pipeline.compile(step, split=4)
    with pytest.warns(SplitMatchedNothingWarning) as caught:
        loss, _ = compiled(*_batch(96, 2, 16))
    loss.backward()
    assert compiled.recorder.splits == []
    (alone,) = compiled.recorder.split_left_alone
    assert alone.reason.endswith("the loss must be its only reader")
    (warning,) = [w for w in caught if w.category is SplitMatchedNothingWarning]
    assert str(warning.message) == (
        f"split=4 was asked for, but a compiled graph has nothing to split: its cross-entropy "
        f"is left whole ({alone.loss}: {alone.reason}); that graph compiles whole")


def test_an_explicit_split_that_matches_nothing_says_so_once_and_why():
    """A model without its LM head and loss in the graph (the loss computed outside): split=4
    cannot apply, and the user who asked for it is told, once, not left to guess."""
    import warnings

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = aot_pipeline.compile(model, compiler="nop", split=4)
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a second step compiles nothing new and says nothing more
            compiled(x).pow(2).mean().backward()
    said = [str(w.message) for w in caught if w.category is SplitMatchedNothingWarning]
    assert said == [
        "split=4 was asked for, but a compiled graph has nothing to split: no linear projection "
        "followed by a cross-entropy loss is in it (compile the loss with the model: the LM "
        "head and its loss must be in one graph); that graph compiles whole"]
    assert compiled.recorder.splits == []
    eager(x).pow(2).mean().backward()
    eager(x).pow(2).mean().backward()
    for (name, got), want in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, msg=name)


def test_the_opposite_case_a_split_that_applies_or_auto_says_nothing():
    import warnings

    torch._dynamo.reset()
    model = _gpt()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split = aot_pipeline.compile(_gpt_step(model), split=4, compiler="nop")
        split(*_batch(96, 2, 16)).backward()
        torch._dynamo.reset()
        auto = aot_pipeline.compile(nn.Linear(8, 8), compiler="nop")  # split "auto"
        auto(torch.randn(2, 8)).sum().backward()
    assert [w for w in caught if w.category is SplitMatchedNothingWarning] == []
    assert len(split.recorder.splits) == 1


class _Head(nn.Module):
    def __init__(self, vocab=10, dim=8):
        super().__init__()
        self.proj = nn.Linear(dim, vocab)


@pytest.mark.parametrize("loss_fn, reason", [
    (lambda lg, t: F.cross_entropy(lg, t, weight=torch.ones(10)), "class weights"),
    (lambda lg, t: F.cross_entropy(lg, t, reduction="none").sum(),
     "reduction 'none' (mean and sum are split)"),
    (lambda lg, t: F.cross_entropy(lg.unsqueeze(0).transpose(1, 2), t.unsqueeze(0)),
     "split takes [tokens, vocab] logits and [tokens] class indices"),
    (lambda lg, t: F.cross_entropy(lg.exp(), t), "between the projection and the loss"),
    (lambda lg, t: F.nll_loss(F.log_softmax(lg, dim=0), t),
     "nll_loss of something other than log_softmax(logits, dim=-1)"),
    # a reshape that moves the class boundary: [6, 10] read as [12, 5]
    (lambda lg, t: F.cross_entropy(lg.reshape(12, 5), torch.cat([t, t]) % 5),
     "a reshape other than flattening the token dims"),
])
def test_patterns_that_do_not_match_exactly_are_left_alone(loss_fn, reason):
    head = _Head()
    seen = []

    def backend(gm, example_inputs):
        seen.append(find_split_sites(gm))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda x, t: loss_fn(head.proj(x), t), backend=backend)(
        torch.randn(6, 8), torch.randint(0, 10, (6,)))
    ((sites, left),) = seen
    assert sites == []
    (alone,) = left
    assert reason in alone.reason


def test_an_autocast_region_is_left_alone():
    head = _Head()
    seen = []

    def backend(gm, example_inputs):
        seen.append(find_split_sites(gm))
        return gm.forward

    def step(x, t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head.proj(x)
        return F.cross_entropy(logits.float(), t)

    torch._dynamo.reset()
    torch.compile(step, backend=backend)(torch.randn(6, 8), torch.randint(0, 10, (6,)))
    ((sites, left),) = seen
    assert sites == [] and left[0].reason == "inside an autocast region"


@pytest.mark.parametrize("value", ["sometimes", 0, -2, True, 2.5])
def test_a_bad_split_option_is_named(value):
    with pytest.raises(PipelineOptionError, match="split must be 'auto', False .never. or a "
                                                  "number of chunks >= 1 .1: never., got"):
        aot_pipeline.compile(nn.Linear(2, 2), split=value)


def test_the_flag_sets_the_default_and_a_contradicting_option_is_refused():
    from aot_config import functorch as functorch_flags
    from aot_pipeline.backend import OptionFlagConflictError

    with functorch_flags.patch(activation_token_split=8):
        assert aot_pipeline.compile(nn.Linear(2, 2)).options.split == 8
        with pytest.raises(OptionFlagConflictError, match="split"):
            aot_pipeline.compile(nn.Linear(2, 2), split=4)


def test_against_recompute_auto_tries_more_chunks_down_to_128_tokens():
    """Issue 50: under a cap the whole graph met by recomputing, "auto" compared only the split
    in chunks of >= 1,024 tokens (2 chunks of 2,048 tokens), which still recomputed; 16 chunks
    fit with none. The counts tried now double from there down to 128 tokens a chunk."""
    from types import SimpleNamespace

    from aot_pipeline.splitting import split_counts_against_recompute

    def sites(tokens):
        return [SimpleNamespace(tokens=tokens, bytes_saved=lambda k: 0)]

    assert split_counts_against_recompute(sites(2048)) == [2, 4, 8, 16]
    assert split_counts_against_recompute(sites(8192)) == [8, 16, 32, 64]
    assert split_counts_against_recompute(sites(256)) == [2]  # 128 tokens a chunk at most
    assert split_counts_against_recompute(sites(2**20)) == [64]  # MAX_CHUNKS


class _TrunkAndHead(nn.Module):
    """A trunk and an LM head named as torchtune's (``output``), which returns the logits whole
    or, as torchtune's ``set_num_output_chunks``, one projection a chunk of the sequence."""

    def __init__(self, vocab=96, dim=32, output_chunks=1):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.output_chunks = output_chunks

    def forward(self, ids):
        h = torch.tanh(self.body(self.emb(ids)))
        if self.output_chunks == 1:
            return self.output(h)
        return [self.output(chunk) for chunk in h.chunk(self.output_chunks, dim=1)]


def _torchtitan_loss(pred, labels):
    """torchtitan's cross-entropy: flattened, in fp32, summed, divided by the tokens counted."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum",
                           ignore_index=-100) / (labels != -100).sum()


def _torchtune_chunked_output_loss(logits, labels, chunks=4):
    """torchtune's CEWithChunkedOutputLoss: a summed fp32 cross-entropy per output chunk."""
    total = (labels != -100).sum()
    labels = [t.reshape(-1) for t in labels.chunk(chunks, dim=1)]
    loss = 0.0
    for chunk, target in zip(logits, labels):
        loss = loss + F.cross_entropy(chunk.reshape(-1, chunk.size(-1)).float(), target,
                                      ignore_index=-100, reduction="sum")
    return loss / total


@pytest.mark.parametrize("output_chunks, loss_fn, sites", [
    (1, _torchtitan_loss, 1), (4, _torchtune_chunked_output_loss, 4)])
def test_torchtitans_and_torchtunes_loss_shapes_are_split_and_equal_eager(
        output_chunks, loss_fn, sites):
    """Issue 50 item 4: the losses torchtitan and torchtune write (torchtune's already chunked by
    the model's output projections: each chunk's head and loss is a site of its own)."""
    torch.manual_seed(0)
    model = _TrunkAndHead(output_chunks=output_chunks)
    eager = copy.deepcopy(model)

    def step_of(module):
        return lambda ids, labels: loss_fn(module(ids), labels)

    torch._dynamo.reset()
    compiled = aot_pipeline.compile(step_of(model), split=4)
    _compare(model, eager, compiled, step_of(eager), _batch(96, 2, 16))
    assert [(d.chunks, d.site.reduction) for d in compiled.recorder.splits] == [(4, "sum")] * sites
    assert compiled.recorder.split_left_alone == []
