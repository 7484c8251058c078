"""A Hugging Face `transformers` causal language model trained through heterotrain's wrapper.

A GPT-2 built from a small config (2 layers, 2 heads, width 64; nothing downloaded) learns, from
scratch, the character-level text that `tiny_lm` generates from its grammar: the vocabulary is the
corpus's characters, so there is no tokenizer and nothing is read from the network (transformers
needs no `HF_HUB_OFFLINE` for that). The training loop is the script's own: AdamW, a cosine learning
rate schedule, gradient clipping, and the loss the model computes from its `labels`, a mean over the
tokens of this rank's batch, which is what HeteroModel needs. Rank 0 reports the held-out loss and
perplexity before and after training, next to ln(vocabulary), the loss of a uniform guess.

    heterotrain run-local --workers 3 --speeds 1,0.5,0.25 -- python hf_causal_lm.py --epochs 8
    python hf_causal_lm.py --epochs 8       # one process, no cluster
"""

import argparse
import hashlib
import json
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

import hetero_runtime.wrap as heterotrain
from hetero_runtime.examples.tiny_lm import generate_corpus

CONTEXT = 64  # characters per training sequence, and the model's n_positions


def corpus(train_sentences: int, seed: int = 0) -> tuple[str, TensorDataset, torch.Tensor]:
    """The alphabet, the training sequences and the held-out ones, all from the generator."""
    train_text = generate_corpus(train_sentences, seed)
    held_out_text = generate_corpus(max(1, train_sentences // 8), seed + 1)
    alphabet = "".join(sorted(set(train_text) | set(held_out_text)))
    index = {ch: i for i, ch in enumerate(alphabet)}

    def sequences(text: str) -> torch.Tensor:
        ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        return ids[: len(ids) // CONTEXT * CONTEXT].view(-1, CONTEXT)

    return alphabet, TensorDataset(sequences(train_text)), sequences(held_out_text)


def build_model(vocabulary: int) -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=vocabulary,
        n_positions=CONTEXT,
        n_embd=64,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config)


def held_out_loss(model: nn.Module, held_out: torch.Tensor) -> float:
    ids = held_out.to(heterotrain.device())
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    model.train()
    return float(loss)


def checksum(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch, over all ranks")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sentences", type=int, default=800, help="training sentences to generate")
    parser.add_argument("--out", type=Path, default=None, help="write the final metrics here (JSON)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # OMP_NUM_THREADS when given (torchrun sets 1 for several processes), else a share of the cores:
    # more threads than free cores make every parallel region wait for a descheduled one.
    shared = max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or shared))
    heterotrain.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    alphabet, train, held_out = corpus(args.sentences)
    model = heterotrain.HeteroModel(build_model(len(alphabet)))
    loader = heterotrain.HeteroDataLoader(train, batch_size=args.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * len(loader), eta_min=args.lr / 10
    )
    initial = held_out_loss(model, held_out) if rank == 0 else math.nan
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for (x,) in loader:
            optimizer.zero_grad()
            outputs = model(input_ids=x, labels=x)  # the model shifts the labels itself
            outputs.loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            scheduler.step()
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {outputs.loss.item():.4f}", flush=True)
    checksums: list[str] = [""] * world
    dist.all_gather_object(checksums, checksum(model))  # every rank holds the same weights
    if rank == 0:
        final = held_out_loss(model, held_out)
        print(f"held-out loss {initial:.4f} -> {final:.4f}, perplexity {math.exp(final):.2f}")
        if args.out is not None:
            metrics = {
                "vocabulary": len(alphabet),
                "uniform_loss": math.log(len(alphabet)),
                "initial_loss": initial,
                "held_out_loss": final,
                "perplexity": math.exp(final),
                "lr": scheduler.get_last_lr()[0],
                "checksums": checksums,
                "world_size": world,
                "device": heterotrain.device().type,
            }
            args.out.write_text(json.dumps(metrics))
    heterotrain.leave()  # with every rank (rank 0 was still evaluating), and end at once


if __name__ == "__main__":
    main()
