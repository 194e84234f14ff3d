"""The demo model's training recipe on a fabricated mini data set: it resumes, and its predictor-only stage moves
the code predictor's layers and heads and nothing else. (Learning itself is measured by the model card's runs,
not here.)"""

from __future__ import annotations

import shutil

import torch

from leapvox.models.catalog import DEMO_DIR
from leapvox.models.recipes.demo.train import train

PHONEMES = ["həlˈoʊ wˈɜːld.", "ðə kwˈɪk bɹˈaʊn fˈɑːks.", "dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.", "ɪts ɐ tˈɛst."]


def fake_data(folder, utterances: int = 12, seed: int = 0):
    """build-data's split layout with random codes (code 0 < 1024, codes 1..15 < 256)."""
    g = torch.Generator().manual_seed(seed)
    for name in ("train", "test"):
        lengths = torch.randint(6, 14, (utterances,), generator=g)
        codes = torch.cat([torch.randint(0, 256, (int(n), 16), generator=g) for n in lengths])
        codes[:, 0] = torch.randint(0, 1024, (len(codes),), generator=g)
        split = {
            "text": [f"sentence {i}" for i in range(len(PHONEMES))], "phonemes": PHONEMES,
            "source": ["fortunes"] * len(PHONEMES), "codes": codes.short(),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "sentence": torch.arange(utterances, dtype=torch.int32) % len(PHONEMES),
        }
        torch.save(split, folder / f"{name}.pt")
    shutil.copytree(DEMO_DIR / "speech_tokenizer", folder / "speech_tokenizer")


def weights(state_file):
    return torch.load(state_file, weights_only=False)["model"]


