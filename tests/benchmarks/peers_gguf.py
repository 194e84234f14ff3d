"""A Qwen3-TTS checkpoint folder (official layout) -> the two GGUF files qwentts.cpp loads (talker + codec), Q8_0.

Run inside the qwentts.cpp virtualenv of `python -m tests.benchmarks.peers` (needs numpy and the `gguf` package
from PyPI; imports nothing from leapvox):

    python tests/benchmarks/peers_gguf.py CHECKPOINT_FOLDER OUT_FOLDER [--quant Q8_0|F32]

Written for the peer benchmark from facts about the format that qwentts.cpp (the native library bundled in
`realtimetts-qwen-native-cpu` 0.4.2) reads: the GGUF architecture names ("qwen3-tts" for the talker file,
"qwen3-tts-tokenizer" for the codec file), the metadata keys and tensor names its loader looks up, and its
quantization policy (every weight of two or more dimensions whose rows are a whole number of 32-element blocks in
Q8_0, the other multi-dimensional weights (convolution kernels) in F16; vectors, snake parameters and the RVQ
codebooks with their projections kept in F32; the codebooks stored as embedding_sum / max(cluster_usage, 1e-5)).
Only what CustomVoice synthesis needs is written: the codec's encoder (used for voice cloning) is left out, its
hyperparameters are still written from speech_tokenizer/config.json. Output files are written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np

EPS = 1e-5  # the RVQ codebook's clamp on cluster usage
VERSION = 1  # bump when the output changes: cached files are rebuilt

# ---- reading safetensors (bf16 included) without torch ----------------------------------------------------------

_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "U8": "u1", "I8": "i1"}


class SafeTensors:
    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        self.header = header
        self.base = 8 + size
        self.raw = np.memmap(path, dtype=np.uint8, mode="r")

    def names(self) -> list[str]:
        return sorted(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32 (float kinds) or its integer dtype."""
        info = self.header[name]
        start, end = info["data_offsets"]
        a = self.raw[self.base + start : self.base + end].view(_DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in ("F16", "F32"):
            a = a.astype(np.float32)
        return a.reshape(info["shape"])


# ---- names -------------------------------------------------------------------------------------------------------

_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn_layer_scale.scale": "attn_scale",
    "mlp_layer_scale.scale": "ffn_scale",
}
_TALKER = {
    "talker.model.codec_embedding.weight": "talker.codec_embd.weight",
    "talker.model.text_embedding.weight": "talker.text_embd.weight",
    "talker.model.norm.weight": "talker.output_norm.weight",
    "talker.codec_head.weight": "talker.codec_head.weight",
    "talker.code_predictor.model.norm.weight": "code_pred.output_norm.weight",
    "talker.code_predictor.small_to_mtp_projection.weight": "code_pred.mtp_proj.weight",
    "talker.code_predictor.small_to_mtp_projection.bias": "code_pred.mtp_proj.bias",
}


def talker_name(name: str) -> str | None:
    """The GGUF name of a talker checkpoint tensor; None for one CustomVoice synthesis does not use."""
    if name in _TALKER:
        return _TALKER[name]
    m = re.fullmatch(r"talker\.text_projection\.linear_fc([12])\.(weight|bias)", name)
    if m:
        return f"talker.text_proj.fc{m[1]}.{m[2]}"
    for src, dst in (("talker.model.layers.", "talker.blk"), ("talker.code_predictor.model.layers.", "code_pred.blk")):
        if name.startswith(src):
            layer, _, rest = name[len(src) :].partition(".")
            return f"{dst}.{layer}.{_LAYER[rest]}"
    m = re.fullmatch(r"talker\.code_predictor\.model\.codec_embedding\.(\d+)\.weight", name)
    if m:
        return f"code_pred.codec_embd.{m[1]}.weight"
    m = re.fullmatch(r"talker\.code_predictor\.lm_head\.(\d+)\.weight", name)
    if m:
        return f"code_pred.lm_head.{m[1]}.weight"
    return None  # e.g. a Base checkpoint's speaker encoder


