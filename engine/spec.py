"""`spec` mode: RVQ-position-aware speculative decoding of the code predictor's codes 1..15.

Indexing. Predictor position p holds input p: 0 = talker hidden, 1 = C(code 0), g+1 = E_{g-1}(code g). The
final-normed hidden h_p feeds head p-1, whose target is code p. **Drafting**: heads p-1+j read h_p + b_j
(j = 1..K) and propose code p+j. Verification never sees the offsets b, so outputs keep ar's distribution.

One verify call feeds the token just sampled (the root, code k, at position k+1) plus a sparse tree of drafts
(a node at depth d is a candidate for code k+d at position k+1+d) under a tree mask: every row attends to the
committed prefix, its ancestors and itself. The walk accepts children with lossless speculative sampling;
the accepted rows' K/V are moved into place and the next code is sampled from the last accepted node, so a
call always yields >= 1 code.

Losslessness: the candidates of each depth are drawn from the draft distribution q WITHOUT replacement
(Gumbel-top-k) and tried in that order; child x is accepted with probability min(1, p(x)/q(x)); on rejection
p <- normalize(max(p - q, 0)) and x is removed from q (renormalised). Greedy decoding uses the top-ranked
drafts and accepts a child iff it is the target's argmax, so greedy spec == greedy ar token for token.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field

import torch

from leapvox.engine.fast.predictor import PredictorLoop, loop_for
from leapvox.engine.nets.code_predictor import CodePredictor
from leapvox.engine.sampling import SamplingParams, temperature_top_k_top_p


@dataclass(frozen=True)
class DraftTree:
    """Node 0 is the root (the token just sampled). Node i > 0: parent[i] < i, depth[i] = depth[parent[i]] + 1,
    rank[i] = which draft candidate of its depth it carries. Nodes are ordered by depth, and the children of every
    node carry ranks 0..m-1 (the walk treats them as the first m draws without replacement). A tree that breaks
    these rules raises ValueError when built (`from_paths` renumbers rank gaps instead)."""

    parent: tuple[int, ...] = (-1,)
    depth: tuple[int, ...] = (0,)
    rank: tuple[int, ...] = (0,)

    def __post_init__(self):
        problem = tree_problem(self.parent, self.depth, self.rank)
        if problem:
            raise ValueError(f"bad draft tree: {problem}")

    @classmethod
    def from_paths(cls, paths) -> DraftTree:
        """Build from rank paths such as [(0,), (1,), (0, 0)]; every prefix of a path becomes a node too.

        The walk tries a node's m children as the first m draws (without replacement) of their depth, so their
        ranks must be 0..m-1. Siblings that skip a rank are renumbered in order (children ranked {0, 1, 3} become
        0, 1, 2; their subtrees move with them): same shape, same node order, a tree the walk treats losslessly.
        Code that reads a stored tree should refuse a gap instead (`rank_gap`)."""
        nodes = {()}
        for path in paths:
            path = tuple(operator.index(r) for r in path)  # TypeError for a non-integer rank
            if any(r < 0 for r in path):
                raise ValueError(f"bad draft tree: path {path} holds a negative rank")
            nodes.update(path[:i] for i in range(1, len(path) + 1))
        if rank_gap(nodes):
            nodes = _renumbered(nodes)
        order = sorted(nodes, key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(order)}
        return cls(
            parent=tuple(index[p[:-1]] if p else -1 for p in order),
            depth=tuple(len(p) for p in order),
            rank=tuple(p[-1] if p else 0 for p in order),
        )

    @property
    def size(self) -> int:
        """Draft nodes, the root excluded."""
        return len(self.parent) - 1

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def paths(self) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = [()]
        for i in range(1, len(self.parent)):
            out.append(out[self.parent[i]] + (self.rank[i],))
        return out

    def pruned(self, max_depth: int) -> DraftTree:
        """The nodes no deeper than `max_depth`."""
        return self if self.max_depth <= max_depth else _pruned(self, max_depth)

    def widths(self) -> list[int]:
        """Candidates needed per depth 1..max_depth."""
        w = [0] * (self.max_depth + 1)
        for d, r in zip(self.depth, self.rank, strict=True):
            w[d] = max(w[d], r + 1)
        return w[1:]

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parent]
        for i in range(1, len(self.parent)):
            kids[self.parent[i]].append(i)
        return [sorted(k, key=lambda i: self.rank[i]) for k in kids]

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: row i may attend to column j iff j is i or one of its ancestors."""
        return _ancestor_mask(self).clone()


