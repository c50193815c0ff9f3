"""The argument contract between SDPA adapters and SDPA kernel templates.

Every SDPA kernel takes the user's io tensors and Stats exactly as bound, in
their declared order, so execute builds no view of them (padding lengths and
sinks arrive as 1-D views):

Dense graphs:
    q  (B, Hq, Sq, Dqk)   k  (B, Hkv, Skv, Dqk)   v  (B, Hv, Skv, Dv)   (Hv = Hkv unless num_heads_v says)
    o  (B, Hq, Sq, Dv)    lse (B, Hq, Sq, 1) fp32   (gradients dq/dk/dv/do alike)
Packed THD graphs:
    q  (Tq, Hq, Dqk)      k  (Tkv, Hkv, Dqk)      v  (Tkv, Hv, Dv)
    o  (Tq, Hq, Dv)       lse (Tq, Hq, 1) fp32
    cu_seqlens_q / cu_seqlens_kv: int32 (B+1,) prefix sums on the device
The jit entry (`frost.engines.common.sdpa_entry`) turns them, at trace time, into
the canonical views kernels are written against: token-major (B, S, H, D) for
dense io tensors, (B, H, S) / (H, T) for lse; THD io tensors stay (T, H, D).
`canonical_to_declared` is the inverse, for callers that hold canonical views.
Strides are whatever the user declared; the last (head-dim) stride is 1.
B, S and T are runtime extents and compile as symbolic ints (`cute.sym_int`);
Hq, Hkv, D, Dv, dtypes and layout facts are plan-time and compile as constants.

Forward argument order (optional entries present only when their TemplateParams
flag is set, in this order):
    q, k, v, o,
    lse                          if has_lse
    score_max                    if has_score_max      (shaped and viewed like lse)
    score_sum_exp                if has_score_sum_exp  (shaped and viewed like lse)
    cu_seqlens_q, cu_seqlens_kv  if is_thd
    seqused_q, seqused_kv        if has_seqused   (int32 (B,), padding masks, dense only)
    sinks                        if has_sinks     (fp32 (Hq,))
    bias                         if has_bias      (io dtype (B or 1, Hq or 1, Sq, Skv), as declared)
    block_mask                   if has_block_mask (uint8 (B, Hq, ceil(Sq/128), ceil(ceil(Skv/128)/8)), as declared)
    k_table, v_table             if paged (int32 (B, 1, max_blocks, 1) block tables, as declared)
    softmax_scale                Float32
    window_left                  if has_window_left   Int32 >= 0
    window_right                 if has_window_right  Int32 >= 0 (causal is window_right = 0)
    max_seqlen_kv                if paged         Int32 plan-time envelope S_kv (paged_attention_max_seq_len_kv)
    max_seqlen_q                 if is_thd        Int32 plan-time envelope (max_seq_len_q): sizes the grid, caps
                                                  each packed query length
    max_seqlen_kv                if is_thd        Int32 plan-time envelope (max_seq_len_kv): caps each packed key
                                                  length (a length above its envelope is clamped to it)
    total_q, total_kv            if ragged        Int32 plan-time token envelopes (T of the (T, H, D) views)
    o_partial, lse_partial       if num_splits > 1 fp32 (splits, B, Hq, Sq, Dv) / (splits, B, Hq, Sq) workspace
                                 views: each split's O and LSE (no sink); `split_combine` reduces them
                                 (packed batches: Sq the max_seqlen_q envelope, rows local to each sequence)
    max_partial                  if num_splits > 1 and has_score_max or has_score_sum_exp: fp32 (splits, B, Hq, Sq),
                                 each split's row max (natural units, no sink; -inf where it saw no key)
    stream                       CUstream (explicit; the adapter passes the context's stream)

cuDNN's ragged-offset form (params `ragged`: `token_div_q` / `token_div_kv` > 0) is packed THD
whose io tensors are bound as declared, (B, H, S, D) with bshd strides: the entry views each as
(T, H, D) with its S and H strides, T = total_q / total_kv (max_total_seq_len or B * S).
cu_seqlens_q / cu_seqlens_kv then hold element offsets per batch, (B+1,) int32 or int64
(`offset_dtype_q/kv`), which kernels divide by the group's token stride (`token_div_q/kv`);
lengths come from seqused_q / seqused_kv. Those are q's and k's offsets; every other io tensor
whose offsets are another tensor, or whose token stride differs (cuDNN gives each tensor its
own), reads `<role>_offsets` (params `own_offsets`: role, divisor, dtype), passed after
lse_offsets in OWN_OFFSET_ROLES order (the forward: o_offsets, v_offsets, then score_max_offsets
and score_sum_exp_offsets, which ragged score_max / score_sum_exp always read, like Stats' lse_offsets). Stats are
ragged too, (H, T) viewed the same way with their own offsets `lse_offsets` (after seqused, if has_lse; divisor
`token_div_lse`), or
per batch (`stats_per_batch`): (B, H, S, 1) read and written like a dense batch's; score_max and
score_sum_exp the same way (their own offsets, or per batch with Stats). Kernels
write only the rows of the sequences (the backward's helpers walk each sequence's rows, so
dQ outside every sequence is not written either).

cuDNN's paged K/V cache (params `paged`: `paged_block_k` / `paged_block_v` > 0) is dense with
lengths from seqused: k and v are containers (num_blocks, Hkv, block_size, D) (canonical
(num_blocks, block_size, H, D)); key j of sequence b is row j % block_size of block
k_table[b, 0, j // block_size, 0] (v_table for V). seqused_kv is clamped to max_seqlen_kv.

Mask semantics (shared by every engine and the reference):
    query row i, key column j, both local to their sequence;
    off = (seqlen_kv - seqlen_q) if causal_bottom_right (align_bottom_right) else 0
    allowed(i, j) = j < seqlen_kv
                    and (not has_window_left  or j >= i + off - window_left)
                    and (not has_window_right or j <= i + off + window_right)
Logits are softmax_scale * q.k. GQA: query head h reads K head h // (Hq // Hkv) and
V head h // (Hq // Hv).
Score modifiers (cuDNN's order): logits are
    softmax_scale * q.k + bias[b, h, i, j] + slope(h) * (j - i)
then masked. The bias (flag `has_bias`) is taken as declared, any strides (the
kernel reads it element by element), its batch and head modes of extent 1 when it
broadcasts over them (`bias_per_batch` / `bias_per_head` say which are full);
i, j are sequence-local (packed THD sequences index it like padded ones, S_q and
S_kv being max_seq_len_q / kv). ALiBi (flag `has_alibi`) uses cuDNN's slopes
(`alibi_slopes`) and needs a causal mask, as in cuDNN.
Block mask (flag `has_block_mask`, forward only, cuDNN's block_mask): bit j (LSB first)
of byte [b, h, i // 128, k] says whether query rows 128 i' .. 128 i' + 127 (i' = i // 128)
may see keys 128 (8 k + j) .. + 127; a cleared bit masks those pairs like the band does
(sequence-local positions; S_q, S_kv of packed graphs: max_seq_len_q / kv). A row left with
no key is an empty row.
Sinks: one extra logit per query head, sinks[h] (already in scaled-logit units),
enters the softmax denominator only. LSE (natural log) includes the sink.
score_max is the row max of the masked logits and the sink (natural units, scaled);
score_sum_exp the row sum of exp(logit - score_max), the sink's term included, so
LSE = score_max + log(score_sum_exp) (cuDNN's definitions).
A row with no allowed key and no sink writes O = 0 and LSE = -inf (score_max = -inf,
score_sum_exp = 0). Dense rows past seqused_q are written the same way; THD kernels
write only rows inside a sequence.
Padding rows (past seqused) and tokens outside every packed sequence may hold any bits,
NaN and Inf included: kernels never let them reach a result.

Backward argument order:
    q, k, v, o, do, lse, dq, dk, dv,
    (cu_seqlens_q, cu_seqlens_kv | seqused_q, seqused_kv | sinks, dsinks | bias, dbias)  as flagged,
    scratch views carved from the caller's workspace (listed by the template),
    softmax_scale, window_left?, window_right?, max_seqlen_q?, max_seqlen_kv?, stream
(packed graphs cap each length at max_seqlen_q / max_seqlen_kv, as the forward does)
dsinks (fp32 (Hq,)) = -sum over rows of exp(sinks[h] - lse) * rowsum(dO * O).
dbias (flag `has_dbias`; the bias's dims, any strides) = dS = P * (dP - rowsum(dO * O)),
the logits' gradient before the scale, summed over the batch entries and heads the
bias broadcasts over; zero at masked and padding positions.
A backward made of several kernels gives each kernel the ordered subsequence of
this list that it reads; its params module names them per kernel (e.g.
`frost.engines.sdpa_bwd.chain.bwd_chain`). dsinks is present only when dSink is
requested (flag `has_dsinks`); sinks then too. lse is read natively from its
declared strides. Rows and tokens outside every sequence get dQ = 0; dense
padding rows of dK / dV get 0; THD tokens past cu_seqlens_kv[B] are not written.
"""