def codec_name(name: str) -> str | None:
    """The GGUF name of a codec (speech_tokenizer) decoder tensor; None for one handled elsewhere or unused."""
    p = name.split(".")
    if p[0] != "decoder" or p[1] == "quantizer":
        return None
    if p[1] == "pre_conv":
        return f"tok_dec.pre_conv.{p[-1]}"
    if p[1] == "pre_transformer":
        if p[2] == "layers":
            return f"tok_dec.pre_tfm.blk.{p[3]}.{_LAYER['.'.join(p[4:])]}"
        return "tok_dec.pre_tfm." + ".".join(p[2:])  # input_proj, output_proj, norm
    if p[1] == "upsample":
        i = p[2]
        if p[3] == "0":
            return f"tok_dec.upsample.{i}.conv.{p[-1]}"
        if p[4] == "gamma":
            return f"tok_dec.upsample.{i}.gamma"
        return f"tok_dec.upsample.{i}.{p[4]}.{p[-1]}"  # dwconv, norm, pwconv1, pwconv2
    if p[1] == "decoder":
        i = int(p[2])
        if len(p) == 4:  # the final snake: decoder.decoder.N.{alpha,beta}
            return f"tok_dec.dec.{i}.snake.{p[-1]}"
        if p[3] == "conv":  # the first and last convolutions
            return f"tok_dec.dec.{i}.conv.{p[-1]}"
        j = int(p[4])
        if j == 0:
            return f"tok_dec.dec.{i}.snake.{p[-1]}"
        if j == 1:
            return f"tok_dec.dec.{i}.conv_t.{p[-1]}"
        return f"tok_dec.dec.{i}.res.{j - 2}.{p[5]}.{p[-1]}"  # act1/act2 alpha/beta, conv1/conv2 weight/bias
    raise ValueError(f"unexpected codec tensor {name}")


# ---- the quantization policy ---------------------------------------------------------------------------------------


def kept_f32(gguf_name: str, ndim: int) -> bool:
    return ndim < 2 or ".vq_" in gguf_name or re.search(r"\.(snake|act1|act2)\.(alpha|beta)$", gguf_name) is not None


def add_tensor(writer, gguf, name: str, a: np.ndarray, quant: str) -> int:
    """Add one tensor in the policy's type; returns its bytes in the file."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if quant == "F32" or kept_f32(name, a.ndim):
        writer.add_tensor(name, a)
        return a.nbytes
    if a.shape[-1] % 32:  # a convolution kernel: no whole 32-blocks per row
        h = a.astype(np.float16)
        writer.add_tensor(name, h)
        return h.nbytes
    q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    return q.nbytes


# ---- the two files -----------------------------------------------------------------------------------------------


def bpe_payload(folder: Path):
    """tokens, token types and merges of the checkpoint's byte-level BPE (added tokens typed 4, gaps 5)."""
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    added = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("added_tokens_decoder", {})
    size = 1 + max([*vocab.values(), *(int(i) for i in added)])
    tokens, types = [f"<|unused-{i}|>" for i in range(size)], [5] * size
    for tok, i in vocab.items():
        tokens[i], types[i] = tok, 1
    for i, info in added.items():
        tokens[int(i)], types[int(i)] = info["content"], 4
    merges = [
        ln for ln in (folder / "merges.txt").read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")
    ]
    return tokens, types, merges