def rank_gap(paths) -> str | None:
    """None when, under every node, the children's ranks are exactly 0..m-1; else what is wrong. A child whose
    lower-ranked sibling is missing would be tried as if it were an earlier draw than it is: spec's acceptance
    rule would no longer keep ar's distribution."""
    nodes = {tuple(p) for p in paths} | {()}
    nodes |= {p[:i] for p in list(nodes) for i in range(len(p))}
    kids: dict[tuple[int, ...], list[int]] = {}
    for p in nodes:
        if p:
            kids.setdefault(p[:-1], []).append(p[-1])
    for parent, ranks in sorted(kids.items()):
        if sorted(ranks) != list(range(len(ranks))):
            missing = min(set(range(max(ranks) + 1)) - set(ranks))
            return (f"the children of node {parent} carry ranks {sorted(ranks)} but not {missing} "
                    f"(siblings must carry ranks 0..m-1)")
    return None


def _renumbered(nodes: set[tuple[int, ...]]) -> set[tuple[int, ...]]:
    """The same prefix-closed path set with each node's children renumbered 0..m-1 in their rank order."""
    new = {(): ()}
    for p in sorted(nodes, key=lambda p: (len(p), p)):
        if p:
            siblings = sorted(q[-1] for q in nodes if len(q) == len(p) and q[:-1] == p[:-1])
            new[p] = new[p[:-1]] + (siblings.index(p[-1]),)
    return set(new.values())


def tree_problem(parent, depth, rank) -> str | None:
    """None for a well-formed tree given as parent/depth/rank tuples, else what is wrong."""
    n = len(parent)
    if not (n == len(depth) == len(rank)) or n == 0:
        return "parent, depth and rank must have one entry per node, the root first"
    if parent[0] != -1 or depth[0] != 0 or rank[0] != 0:
        return "node 0 must be the root (parent -1, depth 0, rank 0)"
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, n):
        if not 0 <= parent[i] < i:
            return f"node {i} has parent {parent[i]}; parents come before their children"
        if depth[i] != depth[parent[i]] + 1 or depth[i] < depth[i - 1]:
            return f"node {i} has depth {depth[i]}; depth is the parent's + 1 and nodes are ordered by depth"
        if rank[i] < 0:
            return f"node {i} has rank {rank[i]}"
        paths.append(paths[parent[i]] + (rank[i],))
    if len(set(paths)) < n:
        return "two siblings carry the same rank"
    return rank_gap(paths)


@functools.cache
def _pruned(tree: DraftTree, max_depth: int) -> DraftTree:
    return DraftTree.from_paths(p for p in tree.paths()[1:] if len(p) <= max_depth)


@functools.cache
def _ancestor_mask(tree: DraftTree) -> torch.Tensor:
    n = len(tree.parent)
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[tree.parent[i]]
    return mask


def chain(depth: int) -> DraftTree:
    return DraftTree.from_paths([(0,) * depth])


def default_tree(depth: int = 3) -> DraftTree:
    """The tree used until a calibrated one exists: 3 candidates at depth 1, a second at depth 2, the top-1 chain
    below the best candidate `depth` deep (as deep as the offsets draft) and one node below the second."""
    if not 1 <= depth <= 14:
        raise ValueError(f"draft depth {depth} is outside 1..14 (15 codes per frame, the first sampled alone)")
    return DraftTree.from_paths([(0,) * depth, (1, 0), (2,), (0, 1)]).pruned(depth)


DEFAULT_TREE = default_tree(3)


@dataclass
class SpecStats:
    calls: int = 0
    tokens: int = 0
    attempts: list[int] = field(default_factory=list)  # per depth: children tried at that depth
    accepts: list[int] = field(default_factory=list)  # per depth: accepted

    def record(self, depth: int, accepted: bool) -> None:
        while len(self.attempts) < depth:
            self.attempts.append(0)
            self.accepts.append(0)
        self.attempts[depth - 1] += 1
        self.accepts[depth - 1] += int(accepted)

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class DraftPlan:
    """What spec mode drafts with: the draft tree and the offsets b [K, Hc] or per position [15, K, Hc] (None: zero
    offsets, the reused-heads baseline). Read-only; the counters of a frame go to a SpecStats."""

    tree: DraftTree = DEFAULT_TREE
    offsets: torch.Tensor | None = None

    @property
    def depth(self) -> int:
        k = self.tree.max_depth
        return min(k, self.offsets.shape[-2]) if self.offsets is not None else k


