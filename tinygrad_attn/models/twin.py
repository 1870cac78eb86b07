"""What every model family offers for leaving the engine with its weights: a torch twin."""

from __future__ import annotations


class TorchTwin:
    """``to_torch`` and ``from_torch`` for a model class (``tinygrad_attn.export.torch`` does the
    work; it is imported only when called, since it imports PyTorch)."""

    def to_torch(self, dtype=None):
        """The same network as a ``torch.nn.Module`` of torch's own layers, with this model's
        parameter names and weights, in this model's dtype unless ``dtype`` (a torch dtype,
        e.g. ``torch.float32``) is given, whose ``forward(src, tgt_in)`` returns these logits:
        ``tinygrad_attn.export.torch.to_torch``.

        Example:
            >>> twin = model.to_torch()                   # e.g. for DistributedDataParallel
        """
        from ..export.torch import to_torch

        return to_torch(self, dtype)

    @classmethod
    def from_torch(cls, module):
        """The engine model of what ``to_torch`` made (trained or not, or a
        DistributedDataParallel around it), weights, dtype and mode included."""
        from ..export.torch import from_torch

        return from_torch(module, cls)
