"""The Core ML backend (`--backend ane`, engine/coreml/runtime.py).

On Linux: the backend's host logic (input packing against the exported interface, KV state handling, positions,
masks and predictor slots, sampling, the spec walk and acceptance, the KV commit) runs against a STAND-IN for the
Core ML function models: an object with Core ML's `predict(inputs, state)` / `make_state()` interface that
computes with the torch export wrappers (engine/coreml/wrappers.py) the functions are converted from. It is not
Core ML; it proves that everything around the Core ML call gives the torch backend's codes. Plus the one-line
errors of `--backend ane` where Core ML cannot run.

On a Mac (macOS 15+, coremltools): the tests marked `macos` export a tiny checkpoint and run the real Core ML
functions. One command:

    python -m pytest -m macos tests/test_coreml_runtime.py

Off macOS they are skipped, because Core ML predictions cannot run on Linux.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from leapvox.engine.coreml.runtime import CoreMLBackend
from leapvox.engine.errors import InputError
from leapvox.engine.spec import DEFAULT_TREE, DraftPlan, DraftTree, SpecStats
from leapvox.models.recipes.coreml_export import ExportSettings, predictor_functions, talker_functions

from .conftest import FIXTURES

TEXT = "Hello world, this is a test."
ON_MAC = sys.platform == "darwin"


class StandInFunction:
    """A STAND-IN for one Core ML function, not Core ML: the interface of coremltools' CompiledMLModel
    (`predict(inputs, state)`, `make_state()`), computed by the torch export wrapper the function is converted
    from. It checks every input against the exported interface (names, shapes, dtypes) and keeps the KV cache in
    the state object, as Core ML does."""

    def __init__(self, fn, fp=np.float32):
        self.module, self.spec, self.outputs, self.fp = fn.module, fn.inputs, fn.outputs, fp
        self.state_names = fn.module.state_names()
        self.calls = 0

    def make_state(self) -> list[torch.Tensor]:
        return [torch.zeros_like(getattr(self.module, n)) for n in self.state_names]

    def predict(self, inputs: dict, state: list[torch.Tensor]) -> dict:
        assert sorted(inputs) == sorted(n for n, _, _ in self.spec)
        for name, shape, kind in self.spec:
            x = inputs[name]
            assert tuple(x.shape) == shape, f"{name}: {x.shape} != exported {shape}"
            assert x.dtype == (self.fp if kind == "fp" else np.int32), f"{name}: {x.dtype}"
        for name, buf in zip(self.state_names, state, strict=True):  # the state object holds the cache
            setattr(self.module, name, buf)
        with torch.no_grad():
            out = self.module(*(torch.from_numpy(inputs[n]) for n, _, _ in self.spec))
        self.calls += 1
        out = out if isinstance(out, tuple) else (out,)
        return {n: o.numpy() for n, o in zip(self.outputs, out, strict=True)}


def stand_in_parts(talker, settings: ExportSettings, offsets=None):
    """Stand-ins of an fp32 export with `settings`: (talker functions, predictor functions, manifest with the
    fields an export's manifest.json has)."""
    cp = talker.code_predictor
    p_fns, p_state = predictor_functions(cp, talker.cfg.hidden_size, settings, offsets, {})
    t_fns, t_state = talker_functions(talker, settings, {})
    names = p_fns["ar"].module.state_names()

    def part(fns, state):
        return {
            "compute": "fp32",
            "states": {n: list(b.shape) for n, b in zip(names, state, strict=True)},
            "functions": {n: {"inputs": {i: list(s) for i, s, _ in f.inputs}} for n, f in fns.items()},
        }

    manifest = {
        "settings": {"prefill_len": settings.prefill_len, "drafts": settings.drafts},
        "parts": {"predictor": part(p_fns, p_state), "talker": part(t_fns, t_state)},
    }
    manifest["parts"]["predictor"]["tree_paths"] = [list(p) for p in settings.tree_paths]
    stand_in = {n: StandInFunction(f) for n, f in t_fns.items()}, {n: StandInFunction(f) for n, f in p_fns.items()}
    return *stand_in, manifest


def stand_in_backend(talker, settings: ExportSettings, offsets=None) -> CoreMLBackend:
    """The Core ML backend over stand-ins of an fp32 export with `settings`."""
    return CoreMLBackend(talker, *stand_in_parts(talker, settings, offsets))


@pytest.fixture
def fixture_model(tmp_path, monkeypatch):
    from leapvox.models.load import load_model

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))  # no stored offsets or trees
    return load_model(FIXTURES / "tiny-0b6")


