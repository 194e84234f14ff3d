"""Carry a built demo dataset to a training machine in about half its size, and unpack it there.

`pack` stores each split's codes column by column (code 0 as little-endian int16, codes 1..15 as uint8, which
their codebook sizes allow) and xz-compresses them; everything else of the split travels as is. `unpack` writes
the same `train.pt` / `extra.pt` / `test.pt` back, equal tensor for tensor, plus the codec folder.

    python -m leapvox.models.recipes.demo.pack DATA pack.xz.pt          # here
    python -m leapvox.models.recipes.demo.pack --unpack pack.xz.pt DATA  # there
(--no-codec / --codec DIR leave the speech tokenizer out when the other side already has it)
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

SPLITS = ("train", "extra", "test")


def _blob(b: bytes) -> torch.Tensor:
    """bytes as a uint8 tensor (torch.save's pickle protocol would store raw bytes about 1.5x larger)."""
    return torch.frombuffer(bytearray(b), dtype=torch.uint8)


def _squeeze(codes: torch.Tensor) -> torch.Tensor:
    c = codes.numpy()
    if c.shape[1] != 16 or c[:, 0].max(initial=0) > 32767 or c[:, 1:].max(initial=0) > 255 or c.min(initial=0) < 0:
        raise ValueError("codes must be [T, 16] with code 0 in int16 and codes 1..15 in 0..255")
    cols = [c[:, 0].astype("<i2").tobytes()] + [c[:, g].astype(np.uint8).tobytes() for g in range(1, 16)]
    return _blob(lzma.compress(b"".join(cols), preset=6))


def _expand(blob: torch.Tensor, frames: int) -> torch.Tensor:
    raw = lzma.decompress(blob.numpy().tobytes())
    out = np.empty((frames, 16), dtype=np.int16)
    out[:, 0] = np.frombuffer(raw, dtype="<i2", count=frames)
    rest = np.frombuffer(raw, dtype=np.uint8, offset=2 * frames).reshape(15, frames)
    out[:, 1:] = rest.T
    return torch.from_numpy(out)


def pack(data_dir: str | Path, out_file: str | Path, splits=SPLITS, codec: bool = True) -> dict:
    """Pack the splits of `data_dir` that exist (and, with `codec`, its speech_tokenizer files) into one file.
    Returns the compressed code bytes per split."""
    data, packed = Path(data_dir), {}
    for name in splits:
        if not (data / f"{name}.pt").is_file():
            continue
        d = torch.load(data / f"{name}.pt", weights_only=False)
        codes = d.pop("codes")
        packed[name] = dict(d, codes_xz=_squeeze(codes), frames=codes.shape[0])
    files = {p.name: _blob(p.read_bytes()) for p in (data / "speech_tokenizer").iterdir() if p.is_file() and codec}
    tmp = Path(str(out_file) + ".part")
    torch.save({"splits": packed, "speech_tokenizer": files}, tmp)
    tmp.replace(out_file)
    return {name: v["codes_xz"].numel() for name, v in packed.items()}


def unpack(pack_file: str | Path, data_dir: str | Path, codec_dir: str | Path | None = None) -> list[str]:
    """Write the packed splits and speech_tokenizer/ into `data_dir` (the codec from `codec_dir` when the pack
    carries none, e.g. the bundled demo model's speech_tokenizer/, which build-data's codec is); returns the
    split names."""
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    p = torch.load(pack_file, weights_only=False)
    for name, d in p["splits"].items():
        d = dict(d)
        d["codes"] = _expand(d.pop("codes_xz"), d.pop("frames"))
        torch.save(d, data / f"{name}.pt")
    codec = data / "speech_tokenizer"
    if codec.exists():
        shutil.rmtree(codec)
    if not p["speech_tokenizer"]:
        if codec_dir is None:
            raise ValueError("this pack carries no codec: give codec_dir")
        shutil.copytree(codec_dir, codec)
        return list(p["splits"])
    codec.mkdir()
    for fname, blob in p["speech_tokenizer"].items():
        (codec / fname).write_bytes(blob.numpy().tobytes())
    return list(p["splits"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m leapvox.models.recipes.demo.pack", description=__doc__.split("\n")[0])
    ap.add_argument("--unpack", action="store_true", help="SRC is a pack file, DST a data folder")
    ap.add_argument("--no-codec", action="store_true", help="leave speech_tokenizer/ out of the pack")
    ap.add_argument("--codec", type=Path, help="with --unpack: the codec folder to use when the pack has none")
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    a = ap.parse_args(argv)
    if not a.src.exists():
        print(f"leapvox: {a.src} does not exist", file=sys.stderr)
        return 2
    print(unpack(a.src, a.dst, a.codec) if a.unpack else pack(a.src, a.dst, codec=not a.no_codec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
