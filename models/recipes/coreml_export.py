"""Core ML export: the talker (prefill + decode) and the code predictor (prefill, ar, verify) as multifunction
.mlpackage assets with shared weights, KV caches as states (macOS 15), and the codec decoder as one streaming
step with its carried state as inputs/outputs; fp16 compute, W8A16 or fp16 weights.

Assets land in `<leapvox data folder>/coreml/<model key>-<revision>-<settings>/` (see `leapvox paths`), written into
a temporary folder beside it and renamed into place, with a manifest.json describing every function.
Conversion runs anywhere coremltools installs; running the assets needs macOS 15.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from leapvox.engine.coreml.wrappers import (
    PredictorCall,
    TalkerDecode,
    TalkerPrefill,
    additive_mask,
    new_kv_state,
    power_of_two_scale,
)
from leapvox.engine.errors import LeapvoxError
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.nets.layers import RMSNorm
from leapvox.engine.nets.talker import Talker
from leapvox.engine.spec import DEFAULT_TREE, DraftTree
from leapvox.models.coreml_assets import export_root
from leapvox.models.paths import model_key, model_revision

WEIGHTS = ("w8a16", "fp16")
PARTS = ("predictor", "talker", "codec")
MANIFEST = "manifest.json"
FP16_MAX = 65504.0


class CoreMLExportError(LeapvoxError):
    """Export failed (missing coremltools, a conversion error)."""


@dataclass(frozen=True)
class ExportSettings:
    weights: str = "w8a16"  # "w8a16": int8 per-channel weights, fp16 compute; "fp16": fp16 weights and compute
    prefill_len: int = 256  # talker prompt rows per prefill call (prompts are padded to this)
    context: int = 2048  # talker KV slots: prompt + frames
    tree_paths: tuple[tuple[int, ...], ...] = tuple(DEFAULT_TREE.paths()[1:])  # the verify function's draft tree
    drafts: int = 3  # K: draft depths computed per row (offsets b_1..b_K)
    codec_chunk: int = 4  # frames per codec streaming call (4 = 320 ms of audio)
    parts: tuple[str, ...] = PARTS

    @property
    def tree(self) -> DraftTree:
        return DraftTree.from_paths(self.tree_paths)

    def key(self) -> str:
        t = self.tree
        parts = "" if self.parts == PARTS else "-" + "+".join(self.parts)
        return (f"{self.weights}-p{self.prefill_len}-c{self.context}-n{t.size}d{t.max_depth}k{self.drafts}"
                f"-f{self.codec_chunk}{parts}")

    def check(self) -> None:
        if self.weights not in WEIGHTS:
            raise CoreMLExportError(f"unknown weights setting {self.weights!r}", hint="use w8a16 or fp16")
        if not 0 < self.prefill_len <= self.context:
            raise CoreMLExportError(f"prefill length {self.prefill_len} must be in 1..context ({self.context})")
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise CoreMLExportError(f"unknown part {bad[0]!r}", hint=f"parts are {', '.join(PARTS)}")
        if self.tree.max_depth > 15 or self.drafts < 1:
            raise CoreMLExportError("the draft tree must be at most 15 deep and drafts at least 1")
        if self.codec_chunk < 1:
            raise CoreMLExportError(f"codec chunk of {self.codec_chunk} frames", hint="use 1 frame or more")


def predictor_context(tree: DraftTree) -> int:
    """Predictor KV slots: 16 committed rows (positions 0..15) plus one call's root and tree."""
    return 16 + tree.size + 1


def export_dir(folder: Path, settings: ExportSettings) -> Path:
    return export_root() / f"{model_key(folder)}-{model_revision(folder)}-{settings.key()}"


# ---------------------------------------------------------------------------------------------------- numerics


