"""Shared test helpers: tiny random-weight models built in-process, and the reference fixture paths."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "reference"


def session_kernel_cache() -> Path:
    """The compiled-kernel cache of the test session's own environment (before any test points LEAPVOX_HOME at a
    temp folder): a test that runs leapvox in a subprocess under another LEAPVOX_HOME links it in, so the
    subprocess loads the session's build instead of compiling (15-30 s and a line on stderr) where it can."""
    from leapvox.engine.fast import kernels

    return kernels.cache_dir()


SESSION_KERNEL_CACHE = session_kernel_cache()


def isolate_home() -> Path:
    """Point $LEAPVOX_HOME at a fresh folder for the whole test session (each xdist worker its own), so that what
    the machine's user made — a tune profile that turns `--mode auto` into spec, saved voices, settings — never
    changes what a test sees. The compiled-kernel cache is the one thing shared (linked), so kernels build once."""
    import atexit
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="leapvox-tests-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    (home / "cache").mkdir()
    SESSION_KERNEL_CACHE.mkdir(parents=True, exist_ok=True)
    (home / "cache" / "kernels").symlink_to(SESSION_KERNEL_CACHE, target_is_directory=True)
    os.environ["LEAPVOX_HOME"] = str(home)
    return home


SESSION_HOME = isolate_home()
DESIGN_CONFIG = {
    "im_start_token_id": 190,
    "im_end_token_id": 191,
    "assistant_token_id": 150,
    "tts_pad_token_id": 192,
    "tts_bos_token_id": 193,
    "tts_eos_token_id": 194,
    "tts_model_size": "0b6",
    "tts_model_type": "custom_voice",
    "talker_config": {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "vocab_size": 3072, "text_vocab_size": 200, "text_hidden_size": 48, "num_code_groups": 16,
        "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
        "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "codec_language_id": {"english": 2050, "chinese": 2055, "sichuan_dialect": 2062, "beijing_dialect": 2074},
        "spk_id": {"ryan": 3061, "eric": 2875, "dylan": 2878},
        "spk_is_dialect": {"ryan": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect"},
        "some_future_key": [1, 2, 3],
        "code_predictor_config": {
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "vocab_size": 64, "num_code_groups": 16,
        },
    },
}


# ---- parallel runs: pytest-xdist, as .ci/run runs the suite (`-n 2 --dist loadgroup --no-loadscope-reorder`) --------

def worker_threads() -> int | None:
    """Under pytest-xdist: the torch threads one worker takes, its share of what a lone run would use (at least 1),
    so that N workers do not run N times as many threads as there are cores. None outside xdist."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if "PYTEST_XDIST_WORKER" not in os.environ or workers < 1:
        return None
    return max(1, torch.get_num_threads() // workers)


if (_share := worker_threads()) is not None:
    torch.set_num_threads(_share)
    os.environ["OMP_NUM_THREADS"] = str(_share)  # and the leapvox processes its tests start take the same share

# Tests that must not share the machine with each other: one xdist group, so one worker runs them one after the
# other (the real sound device: one PulseAudio pipe sink, read back sample by sample; the TUI's stop-latency bound).
SERIAL_GROUP = "serial"
SERIAL_FILES = {"test_real_audio.py", "test_tui.py", "test_tui_live.py", "test_playback.py"}


def _module_scoped_fixtures(item) -> bool:
    """Whether `item` uses a fixture shared by its module (or class, or package): it must run where its file runs."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d and d[-1].scope in ("module", "class", "package") for d in defs.values())


def xdist_groups(items) -> None:
    """--dist loadgroup: a file's tests go to one worker (its module fixtures load once), except `slow` tests that
    share nothing with their file, which go on their own (minutes each: spread over the workers); SERIAL_FILES go
    together. The order the workers are handed groups in (with --no-loadscope-reorder): slow tests first (and so
    their files), then the rest as collected; xdist's own order (most tests first) would hand the lone slow tests out
    last, where one worker runs them while the other has nothing left."""
    for item in items:
        name = item.path.name
        if name in SERIAL_FILES:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
        elif not ("slow" in item.keywords and not _module_scoped_fixtures(item)):
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(REPO))))

    items.sort(key=lambda item: "slow" not in item.keywords)  # stable: collection order otherwise


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Tests marked `macos` call Core ML itself; elsewhere they are skipped and say why. Under xdist's loadgroup,
    groups and order as xdist_groups says."""
    if getattr(config.option, "loadgroup", False):
        xdist_groups(items)
    if sys.platform == "darwin":
        return
    skip = pytest.mark.skip(reason="Core ML predictions cannot run on Linux (macOS 15+ only); on a Mac: "
                            "python -m pytest -m macos tests/test_coreml_runtime.py tests/test_coreml.py")
    for item in items:
        if "macos" in item.keywords:
            item.add_marker(skip)


def tiny_config_dict(**talker_overrides) -> dict:
    d = copy.deepcopy(DESIGN_CONFIG)
    d["talker_config"].update(talker_overrides)
    return d


@pytest.fixture
def tiny_model():
    """(TTSConfig, TTSModel) with random weights scaled so logits have a spread of a few units."""
    from leapvox.engine.config import TTSConfig
    from leapvox.engine.nets.talker import TTSModel

    torch.manual_seed(0)
    cfg = TTSConfig.from_dict(tiny_config_dict())
    model = TTSModel(cfg.talker).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "norm" not in name:
                p.normal_(0, 1.0 / p.shape[1] ** 0.5 if "embedding" not in name else 1.0)
    return cfg, model


def load_expected() -> dict:
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Commands run in-process may set torch's thread count (`demo wer` scores on one thread); fp32 results are
    bit-exact only at one thread count (the reference fixtures: 2), so every test starts with the session's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def _w8a8_kernel_built():
    """Build leapvox's optional w8a8 kernel (engine.kernels) once, before any test: the first build takes 15-30 s
    and prints a line, which a test that starts leapvox in a subprocess should see neither in its time nor in its
    output. Where it cannot be built this only records why (test_kernels.py says so in its skip reasons)."""
    from leapvox.engine.fast import kernels

    kernels.w8a8_op()


def run(capsys, *argv):
    """`leapvox ARGV` in this process -> (exit code, stdout, stderr)."""
    from leapvox.app.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    """The one line a user mistake prints (no traceback, no internal error)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture
def no_load(monkeypatch):
    """Fail the test if speak gets as far as loading the model."""
    def load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("leapvox.app.speak.load", load)


@contextlib.contextmanager
def serve_in_thread(app):
    """`app` (leapvox.app.serve.build_app) served by make_server on a thread, on a free localhost port: yields its
    base URL (http://127.0.0.1:PORT); on the way out the server is asked to stop and its thread joined."""
    from leapvox.app.serve import listen, make_server

    sock = listen("127.0.0.1", 0)
    srv = make_server(app, grace=5)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not srv.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.started, "the in-process server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(60)
        sock.close()
