"""The wgmma backward main kernel compiles for sm_90a without a GPU; its PTX holds what the design asks for.

Covering set: every head dim and tile height, fp16, every mask flag, GQA and MQA, packed THD, padding masks,
sinks and the deterministic mode. Each PTX must hold wgmma, TMA bulk-tensor loads (and stores, dense), the
reduce-add of dQ (a tensor TMA of rows, or one 1D bulk reduce of a fragment-order tile written with 16-byte
stores), register reallocation and the frost symbol; the params validator rejects what the template does not
serve.
"""

from __future__ import annotations

import json
import re

import pytest

from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams, main_args, validate
from frost.errors import TemplateParamsError
from frost.engines.sdpa_bwd.chain import chain_of
from frost.testing.cases import (
    SM90_BWD_COVER,
    SM90_BWD_HEAD_DIM_COVER,
    SM90_BWD_ROWS_BARRIER_COVER,
    SM90_BWD_SCORE_MOD_COVER,
    SM90_BWD_WIDE_COVER,
    sm90_bwd_kwargs,
)
from test.compile_runner import compile_groups, run_compile_script


_p = sm90_bwd_kwargs
COVER = SM90_BWD_COVER + SM90_BWD_WIDE_COVER + [SM90_BWD_ROWS_BARRIER_COVER, SM90_BWD_SCORE_MOD_COVER]
TEMPLATE = "frost.engines.sm90.sdpa_bwd"
PARAMS = "frost.engines.sm90.sdpa_bwd_params.Sm90BwdParams"


@pytest.mark.slow
def test_covering_set_compiles_for_sm90a(tmp_path):
    groups = [("sm_90a", [(TEMPLATE, PARAMS, kw, None) for kw in part]) for part in COVER]
    results = [r for part in compile_groups(groups, tmp_path, timeout=600) for r in part]
    for kw, r in zip([kw for part in COVER for kw in part], results, strict=True):
        # a longest-first launch (`ranked_launch`) holds each warp's two votes of `ranked_batch`; the rest none
        assert r["ballot"] == (2 if Sm90BwdParams(**kw).ranked_launch else 0), r
        assert r["name"].startswith("frost_sdpa_bwd_main_sm90_"), r
        assert r["entries"] == [r["name"]], r
        assert r["target"] == ["sm_90a"], r
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r
        knobs = re.sub(r"^m\d+n\d+s\d", "", r["name"].rsplit("_", 1)[-1])  # the knob letters after the tiles
        if "f" in knobs:  # dq_fragments
            assert r["bulk_reduce"] == 1 and r["sts_v4"] > 0 and r["tma_reduce"] == 0, r
        elif "r" in knobs:  # dq_red: two columns per add, no shared dQ tile leaves
            assert r["red_v2"] > 0 and r["red"] == 0 and r["tma_reduce"] == r["bulk_reduce"] == 0, r
        else:
            assert r["tma_reduce"] > 0 and r["bulk_reduce"] == 0, r
        assert r["local"] == 0, r
        # programmatic dependent launch: the writer / rows warp (one wait) and the MMA warpgroups (another)
        assert r["pdl_wait"] == (2 if knobs.endswith("p") else 0), r
    assert len({r["name"] for r in results}) == len(results)
    suffixes = {re.sub(r"^m\d+n\d+s\d", "", r["name"].rsplit("_", 1)[-1]) for r in results}
    # every dQ path covered, the rows warp (on mbarriers and on named barriers), and the dependent launch
    assert {"fp", "rp", "p", "fwbp", "fwp"} <= suffixes


def test_validator_declines_what_the_template_lacks():
    for flags, word in (
        (dict(has_dsinks=True), "dsinks needs sinks"),
        (dict(tile_m=80, head_dim=64, head_dim_v=64, dq_fragments=False), "head_dim from 104 to 128"),
        (dict(tile_m=64, head_dim=80, head_dim_v=80, dq_fragments=True), r"pad to tiles of \(96, 80\)"),
        (dict(tile_m=128, head_dim=112, head_dim_v=112, dq_fragments=False), r"tiles of \(112, 112\) needs 240"),
        (dict(head_dim=100, head_dim_v=100), "d_qk=100 is not a multiple of 8"),
        (dict(head_dim=264, head_dim_v=264), "d_qk=264 is above 256"),
        (dict(head_dim=128, head_dim_v=12), "d_v=12 is not a multiple of 8"),
        (dict(tile_m=128), "registers"),
        (dict(tile_n=64, tile_m=80, dq_fragments=False), "tile_m=64"),
        (dict(tile_n=32, tile_m=64), "tile_n"),
        (dict(tile_m=80, dq_fragments=True), "serialize"),
        (dict(tile_m=64, dq_red=True, dq_fragments=True), "pick one"),
        (dict(tile_m=80, dq_red=True, dq_fragments=False), "transposes"),
        (dict(tile_m=80, head_dim=128, head_dim_v=64, dq_fragments=False), "head_dim_v == head_dim"),
        (dict(head_dim=256, head_dim_v=256, tile_m=64), "registers"),
        (
            dict(tile_m=64, dq_fragments=True, is_thd=True, has_seqused=True, token_div_q=512, token_div_kv=512),
            "ragged-offset form",
        ),
        (dict(tile_m=64, rows_warp=False, rows_mbar=True), "needs rows_warp"),
    ):
        with pytest.raises(TemplateParamsError, match=word):
            validate(Sm90BwdParams(**{**_p(), **flags}))
    for part in COVER + SM90_BWD_HEAD_DIM_COVER:
        for kw in part:
            validate(Sm90BwdParams(**kw))


