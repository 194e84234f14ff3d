"""A tiny byte-level BPE tokenizer in the Qwen2 file format (vocab.json, merges.txt, tokenizer_config.json).

Base vocabulary: the 256 byte symbols. Merges make every multi-byte character of the corpus (IPA) and the word
"assistant" single tokens. Added tokens: the Qwen3-TTS special tokens, after the regular vocabulary.
"""

from __future__ import annotations

from pathlib import Path

from leapvox.models.recipes.bpe import byte_symbols, write_tokenizer_files

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>",
    "<tts_text_bos>", "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
]


def write_tokenizer(folder: Path, corpus: list[str]) -> dict:
    """Write the three tokenizer files; returns the vocabulary size, special-token ids and the assistant id."""
    sym = byte_symbols()
    vocab = {s: i for i, s in enumerate(sym)}
    merges: list[tuple[str, str]] = []

    def add_word(word: str) -> None:
        pieces = [sym[b] for b in word.encode("utf-8")]
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append((a, b))
            pieces = [a + b] + pieces[2:]

    for ch in sorted({c for line in corpus for c in line if len(c.encode("utf-8")) > 1}):
        add_word(ch)
    add_word("assistant")
    special = {t: len(vocab) + i for i, t in enumerate(SPECIAL_TOKENS)}
    decoder = {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                        "single_word": False} for t, i in special.items()}
    config = {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": decoder, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "model_max_length": 32768, "clean_up_tokenization_spaces": False,
              "errors": "replace", "split_special_tokens": False}
    write_tokenizer_files(folder, vocab, merges, config)
    return {"vocab_size": len(vocab) + len(SPECIAL_TOKENS), "special": special, "assistant": vocab["assistant"]}
