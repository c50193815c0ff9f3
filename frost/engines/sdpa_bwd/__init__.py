"""The backward skeleton every SDPA backward shares: a chain of three kernels on one stream.

1. preprocess (`preprocess.py`): dpsum = rowsum(dO * O), zeroes the fp32 dQ accumulator (every copy), the
   turn semaphores and the fp32 dBias accumulator (`dbias_accum`), and writes the per-block partial sums of
   dSink.
2. main (the arch's own template): dK and dV, and dQ partials added into the fp32 accumulator.
3. dQ convert (`postprocess.py`): dQ = accumulator (copies summed in order) * scale in the io dtype,
   dSink from its partials, and dBias from its accumulator.

The helper kernels use plain loads and stores only, so any main kernel can sit between them. A main
kernel whose params carry `pdl=True` (the SM90 backward) is launched as a programmatic dependent of the
preprocess and waits for it (`griddepcontrol.wait`) before its first read of the preprocess's output; the
dQ convert of such a chain is launched the same way after it. What
a backward provides to join the chain:

- a params class (a frozen `SdpaFeatureParams` subclass, the `BwdChainParams` protocol of
  `chain.py`): the feature flags, `family` (how its kernel names begin), `deterministic`,
  `has_dsinks`, `dbias_accum` (with `dbias_accum_per_batch` / `_per_head`: a dBias the main kernel adds
  into an fp32 accumulator), `tile_m` (query rows per semaphore), `pdl` (its main kernel waits for the
  preprocess itself, so the chain launches as programmatic dependents), and the dQ accumulator layout:
  `dq_accum_blocked` (8x8 blocks, dense only, or plain rows), `dq_accum_tile` (m > 0: dense tiles
  of m rows in the SM90 wgmma fragment order, `accum.fragment_coord`; rows padded to whole tiles) and
  `dq_splits` (0: one accumulator; n >= 1: n copies stacked along its batch mode, each written by one
  CTA, with no turns);
- its params module (the module that defines its params class) exposes `MAIN_TEMPLATE` (the main template's dotted
  module path), `main_args(params)` (the main kernel's argument names, from `sdpa_args` and the scratch names of
  `scratch.py`) and `validate(params)`; its default knobs live beside it (`sdpa_bwd_knobs`), read by the
  arch adapter's `plan_knobs`;
- the main template module exposes `kernel_name(params, arch)` and `build(params, arch)` like any
  template, taking its scratch fakes from `accum.scratch_fake`.

`chain.chain_of(params)` (`bwd_chain(params, MAIN_TEMPLATE, main_args(params))`) then lists the three kernels with their
argument names and compile params (the helpers compile from a small `BwdHelperParams` record, so
main-kernel knobs never compile a helper twice); `scratch.scratch_layout` sizes the workspace;
`frost.adapters.dsl_bwd.DslBwdAdapter` compiles, carves and launches the chain. Only `accum.py`,
`preprocess.py` and `postprocess.py` import cutlass.
"""
