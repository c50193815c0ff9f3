"""tools/kernel_ir.py sorts kernel MLIR changes into identical, reordered and different."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "kernel_ir.py"
_spec = importlib.util.spec_from_file_location("kernel_ir", _TOOL)
kernel_ir = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernel_ir)

A = """%0 = arith.muli %arg1, %c128_i32 : i32
%view_3 = cute.make_view(%iter_1, %lay_2) : !memref
%1 = arith.addi %0, %view_3 : i32"""
# the same two independent ops swapped, SSA names shifted
B = """%view_3 = cute.make_view(%iter_1, %lay_2) : !memref
%5 = arith.muli %arg1, %c128_i32 : i32
%1 = arith.addi %5, %view_3 : i32"""
C = A.replace("arith.muli", "arith.subi")


def test_classify():
    assert kernel_ir.classify(A, A) == "identical"
    assert kernel_ir.classify(A, B) == "reordered"
    assert kernel_ir.classify(A, C) == "different"


def test_locations_are_stripped():
    text = '%0 = arith.addi %a, %b : i32 loc(#loc3)\n#loc3 = loc("x.py":1:2)\n%1 = foo loc(fused[#loc1, #loc2])'
    assert kernel_ir.strip_locations(text) == "%0 = arith.addi %a, %b : i32\n%1 = foo"


def test_diff_reports_the_worst(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "00_k.mlir").write_text(A)
    (b / "00_k.mlir").write_text(B)
    assert kernel_ir.diff(a, b) == 1
    (b / "01_only.mlir").write_text(A)
    assert kernel_ir.diff(a, b) == 2


def test_diff_matches_kernels_by_name_not_index(tmp_path, capsys):
    """A kernel added to the covering set shifts the index of every later one: diff pairs them by name."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "00_first.mlir").write_text(A)
    (a / "01_second.mlir").write_text(A)
    (b / "00_first.mlir").write_text(A)
    (b / "01_new.mlir").write_text(C)
    (b / "02_second.mlir").write_text(B)
    assert kernel_ir.diff(a, b) == 2
    out = capsys.readouterr().out
    assert "reordered  second.mlir" in out and "identical  first.mlir" in out and "only in" in out
    assert out.count("only in") == 1


def test_a_name_dumped_twice_is_paired_by_occurrence(tmp_path, capsys):
    """One kernel name for two archs, with kernels added before the second copy: each copy pairs with its own."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "00_twice.mlir").write_text(A)
    (a / "01_twice.mlir").write_text(C)
    (b / "00_twice.mlir").write_text(A)
    (b / "01_new.mlir").write_text(B)
    (b / "02_newer.mlir").write_text(B)
    (b / "10_twice.mlir").write_text(C)
    assert kernel_ir.diff(a, b) == 2  # the new ones
    out = capsys.readouterr().out
    assert "identical  twice.mlir\n" in out and "identical  twice.mlir#2" in out and out.count("only in") == 2


def test_a_changed_dataflow_is_not_a_reorder():
    # a butterfly sum whose shuffle offsets swap: the same op lines, another summation order
    first = """%1 = nvvm.shfl.sync bfly %0, %c1 : f32
%2 = arith.addf %0, %1 : f32
%3 = nvvm.shfl.sync bfly %2, %c2 : f32
%4 = arith.addf %2, %3 : f32"""
    swapped = first.replace("%c1", "%cX").replace("%c2", "%c1").replace("%cX", "%c2")
    assert kernel_ir.classify(first, swapped) == "different"
    # a store moved across a barrier keeps every line but not the order of the ordered ones
    a = "%1 = arith.addf %0, %0 : f32\nmemref.store %1, %m[%c0]\nnvvm.barrier0"
    b = "%1 = arith.addf %0, %0 : f32\nnvvm.barrier0\nmemref.store %1, %m[%c0]"
    assert kernel_ir.classify(a, b) == "different"


def test_empty_dumps_are_not_identical(tmp_path, capsys):
    """A compile that kept no MLIR writes an empty file: two of them prove nothing, so diff does not call them
    identical."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "k.mlir").write_text("")
    (b / "k.mlir").write_text("")
    assert kernel_ir.diff(a, b) == 2
    assert "empty" in capsys.readouterr().out