def codes_of(model, backend, opts, spec: DraftPlan | None = None, text: str = TEXT):
    synth = replace(model, backend=backend, plan=spec or model.plan).synthesizer()
    codes, stats, warnings = synth.generate_codes(text, opts)
    return codes.tolist(), stats, warnings


# ---------------------------------------------------------------------------------------- Linux: the stand-in


@pytest.mark.parametrize("tree", [DEFAULT_TREE, DraftTree.from_paths([(0, 0), (1, 1), (3, 0)])])
def test_greedy_codes_equal_the_torch_backend(fixture_model, tree):
    """Greedy ar and spec through the backend's host logic (stand-in functions) give the torch backend's codes,
    in both text layouts; spec with trained-like offsets baked into the fused draft + verify function."""
    m = fixture_model
    hc = m.tts.talker.code_predictor.cfg.hidden_size
    offsets = 0.5 * torch.randn(15, tree.max_depth, hc, generator=torch.Generator().manual_seed(1))
    settings = ExportSettings(prefill_len=64, context=96, tree_paths=tuple(tree.paths()[1:]), drafts=tree.max_depth)
    backend = stand_in_backend(m.tts.talker, settings, offsets)
    spec = DraftPlan(tree, offsets)
    for layout in ("non-streaming", "streaming"):
        opts = replace(m.defaults, max_frames=14, text_layout=layout).greedy()
        for mode in ("ar", "spec"):
            ref, ref_stats, _ = codes_of(m, None, replace(opts, mode=mode), spec)
            got, stats, _ = codes_of(m, backend, replace(opts, mode=mode), spec)
            assert got == ref, (layout, mode)
            assert len(got) > 3
            assert stats.predictor_calls == ref_stats.predictor_calls and stats.attn_span == ref_stats.attn_span
            if mode == "spec":
                assert (stats.spec.calls, stats.spec.tokens) == (ref_stats.spec.calls, ref_stats.spec.tokens)
                assert stats.spec.accepts == ref_stats.spec.accepts and stats.spec.calls < 15 * len(got)


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_seeded_sampling_equals_the_torch_backend(fixture_model, mode):
    """Sampling with a seed draws in the same order on both backends (code 0, then codes 1..15; in spec the
    draft candidates, the acceptance draws and the residual draws), so the codes are the same."""
    m = fixture_model
    hc = m.tts.talker.code_predictor.cfg.hidden_size
    offsets = 0.3 * torch.randn(3, hc, generator=torch.Generator().manual_seed(2))  # shared offsets [K, Hc]
    settings = ExportSettings(prefill_len=64, context=96)
    backend = stand_in_backend(m.tts.talker, settings, offsets)
    spec = DraftPlan(DEFAULT_TREE, offsets)
    for seed in (0, 7):
        opts = replace(m.defaults, max_frames=12, seed=seed, mode=mode)
        ref, ref_stats, _ = codes_of(m, None, opts, spec)
        got, stats, _ = codes_of(m, backend, opts, spec)
        assert got == ref, seed
        if mode == "spec":
            assert stats.spec.attempts == ref_stats.spec.attempts and stats.spec.accepts == ref_stats.spec.accepts


@torch.no_grad()
def test_spec_commits_the_kv_rows_of_ar(fixture_model):
    """After a greedy spec frame, the predictor state's committed slots (in position order) hold the K/V rows that
    the engine's predictor stack caches for the same 16 input rows (h, C(code 0), codes 1..14) in one causal pass:
    accepted rows are committed where they were written."""
    from leapvox.engine.fast.predictor import predict_codes
    from leapvox.engine.sampling import SamplingParams

    m = fixture_model
    talker, cp = m.tts.talker, m.tts.talker.code_predictor
    backend = stand_in_backend(talker, ExportSettings(prefill_len=64, context=96))
    backend.setup(10, 4)
    greedy = SamplingParams(do_sample=False)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        h = torch.randn(1, 1, talker.cfg.hidden_size, generator=g)
        c0 = talker.embed_codec(torch.randint(0, 2048, (1, 1), generator=g))
        spec, stats = DraftPlan(DEFAULT_TREE), SpecStats()
        codes = backend.verify(h, c0, greedy, None, spec, stats)
        assert predict_codes(cp, h, c0, greedy, None).tolist() == codes.tolist()
        rows = [cp.prefill_rows(h, c0)] + [cp.embed(i, codes[:, i - 1 : i]) for i in range(1, 15)]
        cp.model.setup_cache(18)
        cp.model(torch.cat(rows, dim=1), 0)  # positions 0..15
        slots = backend.slots.committed[:16]
        assert len(backend.slots.committed) >= 16 and stats.calls < 15
        for layer, cache in enumerate(cp.model.caches):
            k_state, v_state = backend.p_state[2 * layer], backend.p_state[2 * layer + 1]
            assert (k_state[0][:, slots] - cache.k[0, :, :16]).abs().max() < 1e-5
            assert (v_state[0][:, slots] - cache.v[0, :, :16]).abs().max() < 1e-5


