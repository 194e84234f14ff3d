"""The talker's KV cache policies: `FullCache` (ar, spec: every frame row stays) and `RingCache` (windowed).

Both sit on the talker's own preallocated cache (`DecoderStack.setup_cache`) and differ only in which slot a frame
row is written to and which slots a step reads.

`windowed` (WAND-style): the talker attends globally to the prompt and to a sliding window of frames.
Cache layout, per layer ([B, n_kv, L + W, D], allocated once):
  slots 0 .. L-1        the prompt rows (role, control, language, speaker and, non-streaming, all text rows)
  slots L .. L+W-1      a ring of the last W frame rows: frame row k lives at slot L + (k mod W)

Frame row k is rotated once, at its absolute position L + k, when it is written; evicting it is overwriting its
slot, with no re-rotation of the survivors, so relative positions stay those of plain `ar`. Step k's query sits
at position L + k and sees the prompt plus rows max(0, k-W+1) .. k. Every step reads the same L + W slots under
a boolean mask (static shapes), so the per-step cost and the memory are flat whatever the length.

Streaming text layout: the text rows riding on frames are summed into the frame rows, so they age out of the
window with their frames, as in WAND; only the first text token (in the prompt) stays global.

On a model trained with full attention this is an approximation; it is exact while the window holds every frame
(W >= frames generated). The default window is options.DEFAULT_WINDOW (48 frames; the reason is noted there).
"""

from __future__ import annotations

import torch

from leapvox.engine.nets.talker import Talker


class FullCache:
    """ar's talker cache: every row stays. Prompt rows at slots 0..L-1, frame row k at slot and position L+k."""

    def __init__(self, talker: Talker, prefix: int, max_frames: int):
        self.talker, self.prefix = talker, prefix
        talker.model.setup_cache(prefix + max_frames, zeroed=False)  # steps read only the rows written so far

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.talker(x, 0)

    def step(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame row k [1, 1, H] -> (hidden, code-0 logits) of the next frame."""
        return self.talker(x, self.prefix + k)

    def span(self, k: int) -> int:
        """Keys attended by step k (= rows held after it)."""
        return self.prefix + k + 1

    def kv_bytes(self, k: int) -> int:
        return self.talker.model.kv_bytes(self.span(k))


def window_mask(prefix: int, window: int, k: int, device=None) -> torch.Tensor:
    """Boolean [1, L+W] mask (True = may attend) of step k: the prompt slots and the ring slots written so far."""
    ring = torch.arange(window, device=device) <= k  # all True once the ring has wrapped
    return torch.cat([torch.ones(prefix, dtype=torch.bool, device=device), ring])[None]


class RingCache:
    """The talker steps of `windowed`: prompt rows in fixed slots, frame rows in a ring of `window` slots."""

    def __init__(self, talker: Talker, prefix: int, window: int):
        self.talker, self.prefix, self.window = talker, prefix, window
        talker.model.setup_cache(prefix + window)  # reuses a bigger cache (zeroing slots [0, L+W), all it reads)

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.talker(x, 0)

    def slot(self, k: int) -> int:
        return self.prefix + k % self.window

    def step(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame row k [1, 1, H] -> (hidden, code-0 logits) of the next frame."""
        mask = window_mask(self.prefix, self.window, k, x.device)
        h = self.talker.model.forward_ring(x, self.slot(k), self.prefix + k, mask, self.prefix + self.window)
        return h, self.talker.codec_head(h)

    def span(self, k: int) -> int:
        """Keys attended by step k (= rows held after it): the prompt plus min(k+1, W) frame rows."""
        return self.prefix + min(k + 1, self.window)

    def kv_bytes(self, k: int) -> int:
        return self.talker.model.kv_bytes(self.span(k))