def test_train_resumes_and_the_predictor_stage_moves_only_the_predictor(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    logs = []
    first = tmp_path / "run"
    train(str(data), str(first), steps=3, batch=4, save_every=3, size="tiny", threads=1, sampled=0.5,
          log=logs.append)
    assert weights(first / "state.pt") and torch.load(first / "state.pt", weights_only=False)["step"] == 3
    assert any(m.startswith("step 3  held-out l0 ") and "  l0s " in m for m in logs)
    old = torch.load(first / "state.pt", weights_only=False)
    assert old["best_by"] == "l0s+lcp" and old["best"] < float("inf")
    del old["best_by"]  # as a run saved before best/ was chosen by l0s + lcp
    old["best"] = -1.0  # a value no new held-out loss beats
    torch.save(old, first / "state.pt")
    shutil.rmtree(first / "best")
    train(str(data), str(first), steps=5, batch=4, save_every=5, size="tiny", threads=1, log=logs.append)
    assert "resumed at step 3" in logs
    assert (first / "best" / "model.safetensors").is_file()  # its old best did not count on the new scale
    assert torch.load(first / "state.pt", weights_only=False)["step"] == 5

    second = tmp_path / "predictor"
    export = train(str(data), str(second), steps=4, batch=4, save_every=4, size="tiny", threads=1,
                   part="predictor", init=str(first / "state.pt"), cp_fraction=1.0, lr=1e-2, log=logs.append)
    assert any(m.startswith("initialised from") for m in logs)
    before, after = weights(first / "state.pt"), weights(second / "state.pt")
    tables = [k for k in before if k.startswith("talker.code_predictor.model.codec_embedding.")]
    predictor = [k for k in before if k.startswith("talker.code_predictor.") and k not in tables]
    rest = [k for k in before if k not in predictor]
    assert predictor and tables and rest
    # the talker is frozen, and so are the code tables it reads for past frames' codes 1..15
    assert all(torch.equal(before[k], after[k]) for k in rest)
    assert sum(not torch.equal(before[k], after[k]) for k in predictor) > len(predictor) // 2
    assert (export / "model.safetensors").is_file() and (export / "speech_tokenizer").is_dir()


def test_grown_predictor_starts_as_the_smaller_one():
    from leapvox.engine.config import TTSConfig
    from leapvox.engine.nets.talker import TTSModel
    from leapvox.models.recipes.demo.train import demo_config, load_grown

    special = {t: 290 + i for i, t in enumerate(["<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
                                                   "<tts_text_eod>"])}
    small_cfg, big_cfg = (TTSConfig.from_dict(demo_config(300, special, 289, "tiny", n)) for n in (2, 3))
    torch.manual_seed(0)
    small, big = TTSModel(small_cfg.talker).eval(), TTSModel(big_cfg.talker).eval()
    assert load_grown(big, small.state_dict()) == {"talker": 0, "predictor": 1}
    assert len(big.talker.code_predictor.model.layers) == 3
    x = torch.randn(2, 5, small_cfg.talker.code_predictor.hidden_size)
    with torch.no_grad():
        a = small.talker.code_predictor.model.forward_train(x)
        b = big.talker.code_predictor.model.forward_train(x)
    assert torch.allclose(a, b, atol=1e-6)


def test_grown_talker_starts_as_the_smaller_one_and_layers_are_never_removed():
    import pytest

    from leapvox.engine.config import TTSConfig
    from leapvox.engine.errors import InputError
    from leapvox.engine.nets.talker import TTSModel
    from leapvox.models.recipes.demo.train import demo_config, load_grown

    special = {t: 290 + i for i, t in enumerate(["<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
                                                   "<tts_text_eod>"])}
    small_cfg, big_cfg = (TTSConfig.from_dict(demo_config(300, special, 289, "tiny", talker_layers=n)) for n in (4, 6))
    torch.manual_seed(0)
    small, big = TTSModel(small_cfg.talker).eval(), TTSModel(big_cfg.talker).eval()
    with torch.no_grad():
        for p in small.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # no zero weights the new layers could hide behind
    assert load_grown(big, small.state_dict()) == {"talker": 2, "predictor": 0}
    assert len(big.talker.model.layers) == 6
    x = torch.randn(2, 7, small_cfg.talker.hidden_size)
    with torch.no_grad():
        a, b = small.talker.model.forward_train(x), big.talker.model.forward_train(x)
    assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(InputError, match="added, not removed"):
        load_grown(small, big.state_dict())


def test_teacher_forced_codes_keep_code_0_and_sample_the_rest():
    """The WER diagnostic `demo wer --what predictor`: true code 0 of the canonical rendition, the bundled model's
    codes 1..15 (seeded per sentence, so reruns agree)."""
    from leapvox.models.frontend import CANONICAL
    from leapvox.models.load import load_model
    from leapvox.models.recipes.demo.quality import teacher_forced_codes

    g = torch.Generator().manual_seed(1)
    lengths = [7, 9, 5]
    codes = torch.cat([torch.randint(0, 256, (n, 16), generator=g) for n in lengths])
    codes[:, 0] = torch.randint(0, 1024, (len(codes),), generator=g)
    split = {"phonemes": PHONEMES[:2], "codes": codes.short(), "sentence": torch.tensor([0, 0, 1]),
             "offsets": torch.tensor([0, 7, 16, 21]),
             "speed": torch.tensor([CANONICAL[0], 150, CANONICAL[0]]), "pitch": torch.tensor([CANONICAL[1]] * 3)}
    m = load_model(DEMO_DIR)
    out = teacher_forced_codes(m, split, 2)
    assert [tuple(c.shape) for c in out] == [(7, 16), (5, 16)]  # the canonical renditions, in sentence order
    assert torch.equal(out[0][:, 0], codes[:7, 0].long()) and torch.equal(out[1][:, 0], codes[16:, 0].long())
    assert all(int(c[:, 1:].max()) < 256 and int(c[:, 1:].min()) >= 0 for c in out)
    again = teacher_forced_codes(m, split, 2)
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))
    # --true-codes 7: the rendition's codes 0..7, the same draw's codes 8..15
    mixed = teacher_forced_codes(m, split, 2, true_codes=7)
    truth = [codes[:7].long(), codes[16:].long()]
    assert all(torch.equal(c[:, :8], t[:, :8]) for c, t in zip(mixed, truth, strict=True))
    assert all(torch.equal(c[:, 8:], o[:, 8:]) for c, o in zip(mixed, out, strict=True))
    assert not all(torch.equal(c[:, 1:8], o[:, 1:8]) for c, o in zip(mixed, out, strict=True))


