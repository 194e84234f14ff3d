"""Core ML export: the export wrappers against the engine (fp32, and simulated fp16 / int8 weights), activation
figures, and the conversion of a tiny checkpoint with its .mlpackage inspected. Core ML predictions need macOS."""

from __future__ import annotations

import copy

import pytest
import torch

from leapvox.engine.coreml.wrappers import (
    MASK_MIN,
    PredictorCall,
    PredictorSlots,
    TalkerDecode,
    TalkerPrefill,
    additive_mask,
    new_kv_state,
    rms_norm,
)
from leapvox.engine.fast.predictor import predict_codes
from leapvox.engine.sampling import SamplingParams
from leapvox.engine.spec import DEFAULT_TREE, DraftPlan, SpecStats, predict_codes_spec
from leapvox.models.recipes.coreml_export import (
    ExportSettings,
    calibrate_predictor,
    fp16_risk,
    predictor_context,
)

GREEDY = SamplingParams(do_sample=False)
TOL = 1e-5  # fp32: the wrappers sum in another order (attention over all slots, batched heads) than the engine


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def frame_inputs(talker, seed: int):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(1, 1, talker.cfg.hidden_size, generator=g)
    c0 = talker.embed_codec(torch.randint(0, 2048, (1, 1), generator=g))
    return h, c0


def row_of(cp, code_index: int, token: int) -> torch.Tensor:
    """Talker-width input row [1, 1, Ht] for code `code_index` (1..15); a zero row past the last table."""
    tables = cp.model.codec_embedding
    if code_index > len(tables):
        return torch.zeros(1, 1, tables[0].embedding_dim)
    return tables[code_index - 1](torch.tensor([[token]]))


# ------------------------------------------------------------------------------------------- host loops (greedy)


def wrapper_ar_frame(cp, calls, slots, h, c0, logits_out=None):
    """Codes 1..15 with the prefill and ar wrappers (greedy); optionally collects each step's logits."""
    slots.reset()
    s = slots.alloc(2)
    logits, _ = calls["prefill"](torch.cat([h, c0], 1), i32([0, 1]), i32(s),
                                 slots.mask(s, torch.ones(2, 2, dtype=torch.bool).tril()), i32([0]))
    slots.commit(s)
    codes, row_logits = [], logits[1]
    for g in range(1, 16):
        if logits_out is not None:
            logits_out.append(row_logits)
        codes.append(int(row_logits.argmax()))
        if g == 15:
            break
        s = slots.alloc(1)
        row_logits = calls["ar"](row_of(cp, g, codes[-1]), i32([g + 1]), i32(s),
                                 slots.mask(s, torch.ones(1, 1, dtype=torch.bool)), i32([g]))[0]
        slots.commit(s)
    return codes


def wrapper_spec_frame(cp, calls, slots, tree, h, c0):
    """Codes 1..15 with the fused draft + verify wrappers (greedy), and the number of calls (as SpecStats)."""
    slots.reset()
    s = slots.alloc(2)
    logits, drafts = calls["prefill"](torch.cat([h, c0], 1), i32([0, 1]), i32(s),
                                      slots.mask(s, torch.ones(2, 2, dtype=torch.bool).tril()), i32([0]))
    slots.commit(s)
    tok, draft = int(logits[1].argmax()), drafts[1]
    codes, k, calls_made = [tok], 1, 1
    kids = tree.children()
    while k < 15:
        widths = tree.widths()
        cands = [torch.topk(draft[d], w).indices for d, w in enumerate(widths)]
        node_tok = [tok] + [int(cands[d - 1][r]) for d, r in zip(tree.depth[1:], tree.rank[1:], strict=True)]
        rows = torch.cat([row_of(cp, k + d, t) for d, t in zip(tree.depth, node_tok, strict=True)], dim=1)
        s = slots.alloc(len(node_tok))
        positions = i32([k + 1 + d for d in tree.depth])
        logits, drafts = calls["verify"](rows, positions, i32(s), slots.mask(s, tree.ancestor_mask()), i32([k]))
        calls_made += 1
        u, path, next_tok = 0, [], None
        while k + tree.depth[u] < 15:
            target = int(logits[u].argmax())
            child = next((c for c in kids[u] if node_tok[c] == target), None)
            if child is None:
                next_tok = target
                break
            path.append(child)
            u = child
        slots.commit([s[0]] + [s[i] for i in path])
        codes += [node_tok[i] for i in path]
        k += len(path)
        if next_tok is None:
            break
        codes.append(next_tok)
        tok, draft, k = next_tok, drafts[u], k + 1
    return codes, calls_made


