"""The user's own model for the command line: a factory, a transformers / torchvision / timm
architecture built from a config with random weights, or a saved ``torch.export`` program.

Each source becomes a ``ModelSpec``: plain data the CLI fills from its arguments (so it can be
printed and written to JSON), whose ``build(device)`` gives the ``BuiltModel`` every command
runs. Nothing is downloaded: transformers models come from ``AutoConfig.for_model`` and
``from_config``, torchvision and timm ones with ``weights=None`` / ``pretrained=False``.

Every failure (a module that does not import, a factory that raises or returns the wrong thing,
an unknown architecture, an unreadable ``.pt2``) is one ``UserModelError`` naming the source and
what would be valid.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .exported_archive import ExportedArchiveError, check_archive_sizes
from .models import BuiltModel, build_model
from .options import PipelineOptionError

__all__ = [
    "ModelSpec",
    "UserModelError",
    "load_factory",
    "parse_input_specs",
]

SOURCES = ("builtin", "factory", "hf", "torchvision", "timm", "exported")
# Inputs for the architectures built by name (the shapes a small config accepts).
HF_BATCH, HF_SEQ = 2, 16
VISION_BATCH = 2
_DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
    "bool")} | {"float": torch.float32, "long": torch.int64, "int": torch.int32,
                "half": torch.float16, "double": torch.float64}
# An example input's bytes at most: the commands trace and train on it (CPU by default); a
# larger one is a typo far more often than a plan, and is refused before it is allocated.
MAX_INPUT_BYTES = 256 << 20


class UserModelError(PipelineOptionError):
    """The user's model could not be built; the message names the source."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a command's model comes from.

    ``source``: ``builtin`` (``name`` in the built-in models, ``layers``), ``factory``
    (``name`` = ``package.module:function`` or ``path/to/file.py:function``), ``hf``
    (``name`` = a ``transformers.AutoConfig.for_model`` model type, ``config`` its overrides),
    ``torchvision`` / ``timm`` (``name`` an architecture, ``config`` constructor arguments) or
    ``exported`` (``name`` the path of a ``torch.export.save``d program). ``inputs``: input
    specs such as ``2x128:int64`` for a factory that returns only a module, or to replace an
    architecture's default inputs. ``config_flag``: the option the config was given with
    (``--hf-config`` or ``--model-config``), named in errors; by default the one the source
    documents.
    """

    source: str = "builtin"
    name: str = "gpt"
    layers: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    config_flag: str | None = None

    @property
    def config_option(self) -> str:
        """The config's option as the user wrote it, for error messages."""
        return self.config_flag or ("--hf-config" if self.source == "hf" else "--model-config")

    @property
    def label(self) -> str:
        if self.source == "builtin":
            sizes = [f"{self.layers} layers"] if self.layers else []
            sizes += [f"{key} {value}" for key, value in self.config.items()]
            return f"{self.name} ({', '.join(sizes)})" if sizes else self.name
        if self.source == "factory":
            return self.name
        return f"{self.source}:{self.name}"

    def build(self, device: str | torch.device = "cpu", seed: int = 0) -> BuiltModel:
        """The module and its inputs; weights drawn under ``torch.manual_seed(seed)``, so every
        call gives the same model."""
        if self.source == "builtin":
            return build_model(self.name, layers=self.layers, device=device, seed=seed,
                               **dict(self.config))
        if self.source not in SOURCES:
            raise UserModelError(f"unknown model source {self.source!r}; choose one of "
                                 f"{', '.join(SOURCES)}")
        torch.manual_seed(seed)
        builder = {"factory": _from_factory, "hf": _from_transformers,
                   "torchvision": _from_torchvision, "timm": _from_timm,
                   "exported": _from_exported}[self.source]
        module, inputs = builder(self)
        if self.inputs:
            example, inputs = inputs, parse_input_specs(self.inputs, seed=seed)
            _check_inputs_fit(self, module, example, inputs)
        if not inputs:
            raise UserModelError(f"{self.label} gave no example inputs; pass their shapes with "
                                 "--input, e.g. --input 2x128:int64")
        module = module.to(device)
        placed = tuple(t.to(device) for t in inputs)
        return BuiltModel(self.label, module, lambda: placed)


# ---- factories ----------------------------------------------------------------------------

