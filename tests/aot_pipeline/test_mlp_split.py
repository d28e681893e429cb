"""The token-wise MLP in chunks of tokens (issue 39, Mini-Sequence Transformer) on the graphs
Dynamo captures from the code people run: ``find_split_sites(gm, kinds=("mlp",))`` and
``split_token_wise`` applied by a small back end before aot_pipeline's (Inductor, or nop), loss
and every gradient against eager; dynamic sequence lengths; together with the loss split; and
the MLPs left alone, with the reason. (The pipeline's own ``split`` option does not apply MLP
sites yet: these tests apply them.)"""

from __future__ import annotations

import copy

import aot_pipeline
import pytest
import torch
import torch.nn.functional as F
from aot_partition.split.token_split import (
    LeftAlone,
    MlpSplitSite,
    SplitSite,
    find_split_sites,
    split_token_wise,
)
from aot_pipeline.recording import PartitionRecorder
from torch import nn


class _Split:
    """A torch.compile back end: the MLP sites (and the loss's, with ``kinds``) split into
    ``chunks``, then aot_pipeline's back end (its own split off). Records what it found."""

    def __init__(self, chunks=4, compiler="inductor", kinds=("mlp",)):
        self.chunks, self.kinds = chunks, kinds
        self.recorder = PartitionRecorder()
        self.inner = aot_pipeline.make_backend({"compiler": compiler, "split": False},
                                               self.recorder)
        self.sites, self.left, self.decisions = [], [], []

    def __call__(self, gm, example_inputs):
        sites, left = find_split_sites(gm, kinds=self.kinds)
        self.sites += sites
        self.left += left
        self.decisions += split_token_wise(gm, self.chunks, sites=sites)
        return self.inner(gm, example_inputs)

    def forward_has_the_op(self):
        return any("token_mlp" in str(n.target) for p in self.recorder.partitions
                   for n in p.forward.graph.nodes)


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
    assert grads.keys() == wanted.keys() and wanted
    for name in wanted:
        torch.testing.assert_close(grads[name], wanted[name], rtol=rtol, atol=atol, msg=name)