def write_talker(gguf, folder: Path, out: Path, quant: str) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    tc, pc = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    w = gguf.GGUFWriter(str(out), "qwen3-tts")
    w.add_string("general.name", f"random {cfg.get('tts_model_size', '')} {cfg.get('tts_model_type', '')}")
    w.add_string("qwen3-tts.tokenizer_type", cfg["tokenizer_type"])
    w.add_string("qwen3-tts.model_size", cfg["tts_model_size"])
    w.add_string("qwen3-tts.model_type", cfg["tts_model_type"])
    w.add_uint32("qwen3-tts.num_code_groups", tc["num_code_groups"])
    for part, c in (("talker", tc), ("code_pred", pc)):
        k = f"qwen3-tts.{part}."
        w.add_uint32(k + "embedding_length", c["hidden_size"])
        w.add_uint32(k + "feed_forward_length", c["intermediate_size"])
        w.add_uint32(k + "block_count", c["num_hidden_layers"])
        w.add_uint32(k + "attention.head_count", c["num_attention_heads"])
        w.add_uint32(k + "attention.head_count_kv", c["num_key_value_heads"])
        w.add_uint32(k + "attention.key_length", c["head_dim"])
        w.add_uint32(k + "vocab_size", c["vocab_size"])
        w.add_uint32(k + "context_length", c["max_position_embeddings"])
        w.add_float32(k + "rope.freq_base", float(c["rope_theta"]))
        w.add_float32(k + "attention.layer_norm_rms_epsilon", float(c["rms_norm_eps"]))
    w.add_uint32("qwen3-tts.talker.text_vocab_size", tc["text_vocab_size"])
    w.add_uint32("qwen3-tts.talker.text_hidden_size", tc["text_hidden_size"])
    w.add_uint32("qwen3-tts.talker.position_id_per_seconds", tc.get("position_id_per_seconds", 13))
    rope = tc.get("rope_scaling") or {}
    if "mrope_section" in rope:
        w.add_array("qwen3-tts.talker.rope.mrope_section", list(rope["mrope_section"]))
        w.add_bool("qwen3-tts.talker.rope.mrope_interleaved", bool(rope.get("interleaved", False)))
    for key, src in (
        ("pad_id", "codec_pad_id"),
        ("bos_id", "codec_bos_id"),
        ("eos_id", "codec_eos_token_id"),
        ("think_id", "codec_think_id"),
        ("nothink_id", "codec_nothink_id"),
        ("think_bos_id", "codec_think_bos_id"),
        ("think_eos_id", "codec_think_eos_id"),
    ):
        w.add_uint32(f"qwen3-tts.codec.{key}", tc[src])
    langs = tc.get("codec_language_id") or {}
    w.add_array("qwen3-tts.codec.language_names", list(langs))
    w.add_array("qwen3-tts.codec.language_ids", [int(v) for v in langs.values()])
    speakers = tc.get("spk_id") or {}
    if speakers:
        dialect = tc.get("spk_is_dialect") or {}
        w.add_array("qwen3-tts.codec.speaker_names", list(speakers))
        w.add_array("qwen3-tts.codec.speaker_ids", [int(v) for v in speakers.values()])
        w.add_array(
            "qwen3-tts.codec.speaker_dialects",
            [d if isinstance(d := dialect.get(s), str) else "" for s in speakers],
        )
    for key in ("im_start", "im_end"):
        w.add_uint32(f"qwen3-tts.text.{key}_id", cfg[f"{key}_token_id"])
    for key in ("tts_pad", "tts_bos", "tts_eos"):
        w.add_uint32(f"qwen3-tts.text.{key}_id", cfg[f"{key}_token_id"])
    for key, kind in (
        ("do_sample", "bool"),
        ("top_k", "u32"),
        ("top_p", "f32"),
        ("temperature", "f32"),
        ("repetition_penalty", "f32"),
        ("subtalker_dosample", "bool"),
        ("subtalker_top_k", "u32"),
        ("subtalker_top_p", "f32"),
        ("subtalker_temperature", "f32"),
        ("max_new_tokens", "u32"),
    ):
        if key in gen:
            name = "generation." + key.replace("subtalker_dosample", "subtalker_do_sample")
            {"bool": w.add_bool, "u32": w.add_uint32, "f32": w.add_float32}[kind](
                name, {"bool": bool, "u32": int, "f32": float}[kind](gen[key])
            )
    tokens, types, merges = bpe_payload(folder)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    endoftext = next((i for i, t in enumerate(tokens) if t == "<|endoftext|>"), None)
    if endoftext is not None:
        w.add_uint32("tokenizer.ggml.eos_token_id", endoftext)
    st = SafeTensors(folder / "model.safetensors")
    sizes, skipped = {}, []
    for name in st.names():
        dst = talker_name(name)
        if dst is None:
            skipped.append(name)
            continue
        sizes[dst] = add_tensor(w, gguf, dst, st.get(name), quant)
    _finish(w)
    return {"tensors": len(sizes), "bytes": sum(sizes.values()), "skipped": skipped}