def _probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return torch.softmax(temperature_top_k_top_p(logits[None].float(), params)[0], dim=-1)


def draft(
    heads,
    h: torch.Tensor,
    k: int,
    widths: list[int],
    offsets: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Candidates for codes k+1..k+len(widths) from the normed hidden h [1, Hc] at position k, through `heads`
    (the predictor's LM heads as callables on [1, Hc] rows).

    Returns per depth the candidate tokens [w] and (when sampling) the draft distribution q [V].
    """
    logits = (
        heads[k - 1 + j](h if offsets is None else h + _offset(offsets, k, j, h.dtype))[0]
        for j in range(1, len(widths) + 1)
    )
    return candidates(logits, widths, params, generator)


def candidates(logits_by_depth, widths: list[int], params: SamplingParams, generator: torch.Generator | None):
    """Per depth, from its draft logits [V]: the top-w tokens (greedy) or w draws without replacement from the
    processed draft distribution q, with q (None when greedy). Depths in order: that is the random draw order."""
    tokens, qs = [], []
    for logits, w in zip(logits_by_depth, widths, strict=False):
        logits = logits.float()
        if not params.do_sample:
            tokens.append(torch.topk(logits, w).indices)
            qs.append(None)
            continue
        q = _probs(logits, params)
        tokens.append(sample_without_replacement(q, w, generator))
        qs.append(q)
    return tokens, qs


def _offset(offsets: torch.Tensor, k: int, j: int, dtype: torch.dtype) -> torch.Tensor:
    """b_j from shared offsets [K, Hc], or b_{k,j} from per-position offsets [15, K, Hc], in the hidden states'
    dtype (offsets are stored fp32; a bf16 model's heads take bf16 rows)."""
    return (offsets[j - 1] if offsets.dim() == 2 else offsets[k - 1, j - 1]).to(dtype)


def sample_without_replacement(q: torch.Tensor, w: int, generator: torch.Generator | None) -> torch.Tensor:
    """Up to `w` distinct ids drawn from q [V] one after another without replacement (Gumbel-top-k)."""
    w = min(w, int((q > 0).sum()))
    gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=generator).clamp_min(1e-20)))
    return torch.topk(q.log() + gumbel, w).indices


def accept_child(
    p: torch.Tensor, q: torch.Tensor, candidates: list[int], generator: torch.Generator | None
) -> tuple[int | None, torch.Tensor]:
    """Lossless multi-candidate rule. Returns (index of the accepted candidate or None, residual p)."""
    q = q.clone()
    for i, x in enumerate(candidates):
        u = torch.rand((), generator=generator)
        if q[x] > 0 and u * q[x] < p[x]:
            return i, p
        residual = (p - q).clamp_min(0)
        total = residual.sum()
        if total > 0:
            p = residual / total
        else:  # p == q up to rounding: acceptance was certain in exact arithmetic; drop x and carry on
            p = p.clone()
            p[x] = 0
            p = p / p.sum()
        q[x] = 0
        if q.sum() <= 0:
            break
        q = q / q.sum()
    return None, p


@torch.inference_mode()
def predict_codes_spec(
    cp: CodePredictor,
    talker_hidden: torch.Tensor,
    code0_embed: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    plan: DraftPlan,
    stats: SpecStats,
) -> torch.Tensor:
    """Codes 1..15 of one frame [1, 15] with speculative verify calls (batch 1), on the predictor's hot loop
    (predictor.PredictorLoop: its buffers, its module-free products). Counters go to `stats`."""
    n = cp.num_heads
    loop = loop_for(cp)
    loop.reserve(cp.cfg.num_code_groups + plan.tree.size + 2)
    hid = loop.hidden(loop.project(torch.cat([talker_hidden[0], code0_embed[0]])), 0)  # [1, Hc], position 1

    def call(k: int, tok: int):
        nonlocal hid
        tree = plan.tree.pruned(min(plan.depth, n - k))
        path, next_tok, hid = _verify_and_walk(loop, tree, plan.offsets, stats, k, tok, hid, params, generator)
        return path, next_tok

    codes = spec_frame(_sample(loop.heads[0](hid)[0], params, generator), n, stats, call)
    return torch.tensor([codes], device=hid.device)