def predictor_calls(cp, tree, offsets, drafts=3, scales=None):
    state = new_kv_state(cp.model, predictor_context(tree), next(cp.parameters()).dtype)
    calls = {
        "prefill": PredictorCall(cp, state, (0, 0), drafts, offsets, scales),
        "ar": PredictorCall(cp, state, (0,), 0, offsets, scales),
        "verify": PredictorCall(cp, state, tree.depth, drafts, offsets, scales),
    }
    return calls, PredictorSlots(predictor_context(tree))


# ------------------------------------------------------------------------------------------- fp32 equivalence


@torch.no_grad()
def test_talker_prefill_and_decode_equal_the_engine(tiny_model):
    """The one parity test of the Core ML backend of the decoder layer (`coreml_wrappers._Stack._layer`) against the
    Python layer (`transformer.DecoderLayer`), through the talker's prefill and decode steps; the predictor tests
    below check the call formulas built on it (heads, slots, drafts)."""
    _, model = tiny_model
    talker = model.talker
    ctx, p, n = 48, 16, 11
    state = new_kv_state(talker.model, ctx)
    prefill, decode = TalkerPrefill(talker, state, p), TalkerDecode(talker, state)
    x = torch.randn(1, n, 64, generator=torch.Generator().manual_seed(1))
    talker.model.setup_cache(ctx)
    h_ref, logits_ref = talker(x, 0)
    h, logits = prefill(torch.cat([x, torch.randn(1, p - n, 64)], dim=1))  # padded prompt
    assert (h[:, :n] - h_ref).abs().max() < TOL and (logits[:, :n] - logits_ref).abs().max() < TOL
    for step in range(6):
        pos = n + step
        row = torch.randn(1, 1, 64)
        h_ref, logits_ref = talker(row, pos)
        h, logits = decode(row, i32([pos]), additive_mask(torch.arange(ctx) <= pos)[None])
        assert (h - h_ref).abs().max() < TOL and (logits - logits_ref).abs().max() < TOL
        assert logits.argmax() == logits_ref.argmax()
    for i, c in enumerate(talker.model.caches):  # the state buffers hold the engine's cache
        assert (state[2 * i][:, :, : n + 6] - c.k[:, :, : n + 6]).abs().max() < TOL
        assert (state[2 * i + 1][:, :, : n + 6] - c.v[:, :, : n + 6]).abs().max() < TOL


@torch.no_grad()
def test_predictor_ar_equals_the_engine(tiny_model):
    _, model = tiny_model
    talker, cp = model.talker, model.talker.code_predictor
    calls, slots = predictor_calls(cp, DEFAULT_TREE, None)
    for seed in range(4):
        h, c0 = frame_inputs(talker, seed)
        cp.model.setup_cache(18)
        ref = predict_codes(cp, h, c0, GREEDY, None)[0].tolist()
        got_logits = []
        assert wrapper_ar_frame(cp, calls, slots, h, c0, got_logits) == ref
        # logits of every step, against the engine fed the same codes
        cp.model.setup_cache(18)
        x = cp.prefill_rows(h, c0)
        hid = cp.model(x, 0)[:, -1]
        for g in range(15):
            assert (cp.lm_head[g](hid)[0] - got_logits[g]).abs().max() < TOL
            if g < 14:
                hid = cp.model(cp.embed(g + 1, torch.tensor([[ref[g]]])), g + 2)[:, -1]


