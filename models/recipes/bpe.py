"""Byte-level BPE text tokenizer files in the Qwen2 format (vocab.json, merges.txt, tokenizer_config.json), written
by one function for every tokenizer leapvox makes: the demo model's (recipes/demo/tokenizer_files.py), the developer
benchmark's random-weight checkpoints (tests/benchmarks/bench.py) and the reference fixtures
(tests/reference/make_fixtures.py). Standard library only: make_fixtures.py loads this file by path in the reference
virtualenv, where leapvox is not installed."""

from __future__ import annotations

import json
from pathlib import Path


def byte_symbols() -> list[str]:
    """The byte -> printable-character table of byte-level BPE (GPT-2 / Qwen2 convention): printable Latin-1 bytes
    stand for themselves, the other bytes (controls, space, a few others) for the characters from U+0100 up, in byte
    order. Entry b is byte b's symbol."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), 256))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tokenizer_files(vocab: dict[str, int], merges: list[tuple[str, str]], config: dict, indent: int = 1) -> dict:
    """The three files' text: vocab.json (token -> id), merges.txt (one `a b` pair a line, in rank order) and
    tokenizer_config.json (`config`, indented by `indent`)."""
    return {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
        "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=indent),
    }


def write_tokenizer_files(
    folder: str | Path, vocab: dict[str, int], merges: list[tuple[str, str]], config: dict, indent: int = 1
) -> None:
    """Write `tokenizer_files(...)` into `folder` (created if missing), UTF-8."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in tokenizer_files(vocab, merges, config, indent).items():
        (folder / name).write_text(text, encoding="utf-8")