def test_chain_wraps_the_main_kernel_in_the_shared_helpers():
    p = Sm90BwdParams(**_p(has_window_right=True))
    stages = chain_of(p)
    assert [s[0] for s in stages] == ["preprocess", "main", "postprocess"]
    assert stages[1][1] == TEMPLATE and stages[1][2] == main_args(p)
    for _, _, _, sp in (stages[0], stages[2]):
        assert sp.dq_accum_blocked is False and sp.dq_splits == 0 and sp.family == "sm90"
    assert stages[2][3].dq_accum_tile == p.tile_m == 64  # causal d=128: fragment-order tiles for the dQ convert
    assert "window_right" in main_args(p) and "max_seqlen_kv" not in main_args(p)
    det = Sm90BwdParams(**_p(deterministic=True))
    assert main_args(det)[main_args(det).index("dq_accum") + 1] == "dq_semaphore"
    assert "dq_semaphore" in chain_of(det)[0][2]  # the preprocess zeroes the turn counters
    thd = Sm90BwdParams(**_p(is_thd=True))
    assert main_args(thd)[7:9] == ["cu_seqlens_q", "cu_seqlens_kv"] and main_args(thd)[-2] == "max_seqlen_kv"
    sinks = Sm90BwdParams(**_p(has_sinks=True, has_dsinks=True))
    assert "sinks" not in main_args(sinks) and "dsinks" in chain_of(sinks)[2][2]  # the helpers compute dSink


@pytest.mark.parametrize("tile_m,d", [(80, 128), (128, 64), (64, 128), (64, 96), (64, 64)])
def test_fragment_order_is_a_bijection_of_the_tile(tile_m, d):
    """Every (row, column) of a tile is one register of one MMA thread, stored at its own word of the tile."""
    from frost.engines.sdpa_bwd.accum import FRAGMENT_THREADS, fragment_coord, fragment_offset

    n = tile_m * d // FRAGMENT_THREADS
    coords, offsets = set(), set()
    for t in range(FRAGMENT_THREADS):
        for i in range(n):
            r, c = fragment_coord(tile_m, d, t, i)
            assert 0 <= r < tile_m and 0 <= c < d
            coords.add((r, c))
            offsets.add(fragment_offset(tile_m, d, t, i))
        # each thread's registers leave four at a time, side by side
        assert all(
            fragment_offset(tile_m, d, t, i) + 1 == fragment_offset(tile_m, d, t, i + 1) for i in range(n) if i % 4 != 3
        )
    assert len(coords) == len(offsets) == tile_m * d and offsets == set(range(tile_m * d))


