"""First moments and shared sources of the activations a kernel map carries, for exact fan-ins.

A `Kernel` holds second moments. Where branches meet (`FanInSum`, `FanInProd`, `FanInConcat`), second moments of
the branches are not always enough:

* **Means.** For independent branches f and g, E[(f + g)(x) (f + g)(x')] = K_f + K_g + m_f(x) m_g(x') +
  m_g(x) m_f(x'), with m the mean of one channel's activation. After an affine layer (zero-mean weights and
  biases) m = 0, which is what neural-tangents assumes everywhere; after an activation, m(x) = E[phi(u)] with
  u ~ N(0, K(x, x)): a ReLU branch beside an identity branch over ReLU activations is 25 % off without it.
* **Shared sources.** Branches that are functions of the same activations (no affine layer of their own
  between `FanOut` and the fan-in: ``parallel(Relu(), Erf())`` after one ``Dense``) are not independent, and
  their cross moment E[relu(u) erf(u')] is no product of means.

So every kernel a layer map returns inside a ``kernel_fn`` carries a `Flow` (the hidden ``_flow`` attribute of
the `Kernel`, part of its pytree so that it survives `jax.lax.scan` / `jax.lax.map`): the mean of one channel
at every point and position (``status`` 'zero', 'known' or 'unknown'), whether every channel has that mean
(``exchangeable``: false for raw inputs, whose channels are data), and the open `FanOut` branches the
activations depend on (``labels``: (fan-out token, branch, branches) triples, dropped by an affine layer, whose
output is independent of everything before it in the limit, and closed by the fan-in that merges every branch
of that fan-out). The public ``kernel_fn`` strips the flow from what it returns.

Each `Layer` declares how it maps the flow (``means=``): `FRESH` (affine layers: zero mean, no labels),
`PASS` (values unchanged in mean: `Identity`, `Dropout`), `linear` (a parameter-free map applied alike to every
channel: pooling, flattening; the mean is that map of the mean), `ZERO_PRESERVING` (zero in, zero out; else
unknown), `activation(mean_fn)` (E[phi(u)] of the Gaussian input's variances), `UNKNOWN` (the default: user
layers). The NTK needs no means: gradients of independent branches are orthogonal in the limit.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator

import jax
import jax.numpy as jnp

from smnngp.stax._core import _from_canonical, _spatial_diagonal, to_canonical

# Quadrature for functions of one Gaussian built from several activations (chains, products of branches): the
# polar and split rules are spectral for kinks at 0, but a chain moves kinks away from 0 (|cos u| kinks at +-pi/2)
# and there they converge algebraically. Measured on Dense > Cos > Abs > LayerNorm > Dense against 1e6 Gaussian
# draws (issue 49): 48-node means and a 16 x 48 polar rule 0.111 off; 1,024-node means 0.014; with a 32 x 192
# polar rule 0.005 (the draws' own error). LayerNorm's centring E[phi phi'] - m m' keeps the means' error whole,
# so the means get the most nodes (they cost one node per point, the polar rule one per pair).
CHAIN_POLAR_NODES = (32, 192)
CHAIN_MEAN_NODES = 1024


def chain_polar(f1, f2, c, v1, v2):
    """E[f1(u) f2(v)] by `gauss_polar_2d` with the chains' node counts (`CHAIN_POLAR_NODES`)."""
    from smnngp.stax.elementwise import gauss_polar_2d

    return gauss_polar_2d(f1, f2, c, v1, v2, *CHAIN_POLAR_NODES)


def chain_mean(f, v):
    """E[f(u)], u ~ N(0, v), by `gauss_split_1d` with the chains' node count (`CHAIN_MEAN_NODES`)."""
    from smnngp.stax.elementwise import gauss_split_1d

    return gauss_split_1d(f, v, CHAIN_MEAN_NODES)


@dataclasses.dataclass(frozen=True)
class Flow:
    """The first-moment state of a kernel's activations (see the module docstring).

    ``mean1`` (N1, spatial...) and ``mean2`` (N2, spatial...; ``None`` when x2 is x1) are set when ``status`` is
    'known'; ``why`` names the layer that made the mean unknown.
    """

    status: str
    mean1: object = None
    mean2: object = None
    exchangeable: bool = True
    labels: frozenset = frozenset()
    why: str = ""
    chain: tuple | None = None  # (source token, (phi_1, ..., phi_m)): the activations are phi_m(...phi_1(u))
    base: object = None  # the Kernel of that Gaussian u (without a flow), when ``chain`` is set

    def aux(self):
        return (self.status, self.mean1 is not None, self.mean2 is not None, self.exchangeable, self.labels,
                self.why, self.chain)

    def children(self):
        return tuple(m for m in (self.mean1, self.mean2, self.base) if m is not None)

    @classmethod
    def rebuild(cls, aux, children):
        status, has1, has2, exchangeable, labels, why, chain = aux
        it = iter(children)
        m1 = next(it) if has1 else None
        m2 = next(it) if has2 else None
        base = next(it) if chain is not None else None
        return cls(status, m1, m2, exchangeable, labels, why, chain, base)

    def with_labels(self, labels) -> Flow:
        return dataclasses.replace(self, labels=frozenset(labels))