def measure_activations(root: nn.Module, run: Callable[[], object]) -> dict[str, dict[str, float]]:
    """Run `run()` with hooks on every RMSNorm (input max |x| and max row RMS) and Linear (max |output|) under
    `root`; returns name (relative to root) -> figures, all in fp32."""
    stats: dict[str, dict[str, float]] = {}
    hooks = []

    def on_norm(name):
        def hook(mod, args, out):
            x = args[0].detach().float()
            s = stats.setdefault(name, {"max_abs_in": 0.0, "max_rms_in": 0.0, "max_sum_sq_in": 0.0})
            s["max_abs_in"] = max(s["max_abs_in"], float(x.abs().max()))
            s["max_rms_in"] = max(s["max_rms_in"], float(x.pow(2).mean(-1).sqrt().max()))
            s["max_sum_sq_in"] = max(s["max_sum_sq_in"], float(x.pow(2).sum(-1).max()))

        return hook

    def on_linear(name):
        def hook(mod, args, out):
            s = stats.setdefault(name, {"max_abs_out": 0.0, "max_abs_in": 0.0})
            s["max_abs_out"] = max(s["max_abs_out"], float(out.detach().float().abs().max()))
            s["max_abs_in"] = max(s["max_abs_in"], float(args[0].detach().float().abs().max()))

        return hook

    for name, mod in root.named_modules():
        if isinstance(mod, RMSNorm):
            hooks.append(mod.register_forward_hook(on_norm(name)))
        elif isinstance(mod, nn.Linear):
            hooks.append(mod.register_forward_hook(on_linear(name)))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return stats


def norm_scales(stats: dict[str, dict[str, float]], prefix: str = "") -> dict[str, float]:
    """Power-of-two RMSNorm input scales from measured activations (only where the RMS exceeds 1)."""
    out = {}
    for name, s in stats.items():
        if "max_rms_in" in s and name.startswith(prefix):
            scale = power_of_two_scale(s["max_rms_in"])
            if scale != 1.0:
                out[name[len(prefix) :]] = scale
    return out


def fp16_risk(stats: dict[str, dict[str, float]]) -> dict[str, object]:
    """The largest figures and what they mean for fp16 (65504 max)."""
    if not stats:
        return {}
    abs_max = max(max(s.get("max_abs_in", 0.0), s.get("max_abs_out", 0.0)) for s in stats.values())
    sum_sq = max((s.get("max_sum_sq_in", 0.0) for s in stats.values()), default=0.0)
    worst = max(stats, key=lambda n: max(stats[n].get("max_abs_in", 0.0), stats[n].get("max_abs_out", 0.0)))
    return {
        "max_abs_activation": abs_max,
        "at": worst,
        "max_rmsnorm_sum_of_squares": sum_sq,
        "activations_fit_fp16": abs_max < FP16_MAX / 4,
        "unscaled_rmsnorm_sum_of_squares_fits_fp16": sum_sq < FP16_MAX,
    }


def _frame_rows(cp: CodePredictor, talker_hidden: int, g: torch.Generator, n: int = 8) -> list[torch.Tensor]:
    """Predictor input rows like a frame's: a unit-RMS talker hidden, then code embeddings of random codes."""
    out = []
    for _ in range(n):
        h = torch.randn(1, 1, talker_hidden, generator=g)
        codes = torch.randint(0, cp.cfg.vocab_size, (16,), generator=g)
        rows = [h] + [cp.model.codec_embedding[i](codes[i : i + 1])[None] for i in range(cp.num_heads)]
        out.append(torch.cat(rows, dim=1))  # [1, 16, Ht]; row 1 stands in for C(code 0)
    return out


def calibrate_predictor(cp: CodePredictor, talker_hidden: int, seed: int = 0,
                        frames: int = 8) -> dict[str, dict[str, float]]:
    """Activation figures of the code predictor over a few frames of ar-shaped calls (engine modules, fp32)."""
    g = torch.Generator().manual_seed(seed)
    frames = _frame_rows(cp, talker_hidden, g, frames)

    def run():
        cp.model.setup_cache(cp.cfg.num_code_groups + 2, dtype=torch.float32)
        for rows in frames:
            x = cp.small_to_mtp_projection(rows)
            h = cp.model(x, 0)
            for i in range(cp.num_heads):
                cp.lm_head[i](h[:, i + 1])

    return measure_activations(cp, run)