def test_default_knobs_pick_the_dq_path_per_head_dim_and_band():
    from frost.engines.sm90.sdpa_bwd_knobs import default_knobs

    assert default_knobs(128, 128) == dict(
        tile_m=64, tile_n=128, num_stages=2, dq_fragments=True, rows_warp=True, rows_mbar=True
    )
    assert default_knobs(128, 128, packed=True) == dict(
        tile_m=80, tile_n=128, num_stages=2, dq_fragments=False, rows_warp=True, rows_mbar=True
    )
    # the rows warp where it was measured: d = 64, 96, 128; dense padded 64-row tiles (d_qk 72-88) and the 80-row
    # kernel at d_qk 104 / 112 (run 18); not the d=128 80-row kernel (serialized), d=120's, d=112 under a band, packed
    # padded tiles or d_qk != d_v
    assert all(
        default_knobs(d, d, banded=b, packed=pk)["rows_warp"]
        for d in (64, 96, 128)
        for b in (False, True)
        for pk in (False, True)
    )
    assert all(default_knobs(d, d, banded=b)["rows_warp"] for d in (72, 80, 88) for b in (False, True))
    assert default_knobs(112, 112)["rows_warp"] and default_knobs(104, 104)["rows_warp"]
    assert not default_knobs(128, 128, tile_m=80)["rows_warp"] and not default_knobs(120, 120)["rows_warp"]
    assert not default_knobs(112, 112, banded=True)["rows_warp"] and not default_knobs(80, 80, packed=True)["rows_warp"]
    assert not default_knobs(128, 64)["rows_warp"] and not default_knobs(80, 64)["rows_warp"]
    # 80 rows only with equal head dims: d_qk = 128 over d_v = 64 on 80 rows was wrong on the H200 (run 20)
    assert default_knobs(128, 64, packed=True)["tile_m"] == 64 and default_knobs(120, 64)["tile_m"] == 64
    assert default_knobs(112, 112, packed=True)["tile_m"] == 80 and default_knobs(120, 120)["tile_m"] == 80
    assert default_knobs(128, 128, banded=True)["tile_m"] == 64 and default_knobs(128, 128, banded=True)["dq_fragments"]
    assert default_knobs(64, 64)["dq_fragments"] and default_knobs(96, 96)["dq_fragments"]
    # packed tiles up to 64 wide add dQ in fragment order as well (each sequence's own tiles), but not in cuDNN's
    # ragged form (sequences anywhere) nor where a tile is not whole (16-wide tiles of 8 columns)
    assert default_knobs(64, 64, packed=True)["dq_fragments"] and default_knobs(32, 48, packed=True)["dq_fragments"]
    assert not default_knobs(64, 64, packed=True, ragged=True)["dq_fragments"]
    assert not default_knobs(8, 8, packed=True)["dq_fragments"]
    assert not default_knobs(96, 96, packed=True)["dq_fragments"]
    assert not default_knobs(64, 64, tile_m=80)["dq_fragments"]  # a requested knob keeps the plan valid
    assert default_knobs(256, 256) == dict(tile_m=64, tile_n=64, num_stages=1, dq_red=False, dq_fragments=True)
    assert default_knobs(192, 128)["num_stages"] == 2
    assert default_knobs(192, 128)["tile_n"] == 64 and default_knobs(192, 128)["dq_fragments"]
    assert not default_knobs(192, 128, packed=True)["dq_fragments"]
    for d, dv in ((64, 64), (96, 96), (128, 128), (192, 128), (256, 256)):
        for banded in (False, True):
            for packed in (False, True):
                validate(Sm90BwdParams(**_p(d=d, dv=dv, has_window_right=banded, is_thd=packed)))


def test_the_dq_convert_of_a_fragment_tile_compiles_with_16_byte_accesses(tmp_path):
    from frost.engines.sdpa_bwd.chain import stage_params

    p = Sm90BwdParams(**_p(d=64))
    sp = stage_params(p, "postprocess")
    assert p.dq_accum_tile == sp.dq_accum_tile == 128
    spec = ("frost.engines.sdpa_bwd.postprocess", "frost.engines.sdpa_bwd.chain.BwdHelperParams", sp.model_dump(), None)
    [[r]] = compile_groups([("sm_90a", [spec])], tmp_path, timeout=600)
    assert r["name"].endswith("_qf128_pdl"), r
    assert r["local"] == 0 and r["ldg_v4"] > 0 and r["stg_v4"] > 0, r
    assert r["pdl_wait"] == 1, r  # launched as the main kernel's dependent: it waits for the dQ partials


@pytest.mark.parametrize(
    "kw",
    [dict(d=64), dict(d=128), dict(d=128, has_window_right=True), dict(is_thd=True)],
    ids=["d64_fragments", "d128_rows", "d128_causal_fragments", "thd_rows"],
)
def test_helpers_take_a_padded_accumulator_as_its_own_extent(kw):
    """A fragment-order accumulator has whole tiles of rows, more than Sq: the helpers' fake dq_accum must
    not share the query rows' symbol (else binding a real padded accumulator fails), and a row accumulator must."""
    from frost.engines.sdpa_bwd import postprocess, preprocess
    from frost.engines.sdpa_bwd.chain import postprocess_args, preprocess_args, stage_params

    p = Sm90BwdParams(**_p(**kw))
    for mod, args, stage, rows_of in (
        (preprocess, preprocess_args, "preprocess", "o"),
        (postprocess, postprocess_args, "postprocess", "dq"),
    ):
        sp = stage_params(p, stage)
        _, fakes = mod.build(sp, "sm_90a")
        names = args(sp)
        acc, io = fakes[names.index("dq_accum")], fakes[names.index(rows_of)]
        acc_rows, io_rows = (acc.shape[1], io.shape[0]) if p.is_thd else (acc.shape[2], io.shape[2])
        assert (str(acc_rows) != str(io_rows)) == (p.dq_accum_tile > 0), (stage, acc.shape, io.shape)