ZERO_FLOW = Flow("zero")


def unknown(why: str, labels=frozenset()) -> Flow:
    return Flow("unknown", labels=frozenset(labels), why=why)


def of(k) -> Flow:
    """The flow a kernel carries (an input `Kernel` given by the user carries none: mean unknown); a list of
    flows for a list of branch kernels."""
    if isinstance(k, list | tuple):
        return [of(x) for x in k]
    flow = getattr(k, "_flow", None)
    return unknown("a Kernel passed to kernel_fn (its means are not stored)") if flow is None else flow


def attach(k, flow: Flow):
    """``k`` with ``flow`` (in place: the kernel was just built by the layer map)."""
    object.__setattr__(k, "_flow", flow)
    return k


def strip(k):
    """A copy of ``k`` without a flow (what the public ``kernel_fn`` returns)."""
    if isinstance(k, list):
        return [strip(x) for x in k]
    if getattr(k, "_flow", None) is None:
        return k
    return k.replace()


def var_of(k, cov):
    """Same-position variances (N, spatial...) of a kernel's ``cov1`` / ``cov2``."""
    return cov if not k.full or k.spatial_ndim == 0 else _spatial_diagonal(cov, 1)


def has_masks(k) -> bool:
    return k.mask1 is not None or k.mask2 is not None


def chain_kernel(flow: Flow, phi, k):
    """The kernel of phi(psi(u)) for ``k`` the kernel of psi(u), psi the flow's chain of activations of the
    Gaussian u (`Flow.base`): E[chi(u) chi(v)] and E[chi'(u) chi'(v)] Theta_u for chi = phi o psi, by
    `chain_polar` (the polar rule, split where u or v = 0, with the chains' node counts)."""
    from smnngp.stax.elementwise import _pair_variances

    base = flow.base
    chi = _composite(flow.chain[1] + (phi,))
    d_chi = jnp.vectorize(jax.grad(chi))
    nngp_pair, cov1_pair, cov2_pair = _pair_variances(base)
    nngp = chain_polar(chi, chi, base.nngp, *nngp_pair)
    ntk = None
    if k.ntk is not None and base.ntk is not None:
        ntk = chain_polar(d_chi, d_chi, base.nngp, *nngp_pair) * base.ntk
    cov1 = chain_polar(chi, chi, base.cov1, *cov1_pair)
    cov2 = None if base.cov2 is None else chain_polar(chi, chi, base.cov2, *cov2_pair)
    return k.replace(nngp=nngp, ntk=ntk, cov1=cov1, cov2=cov2, is_gaussian=False)


def without_chain(k):
    """``k`` with its flow's `Flow.chain` (and the Gaussian kernel it holds) dropped."""
    flow = getattr(k, "_flow", None)
    if flow is None or flow.chain is None or isinstance(k, list):
        return k
    return attach(k.replace(), dataclasses.replace(flow, chain=None, base=None))


def input_flow(x1, x2) -> Flow:
    """The flow of the inputs: their channel-averaged values (data, so the channels are not exchangeable)."""
    m1 = jnp.mean(x1, axis=-1)
    return Flow("known", m1, None if x2 is None else jnp.mean(x2, axis=-1), exchangeable=False)


# ---------------------------------------------------------------------------------------------------------
# Rules: (flow of the input kernel, input kernel, output kernel, layer name) -> flow of the output


def FRESH(flow, k_in, k_out, name):
    return ZERO_FLOW


def PASS(flow, k_in, k_out, name):
    return flow


def UNKNOWN(flow, k_in, k_out, name):
    return unknown(f"{name} (smnngp.stax does not know the mean of its output)", flow.labels)


def ZERO_PRESERVING(flow, k_in, k_out, name):
    if flow.status == "zero":
        return Flow("zero", labels=flow.labels)
    return unknown(f"{name} (applied to activations with a non-zero mean)", flow.labels)


