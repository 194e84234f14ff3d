"""The code predictor ("sub-talker"): a 5-layer depth transformer emitting codes 1..15 of a frame.

Per frame it starts from an empty cache: row 0 is the talker's final-normed hidden state, row 1 the talker
embedding of code 0; row g+1 (g = 1..14) embeds code g with private table g-1. Head g predicts code g+1.
"""

from __future__ import annotations

import torch
from torch import nn

from leapvox.engine.config import CodePredictorConfig
from leapvox.engine.nets.transformer import DecoderStack


class CodePredictorModel(DecoderStack):
    """`talker.code_predictor.model`: the stack plus 15 private code tables at TALKER width."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int):
        super().__init__(cfg)
        n = cfg.num_code_groups - 1
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(n))


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int):
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorModel(cfg, talker_hidden)
        n = cfg.num_code_groups - 1
        self.lm_head = nn.ModuleList(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(n))
        if talker_hidden != cfg.hidden_size:
            self.small_to_mtp_projection: nn.Module = nn.Linear(talker_hidden, cfg.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    @property
    def num_heads(self) -> int:
        return len(self.lm_head)

    def embed(self, group: int, codes: torch.Tensor) -> torch.Tensor:
        """Codes of group `group` (1..14) [B, T] -> input rows [B, T, Hc] (private table, then projection). The
        table may be kept as stored (a quantized model's, e.g. bf16): its rows are cast to the compute dtype."""
        rows = self.model.codec_embedding[group - 1](codes).to(self.model.norm.weight.dtype)
        return self.small_to_mtp_projection(rows)

    def forward(self, x: torch.Tensor, start: int, head: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Projected rows [B, T, Hc] at positions start.. -> logits of LM head `head` [B, T, Vp]."""
        return self.lm_head[head](self.model(x, start, mask))

    def prefill_rows(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor) -> torch.Tensor:
        """[h, C(code 0)] -> the two projected prefill rows [B, 2, Hc]."""
        return self.small_to_mtp_projection(torch.cat([talker_hidden, code0_embed], dim=1))
