"""PyTorch Lightning: `Trainer(strategy=HeteroStrategy())` instead of `strategy="ddp"`.

    import lightning as L
    import hetero_runtime.wrap as heterotrain
    from hetero_runtime.wrap.lightning import HeteroStrategy

    trainer = L.Trainer(strategy=HeteroStrategy(), accelerator="auto", devices=1, max_epochs=8)
    trainer.fit(module, train_dataloaders=DataLoader(train_set, batch_size=64, shuffle=True))
    heterotrain.leave()  # the script's last call: every rank leaves the job together, and ends

The LightningModule, its training_step, optimizers, schedulers, callbacks, loggers and checkpoints stay
as they are. The strategy takes the place of DDP: the model is wrapped in HeteroModel (each rank's
gradient weighted by b_i/B), and the training DataLoader becomes a HeteroDataLoader over its dataset
whose global batch is the DataLoader's batch_size times the world (what the ranks of a DDP run took
together), split by the plan in force and re-split at epoch boundaries. Each process of the job runs
one rank, started by the operator or by `heterotrain run-local` (one device per process).

Each rank computes in the format the script's `Trainer(precision=...)` gives it (a script may pick
it per GPU: "bf16-mixed" on an A100, "16-mixed" on a V100). The loss scale is the job's: if any rank
scales its loss ("16-mixed"), every rank does, with the job-wide scaler's settings, so that the ranks'
gradients carry one scale and an overflow on any rank is skipped on every rank (`JobScaledPrecision`).

Lightning fetches each batch one step ahead of the step that trains on it; the loader hands a rank its
share when its step begins. So the DataLoader yields placeholders, and each becomes the step's batch
when Lightning moves it to the device (an `on_before_batch_transfer` of the module's sees the
placeholder). The global batch stays as the job started: Lightning counts an epoch's batches once.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader

from hetero_operator.plan import Strategy
from hetero_runtime.precision import job_loss_scaler
from hetero_runtime.worker_session import gather_objects
from hetero_runtime.wrap.loader import HeteroDataLoader
from hetero_runtime.wrap.model import HeteroModel
from hetero_runtime.wrap.session import WrapperError, current_session, init


class JobEnvironment(ClusterEnvironment):
    """One rank per process, as the operator's pods (or `heterotrain run-local`) start them: the
    ranks come from the torchrun variables the worker is given, never from Lightning's own count of
    devices and nodes."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "29500"))

    @staticmethod
    def detect() -> bool:
        return "RANK" in os.environ and "WORLD_SIZE" in os.environ

    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    def set_world_size(self, size: int) -> None:
        pass  # the job's, not Lightning's

    def global_rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return self.global_rank()  # one process per pod


_FORMATS = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class JobScaledPrecision(MixedPrecision):
    """Lightning's mixed-precision plugin with the job-wide loss scaler, on a rank that computes in
    fp32, bf16 or fp16 (Lightning's own plugin refuses a scaler beside bf16, and has none for fp32)."""

    def __init__(self, precision: str, device: str) -> None:
        # Not MixedPrecision.__init__, which refuses a scaler beside bf16: the state it sets, set here.
        self.precision = precision  # type: ignore[assignment]
        self.device = device
        self.scaler = job_loss_scaler(device)
        self.dtype = _FORMATS[precision]

    @contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        context = (
            nullcontext()
            if self.dtype is None
            else torch.autocast(self.device, self.dtype, cache_enabled=False)
        )
        with context:
            yield


def plugin_format(plugin: Precision) -> tuple[str, bool]:
    """The precision a rank's plugin computes in ("other" for formats beyond fp32, bf16 and fp16
    mixed) and whether it scales its loss."""
    if isinstance(plugin, MixedPrecision):
        return plugin.precision, plugin.scaler is not None
    if type(plugin) is Precision:
        return "32-true", False
    return "other", False


def job_scaled(plugin: Precision, device: torch.device, world_size: int) -> Precision:
    """This rank's plugin under the job's loss scale: unchanged when no rank scales its loss, else a
    JobScaledPrecision in this rank's format (a collective: every rank's format is gathered)."""
    formats = gather_objects(plugin_format(plugin), world_size)
    if not any(scaled for _, scaled in formats):
        return plugin
    others = [rank for rank, (name, _) in enumerate(formats) if name not in _FORMATS]
    if others:
        raise WrapperError(
            f"rank {others[0]}'s Trainer(precision=...) is {type(plugin).__name__}, but rank "
            f"{next(r for r, (_, scaled) in enumerate(formats) if scaled)} scales its loss (16-mixed): "
            "with ranks in 16-mixed, give every rank 32-true, bf16-mixed or 16-mixed"
        )
    return JobScaledPrecision(plugin_format(plugin)[0], device.type)


class _Placeholder:
    """What the training DataLoader yields: the step's batch is drawn when the step begins."""

    __slots__ = ()


