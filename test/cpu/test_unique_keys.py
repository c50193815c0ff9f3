"""Tensor names and uids key the variant pack: a graph never holds two tensors with one name or one chosen uid."""

from __future__ import annotations

import pytest
import torch

import frost
from frost.errors import GraphError


def _g():
    return frost.Graph(
        io_data_type=torch.float32, intermediate_data_type=torch.float32, compute_data_type=torch.float32
    )


NAME_TAKEN = (
    "graph 'frost_graph': tensor name 'q' is already taken (the tensor of uid {uid}); names key the "
    "variant pack, so each is used once per graph"
)


def test_duplicate_names_raise_at_declaration_and_in_set_name():
    g = _g()
    q = g.tensor((1, 2, 8, 16), name="q")
    with pytest.raises(GraphError) as ei:
        g.tensor((1, 2, 8, 16), name="q")
    assert str(ei.value) == NAME_TAKEN.format(uid=q.uid)
    k = g.tensor((1, 2, 8, 16), name="k")
    with pytest.raises(GraphError) as ei:
        k.set_name("q")
    assert str(ei.value) == NAME_TAKEN.format(uid=q.uid)
    assert k.name == "k"
    k.set_name("k")  # its own name again is fine
    with pytest.raises(GraphError, match="set_name takes a non-empty string"):
        k.set_name("")


def test_a_virtual_output_cannot_take_a_declared_name():
    g = _g()
    q = g.tensor((1, 2, 8, 16), name="sdpa::O")
    k, v = g.tensor((1, 2, 8, 16), name="k"), g.tensor((1, 2, 8, 16), name="v")
    with pytest.raises(GraphError, match="tensor name 'sdpa::O' is already taken"):
        g.sdpa(q, k, v, attn_scale=0.25)


def test_unnamed_tensors_get_free_labels():
    g = _g()
    g.tensor((1, 2), name="tensor_1")
    a, b = g.tensor((1, 2)), g.tensor((1, 2))
    assert len({a.name, b.name, "tensor_1"}) == 3


def test_duplicate_chosen_uids_raise_in_tensor_and_set_uid():
    g = _g()
    q = g.tensor((1, 2), name="q", uid=5)
    with pytest.raises(GraphError) as ei:
        g.tensor((1, 2), name="k", uid=5)
    assert str(ei.value) == (
        "tensor 'k': uid 5 is already tensor 'q''s; uids key the variant pack, so each is used once per graph"
    )
    k = g.tensor((1, 2), name="k")
    with pytest.raises(GraphError) as ei:
        k.set_uid(5)
    assert str(ei.value) == (
        "tensor 'k': uid 5 is already tensor 'q''s; uids key the variant pack, so each is used once per graph"
    )
    assert q.uid == 5 and k.uid != 5
    with pytest.raises(GraphError, match="uid must be an int >= 0, got 'x'"):
        k.set_uid("x")


def test_a_chosen_uid_moves_an_automatic_one_aside():
    """cuDNN programs pick small uids; a tensor that was only numbered automatically steps aside."""
    g = _g()
    a = g.tensor((1, 2), name="a")
    b = g.tensor((1, 2), name="b")
    b.set_uid(a.uid)
    assert b.uid != a.uid and len({t.uid for t in g.tensors}) == 2


def test_one_tensor_cannot_feed_two_ports_through_a_name():
    """Before: two tensors named 'x' made a pack keyed by name feed one tensor to both ports."""
    g = _g()
    g.tensor((1, 2, 8, 16), name="x")
    with pytest.raises(GraphError, match="tensor name 'x' is already taken"):
        g.tensor((1, 2, 8, 16), name="x")
