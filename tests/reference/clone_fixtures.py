"""Base (voice cloning) and VoiceDesign fixtures: part of make_fixtures.py (`--only clone`), run in the reference
virtualenv with the official qwen-tts 0.1.1. The leapvox product never imports this.

Builds tiny-base-0b6, tiny-base-1b7 (speaker encoder included; the speech tokenizer has tiny-0b6's decoder and an
encoder with data-driven codebooks, one blob in all three folders) and tiny-voicedesign (1b7 shapes, no speakers),
then records through the OFFICIAL wrapper:
  - the fixture clips (clone_clip.wav, 24 kHz float32) and the official mel of the main clip,
  - speaker embeddings of the clip (both Base sizes), speech-tokenizer encoder codes of the clips,
  - seeded x-vector-only and ICL cloning (both text layouts) and voice-design cases: codes, prompt rows,
  - the final audio of one ICL case (reference decoded with the output and cut off, as the wrapper does),
  - clips given to the official API as FILES at lengths that are not whole 20 ms frames (a 22.05 kHz stereo 16-bit
    WAV, an 8 kHz 3-channel 24-bit FLAC): the 24 kHz samples the wrapper makes of them (a SHA-256), their x-vectors
    and codes, and x-vector / ICL cases with their final audio, where the ICL cut falls a sample before the frame
    boundary (`make_file_cases`; `make_fixtures.py --only clone-files` adds just these to the existing files).
Writes expected_clone.json + expected_clone.safetensors; the CustomVoice files are not touched.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import shutil

import numpy as np
import torch

CLONE_CKPTS = {
    "tiny-base-0b6": dict(size="0b6", hidden=64, inter=128, layers=2, type="base", eos_gain=4.0, seed=0),
    "tiny-base-1b7": dict(size="1b7", hidden=96, inter=192, layers=2, type="base", eos_gain=3.5, seed=1),
    "tiny-voicedesign": dict(size="1b7", hidden=96, inter=192, layers=2, type="voice_design", eos_gain=3.5, seed=2),
}
# ECAPA-TDNN at tiny width; the mel front end keeps the shipped 128 bins (it is fixed in the official code).
SPEAKER_ENCODER = dict(mel_dim=128, enc_channels=[32, 32, 32, 32, 96], enc_kernel_sizes=[5, 3, 3, 3, 1],
                       enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16, enc_res2net_scale=8,
                       enc_se_channels=16, sample_rate=24000)
SR = 24000
REF_TEXT = "Hello world, this is a test."
REF_TEXT_SHORT = "Hello."
T_TARGET = "Good morning, the weather is very nice today."
T_TARGET_LONG = "The quick brown fox. Good morning, the weather is very nice today, please speak with a calm tone."
VD_INSTRUCT = "A calm voice, speak slowly and happily."
# clips passed to the official API as file paths, 2.53 s and 1.18 s: at 24 kHz not whole 20 ms frames
FILE_CLIPS = {
    "file_22k": dict(file="clone_clip_22k.wav", sr=22050, samples=55786, channels=2, subtype="PCM_16", seed=7),
    "file_8k": dict(file="clone_clip_8k.flac", sr=8000, samples=9437, channels=3, subtype="PCM_24", seed=8),
}


def fixture_clip(seconds: float, seed: int, sr: int = SR) -> np.ndarray:
    """A voice-like synthetic clip: a gliding harmonic tone with syllable-rate amplitude, a little noise."""
    g = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    f0 = 140 + 25 * np.sin(2 * np.pi * 0.7 * t) + 10 * np.sin(2 * np.pi * 3.1 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sr
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    wav = 0.25 * voice * envelope + 0.01 * g.standard_normal(len(t))
    return (0.6 * wav / np.abs(wav).max()).astype(np.float32)


def config_dict(mf, spec, special_ids, assistant_id):
    d = mf.model_config_dict(spec, special_ids, assistant_id)
    d["tts_model_type"] = spec["type"]
    d["talker_config"]["spk_id"] = {}
    d["talker_config"]["spk_is_dialect"] = {}
    if spec["type"] == "base":
        d["speaker_encoder_config"] = dict(SPEAKER_ENCODER, enc_dim=spec["hidden"])
    return d


@torch.no_grad()
def init_speaker_encoder(enc, seed, clip, extract):
    g = torch.Generator().manual_seed(seed)
    for mod in enc.modules():
        if isinstance(mod, torch.nn.Conv1d):
            fan_in = mod.weight.shape[1] * mod.weight.shape[2]
            mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) / math.sqrt(fan_in))
            mod.bias.copy_(0.05 * torch.randn(mod.bias.shape, generator=g))
    emb = extract(clip)  # scale the output to unit RMS on the fixture clip: a codec-embedding-sized x-vector
    rms = float(emb.pow(2).mean().sqrt())
    enc.fc.weight.mul_(1.0 / rms)
    enc.fc.bias.mul_(1.0 / rms)


def build(mf, tok, clips):
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    vocab, merges, tok_cfg, special_ids, n_regular = tok
    assistant_id = vocab["assistant"]
    for ci, (name, spec) in enumerate(CLONE_CKPTS.items()):
        folder = mf.OUT / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        cfg_dict = config_dict(mf, spec, special_ids, assistant_id)
        torch.manual_seed(300 + ci)
        model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**cfg_dict)).eval()
        mf.init_tts_model(model, seed=3000 + ci, eos_gain=spec["eos_gain"])
        if model.speaker_encoder is not None:
            def extract(wav, enc=model.speaker_encoder):
                mels = mel_spectrogram(torch.from_numpy(wav)[None], 1024, 128, SR, 256, 1024, 0, 12000)
                return enc(mels.transpose(1, 2))[0]
            init_speaker_encoder(model.speaker_encoder, 4000 + ci, clips["clip"], extract)
        model = model.to(torch.bfloat16)
        model.save_pretrained(folder, safe_serialization=True)
        saved = json.loads((folder / "config.json").read_text())
        # the official loader takes only the encoder's own keys (no model_type); CustomVoice/VoiceDesign ship none
        saved.pop("speaker_encoder_config", None)
        if spec["type"] == "base":
            saved["speaker_encoder_config"] = cfg_dict["speaker_encoder_config"]
        (folder / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))
        (folder / "generation_config.json").write_text(json.dumps(mf.GENERATION_CONFIG, indent=2))
        mf.write_text_tokenizer(folder, vocab, merges, tok_cfg)
        if ci == 0:
            build_speech_tokenizer(mf, folder / "speech_tokenizer", clips["clip_long"])
        else:  # the same blob in every clone checkpoint
            shutil.copytree(mf.OUT / "tiny-base-0b6" / "speech_tokenizer", folder / "speech_tokenizer")


def build_speech_tokenizer(mf, st_dir, wav):
    """tiny-0b6's speech tokenizer (the same decoder: same config, seeds and init) with data-driven encoder
    codebooks: random ones left every frame of the fixture clips on one code. Each codebook is drawn from the
    residuals of a 12 s clip at its stage (plus noise), so encoded codes vary from frame to frame."""
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from transformers import EncodecFeatureExtractor

    torch.manual_seed(200)
    st = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**mf.speech_tokenizer_config())).eval()
    mf.init_speech_tokenizer(st, seed=2000)
    g = torch.Generator().manual_seed(2100)
    enc = st.encoder
    with torch.no_grad():
        h = enc.encoder(torch.from_numpy(wav)[None, None])
        h = enc.encoder_transformer(h.transpose(1, 2), return_dict=True).last_hidden_state.transpose(1, 2)
        h = enc.downsample(h)  # [1, C, T]
        for rvq in (enc.quantizer.semantic_residual_vector_quantizer, enc.quantizer.acoustic_residual_vector_quantizer):
            residual = (rvq.input_proj(h) if rvq.input_proj is not None else h)[0].T  # [T, D]
            for layer in rvq.layers:
                book = layer.codebook
                rows = residual[torch.randint(0, residual.shape[0], (book.codebook_size,), generator=g)]
                vectors = rows + 0.1 * residual.std() * torch.randn(rows.shape, generator=g)
                book.cluster_usage.fill_(1.0)
                book.embed_sum.copy_(vectors)
                book._embed = None
                residual = residual - book.decode(book.encode(residual))
    st_dir.mkdir()
    st.save_pretrained(st_dir, safe_serialization=True)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0,
                            return_attention_mask=True).save_pretrained(st_dir)


def capture(tts, call):
    """Run `call()` through the official wrapper, capturing codes, prompt rows and trailing rows."""
    m, cap = tts.model, {}
    orig_generate, orig_talker_generate = m.generate, m.talker.generate

    def gen_wrap(**kw):
        out = orig_generate(**kw)
        cap["codes"] = [c.clone() for c in out[0]]
        return out

    def talker_wrap(**kw):
        cap["prompt_embeds"] = kw["inputs_embeds"].detach().clone()
        cap["trailing"] = kw["trailing_text_hidden"].detach().clone()
        res = orig_talker_generate(**kw)
        cap["sequences"] = res.sequences.detach().clone()
        return res

    m.generate, m.talker.generate = gen_wrap, talker_wrap
    try:
        wavs, sr = call()
    finally:
        del m.generate
        del m.talker.generate
    cap["wav"] = torch.from_numpy(np.asarray(wavs[0], dtype=np.float32))
    return cap


def case(name, ckpt, kind, text, params, seed, *, layout="non-streaming", clip="clip", ref_text=REF_TEXT,
         language="english", instruct=None, max_new_tokens=30, keep_wav=False, note=""):
    return dict(name=name, checkpoint=ckpt, kind=kind, text=text, language=language, text_layout=layout,
                clip=clip if kind != "voice_design" else None, ref_text=ref_text if kind == "icl" else None,
                instruct=instruct, seed=seed, max_new_tokens=max_new_tokens, keep_wav=keep_wav, note=note, **params)


def cases(mf):
    S, G = mf.SAMPLING_DEFAULTS, mf.GREEDY
    return [
        case("xvec_ns_0b6", "tiny-base-0b6", "xvec", T_TARGET, S, 101, note="x-vector only, non-streaming"),
        case("xvec_st_1b7", "tiny-base-1b7", "xvec", T_TARGET, S, 102, layout="streaming",
             note="x-vector only, streaming text layout"),
        case("icl_ns_0b6", "tiny-base-0b6", "icl", T_TARGET, S, 103, keep_wav=True,
             note="ICL, non-streaming; final audio kept (reference decoded with the output, then cut)"),
        case("icl_st_0b6", "tiny-base-0b6", "icl", T_TARGET, S, 104, layout="streaming",
             note="ICL, streaming, text shorter than the reference codes: trailing = pad"),
        case("icl_st_short_0b6", "tiny-base-0b6", "icl", T_TARGET_LONG, G, 0, layout="streaming",
             clip="clip_short", ref_text=REF_TEXT_SHORT,
             note="ICL, streaming, text longer than the reference codes: text rows trail; greedy"),
        case("icl_ns_1b7", "tiny-base-1b7", "icl", T_TARGET, G, 0, language="auto", note="ICL on 1b7, auto, greedy"),
        case("icl_st_1b7", "tiny-base-1b7", "icl", T_TARGET, S, 105, layout="streaming", note="ICL on 1b7, streaming"),
        case("vd_ns", "tiny-voicedesign", "voice_design", T_TARGET, S, 106, instruct=VD_INSTRUCT,
             note="voice design (non-streaming, the wrapper's default)"),
        case("vd_st_greedy", "tiny-voicedesign", "voice_design", T_TARGET, G, 0, layout="streaming",
             instruct=VD_INSTRUCT, language="auto", note="voice design, streaming, greedy"),
    ]


def run(tts, c, clips, mf):
    kw = {k: c[k] for k in mf.PARAM_KEYS}
    ns = c["text_layout"] == "non-streaming"
    if c["kind"] == "voice_design":
        def call():
            return tts.generate_voice_design(text=c["text"], instruct=c["instruct"], language=c["language"],
                                             non_streaming_mode=ns, **kw)
    else:
        ref_audio = str(mf.OUT / FILE_CLIPS[c["clip"]]["file"]) if c["clip"] in FILE_CLIPS else (clips[c["clip"]], SR)
        items = tts.create_voice_clone_prompt(ref_audio=ref_audio, ref_text=c["ref_text"],
                                              x_vector_only_mode=c["kind"] == "xvec")

        def call():
            return tts.generate_voice_clone(text=c["text"], language=c["language"], voice_clone_prompt=items,
                                            non_streaming_mode=ns, **kw)
    torch.manual_seed(c["seed"])  # right before generation: the prompt's encoders draw no random numbers
    return capture(tts, call)


def file_cases(mf):
    """Clips given as files (FILE_CLIPS), max_new_tokens chosen so that each ICL case's cut falls a sample before the
    frame boundary (ref 32 frames + 17, ref 15 + 7) when it runs to the limit."""
    S = mf.SAMPLING_DEFAULTS
    return [
        case("file_icl_ns_0b6", "tiny-base-0b6", "icl", T_TARGET, S, 107, clip="file_22k", max_new_tokens=18,
             keep_wav=True, note="ICL from a 22.05 kHz stereo 16-bit WAV file of 2.53 s; final audio kept"),
        case("file_xvec_st_1b7", "tiny-base-1b7", "xvec", T_TARGET, S, 108, layout="streaming", clip="file_8k",
             max_new_tokens=9, keep_wav=True, note="x-vector only from an 8 kHz 3-channel FLAC file of 1.18 s"),
        case("file_icl_ns_1b7", "tiny-base-1b7", "icl", T_TARGET, S, 100, clip="file_8k", ref_text=REF_TEXT_SHORT,
             max_new_tokens=8, keep_wav=True, note="ICL from the 8 kHz FLAC file; final audio kept"),
    ]


def write_file_clips(mf):
    import soundfile as sf

    for spec in FILE_CLIPS.values():
        n, ch = spec["samples"], spec["channels"]
        mono = fixture_clip(n / spec["sr"] + 0.1, spec["seed"], spec["sr"])[:n].astype(np.float64)
        g = np.random.default_rng(spec["seed"])
        chans = [mono * (1 - 0.3 * k) + 0.02 * k * g.standard_normal(n) for k in range(ch)]  # channels that differ
        sf.write(mf.OUT / spec["file"], np.clip(np.stack(chans, axis=1), -1, 1), spec["sr"], subtype=spec["subtype"])


def make_file_cases(mf, loaded, expected, tensors):
    """Record the FILE_CLIPS cases into `expected` / `tensors` (replacing earlier ones of the same names)."""
    import librosa

    write_file_clips(mf)
    expected["clip_files"].update({name: spec["file"] for name, spec in FILE_CLIPS.items()})
    expected["file_clips"] = {}
    for name, spec in FILE_CLIPS.items():
        tts = loaded["tiny-base-0b6"]
        wav, sr = tts._normalize_audio_inputs([str(mf.OUT / spec["file"])])[0]  # what create_voice_clone_prompt does
        at24 = librosa.resample(y=wav.astype(np.float32), orig_sr=sr, target_sr=SR) if sr != SR else wav
        expected["file_clips"][name] = dict(
            spec, samples_24k=int(at24.shape[0]), dtype=str(at24.dtype),
            sha256_24k=hashlib.sha256(np.ascontiguousarray(at24, dtype="<f4").tobytes()).hexdigest(),
            note="the 24 kHz float32 samples the official wrapper encodes and embeds (librosa.load, mean of the "
                 "channels, librosa.resample): their SHA-256")
        for ckpt in ("tiny-base-0b6", "tiny-base-1b7"):
            item = loaded[ckpt].create_voice_clone_prompt(ref_audio=str(mf.OUT / spec["file"]), ref_text="x")[0]
            tensors[f"spk/{ckpt}/{name}"] = item.ref_spk_embedding.float().contiguous()
        tensors[f"enc/{name}"] = item.ref_code.contiguous()
    names = [c["name"] for c in file_cases(mf)]
    expected["cases"] = [c for c in expected["cases"] if c["name"] not in names]
    for c in file_cases(mf):
        rec = record(loaded[c["checkpoint"]], c, {}, mf, tensors)
        if c["kind"] == "icl":
            ref = tensors[f"enc/{c['clip']}"].shape[0]
            total = ref + rec["num_frames"]
            rec["icl_cut"] = dict(ref_frames=ref, total_frames=total, cut=int(ref / total * total * 1920),
                                  frame_boundary=ref * 1920)
        expected["cases"].append(rec)
    expected["file_cases_made_on"] = f"{platform.processor() or platform.machine()}, {_cpu()}, " \
                                     f"{torch.get_num_threads()} threads"


def _cpu() -> str:
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def record(tts, c, clips, mf, tensors) -> dict:
    """Run case `c` through the official wrapper; its JSON record (tensors stored into `tensors`)."""
    cap = run(tts, c, clips, mf)
    codes, seq = cap["codes"][0], cap["sequences"][0].tolist()
    stop = "eos" if seq[-1] == 2150 else "max_new_tokens"
    rec = {k: v for k, v in c.items() if k != "keep_wav"}
    rec.update(code0_tokens=seq, stop_reason=stop, num_frames=int(codes.shape[0]), codes=codes.tolist(),
               prompt_len=int(cap["prompt_embeds"].shape[1]), trailing_len=int(cap["trailing"].shape[1]),
               prompt_embeds_key=f"case/{c['name']}/prompt_embeds", trailing_key=f"case/{c['name']}/trailing",
               wav_key=None, wav_num_samples=int(cap["wav"].shape[0]))
    tensors[rec["prompt_embeds_key"]] = cap["prompt_embeds"][0].float().contiguous()
    tensors[rec["trailing_key"]] = cap["trailing"][0].float().contiguous()
    if c["keep_wav"]:
        rec["wav_key"] = f"wav/{c['name']}"
        tensors[rec["wav_key"]] = cap["wav"].contiguous()
    print(f"{c['name']:22s} L={rec['prompt_len']:3d} trailing={rec['trailing_len']:3d} "
          f"frames={rec['num_frames']:3d} stop={stop}", flush=True)
    return rec


def make_files_only(mf):
    """`--only clone-files`: add the FILE_CLIPS cases to the existing expected_clone.* and leave every other entry
    as it is (a full rerun on another CPU moves the encoder's near-tie codes, and with them the ICL cases)."""
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from safetensors.torch import load_file, save_file

    expected = json.loads((mf.OUT / "expected_clone.json").read_text())
    tensors = load_file(mf.OUT / "expected_clone.safetensors")
    loaded = {name: Qwen3TTSModel.from_pretrained(str(mf.OUT / name)) for name in ("tiny-base-0b6", "tiny-base-1b7")}
    make_file_cases(mf, loaded, expected, tensors)
    save_file(tensors, str(mf.OUT / "expected_clone.safetensors"), metadata={"format": "pt"})
    (mf.OUT / "expected_clone.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False))


def make(mf, tok, skip_build):
    import soundfile as sf
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel
    from safetensors.torch import save_file

    clip = fixture_clip(3.0, seed=5)
    clips = {"clip": clip, "clip_short": clip[: SR], "clip_long": fixture_clip(12.0, seed=6)}
    if not skip_build:
        build(mf, tok, clips)
    sf.write(mf.OUT / "clone_clip.wav", clip, SR, subtype="FLOAT")
    tensors = {f"clips/{k}": torch.from_numpy(v.copy()) for k, v in clips.items()}
    mel = mel_spectrogram(torch.from_numpy(clip)[None], 1024, 128, SR, 256, 1024, 0, 12000)
    tensors["mel/clip"] = mel[0].T.contiguous()
    expected = {"format_version": 1, "generated_by": "tests/reference/make_fixtures.py --only clone",
                "torch_num_threads": torch.get_num_threads(), "sample_rate": SR,
                "clip_files": {"clip": "clone_clip.wav (== clips/clip)"},
                "mel": {"clip": "mel/clip [frames, 128] = official mel_spectrogram(n_fft 1024, hop 256, win 1024, "
                                "128 mels, fmin 0, fmax 12000), transposed"},
                "speaker_embeddings": {}, "encoder_codes": {}, "cases": []}
    loaded = {name: Qwen3TTSModel.from_pretrained(str(mf.OUT / name)) for name in CLONE_CKPTS}
    for name in ("tiny-base-0b6", "tiny-base-1b7"):
        emb = loaded[name].model.extract_speaker_embedding(clip, SR).float()
        key = f"spk/{name}/clip"
        tensors[key] = emb.contiguous()
        expected["speaker_embeddings"][name] = {"clip": key, "rms": float(emb.pow(2).mean().sqrt())}
    st = loaded["tiny-base-0b6"].model.speech_tokenizer
    for cname, wav in clips.items():
        codes = st.encode(wav, sr=SR).audio_codes[0]  # [T, 16]
        key = f"enc/{cname}"
        tensors[key] = codes.contiguous()
        expected["encoder_codes"][cname] = {"key": key, "frames": int(codes.shape[0]), "samples": len(wav),
                                            "distinct_code0": int(codes[:, 0].unique().numel())}
    for c in cases(mf):
        expected["cases"].append(record(loaded[c["checkpoint"]], c, clips, mf, tensors))
    # a seeded rerun reproduces a sampled case
    again = run(loaded["tiny-base-0b6"], cases(mf)[2], clips, mf)["codes"][0].tolist()
    assert again == expected["cases"][2]["codes"], "seeded rerun differs"
    expected["notes"] = [
        "Official qwen-tts 0.1.1, fp32 on CPU, Qwen3TTSModel.from_pretrained(folder) defaults.",
        "Clips are passed as (float32 array, 24000): no resampling; create_voice_clone_prompt builds the prompt "
        "(speaker embedding + encoder codes), torch.manual_seed(seed) right before generate_voice_clone / "
        "generate_voice_design.",
        "ICL final audio: the wrapper decodes reference codes + generated codes (chunked 300/25) and cuts "
        "int(ref_len / total_len * n_samples) samples.",
    ]
    make_file_cases(mf, loaded, expected, tensors)
    save_file(tensors, str(mf.OUT / "expected_clone.safetensors"), metadata={"format": "pt"})
    (mf.OUT / "expected_clone.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False))