def linear(apply_fn, layout):
    """The rule of a parameter-free layer that applies one linear map to every channel alike (pooling,
    flattening): the output mean is that map of the input mean (``apply_fn`` on the mean as a one-channel
    array), averaged over the output's channels (a flattening turns positions into channels)."""

    def rule(flow, k_in, k_out, name):
        if flow.status != "known":
            return dataclasses.replace(flow, chain=None, base=None)

        def push(m):
            if m is None:
                return None
            x = _from_canonical(m[..., None], layout)
            return jnp.mean(to_canonical(apply_fn((), x), layout), axis=-1)

        return dataclasses.replace(flow, mean1=push(flow.mean1), mean2=push(flow.mean2), chain=None, base=None)

    return rule


def activation(mean_fn, phi):
    """The rule of an elementwise activation on Gaussian input: E[phi(u)], u ~ N(0, variance at the point and
    position); ``mean_fn(v)`` gives it (``None``: unknown, for a layer without a finite network)."""

    token = object()  # the Gaussian this activation reads, when no fan-out named it before

    def rule(flow, k_in, k_out, name):
        if mean_fn is None:
            return UNKNOWN(flow, k_in, k_out, name)

        def var(cov):
            return cov if not k_in.full or k_in.spatial_ndim == 0 else _spatial_diagonal(cov, 1)

        if k_in.is_gaussian:
            m1 = mean_fn(var(k_in.cov1))
            m2 = None if k_in.cov2 is None else mean_fn(var(k_in.cov2))
        else:  # phi after a chain psi of activations of one Gaussian u: E[phi(psi(u))] over u
            composite = _composite(flow.chain[1] + (phi,))
            base = flow.base
            m1 = chain_mean(composite, var_of(base, base.cov1))
            m2 = None if base.cov2 is None else chain_mean(composite, var_of(base, base.cov2))
        if flow.chain is not None:  # a further function of the same Gaussian
            chain, base = (flow.chain[0], flow.chain[1] + (phi,)), flow.base
        elif k_in.is_gaussian:
            chain, base = (token, (phi,)), strip(k_in)
        else:
            chain, base = None, None
        return Flow("known", m1, m2, True, flow.labels, chain=chain, base=base)

    return rule


# ---------------------------------------------------------------------------------------------------------
# Fan-out and fan-in


def fan_out(flow: Flow, k, token, num: int) -> list[Flow]:
    """The flows of ``num`` copies of ``k``: each names its branch; copies of a Gaussian start a chain of
    functions of it (`Flow.chain`), so that fan-ins can pair functions of the same Gaussian."""
    if flow.chain is None and k.is_gaussian:
        flow = dataclasses.replace(flow, chain=(token, ()), base=strip(k))
    return [flow.with_labels(flow.labels | {(token, i, num)}) for i in range(num)]


def merged_labels(flows) -> frozenset:
    """The union of the branches' labels, less those of fan-outs whose every branch meets here."""
    labels = frozenset().union(*(f.labels for f in flows))
    seen: dict = {}
    for token, i, num in labels:
        seen.setdefault((token, num), set()).add(i)
    closed = {token for (token, num), idx in seen.items() if len(idx) == num}
    return frozenset(lab for lab in labels if lab[0] not in closed)


def dependent_pairs(flows, layer: str) -> list[tuple[int, int]]:
    """The pairs of branches that depend on the same activations through different branches of one `FanOut`;
    refused unless both are functions of one Gaussian (`Flow.chain`), whose joint moments `joint_terms` gives."""
    pairs = []
    for (b, fb), (c, fc) in itertools.combinations(enumerate(flows), 2):
        tokens_b = {(t, n): i for t, i, n in fb.labels}
        if not any(tokens_b.get((t, n), j) != j for t, j, n in fc.labels):
            continue
        if fb.chain is None or fc.chain is None or fb.chain[0] is not fc.chain[0]:
            raise NotImplementedError(
                f"{layer}: branches {b} and {c} are both functions of the same activations (the input of a "
                f"FanOut, with no Dense, Conv or attention layer of their own between it and {layer}), so they "
                f"are not independent, and they are not both elementwise functions of one Gaussian layer (whose "
                f"joint moments smnngp.stax integrates); smnngp.stax does not compute this limit. Give one branch "
                f"an affine layer, or write the network in JAX and take its kernel with "
                f"smnngp.traced.infinite_width")
        pairs.append((b, c))
    return pairs


def _composite(fns):
    def f(u):
        for fn in fns:
            u = fn(u)
        return u

    return f


