"""What `leapvox tune` decides and why: the fidelity threshold a weight format must pass, when spec mode pays, the
built-in text set, and the time a tune is expected to take. Pure functions of measured numbers; the stages that
measure them are `models/recipes/tune.py` (a recipe: this runtime module never imports it).

**The fidelity threshold.** A weight format is measured against fp32 on the model's own held-out frames,
teacher-forced: the KL divergence from fp32's code distributions (at the model's sampling temperature) to the
format's, for code 0 (talker) and codes 1..15 (code predictor). The only speech-quality evidence there is comes from
the bundled demo model, whose paired WER was measured on 300 held-out sentences per format
(`tests/benchmarks/wer-demo-*.json`): w8a8 +0.4 points over fp32 (95 % CI -1.3 .. +2.3) and w4a8 +0.9
(-1.8 .. +3.7), no loss measurable for either. `tests/benchmarks/tune_fidelity.py` puts the same demo, with the
kernels' arithmetic those WER runs used, on this scale (24 sentences, 1,104 frames): w4a8 moves code 0 by KL
0.0167 nats and codes 1..15 by 0.0292; w8a8 by 0.0003 and 0.0004. So a drift up to w4a8's on the demo is known to
cost at most +3.7 WER points, and no larger drift has a WER measurement behind it. The thresholds are w4a8's demo
drift rounded up to two digits (`MAX_KL_TALKER` 0.017, `MAX_KL_PREDICTOR` 0.030): a format that moves a user's
model more than that is never chosen automatically (`--weights` still picks it by hand). KL rather than argmax
agreement, because it carries across models: near-ties flip an argmax without changing what is sampled, while by
Pinsker's inequality a per-code KL of k changes a coupled draw with probability at most sqrt(k / 2) (here ~9 % for
code 0 and ~12 % for codes 1..15), whatever the model's entropy. On the demo, torch's int4 lands just outside
(0.0171 and 0.0313) and the 8-bit formats far inside.

**When spec pays.** spec replaces 15 ar predictor calls a frame with 15 / t verify calls, t the tokens per call
measured on held-out frames, each costing r times an ar call (`verify_over_ar`, timed back to back here). The
predictor's estimated speed-up is t / r; spec is chosen when that is at least `SPEC_MIN_GAIN`, which leaves room
for the host work a verify call adds and the ratio leaves out (drafting the tree's candidates, the acceptance walk),
and when the measured spec frames of that format were not slower than its ar frames.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from leapvox.engine.options import WEIGHT_FORMATS

from .profile import Decision, FormatResult

MAX_KL_TALKER = 0.017  # nats per code 0; argued in the module docstring
MAX_KL_PREDICTOR = 0.030  # nats per code, codes 1..15
SPEC_MIN_GAIN = 1.1  # the predictor's estimated speed-up (tokens per call / verify-over-ar) spec must reach
DEFAULT_UTTERANCES = 16  # sentences the frames stage speaks
MAX_FRAMES = 75  # frames kept per sentence (6 s; a model that never stops, as a random one, is cut here)
HELD_OUT_SHARE = 0.25  # of the sentences, measured on and never trained on (at least one)


def formats_here(wanted: tuple[str, ...] | None = None) -> list[str]:
    """fp32 (the reference) first, then every other weight format that runs on this machine (of `wanted`)."""
    from leapvox.engine.fast.quant import format_unavailable_reason

    names = [w for w in WEIGHT_FORMATS if wanted is None or w in wanted or w == "fp32"]
    return [w for w in names if format_unavailable_reason(w) is None]


def likely_formats() -> int:
    """How many weight formats will run here, guessed without building or loading leapvox's compiled kernel (an
    estimate's input): all of them, but w4a8 only on a CPU with AVX-512 VNNI."""
    from leapvox.engine.fast.kernels import cpu_flags

    vnni = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags()
    return len(WEIGHT_FORMATS) - (0 if vnni else 1)


def passes(kl_talker: float, kl_predictor: float) -> bool:
    """Whether a format's measured drift from fp32 is within the threshold (module docstring)."""
    return kl_talker <= MAX_KL_TALKER and kl_predictor <= MAX_KL_PREDICTOR


def spec_gain(tokens_per_call: float | None, verify_over_ar: float | None) -> float | None:
    """The code predictor's estimated speed-up in spec mode: tokens per call over one verify call's cost in ar
    calls (None when either is unknown)."""
    if not tokens_per_call or not verify_over_ar:
        return None
    return tokens_per_call / verify_over_ar


