"""The argument contract between SDPA adapters and SDPA kernel templates.

Every SDPA kernel template (any feature arch) is called with the same canonical
views, built by the adapter from the user's tensors as strided views only (a
`permute` / `select` / `view` — never a copy):

Dense (B, H, S, D graphs), token-major "BSHD" views:
    q  (B, Sq, Hq, Dqk)    k  (B, Skv, Hkv, Dqk)    v  (B, Skv, Hkv, Dv)
    o  (B, Sq, Hq, Dv)     lse (B, Hq, Sq) fp32
Packed THD graphs:
    q  (Tq, Hq, Dqk)       k  (Tkv, Hkv, Dqk)       v  (Tkv, Hkv, Dv)
    o  (Tq, Hq, Dv)        lse (Hq, Tq) fp32
    cu_seqlens_q / cu_seqlens_kv: int32 (B+1,) prefix sums on the device
Strides are whatever the user declared; the last (head-dim) stride is 1.
B, S and T are runtime extents and compile as symbolic ints (`cute.sym_int`);
Hq, Hkv, D, Dv, dtypes and layout facts are plan-time and compile as constants.

Forward argument order (optional entries present only when their TemplateParams
flag is set, in this order):
    q, k, v, o,
    lse                          if has_lse
    cu_seqlens_q, cu_seqlens_kv  if is_thd
    seqused_q, seqused_kv        if has_seqused   (int32 (B,), padding masks, dense only)
    sinks                        if has_sinks     (fp32 (Hq,))
    softmax_scale                Float32
    window_left                  if has_window_left   Int32 >= 0
    window_right                 if has_window_right  Int32 >= 0 (causal is window_right = 0)
    max_seqlen_q                 if is_thd        Int32 plan-time envelope, sizes the grid
    stream                       CUstream (explicit; the adapter passes the context's stream)

Mask semantics (shared by every engine and the reference):
    query row i, key column j, both local to their sequence;
    off = (seqlen_kv - seqlen_q) if causal_bottom_right (align_bottom_right) else 0
    allowed(i, j) = j < seqlen_kv
                    and (not has_window_left  or j >= i + off - window_left)
                    and (not has_window_right or j <= i + off + window_right)
Logits are softmax_scale * q.k. GQA: query head h reads kv head h // (Hq // Hkv).
Sinks: one extra logit per query head, sinks[h] (already in scaled-logit units),
enters the softmax denominator only. LSE (natural log) includes the sink.
A row with no allowed key and no sink writes O = 0 and LSE = -inf. Dense rows past
seqused_q are written the same way; THD kernels write only rows inside a sequence.
Padding rows (past seqused) and tokens outside every packed sequence may hold any bits,
NaN and Inf included: kernels never let them reach a result.

Backward argument order:
    q, k, v, o, do, lse, dq, dk, dv,
    (cu_seqlens_q, cu_seqlens_kv | seqused_q, seqused_kv | sinks, dsinks)  as flagged,
    scratch views carved from the caller's workspace (listed by the template),
    softmax_scale, window_left?, window_right?, max_seqlen_q?, max_seqlen_kv?, stream
dsinks (fp32 (Hq,)) = -sum over rows of exp(sinks[h] - lse) * rowsum(dO * O).
A backward made of several kernels gives each kernel the ordered subsequence of
this list that it reads; its params module names them per kernel (e.g.
`sm80.sdpa_bwd_params.bwd_chain`). dsinks is present only when dSink is
requested (flag `has_dsinks`); sinks then too. lse is read natively from its
declared strides. Rows and tokens outside every sequence get dQ = 0; dense
padding rows of dK / dV get 0; THD tokens past cu_seqlens_kv[B] are not written.
"""

FWD_DOC = __doc__