def joint_terms(fb: Flow, fc: Flow, want_ntk: bool):
    """E[psi_b(u) psi_c(v) + psi_c(u) psi_b(v)] for two functions of the same Gaussian (``chain``), as (nngp,
    ntk, cov1, cov2) terms: `chain_polar` (the polar rule split where u or v = 0) over the base
    Gaussian's covariances, and E[psi_b'(u) psi_c'(v) + psi_c'(u) psi_b'(v)] times its NTK."""
    from smnngp.stax.elementwise import _pair_variances

    k = fb.base
    psi_b, psi_c = _composite(fb.chain[1]), _composite(fc.chain[1])
    d_b, d_c = (jnp.vectorize(jax.grad(p)) for p in (psi_b, psi_c))
    nngp_pair, cov1_pair, cov2_pair = _pair_variances(k)

    def sym(f, g, cov, v1, v2):
        return (chain_polar(f, g, cov, v1, v2)
                + chain_polar(g, f, cov, v1, v2))

    nngp = sym(psi_b, psi_c, k.nngp, *nngp_pair)
    ntk = None if not want_ntk or k.ntk is None else sym(d_b, d_c, k.nngp, *nngp_pair) * k.ntk
    cov1 = sym(psi_b, psi_c, k.cov1, *cov1_pair)
    cov2 = None if k.cov2 is None else sym(psi_b, psi_c, k.cov2, *cov2_pair)
    return nngp, ntk, cov1, cov2


def groups(n: int, pairs) -> list[list[int]]:
    """The branches 0..n-1 grouped by the dependence ``pairs`` (connected components), in order."""
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for b, c in pairs:
        parent[find(c)] = find(b)
    out: dict = {}
    for i in range(n):
        out.setdefault(find(i), []).append(i)
    return list(out.values())


def product_terms(group_flows, want_ntk: bool):
    """The moments of the product of several functions of one Gaussian, psi = prod_b psi_b (a `FanInProd` of
    dependent branches): (nngp, ntk, cov1, cov2, mean1, mean2, chain) by quadrature over the Gaussian (`chain`: psi as
    a `Flow.chain`)."""
    from smnngp.stax.elementwise import _pair_variances

    k = group_flows[0].base
    parts = [_composite(f.chain[1]) for f in group_flows]

    def psi(u):
        return functools.reduce(operator.mul, [p(u) for p in parts])

    d_psi = jnp.vectorize(jax.grad(psi))
    nngp_pair, cov1_pair, cov2_pair = _pair_variances(k)
    nngp = chain_polar(psi, psi, k.nngp, *nngp_pair)
    ntk = None if not want_ntk or k.ntk is None else chain_polar(d_psi, d_psi, k.nngp, *nngp_pair) * k.ntk
    cov1 = chain_polar(psi, psi, k.cov1, *cov1_pair)
    cov2 = None if k.cov2 is None else chain_polar(psi, psi, k.cov2, *cov2_pair)

    def var(cov):
        return cov if not k.full or k.spatial_ndim == 0 else _spatial_diagonal(cov, 1)

    mean1 = chain_mean(psi, var(k.cov1))
    mean2 = None if k.cov2 is None else chain_mean(psi, var(k.cov2))
    # the product is itself a function of the same Gaussian: later activations of it are chains
    return nngp, ntk, cov1, cov2, mean1, mean2, (group_flows[0].chain[0], (psi,))


def _sides(f: Flow):
    return f.mean1, (f.mean1 if f.mean2 is None else f.mean2)


def _products(a, b, k, pairs: bool):
    """a(x) b(x') in the kernel layout: over pairs of points (``pairs``: (Na, Nb, ...)) or per point ((N, ...),
    a and b of the same points), at same positions only or at all position pairs (interleaved)."""
    if not k.full or a.ndim == 1:
        return a[:, None] * b[None, :] if pairs else a * b

    def spread(m, first: bool, lead: list):
        shape = list(lead)
        for size in m.shape[1:]:
            shape += [size, 1] if first else [1, size]
        return m.reshape(shape)

    if pairs:
        return spread(a, True, [a.shape[0], 1]) * spread(b, False, [1, b.shape[0]])
    return spread(a, True, [a.shape[0]]) * spread(b, False, [b.shape[0]])


def cross_terms(fb: Flow, fc: Flow, k):
    """m_b(x) m_c(x') as (nngp, cov1, cov2) terms of the kernel layout of ``k``."""
    b1, b2 = _sides(fb)
    c1, c2 = _sides(fc)
    return (_products(b1, c2, k, True), _products(b1, c1, k, False),
            None if k.cov2 is None else _products(b2, c2, k, False))