def spec_frame_ms(f: FormatResult, tokens_per_call: float | None, verify_over_ar: float | None) -> float | None:
    """A format's estimated ms per frame in spec mode: its talker step plus its ar predictor frame divided by the
    estimated speed-up (None when a figure is missing)."""
    gain = spec_gain(tokens_per_call, verify_over_ar)
    if gain is None or f.talker_ms is None or f.predictor_ms is None:
        return None
    return f.talker_ms + f.predictor_ms / gain


def decide(formats: list[FormatResult], tokens_per_call: float | None, verify_over_ar: float | None) -> Decision:
    """The mode and weight format `auto` follows, from the measured numbers: the fastest format that passes the
    fidelity threshold (fp32, the reference, always does), and in it spec where its estimated gain reaches
    SPEC_MIN_GAIN and its measured spec frames were not slower than ar's, else ar. `verify_over_ar` is the tree
    stage's ratio, used for a format that has none of its own."""
    if not formats:
        raise ValueError("no weight format was measured")
    candidates = [f for f in formats if f.passes] or [f for f in formats if f.weights == "fp32"]
    if not candidates:
        raise ValueError("no weight format passed the fidelity threshold and fp32 was not measured")

    def plan(f: FormatResult) -> tuple[str, float, float | None]:
        ratio = f.verify_over_ar or verify_over_ar
        gain = spec_gain(tokens_per_call, ratio)
        measured_ok = f.spec_predictor_ms is None or f.predictor_ms is None or f.spec_predictor_ms < f.predictor_ms
        if gain is not None and gain >= SPEC_MIN_GAIN and measured_ok:
            return "spec", spec_frame_ms(f, tokens_per_call, ratio) or f.frame_ms, gain
        return "ar", f.frame_ms, gain

    plans = {f.weights: plan(f) for f in candidates}
    best = min(candidates, key=lambda f: plans[f.weights][1])
    mode, ms, gain = plans[best.weights]
    return Decision(mode, best.weights, _why(best, mode, ms, gain, tokens_per_call, formats))


def _why(best: FormatResult, mode: str, ms: float, gain: float | None, tpc: float | None,
         formats: list[FormatResult]) -> str:
    if mode == "spec":
        head = f"spec: {tpc:.2f} tokens/call, the predictor ~{gain:.2f}x faster here"
    elif gain is None:
        head = "ar: spec's tokens per call were not measured"
    elif gain >= SPEC_MIN_GAIN:
        head = f"ar: spec's estimated {gain:.2f}x was not borne out by its measured frames here"
    else:
        head = f"ar: spec's {tpc:.2f} tokens/call give only {gain:.2f}x here (needs {SPEC_MIN_GAIN}x)"
    failed = [f.weights for f in formats if not f.passes]
    tail = f"{best.weights}: the fastest format within fidelity, ~{ms:.0f} ms a frame in {mode} (talker + predictor)"
    return f"{head}; {tail}" + (f" ({', '.join(failed)} moved the codes too much)" if failed else "")


# ---- the built-in text set ----------------------------------------------------------------------------------------

# Everyday sentences per language the Qwen3-TTS CustomVoice models speak; `texts_for` takes those the model lists.
TEXTS: dict[str, list[str]] = {
    "english": [
        "The library on the corner stays open late on Thursdays, so we can finish the project there.",
        "If the weather holds, the ferry leaves at nine and reaches the island before lunch.",
        "She wrote the recipe on the back of an envelope and pinned it above the stove.",
        "Please remember to water the tomatoes while I am away next week.",
    ],
    "chinese": [
        "今天下午我们去公园散步，顺便买点新鲜的水果回家。",
        "这家小餐馆的面条很好吃，每天中午都有很多人排队。",
        "请把会议的时间改到明天上午十点，谢谢你的帮助。",
    ],
    "japanese": [
        "駅の近くに新しいパン屋さんができたので、明日の朝に行ってみます。",
        "雨が降りそうなので、傘を持って出かけたほうがいいですよ。",
        "週末は家族と一緒に山へハイキングに行く予定です。",
    ],
    "korean": [
        "오늘 저녁에는 친구들과 함께 새로 생긴 식당에 가기로 했어요.",
        "내일 아침 회의는 열 시에 시작하니까 조금 일찍 와 주세요.",
        "주말마다 공원에서 자전거를 타는 것이 제 취미입니다.",
    ],
    "german": [
        "Morgen früh fahren wir mit dem Zug nach Hamburg und besuchen den Hafen.",
        "Kannst du bitte das Fenster schließen, es wird langsam kalt im Zimmer?",
        "Der kleine Laden an der Ecke verkauft das beste Brot der ganzen Stadt.",
    ],
    "french": [
        "Nous avons pris le petit déjeuner sur la terrasse en regardant la mer.",
        "Le musée ferme à six heures, alors dépêchons-nous de voir la dernière salle.",
        "Mon voisin joue du piano tous les soirs après le dîner.",
    ],
    "russian": [
        "Завтра утром мы поедем за город и погуляем по лесу.",
        "Пожалуйста, позвони мне, когда закончишь работу над отчётом.",
        "В этом маленьком кафе готовят очень вкусный черничный пирог.",
    ],
    "portuguese": [
        "Amanhã vamos caminhar pela praia logo depois do café da manhã.",
        "A biblioteca da escola recebeu muitos livros novos esta semana.",
        "Por favor, feche a porta quando sair, porque o gato pode fugir.",
    ],
    "spanish": [
        "El mercado del barrio abre temprano y tiene la fruta más fresca.",
        "Mañana por la tarde vamos a visitar a mis abuelos en el pueblo.",
        "¿Podrías ayudarme a mover estas cajas antes de que llegue el camión?",
    ],
    "italian": [
        "Domani mattina andiamo al mercato a comprare verdure fresche.",
        "Il treno per Firenze parte dal binario tre tra dieci minuti.",
        "Mia sorella ha preparato una torta di mele per la festa di stasera.",
    ],
}


