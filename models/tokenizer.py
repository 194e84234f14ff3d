"""The Qwen2 byte-level BPE text tokenizer, built from `vocab.json` + `merges.txt` through transformers.

Added/special tokens come from `tokenizer_config.json` (`added_tokens_decoder`) and must land on their
declared ids. The pre-tokenizer is the Qwen2 split regex, as when the official package loads a model by
its hub id. (Loaded from a local folder, transformers 4.57.3 swaps in a Mistral regex for vocabularies over
100k entries whose config says transformers 4.57.3; that only changes how camel-case words split.)
"""

from __future__ import annotations

import json
from pathlib import Path

from leapvox.engine.errors import CheckpointError


class TextTokenizer:
    """`encode(text) -> ids` without BOS or extra special tokens."""

    def __init__(self, folder: Path, frontend=None):
        import transformers

        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        for f in (vocab, merges):
            if not f.is_file():
                raise CheckpointError(f"the model folder has no {f.name}: {folder}", hint="download the model again")
        added = _added_tokens(folder / "tokenizer_config.json")
        common = dict(unk_token=None, bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
        try:
            if int(transformers.__version__.split(".")[0]) >= 5:
                tok = transformers.Qwen2Tokenizer(vocab=str(vocab), merges=str(merges), **common)
            else:
                tok = transformers.Qwen2TokenizerFast(vocab_file=str(vocab), merges_file=str(merges), **common)
        except Exception as e:  # malformed json / merges
            raise CheckpointError(f"cannot read the text tokenizer in {folder}: {e}") from None
        from tokenizers import AddedToken

        for tid, (content, special) in sorted(added.items()):
            tok.add_tokens([AddedToken(content, special=special, normalized=False)], special_tokens=special)
            got = tok.convert_tokens_to_ids(content)
            if got != tid:
                raise CheckpointError(
                    f"tokenizer_config.json declares {content!r} as id {tid}, but it got id {got}",
                    hint="the tokenizer files do not belong together; download the model again",
                )
        self._tok = tok
        self.frontend = frontend  # text -> text before wrapping (e.g. phonemes), or None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

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
