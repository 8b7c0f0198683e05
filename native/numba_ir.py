"""LLVM IR for one row of a quantized GGUF matrix times one float32 activation row.

Numba's auto-vectorizer, given plain loops over blocks, vectorizes the *block* loop
with gathers (LLVM fully unrolls the 16/32-long inner loop first), which runs at a
fraction of memory speed. So the row dot product is written directly as portable LLVM
vector IR (no target intrinsics: x86 gets AVX2/FMA/F16C, ARM gets NEON, from the same
IR), exposed to Numba as one `@intrinsic`, `rowdot`:

    rowdot(w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb) -> float32   # row r of w . row j of x

and `rowdot4`/`rowdot8`, the same for 4 or 8 consecutive rows of x in one pass over the weight
row: each block is unpacked once for all of them, and each x row's result is bit for bit its
`rowdot` (so a speculative verify equals decoding). Each step also prefetches the weights
PREFETCH bytes ahead.

`w` is the uint8 [rows, row_bytes] weight array viewed as a one-byte record dtype
whose field name is the GGUF type (`tag_dtype`), so each type is its own Numba type:
the kernel specializes (and compiles) per type only when a model uses it, and the
specialization is cacheable (see _TagCache at the end). xs16/xs32 hold the sums of x over
each run of 16/32 values, so block offsets and minimums (Q4_0's -8, Q4_1's m, K-quants'
mins) cost one multiply per block instead of one per weight.

Method (the float path): each block is unpacked into a vector of small integers, turned
into float32, multiplied with x and folded to 8 lanes; one FMA per (sub-)block scales it
into a vector accumulator. No horizontal reduction per block; one at the end of a row.

The int8 paths (AVX2; INT8_TYPES), as ggml: x is quantized once per call, per 32 values
(Q8_0 form: xq, xqd) for Q4_0..Q8_0, IQ4_NL and MXFP4 or per 256 (Q8_K form: xk, xkd, and int16
sums per 16 in xkb) for the K-quants and IQ4_XS. Weights stay unsigned (vpmaddubsw) where
they can; offsets (Q4_0's -8, Q3_K's -4, Q6_K's -32) and K-quant mins go through x's integer
sums; signed weights (Q8_0, and the IQ4 and MXFP4 table values, looked up with vpshufb) take their
sign off with vpsignb. K-quant sub-block scales are applied as integers (vpmaddwd), leaving
one float FMA per block or super-block (plus one for mins).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from llvmlite import ir
from numba import njit, prange, typeof, types
from numba.core import cgutils
from numba.core.caching import FunctionCache
from numba.extending import intrinsic

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, HALF = ir.FloatType(), ir.HalfType()
V8F = ir.VectorType(F32, 8)

# Block size (values) and bytes per block (the float types: 8 values per step). Its keys are
# the block types this kernel set runs.
BLOCK = {
    Q.F32: 8, Q.F16: 8, Q.BF16: 8, Q.Q4_0: 32, Q.Q4_1: 32, Q.Q5_0: 32, Q.Q5_1: 32, Q.Q8_0: 32, Q.IQ4_NL: 32, Q.MXFP4: 32,
    Q.Q2_K: 256, Q.Q3_K: 256, Q.Q4_K: 256, Q.Q5_K: 256, Q.Q6_K: 256, Q.IQ4_XS: 256,
}
BYTES = {
    Q.F32: 32, Q.F16: 16, Q.BF16: 16, Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q8_0: 34, Q.IQ4_NL: 2 + 16,
    Q.MXFP4: 1 + 16, Q.Q2_K: 16 + 64 + 2 + 2, Q.Q3_K: 32 + 64 + 12 + 2, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210, Q.IQ4_XS: 2 + 2 + 4 + 128,
}
NUMBA_TYPES: frozenset[Q] = frozenset(BLOCK)
FLOAT_TYPES = frozenset({Q.F32, Q.F16, Q.BF16})  # 8 values per step, and a tail of cols % 8
# The 16 values of an IQ4_NL / IQ4_XS nibble (ggml's kvalues_iq4nl).
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# The 16 values of an MXFP4 code (ggml's kvalues_mxfp4: E2M1, doubled; the scale is halved).
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def tag_dtype(qtype: Q, float_path: bool = False) -> np.dtype:
    """A one-byte record dtype naming the block type: `data.view(tag_dtype(t))` is free.

    float_path=True names the portable float path even where the int8 path would run (what
    a CPU without AVX2 runs; the tests cover it with this on any machine)."""
    forced = float_path and qtype in INT8_TYPES  # else the float path is its only one: one tag
    return np.dtype([(qtype.name.lower() + ("_float" if forced else ""), np.uint8)])


_BY_NAME = {t.name.lower(): (t, False) for t in BLOCK} | {t.name.lower() + "_float": (t, True) for t in BLOCK}


def _tag_of(arr_ty) -> tuple[Q, bool] | None:
    """(block type, float path forced) of a tagged weight array's Numba type."""
    dt = getattr(arr_ty, "dtype", None)
    if not isinstance(dt, types.Record) or len(dt.fields) != 1:
        return None
    return _BY_NAME.get(next(iter(dt.fields)))


def _qtype_of(arr_ty) -> Q | None:
    tag = _tag_of(arr_ty)
    return None if tag is None else tag[0]


def _path_of(arr_ty) -> str:
    """How rows of this tagged type are dotted with x: 'float', 'q8_0' (x in int8 per 32)
    or 'q8_k' (x in int8 per 256)."""
    qtype, forced = _tag_of(arr_ty)
    if forced or qtype not in INT8_TYPES:
        return "float"
    return "q8_k" if qtype in Q8K_TYPES else "q8_0"


# --------------------------------------------------------------------------- IR helpers


def _c(ty, v):
    return ir.Constant(ty, v)


def _splat(b, val, n):
    vty = ir.VectorType(val.type, n)
    v = b.insert_element(ir.Constant(vty, ir.Undefined), val, _c(I32, 0))
    return b.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, n), [0] * n))


def _fma(b, a, c, acc):
    """llvm.fma on floats or float vectors (llvmlite's builder.fma takes scalars only)."""
    ty = a.type
    suffix = f"v{ty.count}f32" if isinstance(ty, ir.VectorType) else "f32"
    name = "llvm.fma." + suffix
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ty, [ty, ty, ty]), name)
    return b.call(fn, [a, c, acc])


def _vconst(ty, vals):
    return ir.Constant(ir.VectorType(ty, len(vals)), list(vals))


def _shuf(b, a, c, idx):
    return b.shuffle_vector(a, c, _vconst(I32, idx))


def _load(b, base, off, ty):
    """Unaligned load of `ty` at byte offset `off` (an i64 value or int) from i8* `base`."""
    off = off if isinstance(off, ir.Value) else _c(I64, off)
    p = b.gep(base, [off], inbounds=True)
    return b.load(b.bitcast(p, ty.as_pointer()), align=1)


def _f16_to_f32(b, f16_native, h):
    """float16 bits (an i16, or a vector of them) as float32. Without hardware conversion, a
    portable bit trick: exponent rebias by a multiply (handles zero and subnormals), inf/nan
    patched with a select, sign or-ed back."""
    n = h.type.count if isinstance(h.type, ir.VectorType) else 0

    def ty(t):
        return ir.VectorType(t, n) if n else t

    def k(t, v):
        return _vconst(t, [v] * n) if n else _c(t, v)

    if f16_native:
        return b.fpext(b.bitcast(h, ty(HALF)), ty(F32))
    h32 = b.zext(h, ty(I32))
    em = b.shl(b.and_(h32, k(I32, 0x7FFF)), k(I32, 13))
    f = b.bitcast(b.fmul(b.bitcast(em, ty(F32)), k(F32, 2.0**112)), ty(I32))
    isinf = b.icmp_unsigned("==", b.and_(h32, k(I32, 0x7C00)), k(I32, 0x7C00))
    f = b.select(isinf, b.or_(em, k(I32, 0x7F800000)), f)
    sign = b.shl(b.and_(h32, k(I32, 0x8000)), k(I32, 16))
    return b.bitcast(b.or_(f, sign), ty(F32))


def _bf16_to_f32(b, h):
    """bfloat16 bits (an i16, or a vector of them) as float32: the top half of its bits."""
    if isinstance(h.type, ir.VectorType):
        n = h.type.count
        return b.bitcast(b.shl(b.zext(h, ir.VectorType(I32, n)), _vconst(I32, [16] * n)), ir.VectorType(F32, n))
    return b.bitcast(b.shl(b.zext(h, I32), _c(I32, 16)), F32)


def _halves8(b, f16_native, ptr, off):
    """8 float32 from the 8 float16 at byte offset `off`."""
    return _f16_to_f32(b, f16_native, _load(b, ptr, off, ir.VectorType(I16, 8)))


