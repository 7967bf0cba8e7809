"""Where a watched script meets torch: the patches of torch's entry points that every DDP script
calls anyway, each calling the script's own call unchanged and telling a
:class:`~ddp_engine.rank.script_watch.ScriptWatch` what happened.

Fail-safe: the watch's part of every patch runs inside a :class:`Guard`. An exception there
(a bug of ours, an object we did not expect) is logged once with its traceback, said to the
viewers, and turns that part of the watch off; the script's own call goes on as under plain
torchrun. Only :class:`~ddp_engine.rank.script_stop.ScriptStopped` (a SystemExit, raised on
purpose at an agreed stop) passes through.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.optim.optimizer as optim_hooks
from torch._dynamo.eval_frame import OptimizedModule
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from ddp_engine.common.lifeline import signal_name
from ddp_engine.rank.script_step_ends import shadow_step

if TYPE_CHECKING:
    from ddp_engine.rank.script_watch import ScriptWatch

log = logging.getLogger("ddp_engine.rank.script_patches")

PARTS = {
    "steps": "steps, the agreed stop and the reports",
    "loss": "the loss",
    "forward": "samples/s, data wait and forward time",
    "sync": "gradient sync timing",
    "epoch": "the epoch",
    "start": "the run's start (side group, devices)",
    "end": "the last report",
    "signals": "the script's own signal handlers",
}
"""The parts of the watch a failure turns off, and what each watches (as the dashboard says)."""


def first_batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The first dimension of the first tensor among a forward's arguments (a step or two
    into lists, tuples and dicts), or None."""
    todo: list[Any] = [*args, *kwargs.values()]
    for _ in range(64):
        if not todo:
            return None
        item = todo.pop(0)
        if isinstance(item, torch.Tensor):
            return int(item.shape[0]) if item.dim() > 0 else None
        if isinstance(item, list | tuple):
            todo[:0] = list(item)[:8]
        elif isinstance(item, dict):
            todo[:0] = list(item.values())[:8]
    return None


def compiling() -> bool:
    """Inside torch.compile's tracing: our hooks do nothing there (no graph break)."""
    return bool(torch.compiler.is_compiling())


