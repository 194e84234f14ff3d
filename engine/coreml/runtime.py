"""The Core ML backend (`--backend ane`): the exported talker and code-predictor functions run by Core ML on macOS
15+, behind the same interface as the torch engine (engine/backend.py).

What runs where. Core ML: the talker's prefill and decode functions (KV cache as Core ML state) and the code
predictor's prefill, ar and fused draft + verify functions (one shared KV state; drafting for the next call comes
out of the same call). Host: prompt and embedding lookups (the torch model's tables), sampling, the spec walk and
its lossless acceptance (spec.py's functions), the predictor's slot bookkeeping (which cache slots hold committed
rows, `PredictorSlots`), positions and masks. Windowed mode is not exported, so it is refused here.

A function model is anything with `predict(inputs: dict[str, np.ndarray], state) -> dict[str, np.ndarray]` and
`make_state()`: coremltools' CompiledMLModel, one per function of a multifunction package, on a Mac
(`load_functions`); the Linux tests pass a stand-in that runs the torch export wrappers, so everything but the
Core ML call itself is tested there.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch

from leapvox.engine import backend
from leapvox.engine.errors import InputError
from leapvox.engine.nets.talker import Talker
from leapvox.engine.sampling import SamplingParams, pick
from leapvox.engine.spec import (
    DraftPlan,
    DraftTree,
    SpecStats,
    _sample,
    _walk_step,
    candidates,
    spec_frame,
)

# --compute-units (options.COMPUTE_UNIT_CHOICES) -> coremltools.ComputeUnit member
COMPUTE_UNITS = {"cpu_and_ne": "CPU_AND_NE", "all": "ALL", "cpu_only": "CPU_ONLY"}
MANIFEST = "manifest.json"
MASK_MIN = -1.0e4  # additive mask value: exp underflows to exactly 0 in fp32 and fp16, and it stays finite


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask (True = may attend) -> 0 / MASK_MIN."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.full((), MASK_MIN, dtype=dtype))


class PredictorSlots:
    """Host-side bookkeeping of the predictor cache: which slots hold committed rows (never moved or rewritten);
    each call's rows go to free slots; the mask lets a row see every committed slot plus its own tree ancestors."""

    def __init__(self, context: int):
        self.context = context
        self.committed: list[int] = []

    def reset(self) -> None:
        self.committed = []

    def alloc(self, n: int) -> list[int]:
        taken = set(self.committed)
        free = [s for s in range(self.context) if s not in taken][:n]
        if len(free) < n:
            raise RuntimeError(f"predictor cache of {self.context} slots is full")
        return free

    def mask(self, slots: list[int], ancestors: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
        """[T, S] additive mask; `ancestors` [T, T] bool (row i may see row j of this call)."""
        allowed = torch.zeros(len(slots), self.context, dtype=torch.bool)
        allowed[:, self.committed] = True
        allowed[:, slots] = ancestors
        return additive_mask(allowed, dtype)

    def commit(self, slots: list[int]) -> None:
        self.committed.extend(slots)


def unavailable_reason() -> str | None:
    """Why Core ML predictions cannot run here, or None (`backend.ane_unavailable_reason`, which needs no import of
    this module)."""
    return backend.ane_unavailable_reason()


def check_available() -> None:
    """Raise a one-line InputError (exit 2) when Core ML predictions cannot run on this machine."""
    why = backend.ane_unavailable_reason()
    if why:
        raise InputError(why, hint="use --backend cpu")
    try:
        import coremltools  # noqa: F401
    except ImportError as e:
        raise InputError(f"coremltools is installed but does not import: {e}", hint="use --backend cpu") from None


def device_class() -> str:
    """This Mac's chip as a file-name key, e.g. 'apple-m2-pro' (draft trees are calibrated per device class)."""
    chip = ""
    if sys.platform == "darwin":
        import subprocess

        try:
            chip = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            chip = ""
    chip = chip or platform.machine() or "unknown"
    return "-".join("".join(c if c.isalnum() else " " for c in chip.lower()).split())


def load_functions(package: Path, names, compute_units: str = "cpu_and_ne") -> dict:
    """Core ML function models of a multifunction .mlpackage (compiled once to a .mlmodelc beside it)."""
    check_available()
    import coremltools as ct

    if compute_units not in COMPUTE_UNITS:
        raise InputError(f"unknown compute units {compute_units!r}", hint=f"use one of {', '.join(COMPUTE_UNITS)}")
    package = Path(package)
    compiled = package.with_suffix(".mlmodelc")
    if not compiled.is_dir():
        tmp = package.with_suffix(".compiling.mlmodelc")
        ct.models.utils.compile_model(str(package), str(tmp))
        tmp.rename(compiled)
    units = getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units])
    return {n: ct.models.CompiledMLModel(str(compiled), compute_units=units, function_name=n) for n in names}