def calibrate_talker(talker: Talker, rows: int = 64, seed: int = 0) -> dict[str, dict[str, float]]:
    """Activation figures of the talker over a prompt-like sequence of codec embeddings (engine modules, fp32)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, talker.cfg.vocab_size, (1, rows), generator=g)

    def run():
        talker.model.setup_cache(rows, dtype=torch.float32)
        talker(talker.embed_codec(ids), 0)

    return measure_activations(talker, run)


# ---------------------------------------------------------------------------------------------------- functions


@dataclass
class Function:
    """One Core ML function: a wrapper module, example inputs, input specs (name, shape, dtype), outputs."""

    module: nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[tuple[str, tuple[int, ...], str]]
    outputs: list[str]


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def predictor_functions(cp: CodePredictor, talker_hidden: int, settings: ExportSettings,
                        offsets: torch.Tensor | None, scales: dict[str, float]) -> tuple[dict[str, Function], list]:
    """prefill (T = 2, drafts), ar (T = 1) and verify (T = N + 1, drafts) over one set of cache buffers."""
    tree, k = settings.tree, settings.drafts
    ctx = predictor_context(tree)
    state = new_kv_state(cp.model, ctx)
    calls = {
        "prefill": PredictorCall(cp, state, (0, 0), k, offsets, scales),
        "ar": PredictorCall(cp, state, (0,), 0, offsets, scales),
        "verify": PredictorCall(cp, state, tree.depth, k, offsets, scales),
    }
    out = {}
    for name, call in calls.items():
        t = len(call.depths)
        allowed = torch.ones(t, t, dtype=torch.bool).tril() if name != "verify" else tree.ancestor_mask()
        mask = torch.full((t, ctx), -1.0e4)
        mask[:, :t] = additive_mask(allowed)
        example = (torch.randn(1, t, talker_hidden), _i32(list(range(t))), _i32(list(range(t))), mask, _i32([0]))
        inputs = [("rows", (1, t, talker_hidden), "fp"), ("positions", (t,), "i32"), ("slots", (t,), "i32"),
                  ("mask", (t, ctx), "fp"), ("k", (1,), "i32")]
        outputs = ["logits", "drafts"] if call.drafts else ["logits"]
        out[name] = Function(call, example, inputs, outputs)
    return out, state


def talker_functions(talker: Talker, settings: ExportSettings, scales: dict[str, float]):
    """prefill (P rows at slots 0..P-1) and decode (one row at a dynamic slot) over one set of cache buffers."""
    state = new_kv_state(talker.model, settings.context)
    p, s, h = settings.prefill_len, settings.context, talker.cfg.hidden_size
    mask = additive_mask(torch.arange(s) <= p)[None]
    out = {
        "prefill": Function(TalkerPrefill(talker, state, p, scales), (torch.randn(1, p, h),),
                            [("x", (1, p, h), "fp")], ["hidden", "logits"]),
        "decode": Function(TalkerDecode(talker, state, scales), (torch.randn(1, 1, h), _i32([p]), mask),
                           [("x", (1, 1, h), "fp"), ("pos", (1,), "i32"), ("mask", (1, s), "fp")],
                           ["hidden", "logits"]),
    }
    return out, state


def codec_functions(decoder, settings: ExportSettings) -> dict[str, Function]:
    """One streaming step of C frames with the carried state as explicit inputs (state{i}) and outputs."""
    from leapvox.engine.coreml.wrappers import CodecChunk

    chunk = CodecChunk(decoder, settings.codec_chunk)
    shapes = chunk.state_shapes()
    cos, sin, mask = chunk.host_inputs(0)
    n = settings.codec_chunk
    inputs = [("codes", (1, decoder.config.num_quantizers, n), "i32"), ("cos", tuple(cos.shape), "fp"),
              ("sin", tuple(sin.shape), "fp"), ("mask", tuple(mask.shape), "fp")]
    inputs += [(f"state{i}", s, "fp") for i, s in enumerate(shapes)]
    codes = torch.zeros(1, decoder.config.num_quantizers, n, dtype=torch.int32)
    example = (codes, cos, sin, mask, *chunk.initial_state())
    outputs = ["wav"] + [f"next_state{i}" for i in range(len(shapes))]
    return {"step": Function(chunk, example, inputs, outputs)}


# ---------------------------------------------------------------------------------------------------- conversion


def _coremltools():
    try:
        import coremltools as ct
    except ImportError:
        raise CoreMLExportError(
            "coremltools is not installed", hint='pip install "leapvox[coreml]" (conversion runs on Linux too)'
        ) from None
    return ct


def convert_function(fn: Function, state_names: list[str], state: list[torch.Tensor], weights: str,
                     fp32: bool = False):
    """Trace and convert one wrapper to an fp16-compute ML program (states as fp16 Core ML states); `fp32` keeps
    compute, inputs, outputs and states in fp32 (for a part whose activations do not fit fp16)."""
    ct = _coremltools()
    module = fn.module.eval()
    with torch.no_grad():
        traced = torch.jit.trace(module, fn.example, check_trace=False)
    for buf in state:  # tracing ran the in-place cache writes once
        buf.zero_()
    fp = np.float32 if fp32 else np.float16
    dtypes = {"fp": fp, "i32": np.int32}
    ml = ct.convert(
        traced,
        inputs=[ct.TensorType(name=n, shape=s, dtype=dtypes[d]) for n, s, d in fn.inputs],
        outputs=[ct.TensorType(name=n, dtype=fp) for n in fn.outputs],
        states=[ct.StateType(wrapped_type=ct.TensorType(shape=tuple(b.shape), dtype=fp), name=n)
                for n, b in zip(state_names, state, strict=True)] or None,
        minimum_deployment_target=ct.target.macOS15,
        compute_precision=ct.precision.FLOAT32 if fp32 else ct.precision.FLOAT16,
        convert_to="mlprogram",
        skip_model_load=True,
    )
    if weights == "w8a16":
        ml = ct.optimize.coreml.linear_quantize_weights(ml, w8a16_config(ml._mil_program))
    return ml


WEIGHT_CONSUMERS = ("linear", "conv", "matmul")
STACKED_HEADS = "heads"  # PredictorCall's LM heads, [15, V, Hc] after const folding: a scale per head and row


def w8a16_config(program, threshold: int = 2048):
    """int8 symmetric per-output-channel quantization for the weights of linear / conv / matmul ops and for the
    stacked LM heads; everything else stays fp16 (RoPE tables, masks, offsets, codebooks, biases), by name."""
    ct = _coremltools()
    q = ct.optimize.coreml
    per_channel = q.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                            weight_threshold=threshold)
    names: dict = {}
    for fn in program.functions.values():
        for op in fn.find_ops(op_type="const"):
            val = op.outputs[0].val
            if val is None or getattr(val, "size", 0) <= threshold:
                continue
            users = {c.op_type for c in op.outputs[0].child_ops}
            if users & set(WEIGHT_CONSUMERS):
                names[op.name] = per_channel
            elif op.name.startswith(STACKED_HEADS) and val.ndim == 3:
                names[op.name] = q.OpLinearQuantizerConfig(
                    mode="linear_symmetric", dtype="int8", granularity="per_block", block_size=[1, 1, 0],
                    weight_threshold=threshold)
            else:
                names[op.name] = None
    return q.OptimizationConfig(global_config=None, op_name_configs=names)


def _save_multifunction(paths: dict[str, Path], dest: Path, default: str) -> None:
    ct = _coremltools()
    desc = ct.utils.MultiFunctionDescriptor()
    for name, path in paths.items():
        desc.add_function(str(path), src_function_name="main", target_function_name=name)
    desc.default_function_name = default
    ct.utils.save_multifunction(desc, str(dest))


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def export_part(part: str, fns: dict[str, Function], state: list[torch.Tensor], state_names: list[str],
                weights: str, work: Path, say: Callable[[str], None], fp32: bool = False) -> dict:
    """Convert every function of a part and merge them into one multifunction <part>.mlpackage in `work`."""
    single = {}
    info = {"compute": "fp32" if fp32 else "fp16", "functions": {},
            "states": {n: list(b.shape) for n, b in zip(state_names, state, strict=True)}}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        say(f"{part}: converting {name} ...")
        ml = convert_function(fn, state_names, state, weights, fp32)
        single[name] = work / f"{part}-{name}.single.mlpackage"
        ml.save(str(single[name]))
        dt = time.perf_counter() - t0
        info["functions"][name] = {"inputs": {n: list(s) for n, s, _ in fn.inputs}, "outputs": fn.outputs,
                                   "convert_s": round(dt, 2)}
        say(f"{part}: {name} converted in {dt:.1f} s")
    dest = work / f"{part}.mlpackage"
    if len(single) == 1:
        shutil.move(str(next(iter(single.values()))), dest)
    else:
        say(f"{part}: merging {len(single)} functions (shared weights) ...")
        _save_multifunction(single, dest, default=next(iter(single)))
        for p in single.values():
            shutil.rmtree(p)
    info["bytes"] = dir_size(dest)
    return info


def _needs_fp32(part: str, stats: dict, say: Callable[[str], None]) -> bool:
    """fp32 compute for a part whose measured activations come within 4x of fp16's largest value."""
    risk = fp16_risk(stats)
    if risk and not risk["activations_fit_fp16"]:
        say(f"{part}: activations reach {risk['max_abs_activation']:.0f} (at {risk['at']}), too close to fp16's "
            "65504: this part is converted with fp32 compute (it will run on the GPU or CPU, not the Neural Engine)")
        return True
    return False


