"""Speaking with nothing but what pip installs (issue #36): no espeak-ng program on PATH, no espeak-ng library loaded.

Each test runs a child Python whose PATH is an empty folder (so neither `espeak-ng` nor any other program can be
run) and which, after speaking, reads its own /proc/self/maps to prove that no espeak-ng library was loaded
either. The model with a pip-only front end is the training candidate (models/recipes/demo/candidate, hibari-g2p)
until it ships as the bundled demo model; the bundled model of today reads espeak-ng's phonemes, and without them
it must stop with one line that says what is missing and how to get it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "models" / "assets" / "demo"
CANDIDATE = ROOT / "models" / "recipes" / "demo" / "candidate"
PIP_ONLY = {"hibari-g2p", "graphemes"}  # front ends that need no program or library outside pip
FOX = "The quick brown fox jumps over the lazy dog."

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").is_file(),
                                reason="reads /proc/self/maps to see which libraries were loaded (Linux only)")

CHILD = r"""
import json, shutil, sys
from leapvox.app.cli import main
argv = json.loads(sys.argv[1])
found = shutil.which("espeak-ng")
try:
    rc = main(argv)
except SystemExit as e:
    rc = e.code
maps = open("/proc/self/maps").read()
print(json.dumps({"rc": rc, "which": found, "espeak_loaded": "espeak" in maps}), file=sys.stderr)
"""


def frontend_of(model: Path) -> str | None:
    return json.loads((model / "config.json").read_text()).get("leapvox_text_frontend")


def pip_only_model() -> Path | None:
    for model in (BUNDLED, CANDIDATE):
        if (model / "config.json").is_file() and frontend_of(model) in PIP_ONLY:
            return model
    return None


def speak_without_espeak(tmp_path: Path, argv: list[str]) -> tuple[dict, str]:
    """Run `leapvox <argv>` in a child whose PATH is an empty folder; return its report and its stderr."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv)], capture_output=True, text=True,
                       env={"PATH": str(empty), "HOME": str(tmp_path), "LEAPVOX_HOME": str(tmp_path / "home"),
                            "OMP_NUM_THREADS": "1"}, timeout=600)
    *lines, last = r.stderr.strip().splitlines()
    return json.loads(last), "\n".join(lines)


@pytest.mark.skipif(pip_only_model() is None, reason="neither the bundled demo model nor a training candidate "
                                                     "(models/recipes/demo/candidate) has a pip-only front end")
def test_a_pip_only_model_speaks_with_no_espeak_ng_program_or_library(tmp_path):
    pytest.importorskip("hibari", reason="hibari-tts (a pip package; leapvox[hibari]) is not installed")
    model = pip_only_model()
    out = tmp_path / "fox.wav"
    report, err = speak_without_espeak(tmp_path, ["speak", FOX, "--model", str(model), "-o", str(out)])
    assert report["which"] is None, "the child could still find an espeak-ng program"
    assert report["rc"] == 0, err
    assert not report["espeak_loaded"], "an espeak-ng library was loaded while speaking"
    with wave.open(str(out)) as w:
        seconds = w.getnframes() / w.getframerate()
    assert 1.0 < seconds < 12.0, f"{seconds:.2f} s of audio for a nine-word sentence"
    assert "(eos)" in err, f"the utterance did not stop on its own: {err}"


@pytest.mark.skipif(frontend_of(BUNDLED) != "espeak-ng-ipa",
                    reason="the bundled demo model no longer reads espeak-ng's phonemes")
def test_the_espeak_trained_model_says_in_one_line_what_is_missing(tmp_path):
    report, err = speak_without_espeak(tmp_path, ["speak", FOX, "-o", str(tmp_path / "fox.wav")])
    assert report["rc"] not in (0, None)
    assert "Traceback" not in err
    assert "espeak-ng" in err and "install" in err, err
    assert not (tmp_path / "fox.wav").exists()