def test_ane_backend_refuses_windowed_and_long_prompts_and_caps_frames(fixture_model):
    m = fixture_model
    backend = stand_in_backend(m.tts.talker, ExportSettings(prefill_len=24, context=30))
    opts = replace(m.defaults, max_frames=200).greedy()
    with pytest.raises(InputError, match="windowed mode is not available on the ane backend") as e:
        codes_of(m, backend, replace(opts, mode="windowed"))
    assert "--backend cpu" in e.value.hint
    with pytest.raises(InputError, match="more than the 24") as e:
        codes_of(m, backend, opts, text=" ".join(["word"] * 40))
    assert "--prefill-len" in e.value.hint
    # a prompt of L rows leaves 30 - L frames in the exported context: the utterance stops there and says so
    got, stats, warnings = codes_of(m, backend, replace(opts, runaway_guard=False, max_frames=500))
    assert stats.stop_reason == "max_frames" and len(got) == 30 - backend.prefix
    assert any("exported context" in w for w in warnings), warnings
    assert stats.kv_bytes == backend.kv_bytes(len(got) - 2) == (backend.prefix + len(got) - 1) * backend.slot_bytes


def test_verify_timer_feeds_the_exported_interface(fixture_model):
    """`recipe tree --backend ane` times ar and verify with inputs of the exported shapes and dtypes (the
    stand-in checks them) in one state; the figures are positive and consistent."""
    from leapvox.models.recipes.coreml_export import time_verify_over_ar

    _, p_fns, manifest = stand_in_parts(fixture_model.tts.talker, ExportSettings(prefill_len=16, context=32))
    t = time_verify_over_ar(p_fns, manifest, repeats=2)
    assert p_fns["ar"].calls == p_fns["verify"].calls == 5
    assert t["ar_s"] > 0 and t["verify_s"] > 0 and t["verify_over_ar"] == pytest.approx(t["verify_s"] / t["ar_s"])


# ---------------------------------------------------------------------------------------- Linux: the CLI


@pytest.mark.skipif(ON_MAC, reason="checks the message off macOS")
@pytest.mark.parametrize(
    "command", [["speak", "Hello.", "-o", "{out}"], ["compare", "Hello.", "--out", "{dir}"], ["recipe", "tree"]]
)
def test_backend_ane_off_macos_is_one_line_exit_2(tmp_path, capsys, command):
    from leapvox.app.cli import main

    argv = [a.format(out=tmp_path / "x.wav", dir=tmp_path / "c") for a in command] + ["--backend", "ane"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err]
    assert "the ane backend needs macOS (Core ML predictions are unavailable on" in err and "--backend cpu" in err
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.parametrize("backend", [[], ["--backend", "cpu"]])
def test_cpu_speak_imports_no_core_ml_module(tmp_path, backend):
    """A CPU `speak` (the default backend without an export, or --backend cpu) imports no Core ML module: neither
    the runtime nor the export wrappers nor coremltools; only models/coreml_assets, which looks for exports."""
    code = ("import json, sys; from leapvox.app.cli import main; rc = main(sys.argv[1:]); "
            "print(json.dumps(sorted(m for m in sys.modules if 'coreml' in m))); sys.exit(rc)")
    argv = ["speak", "Hello.", "-o", str(tmp_path / "x.wav"), "--max-frames", "4", *backend]
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "x.wav").stat().st_size > 44
    assert json.loads(r.stdout.splitlines()[-1]) == ["leapvox.models.coreml_assets"]


