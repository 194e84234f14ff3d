"""Load a Qwen3-TTS 12 Hz checkpoint folder (Hugging Face layout) into engine networks: CustomVoice, VoiceDesign or
Base (config.json's tts_model_type; Base adds the speaker encoder and uses the speech tokenizer's encoder to clone).

Weights are read with safetensors (memory-mapped, never pickle) into modules built on the meta device,
by their exact official key names. Anything missing, unexpected or mis-shaped is one clear error naming the
key and the file.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from leapvox.engine.config import TTSConfig
from leapvox.engine.errors import CheckpointError
from leapvox.engine.fast.codec_ops import FastCodecOps
from leapvox.engine.fast.fused import fuse_decoder_layers, fuse_fp32_layers
from leapvox.engine.fast.quant import (
    NARROW_HIDDEN,
    QUANT_FORMATS,
    WEIGHT_FORMATS,
    lowers_codec,
    quantize_model,
    resolve_weights,
)
from leapvox.engine.nets.codec import CodecConfig, CodecDecoder
from leapvox.engine.nets.demo_codec import DemoCodec, DemoCodecConfig
from leapvox.engine.nets.talker import TTSModel
from leapvox.engine.options import AUTO, SynthesisOptions
from leapvox.engine.prompt import ClonedVoice
from leapvox.engine.sampling import SamplingParams
from leapvox.engine.spec import DraftPlan
from leapvox.engine.synthesis import Synthesizer

from .catalog import ASSETS
from .frontend import text_frontend
from .paths import check_folder
from .spec_assets import load_offsets, load_tree
from .tokenizer import TextTokenizer

_INIT_LOCK = threading.Lock()


@contextlib.contextmanager
def skeleton():
    """Build modules as shapes only (the meta device) whose weights a file fills next, without running torch.nn.init
    on them: a random init on meta goes through torch._refs, whose first call imports torch._dynamo (seconds, on the
    way to the first audio). The init functions are no-ops inside (their tensor returned); a lock keeps two threads'
    loads from restoring each other's patch."""
    init = torch.nn.init
    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    with _INIT_LOCK:
        saved = {n: getattr(init, n) for n in names}
        try:
            for n in names:
                setattr(init, n, _keep)
            with torch.device("meta"):
                yield
        finally:
            for n, f in saved.items():
                setattr(init, n, f)


def _keep(tensor, *args, **kwargs):
    return tensor


CODEC_PREFIX = "decoder."  # the speech tokenizer file also holds the encoder (Base models: cloning)
ENCODER_PREFIX = "encoder."
SPEAKER_PREFIX = "speaker_encoder."  # Base models' model.safetensors
MODEL_TYPES = ("custom_voice", "voice_design", "base")  # config.json tts_model_type values leapvox speaks with
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class LoadedModel:
    """A checkpoint's networks with what speaking needs: tokenizer, defaults, spec mode's draft plan, and the
    backend that runs the networks (None: the torch engine; models.load.load_model attaches a Core ML one)."""

    path: Path
    config: TTSConfig
    tts: TTSModel
    codec: nn.Module
    tokenizer: TextTokenizer
    defaults: SynthesisOptions
    sample_rate: int
    weights: str = "fp32"  # weight format: fp32, bf16, int8, w8a8, w4a8 or int4 (engine.fast.quant)
    plan: DraftPlan = field(default_factory=DraftPlan)  # spec mode's draft tree and trained offsets
    backend: object = None  # None = torch (engine.backend.TorchBackend); a coreml.runtime.CoreMLBackend for ane

    @property
    def backend_name(self) -> str:
        return getattr(self.backend, "name", "cpu")

    encoders: dict = field(default_factory=dict, compare=False, repr=False)  # Base: loaded on first clone()

    def synthesizer(self) -> Synthesizer:
        return Synthesizer(self.tts, self.codec, self.config, self.tokenizer, self.sample_rate, self.plan,
                           self.tokenizer.frontend, self.backend)

    @property
    def model_type(self) -> str:
        return self.config.tts_model_type

    def clone(self, wav: torch.Tensor, ref_text: str | None = None) -> ClonedVoice:
        """A Base model's voice from a prepared 24 kHz clip [N]: its x-vector, and with `ref_text` (ICL) its codes.
        The encoders (speaker encoder, speech-tokenizer encoder) load on the first call, in fp32."""
        if self.model_type != "base":
            raise CheckpointError(f"{self.path} is a {self.model_type} model; only Base models clone voices")
        if not self.encoders:
            self.encoders.update(load_encoders(self.path))
        xvector = self.encoders["speaker"].embed(wav).float()
        codes = self.encoders["speech"].encode(wav) if ref_text else None
        return ClonedVoice(xvector, codes, ref_text or None)


