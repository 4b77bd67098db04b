r"""A Pyro optimizer that steps every parameter with one fused PyTorch optimizer.

``pyro.optim.PyroOptim`` builds one PyTorch optimizer per parameter and steps them one by one,
so a step of an encoder with P parameter tensors makes P optimizer calls of the single-tensor
kernel. :class:`FusedPyroOptim` keeps one PyTorch optimizer whose parameter list grows as new
Pyro params appear, so a step is one call of the multi-tensor (``foreach``) kernel. The update
rule is the optimizer's own (e.g. Adam's); only the bookkeeping differs.
"""

from __future__ import annotations

from typing import Any

import pyro
import torch
from pyro.optim import PyroOptim

__all__ = ["FusedAdam", "FusedPyroOptim"]


class FusedPyroOptim(PyroOptim):
    r"""A :class:`pyro.optim.PyroOptim` backed by a single PyTorch optimizer.

    Use it wherever Pyro takes an optimizer, e.g. ``SVI(model, guide, FusedAdam({"lr": 1e-3}),
    RPMELBO())``. Per-parameter arguments (a callable ``optim_args``) are not supported: every
    parameter shares ``optim_args``.

    :param optim_constructor: a ``torch.optim.Optimizer`` class, e.g. ``torch.optim.Adam``.
    :param dict optim_args: its keyword arguments.
    """

    def __init__(self, optim_constructor: type[torch.optim.Optimizer], optim_args: dict[str, Any]):
        if not isinstance(optim_args, dict):
            raise TypeError(
                "FusedPyroOptim takes one dict of optimizer arguments shared by every parameter, "
                f"got {type(optim_args).__name__}; use pyro.optim.PyroOptim for per-parameter "
                "arguments"
            )
        super().__init__(optim_constructor, optim_args)
        self.optimizer: torch.optim.Optimizer | None = None
        self._seen: set = set()

    def __call__(self, params, *args, **kwargs) -> None:
        """One optimizer step over ``params``; parameters seen for the first time are added."""
        new = [p for p in params if p not in self._seen]
        if new:
            if self.optimizer is None:
                self.optimizer = self.pt_optim_constructor(new, **self.pt_optim_args)
            else:
                self.optimizer.add_param_group({"params": new})
            self._seen.update(new)
            self._load_waiting_state()
        if self.optimizer is not None:
            self.optimizer.step(*args, **kwargs)

    def _load_waiting_state(self) -> None:
        state = self._state_waiting_to_be_consumed.get("fused")
        if state is None or self.optimizer is None:
            return
        names = [pyro.get_param_store().param_name(p) for g in self.optimizer.param_groups
                 for p in g["params"]]
        if names == state["param_names"]:
            self.optimizer.load_state_dict(state["optimizer"])
            self._state_waiting_to_be_consumed.pop("fused")

    def get_state(self) -> dict:
        """The optimizer's state dict together with the Pyro names of its parameters."""
        if self.optimizer is None:
            return {}
        names = [pyro.get_param_store().param_name(p) for g in self.optimizer.param_groups
                 for p in g["params"]]
        return {"fused": {"optimizer": self.optimizer.state_dict(), "param_names": names}}

    def set_state(self, state_dict: dict) -> None:
        """Restores a state from :meth:`get_state` (applied once the same params are seen)."""
        self._state_waiting_to_be_consumed.update(state_dict)
        self._load_waiting_state()


def FusedAdam(optim_args: dict[str, Any]) -> FusedPyroOptim:
    """Adam for every Pyro param in one fused step: ``FusedPyroOptim(torch.optim.Adam, args)``."""
    return FusedPyroOptim(torch.optim.Adam, optim_args)
