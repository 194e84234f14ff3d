"""The overhead-free predictor loop equals the plain module loop bit for bit, with the same random draws."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from leapvox.engine.config import CodePredictorConfig
from leapvox.engine.fast import kernels
from leapvox.engine.fast.fused import fuse_stack_layers
from leapvox.engine.fast.predictor import PredictorLoop, loop_for, predict_codes, predict_codes_reference
from leapvox.engine.fast.quant import fuse_layers, quantized_linear, w4a8_unavailable_reason, w8a8_unavailable_reason
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.sampling import SamplingParams

CFG = CodePredictorConfig(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
)
# head_dim 32: shapes the fused w8a8 layer (engine/fast/fused.py) takes, so "w8a8-fused" runs both loops through it
CFG_FUSED = dataclasses.replace(CFG, head_dim=32)


def predictor(weights: str, talker_hidden: int = 48, seed: int = 0) -> CodePredictor:
    """A random predictor (talker_hidden != hidden: with the 1.7B input projection) in `weights` format
    ("w8a8-fused": w8a8 at head_dim 32, whose layers run as one compiled call each where the kernel is built;
    "w4a8-fused": the same in w4a8, whose down projection (96 input features, not a multiple of 64) keeps w8a8)."""
    torch.manual_seed(seed)
    fused = weights.endswith("-fused")
    weights = weights.removesuffix("-fused")
    if fused and kernels.layer_op() is None:
        pytest.skip(f"the compiled w8a8 kernel is not available here ({kernels.unavailable_reason()})")
    cp = CodePredictor(CFG_FUSED if fused else CFG, talker_hidden).eval()
    with torch.no_grad():
        for m in cp.modules():  # non-trivial norm weights and sharp heads, so that bit differences would show
            if type(m).__name__ == "RMSNorm":
                m.weight.normal_(1.0, 0.3)
        for head in cp.lm_head:
            head.weight.mul_(6)
    if weights == "bf16":
        cp = cp.to(torch.bfloat16)
    if weights == "w8a8" and w8a8_unavailable_reason():
        pytest.skip(f"w8a8 does not run here: {w8a8_unavailable_reason()}")
    if weights == "w4a8" and w4a8_unavailable_reason():
        pytest.skip(f"w4a8 does not run here: {w4a8_unavailable_reason()}")
    if weights in ("int8", "w8a8", "w4a8"):
        for parent in list(cp.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, quantized_linear(child, weights, name))
        if weights in ("w8a8", "w4a8"):  # as the loader does: q/k/v and gate/up fused into one product each
            assert fuse_layers(cp.model.layers) == 2 * len(cp.model.layers)
            if fused:  # and each layer one compiled call
                assert fuse_stack_layers(cp.model.layers) == len(cp.model.layers)
    cp.model.setup_cache(CFG.num_code_groups)
    if fused:
        assert all(L.fused is not None for L in PredictorLoop(cp).layers)
    return cp


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "w8a8", "w8a8-fused", "w4a8-fused"])
@pytest.mark.parametrize("split", [False, True])
def test_fast_loop_equals_module_loop(weights, split):
    cp = predictor(weights)
    loop = PredictorLoop(cp, split=split)
    dtype = cp.model.norm.weight.dtype
    for do_sample in (True, False):
        params = SamplingParams(do_sample=do_sample, temperature=0.9, top_k=20)
        for seed in range(6):
            g = torch.Generator().manual_seed(seed)
            h, e = torch.randn(2, 1, 1, 48, generator=g).to(dtype)
            g_ref, g_fast = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            with torch.inference_mode():
                ref = predict_codes_reference(cp, h, e, params, g_ref)
                rows = cp.prefill_rows(h, e)
                hidden_ref = cp.model(rows, 0)[:, -1]
            fast = loop(h, e, params, g_fast)
            assert torch.equal(fast, ref), (weights, split, do_sample, seed)
            assert torch.equal(g_fast.get_state(), g_ref.get_state())  # the same draws, in the same order
            with torch.inference_mode():
                assert torch.equal(loop.hidden(rows[0], 0), hidden_ref)  # bit for bit, not just the same codes


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "w8a8", "w8a8-fused", "w4a8-fused"])
def test_verify_rows_equal_the_module_path_and_commit_moves_rows(weights):
    """spec's verify call on the hot loop (tree mask, depth positions) = DecoderStack.forward with the same mask and
    positions (bit for bit but for fp32's split products); commit() copies accepted rows into place."""
    from leapvox.engine.spec import DEFAULT_TREE

    cp = predictor(weights, seed=1)
    tree = DEFAULT_TREE
    nodes, start = len(tree.parent), 5
    cp.model.setup_cache(start + nodes)
    loop = PredictorLoop(cp, split=True)
    loop.reserve(start + nodes)
    dtype = cp.model.norm.weight.dtype
    g = torch.Generator().manual_seed(3)
    prefix, x = torch.randn(1, start, 64, generator=g).to(dtype), torch.randn(1, nodes, 64, generator=g).to(dtype)
    mask = torch.ones(nodes, start + nodes, dtype=torch.bool)
    mask[:, start:] = tree.ancestor_mask()
    positions = torch.tensor(tree.depth) + start
    with torch.inference_mode():
        cp.model(prefix, 0)
        ref = cp.model(x, start, mask, positions)[0]
        loop.hidden(prefix[0], 0)
        fast = loop.rows(x[0], start, mask, positions)
        # fp32 verify rows take the two-half split products: equal up to rounding; bf16 and int8 bit for bit
        same = (lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-5)) if weights == "fp32" else torch.equal
        assert same(fast, ref)
        for layer, cache in enumerate(cp.model.caches):
            k, v = loop.kv(layer, start + nodes)
            assert same(k, cache.k[0, :, : start + nodes]) and same(v, cache.v[0, :, : start + nodes])
        path = torch.tensor([2, 6]) + start  # two accepted nodes -> slots start+1, start+2
        want = loop.kv(0, start + nodes)[0][:, path].clone()
        loop.commit(path, start + 1)
        assert torch.equal(loop.kv(0, start + 3)[0][:, start + 1 :], want)
        with pytest.raises(RuntimeError, match="too small"):
            loop.rows(x[0], loop.positions, mask, positions)