def test_time_budget_stops_and_keeps_the_best_export_and_extra_data_is_read(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    torch.save(torch.load(data / "train.pt", weights_only=False), data / "extra.pt")  # a second split, same layout
    logs = []
    run = tmp_path / "run"
    train(str(data), str(run), steps=100_000, batch=4, save_every=100_000, size="tiny", threads=1, minutes=0.02,
          log=logs.append)
    assert 1 <= torch.load(run / "state.pt", weights_only=False)["step"] < 100_000  # the 1.2 s budget ended it
    assert any("24 training utterances (train + extra)" in m for m in logs)
    assert (run / "best" / "model.safetensors").is_file() and (run / "export" / "model.safetensors").is_file()
    assert not list(run.glob("*.part")) and not list(run.glob("*.old"))
    logs.clear()
    train(str(data), str(tmp_path / "no-extra"), steps=1, batch=4, save_every=1, size="tiny", threads=1,
          extra=False, log=logs.append)
    assert any("12 training utterances (train)," in m for m in logs)


def test_init_from_a_model_folder_keeps_its_config_tokenizer_and_weights(tmp_path):
    """Fine-tuning the bundled demo model: its config and tokenizer carry over, and with lr 0 the weights stay
    the folder's (bf16 -> fp32) exactly."""
    from safetensors.torch import load_file

    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    run = tmp_path / "ft"
    export = train(str(data), str(run), steps=1, batch=4, save_every=1, lr=0.0, threads=1, init=str(DEMO_DIR),
                   log=lambda m: None)
    for f in ("config.json", "vocab.json", "merges.txt"):
        assert (export / f).read_text() == (DEMO_DIR / f).read_text()
    shipped = load_file(str(DEMO_DIR / "model.safetensors"))
    after = weights(run / "state.pt")
    assert shipped.keys() == after.keys()
    assert all(torch.equal(shipped[k].float(), after[k]) for k in shipped)


def test_pack_round_trip(tmp_path):
    from leapvox.models.recipes.demo.pack import pack, unpack

    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    with_codec, without = tmp_path / "a.pack", tmp_path / "b.pack"
    pack(data, with_codec)
    pack(data, without, codec=False)
    assert without.stat().st_size < with_codec.stat().st_size
    for src, codec_dir in ((with_codec, None), (without, DEMO_DIR / "speech_tokenizer")):
        out = tmp_path / f"out-{src.stem}"
        assert unpack(src, out, codec_dir) == ["train", "test"]
        for name in ("train", "test"):
            a = torch.load(data / f"{name}.pt", weights_only=False)
            b = torch.load(out / f"{name}.pt", weights_only=False)
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)
        for f in (data / "speech_tokenizer").iterdir():
            assert (out / "speech_tokenizer" / f.name).read_bytes() == f.read_bytes()


def test_extra_sentences_rule_and_dedup():
    from leapvox.models.recipes.demo.data import extra_sentence_ok, new_sentences

    assert extra_sentence_ok("Go away now.")  # 3 words: too short for the main rule, fine here
    assert extra_sentence_ok("Gwyneth visits Llanfair.")  # words outside the ASR dictionary are fine for training
    assert not extra_sentence_ok("Call 911 now.") and not extra_sentence_ok("Stop the NASA budget.")
    assert not extra_sentence_ok("Two words.")
    found = new_sentences(
        [("The cat sat.", "a"), ("the CAT, sat!", "b"), ("He said the dog ran home today.", "c"),
         ("A bird sang.", "d"), ("Mice ran.", "e")],
        train=["A bird sang."], test=["The dog ran home."])
    # equal to a train sentence, containing a test sentence: out; punctuation and case do not separate duplicates
    # of each other here (that is read_corpus's job), only of train and test
    assert found == [("The cat sat.", "a"), ("the CAT, sat!", "b"), ("Mice ran.", "e")]


def test_sampled_residuals_are_the_predictors_own_codes_for_the_input_only():
    """`--sampled-residuals`: the talker's input rows carry codes 1..15 that the model's predictor draws from the
    talker hidden of each frame (greedy here, so the batched draw must equal the engine's per-frame loop), while
    the code-0 targets and the frames the predictor learns from stay the true ones."""
    from leapvox.engine.fast.predictor import predict_codes
    from leapvox.engine.sampling import SamplingParams
    from leapvox.models.load import load_model
    from leapvox.models.recipes.demo.train import Example, make_batch, sampled_residuals

    m = load_model(DEMO_DIR)
    tts, cfg, tok = m.tts.eval(), m.config, m.tokenizer
    g = torch.Generator().manual_seed(3)
    role = tok("<|im_start|>assistant\n")
    batch = []
    for n, ph in zip((6, 9, 4), PHONEMES, strict=False):
        codes = torch.randint(0, 256, (n, 16), generator=g)
        codes[:, 0] = torch.randint(0, 1024, (n,), generator=g)
        batch.append(Example(role, tok(ph), codes))
    greedy = SamplingParams(do_sample=False)
    with torch.no_grad():
        res = sampled_residuals(tts, cfg, batch, [0, 2], None, greedy)
        assert sorted(res) == [0, 2] and [tuple(res[b].shape) for b in (0, 2)] == [(6, 15), (4, 15)]
        x, target, starts, frames = make_batch(tts, cfg, batch)
        h = tts.talker.model.forward_train(x, 0.0)
        for b in (0, 2):  # the per-frame engine loop over the same teacher-forced hidden states
            L, e = starts[b], batch[b]
            want = torch.cat([predict_codes(tts.talker.code_predictor, h[b : b + 1, L - 1 + k][:, None],
                                            tts.talker.embed_codec(e.codes[k : k + 1, :1]), greedy, None)
                              for k in range(len(e.codes))])
            assert torch.equal(res[b], want)
        xs, ts, starts_s, frames_s = make_batch(tts, cfg, batch, residuals=res)
    assert torch.equal(ts, target) and torch.equal(frames_s, frames) and starts_s == starts
    changed = (xs != x).any(-1)  # [B, S]: rows whose input differs
    assert not changed[1].any()  # example 1 was not picked
    for b in (0, 2):
        rows = changed[b].nonzero().flatten().tolist()
        assert rows and set(rows) <= set(range(starts[b], starts[b] + len(batch[b].codes)))


