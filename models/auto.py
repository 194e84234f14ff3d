"""`--mode auto` and `--weights auto`: the mode and weight format a request runs, chosen once per request before the
weights load, from the model's tune profile on this machine (models.profile, `leapvox tune`).

With a usable profile, auto follows its decision, unless that cannot run here now: a format whose kernel is missing
falls back to the format auto meant before tune existed, and spec whose offsets or tree file is gone falls back to
ar, each saying so. Without a profile (never tuned here, unfinished, or stale: other weights, leapvox, torch or CPU)
auto means what it meant before: mode ar, weights `auto_weights` (fp32 for a narrow model such as the demo, else
engine.fast.quant.resolve_weights("auto")); the reason says which.
A profile measures the torch engine on this CPU, so another backend (ane) does not follow it: ar and today's weights.
A fixed mode or format is never changed; the two are chosen independently (`--mode ar --weights auto` runs ar in
the profile's format).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from leapvox.engine.fast.quant import format_unavailable_reason, resolve_weights
from leapvox.engine.options import AUTO, WEIGHT_FORMATS

from .profile import Profile, load_profile

CHOSEN_MODES = ("ar", "spec")  # what a profile may decide: ar's distribution (windowed approximates it: never auto)


@dataclass(frozen=True)
class Choice:
    """What a request runs: `mode` (one of engine.options.MODES) and `weights` (a format), what was asked for, and
    why (one line; empty when nothing was `auto`). `source`: "fixed" (nothing was auto), "profile" (the tune
    profile's decision), "fallback" (a usable profile whose choice cannot run here now, partly or wholly) or
    "default" (no usable profile: auto as before tune)."""

    mode: str
    weights: str
    why: str
    source: str
    asked_mode: str = AUTO
    asked_weights: str = AUTO

    def line(self) -> str:
        """'mode auto -> spec, weights auto -> int8 (why)': what auto chose, for a summary line; '' when nothing was
        auto."""
        parts = [f"{what} auto -> {got}" for what, asked, got in (("mode", self.asked_mode, self.mode),
                                                                  ("weights", self.asked_weights, self.weights))
                 if asked == AUTO]
        return f"{', '.join(parts)} ({self.why})" if parts else ""


def choose(folder: Path, mode: str = AUTO, weights: str = AUTO, backend: str = "cpu",
           name: str | None = None, hidden: int | None = None) -> Choice:
    """The mode and weights to run for the model in `folder` when `mode` and `weights` are asked for (`auto` or
    fixed), on `backend` as resolved (cpu, ane; `auto` is resolved here). `name` is the model as the user names it
    (for the hint `leapvox tune NAME`); `hidden`, its talker's width where the caller has read its config already.
    Reads the profile only when something is auto; never reads the weights."""
    if mode != AUTO and weights != AUTO:
        return Choice(mode, weights, "", "fixed", mode, weights)
    default_mode = "ar" if mode == AUTO else mode
    default_weights = auto_weights(folder, hidden) if weights == AUTO else weights
    asked = dict(asked_mode=mode, asked_weights=weights)
    backend = _backend(backend, folder)
    if backend != "cpu":
        return Choice(default_mode, default_weights, f"the tune profile measures the cpu backend, this is {backend}",
                      "default", **asked)
    profile, why_not = load_profile(folder)
    if profile is None or profile.decision is None:
        why = f"tune profile not used: {why_not}" if why_not else \
            f"no tune profile here; leapvox tune {name or folder} makes one"
        return Choice(default_mode, default_weights, why, "default", **asked)
    return _follow(profile, folder, mode, weights, default_mode, default_weights, name)


def auto_weights(folder: Path, hidden: int | None = None) -> str:
    """What `--weights auto` runs for the model in `folder` without a tune profile: quant.resolve_weights with the
    width of its talker (`hidden`, else read from its config.json; fp32 for a narrow one), or without it where the
    config does not say."""
    if hidden is not None:
        return resolve_weights(AUTO, hidden)
    try:
        hidden = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))["talker_config"]["hidden_size"]
    except (OSError, ValueError, KeyError, TypeError):  # loading says what is wrong with it, later
        hidden = None
    return resolve_weights(AUTO, hidden if isinstance(hidden, int) else None)


def _backend(backend: str, folder: Path) -> str:
    if backend != AUTO:
        return backend
    from .coreml_assets import resolve_backend

    return resolve_backend(backend, folder)


def _follow(profile: Profile, folder: Path, mode: str, weights: str, default_mode: str, default_weights: str,
            name: str | None) -> Choice:
    """A usable profile's decision for what is auto, each part checked against what runs here now."""
    d = profile.decision
    fallbacks = []
    got_mode, got_weights = default_mode, default_weights
    if mode == AUTO:
        gone = spec_assets_gone(profile) if d.mode == "spec" else None
        if d.mode not in CHOSEN_MODES:
            fallbacks.append(f"its mode {d.mode!r} is not one auto runs, so ar")
        elif gone:
            fallbacks.append(f"its spec {gone}, so ar (rerun leapvox tune {name or folder})")
        else:
            got_mode = d.mode
    if weights == AUTO:
        unavailable = format_unavailable_reason(d.weights) if d.weights in WEIGHT_FORMATS else "unknown format"
        if unavailable:
            fallbacks.append(f"its {d.weights} does not run here ({unavailable}), so {default_weights}")
        else:
            got_weights = d.weights
    why = f"tune profile: {d.why}" + "".join(f"; but {f}" for f in fallbacks)
    return Choice(got_mode, got_weights, why, "fallback" if fallbacks else "profile", mode, weights)


def spec_assets_gone(profile: Profile) -> str | None:
    """Which of the files spec mode needs by the profile (offsets, tree) no longer exists, or None."""
    for what, path in (("offsets", profile.offsets_path), ("tree", profile.tree_path)):
        if path and not Path(path).is_file():
            return f"{what} file {path} is gone"
    return None


def profile_status(folder: Path, name: str | None = None) -> tuple[str, str]:
    """(state, one line) for `doctor`: state "fresh" (the line: its decision and why), "unused" (why it is not
    followed: stale, unfinished or unreadable), or "none" (no tune profile here, and the command that makes one)."""
    profile, why_not = load_profile(folder)
    if profile is not None and profile.decision is not None:
        d = profile.decision
        gone = spec_assets_gone(profile) if d.mode == "spec" else None
        extra = f" (but its {gone}: auto runs ar)" if gone else ""
        return "fresh", f"tuned: auto runs {d.mode}, {d.weights} ({d.why}){extra}"
    if why_not:
        return "unused", f"tune profile not used: {why_not}"
    return "none", f"no tune profile here; leapvox tune {name or folder} makes one"
