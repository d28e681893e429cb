"""Jaxpr-like graphs in the core's plain terms, shared by the core's budget tests and
benchmarks/core_budget_bench.py: a GPT training step as jax.value_and_grad's jaxpr has it (its
VJP written out), jax remat policies priced on it, and small random training steps. Imports only
``aot_partition.core`` (no torch)."""

from __future__ import annotations

import math
import random

from aot_partition.core import CoreGraph

# ---- a jaxpr-like transformer training step, its VJP written out ---------------------------

class _Trace:
    def __init__(self):
        self.records, self.shapes, self.fwd_eqns, self.counter = [], {}, [], 0
        self.batched: set[str] = set()

    def var(self, op, inputs, shape, *, category, runtime=0.0, backward=False, **extra):
        self.counter += 1
        name = f"{op}_{self.counter}"
        self.shapes[name] = shape
        record = {"id": name, "inputs": list(inputs), "nbytes": 4 * math.prod(shape),
                  "category": category, "op": op, **extra}
        if backward:
            record["in_backward"] = True
        else:
            record["forward"] = True
            if runtime:
                record["runtime"] = float(runtime)
        self.records.append(record)
        return name

    # forward ops: each records (op, out, ins, info) for the VJP
    def leaf(self, kind, shape):
        category = {"input": "input", "param": "parameter"}[kind]
        return self.var(kind, (), shape, category=category)

    def fw(self, op, ins, shape, category, runtime, info=None):
        out = self.var(op, ins, shape, category=category, runtime=runtime)
        self.fwd_eqns.append((op, out, tuple(ins), info or {}))
        return out

    def dot(self, a, b, shape, k, batch=False):
        out = self.fw("dot_general", (a, b), shape, "compute", 2 * math.prod(shape) * k)
        if batch:
            self.batched.add(out)
        return out

    def ew(self, op, ins, shape=None):
        shape = shape or self.shapes[ins[0]]
        return self.fw(op, ins, shape, "pointwise", math.prod(shape))

    def reduce(self, op, a, shape):
        return self.fw(op, (a,), shape, "reduction", math.prod(self.shapes[a]))

    def view(self, op, a, shape):
        return self.fw(op, (a,), shape, "view", 0)


def _layer_norm(t, x, g):
    shape = t.shapes[x]
    row = shape[:-1] + (1,)
    mean = t.reduce("reduce_sum", x, row)
    xc = t.ew("sub", (x, mean))
    sq = t.ew("mul", (xc, xc))
    var = t.reduce("reduce_sum", sq, row)
    rs = t.ew("rsqrt", (var,))
    xn = t.ew("mul", (xc, rs))
    return t.ew("mul", (xn, g))


def _softmax_parts(t, s):
    shape = t.shapes[s]
    row = shape[:-1] + (1,)
    mx = t.reduce("reduce_max", s, row)
    sh = t.ew("sub", (s, mx))
    e = t.ew("exp", (sh,))
    se = t.reduce("reduce_sum", e, row)
    return e, se