def test_init_from_a_runs_state_takes_that_runs_config_and_a_mismatch_is_a_one_line_error(tmp_path):
    """`--init RUN/state.pt` builds the model RUN/export/ describes, whatever --size says; weights that fit no
    model of that shape are a user error with a hint, not a page of size mismatches."""
    import pytest

    from leapvox.engine.config import TTSConfig
    from leapvox.engine.errors import InputError
    from leapvox.engine.nets.talker import TTSModel
    from leapvox.models.recipes.demo.train import demo_config, load_grown

    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    first = tmp_path / "tiny"
    train(str(data), str(first), steps=1, batch=4, save_every=1, size="tiny", threads=1, log=lambda m: None)
    logs = []
    train(str(data), str(tmp_path / "next"), steps=1, batch=4, save_every=1, lr=0.0, threads=1,
          init=str(first / "state.pt"), log=logs.append)  # default --size is "small", not the run's "tiny"
    assert f"config and tokenizer from {first / 'export'} (--size ignored)" in logs
    before, after = weights(first / "state.pt"), weights(tmp_path / "next" / "state.pt")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

    special = {t: 290 + i for i, t in enumerate(["<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
                                                   "<tts_text_eod>"])}
    small = TTSModel(TTSConfig.from_dict(demo_config(300, special, 289, "small")).talker)
    with pytest.raises(InputError, match="other shapes") as e:
        load_grown(small, before)
    assert "--size" in e.value.hint


def test_excess_distortion_prices_each_code_against_the_residual_its_own_prefix_leaves():
    """`--predictor-objective distortion`: a code's cost is the codec-space error of the codeword it picks for the
    residual that code 0 and the codes it read leave of the frame (the true codewords' sum), above the best
    codeword's, over that residual's energy. Hand-computed on 1-D books."""
    from leapvox.models.recipes.demo.train import excess_distortion

    books = [torch.tensor([[0.0], [10.0]]), torch.tensor([[0.0], [1.0], [3.0]]), torch.tensor([[0.0], [1.0], [2.0]])]
    codes = torch.tensor([[1, 2, 0]])  # z = 10 + 3 + 0 = 13
    big = 50.0

    def onehot(*picks):  # logits [1, 2, 3] with all mass on the picked codewords
        out = torch.full((1, 2, 3), -big)
        for g, c in enumerate(picks):
            out[0, g, c] = big
        return out

    # true prefix: code 1's residual is 3 (codeword 2 exact), code 2's is 0 (codeword 0 exact)
    assert excess_distortion(onehot(2, 0), codes, codes, books).item() < 1e-6
    # read code 1 = 1 instead: code 2's residual is 2, codeword 2 is exact, codeword 0 costs 4 over energy 4
    prefix = torch.tensor([[1, 1, 0]])
    assert excess_distortion(onehot(2, 2), codes, prefix, books).item() < 1e-6
    assert abs(excess_distortion(onehot(2, 0), codes, prefix, books).item() - 1.0 / 2) < 1e-6  # mean of 2
    # code 1 picking codeword 0 for residual 3: cost 9 over energy 9
    assert abs(excess_distortion(onehot(0, 0), codes, codes, books).item() - 1.0 / 2) < 1e-6
    # a spread distribution pays the expected cost; the gradient moves mass to the cheaper codewords
    logits = torch.zeros(1, 2, 3, requires_grad=True)
    loss = excess_distortion(logits, codes, prefix, books)
    # code 1 (residual 3): costs (9, 4, 0) / 9; code 2 (residual 2): costs (4, 1, 0) / 4; uniform mass
    assert abs(loss.item() - (13 / 27 + 5 / 12) / 2) < 1e-6
    loss.backward()
    for g in range(2):
        assert logits.grad[0, g].argmin() == 2 and logits.grad[0, g].argmax() == 0


