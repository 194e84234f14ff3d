"""Saved voices: a Base model's cloned voices, encoded once (`leapvox voices add`) and stored in leapvox's data
folder, one safetensors file per voice under a folder per model (`voices/<model key>/<name>.safetensors`).

A voice file holds the x-vector (`xvector` [H] float32) and, for an ICL voice, the reference codes (`ref_codes`
[T, 16] int64) and the clip's transcript (metadata `ref_text`); metadata `clip` says how the clip was read: "official"
(as the official package reads it) or "cleaned" (`--ref-clean`; files without the key predate it and were cleaned).
The model key is `paths.model_key` of the checkpoint folder (a Hub snapshot's folder names its commit): a voice
belongs to the encoders that made it.

Names are checked against NAME before any path is built from them; writes are atomic; a damaged file is one
`VoiceError` line. The public functions (list_voices, voice_info, load_voice, save_voice, remove_voice) are what the
CLI, the TUI and the server use.
"""

from __future__ import annotations

import errno
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from leapvox.engine.errors import InputError, LeapvoxError

from .files import write_bytes_atomic
from .paths import leapvox_dirs, model_key

__all__ = ["NAME", "VoiceError", "VoiceInfo", "check_name", "check_writable", "list_voices", "load_voice", "model_key",
           "remove_voice", "save_voice", "voice_info", "voices_dir"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # letters, digits, - and _; no dots, slashes or spaces
FORMAT = "leapvox-voice/1"
KEY = re.compile(r"^[\w.-]+-[0-9a-f]{10}$")  # paths.model_key's shape


class VoiceError(LeapvoxError):
    """A saved voice that cannot be used: missing, damaged, or made for other encoders."""


class VoiceNotFound(VoiceError):
    exit_code = 2


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    path: Path
    mode: str  # "icl" (codes + transcript) or "xvector" (x-vector only)
    ref_text: str | None
    frames: int  # reference code frames (0 for x-vector only)
    hidden: int  # x-vector width = the model's talker width
    created: str  # UTC, ISO 8601
    source: str  # the clip's file name, as given when added
    cleaned: bool = False  # made with --ref-clean (trimmed, levelled, silence appended), not the official reading

    @property
    def seconds(self) -> float:
        return self.frames / 12.5


def check_name(name: str) -> str:
    """`name` when it is a valid voice name, else an InputError (exit 2); nothing touches the file system first."""
    if not isinstance(name, str) or not NAME.match(name):
        raise InputError(f"invalid voice name {name!r}",
                         hint="use 1-64 letters, digits, '-' or '_', starting with a letter or digit")
    return name


def voices_dir(key: str) -> Path:
    """The folder of one model's voices (it may not exist yet)."""
    if not KEY.match(key):
        raise ValueError(f"not a model key: {key!r}")
    return leapvox_dirs()["data"] / "voices" / key


def _path(key: str, name: str) -> Path:
    return voices_dir(key) / f"{check_name(name)}.safetensors"


def _damaged(path: Path, why: str) -> VoiceError:
    return VoiceError(f"the saved voice {path.stem!r} is damaged ({path}: {why})",
                      hint=f"remove it with 'leapvox voices rm {path.stem}' and add it again")


def _read(path: Path, hidden: int | None = None):
    """(tensors, metadata) of a voice file, checked; VoiceError when it is damaged or of another width."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a mapping
    except FileNotFoundError:
        raise VoiceNotFound(f"no saved voice {path.stem!r} for this model",
                            hint="see 'leapvox voices list', or add one with 'leapvox voices add'") from None
    except Exception as e:  # safetensors raises its own types for bad headers and short files
        raise _damaged(path, f"not a voice file: {e}") from None
    if meta.get("format") != FORMAT:
        raise _damaged(path, f"format {meta.get('format')!r}, expected {FORMAT!r}")
    x = tensors.get("xvector")
    if x is None or x.dim() != 1 or not x.is_floating_point() or not bool(x.isfinite().all()):
        raise _damaged(path, "no usable x-vector")
    codes = tensors.get("ref_codes")
    if codes is not None and (codes.dim() != 2 or codes.shape[1] != 16 or codes.dtype.is_floating_point
                              or codes.shape[0] == 0 or int(codes.min()) < 0 or int(codes.max()) >= 2048):
        raise _damaged(path, "reference codes are not [frames, 16] codes in 0..2047")
    if codes is not None and not meta.get("ref_text"):
        raise _damaged(path, "reference codes without a transcript")
    if hidden is not None and x.shape[0] != hidden:
        raise VoiceError(f"the saved voice {path.stem!r} has a {x.shape[0]}-wide x-vector; this model needs {hidden}",
                         hint="add the voice again for this model")
    return tensors, meta


def _info(path: Path, tensors: dict, meta: dict) -> VoiceInfo:
    codes = tensors.get("ref_codes")
    return VoiceInfo(path.stem, path, "icl" if codes is not None else "xvector", meta.get("ref_text") or None,
                     0 if codes is None else int(codes.shape[0]), int(tensors["xvector"].shape[0]),
                     meta.get("created", ""), meta.get("source", ""), meta.get("clip", "cleaned") == "cleaned")


def list_voices(key: str) -> list[VoiceInfo]:
    """The model's saved voices, by name. A damaged file is listed by name with mode "damaged"."""
    folder = voices_dir(key)
    out = []
    for p in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        if not NAME.match(p.stem):
            continue
        try:
            out.append(_info(p, *_read(p)))
        except VoiceError:
            out.append(VoiceInfo(p.stem, p, "damaged", None, 0, 0, "", ""))
    return out


def voice_info(key: str, name: str) -> VoiceInfo:
    path = _path(key, name)
    return _info(path, *_read(path))


def load_voice(key: str, name: str, hidden: int | None = None):
    """The saved voice `name` of model `key` as an engine ClonedVoice; `hidden` checks the x-vector's width."""
    from leapvox.engine.prompt import ClonedVoice

    tensors, meta = _read(_path(key, name), hidden)
    codes = tensors.get("ref_codes")
    ref_text = meta.get("ref_text") or None
    return ClonedVoice(tensors["xvector"].float(), None if codes is None else codes.long(), ref_text)


def _unwritable(what: str, e: OSError) -> VoiceError:
    hint = {errno.ENOSPC: "free some space"}.get(e.errno, "make it writable, or set LEAPVOX_HOME to a writable folder "
                                                  "(leapvox paths shows where voices go)")
    return VoiceError(f"cannot {what}: {e.strerror or e}", hint=hint)


def check_writable(key: str) -> Path:
    """The model's voice folder, made and checked to take a new file (before anything slow); a VoiceError (exit 1)
    when it cannot (a read-only LEAPVOX_HOME, say)."""
    folder = voices_dir(key)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise _unwritable(f"save voices in {folder}", e) from None
    return folder


def save_voice(key: str, name: str, voice, source: str = "", overwrite: bool = False, cleaned: bool = False) -> Path:
    """Store `voice` (an engine ClonedVoice) as `name` for model `key`, atomically; `cleaned`: its clip was read with
    --ref-clean. An InputError when the name is taken and not `overwrite`; a VoiceError when it cannot be written."""
    from safetensors.torch import save

    path = _path(key, name)
    if path.exists() and not overwrite:
        raise InputError(f"a voice named {name!r} exists for this model",
                         hint=f"choose another name, or 'leapvox voices rm {name}' first")
    tensors = {"xvector": voice.xvector.detach().float().cpu().contiguous()}
    meta = {"format": FORMAT, "name": name, "source": source, "clip": "cleaned" if cleaned else "official",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if voice.icl:
        tensors["ref_codes"] = voice.ref_codes.detach().long().cpu().contiguous()
        meta["ref_text"] = voice.ref_text
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_bytes_atomic(path, save(tensors, metadata=meta))
    except OSError as e:
        raise _unwritable(f"save the voice {name!r} to {path}", e) from None


def remove_voice(key: str, name: str) -> Path:
    """Delete the saved voice; VoiceNotFound (exit 2) when there is none."""
    path = _path(key, name)
    try:
        path.unlink()
    except FileNotFoundError:
        raise VoiceNotFound(f"no saved voice {name!r} for this model", hint="see 'leapvox voices list'") from None
    except OSError as e:
        raise _unwritable(f"remove {path}", e) from None
    return path