class _Ctx:
    def __init__(self, b, f16_native, int8=False, xq=None, xqd=None, xk=None, xkd=None, xkb=None):
        self.b = b
        self.f16_native = f16_native
        self.int8 = int8  # the int8 path: x quantized per 32 (xq, xqd rows) or per 256 (xk, xkd, xkb)
        self.xq = xq
        self.xqd = xqd
        self.xk = xk
        self.xkd = xkd
        self.xkb = xkb

    def half(self, base, off):
        """float32 from the fp16 at byte offset `off`."""
        return _f16_to_f32(self.b, self.f16_native, _load(self.b, base, off, I16))

    def fma(self, a, c, acc):
        return _fma(self.b, a, c, acc)

    def fold8(self, v, n):
        """Sum an n-lane float vector (n = 8, 16, 32) down to 8 lanes."""
        b = self.b
        while n > 8:
            h = n // 2
            v = b.fadd(_shuf(b, v, v, range(h)), _shuf(b, v, v, range(h, n)))
            n = h
        return v

    def dot8(self, qf, xv, n):
        """qf * xv (n lanes) folded to 8 lanes, with FMAs."""
        b = self.b
        parts = [(_shuf(b, qf, qf, range(k, k + 8)), _shuf(b, xv, xv, range(k, k + 8))) for k in range(0, n, 8)]
        acc = b.fmul(parts[0][0], parts[0][1])
        for q, x in parts[1:]:
            acc = _fma(b, q, x, acc)
        return acc

    def hsum8(self, v):
        b = self.b
        v4 = b.fadd(_shuf(b, v, v, range(4)), _shuf(b, v, v, range(4, 8)))
        v2 = b.fadd(_shuf(b, v4, v4, [0, 1]), _shuf(b, v4, v4, [2, 3]))
        return b.fadd(b.extract_element(v2, _c(I32, 0)), b.extract_element(v2, _c(I32, 1)))


def _loop(b, count, inits, body, name):
    """for i in range(count): vals = body(i, vals); returns the final vals (count may be 0)."""
    pre = b.block
    fn = pre.function
    head = fn.append_basic_block(name + ".body")
    done = fn.append_basic_block(name + ".done")
    b.cbranch(b.icmp_signed(">", count, _c(I64, 0)), head, done)
    b.position_at_end(head)
    i = b.phi(I64)
    phis = [b.phi(v.type) for v in inits]
    i.add_incoming(_c(I64, 0), pre)
    for p, v in zip(phis, inits):
        p.add_incoming(v, pre)
    new = body(i, phis)
    nxt = b.add(i, _c(I64, 1))
    end = b.block
    i.add_incoming(nxt, end)
    for p, v in zip(phis, new):
        p.add_incoming(v, end)
    b.cbranch(b.icmp_signed("<", nxt, count), head, done)
    b.position_at_end(done)
    outs = []
    for v0, v in zip(inits, new):
        o = b.phi(v.type)
        o.add_incoming(v0, pre)
        o.add_incoming(v, end)
        outs.append(o)
    return outs


# --------------------------------------------------------------------------- per type
# Each body(cx, wrow, xrow, xs16, xs32, i, accs) handles block i and returns new accs.
# accs = [acc0 (V8F), acc1 (V8F), macc (V8F), ms (F32)]: the row's value is
# hsum(acc0 + acc1 + macc) + ms, macc and ms holding the min/offset terms.


def _nibbles(b, qs16):
    """<16 x i8> packed nibbles -> <32 x i8>: low nibbles then high nibbles."""
    lo = b.and_(qs16, _vconst(I8, [15] * 16))
    hi = b.lshr(qs16, _vconst(I8, [4] * 16))
    return _shuf(b, lo, hi, range(32))


