"""Train a model (built-in or the user's) the same way three times: eager, ``backend="inductor"``, and ours.

Each run builds the model afresh from the same seed and feeds the same synthetic batches, so the
losses of the three runs must agree up to float rounding. Every variant runs the model and its
loss as one module (``BuiltModel.training_step()``: next-token cross-entropy for the built-in
language models), so the compiled variants compile the loss inside the step, as a training step
does. Each run records:

- ``first_step_s``: wall time of step 1, which includes compiling forward and backward;
- ``step_s``: median wall time of the later steps;
- ``saved_bytes``: bytes the forward keeps alive for the backward beyond its inputs
  (``aot_partition.saved_bytes``: inputs, parameters, buffers and views of them cost nothing).
  Ours: read from the forward graph our partitioner produced; Inductor's: from the forward
  graph torch's partitioner gave Inductor (captured at ``compile_fx``'s ``inner_compile``);
  eager: the distinct storages autograd packed during one forward (``saved_tensors_hooks``),
  less the inputs' and the module's;
- ``peak_memory_bytes``: peak CUDA memory allocated over the steps after the first (GPU only).
- ``step_peak_bytes``: one more step's peak above what is allocated before it, measured (CPU:
  the profiler's allocation events); ``predicted_peak_bytes``: for aot_pipeline, the peak
  ``CompiledModel.predicted_peak()`` predicts for that step. ``aot_pipeline_capped`` is ours
  under the peak cap ``TrainSettings.capped_budget`` ("0.8 peak" unless given): the cap bounds
  the whole step (step_cap.py), and both peaks say whether it held.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import _compat
from .model_names import DEFAULT_CAP, VARIANTS
from .models import BuiltModel
from .options import PipelineOptionError, PipelineOptions
from .recording import PartitionRecorder
from .user_models import ModelSpec

log = logging.getLogger(__name__)

LEARNING_RATE = 1e-2
# The built-in language models train where the LM head's logits matter, as in real training (a
# 1,024-token vocabulary, 256 tokens a sequence: the logits 16x the embedding): the step's peak
# is then the loss's, which the capped row's split lowers. At the models' own sizes (vocab 64,
# 16 tokens) the parameters' gradients make the peak and no cap below ~0.95 of it is reachable.
TRAIN_LM_SIZES = {"vocab": 1024, "seq": 256}
# Losses of compiled runs agree with eager when within this relative tolerance at every step.
LOSS_RTOL = 1e-3
LOSS_ATOL = 1e-5


@dataclass
class TrainResult:
    variant: str
    losses: list[float]
    first_step_s: float
    step_s: float
    saved_bytes: int | None
    peak_memory_bytes: int | None = None
    matches_eager: bool | None = None
    # One more step's peak above what is allocated before it, measured (CPU: the profiler's
    # allocation events; CUDA: max_memory_allocated), and for aot_pipeline the peak predicted
    # for it (CompiledModel.predicted_peak(): every graph of the step, priced as partitioned).
    step_peak_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    # The capped row when its cap is unreachable: the refusal's message (no step ran).
    refusal: str | None = None

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


@dataclass
class TrainSettings:
    model: str = "gpt"
    layers: int = 2
    steps: int = 10
    # a fraction, or a size such as "300MiB"; None here and below: from the partitioner flags
    memory_budget: float | str | None = None
    solver: str | None = None
    compiler: str = "inductor"
    compiled_autograd: bool = False
    device: str = "cpu"
    variants: Sequence[str] = field(default_factory=lambda: VARIANTS)
    memory_budget_best_effort: bool | None = None
    # the LM head and its loss in chunks: "auto", False or a chunk count (None: the flag)
    split: str | int | bool | None = None
    # The model to build (a user's model, see user_models.ModelSpec); None: built-in ``model``.
    model_spec: ModelSpec | None = None
    # The peak cap of the "aot_pipeline_capped" row ("0.8 peak": a share of the uncapped
    # step; or a size, "200MiB peak"): the step's peak bound across all its graphs.
    capped_budget: str = DEFAULT_CAP

    def build(self, device: torch.device) -> BuiltModel:
        return self.spec().build(device)

    def spec(self) -> ModelSpec:
        """The model to train; a built-in language model at ``TRAIN_LM_SIZES`` unless sized."""
        spec = self.model_spec or ModelSpec("builtin", self.model, layers=self.layers)
        if spec.source == "builtin" and spec.name in ("gpt", "llama") and not spec.config:
            spec = dataclasses.replace(spec, config=TRAIN_LM_SIZES)
        return spec

    def pipeline_options(self, capped: bool = False) -> PipelineOptions:
        """The options ``aot_pipeline`` variants compile with: the settings given, the rest
        from the partitioner flags (a set flag contradicting a setting raises); ``capped``:
        the "aot_pipeline_capped" row's, ``capped_budget`` in place of the memory budget."""
        from .backend import with_explicit_options

        budget = self.capped_budget if capped else self.memory_budget
        flagged = {"memory_budget": budget, "solver": self.solver,
                   "memory_budget_best_effort": self.memory_budget_best_effort,
                   "split": self.split}
        return with_explicit_options({
            **{name: value for name, value in flagged.items() if value is not None},
            "compiler": self.compiler, "compiled_autograd": self.compiled_autograd})


