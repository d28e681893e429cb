"""What ``aot-pipeline`` says to a first-time user: the hint without a command, the examples
under each command's ``--help``.

Kept apart from ``cli.py`` as data: a new way to name a model adds its example lines to
``EXAMPLES`` (each line a command and what it shows), and both texts pick them up. Imports no
torch: ``aot-pipeline`` alone answers at once.
"""

from __future__ import annotations

import argparse
from typing import Any

PROG = "aot-pipeline"

# Command -> what it does, one line (the hint's summary).
SUMMARIES: dict[str, str] = {
    "partition": "which activations are saved or recomputed, and why",
    "pareto": "sweep the memory budget: simulated peak against recompute (table and PNG)",
    "train": "train eager, inductor and aot_pipeline side by side and compare",
}

# Command -> (command line, what it shows). The first line is the one the hint shows.
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "partition": [
        ("aot-pipeline partition --model gpt --memory-budget 0.5",
         "half the activation memory: what is recomputed"),
        ("aot-pipeline partition --model llama --layers 2 --memory-budget 300KiB",
         "a cap in bytes instead of a fraction"),
        ("aot-pipeline partition --model mypackage.models:build --memory-budget 0.5",
         "your model: build() returns the module and its example inputs"),
        ("aot-pipeline partition --hf gpt2 --hf-config n_layer=2,n_embd=128,n_head=4 "
         "--memory-budget 0.5",
         "a transformers architecture from a config, random weights"),
        ("aot-pipeline partition --exported model.pt2", "a program saved by torch.export.save"),
    ],
    "pareto": [
        ("aot-pipeline pareto --model gpt --budgets 1,0.5,0 --output pareto.png",
         "three budgets, ours against torch's partitioner"),
        ("aot-pipeline pareto --model convnet --no-torch", "the full sweep, ours only"),
        ("aot-pipeline pareto --torchvision resnet18 --model-config num_classes=10",
         "a torchvision model by name (timm: --timm NAME)"),
    ],
    "train": [
        ("aot-pipeline train --model mlp --steps 5 --compiler nop",
         "a quick check: the same losses as eager"),
        ("aot-pipeline train --model gpt --memory-budget 0.5 --compiled-autograd",
         "half the activations, the backward through compiled autograd"),
        ("aot-pipeline train --model path/to/model.py:build --input 8x128:int64:50257",
         "your model from a file; build() returns a module, --input gives its inputs"),
    ],
}

# Your own model: --model package.module:factory, --hf, --torchvision, --timm (and --exported
# for partition and pareto) on the command line; the same back end from Python.
OWN_MODEL = ('your own model: --model package.module:factory (or file.py:factory), --hf NAME, '
             '--torchvision NAME, --timm NAME;\nfrom Python:\n'
             '  torch.compile(model, backend="aot_pipeline", options={"memory_budget": 0.5})')


def no_command_hint() -> str:
    """The text ``aot-pipeline`` prints without a command."""
    lines = [f"{PROG}: no command given. Start with one of:"]
    for name, summary in SUMMARIES.items():
        lines += [f"  {EXAMPLES[name][0][0]}", f"      {summary}"]
    lines += [f"'{PROG} <command> --help' shows each command's options and more examples;",
              OWN_MODEL]
    return "\n".join(lines)


def command_help(command: str) -> dict[str, Any]:
    """``add_parser`` keyword arguments for ``command``: the examples as its epilog, kept as
    written (one per line)."""
    lines = ["examples:"]
    for line, what in EXAMPLES[command]:
        lines += [f"  {line}", f"      {what}"]
    return {"epilog": "\n".join([*lines, "", OWN_MODEL]),
            "formatter_class": argparse.RawDescriptionHelpFormatter}