def _batch(vocab, batch, seq, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[0, : seq // 3] = -100
    return ids, labels


def _llama(layers=2, dropout=0.0):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=80, hidden_size=32, intermediate_size=88, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        use_cache=False, bos_token_id=0, eos_token_id=0, attention_dropout=dropout)
    model = transformers.LlamaForCausalLM(config)
    model.loss_type = "ForCausalLM"
    return model.train()


def _hf_loss(module):
    return lambda ids, labels: module(input_ids=ids, labels=labels).loss


@pytest.mark.parametrize("compiler", ["inductor", "nop"])
def test_llama_swiglu_mlps_split_in_four_equal_eager(compiler):
    """transformers' LlamaMLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``: one site a
    layer, split, the op in the compiled forward, loss and every gradient as eager's."""
    torch._dynamo.reset()
    layers = 1 if compiler == "inductor" else 2  # Inductor's compile on 2 CPU cores: one layer
    model = _llama(layers)
    eager = copy.deepcopy(model)
    backend = _Split(4, compiler)
    compiled = torch.compile(model, backend=backend)
    _compare(model, eager, _hf_loss(compiled), _hf_loss(eager), _batch(80, 2, 24))
    assert len(backend.sites) == layers
    assert all(isinstance(s, MlpSplitSite) for s in backend.sites)
    site = backend.sites[0]
    assert (site.gated, site.activation, site.tokens, site.dim, site.hidden, site.out) == (
        True, "silu", 48, 32, 88, 32)
    assert all(d.chunks == 4 and d.mode == "recompute" for d in backend.decisions)
    assert "split into 4 chunks (recompute), intermediate 16,896 -> 4,224 bytes a buffer" in \
        backend.decisions[0].describe()
    assert backend.left == [] and backend.forward_has_the_op()


def test_the_default_kinds_find_loss_sites_only():
    """``find_split_sites(gm)``: as before, no MLP sites (the pipeline's callers unchanged)."""
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.append((find_split_sites(gm), find_split_sites(gm, kinds=("loss", "mlp"))))
        return gm.forward

    model = _llama(layers=1)
    torch.compile(model, backend=backend)(input_ids=_batch(80, 2, 8)[0])
    ((default, both),) = seen
    assert default == ([], [])
    assert [s.kind for s in both[0]] == ["mlp"]
    traced = torch.fx.symbolic_trace(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="split site kinds .'ffn',.: valid are loss, mlp"):
        find_split_sites(traced, kinds=("ffn",))
    with pytest.raises(ValueError, match="a sequence of names, e.g. .'mlp',., not 'mlp'"):
        find_split_sites(traced, kinds="mlp")


def _gpt(vocab=96, dim=32, layers=2, seq=32):
    from aot_pipeline.models import build_model

    torch.manual_seed(0)
    return build_model("gpt", vocab=vocab, dim=dim, heads=2, layers=layers, seq=seq).module


def _gpt_step(module):
    def step(ids, labels):
        return F.cross_entropy(module(ids).flatten(0, 1).float(), labels.flatten())
    return step


def test_the_builtin_gpt_gelu_mlps_and_its_loss_split_together():
    """The zoo's GPT: ``out(gelu(fc(ln2(x))))`` with biases, plain; the head and loss split too
    (both kinds): three sites, loss and every gradient as eager's."""
    torch._dynamo.reset()
    model = _gpt()
    eager = copy.deepcopy(model)
    backend = _Split(3, "nop", kinds=("loss", "mlp"))
    compiled = torch.compile(_gpt_step(model), backend=backend)
    _compare(model, eager, compiled, _gpt_step(eager), _batch(96, 2, 32))
    kinds = [type(s) for s in backend.sites]
    assert kinds == [SplitSite, MlpSplitSite, MlpSplitSite]
    assert all(not s.gated and s.activation == "gelu" and s.hidden == 128
               for s in backend.sites[1:])
    assert backend.forward_has_the_op()


def test_dynamic_sequence_lengths_one_graph_for_every_length():
    """dynamic=True: the chunk size follows the length at run time (the nop compiler: the
    rewritten graph's ops as traced)."""
    torch._dynamo.reset()
    model = _llama(layers=1)
    eager = copy.deepcopy(model)
    backend = _Split(3, "nop")
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for seed, seq in enumerate((8, 13, 21)):
        _compare(model, eager, _hf_loss(compiled), _hf_loss(eager), _batch(80, 2, seq, seed),
                 rtol=1e-4, atol=1e-5)
    assert backend.sites and all(d.chunks == 3 for d in backend.decisions)
    assert all(not isinstance(s.tokens, torch.SymInt) for s in backend.sites)


class _Mlp(nn.Module):
    def __init__(self, dim=8, hidden=24, gated=False, dropout=0.0, act=F.silu):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.gate = nn.Linear(dim, hidden) if gated else None
        self.down = nn.Linear(hidden, dim)
        self.dropout, self.act = dropout, act

    def forward(self, x):
        h = self.act(self.up(x)) if self.gate is None else self.act(self.gate(x)) * self.up(x)
        return self.down(F.dropout(h, self.dropout) if self.dropout else h)


def test_back_to_back_mlps_and_a_deep_linear_gelu_chain_split_without_overlap():
    """Two MLPs, the second reading the first's output (rewritten last first); the zoo's deep
    MLP ``gelu(layer(x))`` chains: each linear is one MLP's at most, the others left alone."""
    torch.manual_seed(0)
    first, second = _Mlp(gated=True), _Mlp(act=torch.relu)
    seen = []

    def backend(gm, example_inputs):
        sites, left = find_split_sites(gm, kinds=("mlp",))
        seen.append((sites, left))
        split_token_wise(gm, 4, sites=sites)
        return gm.forward

    x = torch.randn(3, 10, 8, requires_grad=True)
    torch._dynamo.reset()
    y = torch.compile(lambda t: second(first(t)), backend=backend)(x)
    want = second(first(x))
    torch.testing.assert_close(y, want)
    got = torch.autograd.grad(y.square().sum(), [x, *first.parameters(), *second.parameters()])
    wanted = torch.autograd.grad(want.square().sum(),
                                 [x, *first.parameters(), *second.parameters()])
    for a, b in zip(got, wanted):
        torch.testing.assert_close(a, b)
    assert [s.activation for s in seen[0][0]] == ["silu", "relu"]

    from aot_pipeline.models import build_model

    deep = build_model("mlp", dim=16, layers=4).module
    seen.clear()
    torch._dynamo.reset()
    inputs = torch.randn(12, 16)
    torch.testing.assert_close(torch.compile(deep, backend=backend)(inputs), deep(inputs))
    ((sites, left),) = seen
    assert len(sites) == 2 and len(left) == 2
    assert all("sites may not overlap" in alone.reason for alone in left)


def _found(fn, *inputs):
    seen = []

    def backend(gm, example_inputs):
        seen.append(find_split_sites(gm, kinds=("mlp",)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*inputs)
    ((sites, left),) = seen
    return sites, left


@pytest.mark.parametrize("options, make, reason", [
    ({}, lambda m: m, None),
    (dict(gated=True, act=lambda t: F.gelu(t, approximate="tanh")), lambda m: m, None),
    (dict(dropout=0.1), lambda m: m, "is read by dropout"),
    ({}, lambda m: (lambda x: (lambda h: m.down(h) + h.sum())(F.silu(m.up(x)))),
     "the down projection must be its only reader"),
    ({}, lambda m: (lambda x: (lambda u: m.down(F.silu(u)) + u.mean())(m.up(x))),
     "the MLP must be its only reader"),
    ({}, lambda m: (lambda x: m.down(F.silu(m.up(x)) * m.up(x + 1))),
     "project different inputs"),
    ({}, lambda m: (lambda x: m.down(F.silu(m.up(x[:1, :1])))), "fewer than two chunks' worth"),
])
def test_mlps_split_or_left_alone_with_the_reason(options, make, reason):
    """Split: a plain MLP, a GeGLU (tanh). Left alone: dropout inside the MLP, the
    intermediate or a projection read elsewhere, a gate and an up projection of different
    inputs, a single token."""
    torch.manual_seed(0)
    sites, left = _found(make(_Mlp(**options)), torch.randn(2, 6, 8))
    if reason is None:
        assert len(sites) == 1 and isinstance(sites[0], MlpSplitSite) and left == []
        assert sites[0].gated is bool(options.get("gated"))
    else:
        assert sites == []
        assert len(left) == 1 and reason in left[0].reason and left[0].kind == "mlp", left


def test_an_autocast_region_and_gpt2s_conv1d_are_left_alone():
    mlp = _Mlp(gated=True)

    def step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return mlp(x).float()

    sites, left = _found(step, torch.randn(2, 6, 8))
    assert sites == [] and left == [LeftAlone("silu", "inside an autocast region", "mlp")]

    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=80, n_positions=64, n_embd=32, n_layer=1,
                                     n_head=2, use_cache=False)
    config._attn_implementation = "eager"
    gpt2 = transformers.GPT2LMHeadModel(config).eval()
    sites, left = _found(lambda ids: gpt2(input_ids=ids).logits, torch.randint(0, 80, (2, 8)))
    assert sites == [] and left
    assert all("a projection by addmm (as GPT-2's Conv1D)" in a.reason for a in left)


def test_a_site_tuple_that_overlaps_is_refused():
    seen = []

    def backend(gm, example_inputs):
        sites, _ = find_split_sites(gm, kinds=("mlp",))
        with pytest.raises(ValueError, match="share"):
            split_token_wise(gm, 2, sites=[sites[0], sites[0]])
        seen.append(sites)
        return gm.forward

    mlp = _Mlp()
    torch._dynamo.reset()
    torch.compile(mlp, backend=backend)(torch.randn(4, 8))
    assert len(seen[0]) == 1
