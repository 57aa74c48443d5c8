"""``charlm``: a character-level causal transformer on CPython's own standard-library source."""

from __future__ import annotations

import functools
import sysconfig
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from commgym.env.workloads.registry import Workload, WorkloadData, cross_entropy, describe_workload

# --------------------------------------------------------------------------------------
# charlm: character-level causal transformer on CPython's own standard-library source
# --------------------------------------------------------------------------------------

CHARLM_SOURCE_FILES: tuple[str, ...] = (
    "_pydecimal.py",
    "turtle.py",
    "inspect.py",
    "typing.py",
    "pydoc.py",
    "tarfile.py",
    "doctest.py",
    "argparse.py",
    "subprocess.py",
    "_pyio.py",
    "pickletools.py",
    "difflib.py",
    "mailbox.py",
    "enum.py",
    "ipaddress.py",
    "pickle.py",
)
"""Top-level stdlib modules (single files on CPython 3.11-3.14) concatenated, in this
order, into the charlm corpus: about 1.7 MB of text on CPython 3.11. The exact text
follows the running interpreter's version, so compare runs on the same Python."""

CHARLM_VOCAB: str = "\x00\n" + "".join(chr(c) for c in range(0x20, 0x7F))
"""The 97-symbol vocabulary: id 0 = placeholder for any other character (shown as
``chr(0)``), id 1 = newline, ids 2..96 = printable ASCII 0x20..0x7E."""

CHARLM_CONTEXT = 64
CHARLM_EVAL_FRACTION = 0.1
_CHARLM_MIN_CHARS = 256 * 1024
_CHARLM_D_MODEL, _CHARLM_HEADS, _CHARLM_LAYERS, _CHARLM_FF = 64, 4, 2, 256

# code point -> token id, for code points < 128; everything else maps to 0.
_ASCII_TO_ID = np.zeros(128, dtype=np.int64)
_ASCII_TO_ID[ord("\n")] = 1
_ASCII_TO_ID[0x20:0x7F] = np.arange(2, 97)


def encode_chars(text: str) -> torch.Tensor:
    """Map text to :data:`CHARLM_VOCAB` ids.

    Args:
        text: Any Python string.

    Returns:
        int64 tensor ``(len(text),)`` of ids in ``0..96``; characters outside printable
        ASCII and newline (tabs, non-ASCII, ...) become the placeholder id 0.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    ids = np.zeros(codes.shape, dtype=np.int64)
    ascii_mask = codes < 128
    ids[ascii_mask] = _ASCII_TO_ID[codes[ascii_mask]]
    return torch.from_numpy(ids)


def decode_chars(ids: torch.Tensor) -> str:
    """Inverse of :func:`encode_chars` (placeholders come back as ``chr(0)``).

    Args:
        ids: Integer tensor of ids in ``0..96``, any shape (flattened in row-major order).

    Returns:
        The decoded string.
    """
    return "".join(CHARLM_VOCAB[i] for i in ids.reshape(-1).tolist())


@functools.cache
def charlm_text() -> str:
    """The charlm corpus: :data:`CHARLM_SOURCE_FILES` from this interpreter's stdlib.

    Files are read as UTF-8 with universal newlines and joined with no separator; files
    missing from a trimmed installation are skipped with a warning. Cached per process.

    Returns:
        The concatenated source text (about 1.7 M characters on CPython 3.11).

    Raises:
        FileNotFoundError: If fewer than 256 K characters of the listed files exist.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, missing = [], []
    for name in CHARLM_SOURCE_FILES:
        path = stdlib / name
        if path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
        else:
            missing.append(name)
    text = "".join(parts)
    if len(text) < _CHARLM_MIN_CHARS:
        raise FileNotFoundError(
            f"charlm needs the Python source files of the standard "
            f"library in {stdlib}; found only {len(text)} characters "
            f"(missing: {', '.join(missing) or 'none'})"
        )
    if missing:
        warnings.warn(
            f"charlm: {len(missing)} stdlib source files not found in {stdlib} "
            f"({', '.join(missing)}); the corpus is smaller than usual",
            stacklevel=2,
        )
    return text


