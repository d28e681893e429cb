"""The split: a token-wise memory spike computed in chunks of tokens.

- ``chunked_loss``: ``torch.ops.aot_partition.linear_cross_entropy``, the LM head and its
  cross-entropy in chunks (the forward keeps no logits; the backward recomputes each chunk).
- ``chunked_mlp``: ``torch.ops.aot_partition.token_mlp``, a token-wise MLP in chunks.
- ``token_split``: recognising the spike in a traced graph (a projection followed by its loss,
  a token-wise MLP) and rewriting it into the chunked ops.

The chunked ops are leaves (custom ops a compiler sees as one call); the joint's front end
classifies them (``fx.classify``) and the memory models count their scratch.
"""

from .. import _fx_extra  # noqa: F401 - first: without torch, an error naming the extra
