"""A module that takes another module's place in a model while sharing its parameters, buffers
and submodules under the same names (so the model's state_dict does not change), and gives the
original back with whatever those now hold."""

from __future__ import annotations

import torch


class Adopting(torch.nn.Module):
    """Base of the fused drop-ins: adopts `original`'s direct parameters, buffers and children;
    `restore()` returns `original` holding this module's current ones."""

    def __init__(self, original: torch.nn.Module) -> None:
        super().__init__()
        for name, child in original.named_children():
            self.add_module(name, child)
        for name, param in original.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buf in original.named_buffers(recurse=False):
            self.register_buffer(name, buf,
                                 persistent=name not in original._non_persistent_buffers_set)
        self.__dict__["_original"] = original  # not a submodule: not in state_dict or .modules()

    def restore(self) -> torch.nn.Module:
        """The original module, holding this module's current parameters, buffers, children."""
        original = self._original
        for name in list(original._parameters):
            original._parameters[name] = self._parameters[name]
        for name in list(original._buffers):
            original._buffers[name] = self._buffers[name]
        for name, child in self.named_children():
            original._modules[name] = child
        return original

    def __reduce__(self) -> tuple:
        """Pickle as the original module (saved by its own logic) and swap this in on load."""
        return _adopted, (type(self), self.restore(), self.training)


def _adopted(cls: type, original: torch.nn.Module, training: bool) -> Adopting:
    """Unpickles an Adopting module (see its `__reduce__`)."""
    module = cls(original)
    module.training = training
    return module


def swap_in(blocks: list[torch.nn.Module], attr: str, cls: type, fusable) -> int:
    """Put `cls(module)` at each block's `attr` where `fusable(module)`; returns how many blocks
    now hold a `cls`."""
    swapped = 0
    for block in blocks:
        module = getattr(block, attr, None)
        if module is not None and not isinstance(module, cls) and fusable(module):
            setattr(block, attr, cls(module))
        swapped += isinstance(getattr(block, attr, None), cls)
    return swapped


def swap_out(blocks: list[torch.nn.Module], attr: str, cls: type) -> None:
    """Give each block's `cls` at `attr` back as the module it replaced."""
    for block in blocks:
        module = getattr(block, attr, None)
        if isinstance(module, cls):
            setattr(block, attr, module.restore())