def read_manifest(export_dir: Path) -> dict:
    path = Path(export_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(
            f"cannot read the Core ML export manifest {path}: {e}", hint="re-run leapvox recipe coreml for this model"
        ) from None
    missing = [p for p in ("talker", "predictor") if p not in manifest.get("parts", {})]
    if missing:
        raise InputError(
            f"the Core ML export {export_dir} has no {' or '.join(missing)} part",
            hint="re-run leapvox recipe coreml with --parts predictor,talker,codec",
        )
    return manifest


class CoreMLBackend:
    """Runs exported Core ML functions; see the module docstring for the split between Core ML and the host."""

    name = "ane"

    def __init__(self, talker: Talker, talker_fns: dict, predictor_fns: dict, manifest: dict):
        self.talker, self.t_fns, self.p_fns = talker, talker_fns, predictor_fns
        parts, settings = manifest["parts"], manifest["settings"]
        self.fp = {p: np.float32 if parts[p].get("compute") == "fp32" else np.float16 for p in parts}
        self.prefill_len = settings["prefill_len"]
        t_states, p_states = parts["talker"]["states"], parts["predictor"]["states"]
        self.context = t_states["k0"][2]
        itemsize = np.dtype(self.fp["talker"]).itemsize
        self.slot_bytes = sum(s[1] * s[3] * itemsize for s in t_states.values())  # KV bytes per talker slot
        self.tree = DraftTree.from_paths(tuple(p) for p in parts["predictor"]["tree_paths"])
        self.depth = min(self.tree.max_depth, settings["drafts"])
        self.kids = self.tree.children()
        self.ancestors = self.tree.ancestor_mask()
        self.tables = talker.code_predictor.model.codec_embedding  # host lookups of codes 1..15, talker width
        self.n_codes = talker.code_predictor.num_heads
        self.slots = PredictorSlots(p_states["k0"][2])
        self.prefix = 0
        self.t_state = self.p_state = None
        self.export_dir: Path | None = None  # set by load_backend

    # ---- talker ---------------------------------------------------------------------------------------------

    def setup(self, prefix: int, max_frames: int, window: int | None = None) -> int:
        if window:
            raise InputError(
                "windowed mode is not available on the ane backend (the exported talker keeps a full KV cache)",
                hint="use --mode ar or --mode spec, or --backend cpu for windowed",
            )
        if prefix > self.prefill_len:
            raise InputError(
                f"the prompt has {prefix} rows, more than the {self.prefill_len} the Core ML talker was exported for",
                hint="split the text, re-export with a larger --prefill-len, or use --backend cpu",
            )
        self.prefix = prefix
        self.t_state = self.t_fns["decode"].make_state()
        self.p_state = self.p_fns["ar"].make_state()
        return min(max_frames, self.context - prefix)

    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt rows [1, L, H], padded to the exported prefill length -> row L-1's (hidden, logits)."""
        n = x.shape[1]
        padded = torch.zeros(1, self.prefill_len, x.shape[2])
        padded[:, :n] = x
        out = self._run(self.t_fns["prefill"], {"x": padded}, self.t_state, "talker")
        return out["hidden"][:, n - 1 : n], out["logits"][:, n - 1 : n]

    def decode(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frame row k [1, 1, H] written at slot = position L + k, attending to slots 0..L+k."""
        pos = self.prefix + k
        mask = additive_mask(torch.arange(self.context) <= pos)[None]  # [1, S]
        out = self._run(self.t_fns["decode"], {"x": x, "pos": _i32([pos]), "mask": mask}, self.t_state, "talker")
        return out["hidden"], out["logits"]

    def span(self, k: int) -> int:
        return self.prefix + k + 1

    def kv_bytes(self, k: int) -> int:
        return self.span(k) * self.slot_bytes

    def reset(self) -> None:
        self.t_state = self.p_state = None
        self.slots.reset()

    # ---- code predictor ----------------------------------------------------------------------------------

    def predict(self, h, c0_embed, params: SamplingParams, generator) -> torch.Tensor:
        """Codes 1..15 [1, 15]: the prefill call, then one ar call per code (the draw order of the ar loop)."""
        logits = self._predictor_prefill(h, c0_embed)["logits"][1]
        codes = []
        for g in range(1, self.n_codes + 1):
            codes.append(pick(logits[None], params, generator))  # [1]
            if g == self.n_codes:
                break
            out, s = self._predictor_call("ar", self._row(g, int(codes[-1])), (0,), g, torch.ones(1, 1).bool())
            self.slots.commit(s)
            logits = out["logits"][0]
        return torch.stack(codes, dim=1)

    def verify(self, h, c0_embed, params: SamplingParams, generator, plan: DraftPlan, stats: SpecStats):
        """Codes 1..15 [1, 15] with fused draft + verify calls over the exported tree (spec.py's walk and
        acceptance; `stats` gets the counters). The tree and offsets are the ones baked into the export, so
        `plan` is not read."""
        out = self._predictor_prefill(h, c0_embed)
        drafts = out["drafts"][1]  # [K, V]: heads 1..K on h_1 + b_j

        def call(k: int, tok: int):
            nonlocal drafts
            depth = min(self.depth, self.n_codes - k)
            path, next_tok, drafts = self._verify_call(k, tok, drafts, depth, params, generator, stats)
            return path, next_tok

        return torch.tensor([spec_frame(_sample(out["logits"][1], params, generator), self.n_codes, stats, call)])

    def _verify_call(self, k, tok, drafts, depth, params, generator, stats):
        """One call: root `tok` (code k) + the exported tree, nodes deeper than `depth` (past code 15) dead.
        Returns (accepted codes, next code or None, draft logits [K, V] of the node where the walk stopped)."""
        tree = self.tree
        live_tree = tree.pruned(depth)
        tokens, qs = draft_candidates(drafts, live_tree.widths() if live_tree.size else [], params, generator)
        live = [True]
        for i in range(1, len(tree.parent)):
            d = tree.depth[i]
            live.append(live[tree.parent[i]] and d <= depth and tree.rank[i] < len(tokens[d - 1]))
        node_tok = [tok] + [
            int(tokens[d - 1][r]) if live[i] else 0
            for i, (d, r) in enumerate(zip(tree.depth[1:], tree.rank[1:], strict=True), start=1)
        ]
        rows = torch.cat([self._row(k + d, t) for d, t in zip(tree.depth, node_tok, strict=True)], dim=1)
        out, s = self._predictor_call("verify", rows, tree.depth, k, self.ancestors)
        kids = [[c for c in cs if live[c]] for cs in self.kids]
        path, u, next_tok = [], 0, None
        while k + tree.depth[u] < self.n_codes:  # node u carries code k + depth; its logits predict the next
            child = _walk_step(out["logits"][u], kids[u], tree, node_tok, qs, params, generator, stats)
            if isinstance(child, tuple):  # rejected all children (or none): sampled here
                next_tok = child[0]
                break
            path.append(child)
            u = child
        self.slots.commit([s[0]] + [s[i] for i in path])  # the root and the accepted rows stay where they are
        return [node_tok[i] for i in path], next_tok, out["drafts"][u]

    def _predictor_prefill(self, h, c0_embed) -> dict[str, torch.Tensor]:
        self.slots.reset()  # a new frame: nothing committed (old rows stay in the state, masked out)
        out, s = self._predictor_call(
            "prefill", torch.cat([h, c0_embed], dim=1), (0, 0), 0, torch.ones(2, 2).bool().tril(), positions=[0, 1]
        )
        self.slots.commit(s)
        return out

    def _predictor_call(self, name, rows, depths, k, ancestors, positions=None):
        """Rows [1, T, H_talker] of depths `depths` under head base k -> outputs, and the slots they were given."""
        s = self.slots.alloc(len(depths))
        positions = positions or [k + 1 + d for d in depths]
        feed = {
            "rows": rows,
            "positions": _i32(positions),
            "slots": _i32(s),
            "mask": self.slots.mask(s, ancestors),
            "k": _i32([k]),
        }
        return self._run(self.p_fns[name], feed, self.p_state, "predictor"), s

    def _row(self, code: int, token: int) -> torch.Tensor:
        """Input row [1, 1, H_talker] for code `code` (1..15) = `token`; zeros past code 15 (ignored rows)."""
        if code > len(self.tables):
            return torch.zeros(1, 1, self.tables[0].embedding_dim)
        table = self.tables[code - 1]
        return table(torch.tensor([[token]], device=table.weight.device)).float().cpu()

    def _run(self, fn, feed: dict[str, torch.Tensor], state, part: str) -> dict[str, torch.Tensor]:
        fp = self.fp[part]
        inputs = {
            n: t.detach().float().cpu().numpy().astype(fp)
            if t.is_floating_point()
            else t.cpu().numpy().astype(np.int32)
            for n, t in feed.items()
        }
        out = fn.predict(inputs, state)
        return {n: torch.from_numpy(np.asarray(v, dtype=np.float32)) for n, v in out.items()}


def draft_candidates(drafts: torch.Tensor, widths: list[int], params: SamplingParams, generator):
    """spec.draft's choice from draft logits [K, V] that the verify call returned: per depth the candidates (top-w,
    or w draws without replacement from q) and q (None when greedy), in spec.draft's draw order."""
    return candidates(drafts[: len(widths)], widths, params, generator)


def load_backend(export_dir: Path, talker: Talker, compute_units: str = "cpu_and_ne") -> CoreMLBackend:
    """The Core ML backend over an export folder (leapvox recipe coreml); `talker` supplies the host embeddings."""
    check_available()
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    fns = {
        part: load_functions(export_dir / f"{part}.mlpackage", manifest["parts"][part]["functions"], compute_units)
        for part in ("talker", "predictor")
    }
    backend = CoreMLBackend(talker, fns["talker"], fns["predictor"], manifest)
    backend.export_dir = export_dir
    return backend


def _i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)
