"""Live speed readout: xRT, steps/s, tok/call, first audio, KV MB, per-stage ms, playback health."""

from __future__ import annotations

from rich.table import Table
from textual.reactive import reactive
from textual.widgets import Static

from leapvox.app.playback import PlaybackStats
from leapvox.engine.streaming import StreamStats


def _num(x: float | None, fmt: str, unit: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{unit}"


class Readout(Static):
    """Shows the latest StreamStats (and PlaybackStats) it is given; it never fetches anything itself."""

    stats: reactive[StreamStats | None] = reactive(None)
    playback: reactive[PlaybackStats | None] = reactive(None)
    auto: reactive[bool] = reactive(False)  # the mode was auto: the stats' mode is what it chose

    def render(self) -> Table:
        s, p = self.stats, self.playback
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column(justify="right")
        t.add_column(style="bold")
        t.add_column(justify="right")
        ms = s.stage_ms() if s else {}
        t.add_row("×RT", _num(s and s.xrt, ".2f"), "steps/s", _num(s and s.steps_per_s, ".1f"))
        t.add_row("tok/call", _num(s and s.tok_per_call, ".2f"), "pred/s", _num(s and s.predictor_calls_per_s, ".0f"))
        t.add_row("first audio", _num(s and s.first_audio_s, ".2f", " s"), "KV", _num(s and s.kv_mb, ".2f", " MB"))
        t.add_row("talker", _num(ms.get("talker"), ".1f", " ms"), "predictor", _num(ms.get("predictor"), ".1f", " ms"))
        t.add_row("codec", _num(ms.get("codec"), ".1f", " ms"), "frames", _num(s and s.frames, "d"))
        t.add_row("audio", _num(s and s.audio_s, ".2f", " s"), "sentence", f"{s.sentence}/{s.sentences}" if s else "-")
        t.add_row("underruns", _num(p and p.underruns, "d"), "pre-buffer", _num(p and p.prebuffer_s, ".2f", " s"))
        t.add_row("mode", (f"{s.mode} (auto)" if self.auto else s.mode) if s else "-", "", "")
        return t