def export_modules(talker: Talker, dest: Path, settings: ExportSettings, offsets: torch.Tensor | None = None,
                   meta: dict | None = None, say: Callable[[str], None] = print, codec=None) -> dict:
    """Export the parts of `talker` into `dest` (written in a temp folder beside it, then renamed)."""
    settings.check()
    ct = _coremltools()
    if offsets is not None and offsets.shape[-2] < settings.drafts:  # as spec mode: draft no deeper than offsets
        depth = offsets.shape[-2]
        settings = replace(settings, drafts=depth, tree_paths=tuple(settings.tree.pruned(depth).paths()[1:]))
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    cp = talker.code_predictor
    ht = talker.cfg.hidden_size
    manifest = {"created": time.time(), "coremltools": ct.__version__, "torch": torch.__version__,
                "settings": {**asdict(settings), "key": settings.key()}, **(meta or {}), "parts": {},
                "numerics": {}}
    try:
        with torch.no_grad():
            if "predictor" in settings.parts:
                stats = calibrate_predictor(cp, ht)
                scales = norm_scales(stats, prefix="model.")
                manifest["numerics"]["predictor"] = {"fp16": fp16_risk(stats), "norm_scales": scales}
                fns, state = predictor_functions(cp, ht, settings, offsets, scales)
                names = fns["ar"].module.state_names()
                manifest["parts"]["predictor"] = export_part("predictor", fns, state, names, settings.weights, work,
                                                             say, _needs_fp32("predictor", stats, say))
                manifest["parts"]["predictor"]["tree_paths"] = [list(p) for p in settings.tree_paths]
            if "talker" in settings.parts:
                stats = calibrate_talker(talker)
                stats = {n: s for n, s in stats.items() if not n.startswith("code_predictor.")}
                scales = norm_scales(stats, prefix="model.")
                manifest["numerics"]["talker"] = {"fp16": fp16_risk(stats), "norm_scales": scales}
                fns, state = talker_functions(talker, settings, scales)
                names = fns["decode"].module.state_names()
                manifest["parts"]["talker"] = export_part("talker", fns, state, names, settings.weights, work, say,
                                                          _needs_fp32("talker", stats, say))
            if "codec" in settings.parts and codec is not None:
                if not hasattr(codec, "pre_transformer"):
                    say("codec: only the Qwen 12 Hz codec decoder is exported; skipping this model's codec")
                else:
                    fns = codec_functions(codec, settings)
                    manifest["parts"]["codec"] = export_part("codec", fns, [], [], settings.weights, work, say)
        manifest["bytes"] = dir_size(work)
        (work / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def export_model(folder: Path, settings: ExportSettings, say: Callable[[str], None] = print) -> tuple[Path, dict]:
    """Load the checkpoint in `folder` (fp32), pick up its spec offsets, export into the coreml folder."""
    from leapvox.models.load import load_model
    from leapvox.models.spec_assets import load_offsets

    model = load_model(folder, weights="fp32")
    talker = model.tts.talker
    offsets, opath = load_offsets(folder, talker.code_predictor.cfg.hidden_size)
    if offsets is None and "predictor" in settings.parts:
        say("no trained spec offsets for this model: the verify function drafts with zero offsets")
    dest = export_dir(folder, settings)
    meta = {"model": str(Path(folder).resolve()), "revision": model_revision(folder),
            "offsets": str(opath) if opath else None}
    return dest, export_modules(talker, dest, settings, offsets, meta, say, codec=model.codec)


# ---------------------------------------------------------------------------------------------------- tree size


def time_verify_over_ar(fns: dict, manifest: dict, repeats: int = 20) -> dict[str, float]:
    """Median seconds of the exported predictor's `ar` and `verify` calls (inputs of the exported shapes, one
    shared state) and their ratio. `fns` are function models with Core ML's predict(inputs, state) interface."""
    part = manifest["parts"]["predictor"]
    fp = np.float32 if part.get("compute") == "fp32" else np.float16
    rng = np.random.default_rng(0)

    def feed(name):
        spec = part["functions"][name]["inputs"]
        t = spec["positions"][0]
        return {"rows": rng.standard_normal(spec["rows"]).astype(fp), "positions": np.arange(1, t + 1, dtype=np.int32),
                "slots": np.arange(t, dtype=np.int32), "mask": np.zeros(spec["mask"], dtype=fp),
                "k": np.ones(1, dtype=np.int32)}

    state = fns["ar"].make_state()
    out = {}
    for name in ("ar", "verify"):
        inputs, times = feed(name), []
        for i in range(repeats + 3):  # 3 warm-up calls
            t0 = time.perf_counter()
            fns[name].predict(inputs, state)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = float(np.median(times))
    out["verify_over_ar"] = out["verify_s"] / out["ar_s"]
    return out


def profile_verify(talker: Talker, trees: list[DraftTree], offsets: torch.Tensor | None,
                   compute_units: str = "cpu_and_ne", weights: str = "w8a16", say: Callable[[str], None] = print,
                   load=None) -> dict[int, dict[str, float]]:
    """For each draft tree: export the predictor with that verify function (a temporary package), load it with
    `compute_units` and time verify against ar on this machine (`load(package, names, units)` defaults to
    coreml_runtime.load_functions, i.e. Core ML on macOS). Returns N -> time_verify_over_ar's figures."""
    from leapvox.engine.coreml.runtime import load_functions

    out = {}
    with tempfile.TemporaryDirectory(prefix="leapvox-calibrate-") as tmp:
        for tree in trees:
            settings = ExportSettings(weights=weights, tree_paths=tuple(tree.paths()[1:]), drafts=tree.max_depth,
                                      parts=("predictor",))
            dest = Path(tmp) / f"n{tree.size}"
            say(f"exporting a verify function over N={tree.size} draft nodes to time it ...")
            manifest = export_modules(talker, dest, settings, offsets, say=lambda m: None)
            fns = (load or load_functions)(dest / "predictor.mlpackage", ["ar", "verify"], compute_units)
            out[tree.size] = time_verify_over_ar(fns, manifest)
            say(f"N={tree.size}: verify {out[tree.size]['verify_s'] * 1e3:.2f} ms = "
                f"{out[tree.size]['verify_over_ar']:.2f} x an ar call")
    return out


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"



# Ops that the Neural Engine does not run (they go to the CPU or GPU and split the graph); a conservative list.
OFF_ANE_OPS = frozenset({
    "scatter", "scatter_nd", "scatter_along_axis", "gather_nd", "non_zero", "while_loop", "cond", "topk",
    "argsort", "random_uniform", "random_normal", "random_bernoulli", "random_categorical", "einsum",
})


def inspect_package(path: Path) -> dict:
    """What an .mlpackage holds, read from its protobuf spec and MIL program (no Core ML runtime needed):
    per function its inputs (shape, dtype), outputs, states, op-type counts, weight dtypes, ops computing in fp32
    (constants such as rsqrt's fp32 epsilon are not counted) and the ops from OFF_ANE_OPS."""
    from collections import Counter

    ct = _coremltools()
    from coremltools.proto import MIL_pb2

    spec = ct.utils.load_spec(str(path))
    dtype_name = MIL_pb2.DataType.Name
    out: dict = {"default": spec.description.defaultFunctionName, "functions": {}}
    def arr(t):
        return {"shape": list(t.multiArrayType.shape), "dtype": ct.proto.FeatureTypes_pb2.ArrayFeatureType
                .ArrayDataType.Name(t.multiArrayType.dataType)}

    described = list(spec.description.functions)
    if not described:  # a single-function package keeps its interface at the top of the description
        described = [spec.description]
    for f in described:
        out["functions"][getattr(f, "name", "") or "main"] = {
            "inputs": {i.name: arr(i.type) for i in f.input},
            "outputs": [o.name for o in f.output],
            "states": {s.name: list(s.type.stateType.arrayType.shape) for s in f.state},
        }
    for name, fn in spec.mlProgram.functions.items():
        ops = fn.block_specializations[fn.opset].operations
        weights: Counter = Counter()
        fp32 = 0
        for op in ops:
            if op.type == "constexpr_blockwise_shift_scale":
                weights[dtype_name(op.inputs["data"].arguments[0].value.type.tensorType.dataType)] += 1
            elif op.type == "const" and op.attributes["val"].HasField("blobFileValue"):
                weights[dtype_name(op.attributes["val"].type.tensorType.dataType)] += 1
            fp32 += op.type != "const" and any(o.type.tensorType.dataType == MIL_pb2.FLOAT32 for o in op.outputs)
        types = Counter(op.type for op in ops)
        info = out["functions"].setdefault(name, {})
        info.update(ops=dict(types), weights=dict(weights), fp32_ops=fp32,
                    off_ane_ops=sorted(t for t in types if t in OFF_ANE_OPS))
    return out