# roles whose tensors are (B, H, S, D) when dense, (T, H, D) when packed
IO_ROLES = frozenset(("q", "k", "v", "o", "do", "dq", "dk", "dv"))
#: roles of the query token group (the kv group is the rest of IO_ROLES)
Q_ROLES = frozenset(("q", "o", "do", "dq"))
#: ragged io tensors that may read their own offsets (`<role>_offsets`, params `own_offsets`); q and k lead their
#: token groups through cu_seqlens_q / cu_seqlens_kv
OWN_OFFSET_ROLES = ("o", "v", "do", "dq", "dk", "dv", "score_max", "score_sum_exp")
#: the forward's io tensors and row outputs that may read their own offsets
FWD_OWN_OFFSET_ROLES = ("o", "v", "score_max", "score_sum_exp")
STATS_ROLE = "lse"
#: cuDNN's block_mask: query rows and keys of one tile, key tiles per byte (the kernels' and the reference math's
#: reading of it; the graph layer checks the dims with its own copy, frost.ir.validate.block_mask_dims)
BLOCK_MASK_TILE, BLOCK_MASK_BITS = 128, 8
#: per-query-row fp32 tensors: lse and its two halves, each (B, H, S, 1) / (T, H, 1) as declared
STATS_ROLES = frozenset((STATS_ROLE, "score_max", "score_sum_exp"))


