"""Fit the demo codec (PCA + residual k-means over stacked log-mel frames) and read/write its folder.

A speech_tokenizer/ folder holds config.json (model_type "leapvox_demo_codec", the DemoCodecConfig fields and
how it was fitted) and model.safetensors (pca_mean [800], pca_components [256, 800], codebooks.{0..15} [K, 256]).
Only torch and safetensors are needed, so loading works at run time without the `demo` extra.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from leapvox.engine.nets.demo_codec import MODEL_TYPE, DemoCodec, DemoCodecConfig, nearest


def log(msg: str) -> None:
    print(f"leapvox: {msg}", file=sys.stderr, flush=True)


def fit_pca(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, D] -> (mean [D], components [dim, D]) with orthonormal rows, largest variance first.
    Signs are fixed (largest-magnitude entry positive) so refits on the same data give the same basis."""
    mean = x.mean(0)
    xc = (x - mean).double()
    if x.shape[0] < x.shape[1]:  # few frames (tests): the SVD of the data is cheaper than the covariance
        comps = torch.linalg.svd(xc, full_matrices=False)[2][:dim]  # [dim, D]
    else:
        _, vecs = torch.linalg.eigh(xc.t() @ xc)  # ascending eigenvalues
        comps = vecs.flip(1)[:, :dim].t()  # [dim, D]
    sign = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    return mean, (comps * sign).float()


def kmeans(x: torch.Tensor, k: int, iters: int, gen: torch.Generator, init_sample: int = 20000) -> torch.Tensor:
    """Lloyd's k-means with k-means++ seeding (on a subsample) and re-seeding of empty clusters: [N, D] -> [k, D]."""
    sub = x[torch.randperm(x.shape[0], generator=gen)[:init_sample]]
    centers = [sub[torch.randint(sub.shape[0], (1,), generator=gen)].squeeze(0)]
    d2 = ((sub - centers[0]) ** 2).sum(1)
    for _ in range(1, k):
        pick = torch.multinomial(d2 + 1e-12, 1, generator=gen)
        centers.append(sub[pick].squeeze(0))
        d2 = torch.minimum(d2, ((sub - centers[-1]) ** 2).sum(1))
    book = torch.stack(centers)  # [k, D]
    for _ in range(iters):
        idx = nearest(x, book)
        sums = torch.zeros_like(book).index_add_(0, idx, x)
        counts = torch.bincount(idx, minlength=k).to(x.dtype)
        book = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], book)
        empty = (counts == 0).nonzero().squeeze(1)
        if len(empty):  # move dead centroids onto the worst-fitted points
            err = ((x - book[idx]) ** 2).sum(1)
            book[empty] = x[err.topk(len(empty)).indices]
    return book


def fit_codec(wavs: Iterable[torch.Tensor], cfg: DemoCodecConfig | None = None, iters: int = 25,
              seed: int = 0) -> tuple[DemoCodec, dict]:
    """Fit a DemoCodec on 24 kHz float waveforms [N]. Returns the codec and fit statistics."""
    cfg = cfg or DemoCodecConfig()
    codec, gen, t0 = DemoCodec(cfg), torch.Generator().manual_seed(seed), time.perf_counter()
    with torch.no_grad():
        feats = torch.cat([codec.features(w) for w in wavs])  # [N, 800]
        mean, comps = fit_pca(feats, cfg.pca_dim)
        codec.pca_mean.copy_(mean)
        codec.pca_components.copy_(comps)
        resid = (feats - mean) @ comps.t()  # [N, pca_dim]
        total = resid.pow(2).sum(1).mean().item()
        stats = {"frames": feats.shape[0], "pca_explained": 1 - _pca_loss(feats, mean, comps), "stage_mse": []}
        log(f"codec fit: {feats.shape[0]} frames, PCA-{cfg.pca_dim} keeps {stats['pca_explained']:.4f} of variance")
        for q, book in enumerate(codec.codebooks):
            centers = kmeans(resid, book.shape[0], iters, gen)
            book.copy_(centers)
            resid -= centers[nearest(resid, centers)]
            stats["stage_mse"].append(resid.pow(2).sum(1).mean().item() / cfg.pca_dim)
            log(f"codec fit: stage {q + 1}/{cfg.num_quantizers} K={book.shape[0]}: residual "
                f"{resid.pow(2).sum(1).mean().item() / total:.3f} of PCA energy ({time.perf_counter() - t0:.0f} s)")
    stats["fit_seconds"] = round(time.perf_counter() - t0, 1)
    return codec, stats


def _pca_loss(x: torch.Tensor, mean: torch.Tensor, comps: torch.Tensor) -> float:
    xc = x - mean
    back = (xc @ comps.t()) @ comps
    return ((xc - back) ** 2).sum().item() / (xc**2).sum().item()


def save_codec(codec: DemoCodec, folder: str | Path, meta: dict | None = None) -> Path:
    """Write config.json (+ `meta` under "fit") and model.safetensors into `folder`."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = codec.config.to_dict()
    if meta:
        cfg["fit"] = meta
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in codec.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"model_type": MODEL_TYPE})
    return folder


def is_demo_codec(folder: str | Path) -> bool:
    """True when `folder`/config.json names a demo codec (a loader can then pick load_codec over the Qwen one)."""
    path = Path(folder) / "config.json"
    return path.is_file() and json.loads(path.read_text()).get("model_type") == MODEL_TYPE


def load_codec(folder: str | Path) -> DemoCodec:
    """Read a speech_tokenizer/ folder written by save_codec; every tensor must be present and the right shape."""
    from safetensors.torch import load_file

    folder = Path(folder)
    codec = DemoCodec(DemoCodecConfig.from_dict(json.loads((folder / "config.json").read_text())))
    codec.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return codec.eval()