def draft_plan(folder: Path, hidden: int, backend: str = "cpu", device: str = "cpu") -> DraftPlan:
    """spec mode's trained offsets and calibrated tree for the model in `folder`, where they exist."""
    offsets, _ = load_offsets(folder, hidden)
    tree, _ = load_tree(folder, backend, device, offsets)
    return DraftPlan(tree, offsets)


class DamagedFileError(CheckpointError):
    """A checkpoint file missing, unreadable or not what config.json says (`path`). The hint suits a folder of the
    user's own, or the bundled model; models.load gives a model in the Hugging Face cache its own."""

    def __init__(self, message: str, path: Path, missing: bool = False):
        if ASSETS in Path(path).resolve().parents:
            hint = "reinstall leapvox to restore the bundled model"
        else:
            hint = (f"put the checkpoint's {path.name} in {path.parent}" if missing else
                    f"replace {path} with an intact copy of the checkpoint's file")
        super().__init__(message, hint)
        self.path = path


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedFileError(f"missing {path.name} in {path.parent}", path, missing=True) from None
    except (OSError, ValueError) as e:
        raise DamagedFileError(f"cannot read {path}: {e}", path) from None


def _weight_files(folder: Path, stem: str) -> list[Path]:
    index = folder / f"{stem}.safetensors.index.json"
    if index.is_file():
        return sorted({folder / f for f in read_json(index)["weight_map"].values()})
    single = folder / f"{stem}.safetensors"
    if not single.is_file():
        raise DamagedFileError(f"missing {single.name} in {folder}", single, missing=True)
    return [single]


def read_tensors(files: list[Path], prefix: str = "") -> dict[str, tuple[torch.Tensor, Path]]:
    """Tensors whose key starts with `prefix` (stripped), each with the file it came from.

    The tensors are memory-mapped, each through its own mapping: a tensor that is converted and dropped (int8
    quantization, a dtype change) releases its pages, so loading never holds a second copy of the whole file."""
    from safetensors import safe_open

    out = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                keys = [k for k in st.keys() if k.startswith(prefix)]  # noqa: SIM118 - not a mapping
            for key in keys:
                with safe_open(str(f), framework="pt") as st:
                    out[key[len(prefix) :]] = (st.get_tensor(key), f)
        except Exception as e:  # safetensors raises its own error types for bad headers and short files
            raise DamagedFileError(f"{f} is damaged (truncated or not a safetensors file): {e}", f) from None
    return out


