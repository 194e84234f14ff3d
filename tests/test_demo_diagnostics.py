"""The predictor diagnostic's codec-space error (`leapvox recipe demo wer --what predictor`), on a hand-sized codec."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from leapvox.models.frontend import CANONICAL
from leapvox.models.recipes.demo.quality import codec_space_error


def test_codec_space_error_follows_each_code_by_hand():
    # two codebooks in a 2-D space; one utterance of two frames
    codec = SimpleNamespace(codebooks=[torch.tensor([[0.0, 0.0], [2.0, 0.0]]),
                                       torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, -1.0]])])
    split = {"codes": torch.tensor([[1, 1], [0, 2]], dtype=torch.int16), "offsets": torch.tensor([0, 2]),
             "sentence": torch.tensor([0]), "speed": torch.tensor([CANONICAL[0]]),
             "pitch": torch.tensor([CANONICAL[1]])}
    predicted = [torch.tensor([[1, 2], [0, 2]])]  # frame 0's code 1 wrong (its codeword points away), frame 1's right
    # targets (2, 1) and (0, -1); code 0 alone: (2, 0) and (0, 0) -> errors 1 and 1; with code 1: (2, -1) -> 4,
    # (0, -1) -> 0
    assert codec_space_error(predicted, split, codec) == {"frames": 2, "error_after_code": [1.0, 2.0],
                                                          "match": [0.5]}
    assert codec_space_error(predicted, split, SimpleNamespace()) is None  # a codec without one codeword space