def test_distortion_objective_trains_only_the_predictor_and_reports_its_loss(tmp_path):
    """The predictor-only stage with the distortion objective runs on the predictor's own draws, reports the
    objective as lcp, keys best/ on it, and leaves the talker and the code tables where they were."""
    from safetensors.torch import load_file

    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    logs = []
    run = tmp_path / "run"
    train(str(data), str(run), steps=3, batch=4, save_every=3, init=str(DEMO_DIR), part="predictor", threads=1,
          lr=1e-2, objective="distortion", log=logs.append)
    state = torch.load(run / "state.pt", weights_only=False)
    assert state["step"] == 3 and state["best_by"] == "l0s+distortion" and state["best"] < float("inf")
    held = [m for m in logs if m.startswith("step 3  held-out")]
    lcp = float(held[0].split("lcp ")[1].split()[0])
    assert 0.0 < lcp < 1.0  # excess distortion over the residual's energy: not cross-entropy's nats
    shipped, after = load_file(str(DEMO_DIR / "model.safetensors")), state["model"]
    moved = {k for k in shipped if not torch.equal(shipped[k].float(), after[k])}
    assert moved and all(k.startswith("talker.code_predictor.") and ".codec_embedding." not in k for k in moved)


def test_excess_distortion_is_computed_in_fp32_under_autocast():
    """Under bf16 autocast (the CUDA recipe) the costs must not be rounded to bf16: energies in the hundreds differ
    by less than bf16 resolves there."""
    from leapvox.models.recipes.demo.train import excess_distortion

    g = torch.Generator().manual_seed(0)
    books = [torch.randn(32, 8, generator=g) * 10 for _ in range(4)]
    codes = torch.randint(0, 32, (64, 4), generator=g)
    logits = torch.randn(64, 3, 32, generator=g)
    plain = excess_distortion(logits, codes, codes, books)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = excess_distortion(logits, codes, codes, books)
    assert under.dtype == torch.float32 and torch.allclose(under, plain, rtol=1e-6, atol=0)


def test_graphemes_front_end_trains_on_the_text_and_writes_it_into_the_config(tmp_path, monkeypatch):
    """`--frontend graphemes`: the tokenizer and the examples read the sentences' text (no phonemes), the export's
    config names the front end, and a model from --init cannot switch front ends."""
    import json

    import pytest

    from leapvox.engine.errors import InputError
    from leapvox.models.frontend import graphemes
    from leapvox.models.recipes.demo.train import load_examples, model_texts
    from leapvox.models.tokenizer import TextTokenizer

    data = tmp_path / "data"
    data.mkdir()
    fake_data(data)
    split = torch.load(data / "train.pt", weights_only=False)
    assert model_texts(split) == PHONEMES  # the data's own phonemes (espeak-ng-ipa: data built before teachers)
    assert model_texts(split, "graphemes") == [graphemes(t) for t in split["text"]]
    run = tmp_path / "run"
    export = train(str(data), str(run), steps=2, batch=4, save_every=2, size="tiny", threads=1, frontend="graphemes",
                   log=lambda m: None)
    assert json.loads((export / "config.json").read_text())["leapvox_text_frontend"] == "graphemes"
    tok = TextTokenizer(export)
    examples = load_examples(data, "train", tok, frontend="graphemes")
    assert examples[0].body == tok(graphemes(split["text"][0]))
    # it speaks with no espeak-ng anywhere on PATH (a stand-in for the pip-only check of #26, on a fixture model:
    # the bundled model still reads espeak-ng)
    from dataclasses import replace

    from leapvox.models.load import load_model

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    loaded = load_model(export)
    r = loaded.synthesizer().synthesize("Hello there.", replace(loaded.defaults, max_frames=3, seed=0))
    assert r.audio.size > 0
    with pytest.raises(InputError, match="--frontend hibari-g2p differs"):
        train(str(data), str(tmp_path / "again"), steps=1, init=str(export), frontend="hibari-g2p", log=lambda m: None)