def test_auto_is_cpu_without_core_ml_or_export(tmp_path, monkeypatch):
    from leapvox.engine import backend
    from leapvox.models import coreml_assets
    from leapvox.models.recipes import coreml_export

    monkeypatch.setenv("LEAPVOX_HOME", str(tmp_path))
    folder = FIXTURES / "tiny-0b6"
    if not ON_MAC:
        assert coreml_assets.resolve_backend("auto", folder) == "cpu"
    monkeypatch.setattr(backend, "ane_unavailable_reason", lambda: None)  # as on a Mac with coremltools
    assert coreml_assets.resolve_backend("auto", folder) == "cpu"  # ... but no export of this model
    assert coreml_assets.resolve_backend("cpu", folder) == "cpu"
    with pytest.raises(InputError, match="no Core ML export of this model") as e:
        coreml_assets.load_ane_backend(folder, None, model_name="tiny")
    assert e.value.hint.startswith("leapvox recipe coreml --model tiny")
    # an export with both parts makes auto pick ane; the newest one wins
    for name, created in (("a", 1.0), ("b", 2.0)):
        d = coreml_assets.export_root() / f"{coreml_export.export_dir(folder, ExportSettings()).name}{name}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(f'{{"created": {created}, "parts": {{"talker": {{}}, "predictor": {{}}}}}}')
    assert coreml_assets.find_export(folder).name.endswith("b")
    assert coreml_assets.resolve_backend("auto", folder) == "ane"
    assert coreml_assets.export_root().parent.name == "data"  # assets live in the data folder


def test_speak_help_explains_backends(capsys):
    from leapvox.app.cli import main

    with pytest.raises(SystemExit):
        main(["speak", "--help"])
    out = capsys.readouterr().out
    assert "--backend {auto,cpu,ane}" in out and "--compute-units {cpu_and_ne,all,cpu_only}" in out


# ---------------------------------------------------------------------------------------- macOS: real Core ML


@pytest.fixture
def mac_export(fixture_model, tmp_path):
    """A fp16-weight export of the tiny fixture checkpoint (fp16 compute), in a temp folder."""
    from leapvox.models.recipes.coreml_export import export_modules

    m = fixture_model
    export_modules(
        m.tts.talker,
        tmp_path / "export",
        ExportSettings(prefill_len=64, context=128, weights="fp16", parts=("predictor", "talker")),
        say=lambda msg: None,
    )
    return m, tmp_path / "export"


@pytest.mark.macos  # skipped off macOS (conftest.py)
@pytest.mark.parametrize("units", ["cpu_only", "cpu_and_ne", "all"])
def test_coreml_backend_runs_ar_and_spec(mac_export, units):  # pragma: no cover - macOS only
    """Real Core ML: greedy ar and spec through the exported functions. fp16 compute may flip a near-tie, so the
    codes must agree with torch on most positions (and spec must equal ar on the same backend only up to that)."""
    from leapvox.engine.coreml.runtime import load_backend

    m, export = mac_export
    backend = load_backend(export, m.tts.talker, units)
    opts = replace(m.defaults, max_frames=10).greedy()
    for mode in ("ar", "spec"):
        ref, _, _ = codes_of(m, None, replace(opts, mode=mode))
        got, stats, _ = codes_of(m, backend, replace(opts, mode=mode))
        n = min(len(ref), len(got))
        same = sum(a == b for r, g in zip(ref[:n], got[:n], strict=True) for a, b in zip(r, g, strict=True))
        assert n >= 3 and same / (16 * n) > 0.8, (mode, same, n)
        assert stats.frames == len(got)


@pytest.mark.macos  # skipped off macOS (conftest.py)
def test_speak_with_backend_ane_writes_audio(mac_export, tmp_path, monkeypatch):  # pragma: no cover - macOS only
    """`leapvox speak --backend ane` finds the model's export in the data folder and writes a WAV."""
    import shutil

    from leapvox.app.cli import main
    from leapvox.models.recipes.coreml_export import export_dir

    _, export = mac_export
    shutil.copytree(export, export_dir(FIXTURES / "tiny-0b6", ExportSettings(prefill_len=64, context=128)))
    out = tmp_path / "ane.wav"
    assert (
        main(
            [
                "speak",
                "Hello there.",
                "-o",
                str(out),
                "--model",
                str(FIXTURES / "tiny-0b6"),
                "--backend",
                "ane",
                "--weights",
                "fp32",
                "--max-frames",
                "6",
                "--mode",
                "spec",
            ]
        )
        == 0
    )
    assert out.stat().st_size > 44