@pytest.mark.parametrize(
    "d, dv, knobs, tiles",
    [
        ((80, 80), {}, dict(tile_m=64), (96, 80)),
        ((112, 112), {}, dict(tile_m=80), (128, 112)),
        ((112, 112), dict(banded=True), dict(tile_m=64), (128, 112)),
        ((72, 40), {}, dict(tile_m=64), (96, 48)),
        ((40, 40), {}, dict(tile_m=128), (48, 48)),
        ((8, 8), {}, dict(tile_m=128), (16, 16)),
        ((8, 8), dict(packed=True), dict(tile_m=64), (32, 16)),
        ((128, 64), {}, dict(tile_m=64), (128, 64)),
        ((64, 128), {}, dict(tile_m=64), (64, 128)),
        ((192, 64), {}, dict(tile_n=64, num_stages=2), (192, 64)),
        ((160, 160), {}, dict(tile_n=64, num_stages=2), (160, 160)),
        ((200, 200), {}, dict(tile_n=64, num_stages=1), (224, 224)),
        ((256, 64), {}, dict(tile_n=64, num_stages=2), (256, 64)),
    ],
)
def test_default_knobs_of_the_other_head_dims_follow_their_tiles(d, dv, knobs, tiles):
    """Every other head dim takes the knobs of its tiles' width (up to 64: 128 rows, 96: 64 rows, 128: as d=128
    where d_qk allows the 80-row kernel, above: shared keys, two stages where they fit; packed tiles of 16 columns
    take 64 rows); dQ leaves in fragment order only from unpadded tiles."""
    from frost.engines.sm90.sdpa_bwd_knobs import default_knobs

    (d, dv), kw = d, dv
    k = default_knobs(d, dv, **kw)
    assert {n: k[n] for n in knobs} == knobs
    p = Sm90BwdParams(**_p(d=d, dv=dv, has_window_right=kw.get("banded", False), is_thd=kw.get("packed", False)))
    assert (p.tile_head_dim, p.tile_head_dim_v) == tiles
    assert p.dq_fragments == (tiles == (d, dv) and p.tile_m % 64 == 0)
    validate(p)


_PTXAS_SCRIPT = """
import json, os, re, subprocess, sys, tempfile
from test.compile_runner import find_ptxas, ptx_facts
from frost.compiler.compile import compile_kernel
from frost.engines.sm90.sdpa_bwd_params import Sm90BwdParams
out = []
ptxas = find_ptxas()
for kw in json.loads(sys.argv[1]):
    ck = compile_kernel("frost.engines.sm90.sdpa_bwd", Sm90BwdParams(**kw), "sm_90a")
    facts = ptx_facts(ck)
    if ptxas:
        d = tempfile.mkdtemp()
        path = os.path.join(d, "k.ptx")
        open(path, "w").write(ck.ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
        log = r.stdout + r.stderr
        facts["ptxas"] = dict(rc=r.returncode, spills=[int(n) for n in re.findall(r"(\\d+) bytes spill", log)],
                              serialized="serialized" in log, log=log[-2000:])
    out.append(facts)
print("RESULT " + json.dumps(out))
"""


#: what ptxas may spill in a 64-row kernel on padded tiles with the rows warp (d_qk 72 to 88): one 8-byte value
#: stored and reloaded per step inside the rows warp, which runs on the producer warpgroup's 24 registers (stores +
#: loads); the MMA warpgroups spill nothing (measured 1.04-1.06x faster than without the rows warp at d=80, run 18)
ROWS_WARP_SPILL_BYTES = 16