def transformer_step(layers=2, batch=4, seq=64, dim=64, heads=4, ffn=256, vocab=256):
    """A pre-LN GPT training step as jax.value_and_grad's jaxpr has it (dot_general, elementwise
    ops, reductions, reshape/transpose; tanh-GELU and layer norm decomposed), float32, with the
    cotangent seed a tangent input and the backward's equations in_backward. ``runtime`` is
    FLOPs (a dot 2*M*N*K, an elementwise op one per element, a reduction one per input
    element). Returns the graph and the ids of the dots with batch dimensions (attention)."""
    t = _Trace()
    dh = dim // heads
    x = t.leaf("input", (batch, seq, dim))
    onehot = t.leaf("input", (batch, seq, vocab))
    params = []
    for _ in range(layers):
        names = {k: t.leaf("param", s) for k, s in (
            ("g1", (dim,)), ("wq", (dim, dim)), ("wk", (dim, dim)), ("wv", (dim, dim)),
            ("wo", (dim, dim)), ("g2", (dim,)), ("w1", (dim, ffn)), ("w2", (ffn, dim)))}
        params.append(names)
    gf = t.leaf("param", (dim,))
    wout = t.leaf("param", (dim, vocab))
    h = x
    for p in params:
        a = _layer_norm(t, h, p["g1"])
        q, k, v = (t.dot(a, p[w], (batch, seq, dim), dim) for w in ("wq", "wk", "wv"))
        q4, k4, v4 = (t.view("transpose", t.view("reshape", z, (batch, seq, heads, dh)),
                             (batch, heads, seq, dh)) for z in (q, k, v))
        s = t.dot(q4, k4, (batch, heads, seq, seq), dh, batch=True)
        e, se = _softmax_parts(t, s)
        pr = t.ew("div", (e, se))
        o4 = t.dot(pr, v4, (batch, heads, seq, dh), seq, batch=True)
        o = t.view("reshape", t.view("transpose", o4, (batch, seq, heads, dh)),
                   (batch, seq, dim))
        h = t.ew("add", (h, t.dot(o, p["wo"], (batch, seq, dim), dim)))
        b = _layer_norm(t, h, p["g2"])
        f = t.dot(b, p["w1"], (batch, seq, ffn), dim)
        f3 = t.ew("integer_pow", (f,))
        inner = t.ew("add", (f, t.ew("mul", (f3,))))
        th = t.ew("tanh", (t.ew("mul", (inner,)),))
        gelu = t.ew("mul", (t.ew("mul", (f,)), t.ew("add", (th,))))
        h = t.ew("add", (h, t.dot(gelu, p["w2"], (batch, seq, dim), ffn)))
    hf = _layer_norm(t, h, gf)
    logits = t.dot(hf, wout, (batch, seq, vocab), dim)
    e, se = _softmax_parts(t, logits)
    lse = t.ew("log", (se,))
    picked = t.reduce("reduce_sum", t.ew("mul", (logits, onehot)), (batch, seq, 1))
    # loss = sum(lse + max - picked): max's gradient cancels (softmax), as jax folds it
    loss = t.reduce("reduce_sum", t.ew("sub", (lse, picked)), (1,))
    _backward(t, loss, [w for p in params for w in p.values()] + [gf, wout])
    return CoreGraph.from_dicts(t.records), frozenset(t.batched)


def _backward(t, loss, wanted):
    """Reverse-mode over the forward equations: each VJP reads the cotangent and the
    residuals jax's rule reads; cotangents of one value are summed with add_any."""
    ct = {loss: t.var("ct", (), (1,), category="tangent", backward=True)}
    bw = {"backward": True}

    def emit(op, ins, shape, category="pointwise"):
        return t.var(op, ins, shape, category=category, **bw)

    def give(target, g):
        if t.records[_pos(t, target)]["category"] == "input":
            return  # no gradient for the data
        if t.shapes[g] != t.shapes[target]:
            g = emit("reduce_sum", (g,), t.shapes[target], "reduction")
        ct[target] = emit("add_any", (ct[target], g), t.shapes[target]) if target in ct else g

    for op, out, ins, _info in reversed(t.fwd_eqns):
        g = ct.get(out)
        if g is None:
            continue
        shape = t.shapes[out]
        if op == "dot_general":
            a, b = ins
            give(a, emit("dot_general", (g, b), t.shapes[a], "compute"))
            give(b, emit("dot_general", (a, g), t.shapes[b], "compute"))
        elif op in ("add",):
            for a in ins:
                give(a, g)
        elif op == "sub":
            give(ins[0], g)
            if len(ins) > 1:
                give(ins[1], emit("neg", (g,), shape))
        elif op == "mul":
            if len(ins) == 1:  # times a literal
                give(ins[0], emit("mul", (g,), shape))
            else:
                a, b = ins
                give(a, emit("mul", (g, b), shape))
                if a != b:
                    give(b, emit("mul", (g, a), shape))
                else:
                    give(a, emit("mul", (g, a), shape))
        elif op == "div":
            a, b = ins
            q = emit("div", (g, b), shape)
            give(a, q)
            give(b, emit("neg", (emit("mul", (q, out), shape),), shape))
        elif op == "exp":
            give(ins[0], emit("mul", (g, out), shape))
        elif op == "log":
            give(ins[0], emit("div", (g, ins[0]), shape))
        elif op == "tanh":
            sq = emit("mul", (out, out), shape)
            give(ins[0], emit("mul", (g, emit("sub", (sq,), shape)), shape))
        elif op == "integer_pow":
            sq = emit("integer_pow", (ins[0],), shape)
            give(ins[0], emit("mul", (g, sq), shape))
        elif op == "rsqrt":
            give(ins[0], emit("mul", (g, emit("div", (out, ins[0]), shape)), shape))
        elif op == "reduce_sum":
            give(ins[0], emit("broadcast_in_dim", (g,), t.shapes[ins[0]]))
        elif op == "reduce_max":
            mask = emit("eq", (ins[0], out), t.shapes[ins[0]])
            give(ins[0], emit("mul", (g, mask), t.shapes[ins[0]]))
        elif op in ("reshape", "transpose"):
            give(ins[0], emit(op, (g,), t.shapes[ins[0]], "view"))
        else:
            raise AssertionError(op)
    for w in wanted:
        t.records[_pos(t, ct[w])]["backward"] = True