def _bits5(b, qh32):
    """u32 qh -> <32 x i8> holding 16 where bit j of qh is set."""
    v4 = b.bitcast(qh32, ir.VectorType(I8, 4))
    v = _shuf(b, v4, v4, [k // 8 for k in range(32)])
    m = b.and_(v, _vconst(I8, [1 << (k % 8) for k in range(32)]))
    return b.select(b.icmp_unsigned("!=", m, _vconst(I8, [0] * 32)), _vconst(I8, [16] * 32), _vconst(I8, [0] * 32))


def _llvm_call(b, name, ret, args):
    """Call an LLVM intrinsic (llvm.x86.*, llvm.prefetch, ...), declared on first use."""
    fn = b.module.globals.get(name)
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return b.call(fn, args)


V32I8, V16I16, V8I32 = ir.VectorType(I8, 32), ir.VectorType(I16, 16), ir.VectorType(I32, 8)


def _dot_u8i8(b, u, s):
    """<32 x u8> . <32 x i8> -> <8 x i32> partial sums (AVX2 vpmaddubsw + vpmaddwd).

    No saturation: u <= 63 and |s| <= 127 here, or u <= 128 with |s| <= 127 for Q8_0.
    """
    p16 = _llvm_call(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [u, s])
    return _llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [p16, _vconst(I16, [1] * 16)])


def _legacy(qtype):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: 32 values per block, one scale (and one min)."""
    size = BYTES[qtype]

    def body(cx, w, x, xs16, xs32, i, accs):
        b = cx.b
        base = b.mul(i, _c(I64, size))
        d = cx.half(w, base)
        if cx.int8:
            # x was quantized per 32 values: xq (int8), xqd = (dx, dx * sum(xq), sum(xq) and
            # 2 * sum(xq) as int32) per block.
            y = _load(b, cx.xq, b.mul(i, _c(I64, 32)), V32I8)
            dx = _load(b, cx.xqd, b.mul(i, _c(I64, 16)), F32)
            if qtype == Q.Q8_0:
                q = _load(b, w, b.add(base, _c(I64, 2)), V32I8)
                p = _dot_i8i8(b, q, y)
                mn = None
            else:
                if qtype in (Q.Q4_0, Q.Q5_0):
                    mn = None  # the -8 / -16 offset, in integers below
                    off = 2
                else:
                    mn = cx.half(w, b.add(base, _c(I64, 2)))
                    off = 4
                if qtype in (Q.Q5_0, Q.Q5_1):
                    qh = _load(b, w, b.add(base, _c(I64, off)), I32)
                    off += 4
                q = _nibbles(b, _load(b, w, b.add(base, _c(I64, off)), ir.VectorType(I8, 16)))
                if qtype in (Q.Q5_0, Q.Q5_1):
                    q = b.or_(q, _bits5(b, qh))
                p = _dot_u8i8(b, q, y)
                if mn is None:  # sum((q - 8) y) = sum(q y) - 8 sum(y): sum(y) off each of 8 lanes
                    sy = _load(b, cx.xqd, b.add(b.mul(i, _c(I64, 16)), _c(I64, 8 if qtype == Q.Q4_0 else 12)), I32)
                    p = b.sub(p, _splat(b, sy, 8))
            acc0 = cx.fma(_splat(b, b.fmul(d, dx), 8), b.sitofp(p, V8F), accs[0])
            ms = accs[3]
            if mn is not None:
                ms = b.fma(mn, _load(b, cx.xqd, b.add(b.mul(i, _c(I64, 16)), _c(I64, 4)), F32), ms)
            return [acc0, accs[1], accs[2], ms]
        if qtype == Q.Q8_0:
            q = _load(b, w, b.add(base, _c(I64, 2)), ir.VectorType(I8, 32))
            qf = b.sitofp(q, ir.VectorType(F32, 32))
        else:
            if qtype in (Q.Q4_0, Q.Q5_0):
                mn = b.fmul(d, _c(F32, -8.0 if qtype == Q.Q4_0 else -16.0))
                off = 2
            else:
                mn = cx.half(w, b.add(base, _c(I64, 2)))
                off = 4
            if qtype in (Q.Q5_0, Q.Q5_1):
                qh = _load(b, w, b.add(base, _c(I64, off)), I32)
                off += 4
            q = _nibbles(b, _load(b, w, b.add(base, _c(I64, off)), ir.VectorType(I8, 16)))
            if qtype in (Q.Q5_0, Q.Q5_1):
                q = b.or_(q, _bits5(b, qh))
            qf = b.uitofp(q, ir.VectorType(F32, 32))
        xv = _load(b, x, b.mul(i, _c(I64, 128)), ir.VectorType(F32, 32))
        acc0 = cx.fma(_splat(b, d, 8), cx.dot8(qf, xv, 32), accs[0])
        ms = accs[3]
        if qtype != Q.Q8_0:  # the min term: mn * sum(x over this block)
            ms = b.fma(mn, _load(b, xs32, b.mul(i, _c(I64, 4)), F32), ms)
        return [acc0, accs[1], accs[2], ms]

    return body


def _float(qtype):
    """F32 / F16 / BF16: 8 values per step (the row tail is done by _tail)."""

    def body(cx, w, x, xs16, xs32, i, accs):
        b = cx.b
        if qtype == Q.F32:
            wv = _load(b, w, b.mul(i, _c(I64, 32)), V8F)
        elif qtype == Q.F16:
            wv = _halves8(b, cx.f16_native, w, b.mul(i, _c(I64, 16)))
        else:
            wv = _bf16_to_f32(b, _load(b, w, b.mul(i, _c(I64, 16)), ir.VectorType(I16, 8)))
        xv = _load(b, x, b.mul(i, _c(I64, 32)), V8F)
        return [cx.fma(wv, xv, accs[0]), accs[1], accs[2], accs[3]]

    return body


def _kscales(b, s12):
    """Q4_K/Q5_K packed 6-bit scales (<12 x i8>) -> (sc, m) as <8 x i8>."""
    va = _shuf(b, s12, s12, [0, 1, 2, 3, 8, 9, 10, 11])
    vb = _shuf(b, s12, s12, [4, 5, 6, 7, 0, 1, 2, 3])
    vc = _shuf(b, s12, s12, [0, 1, 2, 3, 4, 5, 6, 7])

    def k(v):
        return _vconst(I8, [v] * 8)

    low = _vconst(I1, [1, 1, 1, 1, 0, 0, 0, 0])
    sc_lo = b.and_(va, k(63))
    sc_hi = b.or_(b.and_(va, k(15)), b.shl(b.lshr(vb, k(6)), k(4)))
    m_lo = b.and_(vb, k(63))
    m_hi = b.or_(b.lshr(va, k(4)), b.shl(b.lshr(vc, k(6)), k(4)))
    return b.select(low, sc_lo, sc_hi), b.select(low, m_lo, m_hi)


def _k45(qtype):
    size = BYTES[qtype]
    qs_off = 16 if qtype == Q.Q4_K else 48

    def body(cx, w, x, xs16, xs32, i, accs):
        b = cx.b
        base = b.mul(i, _c(I64, size))
        d = cx.half(w, base)
        dmin = cx.half(w, b.add(base, _c(I64, 2)))
        sc, m = _kscales(b, _load(b, w, b.add(base, _c(I64, 4)), ir.VectorType(I8, 12)))
        scf = b.fmul(b.uitofp(sc, V8F), _splat(b, d, 8))
        mf = b.fmul(b.uitofp(m, V8F), _splat(b, dmin, 8))
        sums = _load(b, xs32, b.mul(i, _c(I64, 32)), V8F)  # 8 sub-block sums of x
        macc = cx.fma(b.fneg(mf), sums, accs[2])
        if qtype == Q.Q5_K:
            qh = _load(b, w, b.add(base, _c(I64, 16)), ir.VectorType(I8, 32))
        acc = [accs[0], accs[1]]
        for c in range(4):
            qs = _load(b, w, b.add(base, _c(I64, qs_off + 32 * c)), ir.VectorType(I8, 32))
            for h in range(2):
                j = 2 * c + h
                q = b.and_(qs, _vconst(I8, [15] * 32)) if h == 0 else b.lshr(qs, _vconst(I8, [4] * 32))
                if qtype == Q.Q5_K:
                    bit = b.and_(qh, _vconst(I8, [1 << j] * 32))
                    hb = b.select(b.icmp_unsigned("!=", bit, _vconst(I8, [0] * 32)), _vconst(I8, [16] * 32), _vconst(I8, [0] * 32))
                    q = b.or_(q, hb)
                qf = b.uitofp(q, ir.VectorType(F32, 32))
                xv = _load(b, x, b.add(b.mul(i, _c(I64, 1024)), _c(I64, 128 * j)), ir.VectorType(F32, 32))
                s = _splat(b, b.extract_element(scf, _c(I32, j)), 8)
                acc[h] = cx.fma(s, cx.dot8(qf, xv, 32), acc[h])
        return [acc[0], acc[1], macc, accs[3]]

    return body


def _q6k(cx, w, x, xs16, xs32, i, accs):
    b = cx.b
    base = b.mul(i, _c(I64, 210))
    d = cx.half(w, b.add(base, _c(I64, 208)))
    sc = _load(b, w, b.add(base, _c(I64, 192)), ir.VectorType(I8, 16))
    scf = b.fmul(b.sitofp(sc, ir.VectorType(F32, 16)), _splat(b, d, 16))
    sums = _load(b, xs16, b.mul(i, _c(I64, 64)), ir.VectorType(F32, 16))
    # -32 * d * sc * sum(x) for each of the 16 sub-blocks, folded to 8 lanes.
    ms = b.fmul(scf, sums)
    macc = cx.fma(_splat(b, _c(F32, -32.0), 8), cx.fold8(ms, 16), accs[2])
    acc = [accs[0], accs[1]]
    for h in range(2):
        qh = _load(b, w, b.add(base, _c(I64, 128 + 32 * h)), ir.VectorType(I8, 32))
        for k in range(4):
            ql = _load(b, w, b.add(base, _c(I64, 64 * h + 32 * (k & 1))), ir.VectorType(I8, 32))
            lo = b.and_(ql, _vconst(I8, [15] * 32)) if k < 2 else b.lshr(ql, _vconst(I8, [4] * 32))
            hi = b.and_(b.lshr(qh, _vconst(I8, [2 * k] * 32)), _vconst(I8, [3] * 32)) if k else b.and_(qh, _vconst(I8, [3] * 32))
            q = b.or_(lo, b.shl(hi, _vconst(I8, [4] * 32)))
            qf = b.uitofp(q, ir.VectorType(F32, 32))
            xv = _load(b, x, b.add(b.mul(i, _c(I64, 1024)), _c(I64, 512 * h + 128 * k)), ir.VectorType(F32, 32))
            sub = 8 * h + 2 * k
            s0 = _splat(b, b.extract_element(scf, _c(I32, sub)), 8)
            s1 = _splat(b, b.extract_element(scf, _c(I32, sub + 1)), 8)
            p0 = cx.dot8(_shuf(b, qf, qf, range(16)), _shuf(b, xv, xv, range(16)), 16)
            p1 = cx.dot8(_shuf(b, qf, qf, range(16, 32)), _shuf(b, xv, xv, range(16, 32)), 16)
            acc[0] = cx.fma(s0, p0, acc[0])
            acc[1] = cx.fma(s1, p1, acc[1])
    return [acc[0], acc[1], macc, accs[3]]


def _dup16(b, v):
    """<8 x i16> -> <32 x i8>: the vector in both 128-bit lanes (for _splat16)."""
    return b.bitcast(_shuf(b, v, v, list(range(8)) * 2), V32I8)


def _splat16(b, v2, lanes):
    """From _dup16's vector: <16 x i16>, lane lanes[0] of it in the low 8, lanes[1] in the high
    8 (lanes[1] - 8 when >= 8). One in-lane byte shuffle (vpshufb), as ggml does."""
    idx = [2 * (lanes[0] % 8) + t for t in range(2)] * 8 + [2 * (lanes[1] % 8) + t for t in range(2)] * 8
    return b.bitcast(_llvm_call(b, "llvm.x86.avx2.pshuf.b", V32I8, [v2, _vconst(I8, idx)]), V16I16)


def _k45_int8(qtype):
    """Q4_K/Q5_K against x in Q8_K form: integer dots per 32-value sub-block, the 6-bit
    scales applied as integers (pmaddwd), one float FMA per super-block for the scales
    and one for the mins (through x's 16-value sums)."""
    size = BYTES[qtype]
    qs_off = 16 if qtype == Q.Q4_K else 48

    def body(cx, w, x, xs16, xs32, i, accs):
        b = cx.b
        base = b.mul(i, _c(I64, size))
        dx = _load(b, cx.xkd, b.mul(i, _c(I64, 4)), F32)
        d = b.fmul(cx.half(w, base), dx)
        dmin = b.fmul(cx.half(w, b.add(base, _c(I64, 2))), dx)
        sc, m = _kscales(b, _load(b, w, b.add(base, _c(I64, 4)), ir.VectorType(I8, 12)))
        sc16 = _dup16(b, b.zext(sc, ir.VectorType(I16, 8)))
        m16 = b.zext(m, ir.VectorType(I16, 8))
        bs = _load(b, cx.xkb, b.mul(i, _c(I64, 32)), V16I16)  # 16 sums of 16 q8 values
        mprod = _llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [_shuf(b, m16, m16, [k // 2 for k in range(16)]), bs])
        macc = cx.fma(_splat(b, b.fneg(dmin), 8), b.sitofp(mprod, V8F), accs[2])
        if qtype == Q.Q5_K:
            qh = _load(b, w, b.add(base, _c(I64, 16)), V32I8)
        xk = b.mul(i, _c(I64, 256))
        parts = []
        for c in range(4):
            qs = _load(b, w, b.add(base, _c(I64, qs_off + 32 * c)), V32I8)
            for h in range(2):
                j = 2 * c + h
                q = b.and_(qs, _vconst(I8, [15] * 32)) if h == 0 else b.lshr(qs, _vconst(I8, [4] * 32))
                if qtype == Q.Q5_K:  # bit j of qh -> 16
                    hb = b.shl(qh, _vconst(I8, [4 - j] * 32)) if j <= 4 else b.lshr(qh, _vconst(I8, [j - 4] * 32))
                    q = b.or_(q, b.and_(hb, _vconst(I8, [16] * 32)))
                y = _load(b, cx.xk, b.add(xk, _c(I64, 32 * j)), V32I8)
                p16 = _llvm_call(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [q, y])
                parts.append(_llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [p16, _splat16(b, sc16, [j, j])]))
        while len(parts) > 1:  # a tree, not a chain
            parts = [b.add(parts[k], parts[k + 1]) for k in range(0, len(parts), 2)]
        acc0 = cx.fma(_splat(b, d, 8), b.sitofp(parts[0], V8F), accs[0])
        return [acc0, accs[1], macc, accs[3]]

    return body


def _q6k_int8(cx, w, x, xs16, xs32, i, accs):
    """Q6_K against x in Q8_K form: unsigned 6-bit q dotted with q8 per 16 values, times
    the int8 scale (pmaddwd); the -32 offset as -32 * sum(scale * 16-value sum of q8)."""
    b = cx.b
    base = b.mul(i, _c(I64, 210))
    dx = _load(b, cx.xkd, b.mul(i, _c(I64, 4)), F32)
    d = b.fmul(cx.half(w, b.add(base, _c(I64, 208))), dx)
    sc16 = b.sext(_load(b, w, b.add(base, _c(I64, 192)), ir.VectorType(I8, 16)), V16I16)
    bs = _load(b, cx.xkb, b.mul(i, _c(I64, 32)), V16I16)
    mprod = _llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [sc16, bs])
    # Scales 0-7 in both lanes, and 8-15 in both lanes, for _splat16.
    sc_lo = b.bitcast(_shuf(b, sc16, sc16, list(range(8)) * 2), V32I8)
    sc_hi = b.bitcast(_shuf(b, sc16, sc16, list(range(8, 16)) * 2), V32I8)
    xk = b.mul(i, _c(I64, 256))
    parts = []
    for h in range(2):
        qh = _load(b, w, b.add(base, _c(I64, 128 + 32 * h)), V32I8)
        for k in range(4):
            ql = _load(b, w, b.add(base, _c(I64, 64 * h + 32 * (k & 1))), V32I8)
            lo = b.and_(ql, _vconst(I8, [15] * 32)) if k < 2 else b.lshr(ql, _vconst(I8, [4] * 32))
            # bits 2k, 2k+1 of qh -> bits 4, 5
            hs = b.shl(qh, _vconst(I8, [4 - 2 * k] * 32)) if k < 2 else (qh if k == 2 else b.lshr(qh, _vconst(I8, [2] * 32)))
            q = b.or_(lo, b.and_(hs, _vconst(I8, [0x30] * 32)))
            y = _load(b, cx.xk, b.add(xk, _c(I64, 128 * h + 32 * k)), V32I8)
            p16 = _llvm_call(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [q, y])
            sub = 8 * h + 2 * k
            parts.append(_llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [p16, _splat16(b, sc_hi if h else sc_lo, [sub, sub + 1])]))
    while len(parts) > 1:
        parts = [b.add(parts[k], parts[k + 1]) for k in range(0, len(parts), 2)]
    sumi = b.sub(parts[0], b.shl(mprod, _vconst(I32, [5] * 8)))
    acc0 = cx.fma(_splat(b, d, 8), b.sitofp(sumi, V8F), accs[0])
    return [acc0, accs[1], accs[2], accs[3]]


# --------------------------------------------------------------------------- the low-bit types
# Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4. Values as ggml's dequantize_row_* gives them; the float
# paths are portable IR, the int8 paths (AVX2) dot x in Q8_0 form (IQ4_NL, MXFP4) or Q8_K form
# (the rest).


def _madd_i8i8(b, q, y):
    """<32 x i8> . <32 x i8> -> <16 x i16> pair sums, both signed: |q| times y with q's sign
    (vpsignb, vpmaddubsw), as ggml's mul_sum_i8_pairs. No saturation: |q|, |y| <= 127."""
    psign = "llvm.x86.avx2.psign.b"
    return _llvm_call(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [_llvm_call(b, psign, V32I8, [q, q]), _llvm_call(b, psign, V32I8, [y, q])])


def _dot_i8i8(b, q, y):
    """<32 x i8> . <32 x i8> -> <8 x i32> partial sums, both signed (see _madd_i8i8)."""
    return _llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [_madd_i8i8(b, q, y), _vconst(I16, [1] * 16)])


def _iq4_values(b, idx, table=KVALUES_IQ4NL):
    """<n x i8> nibbles -> table's values of them (kvalues_iq4nl unless told), portably: LLVM IR
    has no variable byte shuffle, so a tree of selects on the index bits (the float path, off AVX2)."""
    n = idx.type.count
    vals = [_vconst(I8, [v] * n) for v in table]
    bit = 1
    while len(vals) > 1:
        on = b.icmp_unsigned("!=", b.and_(idx, _vconst(I8, [bit] * n)), _vconst(I8, [0] * n))
        vals = [b.select(on, vals[k + 1], vals[k]) for k in range(0, len(vals), 2)]
        bit <<= 1
    return vals[0]


def _iq4_values32(b, idx, table=KVALUES_IQ4NL):
    """<32 x i8> nibbles -> table's values of them: one vpshufb (the table in both lanes)."""
    return _llvm_call(b, "llvm.x86.avx2.pshuf.b", V32I8, [_vconst(I8, list(table) * 2), idx])


def _iq4nl(cx, w, x, xs16, xs32, i, accs):
    """IQ4_NL: Q4_0's layout, each nibble a kvalues_iq4nl index; no offset, no min."""
    b = cx.b
    base = b.mul(i, _c(I64, BYTES[Q.IQ4_NL]))
    d = cx.half(w, base)
    idx = _nibbles(b, _load(b, w, b.add(base, _c(I64, 2)), ir.VectorType(I8, 16)))
    if cx.int8:
        y = _load(b, cx.xq, b.mul(i, _c(I64, 32)), V32I8)
        dx = _load(b, cx.xqd, b.mul(i, _c(I64, 16)), F32)
        p = _dot_i8i8(b, _iq4_values32(b, idx), y)
        return [cx.fma(_splat(b, b.fmul(d, dx), 8), b.sitofp(p, V8F), accs[0]), accs[1], accs[2], accs[3]]
    qf = b.sitofp(_iq4_values(b, idx), ir.VectorType(F32, 32))
    xv = _load(b, x, b.mul(i, _c(I64, 128)), ir.VectorType(F32, 32))
    return [cx.fma(_splat(b, d, 8), cx.dot8(qf, xv, 32), accs[0]), accs[1], accs[2], accs[3]]


def _e8m0_half(b, e):
    """An MXFP4 block's E8M0 exponent byte (i8) as ggml's GGML_E8M0_TO_FP32_HALF, 2^(e - 128):
    the float32 bits (e - 1) << 23, or for e < 2 the subnormals 0x00200000 << e."""
    e = b.zext(e, I32)
    normal = b.shl(b.sub(e, _c(I32, 1)), _c(I32, 23))
    subnormal = b.shl(_c(I32, 0x00200000), b.and_(e, _c(I32, 1)))
    return b.bitcast(b.select(b.icmp_unsigned("<", e, _c(I32, 2)), subnormal, normal), F32)


def _mxfp4(cx, w, x, xs16, xs32, i, accs):
    """MXFP4: IQ4_NL's shape (nibbles after the scale) with kvalues_mxfp4 and an E8M0 scale."""
    b = cx.b
    base = b.mul(i, _c(I64, BYTES[Q.MXFP4]))
    d = _e8m0_half(b, _load(b, w, base, I8))
    idx = _nibbles(b, _load(b, w, b.add(base, _c(I64, 1)), ir.VectorType(I8, 16)))
    if cx.int8:  # ggml_vec_dot_mxfp4_q8_0: an integer dot per block, scaled by d * dx
        y = _load(b, cx.xq, b.mul(i, _c(I64, 32)), V32I8)
        dx = _load(b, cx.xqd, b.mul(i, _c(I64, 16)), F32)
        p = _dot_i8i8(b, _iq4_values32(b, idx, KVALUES_MXFP4), y)
        return [cx.fma(_splat(b, b.fmul(d, dx), 8), b.sitofp(p, V8F), accs[0]), accs[1], accs[2], accs[3]]
    qf = b.sitofp(_iq4_values(b, idx, KVALUES_MXFP4), ir.VectorType(F32, 32))
    xv = _load(b, x, b.mul(i, _c(I64, 128)), ir.VectorType(F32, 32))
    return [cx.fma(_splat(b, d, 8), cx.dot8(qf, xv, 32), accs[0]), accs[1], accs[2], accs[3]]


def _iq4xs_scales(b, w, base):
    """IQ4_XS's 8 sub-block scales, 6 bits less 32 (<8 x i16>): low 4 bits from scales_l's
    nibbles, high 2 from scales_h's bit pairs."""
    sl = _load(b, w, b.add(base, _c(I64, 4)), ir.VectorType(I8, 4))
    lo = b.and_(b.lshr(_shuf(b, sl, sl, [k // 2 for k in range(8)]), _vconst(I8, [0, 4] * 4)), _vconst(I8, [15] * 8))
    sh = _splat(b, _load(b, w, b.add(base, _c(I64, 2)), I16), 8)
    hi = b.and_(b.lshr(sh, _vconst(I16, [2 * k for k in range(8)])), _vconst(I16, [3] * 8))
    ls = b.or_(b.zext(lo, ir.VectorType(I16, 8)), b.shl(hi, _vconst(I16, [4] * 8)))
    return b.sub(ls, _vconst(I16, [32] * 8))


def _iq4xs_nibbles(b, w, base, j):
    """Sub-block j's 32 kvalues indices (16 bytes: low nibbles first)."""
    return _nibbles(b, _load(b, w, b.add(base, _c(I64, 8 + 16 * j)), ir.VectorType(I8, 16)))


def _iq4xs(cx, w, x, xs16, xs32, i, accs):
    """IQ4_XS, the float path: 8 sub-blocks of 32 table values, each with its 6-bit scale."""
    b = cx.b
    base = b.mul(i, _c(I64, BYTES[Q.IQ4_XS]))
    scf = b.fmul(b.sitofp(_iq4xs_scales(b, w, base), V8F), _splat(b, cx.half(w, base), 8))
    acc = [accs[0], accs[1]]
    for j in range(8):
        qf = b.sitofp(_iq4_values(b, _iq4xs_nibbles(b, w, base, j)), ir.VectorType(F32, 32))
        xv = _load(b, x, b.add(b.mul(i, _c(I64, 1024)), _c(I64, 128 * j)), ir.VectorType(F32, 32))
        s = _splat(b, b.extract_element(scf, _c(I32, j)), 8)
        acc[j % 2] = cx.fma(s, cx.dot8(qf, xv, 32), acc[j % 2])
    return [acc[0], acc[1], accs[2], accs[3]]


def _tree_sum(b, parts):
    """Sum integer vectors as a tree, not a chain."""
    while len(parts) > 1:
        parts = [b.add(parts[k], parts[k + 1]) for k in range(0, len(parts), 2)]
    return parts[0]


def _iq4xs_int8(cx, w, x, xs16, xs32, i, accs):
    """IQ4_XS against x in Q8_K form: signed byte dots per 32 values, the scale applied as
    an integer (pmaddwd), one float FMA per super-block."""
    b = cx.b
    base = b.mul(i, _c(I64, BYTES[Q.IQ4_XS]))
    dx = _load(b, cx.xkd, b.mul(i, _c(I64, 4)), F32)
    d = b.fmul(cx.half(w, base), dx)
    sc16 = _dup16(b, _iq4xs_scales(b, w, base))
    xk = b.mul(i, _c(I64, 256))
    parts = []
    for j in range(8):
        q = _iq4_values32(b, _iq4xs_nibbles(b, w, base, j))
        y = _load(b, cx.xk, b.add(xk, _c(I64, 32 * j)), V32I8)
        parts.append(_llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [_madd_i8i8(b, q, y), _splat16(b, sc16, [j, j])]))
    acc0 = cx.fma(_splat(b, d, 8), b.sitofp(_tree_sum(b, parts), V8F), accs[0])
    return [acc0, accs[1], accs[2], accs[3]]


def _q3k_scales(b, w, base):
    """Q3_K's 16 scales, 6 bits less 32 (<16 x i8>): low 4 bits from the nibbles of bytes
    0-7 (low nibbles for scales 0-7, high for 8-15), high 2 from bit pair k // 4 of byte 8 + k % 4."""
    s = _load(b, w, b.add(base, _c(I64, 96)), ir.VectorType(I8, 12))
    a = _shuf(b, s, s, list(range(8)) * 2)
    low = b.select(_vconst(I1, [1] * 8 + [0] * 8), b.and_(a, _vconst(I8, [15] * 16)), b.lshr(a, _vconst(I8, [4] * 16)))
    h = _shuf(b, s, s, [8, 9, 10, 11] * 4)
    hi = b.and_(b.lshr(h, _vconst(I8, [2 * (k // 4) for k in range(16)])), _vconst(I8, [3] * 16))
    return b.sub(b.or_(low, b.shl(hi, _vconst(I8, [4] * 16))), _vconst(I8, [32] * 16))


def _q3k_quants(b, qs, hm, h, j):
    """Values 128h + 32j .. +32 of a Q3_K super-block as unsigned 0..7 (the value is this
    less 4): bits 2j of qs (bytes 32h..), plus 4 where bit 4h + j of hmask is set."""
    k = 4 * h + j
    lo = b.and_(b.lshr(qs, _vconst(I8, [2 * j] * 32)) if j else qs, _vconst(I8, [3] * 32))
    hb = hm if k == 2 else (b.shl(hm, _vconst(I8, [2 - k] * 32)) if k < 2 else b.lshr(hm, _vconst(I8, [k - 2] * 32)))
    return b.or_(lo, b.and_(hb, _vconst(I8, [4] * 32)))


def _q2k_quants(b, qs, j):
    """Values 128h + 32j .. +32 of a Q2_K super-block (0..3): bits 2j of qs bytes 32h.."""
    return b.and_(b.lshr(qs, _vconst(I8, [2 * j] * 32)) if j else qs, _vconst(I8, [3] * 32))


def _k23(qtype):
    """Q2_K / Q3_K, the float path: 16 sub-blocks of 16, each with its own scale (Q2_K's
    4-bit scale and min, Q3_K's signed 6-bit scale); Q2_K's mins through x's 16-value sums."""
    size = BYTES[qtype]
    qs_off = 16 if qtype == Q.Q2_K else 32
    V16F = ir.VectorType(F32, 16)

    def body(cx, w, x, xs16, xs32, i, accs):
        b = cx.b
        base = b.mul(i, _c(I64, size))
        macc = accs[2]
        if qtype == Q.Q2_K:
            d = cx.half(w, b.add(base, _c(I64, 80)))
            dmin = cx.half(w, b.add(base, _c(I64, 82)))
            s = _load(b, w, base, ir.VectorType(I8, 16))
            scf = b.fmul(b.uitofp(b.and_(s, _vconst(I8, [15] * 16)), V16F), _splat(b, d, 16))
            mf = b.fmul(b.uitofp(b.lshr(s, _vconst(I8, [4] * 16)), V16F), _splat(b, dmin, 16))
            sums = _load(b, xs16, b.mul(i, _c(I64, 64)), V16F)
            macc = b.fsub(macc, cx.fold8(b.fmul(mf, sums), 16))
        else:
            d = cx.half(w, b.add(base, _c(I64, 108)))
            scf = b.fmul(b.sitofp(_q3k_scales(b, w, base), V16F), _splat(b, d, 16))
            hm = _load(b, w, base, V32I8)
        acc = [accs[0], accs[1]]
        for h in range(2):
            qs = _load(b, w, b.add(base, _c(I64, qs_off + 32 * h)), V32I8)
            for j in range(4):
                if qtype == Q.Q2_K:
                    qf = b.uitofp(_q2k_quants(b, qs, j), ir.VectorType(F32, 32))
                else:
                    qf = b.sitofp(b.sub(_q3k_quants(b, qs, hm, h, j), _vconst(I8, [4] * 32)), ir.VectorType(F32, 32))
                xv = _load(b, x, b.add(b.mul(i, _c(I64, 1024)), _c(I64, 512 * h + 128 * j)), ir.VectorType(F32, 32))
                sub = 8 * h + 2 * j
                for t in range(2):
                    s = _splat(b, b.extract_element(scf, _c(I32, sub + t)), 8)
                    p = cx.dot8(_shuf(b, qf, qf, range(16 * t, 16 * t + 16)), _shuf(b, xv, xv, range(16 * t, 16 * t + 16)), 16)
                    acc[t] = cx.fma(s, p, acc[t])
        return [acc[0], acc[1], macc, accs[3]]

    return body


def _k23_int8(qtype):
    """Q2_K / Q3_K against x in Q8_K form: unsigned 2- or 3-bit q dotted with q8 per 16
    values, times the scale (pmaddwd); Q2_K's mins as a float FMA over x's integer 16-value
    sums, Q3_K's -4 offset as -4 * sum(scale * 16-value sum of q8), in integers."""
    size = BYTES[qtype]
    qs_off = 16 if qtype == Q.Q2_K else 32

    def body(cx, w, x, xs16, xs32, i, accs):
        b = cx.b
        base = b.mul(i, _c(I64, size))
        dx = _load(b, cx.xkd, b.mul(i, _c(I64, 4)), F32)
        bs = _load(b, cx.xkb, b.mul(i, _c(I64, 32)), V16I16)  # 16 sums of 16 q8 values
        macc = accs[2]
        if qtype == Q.Q2_K:
            d = b.fmul(cx.half(w, b.add(base, _c(I64, 80))), dx)
            dmin = b.fmul(cx.half(w, b.add(base, _c(I64, 82))), dx)
            s = _load(b, w, base, ir.VectorType(I8, 16))
            sc16 = b.zext(b.and_(s, _vconst(I8, [15] * 16)), V16I16)
            mprod = _llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [b.zext(b.lshr(s, _vconst(I8, [4] * 16)), V16I16), bs])
            macc = cx.fma(_splat(b, b.fneg(dmin), 8), b.sitofp(mprod, V8F), macc)
        else:
            d = b.fmul(cx.half(w, b.add(base, _c(I64, 108))), dx)
            sc16 = b.sext(_q3k_scales(b, w, base), V16I16)
            offset = _llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [sc16, bs])
            hm = _load(b, w, base, V32I8)
        sc_lo = b.bitcast(_shuf(b, sc16, sc16, list(range(8)) * 2), V32I8)
        sc_hi = b.bitcast(_shuf(b, sc16, sc16, list(range(8, 16)) * 2), V32I8)
        xk = b.mul(i, _c(I64, 256))
        parts = []
        for h in range(2):
            qs = _load(b, w, b.add(base, _c(I64, qs_off + 32 * h)), V32I8)
            for j in range(4):
                q = _q2k_quants(b, qs, j) if qtype == Q.Q2_K else _q3k_quants(b, qs, hm, h, j)
                y = _load(b, cx.xk, b.add(xk, _c(I64, 128 * h + 32 * j)), V32I8)
                p16 = _llvm_call(b, "llvm.x86.avx2.pmadd.ub.sw", V16I16, [q, y])
                sub = 8 * h + 2 * j
                parts.append(_llvm_call(b, "llvm.x86.avx2.pmadd.wd", V8I32, [p16, _splat16(b, sc_hi if h else sc_lo, [sub, sub + 1])]))
        sumi = _tree_sum(b, parts)
        if qtype == Q.Q3_K:
            sumi = b.sub(sumi, b.shl(offset, _vconst(I32, [2] * 8)))
        acc0 = cx.fma(_splat(b, d, 8), b.sitofp(sumi, V8F), accs[0])
        return [acc0, accs[1], macc, accs[3]]

    return body


BODIES = {
    Q.Q4_0: _legacy(Q.Q4_0), Q.Q4_1: _legacy(Q.Q4_1), Q.Q5_0: _legacy(Q.Q5_0), Q.Q5_1: _legacy(Q.Q5_1),
    Q.Q8_0: _legacy(Q.Q8_0), Q.F32: _float(Q.F32), Q.F16: _float(Q.F16), Q.BF16: _float(Q.BF16), Q.IQ4_NL: _iq4nl, Q.MXFP4: _mxfp4,
    Q.Q2_K: _k23(Q.Q2_K), Q.Q3_K: _k23(Q.Q3_K), Q.Q4_K: _k45(Q.Q4_K), Q.Q5_K: _k45(Q.Q5_K), Q.Q6_K: _q6k, Q.IQ4_XS: _iq4xs,
}
INT8_BODIES = {
    Q.Q2_K: _k23_int8(Q.Q2_K), Q.Q3_K: _k23_int8(Q.Q3_K), Q.Q4_K: _k45_int8(Q.Q4_K), Q.Q5_K: _k45_int8(Q.Q5_K),
    Q.Q6_K: _q6k_int8, Q.IQ4_XS: _iq4xs_int8,
}
# Types whose float path reads x's sums per 16 or 32 (offsets and mins).
XSUM_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q4_K, Q.Q5_K, Q.Q6_K})


def _host() -> tuple[bool, bool]:
    """(fp16 conversion in hardware, AVX2 int8 dot products) on this machine."""
    import llvmlite.binding as llvm

    try:
        if llvm.get_process_triple().startswith(("aarch64", "arm64")):
            return True, False
        feats = llvm.get_host_cpu_features()
        return bool(feats.get("f16c")), bool(feats.get("avx2"))
    except Exception:  # pragma: no cover - unusual hosts
        return False, False


F16_NATIVE, AVX2 = _host()
# Types whose rows are dotted with x quantized to int8 (ggml's way, on AVX2): per 32 values
# (Q8_0 form) for the legacy types, IQ4_NL and MXFP4, per 256 (Q8_K form) for the K-quants and
# IQ4_XS (ggml's vec_dot types for them). Twice as fast as the float path or more.
# Elsewhere (no AVX2) everything runs the float path.
Q8K_TYPES = frozenset({Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS}) if AVX2 else frozenset()
INT8_TYPES = (frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.IQ4_NL, Q.MXFP4}) | Q8K_TYPES) if AVX2 else frozenset()


def _row_ptr(context, builder, aty, val, row):
    ary = context.make_array(aty)(context, builder, val)
    stride0 = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
    data = builder.bitcast(ary.data, I8.as_pointer())
    return builder.gep(data, [builder.mul(row, stride0)], inbounds=True), ary


@intrinsic
def uses_int8(typingctx, w):
    """Compile-time constant: do rows of `w` need x in Q8_0 form (xq, xqd)?"""
    if _qtype_of(w) is None:
        return None
    path = _path_of(w)

    def codegen(context, builder, signature, args):
        return _c(I1, int(path == "q8_0"))

    return types.boolean(w), codegen


@intrinsic
def uses_xsums(typingctx, w):
    """Compile-time constant: do rows of `w` need x's float sums per 16/32 (xs16, xs32)?"""
    qtype = _qtype_of(w)
    if qtype is None:
        return None
    need = _path_of(w) == "float" and qtype in XSUM_TYPES

    def codegen(context, builder, signature, args):
        return _c(I1, int(need))

    return types.boolean(w), codegen


@intrinsic
def uses_q8k(typingctx, w):
    """Compile-time constant: do rows of `w` need x in Q8_K form (xk, xkd, xkb)?"""
    if _qtype_of(w) is None:
        return None
    path = _path_of(w)

    def codegen(context, builder, signature, args):
        return _c(I1, int(path == "q8_k"))

    return types.boolean(w), codegen


@intrinsic
def quantize_row(typingctx, x, j, xq, xqd):
    """Row j of x to int8 per 32 values, as ggml's Q8_0: d = max|x|/127, q = rint(x/d).

    xq[j] gets q; xqd[j, 4k:4k+4] get d, d * sum(q), and sum(q), 2 * sum(q) as int32 bits,
    of block k.
    """
    if not isinstance(j, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        b = builder
        xv, jv, qv, dv = args
        jv = context.cast(b, jv, signature.args[1], types.intp)
        xrow, xary = _row_ptr(context, b, signature.args[0], xv, jv)
        qrow, _ = _row_ptr(context, b, signature.args[2], qv, jv)
        drow, _ = _row_ptr(context, b, signature.args[3], dv, jv)
        cols = cgutils.unpack_tuple(b, xary.shape, 2)[1]
        V32F = ir.VectorType(F32, 32)
        cx = _Ctx(b, F16_NATIVE)

        def body(k, vals):
            v = _load(b, xrow, b.mul(k, _c(I64, 128)), V32F)
            a = _llvm_call(b, "llvm.fabs.v32f32", V32F, [v])
            n = 32
            while n > 1:
                h = n // 2
                lo, hi = _shuf(b, a, a, range(h)), _shuf(b, a, a, range(h, n))
                a = b.select(b.fcmp_ordered(">", lo, hi), lo, hi)
                n = h
            amax = b.extract_element(a, _c(I32, 0))
            d = b.fdiv(amax, _c(F32, 127.0))
            pos = b.fcmp_ordered(">", amax, _c(F32, 0.0))
            inv = b.select(pos, b.fdiv(_c(F32, 127.0), amax), _c(F32, 0.0))
            qf = _llvm_call(b, "llvm.rint.v32f32", V32F, [b.fmul(v, _splat(b, inv, 32))])
            q = b.fptosi(qf, V32I8)
            p = b.gep(qrow, [b.mul(k, _c(I64, 32))], inbounds=True)
            b.store(q, b.bitcast(p, V32I8.as_pointer()), align=1)
            tot = cx.hsum8(cx.fold8(qf, 32))
            pd = b.bitcast(b.gep(drow, [b.mul(k, _c(I64, 16))], inbounds=True), F32.as_pointer())
            b.store(d, pd, align=4)
            b.store(b.fmul(d, tot), b.gep(pd, [_c(I64, 1)]), align=4)
            ti = b.fptosi(tot, I32)
            pi = b.bitcast(pd, I32.as_pointer())
            b.store(ti, b.gep(pi, [_c(I64, 2)]), align=4)
            b.store(b.shl(ti, _c(I32, 1)), b.gep(pi, [_c(I64, 3)]), align=4)
            return vals

        _loop(b, b.sdiv(cols, _c(I64, 32)), [_c(I64, 0)], body, "q8")
        return context.get_dummy_value()

    return types.none(x, j, xq, xqd), codegen


def _hmax(b, v, n, op):
    """Reduce an n-lane float vector with fcmp `op` ('>' for max, '<' for min)."""
    while n > 1:
        h = n // 2
        lo, hi = _shuf(b, v, v, range(h)), _shuf(b, v, v, range(h, n))
        v = b.select(b.fcmp_ordered(op, lo, hi), lo, hi)
        n = h
    return b.extract_element(v, _c(I32, 0))


@intrinsic
def quantize_row_k(typingctx, x, j, xk, xkd, xkb):
    """Row j of x to int8 per 256 values, as ggml's quantize_row_q8_K_ref.

    With m the value of largest |x| (signed): iscale = -127/m, q = min(127, rint(iscale*x)),
    d = 1/iscale (all zero when m is). xk[j] gets q, xkd[j, k] d of super-block k, and
    xkb[j, 16k:16k+16] (int16) the sums of q over each run of 16.
    """
    if not isinstance(j, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        b = builder
        xv, jv, qv, dv, sv = args
        jv = context.cast(b, jv, signature.args[1], types.intp)
        xrow, xary = _row_ptr(context, b, signature.args[0], xv, jv)
        qrow, _ = _row_ptr(context, b, signature.args[2], qv, jv)
        drow, _ = _row_ptr(context, b, signature.args[3], dv, jv)
        srow, _ = _row_ptr(context, b, signature.args[4], sv, jv)
        cols = cgutils.unpack_tuple(b, xary.shape, 2)[1]
        V32F = ir.VectorType(F32, 32)
        cx = _Ctx(b, F16_NATIVE)

        def body(k, vals):
            xo = b.mul(k, _c(I64, 1024))
            vs = [_load(b, xrow, b.add(xo, _c(I64, 128 * t)), V32F) for t in range(8)]
            hi, lo = vs[0], vs[0]
            for v in vs[1:]:
                hi = b.select(b.fcmp_ordered(">", v, hi), v, hi)
                lo = b.select(b.fcmp_ordered("<", v, lo), v, lo)
            mx, mn = _hmax(b, hi, 32, ">"), _hmax(b, lo, 32, "<")
            neg = b.fcmp_ordered(">", b.fneg(mn), mx)
            m = b.select(neg, mn, mx)
            nz = b.fcmp_unordered("!=", m, _c(F32, 0.0))
            iscale = b.select(nz, b.fdiv(_c(F32, -127.0), m), _c(F32, 0.0))
            d = b.select(nz, b.fdiv(_c(F32, 1.0), iscale), _c(F32, 0.0))
            b.store(d, b.bitcast(b.gep(drow, [b.mul(k, _c(I64, 4))], inbounds=True), F32.as_pointer()), align=4)
            isv = _splat(b, iscale, 32)
            for t, v in enumerate(vs):
                qf = _llvm_call(b, "llvm.rint.v32f32", V32F, [b.fmul(v, isv)])
                qf = _llvm_call(b, "llvm.minnum.v32f32", V32F, [qf, ir.Constant(V32F, [127.0] * 32)])
                q = b.fptosi(qf, V32I8)
                p = b.gep(qrow, [b.add(b.mul(k, _c(I64, 256)), _c(I64, 32 * t))], inbounds=True)
                b.store(q, b.bitcast(p, V32I8.as_pointer()), align=1)
                for h in range(2):
                    half = _shuf(b, qf, qf, range(16 * h, 16 * h + 16))
                    tot = cx.hsum8(cx.fold8(half, 16))
                    ps = b.gep(srow, [b.add(b.mul(k, _c(I64, 32)), _c(I64, 4 * t + 2 * h))], inbounds=True)
                    b.store(b.fptosi(tot, I16), b.bitcast(ps, I16.as_pointer()), align=2)
            return vals

        _loop(b, b.sdiv(cols, _c(I64, 256)), [_c(I64, 0)], body, "q8k")
        return context.get_dummy_value()

    return types.none(x, j, xk, xkd, xkb), codegen


def _rowdots(context, b, signature, args, rows):
    """IR for row r of w dotted with `rows` consecutive rows of x from row j: one pass over
    the weight row, each block unpacked once for all of them.

    Each x row gets its own accumulators and the exact operations `rows = 1` does, in the same
    order, so a row's result does not depend on how many rows run beside it (a speculative
    verify equals decoding bit for bit). The bodies are emitted once per x row; the weight
    loads and unpacking in them are identical IR, which LLVM's CSE keeps once per block.
    """
    wv, rv, xv, jv, s16v, s32v, qv, dv, kv, kdv, kbv = args
    qtype = _qtype_of(signature.args[0])
    rv = context.cast(b, rv, signature.args[1], types.intp)
    jv = context.cast(b, jv, signature.args[3], types.intp)
    wrow, _ = _row_ptr(context, b, signature.args[0], wv, rv)
    path = _path_of(signature.args[0])
    int8 = path != "float"
    q8k = path == "q8_k"
    q80 = path == "q8_0"
    per_row = []
    for t in range(rows):
        jt = b.add(jv, _c(I64, t))
        xrow, xary = _row_ptr(context, b, signature.args[2], xv, jt)
        s16, _ = _row_ptr(context, b, signature.args[4], s16v, jt)
        s32, _ = _row_ptr(context, b, signature.args[5], s32v, jt)
        cx = _Ctx(b, F16_NATIVE, int8,
                  _row_ptr(context, b, signature.args[6], qv, jt)[0] if q80 else None,
                  _row_ptr(context, b, signature.args[7], dv, jt)[0] if q80 else None,
                  _row_ptr(context, b, signature.args[8], kv, jt)[0] if q8k else None,
                  _row_ptr(context, b, signature.args[9], kdv, jt)[0] if q8k else None,
                  _row_ptr(context, b, signature.args[10], kbv, jt)[0] if q8k else None)
        per_row.append((cx, xrow, s16, s32))
    cols = cgutils.unpack_tuple(b, xary.shape, 2)[1]
    zero = ir.Constant(V8F, [0.0] * 8)
    f0 = _c(F32, 0.0)
    nblk = b.sdiv(cols, _c(I64, BLOCK[qtype]))
    body = INT8_BODIES[qtype] if q8k else BODIES[qtype]

    def pair(i, a):
        # Two blocks per step with the accumulators swapped: two FMA chains, not one.
        i0 = b.mul(i, _c(I64, 2))
        ahead = b.gep(wrow, [b.add(b.mul(i0, _c(I64, BYTES[qtype])), _c(I64, PREFETCH))], inbounds=False)
        _llvm_call(b, "llvm.prefetch.p0i8", ir.VoidType(), [ahead, _c(I32, 0), _c(I32, 3), _c(I32, 1)])  # read, keep
        out = []
        for t, (cx, xrow, s16, s32) in enumerate(per_row):
            at = a[5 * t:5 * t + 5]
            r0 = body(cx, wrow, xrow, s16, s32, i0, at[:4])
            r1 = body(cx, wrow, xrow, s16, s32, b.add(i0, _c(I64, 1)), [r0[1], r0[0], r0[2], at[4]])
            out += [r1[1], r1[0], r1[2], r0[3], r1[3]]
        return out

    a = _loop(b, b.sdiv(nblk, _c(I64, 2)), [zero, zero, zero, f0, f0] * rows, pair, "blk")
    odd = b.sub(nblk, b.mul(b.sdiv(nblk, _c(I64, 2)), _c(I64, 2)))
    last = b.sub(nblk, _c(I64, 1))

    def odd_block(i, v):
        out = []
        for t, (cx, xrow, s16, s32) in enumerate(per_row):
            out += body(cx, wrow, xrow, s16, s32, last, v[4 * t:4 * t + 4])
        return out

    inits = []
    for t in range(rows):
        at = a[5 * t:5 * t + 5]
        inits += [at[0], at[1], at[2], b.fadd(at[3], at[4])]
    a = _loop(b, odd, inits, odd_block, "odd")
    totals = []
    for t, (cx, xrow, s16, s32) in enumerate(per_row):
        at = a[4 * t:4 * t + 4]
        total = b.fadd(cx.hsum8(b.fadd(b.fadd(at[0], at[1]), at[2])), at[3])
        if qtype in FLOAT_TYPES:  # the last cols % 8 values
            start = b.mul(nblk, _c(I64, 8))

            def tail(i, vals, cx=cx, xrow=xrow):
                k = b.add(start, i)
                if qtype == Q.F32:
                    wk = _load(b, wrow, b.mul(k, _c(I64, 4)), F32)
                elif qtype == Q.F16:
                    wk = cx.half(wrow, b.mul(k, _c(I64, 2)))
                else:
                    wk = _bf16_to_f32(b, _load(b, wrow, b.mul(k, _c(I64, 2)), I16))
                return [_fma(b, wk, _load(b, xrow, b.mul(k, _c(I64, 4)), F32), vals[0])]

            total = _loop(b, b.sub(cols, start), [total], tail, "tail")[0]
        totals.append(total)
    return totals


def _rowdot_args_ok(w, r, j) -> bool:
    return _qtype_of(w) is not None and isinstance(r, types.Integer) and isinstance(j, types.Integer)


@intrinsic
def rowdot(typingctx, w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb):
    """float32 dot(row r of tagged weights w, row j of x); x's sums and int8 forms beside."""
    if not _rowdot_args_ok(w, r, j):
        return None

    def codegen(context, builder, signature, args):
        return _rowdots(context, builder, signature, args, 1)[0]

    return types.float32(w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb), codegen


# Bytes ahead of the block in hand that each step asks the cache for. Without it a row streamed
# from RAM ran at half of what the C kernels (whose simpler loops the hardware prefetcher
# follows) read: 0.085 against 0.044 ms for a 576x1536 Q4_1 matvec, weights not in cache.
PREFETCH = 2048


def _rowdots_intrinsic(rows: int):
    @intrinsic
    def rowdots(typingctx, w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb):
        if not _rowdot_args_ok(w, r, j):
            return None
        ret = types.UniTuple(types.float32, rows)

        def codegen(context, builder, signature, args):
            return context.make_tuple(builder, ret, _rowdots(context, builder, signature, args, rows))

        return ret(w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb), codegen

    rowdots.__doc__ = f"rowdot for rows j .. j+{rows - 1} of x in one pass (a tuple), each equal to its rowdot."
    return rowdots


rowdot4 = _rowdots_intrinsic(4)
rowdot8 = _rowdots_intrinsic(8)


# --------------------------------------------------------------------------- float16 cache rows
# Attention over the f16 KV cache, one cached row at a time. Written as vector IR for the same
# reason as rowdot: as plain Numba loops, the float16 decode is a table lookup (a gather) and a
# dot product is one serial chain of adds, which LLVM may not reorder; here it is 8 lanes.


def _vector_arg(context, b, aty, val):
    ary = context.make_array(aty)(context, b, val)
    return b.bitcast(ary.data, I8.as_pointer()), cgutils.unpack_tuple(b, ary.shape, 1)[0]


def _contiguous_1d(ty, dtype) -> bool:
    return isinstance(ty, types.Array) and ty.ndim == 1 and ty.layout == "C" and ty.dtype == dtype


@intrinsic
def dot_f16(typingctx, q, k):
    """float32 dot(q, k) of a float32 row and a float16 row (as uint16) of q's length, a multiple of 8."""
    if not (_contiguous_1d(q, types.float32) and _contiguous_1d(k, types.uint16)):
        return None

    def codegen(context, builder, signature, args):
        b = builder
        qp, n = _vector_arg(context, b, signature.args[0], args[0])
        kp, _ = _vector_arg(context, b, signature.args[1], args[1])

        def step(i, acc):
            return [_fma(b, _load(b, qp, b.mul(i, _c(I64, 32)), V8F), _halves8(b, F16_NATIVE, kp, b.mul(i, _c(I64, 16))), acc[0])]

        acc = _loop(b, b.sdiv(n, _c(I64, 8)), [ir.Constant(V8F, [0.0] * 8)], step, "dot16")[0]
        return _Ctx(b, F16_NATIVE).hsum8(acc)

    return types.float32(q, k), codegen


@intrinsic
def axpy_f16(typingctx, o, p, v):
    """o += p * v for a float32 row o and a float16 row v (as uint16) of o's length, a multiple of 8."""
    if not (_contiguous_1d(o, types.float32) and isinstance(p, types.Float) and _contiguous_1d(v, types.uint16)):
        return None

    def codegen(context, builder, signature, args):
        b = builder
        op, n = _vector_arg(context, b, signature.args[0], args[0])
        vp, _ = _vector_arg(context, b, signature.args[2], args[2])
        pv = _splat(b, context.cast(b, args[1], signature.args[1], types.float32), 8)

        def step(i, _):
            off = b.mul(i, _c(I64, 32))
            ptr = b.bitcast(b.gep(op, [off], inbounds=True), V8F.as_pointer())
            b.store(_fma(b, pv, _halves8(b, F16_NATIVE, vp, b.mul(i, _c(I64, 16))), b.load(ptr, align=1)), ptr, align=1)
            return []

        _loop(b, b.sdiv(n, _c(I64, 8)), [], step, "axpy16")
        return context.get_dummy_value()

    return types.none(o, p, v), codegen


@njit(cache=True, inline="always")
def exp_scores(scores, t, mx, sink):  # pragma: no cover - jitted
    """scores[j] = e^(scores[j] - mx) for j < t; returns what the weighted values are
    multiplied by: 1 / their sum, where the head's `sink` logit (gpt-oss; -inf for none)
    joins the sum as ggml's flash attention adds it, after every position.

    numba_ops' `_attention_typed` inlines it too, and Numba's cache of that file does not
    notice an edit here: delete native/__pycache__ after changing it."""
    total = np.float32(0.0)
    for j in range(t):
        scores[j] = np.exp(scores[j] - mx)
        total += scores[j]
    if sink > mx:
        ms = np.exp(mx - sink)
        return ms / (total * ms + np.float32(1.0))
    return np.float32(1.0) / (total + np.exp(sink - mx))


@njit(cache=True, inline="always")
def _attend_f16(q, keys, values, pos, out, scale, task, n_head, group, scores, acc, window, sinks):  # pragma: no cover - jitted
    """One query head of one row over its sequence's float16 cache (rows first..pos, first
    = pos - window + 1 with a window, else 0)."""
    i, h = task // n_head, task % n_head
    kvh = h // group
    hd = q.shape[2]
    t = pos[i] + 1
    first = t - window if 0 < window < t else 0
    qh = q[i, h]
    mx = -np.inf
    for j in range(first, t):
        s = dot_f16(qh, keys[kvh, j]) * scale
        scores[j - first] = s
        mx = max(mx, s)
    inv = exp_scores(scores, t - first, mx, sinks[h])
    acc[:] = 0.0
    for j in range(first, t):
        axpy_f16(acc, scores[j - first] * inv, values[kvh, j])
    out[i, h * hd : (h + 1) * hd] = acc


@njit(cache=True)
def attention_f16_serial(q, keys, values, pos, out, scale, group, window, sinks):  # pragma: no cover - jitted
    n_head = q.shape[1]
    scores = np.empty(pos.max() + 1, np.float32)
    acc = np.empty(q.shape[2], np.float32)
    for task in range(q.shape[0] * n_head):
        _attend_f16(q, keys, values, pos, out, scale, task, n_head, group, scores, acc, window, sinks)


@njit(cache=True, parallel=True)
def attention_f16_parallel(q, keys, values, pos, out, scale, group, window, sinks):  # pragma: no cover - jitted
    n_head = q.shape[1]
    longest = pos.max() + 1
    for task in prange(q.shape[0] * n_head):
        scores = np.empty(longest, np.float32)
        acc = np.empty(q.shape[2], np.float32)
        _attend_f16(q, keys, values, pos, out, scale, task, n_head, group, scores, acc, window, sinks)


# The kernel lives in this file, beside the IR it inlines: Numba's cache is keyed to the
# source file of the jitted function, so an edit to the IR must invalidate it too.
@njit(parallel=True, cache=True)
def matmul(w, x, o, cols):  # pragma: no cover - jitted
    """o = x @ w.T for one matrix: every row of x against every row of w, in one parallel
    region over w's rows. One specialization per block type (and path)."""
    n = x.shape[0]
    if x.shape[1] != cols:
        raise ValueError("x has the wrong number of columns")
    if o.shape[0] != n or o.shape[1] != w.shape[0]:
        raise ValueError("the output has the wrong shape")
    # Sums of x over each run of 16 and 32 values (for the float path's block offsets and
    # minimums; the int8 paths have their own, in integers).
    xsum = uses_xsums(w)
    xs16 = np.empty((n if xsum else 0, cols // 16), np.float32)
    xs32 = np.empty((n if xsum else 0, cols // 32), np.float32)
    for j in range(n if xsum else 0):
        for k in range(cols // 16):
            s = np.float32(0.0)
            for t in range(16):
                s += x[j, k * 16 + t]
            xs16[j, k] = s
        for k in range(cols // 32):
            xs32[j, k] = xs16[j, 2 * k] + xs16[j, 2 * k + 1]
    # x in int8 per 32 values, for the types whose rows take the int8 path.
    q8 = uses_int8(w)
    xq = np.empty((n, cols if q8 else 0), np.int8)
    xqd = np.empty((n, cols // 8 if q8 else 0), np.float32)
    if q8:
        for j in range(n):
            quantize_row(x, j, xq, xqd)
    # x in int8 per 256 values (Q8_K: d, q, sums of q per 16), for the K-quants' int8 path.
    qk = uses_q8k(w)
    xk = np.empty((n, cols if qk else 0), np.int8)
    xkd = np.empty((n, cols // 256 if qk else 0), np.float32)
    xkb = np.empty((n, cols // 16 if qk else 0), np.int16)
    if qk:
        for j in range(n):
            quantize_row_k(x, j, xk, xkd, xkb)
    for r in prange(w.shape[0]):
        _rows(w, r, x, xs16, xs32, xq, xqd, xk, xkd, xkb, o)


@njit(cache=True)
def _rows(w, r, x, xs16, xs32, xq, xqd, xk, xkd, xkb, o):  # pragma: no cover - jitted
    """Row r of w against every row of x: eight x rows per pass over the weight row while eight
    remain, then four, then one at a time (a block unpacked once per pass, not once per x row)."""
    n = x.shape[0]
    j = 0
    while j + 8 <= n:
        d = rowdot8(w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb)
        for t in range(8):
            o[j + t, r] = d[t]
        j += 8
    while j + 4 <= n:
        d = rowdot4(w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb)
        for t in range(4):
            o[j + t, r] = d[t]
        j += 4
    while j < n:
        o[j, r] = rowdot(w, r, x, j, xs16, xs32, xq, xqd, xk, xkd, xkb)
        j += 1


# Numba names a record type in symbol names by a per-process counter, so kernels for two block
# types compiled in two processes can share their symbols' names; a process that loads both
# from the disk cache then runs one type's code for the other (wrong numbers, no error). So the
# tags' record types are made here, at import, in one fixed order (the same numbering in every
# process that imports this the same way) and kept alive; and that numbering is part of the
# cache key of the functions that take tagged arrays, so a process that numbered them
# differently compiles its own kernels instead of loading clashing ones.
_TAG_RECORDS = tuple(typeof(np.empty((0, 1), tag_dtype(t, f))).dtype for t in BLOCK for f in (False, True))
_TAG_NUMBERING = tuple(r.mangling_args for r in _TAG_RECORDS)


class _TagCache(FunctionCache):
    """Numba's function cache, keyed also on the tags' numbering."""

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), _TAG_NUMBERING)


for _kernel in (matmul, _rows):
    _kernel._cache = _TagCache(_kernel.py_func)
