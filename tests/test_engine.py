"""Engine invariants on a tiny random model: fast paths equal naive paths; prompt layout; stopping."""

import torch

from leapvox.engine.backend import TorchBackend
from leapvox.engine.decode import DecodeStats
from leapvox.engine.fast.predictor import predict_codes
from leapvox.engine.options import SynthesisOptions, guard_frames
from leapvox.engine.prompt import build_prompt, control_prefix
from leapvox.engine.sampling import SamplingParams
from leapvox.engine.synthesis import decode_frames

# <|im_start|> assistant \n  t1 t2 t3 t4  <|im_end|> \n <|im_start|> assistant \n
IDS = [190, 150, 10, 20, 21, 22, 23, 191, 10, 190, 150, 10]


def test_config_reads_ids_and_ignores_unknown_keys(tiny_model):
    cfg, _ = tiny_model
    assert cfg.talker.codec_eos_token_id == 2150 and cfg.talker.spk_id["eric"] == 2875
    assert cfg.talker.code_predictor.vocab_size == 64
    assert cfg.languages == ["auto", "chinese", "english"]
    assert not cfg.supports_instruct


def test_incremental_decode_equals_full_forward(tiny_model):
    _, model = tiny_model
    talker = model.talker
    x = torch.randn(1, 12, 64)
    with torch.no_grad():
        talker.model.setup_cache(32)
        h_full, logits_full = talker(x, 0)
        h_pre, _ = talker(x[:, :7], 0)
        steps = [h_pre] + [talker(x[:, i : i + 1], i)[0] for i in range(7, 12)]
    assert (torch.cat(steps, 1) - h_full).abs().max() < 1e-5
    assert logits_full.shape == (1, 12, 3072)


def test_predict_codes_equals_teacher_forced_full_forward(tiny_model):
    _, model = tiny_model
    cp = model.talker.code_predictor
    h, c0 = torch.randn(1, 1, 64), torch.tensor([[5]])
    greedy = SamplingParams(do_sample=False)
    with torch.no_grad():
        cp.model.setup_cache(16)
        codes = predict_codes(cp, h, model.talker.embed_codec(c0), greedy, None)  # [1, 15]
        rows = [cp.prefill_rows(h, model.talker.embed_codec(c0))]
        rows += [cp.embed(g, codes[:, g - 1 : g]) for g in range(1, 15)]
        hidden = cp.model(torch.cat(rows, 1), 0)  # [1, 16, Hc]
        ref = [cp.lm_head[g](hidden[:, g + 1]).argmax(-1) for g in range(15)]
    assert codes[0].tolist() == torch.cat(ref).tolist()


def test_prompt_lengths_follow_layout(tiny_model):
    cfg, model = tiny_model
    talker = model.talker
    n = 4
    p = build_prompt(talker, cfg, IDS, "ryan", "english", "non-streaming")
    assert p.embeds.shape[1] == n + 11 and p.trailing.shape[1] == 1
    p = build_prompt(talker, cfg, IDS, "ryan", "auto", "non-streaming")
    assert p.embeds.shape[1] == n + 10  # auto: no language row
    p = build_prompt(talker, cfg, IDS, "ryan", "english", "streaming")
    assert p.embeds.shape[1] == 10 and p.trailing.shape[1] == n  # t2..t4 + EOS_T
    assert torch.equal(p.step_text(n + 3), p.pad)


def test_control_prefix_dialects_and_auto(tiny_model):
    cfg, _ = tiny_model
    assert control_prefix(cfg, "ryan", "english") == [2154, 2156, 2050, 2157, 3061, 2148, 2149]
    assert control_prefix(cfg, "ryan", "auto") == [2155, 2156, 2157, 3061, 2148, 2149]
    assert control_prefix(cfg, "eric", "chinese")[2] == 2062
    assert control_prefix(cfg, "dylan", "auto") == [2154, 2156, 2074, 2157, 2878, 2148, 2149]
    assert control_prefix(cfg, "eric", "english")[2] == 2050


def _run(cfg, model, opts, max_frames):
    prompt = build_prompt(model.talker, cfg, IDS, "ryan", "english")
    stats = DecodeStats()
    gen = torch.Generator().manual_seed(opts.seed or 0)
    frames = list(decode_frames(TorchBackend(model.talker), model.talker, prompt, opts, max_frames, gen, stats))
    return frames, stats


def test_generation_respects_cap_and_valid_ranges(tiny_model):
    cfg, model = tiny_model
    frames, stats = _run(cfg, model, SynthesisOptions(seed=3), 9)
    assert len(frames) == 9 and stats.stop_reason == "max_frames"
    codes = torch.stack(frames)
    assert codes.shape == (9, 16)
    assert int(codes[:, 0].max()) < 2048 and int(codes[:, 1:].max()) < 64


class EosHead(torch.nn.Module):
    """A code-0 head that always prefers EOS by a wide margin."""

    def forward(self, h):
        logits = torch.zeros(*h.shape[:-1], 3072)
        logits[..., 2150] = 100.0
        return logits


def test_generation_stops_on_eos_after_at_least_two_frames(tiny_model):
    cfg, model = tiny_model
    model.talker.codec_head = EosHead()  # the minimum-length rule must still give 2 frames
    frames, stats = _run(cfg, model, SynthesisOptions(seed=1), 50)
    assert stats.stop_reason == "eos" and len(frames) == 2


def test_seeded_generation_is_reproducible(tiny_model):
    cfg, model = tiny_model
    a, _ = _run(cfg, model, SynthesisOptions(seed=7), 6)
    b, _ = _run(cfg, model, SynthesisOptions(seed=7), 6)
    c, _ = _run(cfg, model, SynthesisOptions(seed=8), 6)
    assert torch.equal(torch.stack(a), torch.stack(b)) and not torch.equal(torch.stack(a), torch.stack(c))


def test_guard_grows_with_text():
    assert guard_frames(1) < guard_frames(10) and guard_frames(10) >= 100


def test_cache_free_training_pass_equals_cached_forward(tiny_model):
    _, model = tiny_model
    stack = model.talker.model
    x = torch.randn(2, 9, 64)
    with torch.no_grad():
        stack.setup_cache(16, batch=2)
        cached = stack(x, 0)
        free = stack.eval().forward_train(x)
    assert (cached - free).abs().max() < 1e-5