def load_weights(module: nn.Module, tensors: dict[str, tuple[torch.Tensor, Path]], prefix: str, dtype) -> None:
    """Assign `tensors` to a meta-device `module` by exact key, checking names and shapes first."""
    expected = module.state_dict()
    where = sorted({str(f) for _, f in tensors.values()}) or ["(no file)"]
    missing = [k for k in expected if k not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DamagedFileError(f"tensor {prefix}{missing[0]} is missing from {where[0]}{more} (config.json names it)",
                               Path(where[0]))
    unexpected = [k for k in tensors if k not in expected]
    if unexpected:
        raise CheckpointError(
            f"unexpected tensor {prefix}{unexpected[0]} in {tensors[unexpected[0]][1]}",
            hint="the file does not match config.json (wrong model type or size?)",
        )
    state = {}
    for key, ref in expected.items():
        t, f = tensors[key]
        if tuple(t.shape) != tuple(ref.shape):
            raise DamagedFileError(
                f"tensor {prefix}{key} in {f} has shape {list(t.shape)}, config.json implies {list(ref.shape)}", f)
        state[key] = t.to(dtype) if dtype is not None and t.is_floating_point() else t  # None: as stored
    module.load_state_dict(state, strict=True, assign=True)


def generation_defaults(folder: Path) -> SynthesisOptions:
    """SynthesisOptions seeded from generation_config.json (falling back to the reference's hard defaults)."""
    path = folder / "generation_config.json"
    g = read_json(path) if path.is_file() else {}
    talker = SamplingParams(
        do_sample=bool(g.get("do_sample", True)),
        temperature=float(g.get("temperature", 0.9)),
        top_k=int(g.get("top_k", 50)),
        top_p=float(g.get("top_p", 1.0)),
    )
    predictor = SamplingParams(
        do_sample=bool(g.get("subtalker_dosample", True)),
        temperature=float(g.get("subtalker_temperature", 0.9)),
        top_k=int(g.get("subtalker_top_k", 50)),
        top_p=float(g.get("subtalker_top_p", 1.0)),
    )
    max_frames = int(g.get("max_new_tokens", 2048)) - 1
    return SynthesisOptions(
        talker=talker,
        predictor=predictor,
        repetition_penalty=float(g.get("repetition_penalty", 1.05)),
        max_frames=max_frames,
    )


def model_defaults(folder: Path, cfg: TTSConfig) -> SynthesisOptions:
    """The options a model speaks with unless told otherwise: generation_config.json, the window it was adapted to
    (`leapvox recipe window`), its first speaker. Needs only the folder's small JSON files."""
    defaults = generation_defaults(folder)
    if cfg.leapvox_window:  # adapted: windowed mode runs at the window it learned
        defaults = replace(defaults, window=cfg.leapvox_window)
    return replace(defaults, speaker=next(iter(cfg.talker.spk_id), None))


def load_config(folder: Path) -> TTSConfig:
    raw = read_json(folder / "config.json")
    try:
        cfg = TTSConfig.from_dict(raw)
    except TypeError as e:
        raise CheckpointError(f"config.json in {folder} lacks a required value: {e}") from None
    if cfg.tts_model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{folder} is a {cfg.tts_model_type!r} model; leapvox speaks with {', '.join(MODEL_TYPES)} models",
            hint="use a Qwen3-TTS 12 Hz CustomVoice, VoiceDesign or Base checkpoint",
        )
    if cfg.tts_model_type == "base" and not isinstance(raw.get("speaker_encoder_config"), dict):
        raise DamagedFileError(f"config.json in {folder} is a Base model's but has no speaker_encoder_config",
                               folder / "config.json")
    return cfg


def load_encoders(folder: Path) -> dict[str, nn.Module]:
    """A Base model's speaker encoder (model.safetensors, `speaker_encoder.*`) and speech-tokenizer encoder
    (speech_tokenizer/model.safetensors, `encoder.*`), fp32, on the CPU."""
    from leapvox.engine.nets.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig
    from leapvox.engine.nets.speech_encoder import SpeechEncoder, SpeechEncoderConfig

    speech = folder / "speech_tokenizer"
    try:
        spk_cfg = SpeakerEncoderConfig.from_dict(read_json(folder / "config.json").get("speaker_encoder_config") or {})
        enc_cfg = SpeechEncoderConfig.from_dict(read_json(speech / "config.json"))
        with skeleton():
            speaker, encoder = SpeakerEncoder(spk_cfg), SpeechEncoder(enc_cfg)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"the encoder configs in {folder} are not usable: {e}") from None
    load_weights(speaker, read_tensors(_weight_files(folder, "model"), SPEAKER_PREFIX), SPEAKER_PREFIX, torch.float32)
    load_weights(encoder, read_tensors(_weight_files(speech, "model"), ENCODER_PREFIX), ENCODER_PREFIX,
                 torch.float32)
    return {"speaker": speaker.eval(), "speech": encoder.eval()}


