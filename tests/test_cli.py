"""`leapvox` CLI: exit codes, stdout purity, one-line errors, atomic writes, damaged checkpoints."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from safetensors.torch import load_file, save_file

from leapvox.app.cli import main
from leapvox.models.files import write_bytes_atomic

from .conftest import FIXTURES

MODEL = FIXTURES / "tiny-0b6"
FAST = ["--max-frames", "3", "--greedy"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_speak_writes_wav(tmp_path, capsys):
    out = tmp_path / "x.wav"
    code, stdout, err = run(capsys, "speak", "Hello world.", "-o", out, "--model", MODEL, *FAST, "--codes",
                            tmp_path / "codes.json")
    assert code == 0 and stdout == ""
    audio, sr = sf.read(out)
    codes = json.loads((tmp_path / "codes.json").read_text())
    assert sr == 24000 and audio.ndim == 1 and len(audio) == 1920 * len(codes) and len(codes) <= 3
    assert "wrote" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codes.json", "x.wav"]  # no temp files left


def test_speak_into_a_file_decodes_in_steady_chunks_with_the_same_audio(tmp_path, capsysbinary, monkeypatch):
    """Into a file the first codec chunk is the steady size (no early audio to hand out; each codec call has a fixed
    cost); to standard output (perhaps a player) it stays small. The audio is the same bit for bit."""
    from leapvox.engine.streaming import MAX_CHUNK_FRAMES
    from leapvox.engine.synthesis import Synthesizer

    seen, real = [], Synthesizer.stream

    def spy(self, *a, **k):
        seen.append(k.get("first_chunk"))
        return real(self, *a, **k)

    monkeypatch.setattr(Synthesizer, "stream", spy)
    out, same = tmp_path / "x.wav", ["--model", str(MODEL), "--max-frames", "6", "--seed", "3"]
    assert main(["speak", "Hello world.", "-o", str(out), *same]) == 0
    capsysbinary.readouterr()
    assert main(["speak", "Hello world.", "-o", "-", *same]) == 0
    piped = capsysbinary.readouterr().out
    assert seen == [MAX_CHUNK_FRAMES, None]
    file_audio, _ = sf.read(out, dtype="int16")
    pipe_audio, _ = sf.read(io.BytesIO(piped), dtype="int16")
    assert len(file_audio) == 6 * 1920 and np.array_equal(file_audio, pipe_audio)


def test_stdout_is_pure_wav_and_stdin_text():
    proc = subprocess.run(
        [sys.executable, "-m", "leapvox.app.cli", "speak", "-", "-o", "-", "--model", str(MODEL), *FAST],
        input=b"Hello from a pipe.",
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    audio, sr = sf.read(io.BytesIO(proc.stdout))
    assert proc.stdout[:4] == b"RIFF" and sr == 24000 and len(audio) % 1920 == 0 and len(audio) > 0
    assert b"wrote standard output" in proc.stderr


def test_help_is_fast_path_and_exits_zero():
    proc = subprocess.run(["leapvox", "speak", "--help"], capture_output=True, timeout=60)
    assert proc.returncode == 0 and b"--max-frames" in proc.stdout


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["speak", "   ", "-o", "{tmp}/x.wav", "--model", MODEL], "text is empty"),
        (["speak", "Hi.", "-o", "{tmp}/x.wav", "--model", MODEL, "--speaker", "nobody"], "unknown speaker"),
        (["speak", "Hi.", "-o", "{tmp}/x.wav", "--model", MODEL, "--language", "klingon"], "unknown language"),
        (["speak", "Hi.", "-o", "{tmp}/x.wav", "--model", "{tmp}/nowhere"], "no model at"),
        (["speak", "Hi.", "-o", "{tmp}/x.wav", "--model", "{tmp}"], "not a Qwen3-TTS checkpoint"),
        (["speak", "Hi.", "--model", MODEL], "no output given"),
        (["speak", "Hi.", "-o", "{tmp}/no/such/dir/x.wav", "--model", MODEL], "folder does not exist"),
        (["speak", "Hi.", "-o", "{tmp}/x.wav", "--model", MODEL, "--temperature", "-1"], "temperature"),
        (["speak", "-o", "{tmp}/x.wav", "--model", MODEL], "no text given"),
        (["speakers", "--model", "{tmp}/nowhere"], "no model at"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, capsys, argv, needle):
    argv = [str(a).replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert needle in one_line_error(err)
    assert not (tmp_path / "x.wav").exists()


def _copy_model(tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(MODEL, dst)
    return dst


def _speak_with(tmp_path, capsys, model):
    return run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", model, *FAST)


def test_truncated_safetensors_is_one_line_exit_1(tmp_path, capsys):
    model = _copy_model(tmp_path)
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    code, _, err = _speak_with(tmp_path, capsys, model)
    line = one_line_error(err)
    assert code == 1 and "model.safetensors is damaged" in line


def test_garbage_safetensors_is_one_line_exit_1(tmp_path, capsys):
    model = _copy_model(tmp_path)
    (model / "speech_tokenizer" / "model.safetensors").write_bytes(b"not a safetensors file at all")
    code, _, err = _speak_with(tmp_path, capsys, model)
    assert code == 1 and "damaged" in one_line_error(err)


def test_wrong_shape_and_missing_key_name_the_key_and_file(tmp_path, capsys):
    model = _copy_model(tmp_path)
    f = model / "model.safetensors"
    tensors = load_file(f)
    key = "talker.codec_head.weight"
    tensors[key] = tensors[key][:, :-1].contiguous()
    save_file(tensors, f)
    code, _, err = _speak_with(tmp_path, capsys, model)
    line = one_line_error(err)
    assert code == 1 and key in line and "model.safetensors" in line and "shape" in line

    del tensors[key]
    save_file(tensors, f)
    code, _, err = _speak_with(tmp_path, capsys, model)
    line = one_line_error(err)
    assert code == 1 and key in line and "missing" in line


def test_unexpected_key_is_reported(tmp_path, capsys):
    model = _copy_model(tmp_path)
    f = model / "model.safetensors"
    tensors = load_file(f)
    tensors["talker.extra.weight"] = tensors["talker.codec_head.weight"][:2].clone()
    save_file(tensors, f)
    code, _, err = _speak_with(tmp_path, capsys, model)
    assert code == 1 and "unexpected tensor talker.extra.weight" in one_line_error(err)


def test_speakers_lists_speakers_and_languages(capsys):
    code, out, _ = run(capsys, "speakers", "--model", MODEL)
    assert code == 0
    assert "ryan" in out and "eric" in out and "sichuan_dialect" in out and "auto" in out


def test_instruct_on_small_model_warns(tmp_path, capsys):
    code, _, err = run(capsys, "speak", "Hi.", "-o", tmp_path / "x.wav", "--model", MODEL, *FAST,
                       "--instruct", "Speak slowly.")
    assert code == 0 and "warning:" in err and "instruct" in err


def test_atomic_write_keeps_old_file_on_interrupt(tmp_path, monkeypatch):
    target = tmp_path / "keep.wav"
    target.write_bytes(b"old")

    def boom(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr("os.fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        write_bytes_atomic(target, b"new data")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.wav"]


def test_atomic_write_gives_the_mode_a_plain_write_would(tmp_path):
    """mkstemp makes owner-only files; a WAV the user asked for gets 0666 less the umask, like open() gives."""
    import os

    old = os.umask(0o022)
    try:
        write_bytes_atomic(tmp_path / "a.wav", b"x")
        (tmp_path / "b.wav").write_bytes(b"x")
        os.umask(0o077)
        write_bytes_atomic(tmp_path / "c.wav", b"x")
    finally:
        os.umask(old)
    mode = {n: (tmp_path / n).stat().st_mode & 0o777 for n in ("a.wav", "b.wav", "c.wav")}
    assert mode == {"a.wav": 0o644, "b.wav": 0o644, "c.wav": 0o600}


def test_demo_wer_true_codes_misuse_is_a_one_line_error(tmp_path, capsys):
    code, out, err = run(capsys, "recipe", "demo", "wer", "--data", str(tmp_path), "--what", "predictor",
                         "--model", "demo", "--true-codes", "16")
    assert code == 2 and "--true-codes 16 is out of range" in one_line_error(err)
    code, out, err = run(capsys, "recipe", "demo", "wer", "--data", str(tmp_path), "--what", "codec",
                         "--true-codes", "3")
    assert code == 2 and "hint: add --what predictor" in one_line_error(err)


def test_demo_wer_out_is_checked_before_any_scoring(tmp_path, capsys):
    """--out in a folder that does not exist, or naming a folder: a one-line error before the data is even read."""
    for out in (tmp_path / "missing" / "wer.json", tmp_path):
        code, _, err = run(capsys, "recipe", "demo", "wer", "--data", str(tmp_path / "no-data"), "--what", "codec",
                           "--out", str(out))
        assert code == 2 and f"cannot write {out}" in one_line_error(err)
    assert not (tmp_path / "missing").exists()


def test_demo_wer_mode_none_runs_only_the_predictor_diagnostic(tmp_path, capsys, monkeypatch):
    """--mode none: the predictor diagnostic without the model's own synthesis (which would double the run)."""
    import numpy as np
    import torch

    from leapvox.app.recipes import demo as demo_cmd
    from leapvox.models.recipes.demo import quality

    code, out, err = run(capsys, "recipe", "demo", "wer", "--data", str(tmp_path), "--what", "codec", "--mode", "none")
    assert code == 2 and "hint: --what predictor --mode none" in one_line_error(err)
    code, out, err = run(capsys, "recipe", "demo", "wer", "--data", str(tmp_path), "--what", "predictor",
                         "--model", "demo", "--mode", "none", "--mode", "ar")
    assert code == 2 and "--mode none" in one_line_error(err)

    torch.save({"text": ["one two", "three four"]}, tmp_path / "test.pt")
    scored = []

    class Loaded:
        defaults = codec = None  # _sampling is replaced below

        def synthesizer(self):
            return None

    def fake_codes(loaded, split, n, params, true_codes):
        return [torch.zeros(3, 16, dtype=torch.long)] * n

    def fake_score(texts, codes, codec, workers):
        scored.append(len(codes))
        n = len(texts)
        return quality.WerResult(list(texts), list(texts), np.zeros(n, dtype=int), np.full(n, 2), (0, 0, 0))

    def no_synthesis(*a, **k):
        raise AssertionError("--mode none must not synthesise")

    monkeypatch.setattr(demo_cmd, "_load_for_wer", lambda name, weights: Loaded())
    monkeypatch.setattr(demo_cmd, "_sampling", lambda opts, args: type("O", (), {"predictor": None})())
    monkeypatch.setattr(quality, "teacher_forced_codes", fake_codes)
    monkeypatch.setattr(quality, "score_codes", fake_score)
    monkeypatch.setattr(quality, "score_model", no_synthesis)
    monkeypatch.setattr(quality, "canonical_frames", no_synthesis)
    code, out, err = run(capsys, "recipe", "demo", "wer", "--data", str(tmp_path), "--what", "predictor",
                         "--model", "demo", "--mode", "none")
    assert code == 0, err
    report = json.loads(out)
    assert scored == [2] and "demo:predictor" in report and not any(k.startswith("demo:ar") for k in report)