@pytest.mark.parametrize("per_position", [False, True])
@torch.no_grad()
def test_fused_draft_and_verify_equal_spec_mode(tiny_model, per_position):
    """Greedy spec frames through the wrappers give spec mode's codes (= ar's) in the same number of calls."""
    _, model = tiny_model
    talker, cp = model.talker, model.talker.code_predictor
    g = torch.Generator().manual_seed(3)
    shape = (15, 3, cp.cfg.hidden_size) if per_position else (3, cp.cfg.hidden_size)
    offsets = 0.5 * torch.randn(shape, generator=g)
    calls, slots = predictor_calls(cp, DEFAULT_TREE, offsets)
    for seed in range(6):
        h, c0 = frame_inputs(talker, seed)
        spec, stats = DraftPlan(DEFAULT_TREE, offsets), SpecStats()
        cp.model.setup_cache(16 + DEFAULT_TREE.size + 2)
        ref = predict_codes_spec(cp, h, c0, GREEDY, None, spec, stats)[0].tolist()
        codes, n_calls = wrapper_spec_frame(cp, calls, slots, DEFAULT_TREE, h, c0)
        assert codes == ref
        assert n_calls == stats.calls


@torch.no_grad()
def test_verify_logits_and_drafts_equal_the_engine(tiny_model):
    """One verify call: per node, head k + depth on the node's hidden, and drafts from heads further on."""
    _, model = tiny_model
    talker, cp = model.talker, model.talker.code_predictor
    tree, k = DEFAULT_TREE, 4
    offsets = 0.3 * torch.randn(15, 3, cp.cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    calls, slots = predictor_calls(cp, tree, offsets)
    h, c0 = frame_inputs(talker, 9)
    prefix = [3, 17, 41]  # codes 1..3 committed; the root carries code 4
    toks = [7] + [(5 * i) % 64 for i in range(1, len(tree.depth))]
    # engine: prefix rows at slots 0..k, then the tree under its mask
    cp.model.setup_cache(16 + tree.size + 2)
    cp.model(cp.prefill_rows(h, c0), 0)
    for g, code in enumerate(prefix, start=1):
        cp.model(cp.embed(g, torch.tensor([[code]])), g + 1)
    rows_p = torch.cat([cp.embed(k + d, torch.tensor([[t]])) for d, t in zip(tree.depth, toks, strict=True)], 1)
    mask = torch.ones(len(toks), k + 1 + len(toks), dtype=torch.bool)
    mask[:, k + 1 :] = tree.ancestor_mask()
    hidden = cp.model(rows_p, k + 1, mask, torch.tensor(tree.depth) + k + 1)[0]
    # wrappers: the same rows, committed through prefill + ar
    slots.reset()
    s = slots.alloc(2)
    calls["prefill"](torch.cat([h, c0], 1), i32([0, 1]), i32(s), slots.mask(s, torch.ones(2, 2).bool().tril()),
                     i32([0]))
    slots.commit(s)
    for g, code in enumerate(prefix, start=1):
        s = slots.alloc(1)
        calls["ar"](row_of(cp, g, code), i32([g + 1]), i32(s), slots.mask(s, torch.ones(1, 1).bool()), i32([g]))
        slots.commit(s)
    rows = torch.cat([row_of(cp, k + d, t) for d, t in zip(tree.depth, toks, strict=True)], dim=1)
    s = slots.alloc(len(toks))
    logits, drafts = calls["verify"](rows, i32([k + 1 + d for d in tree.depth]), i32(s),
                                     slots.mask(s, tree.ancestor_mask()), i32([k]))
    for u, d in enumerate(tree.depth):
        assert (logits[u] - cp.lm_head[k + d](hidden[u])).abs().max() < TOL
        for j in range(1, 4):
            want = cp.lm_head[min(k + d + j, 14)](hidden[u] + offsets[k + d, j - 1])
            assert (drafts[u, j - 1] - want).abs().max() < TOL


def test_masks_are_finite():
    m = additive_mask(torch.tensor([True, False]))
    assert torch.isfinite(m).all() and m.tolist() == [0.0, MASK_MIN]
    assert torch.isfinite(PredictorSlots(8).mask([0, 1], torch.eye(2, dtype=torch.bool))).all()


def test_scaled_rms_norm_is_bit_identical():
    from leapvox.engine.nets.layers import RMSNorm

    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.normal_()
    x = 300 * torch.randn(5, 64)
    for s in (2.0, 256.0, 1024.0):
        assert torch.equal(rms_norm(norm, x, s), norm(x))


# ------------------------------------------------------------------------------------------- fp16 / int8 weights


def quantize_int8_per_channel(model: torch.nn.Module) -> None:
    """Round every Linear weight to int8 per output channel (symmetric), as linear_quantize_weights does."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                w = mod.weight
                scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
                w.copy_((w / scale).round().clamp(-127, 127) * scale)


@torch.no_grad()
def test_fp16_and_int8_weights_stay_within_measured_tolerance(tiny_model):
    """W8A16 simulated in torch: int8 per-channel weights, fp16 weights and activations (norm statistics in fp32,
    as torch computes them). Logit error relative to the logit spread, and top-1 agreement, over verify calls."""
    _, model = tiny_model
    talker, cp = model.talker, model.talker.code_predictor
    tree = DEFAULT_TREE
    offsets = 0.3 * torch.randn(15, 3, cp.cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    q = copy.deepcopy(talker)
    quantize_int8_per_channel(q)
    ref_calls, ref_slots = predictor_calls(cp, tree, offsets)
    sim_calls, sim_slots = predictor_calls(q.code_predictor.half(), tree, offsets.half())
    errs, agree, total = [], 0, 0
    for seed in range(4):
        h, c0 = frame_inputs(talker, seed)
        rows = torch.cat([row_of(cp, 1 + d, 11 * seed + 3 * i) for i, d in enumerate(tree.depth)], dim=1)
        for calls, slots, dt in ((ref_calls, ref_slots, torch.float32), (sim_calls, sim_slots, torch.float16)):
            slots.reset()
            s = slots.alloc(2)
            calls["prefill"](torch.cat([h, c0], 1).to(dt), i32([0, 1]), i32(s),
                             slots.mask(s, torch.ones(2, 2).bool().tril(), dt), i32([0]))
            slots.commit(s)
            s = slots.alloc(len(tree.depth))
            out = calls["verify"](rows.to(dt), i32([2 + d for d in tree.depth]), i32(s),
                                  slots.mask(s, tree.ancestor_mask(), dt), i32([1]))
            if dt == torch.float32:
                ref = out
        for a, b in zip(ref, out, strict=True):
            errs.append(float((a - b.float()).abs().max() / a.std()))
            agree += int((a.argmax(-1) == b.float().argmax(-1)).sum())
            total += a.argmax(-1).numel()
    worst = max(errs)
    print(f"\nW8A16 simulation: max |logit error| / logit std = {worst:.4f}; top-1 agreement {agree}/{total}")
    assert worst < 0.1
    assert agree / total > 0.9


# ------------------------------------------------------------------------------------------- activation figures


def test_activation_figures_fit_fp16(tiny_model):
    """Max activation magnitudes in fp32 (tiny model and a random-weight 0.6B-size predictor) stay far below fp16's
    65504; RMSNorm's sum of squares is what comes closest, hence the power-of-two input scales."""
    from leapvox.engine.config import CodePredictorConfig
    from leapvox.engine.nets.code_predictor import CodePredictor
    from leapvox.models.recipes.geometry import PREDICTOR_0_6B

    _, model = tiny_model
    tiny = fp16_risk(calibrate_predictor(model.talker.code_predictor, 64))
    with torch.device("meta"):
        big_cp = CodePredictor(CodePredictorConfig(**PREDICTOR_0_6B), talker_hidden=1024)
    big_cp = big_cp.to_empty(device="cpu").eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # unit-RMS embedding rows and norm gains, 1/sqrt(fan-in) matrices
        for name, p in big_cp.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if "norm" in name else p.zero_()
            else:
                p.normal_(0, 1.0 if "embedding" in name else p.shape[1] ** -0.5, generator=g)
    big = fp16_risk(calibrate_predictor(big_cp, 1024, frames=2))
    print(f"\ntiny: {tiny}\n0.6B-size random predictor: {big}")
    for r in (tiny, big):
        assert r["activations_fit_fp16"]


# ------------------------------------------------------------------------------------------- conversion


def one_layer_model():
    """The tiny checkpoint's architecture with one layer per stack (conversion time grows with the op count)."""
    from leapvox.engine.config import TTSConfig
    from leapvox.engine.nets.talker import TTSModel

    from .conftest import tiny_config_dict

    d = tiny_config_dict(num_hidden_layers=1)
    d["talker_config"]["code_predictor_config"]["num_hidden_layers"] = 1
    torch.manual_seed(0)
    return TTSModel(TTSConfig.from_dict(d).talker).eval()


def test_export_tiny_and_inspect_package(tmp_path):
    pytest.importorskip("coremltools", reason="coremltools is not installed (pip install 'leapvox[coreml]')")
    from leapvox.models.recipes.coreml_export import export_modules, inspect_package

    model = one_layer_model()
    settings = ExportSettings(prefill_len=16, context=48)
    offsets = 0.1 * torch.randn(15, 3, 32)
    manifest = export_modules(model.talker, tmp_path / "out", settings, offsets, say=lambda m: None)
    assert sorted(manifest["parts"]) == ["predictor", "talker"]
    assert not list(tmp_path.glob(".out.*")), "the temp folder is renamed into place"
    pred = inspect_package(tmp_path / "out" / "predictor.mlpackage")
    talk = inspect_package(tmp_path / "out" / "talker.mlpackage")
    assert sorted(pred["functions"]) == ["ar", "prefill", "verify"]
    assert sorted(talk["functions"]) == ["decode", "prefill"]
    n = DEFAULT_TREE.size + 1
    ctx = predictor_context(DEFAULT_TREE)
    v = pred["functions"]["verify"]
    assert v["inputs"] == {"rows": {"shape": [1, n, 64], "dtype": "FLOAT16"},
                           "positions": {"shape": [n], "dtype": "INT32"}, "slots": {"shape": [n], "dtype": "INT32"},
                           "mask": {"shape": [n, ctx], "dtype": "FLOAT16"}, "k": {"shape": [1], "dtype": "INT32"}}
    assert v["outputs"] == ["logits", "drafts"]
    assert pred["functions"]["ar"]["outputs"] == ["logits"]
    d = talk["functions"]["decode"]
    assert list(d["inputs"]) == ["x", "pos", "mask"] and d["outputs"] == ["hidden", "logits"]
    for pkg, names in ((pred, ("prefill", "ar", "verify")), (talk, ("prefill", "decode"))):
        for name in names:
            f = pkg["functions"][name]
            assert f["states"] == {"k0": [1, 2, f["states"]["k0"][2], f["states"]["k0"][3]],
                                   "v0": [1, 2, f["states"]["k0"][2], f["states"]["k0"][3]]}
            assert f["ops"].get("write_state", 0) == 2, "every function writes the layer's K and V"
            assert f["weights"].get("INT8", 0) >= 1, "W8A16: int8 weights"
            assert f["off_ane_ops"] == [], f"{name}: ops that would leave the Neural Engine"
            assert f["fp32_ops"] == 0, f"{name}: everything computes in fp16"
    assert talk["functions"]["decode"]["ops"]["slice_update"] == 2  # one slot written at a dynamic index
    assert pred["functions"]["verify"]["states"]["k0"] == [1, 2, ctx, 8]
    assert talk["functions"]["decode"]["states"]["k0"] == [1, 2, 48, 16]
    print(f"\nconversion: {manifest['parts']['predictor']['functions']} {manifest['parts']['talker']['functions']}")


class CoreMLCall:
    """A Core ML function called like a PredictorCall wrapper; every function shares one state object."""

    def __init__(self, path, name, outputs, shared):
        import coremltools as ct

        self.ml = ct.models.MLModel(str(path), function_name=name)
        self.outputs, self.shared = outputs, shared
        if "state" not in shared:
            shared["state"] = self.ml.make_state()

    def __call__(self, rows, positions, slots, mask, k):
        import numpy as np

        feed = {"rows": rows.numpy().astype(np.float16), "positions": positions.numpy(), "slots": slots.numpy(),
                "mask": mask.numpy().astype(np.float16), "k": k.numpy()}
        out = self.ml.predict(feed, self.shared["state"])
        got = tuple(torch.from_numpy(out[n].astype("float32")) for n in self.outputs)
        return got if len(got) > 1 else got[0]


@pytest.mark.macos  # skipped off macOS: Core ML predictions cannot run on Linux (conftest.py)
@torch.no_grad()
def test_coreml_predictor_matches_the_wrappers(tiny_model, tmp_path):  # pragma: no cover - macOS only
    """On a Mac: greedy spec frames through the exported predictor (fp16 weights) against the torch wrappers."""
    from leapvox.models.recipes.coreml_export import export_modules

    _, model = tiny_model
    settings = ExportSettings(prefill_len=16, context=48, weights="fp16", parts=("predictor",))
    offsets = 0.3 * torch.randn(15, 3, 32, generator=torch.Generator().manual_seed(4))
    export_modules(model.talker, tmp_path / "out", settings, offsets, say=lambda m: None)
    cp = model.talker.code_predictor
    pkg = tmp_path / "out" / "predictor.mlpackage"
    shared: dict = {}
    ml_calls = {"prefill": CoreMLCall(pkg, "prefill", ["logits", "drafts"], shared),
                "ar": CoreMLCall(pkg, "ar", ["logits"], shared),
                "verify": CoreMLCall(pkg, "verify", ["logits", "drafts"], shared)}
    calls, slots = predictor_calls(cp, DEFAULT_TREE, offsets)
    same = 0
    for seed in range(4):
        h, c0 = frame_inputs(model.talker, seed)
        ref, _ = wrapper_spec_frame(cp, calls, slots, DEFAULT_TREE, h, c0)
        got, _ = wrapper_spec_frame(cp, ml_calls, PredictorSlots(slots.context), DEFAULT_TREE, h, c0)
        same += got == ref
    assert same >= 3, "fp16 may flip a near-tie now and then, not most frames"


# ------------------------------------------------------------------------------------------- codec


@pytest.fixture(scope="module")
def tiny_codec():
    from leapvox.engine.nets.codec import CodecConfig, CodecDecoder

    from .test_codec import TINY, lively_init

    m = CodecDecoder(CodecConfig.from_dict(TINY)).eval()
    lively_init(m)
    return m


@torch.no_grad()
def test_codec_chunk_equals_the_stream(tiny_codec):
    """Chunks of 4 frames with the carried state as explicit tensors give CodecStream's audio, past the
    72-frame attention window."""
    from leapvox.engine.coreml.wrappers import CodecChunk

    from .test_codec import random_codes

    chunk = CodecChunk(tiny_codec, 4)
    state = chunk.initial_state()
    stream = tiny_codec.stream()
    codes = random_codes(84)
    worst = 0.0
    for s in range(0, 84, 4):
        ref = stream.push(codes[..., s : s + 4])
        wav, *state = chunk(codes[..., s : s + 4].int(), *chunk.host_inputs(s), *state)
        worst = max(worst, float((wav - ref).abs().max()))
    assert worst < 1e-4, worst
    assert all(torch.isfinite(m).all() for m in chunk.host_inputs(100))


@pytest.mark.skipif(not __import__("os").environ.get("LEAPVOX_COREML_CODEC_TEST"),
                    reason="the codec conversion takes about a minute; set LEAPVOX_COREML_CODEC_TEST=1 to run it")
def test_export_codec_and_inspect(tiny_codec, tmp_path):
    pytest.importorskip("coremltools", reason="coremltools is not installed (pip install 'leapvox[coreml]')")
    from leapvox.models.recipes.coreml_export import codec_functions, export_part, inspect_package

    fns = codec_functions(tiny_codec, ExportSettings())
    export_part("codec", fns, [], [], "w8a16", tmp_path, lambda m: None)
    f = inspect_package(tmp_path / "codec.mlpackage")["functions"]["main"]
    n_state = len(fns["step"].module.state_shapes())
    assert list(f["inputs"])[:4] == ["codes", "cos", "sin", "mask"] and len(f["inputs"]) == 4 + n_state
    assert f["outputs"] == ["wav"] + [f"next_state{i}" for i in range(n_state)]
    assert f["weights"].get("INT8", 0) >= 1 and f["off_ane_ops"] == []


def test_a_part_whose_activations_do_not_fit_fp16_is_kept_in_fp32():
    from leapvox.models.recipes.coreml_export import _needs_fp32

    said = []
    assert _needs_fp32("predictor", {"model.layers.3.mlp.down_proj": {"max_abs_out": 3.0e4, "max_abs_in": 9.0}},
                       said.append)
    assert "fp32 compute" in said[0] and "model.layers.3.mlp.down_proj" in said[0]
    assert not _needs_fp32("predictor", {"model.norm": {"max_abs_in": 40.0, "max_rms_in": 3.0}}, said.append)