def mean_products(flows, ks, layer: str, skip=()):
    """sum over pairs b != c of m_b(x) m_c(x') for `FanInSum` (nngp, cov1, cov2 terms), or ``None`` when at most
    one branch has a non-zero mean; raises where a needed mean is unknown or both are data. Pairs in ``skip``
    (dependent branches, whose cross moments `joint_terms` gives) are left out."""
    nonzero = [i for i, f in enumerate(flows) if f.status != "zero"]
    skip = {frozenset(p) for p in skip}
    if len(nonzero) < 2 or all(frozenset(p) in skip for p in itertools.combinations(nonzero, 2)):
        return None
    for i in nonzero:
        if flows[i].status == "unknown":
            other = next(j for j in nonzero if j != i)
            raise NotImplementedError(
                f"{layer}: branch {i} has an unknown mean (it ends with {flows[i].why}) and branch {other} may "
                f"have a non-zero one, so the sum's covariance needs their product of means; end a branch with "
                f"an affine layer (Dense, Conv), whose output has mean zero")
    data = [i for i in nonzero if not flows[i].exchangeable]
    if len(data) > 1:
        raise NotImplementedError(
            f"{layer}: branches {data[0]} and {data[1]} both carry input data (no affine layer since the input), "
            f"whose channels differ; their cross term needs the inputs themselves. Put an affine layer on one")
    if any(ks[i].mask1 is not None or ks[i].mask2 is not None for i in nonzero):
        raise NotImplementedError(f"{layer}: branches with non-zero means and masked inputs are not supported")
    total = None
    for b, c in itertools.permutations(nonzero, 2):
        if frozenset((b, c)) in skip:
            continue
        terms = cross_terms(flows[b], flows[c], ks[0])
        total = terms if total is None else tuple(None if t is None else t + u for t, u in zip(total, terms))
    return total


def _one_source(flows):
    """``(source, base)`` when every flow is a chain of functions of the same Gaussian, else ``None``."""
    if not flows or any(f.chain is None for f in flows):
        return None
    source = flows[0].chain[0]
    return (source, flows[0].base) if all(f.chain[0] is source for f in flows) else None


def _joined(flows, op):
    """The chain of ``op`` over the branches' functions of one Gaussian (a sum or product is one more)."""
    parts = [_composite(f.chain[1]) for f in flows]

    def psi(u):
        return functools.reduce(op, [p(u) for p in parts])

    return flows[0].chain[0], (psi,)


def summed(flows) -> Flow:
    """The flow of a sum of branches (a chain when every branch is a function of one Gaussian)."""
    labels = merged_labels(flows)
    nonzero = [f for f in flows if f.status != "zero"]
    one = _one_source(flows)
    chain, base = (None, None) if one is None else (_joined(flows, operator.add), one[1])
    if not nonzero:
        return Flow("zero", labels=labels, chain=chain, base=base)
    bad = next((f for f in nonzero if f.status == "unknown"), None)
    if bad is not None:
        return unknown(bad.why, labels)
    m1 = functools.reduce(operator.add, [f.mean1 for f in nonzero])
    has2 = any(f.mean2 is not None for f in nonzero)
    m2 = None if not has2 else functools.reduce(operator.add, [_sides(f)[1] for f in nonzero])
    return Flow("known", m1, m2, all(f.exchangeable for f in nonzero), labels, chain=chain, base=base)


def multiplied(flows) -> Flow:
    """The flow of an elementwise product of independent branches: the product of their means (one branch: its
    own flow, as a `FanInProd` leaves a product of functions of one Gaussian)."""
    labels = merged_labels(flows)
    if len(flows) == 1:
        return flows[0].with_labels(labels)
    if any(f.status == "zero" for f in flows):
        return Flow("zero", labels=labels)
    bad = next((f for f in flows if f.status == "unknown"), None)
    if bad is not None:
        return unknown(bad.why, labels)
    m1 = flows[0].mean1
    for f in flows[1:]:
        m1 = m1 * f.mean1
    has2 = any(f.mean2 is not None for f in flows)
    m2 = None
    if has2:
        m2 = functools.reduce(operator.mul, [_sides(f)[1] for f in flows])
    data = sum(not f.exchangeable for f in flows)
    if data > 1:  # the channel average of a product of data channels is not the product of their averages
        return unknown("a product of input-data branches", labels)
    return Flow("known", m1, m2, data == 0, labels)