def spec_frame(tok: int, n: int, stats: SpecStats, call) -> list[int]:
    """The per-frame spec loop every backend shares. `tok` is code 1, sampled from the prefill call; then
    `call(k, tok)` runs one verify call with the last sampled code `tok` (code k) as root and returns the
    accepted draft codes and the code sampled after them (None when the frame is complete)."""
    codes, k = [tok], 1
    stats.calls += 1
    stats.tokens += 1
    while k < n:
        path, next_tok = call(k, tok)
        codes.extend(path)
        stats.calls += 1
        stats.tokens += len(path) + (next_tok is not None)
        k += len(path)
        if next_tok is None:
            break
        codes.append(next_tok)
        tok, k = next_tok, k + 1
    return codes


def _sample(logits: torch.Tensor, params: SamplingParams, generator) -> int:
    if not params.do_sample:
        return int(torch.argmax(logits))
    return int(torch.multinomial(_probs(logits, params), 1, generator=generator))


def _verify_and_walk(loop: PredictorLoop, tree, offsets, stats, k, tok, h, params, generator):
    """One call: root `tok` (code k) + the draft tree. Returns (accepted codes, next code or None, hidden [1, Hc])."""
    n = len(loop.heads)
    widths = tree.widths() if tree.size else []
    tokens, qs = draft(loop.heads, h, k, widths, offsets, params, generator)
    # a depth may have fewer candidates than the tree asks for (tiny support after top-k / top-p): drop the nodes
    # whose own rank is out of range AND their descendants (every rank on a node's path must be in range)
    live = [True]
    for i in range(1, len(tree.parent)):
        live.append(live[tree.parent[i]] and tree.rank[i] < len(tokens[tree.depth[i] - 1]))
    if not all(live):
        tree = DraftTree.from_paths(p for i, p in enumerate(tree.paths()) if live[i] and p)
    node_tok = [tok] + [int(tokens[d - 1][r]) for d, r in zip(tree.depth[1:], tree.rank[1:], strict=True)]
    # node i carries code k + depth; its input row is that code's table (code g: table g - 1), then the projection
    rows = torch.cat([loop.tables[k + d - 1][t : t + 1] for t, d in zip(node_tok, tree.depth, strict=True)])
    rows = rows.to(loop.dtype)  # a quantized model's tables are kept as stored
    start = k + 1
    hidden = loop.rows(loop.project(rows), start, _tree_mask(tree, start, h.device), _positions(tree, start, h.device))

    kids = tree.children()
    path, u = [], 0
    while True:
        code = k + tree.depth[u]  # node u carries this code; its head predicts code + 1
        if code >= n:  # code 15 reached: the frame is complete
            next_tok = None
            break
        logits = loop.heads[code](hidden[u : u + 1])[0].float()
        child = _walk_step(logits, kids[u], tree, node_tok, qs, params, generator, stats)
        if isinstance(child, tuple):  # rejected all children (or none): sample here
            next_tok = child[0]
            break
        path.append(child)
        u = child
    if path:
        loop.commit(torch.tensor(path, device=h.device) + start, start + 1)
    return [node_tok[i] for i in path], next_tok, hidden[u : u + 1]


@functools.cache
def _tree_mask_cpu(tree: DraftTree, start: int) -> torch.Tensor:
    mask = torch.ones(len(tree.parent), start + len(tree.parent), dtype=torch.bool)
    mask[:, start:] = _ancestor_mask(tree)
    return mask


def _tree_mask(tree: DraftTree, start: int, device) -> torch.Tensor:
    """[N+1, start+N+1] bool: every node sees the committed prefix, its ancestors and itself."""
    return _tree_mask_cpu(tree, start).to(device)


@functools.cache
def _positions_cpu(tree: DraftTree, start: int) -> torch.Tensor:
    return torch.tensor(tree.depth) + start


def _positions(tree: DraftTree, start: int, device) -> torch.Tensor:
    """RoPE positions of the root and the nodes: start + depth."""
    return _positions_cpu(tree, start).to(device)


def _walk_step(logits, children, tree, node_tok, qs, params, generator, stats):
    """Accept one of `children` (returns its node index) or sample the next code (returns a 1-tuple)."""
    if not children:
        return (_sample(logits, params, generator),)
    depth = tree.depth[children[0]]
    if not params.do_sample:
        target = int(torch.argmax(logits))
        for c in children:
            ok = node_tok[c] == target
            stats.record(depth, ok)
            if ok:
                return c
        return (target,)
    p = _probs(logits, params)
    i, p = accept_child(p, qs[depth - 1], [node_tok[c] for c in children], generator)
    for j in range(len(children) if i is None else i + 1):
        stats.record(depth, j == i)
    if i is not None:
        return children[i]
    return (int(torch.multinomial(p, 1, generator=generator)),)