class Guard:
    """Runs the watch's part of a patch; an exception turns that part off (once, said)."""

    def __init__(self, failed: Callable[[str, BaseException], None]) -> None:
        self.off: dict[str, str] = {}
        """Parts turned off, with why (``Type: message``)."""
        self._failed = failed

    def run(self, part: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, or None when ``part`` is off or it raised (an Exception:
        a SystemExit such as ScriptStopped passes)."""
        if part in self.off:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            self.off[part] = f"{type(e).__name__}: {e}"
            log.exception("Rankscope's watch of %s failed and is turned off; the script goes "
                          "on unwatched there", PARTS.get(part, part))
            self._failed(part, e)
            return None


class TorchPatches:
    """The patches (see the module docstring); :meth:`uninstall` undoes every one."""

    def __init__(self, watch: ScriptWatch, guard: Guard) -> None:
        self.watch = watch
        self.guard = guard
        self._undo: list[Callable[[], None]] = []
        self.kept_groups: list[Any] = []
        """The process group of every DDP module the script built, held until the rank lets
        it go (:meth:`release_groups`). Else the script's DDP module holds its group's last
        reference, and freeing the module (its Reducer, as the script's ``main`` returns)
        destroys the group with the GIL held: a gloo worker thread still freeing its last
        backward's all-reduce (whose thread-local state holds a Python object) waits for the
        GIL while the destructor waits for that thread, and the rank hangs for good (torch
        2.13; about one script run in four did on 2 CPU ranks)."""

    def install(self) -> None:
        w, g = self.watch, self.guard
        self._patch(c10d, "init_process_group", self._init)
        self._patch(dist, "init_process_group", self._init)
        self._patch(c10d, "destroy_process_group", self._destroy)
        self._patch(dist, "destroy_process_group", self._destroy)
        self._patch(torch.autograd, "backward", self._backward)
        self._patch(DDP, "__init__", self._ddp_init)
        self._patch(OptimizedModule, "__init__", self._compiled_init)
        self._patch(DDP, "register_comm_hook", self._register_hook)
        self._patch(DDP, "_register_builtin_comm_hook", self._builtin_hook)
        self._patch(torch.amp.GradScaler, "scale", self._scale)
        self._patch(torch.amp.GradScaler, "step", self._scaler_step)
        self._patch(DistributedSampler, "set_epoch", self._set_epoch)
        self._patch(signal, "signal", self._signal)
        self._patch(Join, "__init__", self._join)
        pre = optim_hooks.register_optimizer_step_pre_hook(
            lambda opt, a, k: g.run("steps", w.before_opt_step, opt))
        post = optim_hooks.register_optimizer_step_post_hook(
            lambda opt, a, k: g.run("steps", w.after_opt_step, opt))
        self._undo += [pre.remove, post.remove]

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo = []

    def release_groups(self) -> None:
        """Let the kept process groups go, once the script's modules are gone: a group freed
        from Python is destroyed with the GIL released (see :attr:`kept_groups`)."""
        self.kept_groups = []

    def _patch(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Any]) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, wrap(original))
        self._undo.append(lambda: setattr(owner, name, original))

    # -------------------------------------------------------------------- the wrappers
    def _init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            self.guard.run("start", self.watch.joined, kwargs.get("timeout"))
            return out
        return init_process_group

    def _destroy(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def destroy_process_group(group: Any = None) -> Any:
            if group is None or group is c10d.GroupMember.WORLD:
                self.guard.run("end", self.watch.finish)  # no collective: see finish()
                if not dist.is_initialized():
                    return None  # gone already (the watch ended it at an agreed stop)
            return original(group)
        return destroy_process_group

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            token = self.guard.run("loss", self.watch.before_backward, tensors)
            try:
                return original(tensors, *args, **kwargs)
            finally:
                if token is not None:
                    self.guard.run("loss", self.watch.after_backward, token)
        return backward

    def _scale(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def scale(scaler: Any, outputs: Any) -> Any:
            out = original(scaler, outputs)
            self.guard.run("loss", self.watch.scaled, outputs, out)
            return out
        return scale

    def _scaler_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            self.guard.run("steps", self.watch.scaler_step_begins, optimizer)
            out = original(scaler, optimizer, *args, **kwargs)
            self.guard.run("steps", self.watch.scaler_step_ended, optimizer)
            return out
        return step

    def _set_epoch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def set_epoch(sampler: Any, epoch: int) -> None:
            original(sampler, epoch)
            self.guard.run("epoch", self.watch.epoch_set, epoch)
        return set_epoch

    def _ddp_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # Positional-only: Lightning and Fabric call DistributedDataParallel(module=model).
        def __init__(ddp: DDP, /, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original(ddp, *args, **kwargs)
            self.kept_groups.append(getattr(ddp, "process_group", None))
            self.guard.run("forward", self.watch.adopt, ddp)
        return __init__

    def _compiled_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # torch.compile(DDP(model)): the watch's forward hooks go on the compiled wrapper,
        # whose hooks run outside dynamo: none of ours is traced (no graph break of ours).
        def __init__(opt: OptimizedModule, mod: torch.nn.Module, *args: Any,  # noqa: N807
                     **kwargs: Any) -> None:
            original(opt, mod, *args, **kwargs)
            if isinstance(mod, DDP):
                self.guard.run("forward", self.watch.compiled, opt, mod)
        return __init__

    def _register_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def register_comm_hook(ddp: DDP, state: object, hook: Callable[..., Any]) -> None:
            timed = self.guard.run("sync", self.watch.script_hook, ddp, hook)
            original(ddp, state, timed if timed is not None else hook)
        return register_comm_hook

    def _builtin_hook(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def _register_builtin_comm_hook(ddp: DDP, comm_hook_type: Any) -> None:
            self.guard.run("sync", self.watch.builtin_hook, ddp, comm_hook_type)
            original(ddp, comm_hook_type)
        return _register_builtin_comm_hook

    def _join(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(join: Join, joinables: list[Any], *args: Any, **kwargs: Any) -> None:  # noqa: N807
            if joinables and "steps" not in self.guard.off:  # last: DDP stays the first
                joinables = [*joinables, _StepsJoinable(self.watch, self.guard, joinables[0])]
            original(join, joinables, *args, **kwargs)
        return __init__

    def _signal(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def signal_(signalnum: Any, handler: Any) -> Any:
            chained = self.guard.run("signals", self.watch.script_signal_handler,
                                     int(signalnum), handler)
            return original(signalnum, chained if chained is not None else handler)
        return signal_


def chain(ours: Callable[[int, Any], Any], theirs: Any, signum: int) -> Callable[[int, Any], Any]:
    """A handler that runs ``ours`` (the stop request), then the script's own ``theirs``."""

    def chained(sig: int, frame: Any) -> Any:
        ours(sig, frame)
        return theirs(sig, frame) if callable(theirs) else None

    chained.__name__ = f"rankscope_then_{getattr(theirs, '__name__', signal_name(signum))}"
    return chained


class _StepsJoinable(Joinable):
    """DDP's Join (uneven inputs): a rank out of data shadows the others' collectives in
    ``Join.__exit__``, once per iteration of theirs; this joinable shadows the watch's steps
    there, so its agreed-stop rounds meet theirs (one optimizer step per forward, as usual)."""

    def __init__(self, watch: ScriptWatch, guard: Guard, first: Any) -> None:
        super().__init__()
        self._watch, self._guard = watch, guard
        self._device = first.join_device
        self._group = first.join_process_group

    def join_hook(self, **kwargs: Any) -> JoinHook:
        watch, guard = self._watch, self._guard

        class Shadow(JoinHook):
            def main_hook(self) -> None:
                guard.run("steps", shadow_step, watch)

        return Shadow()

    @property
    def join_device(self) -> torch.device:
        return torch.device(self._device)

    @property
    def join_process_group(self) -> Any:
        return self._group
