"""A plain DistributedDataParallel script, as torchrun launches it: a small residual CNN (or, with
`--model resnet18`, torchvision's ResNet-18) on scikit-learn's 8x8 digits, with mixed precision,
gradient clipping, an LR scheduler, its own logging and checkpoints.

    torchrun --nproc-per-node 2 ddp_digits.py --epochs 8
    heterotrain worker -- python ddp_digits.py --epochs 8      (in a heterotrain pod: even split)

`ddp_digits_hetero.py` is the same script ported to heterotrain (docs/porting.md shows the diff).
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class ResidualCNN(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.block = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)
        )
        self.head = nn.Linear(width * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.relu(self.stem(x))
        x = functional.relu(x + self.block(x))
        return self.head(x.flatten(1))


def build_model(name: str) -> nn.Module:
    """`cnn` (the default, small and quick) or torchvision's ResNet-18 with a stem for 8x8 images of one
    channel (a 3x3 convolution, no max-pool), as ResNets are commonly cut for small images."""
    if name == "cnn":
        return ResidualCNN()
    from torchvision.models import resnet18

    resnet = resnet18(num_classes=10)
    resnet.conv1 = nn.Conv2d(1, 64, 3, padding=1, bias=False)
    resnet.maxpool = nn.Identity()
    return resnet


def digits() -> tuple[TensorDataset, TensorDataset]:
    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.images / 16.0, data.target, test_size=0.2, random_state=0, stratify=data.target
    )

    def dataset(x: object, y: object) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32).unsqueeze(1), torch.tensor(y))

    return dataset(x_train, y_train), dataset(x_test, y_test)


def accuracy(model: nn.Module, test: TensorDataset, device: torch.device) -> float:
    model.eval()
    with torch.no_grad():
        x, y = (t.to(device) for t in test.tensors)
        correct = (model(x).argmax(dim=1) == y).float().mean()
    model.train()
    return float(correct)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--passes", type=int, default=1, help="passes over the training set per epoch")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, over all ranks")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--model", choices=("cnn", "resnet18"), default="cnn")
    parser.add_argument("--amp", action="store_true", help="autocast in bf16 with a GradScaler")
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the final metrics here (JSON)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    # OMP_NUM_THREADS when given (torchrun sets 1 for several processes), else a share of the cores.
    shared = max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"]))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or shared))
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, test = digits()
    train = TensorDataset(*(t.repeat(args.passes, *[1] * (t.dim() - 1)) for t in train.tensors))
    model = DistributedDataParallel(build_model(args.model).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=20, enabled=args.amp)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(train, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size // world, sampler=sampler)
    state = {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "scaler": scaler,
    }
    start = restore(state, args.checkpoint_dir, device)
    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                loss = functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=2.0)
            scaler.step(optimizer)
            scaler.update()
        scheduler.step()
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f} accuracy {accuracy(model, test, device):.4f}")
            save(state, epoch + 1, args.checkpoint_dir)
    if rank == 0 and args.out is not None:
        metrics = {"accuracy": accuracy(model, test, device), "lr": scheduler.get_last_lr()[0]}
        args.out.write_text(json.dumps({**metrics, "scale": scaler.get_scale(), "world_size": world}))
    # Leave together: a rank that tears gloo down while a peer still works may abort at exit.
    dist.barrier()
    dist.destroy_process_group()


def save(state: dict[str, object], epochs_done: int, directory: Path | None) -> None:
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        snapshot = {name: obj.state_dict() for name, obj in state.items()}  # type: ignore[attr-defined]
        torch.save({**snapshot, "epochs_done": epochs_done}, directory / "last.pt")


def restore(state: dict[str, object], directory: Path | None, device: torch.device) -> int:
    if directory is None or not (directory / "last.pt").is_file():
        return 0
    snapshot = torch.load(directory / "last.pt", map_location=device, weights_only=True)
    for name, obj in state.items():
        obj.load_state_dict(snapshot[name])  # type: ignore[attr-defined]
    return int(snapshot["epochs_done"])


if __name__ == "__main__":
    main()
    # Every rank has left the process group: end the process now. torch's C++ teardown at interpreter
    # exit has aborted a rank now and then after its work was done ("terminate called without an
    # active exception"), and a worker's exit code is its pod's verdict.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