def _pos(t, name):
    return int(name.rsplit("_", 1)[1]) - 1


def policy_cut(graph: CoreGraph, saveable) -> tuple[int, float]:
    """(saved bytes, recompute FLOPs) of a jax remat policy on ``graph``: every forward value the
    backward reads is saved when ``saveable(node)`` (inputs and parameters are free: alive
    anyway), else recomputed from its own inputs, recursively."""
    index = graph.index
    saved: set[str] = set()
    recomputed: set[str] = set()
    pending = [i for n in graph.nodes if n.in_backward for i in n.inputs
               if not graph.nodes[index[i]].in_backward]
    while pending:
        name = pending.pop()
        node = graph.nodes[index[name]]
        if name in saved or name in recomputed or node.category in ("input", "parameter"):
            continue
        if saveable(node):
            saved.add(name)
        else:
            recomputed.add(name)
            pending.extend(node.inputs)
    return (sum(graph.nodes[index[n]].nbytes for n in saved),
            sum(graph.nodes[index[n]].runtime for n in recomputed))



def random_step(seed: int) -> CoreGraph:
    """A random forward of compute, pointwise, reduction, view and replayable random nodes
    (about one in ten without a runtime), and a backward reading some of them."""
    rng = random.Random(seed)
    records = [{"id": "x", "nbytes": 4 * rng.randint(1, 64), "category": "input",
                "forward": True},
               {"id": "w", "nbytes": 4 * rng.randint(1, 64), "category": "parameter",
                "forward": True}]
    forward = ["x", "w"]
    for i in range(rng.randint(3, 40)):
        category = rng.choice(["compute", "pointwise", "pointwise", "reduction", "view",
                               "random"])
        runtime = (0.0 if category == "view" or rng.random() < 0.1
                   else rng.randint(1, 100) * (10.0 if category == "compute" else 1.0))
        records.append({"id": f"f{i}", "inputs": sorted(set(rng.sample(forward,
                                                                         rng.randint(1, 2)))),
                        "nbytes": 4 * rng.randint(1, 64), "category": category,
                        "forward": True, "runtime": runtime,
                        "allow_recompute": category == "random"})
        forward.append(f"f{i}")
    records.append({"id": "g", "nbytes": 4, "category": "tangent", "in_backward": True})
    backward = ["g"]
    for i in range(rng.randint(2, 10)):
        records.append({"id": f"b{i}", "inputs": sorted({rng.choice(backward),
                                                         rng.choice(forward[2:])}),
                        "nbytes": 4 * rng.randint(1, 64), "in_backward": True,
                        "category": rng.choice(["pointwise", "compute"])})
        backward.append(f"b{i}")
    records[-1]["backward"] = True
    return CoreGraph.from_dicts(records)
