"""The Qwen2 byte-level BPE text tokenizer, built from `vocab.json` + `merges.txt` with the `tokenizers` library.

It is the pipeline transformers' Qwen2 tokenizer assembles (and the official package uses): NFC normalization, the
Qwen2 split regex, byte-level mapping, BPE without dropout or unknown token. Added/special tokens come from
`tokenizer_config.json` (`added_tokens_decoder`) and must land on their declared ids. The split regex is the one
used when the official package loads a model by its hub id. (Loaded from a local folder, transformers 4.57.3 swaps
in a Mistral regex for vocabularies over 100k entries whose config says transformers 4.57.3; that only changes how
camel-case words split.) Building it here, without importing transformers, saves ~0.6 s and ~26 MB at load.
"""

from __future__ import annotations

import json
from pathlib import Path

from leapvox.engine.errors import CheckpointError

# Qwen2's pre-tokenizer split: contractions, letter runs with one leading non-letter, single digits, punctuation
# runs, newlines, whitespace.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
END_OF_TEXT = "<|endoftext|>"  # eos and pad of the Qwen2 tokenizer: a special token before the declared ones


def qwen2_tokenizer(vocab: Path, merges: Path):
    """A `tokenizers.Tokenizer` with Qwen2's normalizer, pre-tokenizer, BPE model and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges), dropout=None, unk_token=None, fuse_unk=False,
                                         byte_fallback=False, continuing_subword_prefix="", end_of_word_suffix=""))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


class TextTokenizer:
    """`encode(text) -> ids` without BOS or extra special tokens."""

    def __init__(self, folder: Path, frontend=None):
        from tokenizers import AddedToken

        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        for f in (vocab, merges):
            if not f.is_file():
                raise CheckpointError(f"the model folder has no {f.name}: {folder}", hint="download the model again")
        added = _added_tokens(folder / "tokenizer_config.json")
        try:
            tok = qwen2_tokenizer(vocab, merges)
        except Exception as e:  # malformed json / merges
            raise CheckpointError(f"cannot read the text tokenizer in {folder}: {e}") from None
        tok.add_special_tokens([AddedToken(END_OF_TEXT, special=True, normalized=False)])
        for tid, (content, special) in sorted(added.items()):
            token = AddedToken(content, special=special, normalized=False)
            if special:
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            got = tok.token_to_id(content)
            if got != tid:
                raise CheckpointError(
                    f"tokenizer_config.json declares {content!r} as id {tid}, but it got id {got}",
                    hint="the tokenizer files do not belong together; download the model again",
                )
        self._tok = tok
        self.frontend = frontend  # text -> text before wrapping (e.g. phonemes), or None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def __call__(self, text: str) -> list[int]:
        return self.encode(text)


def _added_tokens(path: Path) -> dict[int, tuple[str, bool]]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from None
    out = {}
    for tid, spec in (data.get("added_tokens_decoder") or {}).items():
        out[int(tid)] = (spec["content"], bool(spec.get("special", True)))
    return out