def test_the_other_head_dims_compile_with_padded_tiles(tmp_path):
    """Head dims between the tuned ones (padded tiles, unequal pairs, fragment tiles of whole tiles), dense and
    packed: wgmma, TMA loads (zero-filling the tiles' columns past the head dim) and stores, the dQ path of the
    knobs, no local memory, and (where ptxas is installed) no spills and no serialized wgmmas."""
    from concurrent.futures import ThreadPoolExecutor

    def one(part):
        return run_compile_script(_PTXAS_SCRIPT, [json.dumps(part)], tmp_path, timeout=900)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = [r for part in pool.map(one, SM90_BWD_HEAD_DIM_COVER) for r in part]
    kws = [kw for part in SM90_BWD_HEAD_DIM_COVER for kw in part]
    assert {(kw["head_dim"], kw["head_dim_v"]) for kw in kws} >= {
        (80, 80),
        (112, 112),
        (72, 40),
        (128, 64),
        (192, 64),
        (160, 160),
    }
    for kw, r in zip(kws, results):
        p = Sm90BwdParams(**kw)
        assert r["name"].startswith("frost_sdpa_bwd_main_sm90_") and r["entries"] == [r["name"]], r
        assert r["wgmma_mma_async"] > 0 and r["tma"] > 0 and r["setmaxnreg"] == 2, r
        if p.dq_fragments:
            assert r["bulk_reduce"] == 1 and r["tma_reduce"] == 0, r
        elif p.dq_red:
            assert r["red_v2"] > 0 and r["red"] == 0 and r["tma_reduce"] == r["bulk_reduce"] == 0, r
        else:
            assert r["tma_reduce"] > 0 and r["bulk_reduce"] == 0, r
        assert r["local"] == 0, r
        if "ptxas" in r:
            allowed = ROWS_WARP_SPILL_BYTES if p.rows_warp and p.padded and p.tile_m == 64 else 0
            assert r["ptxas"]["rc"] == 0 and sum(r["ptxas"]["spills"]) <= allowed, (r["name"], r["ptxas"])
            assert not r["ptxas"]["serialized"], (r["name"], r["ptxas"]["log"])
    assert any(Sm90BwdParams(**kw).padded for kw in kws) and any(Sm90BwdParams(**kw).dq_fragments for kw in kws)
    assert any(Sm90BwdParams(**kw).rows_warp and Sm90BwdParams(**kw).padded for kw in kws)


def test_packed_fragment_tiles_give_each_sequence_its_own_tiles():
    """Packed batches with fragment-order dQ tiles (`dq_fragments` on THD): sequence b's tiles start at the tile of
    its first token plus b, so no two sequences share a tile and all fit in (T // tile + B + 1) tiles per head;
    the dQ convert walks (sequence, tile) from the prefix sums."""
    import random

    from frost.engines.sdpa_bwd.accum import packed_acc_tile
    from frost.engines.sdpa_bwd.chain import chain_of, packed_fragments
    from frost.engines.sdpa_bwd.scratch import packed_acc_rows, scratch_layout
    from frost.testing.cases import SM90_BWD_PACKED_FRAGMENT_COVER

    rng = random.Random(7)
    for tile in (64, 128):
        for _ in range(200):
            lens = [rng.choice([0, 1, 5, 63, 64, 65, 127, 128, 129, 300, 513]) for _ in range(rng.randint(1, 9))]
            starts = [sum(lens[:b]) for b in range(len(lens))]
            total = sum(lens)
            used = []
            for b, (s, n) in enumerate(zip(starts, lens)):
                first = packed_acc_tile(s, b, tile)
                used += [first + m for m in range(-(-n // tile))]
            assert len(used) == len(set(used)), (tile, lens)
            assert max(used, default=0) < total // tile + len(lens) + 1, (tile, lens)
    p = Sm90BwdParams(**SM90_BWD_PACKED_FRAGMENT_COVER[0])
    validate(p)
    assert packed_fragments(p) and p.dq_accum_tile == p.tile_m == 128
    layout = {n: shape for n, _, shape in scratch_layout(p, 3, 500, 500, total_q=1000, total_kv=1000)}
    assert layout["dq_accum"] == (p.num_heads_q, packed_acc_rows(p, 1000, 3), p.head_dim) == (4, (7 + 4) * 128, 64)
    post = {stage: names for stage, _, names, _ in chain_of(p)}["postprocess"]
    assert "cu_seqlens_q" in post and "max_seqlen_q" in post


@pytest.mark.slow
def test_packed_fragment_tiles_compile_for_sm90a(tmp_path):
    from frost.engines.sdpa_bwd.chain import chain_of
    from frost.testing.cases import SM90_BWD_PACKED_FRAGMENT_COVER

    helper = "frost.engines.sdpa_bwd.chain.BwdHelperParams"
    specs = [
        (t, PARAMS if stage == "main" else helper, sp.model_dump(), stage)
        for kw in SM90_BWD_PACKED_FRAGMENT_COVER
        for stage, t, _, sp in chain_of(Sm90BwdParams(**kw))
    ]
    results = [r for part in compile_groups([("sm_90a", specs)], tmp_path, timeout=900) for r in part]
    assert len(results) == 6
    for r in results:
        assert r["local"] == 0, r
        if r["tag"] == "main":
            assert r["bulk_reduce"] == 1 and r["tma_reduce"] == 0, r  # one bulk reduce of a flat tile
