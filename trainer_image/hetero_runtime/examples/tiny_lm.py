"""A small character-level transformer language model on a corpus generated from a tiny grammar.

The corpus is produced in code (seeded), so the example needs no download. Sentences follow
"the <adjective> <animal> <verb> the <object> ." with a few fixed word lists; a model that has
learnt the vocabulary and the template predicts most characters, so the validation loss falls
from ln(vocabulary) ≈ 3.2 nats per character to below TARGET_LOSS.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

from hetero_runtime.api import TrainingJob

TARGET_LOSS = 1.0  # nats per character on held-out text
CONTEXT = 32

ADJECTIVES = ["quick", "lazy", "small", "brown", "happy", "old"]
ANIMALS = ["cat", "dog", "fox", "owl", "hen", "pig"]
VERBS = ["sees", "likes", "finds", "eats", "wants"]
OBJECTS = ["mat", "ball", "hat", "box", "cake", "map"]


def generate_corpus(sentences: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    words = [
        f"the {rng.choice(ADJECTIVES)} {rng.choice(ANIMALS)} {rng.choice(VERBS)} the {rng.choice(OBJECTS)} ."
        for _ in range(sentences)
    ]
    return " ".join(words)


def encode(text: str, alphabet: str) -> torch.Tensor:
    index = {ch: i for i, ch in enumerate(alphabet)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long)


def windows(tokens: torch.Tensor, context: int) -> TensorDataset:
    """Non-overlapping (input, next-character target) windows."""
    count = (len(tokens) - 1) // context
    inputs = tokens[: count * context].view(count, context)
    targets = tokens[1 : count * context + 1].view(count, context)
    return TensorDataset(inputs, targets)


class Embed(nn.Module):
    def __init__(self, vocabulary: int, width: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Parameter(torch.zeros(context, width))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions[: ids.shape[1]]


class Block(nn.Module):
    """Pre-norm causal self-attention plus MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        mask = torch.triu(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    def __init__(self, width: int, vocabulary: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_model(vocabulary: int, width: int = 48, heads: int = 4, blocks: int = 2) -> nn.Sequential:
    return nn.Sequential(
        Embed(vocabulary, width, CONTEXT),
        *[Block(width, heads) for _ in range(blocks)],
        Head(width, vocabulary),
    )


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_job(epochs: int = 6, seed: int = 0) -> TrainingJob:
    torch.manual_seed(seed)
    train_text, valid_text = generate_corpus(1500, seed), generate_corpus(200, seed + 1)
    alphabet = "".join(sorted(set(train_text) | set(valid_text)))
    train = windows(encode(train_text, alphabet), CONTEXT)
    valid = windows(encode(valid_text, alphabet), CONTEXT)
    model = build_model(len(alphabet))

    def evaluate(m: nn.Module) -> dict[str, float]:
        device = next(m.parameters()).device
        inputs, targets = (tensor.to(device) for tensor in valid.tensors)
        loss = float(sequence_loss(m(inputs), targets))
        return {"validation_loss": loss, "perplexity": math.exp(loss)}

    return TrainingJob(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
        dataset=train,
        loss_fn=sequence_loss,
        epochs=epochs,
        global_batch=32,
        evaluate=evaluate,
        options={"layers": model},
    )


def main() -> None:
    build_job().fit()


if __name__ == "__main__":
    main()
