"""The trainers people use, each running a few steps of a tiny model through our back end, with
the losses compared to the same trainer through ``backend="inductor"`` (issue 40): transformers'
Trainer (with accelerate), Lightning, and torchtitan's way (each block compiled, the budget set
on torch's flag by its ``memory_budget`` activation-checkpoint mode)."""

from __future__ import annotations

import contextlib
import logging
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch import config as torch_functorch_config

STEPS = 3


def _close(ours: list[float], theirs: list[float]) -> None:
    assert len(ours) == len(theirs) == STEPS, (ours, theirs)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-5)


# ---- transformers' Trainer -----------------------------------------------------------------

def _tiny_gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2,
                                       n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    model.loss_type = "ForCausalLM"  # named: the default is chosen with a logged warning
    return model


class _Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 128, (2 * STEPS, 16), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def _hf_trainer_losses(tmp_path, backend: str, **compile_kwargs) -> list[float]:
    pytest.importorskip("accelerate")  # the Trainer needs it (the workspace's trainers group)
    from transformers import Trainer, TrainingArguments

    torch._dynamo.reset()
    model = _tiny_gpt2()
    # The recipe: compile the model before the Trainer, leave torch_compile off.
    model.compile(backend=backend, **compile_kwargs)
    args = TrainingArguments(output_dir=str(tmp_path / backend), max_steps=STEPS,
                             per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                             dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens())
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_transformers_trainer_with_a_model_compiled_by_aot_pipeline(tmp_path):
    import aot_pipeline  # noqa: F401 - registers the back end (as installing the package does)

    ours = _hf_trainer_losses(tmp_path, "aot_pipeline", options={"memory_budget": 0.5})
    theirs = _hf_trainer_losses(tmp_path, "inductor")
    _close(ours, theirs)


def test_trainers_own_torch_compile_backend_cannot_name_us(tmp_path):
    """Why the recipe compiles the model itself: accelerate turns
    ``torch_compile_backend`` into a fixed enum of torch's own back ends (upstream)."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), torch_compile=True,
                             torch_compile_backend="aot_pipeline", use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match="'AOT_PIPELINE' is not a valid DynamoBackend"):
        Trainer(model=_tiny_gpt2(), args=args, train_dataset=_Tokens())


# ---- Lightning -----------------------------------------------------------------------------

def _lightning_losses(backend: str) -> list[float]:
    pl = pytest.importorskip("pytorch_lightning")
    from aot_pipeline.models import GPT

    class LitGPT(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = GPT(vocab=128, dim=32, heads=2, layers=2, seq=16)
            # The recipe: compile inside the LightningModule.
            self.compiled = torch.compile(self.net, backend=backend)
            self.losses: list[float] = []

        def training_step(self, batch: torch.Tensor, _: int) -> torch.Tensor:
            logits = self.compiled(batch)
            loss = F.cross_entropy(logits.flatten(0, 1), batch.flatten())
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.net.parameters(), lr=1e-2)

    torch._dynamo.reset()
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.DataLoader(torch.randint(0, 128, (2 * STEPS, 16),
                                                     generator=generator), batch_size=2)
    module = LitGPT()
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    with warnings.catch_warnings(), _quiet("lightning", "pytorch_lightning"):
        warnings.simplefilter("ignore")  # its advice on dataloader workers, on CPU
        trainer.fit(module, data)
    return module.losses


@contextlib.contextmanager
def _quiet(*names: str):
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def test_lightning_with_a_module_compiled_by_aot_pipeline():
    import aot_pipeline  # noqa: F401

    _close(_lightning_losses("aot_pipeline"), _lightning_losses("inductor"))


# ---- torchtitan's way: each block compiled, the budget on torch's flag ---------------------

class _Blocks(nn.Module):
    """A model shaped as torchtitan's: ``layers`` of transformer blocks, each compiled alone."""

    def __init__(self) -> None:
        super().__init__()
        from aot_pipeline.models import GPT

        torch.manual_seed(0)
        gpt = GPT(vocab=128, dim=32, heads=2, layers=2, seq=16)
        self.embed, self.pos, self.layers = gpt.tok, gpt.pos, gpt.blocks
        self.norm, self.head = gpt.ln, gpt.head

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


def _titan_losses(backend: str) -> list[float]:
    torch._dynamo.reset()
    model = _Blocks()
    for index, block in enumerate(model.layers):  # torchtitan's apply_compile, per block
        model.layers[index] = torch.compile(block, backend=backend, fullgraph=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    losses = []
    # activation_checkpoint.mode = "memory_budget": torchtitan sets torch's flag
    with torch_functorch_config.patch(activation_memory_budget=0.5):
        for _ in range(STEPS):
            batch = torch.randint(0, 128, (2, 16), generator=generator)
            loss = F.cross_entropy(model(batch).flatten(0, 1), batch.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses


def test_torchtitans_per_block_compile_and_memory_budget_mode():
    import aot_pipeline  # noqa: F401

    _close(_titan_losses("aot_pipeline"), _titan_losses("inductor"))