def fwd_arg_names(p) -> list[str]:
    """The forward argument names of one flag set (any SdpaFeatureParams with has_lse), in order."""
    names = ["q", "k", "v", "o"] + ["lse"] * p.has_lse
    names += ["score_max"] * getattr(p, "has_score_max", False)
    names += ["score_sum_exp"] * getattr(p, "has_score_sum_exp", False)
    names += ["cu_seqlens_q", "cu_seqlens_kv"] * p.is_thd + ["seqused_q", "seqused_kv"] * p.has_seqused
    names += ["lse_offsets"] * (p.has_lse and p.token_div_lse > 0) + own_offset_args(p, FWD_OWN_OFFSET_ROLES)
    names += ["sinks"] * p.has_sinks + ["bias"] * p.has_bias
    paged = getattr(p, "paged", False)
    names += ["block_mask"] * getattr(p, "has_block_mask", False) + ["k_table", "v_table"] * paged
    names += ["softmax_scale"] + ["window_left"] * p.has_window_left + ["window_right"] * p.has_window_right
    names += ["max_seqlen_kv"] * paged
    names += ["max_seqlen_q", "max_seqlen_kv"] * p.is_thd + ragged_totals(p)
    split = getattr(p, "num_splits", 1) > 1
    scores = getattr(p, "has_score_max", False) or getattr(p, "has_score_sum_exp", False)
    return names + ["o_partial", "lse_partial"] * split + ["max_partial"] * (split and scores) + ["stream"]


def ragged_tags(p) -> list[str]:
    """Kernel-name tags of the ragged-offset form: each group's token divisor and 64-bit offsets, the Stats'."""
    if not p.ragged:
        return []
    tags = [f"rg{p.token_div_q}x{p.token_div_kv}"]
    tags += [
        f"o64{g}"
        for g, kind in (("q", p.offset_dtype_q), ("kv", p.offset_dtype_kv), ("lse", p.offset_dtype_lse))
        if kind == "int64"
    ]
    if p.token_div_lse:
        tags.append(f"rglse{p.token_div_lse}")
    tags += [f"rg{r}{div}" + "o64" * (kind == "int64") for r, div, kind in getattr(p, "own_offsets", ())]
    return tags + ["lsepb"] * p.stats_per_batch


def own_offset_args(p, roles) -> list[str]:
    """The `<role>_offsets` arguments of the `roles` a kernel reads that carry their own ragged offsets."""
    return [f"{r}_offsets" for r, _, _ in getattr(p, "own_offsets", ()) if r in roles]


def ragged_totals(p) -> list[str]:
    """The token envelopes a ragged-offset kernel views its (B, H, S, D) tensors with (none otherwise)."""
    return ["total_q", "total_kv"] if p.ragged else []


def alibi_slopes(num_heads: int) -> list[float]:
    """cuDNN's ALiBi slopes, one per query head: with n the largest power of two <= num_heads, head h < n takes
    2^(-8 (h + 1) / n) and head n + e takes 2^(-4 (2 e + 1) / n) (the odd powers of 2^(-4 / n))."""
    n = 1 << (num_heads.bit_length() - 1)
    return [2.0 ** (-8.0 * (h + 1) / n) if h < n else 2.0 ** (-4.0 * (2 * (h - n) + 1) / n) for h in range(num_heads)]


def canonical_to_declared(name: str, t, is_thd: bool):
    """The declared-order view of a canonical one (a torch view; non-tensors pass through)."""
    if name in IO_ROLES and not is_thd:
        return t.permute(0, 2, 1, 3)
    if name in STATS_ROLES:
        return (t.t() if is_thd else t).unsqueeze(-1)
    return t


class CanonicalCall:
    """A compiled forward kernel called with canonical views (kernel-level tests, quick benchmarks)."""

    def __init__(self, kernel, params):
        self.kernel = kernel
        self.names = fwd_arg_names(params)
        self.is_thd = params.is_thd

    def __call__(self, *args):
        if len(args) != len(self.names):
            raise TypeError(f"expected {len(self.names)} arguments ({', '.join(self.names)}), got {len(args)}")
        self.kernel(*[canonical_to_declared(n, a, self.is_thd) for n, a in zip(self.names, args)])


def declared_values(values: dict, is_thd: bool) -> dict:
    """Named canonical values (e.g. a backward chain's arguments) in declared order."""
    return {n: canonical_to_declared(n, v, is_thd) for n, v in values.items()}
