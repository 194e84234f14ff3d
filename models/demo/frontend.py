"""Text front end of the demo model: English text -> espeak-ng IPA, exactly as the training data was made.

Needs the espeak-ng program (Debian/Ubuntu: `apt install espeak-ng`; macOS: `brew install espeak-ng`).
"""

from __future__ import annotations

import shutil
import subprocess

from leapvox.engine.errors import LeapvoxError

from .data import CANONICAL, VOICE, phoneme_string


def ipa(text: str) -> str:
    """The phoneme string the demo model was trained on, for `text` (canonical speed and pitch)."""
    if shutil.which("espeak-ng") is None:
        raise LeapvoxError(
            "the demo model reads phonemes from espeak-ng, which is not installed",
            hint="install it (apt install espeak-ng / brew install espeak-ng), or use --model with a Qwen3-TTS model",
        )
    cmd = ["espeak-ng", "-q", "-v", VOICE, "-s", str(CANONICAL[0]), "-p", str(CANONICAL[1]), "--ipa", "--", text]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    clauses = [line.strip() for line in out.splitlines() if line.strip()]
    return phoneme_string(text, clauses)[0]