def texts_for(languages, n: int, lines: list[str] | None = None) -> list[tuple[str, str]]:
    """`n` (text, language) pairs: the user's `lines` in order, repeated as needed, spoken with language "auto";
    else the built-in sentences of the languages the model lists (its config's codec languages), taken in turn
    language by language (English first), or English with language "auto" when it lists none of them."""
    if lines:
        return [(lines[i % len(lines)], "auto") for i in range(n)]
    known = [lang for lang in TEXTS if lang in set(languages)]
    pools = {lang: TEXTS[lang] for lang in known} or {"auto": TEXTS["english"]}
    order = [(lang, i) for i in range(max(len(p) for p in pools.values())) for lang in pools if i < len(pools[lang])]
    return [(pools[lang][i], lang) for lang, i in (order[k % len(order)] for k in range(n))]


def expected_frames(text: str, cap: int = MAX_FRAMES) -> int:
    """About how many 80 ms frames a model speaks `text` in: ~0.8 a letter, ~3 a CJK character, at most `cap`."""
    wide = sum(1 for ch in text if ord(ch) >= 0x2E80)
    return max(1, min(cap, round(0.8 * (len(text) - wide) + 3 * wide)))


# ---- how long a tune takes -----------------------------------------------------------------------------------------

# Each stage's cost in units of the frames stage (sentences x frames x one frame's time in the default format), net
# of model loads, from the random-weight 0.6B and 1.7B (tests/benchmarks/tune-cost.json); the formats stage's is per
# weight format. A load costs about LOAD_S_PER_GB per GB of checkpoint (quantizing included; both sizes' formats
# stages gave 44-46 s/GB at one thread). Without a timing (the offer
# at the end of `models pull`), a frame is FRAME_S_PER_GB per GB at 2 threads: w8a8 on a quiet 2-core machine
# (tests/benchmarks/bench-0.6b-2t.json, ~55 ms for the 0.6B's 1.8 GB).
STAGE_FACTORS = {"frames": 1.0, "offsets": 1.0, "tree": 0.35, "formats": 0.5, "decision": 0.0}
LOAD_S_PER_GB = 45.0
FRAME_S_PER_GB = 0.03


@dataclass(frozen=True)
class Estimate:
    seconds: float
    per_stage: dict[str, float]
    frame_s: float
    frames: int

    @property
    def minutes(self) -> int:
        return max(1, math.ceil(self.seconds / 60))


def estimate(model_bytes: int, frames: int, formats: int, frame_s: float | None = None,
             threads: int | None = None, stages: tuple[str, ...] = tuple(STAGE_FACTORS)) -> Estimate:
    """The expected time of the `stages` still to run for a model of `model_bytes` on disk: from `frame_s`, one
    frame's time measured here, or else from the model's size (FRAME_S_PER_GB, scaled to `threads`)."""
    gb = model_bytes / 1e9
    if frame_s is None:
        frame_s = FRAME_S_PER_GB * gb * 2 / max(1, threads or min(os.cpu_count() or 2, 8))
    base = frames * frame_s
    loads = dict.fromkeys(stages, 0)
    first = next((s for s in ("frames", "offsets", "tree") if s in stages), None)
    if first:  # the default format, loaded once for the three
        loads[first] = 1
    if "formats" in stages:
        loads["formats"] = formats
    per = {s: STAGE_FACTORS[s] * base * (formats if s == "formats" else 1) + loads[s] * LOAD_S_PER_GB * gb
           for s in stages}
    return Estimate(sum(per.values()), per, frame_s, frames)