def test_split_product_uses_two_halves_and_keeps_bits():
    from leapvox.engine.fast.predictor import product

    for out_features, bias in ((10, True), (64, False), (9, False)):  # biased or odd: the plain product
        lin = torch.nn.Linear(32, out_features, bias=bias)
        for rows in (1, 3):
            x = torch.randn(rows, 32)
            assert torch.equal(product(lin, split=True)(x), lin(x)), (out_features, bias, rows)


def test_predict_codes_runs_the_loop_and_rebuilds_when_weights_change():
    cp = predictor("fp32")
    params = SamplingParams(do_sample=False)
    h, e = torch.randn(2, 1, 1, 48)
    first = loop_for(cp)
    assert loop_for(cp) is first  # cached
    greedy = predict_codes(cp, h, e, params, None)
    assert not greedy.is_inference()  # usable outside inference mode
    with torch.no_grad():
        cp.lm_head[3].weight.mul_(-1)  # in place: the loop reads the live weights
    assert loop_for(cp) is first
    assert torch.equal(predict_codes(cp, h, e, params, None), predict_codes_reference(cp, h, e, params, None))
    cp.lm_head[3] = torch.nn.Linear(CFG.hidden_size, CFG.vocab_size, bias=False)  # a replaced module: rebuilt
    assert loop_for(cp) is not first
    assert torch.equal(predict_codes(cp, h, e, params, None), predict_codes_reference(cp, h, e, params, None))


def test_batches_take_the_module_loop():
    cp = predictor("fp32")
    cp.model.setup_cache(CFG.num_code_groups, batch=2)
    h, e = torch.randn(2, 2, 1, 48)
    params = SamplingParams(do_sample=False)
    assert torch.equal(predict_codes(cp, h, e, params, None), predict_codes_reference(cp, h, e, params, None))
    with pytest.raises(ValueError, match="batch 1"):
        PredictorLoop(cp)(h, e, params, None)


def test_w8a8_predictor_really_rotates_the_down_projection():
    """The w8a8 builder above exercises both W8A8 layer kinds: plain (fused q/k/v) and with a rotated input
    (96 = 3 x 32)."""
    cp = predictor("w8a8")
    downs = [layer.mlp.down_proj for layer in cp.model.layers]
    assert all(d.rotation is not None and d.rotation.shape == (32, 32) for d in downs)
    assert all(layer.self_attn.qkv_proj.rotation is None for layer in cp.model.layers)


def test_w4a8_predictor_mixes_4_and_8_bit_products_in_one_fused_layer():
    """w4a8 puts a layer's products in 4 bits where the input width is a multiple of 64 and keeps w8a8 elsewhere (the
    down projection here, 96 wide); the heads stay w8a8. The equality tests above run such mixed layers."""
    from leapvox.engine.fast.quant import W4A8Linear, W8A8Linear

    cp = predictor("w4a8-fused")
    for layer in cp.model.layers:
        assert isinstance(layer.self_attn.qkv_proj, W4A8Linear) and isinstance(layer.mlp.gate_up_proj, W4A8Linear)
        assert isinstance(layer.self_attn.o_proj, W4A8Linear)
        assert type(layer.mlp.down_proj) is W8A8Linear and layer.mlp.down_proj.rotation is not None
    assert all(type(h) is W8A8Linear for h in cp.lm_head)
