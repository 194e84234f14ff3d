"""The talker: a Qwen3 decoder over summed text + codec embeddings that predicts code 0 of each frame.

Parameter names follow the official checkpoint below the `talker.` prefix, so weights load by their exact keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from leapvox.engine.config import TalkerConfig
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.nets.transformer import DecoderStack


class TalkerModel(DecoderStack):
    """`talker.model`: the decoder stack plus the text and codec embedding tables."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)


class TextProjection(nn.Module):
    """text_hidden -> text_hidden -> hidden MLP with SiLU and biases."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    """`talker`: backbone, text projection, code-0 head and the code predictor."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg.code_predictor, talker_hidden=cfg.hidden_size)

    @property
    def device(self) -> torch.device:
        return self.model.codec_embedding.weight.device

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids [B, T] -> projected text embeddings [B, T, H]. The rows are cast to the talker's compute
        dtype (an int8 model keeps the large text table as stored, bf16, and upcasts only the rows it reads)."""
        rows = self.model.text_embedding(ids)
        return self.text_projection(rows.to(self.model.codec_embedding.weight.dtype))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Codec / control ids [...] -> talker codec embeddings [..., H]."""
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """All 16 codes of a frame [B, 16] -> summed embedding [B, 1, H] (code 0 via the talker table)."""
        parts = [self.embed_codec(codes[:, :1])]  # [B, 1, H]
        tables = self.code_predictor.model.codec_embedding
        # a quantized model keeps these tables as stored (e.g. bf16) and upcasts the rows it reads
        parts += [tables[g](codes[:, g + 1 : g + 2]).to(parts[0].dtype) for g in range(len(tables))]
        return torch.cat(parts, dim=1).sum(1, keepdim=True)

    def forward(self, x: torch.Tensor, start: int, mask: torch.Tensor | None = None):
        """Embeddings [B, T, H] at positions start.. -> (normed hidden [B, T, H], code-0 logits [B, T, Vc])."""
        h = self.model(x, start, mask)
        return h, self.codec_head(h)


class TTSModel(nn.Module):
    """Top level of `model.safetensors`: only the talker for CustomVoice checkpoints."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.talker = Talker(cfg)