def write_codec(gguf, folder: Path, out: Path, quant: str) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    dec, enc = cfg["decoder_config"], cfg.get("encoder_config") or {}
    w = gguf.GGUFWriter(str(out), "qwen3-tts-tokenizer")
    w.add_string("general.name", "random Qwen3-TTS-Tokenizer-12Hz")
    k = "qwen3-tts-tokenizer."
    for key in ("input_sample_rate", "output_sample_rate", "decode_upsample_rate", "encode_downsample_rate"):
        w.add_uint32(k + key, cfg[key])
    w.add_uint32(k + "encoder_valid_num_quantizers", cfg.get("encoder_valid_num_quantizers", dec["num_quantizers"]))
    for key in (
        "latent_dim",
        "codebook_dim",
        "codebook_size",
        "decoder_dim",
        "hidden_size",
        "intermediate_size",
        "head_dim",
        "num_attention_heads",
        "num_key_value_heads",
        "num_hidden_layers",
        "num_quantizers",
        "num_semantic_quantizers",
        "sliding_window",
    ):
        w.add_uint32(k + "decoder." + key, dec[key])
    w.add_float32(k + "decoder.rms_norm_eps", float(dec["rms_norm_eps"]))
    w.add_float32(k + "decoder.rope_theta", float(dec["rope_theta"]))
    w.add_float32(k + "decoder.layer_scale_initial_scale", float(dec["layer_scale_initial_scale"]))
    w.add_array(k + "decoder.upsample_rates", list(dec["upsample_rates"]))
    w.add_array(k + "decoder.upsampling_ratios", list(dec["upsampling_ratios"]))
    w.add_uint32(k + "decoder.vector_quantization_hidden_dim", dec["vector_quantization_hidden_dimension"])
    st = SafeTensors(folder / "model.safetensors")
    internal = next(
        (st.shape(n)[-1] for n in st.names() if n.endswith("_codebook.embedding_sum")), dec["codebook_dim"] // 2
    )
    w.add_uint32(k + "decoder.codebook_dim_internal", internal)
    for key in (
        "num_filters",
        "kernel_size",
        "last_kernel_size",
        "residual_kernel_size",
        "num_residual_layers",
        "dilation_growth_rate",
        "compress",
        "hidden_size",
        "intermediate_size",
        "head_dim",
        "num_attention_heads",
        "num_key_value_heads",
        "num_hidden_layers",
        "codebook_dim",
        "codebook_size",
        "num_quantizers",
        "num_semantic_quantizers",
    ):
        if key in enc:
            w.add_uint32(k + "encoder." + key, enc[key])
    for key in ("norm_eps", "rope_theta", "layer_scale_initial_scale"):
        if key in enc:
            w.add_float32(k + "encoder." + key, float(enc[key]))
    if "upsampling_ratios" in enc:
        w.add_array(k + "encoder.upsampling_ratios", list(enc["upsampling_ratios"]))
    if "vector_quantization_hidden_dimension" in enc:
        w.add_uint32(k + "encoder.vector_quantization_hidden_dim", enc["vector_quantization_hidden_dimension"])
    sizes, books = {}, {}
    for name in st.names():
        m = re.fullmatch(r"decoder\.quantizer\.r(vq_first|vq_rest)\.(input_proj|output_proj)\.weight", name)
        if m:
            if m[2] == "output_proj":  # the input projection is the encoder's business
                sizes[f"tok_dec.{m[1]}.output_proj.weight"] = add_tensor(
                    w, gguf, f"tok_dec.{m[1]}.output_proj.weight", st.get(name), quant
                )
            continue
        m = re.fullmatch(r"decoder\.quantizer\.r(vq_first|vq_rest)\.vq\.layers\.(\d+)\._codebook\.(\w+)", name)
        if m:
            books.setdefault((m[1], int(m[2])), {})[m[3]] = name
            continue
        dst = codec_name(name)
        if dst is not None:
            sizes[dst] = add_tensor(w, gguf, dst, st.get(name), quant)
    for (side, layer), parts in sorted(books.items()):
        table = st.get(parts["embedding_sum"]) / np.maximum(st.get(parts["cluster_usage"]), EPS)[:, None]
        sizes[f"tok_dec.{side}.{layer}.codebook"] = add_tensor(
            w, gguf, f"tok_dec.{side}.{layer}.codebook", table, quant
        )
    _finish(w)
    return {"tensors": len(sizes), "bytes": sum(sizes.values())}


def _finish(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def convert(folder: Path, out: Path, quant: str = "Q8_0") -> dict:
    """Write OUT/talker-QUANT.gguf and OUT/codec-QUANT.gguf (each through a temp file, then renamed)."""
    import gguf

    out.mkdir(parents=True, exist_ok=True)
    report = {"version": VERSION, "quant": quant}
    for label, fn, src in (
        ("talker", write_talker, folder),
        ("codec", write_codec, folder / "speech_tokenizer"),
    ):
        final = out / f"{label}-{quant}.gguf"
        tmp = final.with_name(final.name + ".part")
        report[label] = fn(gguf, src, tmp, quant)
        os.replace(tmp, final)
        report[label]["path"] = str(final)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="checkpoint folder in the official layout")
    ap.add_argument("out", type=Path, help="folder for talker-QUANT.gguf and codec-QUANT.gguf")
    ap.add_argument("--quant", choices=("Q8_0", "F32"), default="Q8_0")
    args = ap.parse_args(argv)
    if not (args.checkpoint / "config.json").is_file() or not (args.checkpoint / "speech_tokenizer").is_dir():
        print(
            f"peers_gguf: error: {args.checkpoint} is not a checkpoint folder in the official layout", file=sys.stderr
        )
        return 2
    print(json.dumps(convert(args.checkpoint, args.out, args.quant)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