def load_codec(speech: Path, dtype) -> tuple[nn.Module, int]:
    """The speech tokenizer's decoder named by speech_tokenizer/config.json: Qwen's 12 Hz codec or the demo codec."""
    raw = read_json(speech / "config.json")
    kind = raw.get("model_type", "qwen3_tts_tokenizer_12hz")
    try:
        if kind == "qwen3_tts_tokenizer_12hz":
            cfg = CodecConfig.from_dict(raw)
            with skeleton():
                codec = CodecDecoder(cfg, FastCodecOps())  # its products on oneDNN and leapvox's kernels
            prefix, rate = CODEC_PREFIX, cfg.output_sample_rate
        elif kind == "leapvox_demo_codec":
            cfg = DemoCodecConfig.from_dict(raw)
            codec, prefix, rate = DemoCodec(cfg), "", cfg.sample_rate  # small; its filterbank is computed here
            dtype = torch.float32  # in every format: its computed filterbank is fp32, and Griffin-Lim wants the bits
        else:
            raise CheckpointError(f"unsupported speech tokenizer type {kind!r} in {speech}")
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{speech / 'config.json'} is not usable: {e}") from None
    load_weights(codec, read_tensors(_weight_files(speech, "model"), prefix), prefix, dtype)
    return codec, rate


def weight_formats() -> list[str]:
    """The weight formats `load_model` (and `--weights`) accept."""
    return list(WEIGHT_FORMATS)


def load_checkpoint(path: str | Path, weights: str = "fp32", device: str = "cpu",
                    config: TTSConfig | None = None, defaults: SynthesisOptions | None = None) -> LoadedModel:
    """Load config, weights, text tokenizer, codec decoder and spec assets from a checkpoint folder.

    `weights` is a weight format: fp32, bf16, int8, w8a8, w4a8 or int4 (the talker's and predictor's linears quantized
    from the file's weights, fp32 for the rest; engine.fast.quant), or auto (quant.resolve_weights). The model
    runs on the torch engine; for a ready model by name with a backend, use models.load.load_model. `config` and
    `defaults`, where the caller read them already (models.load.ModelFolder), are not read again."""
    folder = check_folder(Path(path))
    weights = {"float32": "fp32", "bfloat16": "bf16"}.get(weights, weights)
    if weights != AUTO and weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weights!r}; choose from {', '.join(WEIGHT_FORMATS)}")
    cfg = config or load_config(folder)  # `config`: read already (models.load.open_model)
    weights = resolve_weights(weights, cfg.talker.hidden_size)
    dtype = torch.float32 if weights in QUANT_FORMATS else DTYPES[weights]
    speech = folder / "speech_tokenizer"
    with skeleton():
        tts = TTSModel(cfg.talker)
    tensors = read_tensors(_weight_files(folder, "model"))
    if cfg.tts_model_type == "base":  # the speaker encoder loads with the other encoder, on the first clone
        tensors = {k: v for k, v in tensors.items() if not k.startswith(SPEAKER_PREFIX)}
    if weights in QUANT_FORMATS:  # quantize from the file's own dtype (no fp32 copy of each weight), then fp32 the rest
        load_weights(tts, tensors, "", None)
        del tensors
        quantize_model(tts, weights)
        # the big lookup tables stay as stored and mapped: the text table (0.6B: 151936 x 2048; a prompt reads a
        # few rows, Talker.embed_text upcasts them) and the predictor's 15 code tables (0.6B: 120 MB in fp32; a
        # frame reads one row of each, upcast where they are read)
        tables = {id(tts.talker.model.text_embedding.weight)}
        tables |= {id(e.weight) for e in tts.talker.code_predictor.model.codec_embedding}
        for p in tts.parameters():
            if id(p) not in tables:
                p.data = p.data.float()
        fuse_decoder_layers(tts)  # each layer the compiled kernel takes becomes one call (engine.fast.fused)
    else:
        load_weights(tts, tensors, "", dtype)
        del tensors
    codec, sample_rate = load_codec(speech, dtype)
    if lowers_codec(weights) and isinstance(codec, CodecDecoder):
        codec.lower_precision()
    tts.to(device).eval()
    codec.to(device).eval()
    if weights == "fp32" and cfg.talker.hidden_size < NARROW_HIDDEN and torch.device(device).type == "cpu":
        # a narrow model's layers as one compiled call each (engine.fast.fused); a first load never waits for the
        # compile: it goes without, and the library is built in the background for the next one
        fuse_fp32_layers(tts, build="background")
    tokenizer = TextTokenizer(folder, frontend=text_frontend(vars(cfg)))
    plan = draft_plan(folder, tts.talker.code_predictor.cfg.hidden_size)
    defaults = defaults or model_defaults(folder, cfg)
    return LoadedModel(folder, cfg, tts, codec, tokenizer, defaults, sample_rate, weights, plan)