def check_device(device: str) -> torch.device:
    """``device`` as a torch.device, or a PipelineOptionError naming what is available."""
    if device not in ("cpu", "cuda"):
        raise PipelineOptionError(f"unknown device {device!r}; choose one of cpu, cuda")
    if device == "cuda" and not _compat.cuda_available():
        raise PipelineOptionError("--device cuda was asked for, but torch sees no CUDA device; "
                                  "use --device cpu")
    return torch.device(device)


def eager_saved_bytes(module: nn.Module, inputs: Sequence[torch.Tensor],
                      loss_fn: Callable[[Any], torch.Tensor] = lambda loss: loss) -> int:
    """Bytes of the distinct storages autograd saves in one eager forward of ``module``, less
    those of its inputs, parameters and buffers (alive anyway): the measure
    ``aot_partition.saved_bytes`` applies to the compiled variants' forward graphs.
    ``loss_fn``: what reduces the module's output (none: the module returns its loss)."""
    alive = {t.untyped_storage().data_ptr()
             for t in (*inputs, *module.parameters(), *module.buffers())
             if isinstance(t, torch.Tensor)}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in alive:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_fn(module(*inputs))
    return sum(storages.values())


class _Runner:
    """How one variant calls the model and runs its backward, and what it saves."""

    def __init__(self, variant: str, built: BuiltModel, settings: TrainSettings) -> None:
        self.variant = variant
        self.built = built
        # Every variant runs the model and its loss as one module, so the compiled ones compile
        # the loss with it (an LM's head and loss split, the step's peak cap prices it).
        self.step = built.training_step()
        self.recorder = PartitionRecorder()
        self.backward: Callable[[torch.Tensor], None] = lambda loss: loss.backward()
        self.compiled: Any = None  # the aot_pipeline variant's CompiledModel
        if variant == "eager":
            self.call: Callable[..., Any] = self.step
        elif variant == "inductor":
            self.call = torch.compile(self.step, backend=self._recording_inductor())
        elif variant in ("aot_pipeline", "aot_pipeline_capped"):
            from .api import CompiledModel

            options = settings.pipeline_options(capped=variant == "aot_pipeline_capped")
            compiled = CompiledModel(self.step, options, dynamic=None)
            self.recorder = compiled.recorder
            self.compiled = compiled
            self.call = compiled
            self.backward = compiled.backward
        else:
            raise PipelineOptionError(
                f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")

    def _recording_inductor(self) -> Callable[..., Any]:
        """``backend="inductor"`` as is, but keeping the forward graph Inductor is given."""
        recorder = self.recorder

        def inner_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                          *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("is_backward", False) and not kwargs.get("is_inference", False):
                recorder.record_forward(gm)
            return _compat.compile_fx_inner()(gm, example_inputs, *args, **kwargs)

        def inductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            # The FX graph cache off: a cache hit would skip inner_compile (kernels stay cached).
            # Patched around the compile, not via compile_fx(config_patches=...): that form
            # re-enters the patch on every call of the compiled function (~0.9 s a step on CPU).
            from torch._inductor import config as inductor_config

            with inductor_config.patch(fx_graph_cache=False):
                return _compat.compile_fx()(gm, example_inputs, inner_compile=inner_compile)

        return inductor

    def saved_bytes(self, inputs: Sequence[torch.Tensor]) -> int | None:
        if self.variant == "eager":
            return eager_saved_bytes(self.step, inputs)
        return self.recorder.saved_bytes


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_variant(variant: str, settings: TrainSettings, progress: bool = True) -> TrainResult:
    """Train ``settings.model`` for ``settings.steps`` SGD steps as ``variant``. The capped
    row whose cap is unreachable comes back as a refusal (``TrainResult.refusal``: the
    message naming the floor), not an error: the other rows still say what they measured."""
    if variant != "aot_pipeline_capped":
        return _train_variant(variant, settings, progress)
    from aot_partition import UnreachableMemoryBudgetError

    try:
        return _train_variant(variant, settings, progress)
    except Exception as error:
        refused = next((e for e in _chain(error)
                        if isinstance(e, UnreachableMemoryBudgetError)), None)
        if refused is None:
            raise
        return TrainResult(variant, [], math.nan, math.nan, None, refusal=str(refused))


def _train_variant(variant: str, settings: TrainSettings, progress: bool) -> TrainResult:
    device = check_device(settings.device)
    if settings.steps < 1:
        raise PipelineOptionError(f"steps must be >= 1, got {settings.steps}")
    torch._dynamo.reset()  # each variant compiles from scratch, with its own back end
    if variant == "inductor" or (variant in ("aot_pipeline", "aot_pipeline_capped")
                                 and settings.compiler == "inductor"):
        _import_cpp_extension_without_cuda_home_notice()
    built = settings.build(device)
    runner = _Runner(variant, built, settings)
    optimizer = torch.optim.SGD(built.module.parameters(), lr=LEARNING_RATE)
    losses: list[float] = []
    times: list[float] = []
    first_inputs: tuple[torch.Tensor, ...] | None = None
    steps = _progress(range(settings.steps), variant, progress)
    for step in steps:
        inputs = built.make_inputs()
        first_inputs = first_inputs or inputs
        if step == 1 and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _synchronize(device)
        start = time.perf_counter()
        loss = runner.call(*inputs)
        runner.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak = (torch.cuda.max_memory_allocated(device)
            if device.type == "cuda" and settings.steps > 1 else None)
    assert first_inputs is not None
    step_peak, predicted = _measure_and_predict_peak(runner, built, device)
    return TrainResult(
        variant=variant, losses=losses, first_step_s=times[0],
        step_s=statistics.median(times[1:]) if len(times) > 1 else times[0],
        saved_bytes=runner.saved_bytes(first_inputs), peak_memory_bytes=peak,
        step_peak_bytes=step_peak, predicted_peak_bytes=predicted,
    )


def _measure_and_predict_peak(runner: _Runner, built: BuiltModel, device: torch.device
                              ) -> tuple[int, int | None]:
    """One more forward+backward (no optimizer step: the losses are already taken), its peak
    above what is allocated before it measured; for aot_pipeline, the peak predicted for it."""
    from aot_partition.memory_models.simulator import measure_peak

    inputs = built.make_inputs()

    def step() -> None:
        runner.backward(runner.call(*inputs))

    built.module.zero_grad(set_to_none=True)
    measured = measure_peak(step, device).peak_bytes
    built.module.zero_grad(set_to_none=True)
    predicted = None
    if runner.compiled is not None and runner.compiled.partitions:
        predicted = runner.compiled.predicted_peak().above_inputs_bytes
    return measured, predicted


class _DropNoCudaRuntimeNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def _import_cpp_extension_without_cuda_home_notice() -> None:
    """Import ``torch.utils.cpp_extension`` as Inductor's C++ build does (it would at the first
    compile), without the one warning it logs at import on a machine with a CUDA toolkit but no
    CUDA device ("No CUDA runtime is found, using CUDA_HOME=..."): once per variant process, it
    said nothing about the run. Only that record is dropped, only during the import."""
    if "torch.utils.cpp_extension" in sys.modules:
        return
    logger = logging.getLogger("torch.utils.cpp_extension")
    notice = _DropNoCudaRuntimeNotice()
    logger.addFilter(notice)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        logger.removeFilter(notice)


def losses_agree(losses: Sequence[float], reference: Sequence[float]) -> bool:
    return len(losses) == len(reference) and all(
        math.isclose(a, b, rel_tol=LOSS_RTOL, abs_tol=LOSS_ATOL) for a, b in zip(losses, reference))


def train_all(settings: TrainSettings, progress: bool = True,
              isolated: bool = False) -> list[TrainResult]:
    """Run every variant in ``settings.variants``; compare each one's losses with eager's.

    ``isolated``: each compiled variant in a fresh process with an empty Inductor cache, so
    its first step (the compile) is timed cold, as the first variant's is: in one process the
    one-time costs (Inductor's imports and caches, the C++ compiler's first runs, kernels
    already built for an earlier variant) land on whichever compiles first, which then looks
    slower. The CLI's ``train`` runs isolated."""
    results = [_train_isolated(variant, settings, progress)
               if isolated and variant != "eager" else train_variant(variant, settings, progress)
               for variant in settings.variants]
    eager = next((r for r in results if r.variant == "eager"), None)
    if eager is not None:
        for result in results:
            if result.refusal is None:
                result.matches_eager = losses_agree(result.losses, eager.losses)
    return results


SHARED_CACHE_VARIABLE = "AOT_PIPELINE_SHARED_INDUCTOR_CACHE"


def shared_inductor_cache() -> bool:
    """Whether ``AOT_PIPELINE_SHARED_INDUCTOR_CACHE=1`` asks the fresh processes of ``train``
    and the benchmarks to keep the caller's Inductor cache instead of an empty one each: their
    compile times are then warm, not cold (the test suite sets it: its tables are checked for
    what they hold, and the C++ compiler's runs of the same kernels are most of its time)."""
    value = os.environ.get(SHARED_CACHE_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise PipelineOptionError(f"{SHARED_CACHE_VARIABLE}={value!r}: use 1 (share the caller's "
                         "Inductor cache) or 0 (an empty cache per process, the default)")
    return value == "1"


def cold_cache_environment(folder: str) -> dict[str, str]:
    """The environment a fresh process compiles in: Inductor's (and Triton's) cache in
    ``folder`` (empty: a cold compile), or nothing changed under ``shared_inductor_cache()``."""
    if shared_inductor_cache():
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": folder, "TRITON_CACHE_DIR": os.path.join(folder, "triton")}


def _train_isolated(variant: str, settings: TrainSettings, progress: bool) -> TrainResult:
    """``train_variant`` in a fresh (spawned) process with its own empty Inductor cache."""
    import multiprocessing
    import tempfile

    with tempfile.TemporaryDirectory(prefix="aot-pipeline-train-") as cache:
        environment = cold_cache_environment(cache)
        context = multiprocessing.get_context("spawn")
        with context.Pool(1, initializer=_set_environment, initargs=(environment,)) as pool:
            outcome = pool.apply(_train_in_child, (variant, settings, progress))
            # The worker exits on its own, not by the terminate() leaving the block does: a
            # killed worker never releases what it registered with the shared resource tracker
            # (Inductor's compile pool), which then warns of "leaked semaphore objects".
            pool.close()
            pool.join()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _set_environment(environment: dict[str, str]) -> None:
    os.environ.update(environment)


def _train_in_child(variant: str, settings: TrainSettings,
                    progress: bool) -> TrainResult | BaseException:
    """The child's work; an error comes back as a value the parent re-raises (as itself when
    it survives pickling, else as a RuntimeError naming it)."""
    import pickle

    def survives(error: BaseException) -> bool:
        try:
            pickle.loads(pickle.dumps(error))
            return True
        except Exception:
            return False

    try:
        return train_variant(variant, settings, progress)
    except Exception as error:
        # Ours first (an unreachable cap inside torch.compile's BackendCompilerFailed): the
        # parent reports it as the single process would.
        for cause in _chain(error):
            if type(cause).__module__.split(".")[0] in _OUR_PACKAGES and survives(cause):
                return cause
        if survives(error):
            return error
        return RuntimeError(f"variant {variant}: {type(error).__name__}: {error}")


_OUR_PACKAGES = frozenset({"aot_config", "aot_partition", "aot_compilers", "compiled_autograd",
                           "aot_pipeline"})


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and what it wraps (causes, contexts, torch.compile's inner exception)."""
    seen: list[BaseException] = []
    stack: list[BaseException | None] = [error]
    while stack:
        current = stack.pop(0)
        if current is None or any(current is e for e in seen):
            continue
        seen.append(current)
        stack += [getattr(current, "inner_exception", None), current.__cause__,
                  current.__context__]
    return seen


def _progress(steps: range, label: str, enabled: bool) -> Any:
    if not enabled:
        return steps
    from tqdm import tqdm

    return tqdm(steps, desc=f"{label:>12}", unit="step", file=sys.stderr, leave=True)