def load_factory(target: str) -> Callable[[], Any]:
    """The callable named by ``package.module:function`` or ``path/to/file.py:function``."""
    module_name, sep, attribute = target.rpartition(":")
    if not sep or not module_name or not attribute.isidentifier():
        raise UserModelError(f"--model {target!r}: give a built-in model name or "
                             "'package.module:factory' (or 'path/to/file.py:factory')")
    try:
        if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
            path = Path(module_name)
            if not path.is_file():
                raise UserModelError(f"--model {target!r}: no file {module_name!r}")
            spec = importlib.util.spec_from_file_location(f"_aot_user_model_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise UserModelError(f"--model {target!r}: {module_name!r} is not a Python file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except UserModelError:
        raise
    except SystemExit as error:  # a script's argparse or exit() at import: not our success
        raise UserModelError(f"--model {target!r}: importing {module_name!r} called "
                             f"sys.exit({error.code!r}); a model file must not exit when "
                             "imported (guard its script part with "
                             "if __name__ == '__main__')") from None
    except Exception as error:
        raise UserModelError(f"--model {target!r}: importing {module_name!r} failed: "
                             f"{type(error).__name__}: {_short(error)}") from error
    factory = getattr(module, attribute, None)
    if factory is None:
        raise UserModelError(f"--model {target!r}: {module_name!r} has no attribute "
                             f"{attribute!r}")
    if not callable(factory):
        raise UserModelError(f"--model {target!r}: {attribute!r} is {_describe(factory)}, not "
                             "a callable factory")
    return factory


def _from_factory(spec: ModelSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    factory = load_factory(spec.name)
    _check_factory_config(spec, factory)
    try:
        made = factory(**dict(spec.config))
    except SystemExit as error:
        raise UserModelError(f"--model {spec.name!r}: the factory called "
                             f"sys.exit({error.code!r})") from None
    except Exception as error:
        # The config given is the likely culprit: named with the factory.
        given = f" with {spec.config_option} {_config_text(spec.config)}" if spec.config else ""
        raise UserModelError(f"--model {spec.name!r}{given}: the factory raised "
                             f"{type(error).__name__}: {_short(error)}") from error
    expected = ("it must return an nn.Module, or (module, inputs) with inputs a tensor or a "
                "tuple of tensors")
    if isinstance(made, nn.Module):
        return made, ()
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        module, inputs = made
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if isinstance(inputs, (tuple, list)) and all(isinstance(t, torch.Tensor)
                                                     for t in inputs):
            return module, tuple(inputs)
        raise UserModelError(f"--model {spec.name!r}: the factory's inputs are "
                             f"{_describe(inputs)}; {expected}")
    raise UserModelError(f"--model {spec.name!r}: the factory returned {_describe(made)}; "
                         f"{expected}")


def _check_factory_config(spec: ModelSpec, factory: Callable[..., Any]) -> None:
    """Each config key is a parameter of the factory (unless it takes ``**kwargs``), and a
    negative int is refused where the parameter's default is a non-negative int (a count or a
    size): named by key, before the factory runs into it."""
    import difflib
    import inspect

    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: nothing to read
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    named = [name for name, p in parameters.items()
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    for key, value in dict(spec.config).items():
        parameter = parameters.get(key)
        if parameter is None or parameter.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY):
            if takes_any:
                continue
            close = difflib.get_close_matches(key, named, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserModelError(
                f"{spec.config_option} {key}={value!r}: the factory {spec.name!r} has no "
                f"parameter {key!r}{hint}; it takes {', '.join(named) or 'none'}")
        default = parameter.default
        if (isinstance(value, int) and not isinstance(value, bool) and value < 0
                and isinstance(default, int) and not isinstance(default, bool) and default >= 0):
            raise UserModelError(f"{spec.config_option} {key}={value}: must be >= 0 (a count or "
                                 f"size; the factory's default is {default})")


def _config_text(config: Mapping[str, Any]) -> str:
    return ",".join(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
                    for key, value in config.items())


# ---- architectures by name ----------------------------------------------------------------

class _TensorOutput(nn.Module):
    """A library model whose output is a dict-like or tuple: its first tensor (the logits or
    the last hidden state), which the commands' loss reduces."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        out = self.model(*inputs)
        if isinstance(out, torch.Tensor):
            return out
        items = out.values() if isinstance(out, Mapping) else out
        for item in items:
            if isinstance(item, torch.Tensor):
                return item
        raise TypeError(f"{type(self.model).__name__} returned no tensor")


def _optional(package: str, flag: str) -> Any:
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise UserModelError(f"{flag} needs the {package!r} package ({error}); install it, "
                             f"e.g. pip install {package}") from error


def _from_transformers(spec: ModelSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    transformers = _optional("transformers", "--hf")
    try:
        defaults = transformers.AutoConfig.for_model(spec.name)
    except Exception as error:  # an unknown type (ValueError), or the hub's own errors
        raise UserModelError(f"--hf {spec.name!r}: {_short(error)}") from error
    _check_hf_config(spec, defaults)
    try:
        config = transformers.AutoConfig.for_model(spec.name, **dict(spec.config))
    except Exception as error:  # a value the config refuses (a str for an int, ...)
        raise UserModelError(f"--hf {spec.name!r}: bad {spec.config_option}: "
                             f"{type(error).__name__}: {_short(error)}") from error
    # The first auto class that maps this config (a causal LM's head, else a classifier's, else
    # the bare model); a config it maps but cannot build is the user's error, said as such.
    autos = [getattr(transformers, name) for name in
             ("AutoModelForCausalLM", "AutoModelForImageClassification", "AutoModel")]
    auto = next((a for a in autos if type(config) in a._model_mapping), None)
    if auto is None:
        raise UserModelError(f"--hf {spec.name!r}: transformers has no model class for it")
    try:
        model = auto.from_config(config)
    except Exception as error:
        heads = _heads_mismatch(spec, config)
        if heads is not None:  # said in the keys the user gave, not transformers' internals
            raise UserModelError(heads) from error
        raise UserModelError(f"--hf {spec.name!r}: building the model failed: "
                             f"{type(error).__name__}: {_short(error)}") from error
    model.train()
    if getattr(config, "image_size", None) and getattr(config, "num_channels", None):
        size = config.image_size
        inputs: tuple[torch.Tensor, ...] = (
            torch.randn(VISION_BATCH, config.num_channels, size, size),)
    else:
        vocab = getattr(config, "vocab_size", None) or 2
        inputs = (torch.randint(0, vocab, (HF_BATCH, HF_SEQ)),)
    return _TensorOutput(model), inputs


def _heads_mismatch(spec: ModelSpec, config: Any) -> str | None:
    """The message for a width the attention heads do not divide (transformers says it in its
    own names, "`embed_dim` must be divisible by num_heads"), in the keys the user gave
    (``n_embd``, ``n_head`` for GPT-2: the config's ``attribute_map`` aliases); None when that
    is not the problem or the user gave neither key."""
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0
            and hidden % heads):
        return None
    aliases = getattr(config, "attribute_map", {}) or {}

    def key_of(canonical: str) -> tuple[str, bool]:
        """The key the user gave for ``canonical``, else the config's own name for it."""
        real = aliases.get(canonical, canonical)
        given = next((key for key in spec.config if key in (canonical, real)), None)
        return (given, True) if given is not None else (real, False)

    (hidden_key, hidden_given), (heads_key, heads_given) = key_of("hidden_size"), key_of(
        "num_attention_heads")
    if not (hidden_given or heads_given):
        return None
    given = ",".join(f"{key}={spec.config[key]}" for key in (hidden_key, heads_key)
                     if key in spec.config)
    default = "" if heads_given else ", its default"
    fit = -(-hidden // heads) * heads
    return (f"{spec.config_option} {given}: {hidden_key} ({hidden}) must be divisible by "
            f"{heads_key} ({heads}{default}): each attention head takes an equal share of the "
            f"width; e.g. {hidden_key}={fit}")


def _check_hf_config(spec: ModelSpec, defaults: Any) -> None:
    """Each --hf-config key is one of the config's fields (transformers keeps unknown keys as
    extra attributes: a typo would be ignored), and a count or size is not negative."""
    import difflib

    known = set(defaults.to_dict())
    for key, value in dict(spec.config).items():
        if key not in known and not hasattr(defaults, key):
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserModelError(f"{spec.config_option} {key}={value!r}: "
                                 f"{type(defaults).__name__} has no field {key!r}{hint}")
        default = getattr(defaults, key, None)
        if (isinstance(value, int) and not isinstance(value, bool) and value < 0
                and isinstance(default, int) and not isinstance(default, bool) and default >= 0):
            raise UserModelError(f"{spec.config_option} {key}={value}: must be >= 0 (a count "
                                 f"or size; the default is {default})")


def _constructed(flag: str, spec: ModelSpec, build: Callable[[], Any]) -> Any:
    """``build()``, whose failure (a bad constructor argument) is the user's, said as such."""
    try:
        return build()
    except Exception as error:
        raise UserModelError(f"{flag} {spec.name!r}: {type(error).__name__}: "
                             f"{_short(error)}") from error


def _from_torchvision(spec: ModelSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    _optional("torchvision", "--torchvision")
    from torchvision import models

    if spec.name not in models.list_models():
        raise UserModelError(f"--torchvision {spec.name!r} is not a torchvision model; e.g. "
                             "resnet18, mobilenet_v3_small, efficientnet_b0, vit_b_16")
    model = _constructed("--torchvision", spec, lambda: models.get_model(
        spec.name, weights=None, **dict(spec.config)))
    size = getattr(model, "image_size", 64)
    return _TensorOutput(model), (torch.randn(VISION_BATCH, 3, size, size),)


def _from_timm(spec: ModelSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    timm = _optional("timm", "--timm")
    if not timm.list_models(spec.name):
        raise UserModelError(f"--timm {spec.name!r} is not a timm model; e.g. resnet18, "
                             "vit_tiny_patch16_224")
    model = _constructed("--timm", spec, lambda: timm.create_model(
        spec.name, pretrained=False, **dict(spec.config)))
    channels, height, width = model.pretrained_cfg.get("input_size", (3, 64, 64))
    if "img_size" in spec.config:
        height = width = int(spec.config["img_size"])
    return _TensorOutput(model), (torch.randn(VISION_BATCH, channels, height, width),)


# ---- exported programs --------------------------------------------------------------------

def _from_exported(spec: ModelSpec) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A ``torch.export`` program as a trainable module: its parameters require grad, as the
    model's did, so the joint graph has a backward."""
    import zipfile

    path = Path(spec.name)
    if not path.exists():
        raise UserModelError(f"--exported {spec.name!r}: no such file")
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file (a pipe or a device)"
        raise UserModelError(f"--exported {spec.name!r} is {kind}; give a .pt2 file that "
                             "torch.export.save wrote")
    if not zipfile.is_zipfile(path):  # before torch, which logs a traceback for it
        raise UserModelError(f"--exported {spec.name!r} is not a saved torch.export program "
                             "(torch.export.save writes a .pt2 zip archive)")
    try:
        check_archive_sizes(spec.name)
    except ExportedArchiveError as error:
        raise UserModelError(str(error)) from None
    try:
        with _quiet_torch_export_logs():  # torch logs a traceback before raising; ours is one line
            program = torch.export.load(str(path))
    except Exception as error:
        raise UserModelError(f"--exported {spec.name!r} is not a saved torch.export program "
                             f"(torch.export.save): {type(error).__name__}: "
                             f"{_short(error)}") from error
    module = program.module()
    for parameter in module.parameters():
        parameter.requires_grad_(parameter.is_floating_point())
    args, kwargs = program.example_inputs or ((), {})
    if kwargs:
        raise UserModelError(f"--exported {spec.name!r}: keyword example inputs "
                             f"({', '.join(kwargs)}) are not supported; export with "
                             "positional inputs")
    return module, tuple(t for t in args if isinstance(t, torch.Tensor))


def _check_inputs_fit(spec: ModelSpec, module: nn.Module, example: tuple[torch.Tensor, ...],
                      given: tuple[torch.Tensor, ...]) -> None:
    """--input must fit the model (its shapes and dtypes; an exported program's guards): one
    eager forward under no_grad tells, before Dynamo would explain a misfit in fake-tensor
    terms. A misfit names --input, the model and its example inputs. The forward leaves no
    trace: buffers (batch-norm statistics) and the random state are put back."""
    buffers = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            module(*given)
    except Exception as error:
        shapes = ", ".join(_shape_text(t) for t in example)
        what = f"its example inputs: {shapes}" if shapes else "it gave no example inputs"
        typed = " ".join(f"--input {text!r}" for text in spec.inputs)
        raise UserModelError(f"{typed} does not fit {_source_words(spec)} ({what}): "
                             f"{type(error).__name__}: {_short(error)}") from error
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)


def _shape_text(tensor: torch.Tensor) -> str:
    return "x".join(map(str, tensor.shape)) + f":{str(tensor.dtype).removeprefix('torch.')}"


def _source_words(spec: ModelSpec) -> str:
    """The model as the user named it on the command line."""
    flag = {"factory": "--model", "exported": "--exported"}.get(spec.source, f"--{spec.source}")
    return f"{flag} {spec.name!r}"


@contextlib.contextmanager
def _quiet_torch_export_logs() -> Iterator[None]:
    import logging

    loggers = [logging.getLogger(name) for name in ("torch.export", "torch._export")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


# ---- text arguments -----------------------------------------------------------------------

# Dimensions may carry a minus sign here only to be refused by name ("-1x4").
_SHAPE = re.compile(r"^(-?\d+(?:x-?\d+)*)(?::([a-z0-9]+))?(?::(\d+))?$")


def parse_input_specs(specs: Sequence[str], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Example inputs from specs such as ``2x128:int64:50257`` (shape, dtype (default
    float32), and for integer dtypes the exclusive upper bound of the values, default 2)."""
    generator = torch.Generator().manual_seed(seed + 1)
    tensors = []
    for text in specs:
        match = _SHAPE.match(text.strip().lower())
        if match is None:
            raise UserModelError(f"--input {text!r}: give a shape such as 2x128, optionally a "
                                 "dtype and, for integers, an upper bound: 2x128:int64:50257")
        dims, high = match.group(1).split("x"), match.group(3)
        too_long = [d for d in [*dims, high or ""] if len(d) > _MAX_DIGITS]
        if too_long:
            raise UserModelError(f"--input {_short_text(text)}: a number of {len(too_long[0])} "
                                 f"digits (at most {_MAX_DIGITS})")
        shape = [int(d) for d in dims]
        bad = next((d for d in shape if d < 1), None)
        if bad is not None:
            what = "is negative" if bad < 0 else "makes an empty tensor"
            raise UserModelError(f"--input {_short_text(text)}: dimension {bad} {what}; every "
                                 "dimension must be at least 1, e.g. 2x128")
        dtype_name = match.group(2) or "float32"
        dtype = _DTYPES.get(dtype_name)
        if dtype is None:
            raise UserModelError(f"--input {text!r}: unknown dtype {dtype_name!r}; choose one of "
                                 f"{', '.join(sorted(_DTYPES))}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > MAX_INPUT_BYTES:  # before allocating it
            raise UserModelError(
                f"--input {_short_text(text)}: {math.prod(shape)} {dtype_name} elements take "
                f"{nbytes} bytes, over the {MAX_INPUT_BYTES} ({MAX_INPUT_BYTES >> 20} MiB) an "
                "example input may; give a smaller shape")
        if dtype.is_floating_point:
            if high is not None:
                raise UserModelError(f"--input {text!r}: an upper bound is for integer dtypes")
            tensors.append(torch.randn(shape, generator=generator).to(dtype))
        elif dtype == torch.bool:
            tensors.append(torch.randint(0, 2, shape, generator=generator).bool())
        else:
            bound = int(high) if high is not None else 2
            if bound < 1:
                raise UserModelError(f"--input {text!r}: the upper bound must be >= 1")
            largest = torch.iinfo(dtype).max + 1
            if bound > largest:
                raise UserModelError(f"--input {text!r}: the upper bound {bound} is beyond "
                                     f"{dtype_name} (at most {largest})")
            tensors.append(torch.randint(0, bound, shape, generator=generator, dtype=dtype))
    return tuple(tensors)


# Digits of an --input number: a dimension of 10**12 elements is already refused by size.
_MAX_DIGITS = 12


def _short_text(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")


def _describe(value: Any) -> str:
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ for v in value[:4])
        return f"{article} {name} of ({inner}{', ...' if len(value) > 4 else ''})"
    return f"{article} {name}"


def _short(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text if len(text) <= limit else text[:limit] + "..."