def _windows(ids: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = (ids.numel() - 1) // context
    x = ids[: n * context].reshape(n, context)
    y = ids[1 : n * context + 1].reshape(n, context)
    return x.contiguous(), y.contiguous()


def charlm_split_point() -> int:
    """Character offset where the held-out text starts (first 90% train, last 10% eval).

    Returns:
        ``int(len(charlm_text()) * 0.9)``; no training input or target lies at or after
        it, no evaluation input or target lies before it.
    """
    return int(len(charlm_text()) * (1.0 - CHARLM_EVAL_FRACTION))


@functools.cache
def load_charlm_data() -> WorkloadData:
    """Non-overlapping next-character windows of the stdlib-source corpus, split by position.

    The first 90% of the corpus (:func:`charlm_text`) is the training text, the last 10%
    the held-out text. Each is cut into consecutive windows of ``T = 64`` ids; the target
    is the input shifted by one character (``y[i, t] = x[i, t + 1]`` within the text), so
    no target crosses the split. Cached per process.

    Returns:
        WorkloadData with int64 ``train_x``, ``train_y`` ``(N_train, 64)`` and
        ``eval_x``, ``eval_y`` ``(N_eval, 64)`` of ids in ``0..96`` (about 23.8 K and
        2.6 K windows on CPython 3.11).
    """
    ids = encode_chars(charlm_text())
    split = charlm_split_point()
    train_x, train_y = _windows(ids[:split], CHARLM_CONTEXT)
    eval_x, eval_y = _windows(ids[split:], CHARLM_CONTEXT)
    return WorkloadData(train_x=train_x, train_y=train_y, eval_x=eval_x, eval_y=eval_y)


class _CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, t, dh)
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    """Pre-LayerNorm transformer block (GPT-2 layout), no dropout."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Causal character-level transformer (GPT-2 style, pre-LayerNorm, no dropout).

    Token + learned position embeddings, ``n_layers`` blocks of causal multi-head
    self-attention (``F.scaled_dot_product_attention(is_causal=True)``) and a GELU MLP,
    final LayerNorm, untied output projection. Defaults: vocabulary 97, context 64,
    d_model 64, 4 heads, 2 layers, MLP width 256: 116,705 parameters.

    Args:
        vocab_size: Number of token ids.
        context: Longest input sequence ``T``.
        d_model: Embedding width.
        n_heads: Attention heads (must divide ``d_model``).
        n_layers: Transformer blocks.
        d_ff: Hidden width of each block's MLP.

    Input: int64 ids ``(B, T)`` with ``T <= context``. Output: float32 logits
    ``(B, T, vocab_size)``; position ``t`` sees only ids ``0..t``.

    Raises:
        ValueError: If ``n_heads`` does not divide ``d_model`` (at construction) or the
            input is longer than ``context`` (in ``forward``).
    """

    def __init__(
        self,
        vocab_size: int = len(CHARLM_VOCAB),
        context: int = CHARLM_CONTEXT,
        d_model: int = _CHARLM_D_MODEL,
        n_heads: int = _CHARLM_HEADS,
        n_layers: int = _CHARLM_LAYERS,
        d_ff: int = _CHARLM_FF,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)
        self.register_buffer("positions", torch.arange(context), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` for ids ``(B, T)``."""
        t = ids.shape[1]
        if t > self.context:
            raise ValueError(f"sequence length {t} exceeds the model context {self.context}")
        x = self.tok_emb(ids) + self.pos_emb(self.positions[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def charlm() -> Workload:
    """``charlm``: 116,705-parameter causal char transformer on CPython stdlib source."""
    d, v, t, layers, ff = (
        _CHARLM_D_MODEL,
        len(CHARLM_VOCAB),
        CHARLM_CONTEXT,
        _CHARLM_LAYERS,
        _CHARLM_FF,
    )
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d)
    embeddings = v * d + t * d
    per_token = layers * block + 2 * d + (d * v + v)  # everything applied once per position
    params = embeddings + per_token
    flops, batch = 6.0 * per_token * t + 12.0 * layers * t * t * d, 16
    return Workload(
        name="charlm",
        description=describe_workload(
            f"Causal character-level transformer ({layers} layers, d_model {d}, "
            f"{_CHARLM_HEADS} heads, context {t}, vocabulary {v}: printable ASCII + newline "
            f"+ placeholder) on source text of {len(CHARLM_SOURCE_FILES)} modules of this "
            f"interpreter's standard library (last 10% held out; one sample = one window "
            f"of {t} characters, accuracy = next-character top-1).",
            params,
            flops,
            batch,
        ),
        build_model=CharTransformer,
        load_data=load_charlm_data,
        loss_fn=cross_entropy,
        default_batch_size=batch,
        default_lr=3e-3,
        optimizer="adam",
        train_flops_per_sample=flops,
    )
