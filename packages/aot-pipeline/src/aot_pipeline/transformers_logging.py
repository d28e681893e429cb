"""One transformers logging call Dynamo cannot trace, made a no-op so a step stays one graph.

transformers' ``PreTrainedModel.loss_function`` calls ``logger.warning_once(...)`` (its
``transformers.modeling_utils`` logger) on every call when the model's ``loss_type`` is None:
the class name contains no ``LOSS_MAPPING`` key (``GPT2LMHeadModel``; ``LlamaForCausalLM``
contains "ForCausalLM"). Dynamo graph-breaks on a ``logging.Logger`` method ("logging.Logger
method not supported for non-export cases"), so ``model(input_ids=ids, labels=labels).loss``
became two graphs, the LM head in the first and its loss in the second, and the split could not
reach the loss. Dynamo's documented remedy (its hint for that break) is
``torch._dynamo.config.ignore_logging_functions``; we add that one logger's ``warning_once``
(not ``logging.Logger.warning_once``, which would silence every transformers logger). Only the
message is lost, and only inside compiled code: ``warning_once`` prints nothing else, and the
default loss it announces is the one used either way.

The set is Dynamo's global config: added once per process, before Dynamo traces (at the
registered name's lookup and in ``make_backend``), when transformers' ``modeling_utils`` is
imported by then (a model must exist to be compiled, so it is). Remove it from the set to get
the graph break back.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger(__name__)

LOGGER_NAME = "transformers.modeling_utils"


def loss_warning() -> Any:
    """The bound ``warning_once`` of transformers' ``modeling_utils`` logger; None when
    transformers' modeling code is not imported (or defines no ``warning_once``)."""
    if LOGGER_NAME not in sys.modules:
        return None  # importing transformers ourselves would cost seconds for nothing
    return getattr(logging.getLogger(LOGGER_NAME), "warning_once", None)


def ignore_loss_warning_in_dynamo() -> bool:
    """Add ``loss_warning()`` to ``torch._dynamo.config.ignore_logging_functions``; True when
    added now (logged once), False when absent or already there."""
    method = loss_warning()
    if method is None:
        return False
    import torch._dynamo

    ignored = torch._dynamo.config.ignore_logging_functions
    if method in ignored:  # bound methods of one logger compare equal
        return False
    ignored.add(method)
    log.info("transformers' %s logger.warning_once is a no-op inside compiled code "
             "(torch._dynamo.config.ignore_logging_functions): PreTrainedModel.loss_function "
             "calls it every step when loss_type is None (GPT-2), a graph break between the "
             "LM head and its loss", LOGGER_NAME)
    return True