class PlannedBatches:
    """The training batches as Lightning iterates them: one placeholder per step of the epoch under
    the plan in force; `draw` hands out the loader's next batch (this rank's planned share)."""

    def __init__(self, loader: HeteroDataLoader) -> None:
        self.loader = loader
        self._live: Iterator[Any] | None = None
        self._steps = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[_Placeholder]:
        self.finish_epoch()  # an epoch left early (a limit on batches, an exception caught)
        self._live = iter(self.loader)
        self._steps = len(self.loader)
        return (_Placeholder() for _ in range(self._steps))

    def draw(self) -> Any:
        if self._live is None:
            raise WrapperError("a training batch was asked for outside an epoch of the HeteroDataLoader")
        try:
            return next(self._live)
        except StopIteration:
            raise WrapperError(
                "the HeteroDataLoader's epoch ended before Lightning's: the plan changed the global batch "
                "during the epoch; keep spec.batch fixed for a Lightning script"
            ) from None

    def step_done(self, index: int) -> None:
        """After the optimizer step of step `index`: the epoch's end follows its last step at once
        (its measurements, records and metrics, as a plain loop's leaving the for loop)."""
        if index + 1 >= self._steps:
            self.finish_epoch()

    def finish_epoch(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            for _ in live:
                pass  # the steps Lightning did not take (none, unless the epoch was cut short)


class _StepEnds(Callback):
    """Tells the planned batches where each step ends, and keeps the loader's position in
    Lightning's checkpoints (epoch, samples consumed, the plan in force)."""

    def __init__(self, strategy: HeteroStrategy) -> None:
        self.strategy = strategy

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.strategy.batches is not None:
            self.strategy.batches.step_done(batch_idx)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.strategy.batches is not None:
            self.strategy.batches.finish_epoch()

    def state_dict(self) -> dict[str, Any]:
        batches = self.strategy.batches
        return {"loader": batches.loader.state_dict()} if batches is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.strategy.restored = state_dict.get("loader")


class HeteroStrategy(DDPStrategy):
    """Lightning's DDP strategy with heterotrain's model wrapper and planned batches in place of
    DistributedDataParallel and the DistributedSampler (the `data` strategy; `global_batch`: the
    samples of one step over all ranks, by default the DataLoader's batch_size times the world)."""

    def __init__(self, global_batch: int | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("cluster_environment", JobEnvironment())
        super().__init__(**kwargs)
        if global_batch is not None and global_batch < 1:
            raise WrapperError(f"HeteroStrategy(global_batch={global_batch}): give a positive sample count")
        self.global_batch = global_batch
        self.batches: PlannedBatches | None = None
        self.restored: dict[str, Any] | None = None  # the loader's state from a checkpoint

    @property
    def root_device(self) -> torch.device:
        """The worker's device as heterotrain placed it (its GPU by LOCAL_RANK, or the CPU)."""
        try:
            return current_session().device
        except WrapperError:  # not joined yet
            return self.parallel_devices[0] if self.parallel_devices else torch.device("cpu")

    def setup(self, trainer: pl.Trainer) -> None:
        session = current_session()
        self.precision_plugin = job_scaled(self.precision_plugin, session.device, session.world_size)
        super().setup(trainer)

    def setup_distributed(self) -> None:
        self.set_world_ranks()
        self._process_group_backend = current_session().placement.backend

    def setup_environment(self) -> None:
        init()  # the process group, this worker's device and its metrics
        super().setup_environment()
        # Before Lightning restores a checkpoint's callbacks: the loader's position is among them.
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        callbacks: list[Callback] = getattr(trainer, "callbacks", [])  # set by the Trainer at run time
        if trainer is not None and not any(isinstance(c, _StepEnds) for c in callbacks):
            callbacks.append(_StepEnds(self))

    def _setup_model(self, model: nn.Module) -> HeteroModel:  # type: ignore[override]
        return HeteroModel(model)

    def _register_ddp_hooks(self) -> None:
        pass  # no DDP reducer: HeteroModel's buckets synchronise the gradients

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """Validation and test loaders are sharded over the job's ranks, as under DDP."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def process_dataloader(self, dataloader: object) -> object:
        if not isinstance(dataloader, DataLoader) or self.lightning_module is None:
            return dataloader
        if not self.lightning_module.trainer.training:
            return dataloader
        self.batches = PlannedBatches(self._planned_loader(dataloader))
        return self.batches

    def _planned_loader(self, dataloader: DataLoader[Any]) -> HeteroDataLoader:
        session = current_session()
        if dataloader.batch_size is None and self.global_batch is None:
            raise WrapperError(
                "the training DataLoader has no batch_size (a batch_sampler of its own): give "
                "HeteroStrategy(global_batch=...) the samples of one step over all ranks"
            )
        global_batch = self.global_batch or int(dataloader.batch_size or 1) * session.world_size
        loader = HeteroDataLoader(
            dataloader.dataset,
            batch_size=global_batch,
            collate_fn=dataloader.collate_fn,
            num_workers=dataloader.num_workers,
            pin_memory=dataloader.pin_memory,
        )
        plan = loader.plan
        if plan.strategy is not Strategy.DATA:
            raise WrapperError(
                f"plan version {plan.version} runs strategy {plan.strategy.value!r}; a Lightning script "
                "runs 'data' only (Lightning steps every batch in sync): set spec.parallelism.strategy: "
                "data, or port the loop to hetero_runtime.wrap (docs/porting.md)"
            )
        if self.restored:
            loader.load_state_dict(self.restored)
            self.restored = None
        elif self.batches is not None:  # reloaded (reload_dataloaders_every_n_epochs): carry on
            loader.load_state_dict(self.batches.loader.state_dict())
        return loader

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        if isinstance(batch, _Placeholder) and self.batches is not None:
            batch = self.batches.draw()
        return super().batch_to_device(batch, device, dataloader_idx)

    @contextmanager
    def block_backward_sync(self) -> Generator[None, None, None]:
        """Gradient accumulation (`accumulate_grad_batches`): the passes before the last stay local."""
        if isinstance(self.model, HeteroModel):
            with self.model.no_sync():
                yield None
        else:
            yield None

    def teardown(self) -> None:
        if isinstance(self.model, HeteroModel):
            self.model = self.lightning_module
        super().teardown()
