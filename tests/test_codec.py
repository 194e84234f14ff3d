"""Codec decoder: official key layout, one-shot vs streaming vs the official 300/25 chunking, reference parity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from leapvox.engine.fast import kernels
from leapvox.engine.fast.codec_ops import FastCodecOps
from leapvox.engine.nets.codec import CodecConfig, CodecDecoder, CodecOps, use_ops

SPF = 1920
REFERENCE = Path(__file__).parent / "fixtures" / "reference"

TINY = {
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "decoder_config": {
        "codebook_size": 64, "codebook_dim": 64, "latent_dim": 64, "decoder_dim": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "head_dim": 8, "sliding_window": 72, "num_quantizers": 16, "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2], "rope_theta": 10000, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "attention_bias": False, "semantic_codebook_size": 4096, "some_future_key": 1,
    },
}  # fmt: skip


def lively_init(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights under which the audio depends strongly on the codes without saturating the clamp."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            noise = torch.randn(p.shape, generator=g)
            if leaf == "embedding_sum":
                p.copy_(0.1 * noise)
            elif leaf == "cluster_usage":
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=g))
            elif leaf in ("alpha", "beta"):  # log-space SnakeBeta parameters
                p.copy_(0.1 * noise)
            elif leaf in ("scale", "gamma"):  # layer scales: large enough for the transformer to matter
                p.copy_(0.3 + 0.2 * torch.rand(p.shape, generator=g))
            elif leaf == "bias":
                p.copy_(0.01 * noise)
            elif p.dim() == 1:  # norm weights
                p.copy_(1 + 0.1 * noise)
            else:
                transposed = "block.1.conv" in name or ("upsample" in name and ".0.conv" in name)
                fan_in = 2 * p.shape[0] if transposed else p[0].numel()
                gain = 0.3 if ("conv2" in name or name.startswith("decoder.6")) else 1.0
                p.copy_(gain * noise / math.sqrt(fan_in))


@pytest.fixture(autouse=True, scope="module")
def flush_denormals():
    """Denormal activations of random weights make CPU matmuls several times slower; results are unchanged."""
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="module")
def model() -> CodecDecoder:
    m = CodecDecoder(CodecConfig.from_dict(TINY), FastCodecOps()).eval()  # as the loader builds it
    lively_init(m)
    return m


def random_codes(T: int, B: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (B, 16, T), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a.float() - b.float()).abs().max().item()


def stream_decode(m: CodecDecoder, codes: torch.Tensor, step: int, **kw) -> torch.Tensor:
    s = m.stream(**kw)
    return torch.cat([s.push(codes[..., i : i + step]) for i in range(0, codes.shape[-1], step)], dim=-1)


def test_config_from_dict():
    cfg = CodecConfig.from_dict(TINY)
    assert cfg.samples_per_frame == SPF and cfg.frame_rate == 12.5
    assert cfg.upsample_rates == (8, 5, 4, 3) and cfg.hidden_size == 32
    assert CodecConfig().samples_per_frame == 1920
    with pytest.raises(ValueError, match="samples per frame"):
        CodecConfig.from_dict({**TINY, "decode_upsample_rate": 960})


def test_official_key_names_full_size():
    with torch.device("meta"):
        sd = CodecDecoder(CodecConfig()).state_dict()
    assert len(sd) == 271
    expected = {
        "quantizer.rvq_first.vq.layers.0._codebook.embedding_sum": (2048, 256),
        "quantizer.rvq_rest.vq.layers.14._codebook.cluster_usage": (2048,),
        "quantizer.rvq_rest.input_proj.weight": (256, 512, 1),
        "quantizer.rvq_first.output_proj.weight": (512, 256, 1),
        "pre_conv.conv.weight": (1024, 512, 3),
        "pre_transformer.input_proj.weight": (512, 1024),
        "pre_transformer.layers.7.self_attn.q_proj.weight": (1024, 512),
        "pre_transformer.layers.0.self_attn_layer_scale.scale": (512,),
        "pre_transformer.layers.0.mlp.down_proj.weight": (512, 1024),
        "upsample.0.0.conv.weight": (1024, 1024, 2),
        "upsample.1.1.dwconv.conv.weight": (1024, 1, 7),
        "upsample.1.1.gamma": (1024,),
        "decoder.0.conv.weight": (1536, 1024, 7),
        "decoder.1.block.0.alpha": (1536,),
        "decoder.1.block.1.conv.weight": (1536, 768, 16),
        "decoder.4.block.1.conv.weight": (192, 96, 6),
        "decoder.4.block.4.conv1.conv.weight": (96, 96, 7),
        "decoder.5.beta": (96,),
        "decoder.6.conv.weight": (1, 96, 7),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key


def test_official_key_names_tiny(model):
    sd = model.state_dict()
    cfg, n_rates = model.config, len(model.config.upsample_rates)
    count = 2 * cfg.num_quantizers + 4 + 2 + 5 + 11 * cfg.num_hidden_layers + 11 * 2 + 28 * n_rates + 6
    assert len(sd) == count == 205
    for key in (
        "quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum",
        "decoder.3.block.2.act1.beta",
        "pre_transformer.layers.1.post_attention_layernorm.weight",
        "upsample.0.1.pwconv1.bias",
    ):
        assert key in sd
    fresh = CodecDecoder(cfg, FastCodecOps())
    fresh.load_state_dict(sd, strict=True)
    assert torch.equal(fresh(random_codes(5)), model(random_codes(5)))


@torch.no_grad()
def test_output_shape_range_and_causality(model):
    codes = random_codes(40)
    wav = model(codes)
    assert wav.shape == (1, 1, SPF * 40) and wav.abs().max() <= 1
    assert 0.1 < wav.std() < 0.9  # a real signal, not silence or a clamped square wave
    changed = codes.clone()
    changed[0, 5, 20] = (changed[0, 5, 20] + 1) % 64
    diff = (model(changed) - wav).abs()
    assert diff[..., : 20 * SPF].max() == 0  # nothing before the changed frame moves
    assert diff[..., 20 * SPF :].max() > 0.05  # and the audio depends on an acoustic code


@pytest.fixture(params=["compiled", "torch", "plain"])
def kernels_mode(request, model):
    """Each streaming test three times: the loader's ops with leapvox's compiled codec kernels where they run, those
    ops on torch's kernels alone (what a machine without a compiler runs), and the decoder's plain torch ops."""
    if request.param == "compiled":
        if kernels.linear_op() is None:
            pytest.skip(f"the compiled kernels are not available here ({kernels.unavailable_reason()})")
        yield request.param
    elif request.param == "torch":
        with kernels.disabled():
            yield request.param
    else:
        use_ops(model, CodecOps())
        yield request.param
        use_ops(model, FastCodecOps())


@torch.no_grad()
@pytest.mark.parametrize("step", [1, 7, 13, 50])
def test_streaming_equals_one_shot(model, step, kernels_mode):
    codes = random_codes(150)  # > 72 frames, so the attention window slides
    one_shot = model(codes)
    assert max_diff(stream_decode(model, codes, step), one_shot) <= 1e-6  # bit-identical on x86 MKL


@torch.no_grad()
def test_streaming_batch_and_ragged_pushes(model, kernels_mode):
    codes = random_codes(90, B=2)
    s, wavs, i = model.stream(), [], 0
    for n in (1, 2, 3, 30, 0, 54):
        wavs.append(s.push(codes[..., i : i + n]))
        i += n
    assert max_diff(torch.cat(wavs, dim=-1), model(codes)) <= 1e-6


@torch.no_grad()
def test_stream_state_is_bounded(model):
    codes = random_codes(230)
    s = model.stream(official_chunking=True)

    def numel():
        return sum(t.numel() for v in s.cache.values() for t in (v if isinstance(v, tuple) else (v,))
                   if torch.is_tensor(t))  # fmt: skip

    s.push(codes[..., :100])
    before = numel()
    s.push(codes[..., 100:230])
    assert numel() == before and s.recent.shape[-1] == 25
    s.reset()
    assert s.cache == {} and s.frames == 0


@torch.no_grad()
def test_stream_state_restores(model):
    """A stream's state, taken once, restored any number of times, continues exactly as the stream did then, across
    the official restart at frame 300 too (what Synthesizer.stream does with a codec primed by a voice's clip)."""
    assert (model.samples_per_frame, model.sample_rate, model.streams_exactly) == (SPF, 24000, True)
    codes = random_codes(320)
    s = model.stream(official_chunking=True)
    start = s.state()
    first = s.push(codes[..., :290])
    primed = s.state()
    after = s.push(codes[..., 290:])
    for _ in range(2):
        s.push(random_codes(7, seed=2))  # anything in between
        s.restore(primed)
        assert torch.equal(s.push(codes[..., 290:]), after)
    s.restore(start)
    assert torch.equal(s.push(codes[..., :290]), first)


def test_the_codec_receives_its_ops():
    """codec.py imports neither leapvox's kernels nor quantization: every product runs through the ops it is handed."""
    import ast

    from leapvox.engine.nets import codec as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {"kernels", "quant", "fused", "codec_ops"} & imported
    names, seen = ("linear", "swiglu", "pointwise", "conv", "snake", "overlap_add", "window_attention"), set()

    def counted(name):
        def op(self, *args):
            seen.add(name)
            return getattr(CodecOps, name)(self, *args)

        return op

    counting = type("Counting", (CodecOps,), {name: counted(name) for name in names})()
    plain = CodecDecoder(CodecConfig.from_dict(TINY), CodecOps()).eval()
    lively_init(plain)
    m = CodecDecoder(plain.config, counting).eval()
    m.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert torch.equal(m(random_codes(5)), plain(random_codes(5)))
    assert seen == set(names)


@torch.no_grad()
def test_chunked_decode_rule(model):
    short = random_codes(80)
    assert torch.equal(model.chunked_decode(short), model(short))  # one chunk: the same as one-shot
    codes = random_codes(350)
    chunked, one_shot = model.chunked_decode(codes), model(codes)
    assert chunked.shape == one_shot.shape == (1, 1, 350 * SPF)
    assert torch.equal(chunked[..., : 300 * SPF], one_shot[..., : 300 * SPF])
    assert max_diff(chunked, one_shot) > 1e-3  # the restart at frame 300 is real
    # frames 300.. come from decoding frames 275..349 from scratch and dropping the first 25 frames' audio
    assert torch.equal(chunked[..., 300 * SPF :], model(codes[..., 275:])[..., 25 * SPF :])
    assert max_diff(stream_decode(model, codes, 29, official_chunking=True), chunked) <= 1e-6


@torch.no_grad()
def test_bf16(model):
    codes = random_codes(30)
    m16 = CodecDecoder(model.config, FastCodecOps()).eval()
    m16.load_state_dict(model.state_dict())
    m16.to(torch.bfloat16)
    wav = m16(codes)
    assert wav.dtype == torch.bfloat16 and wav.shape == (1, 1, 30 * SPF)
    assert (wav.float() - model(codes)).abs().mean() < 0.05
    assert max_diff(stream_decode(m16, codes, 4), wav) <= 1e-2


@torch.no_grad()
def test_matches_official_reference():
    from safetensors.torch import load_file

    folder = REFERENCE / "tiny-0b6" / "speech_tokenizer"
    if not (REFERENCE / "expected.safetensors").exists() or not (folder / "model.safetensors").exists():
        pytest.skip(f"official reference fixtures not generated yet ({REFERENCE})")
    cfg = CodecConfig.from_dict(json.loads((folder / "config.json").read_text()))
    m = CodecDecoder(cfg, FastCodecOps()).eval()
    weights = load_file(str(folder / "model.safetensors"))
    m.load_state_dict({k.removeprefix("decoder."): v for k, v in weights.items() if k.startswith("decoder.")})
    expected = load_file(str(REFERENCE / "expected.safetensors"))

    def codes_of(key):  # accept [B, 16, T], [16, T] or [T, 16]
        c = expected[key].long()
        if c.dim() == 2:
            c = c[None] if c.shape[0] == cfg.num_quantizers else c.T[None]
        return c

    for T in (37, 350):
        codes = codes_of(f"codec/T{T}/codes")
        ours = m.chunked_decode(codes)
        ref = expected[f"codec/T{T}/wav"].float().reshape(-1)
        assert max_diff(ours.reshape(-1)[: ref.numel()], ref) <= 1e-5, T
    tail = expected["codec/T350/wav_oneshot_tail"].float()  # one-shot samples from frame 300 on
    assert max_diff(m(codes_of("codec/T350/codes")).reshape(-1)[300 * SPF :], tail) <= 1e-5


@torch.no_grad()
def test_lower_precision(model):
    codes = random_codes(60)
    low = CodecDecoder(model.config, FastCodecOps()).eval()
    low.load_state_dict(model.state_dict())
    assert low.lower_precision() is low
    dtypes = {n: p.dtype for n, p in low.named_parameters()}
    assert dtypes["decoder.1.block.2.conv1.conv.weight"] == torch.bfloat16
    assert dtypes["upsample.0.1.pwconv1.weight"] == dtypes["upsample.0.0.conv.weight"] == torch.bfloat16
    assert dtypes["upsample.0.1.dwconv.conv.weight"] == dtypes["decoder.1.block.0.alpha"] == torch.float32
    assert dtypes["pre_transformer.layers.0.mlp.up_proj.weight"] == dtypes["pre_conv.conv.weight"] == torch.float32
    wav, ref = low(codes), model(codes)
    assert wav.dtype == torch.float32 and wav.shape == ref.shape
    err = (wav - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert 0 < err < 0.05  # bf16 rounding: moved, but far less than the signal
    for step in (1, 7):
        assert torch.equal(stream_decode(low, codes, step), wav)  # still seam-free: bit for bit


CONVS = [(512, 1024, 3, 1, 1), (1024, 1536, 7, 1, 4), (96, 1, 7, 1, 1920)] + [
    (c, c, k, d, f)
    for c, f in ((768, 32), (384, 160), (192, 640), (96, 1920))
    for k, d in ((7, 1), (7, 3), (7, 9), (1, 1))
]  # the 0.6B codec's dense causal convs: (c_in, c_out, kernel, dilation, input samples per frame)
TRANS_CONVS = [(1024, 1024, 2, 2, 2), (1536, 768, 16, 8, 4), (768, 384, 10, 5, 32), (192, 96, 6, 3, 640)]
# ... and transposed convs: (c_in, c_out, kernel, stride, input samples per frame)


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_rounding_independent_of_call_length_at_full_size(dtype):
    """The kernels the full-size codec runs give every sample the same bits however the frames are chunked; except
    bf16 on CPUs with AMX, where oneDNN's bf16 convolutions sum the wide layers (768+ channels) in an order that
    depends on the call's length: there about one sample in 10^4 moves by about one bf16 step (measured: 14 of 122,880
    in the 1024 -> 1536 conv, at most 18 per layer, each within ~1 step of the layer's largest output)."""
    from leapvox.engine.fast import kernels
    from leapvox.engine.nets.codec import CausalConv1d, CausalTransConv1d

    exact = dtype == torch.float32 or "amx_bf16" not in kernels.cpu_flags()

    g = torch.Generator().manual_seed(0)
    convs = [(CausalConv1d(ci, co, k, dilation=d), ci, f) for ci, co, k, d, f in CONVS]
    convs += [(CausalTransConv1d(ci, co, k, s), ci, f) for ci, co, k, s, f in TRANS_CONVS]
    for conv, c_in, f in convs:
        use_ops(conv, FastCodecOps())
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / c_in**0.5)
        conv.to(dtype)
        x = torch.randn(1, c_in, 20 * f, generator=g).to(dtype)
        cache, parts, s = {}, [], 0
        for n in (1, 2, 4, 8, 5):
            parts.append(conv(x[..., s * f : (s + n) * f], cache))
            s += n
        chunked, whole = torch.cat(parts, dim=-1), conv(x)
        if exact:
            assert torch.equal(chunked, whole), conv
        else:
            d = (chunked.float() - whole.float()).abs()
            assert (d > 0).float().mean() < 1e-3, conv
            assert float(d.max()) <= 2**-7 * float(whole.float().abs().max()), conv
