"""What may cross back from the sandbox (tutorials/assignments/replies.py), checked piece by piece.

A reply is written by student code: every node of it that is not data, or not a change of the
caller's own thing of the kind it was, is refused, and a refused reply writes nothing. These run
without the sandbox: they build replies by hand, as a hostile student would, and hand them to the
grader's side.
"""
import functools
import json

import numpy as np
import pytest

from minidl.flat import FlatParameters, absent
from minidl.tensor import Parameter, Tensor
from tests.helpers import fill
from tutorials.assignments import channel, replies, values


def reply(spec, updates=(), **arrays):
    return {"__reply__": np.array(json.dumps({"return": spec, "updates": list(updates)})), **arrays}


def through(result, args, change=None):
    """``result`` of a call of ``args`` as the sandbox would reply it: sent, built there, changed by
    ``change(theirs)``, packed; returns (the caller's ``args``, the arrays of the reply, sent)."""
    arrays, sent = values.pack_call({"args": args})
    message, seen = values.unpack_call(crossed(arrays), importing=True)
    before = replies.snapshot(seen)
    if change is not None:
        result = change(message["args"])
    return crossed(replies.pack_reply(result, seen, before)), sent


def crossed(arrays):
    """``arrays`` as the other side reads them: through a frame's bytes (nothing shared)."""
    return channel.parse(channel.pack(arrays)[8:])


def test_plain_data_crosses_back_exactly():
    value = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "one": np.float32(0.5), "shape": (2, 3),
             "big": 10 ** 30, "nan": float("nan"), "flags": [True, None, "gpipe"], "dtype": np.dtype("<f4"),
             "steps": range(1, 9, 2), "keys": {1, 2}, "nested": [{"a": (1, 2.5)}]}
    arrays, sent = through(value, ())
    back = replies.unpack_reply(arrays, sent)
    assert back["x"].dtype == np.float32 and back["x"].shape == (2, 3) and np.array_equal(back["x"], value["x"])
    assert type(back["one"]) is np.float32 and back["shape"] == (2, 3) and back["big"] == 10 ** 30
    assert np.isnan(back["nan"]) and back["flags"] == [True, None, "gpipe"] and back["dtype"] == np.float32
    assert back["steps"] == range(1, 9, 2) and back["keys"] == {1, 2} and back["nested"] == [{"a": (1, 2.5)}]


@pytest.mark.parametrize("node", [
    ["object", 0, "subprocess:Popen", []],
    ["object", 0, "minidl.tensor:Tensor", [["data", ["array", "v0"]]]],
    ["function", "tests.helpers", "mpiexec"],
    ["function", "os", "system"],
    ["closure", 0, "minidl.gradcheck", "gradcheck.<locals>.loss", 0, [], ["atom", None], ["atom", None]],
    ["method", ["atom", 1], "backward"],
    ["partial", 0, ["function", "tests.helpers", "mpiexec"], ["tuple", []], ["dict", []]],
    ["module", "os"],
    ["namedtuple", "collectives.model.cost:RankCost", [["int", "1"], ["int", "2"], ["int", "3"]]],
    ["dataclass", "algorithms.core.run:Run", []],
    ["generator", "{}"],
    ["comm", 0, 0, 1],
    ["lambda", "print"],
], ids=lambda node: node[0])
def test_a_reply_that_names_anything_but_data_is_refused(node):
    with pytest.raises(ValueError, match="only data"):
        replies.unpack_reply(reply(["list", [["int", "1"], node]], v0=np.zeros(2)), {})


def test_a_crafted_reply_is_refused_and_writes_nothing():
    mine = np.zeros(3)
    arrays, sent = values.pack_call({"args": (mine,)})
    number = next(n for n, thing in sent.items() if thing is mine)
    for spec, why in [
        (["int", "1" + "0" * 6000], "kind 'int'"),
        (["array", "__reply__"], "kind 'array'"),
        (["array", "v7"], "not an array of the reply"),
        (["dict", [[["list", []], ["atom", 1]]]], "unhashable"),
        (["sent", 99], "kind 'sent'"),
    ]:
        crafted = reply(spec, [["array", number, ["array", "v0"]]], v0=np.full(3, 7.0))
        with pytest.raises(ValueError, match=why):
            replies.unpack_reply(crafted, sent)
        assert not mine.any(), f"{spec}: the caller's array was written before the reply was refused"
    too_deep = '["list", [' * 300 + '["atom", null]' + "]]" * 300
    with pytest.raises(ValueError, match="too deep"):
        replies.unpack_reply({"__reply__": np.array('{"return": ' + too_deep + ', "updates": []}')}, sent)
    with pytest.raises(ValueError, match="JSONDecodeError"):
        replies.unpack_reply({"__reply__": np.array("{")}, sent)


def test_a_call_that_changed_an_array_in_place_writes_it_into_the_callers_own_and_views_stay_views():
    flat = FlatParameters([Parameter(np.zeros((2, 3))), Parameter(np.zeros(4))])

    def change(args):
        args[0].parameters[0].data += 1.0                       # through a view: the flat vector moves too
    arrays, sent = through(None, (flat,), change)
    replies.unpack_reply(arrays, sent)
    assert flat.data[:6].tolist() == [1.0] * 6 and flat.data[6:].tolist() == [0.0] * 4
    assert flat.parameters[0].data.base is flat.data, "written in place: still a view of the flat vector"


def test_a_read_only_stand_in_that_comes_back_as_it_was_stays_and_one_that_changed_is_replaced():
    """A weight let go (``minidl.flat.absent``: read-only, no memory) that the call let go again is left
    alone; given values, the field takes them (it cannot be written in place)."""
    weight, other = Parameter(np.zeros((2, 3))), Parameter(np.zeros(2))
    weight.data, other.data = absent((2, 3), np.float64), absent((2,), np.float64)
    stand_in = weight.data

    def change(args):
        args[0].data = absent((2, 3), np.float64)               # gathered, used and let go: a new stand-in
        args[1].data = np.arange(2.0)
    arrays, sent = through(None, (weight, other), change)
    replies.unpack_reply(arrays, sent)
    assert weight.data is stand_in, "an unchanged stand-in is kept"
    assert other.data.tolist() == [0.0, 1.0], other.data


def test_an_array_field_may_come_back_with_another_shape_as_data_in_a_new_array():
    """A layer that keeps its input (sufficient factors' ``x``) keeps this batch's: another shape than the
    last batch's. The field is given the new array; the old one is not written; a function never crosses.
    (A Tensor's data keeps its shape and dtype: the test above.)"""
    from algorithms.sufficient_factors import Factored
    from minidl.nn import Linear
    layer = Factored(Linear(3, 2, rng=np.random.default_rng(0)))
    layer.x = old = np.zeros((4, 3))

    def change(args):
        args[0].x = np.ones((2, 3), np.float32)                 # a smaller last batch, in another dtype
    arrays, sent = through(None, (layer,), change)
    replies.unpack_reply(arrays, sent)
    assert layer.x.shape == (2, 3) and layer.x.dtype == np.float32 and layer.x.all() and not old.any()
    with pytest.raises(TypeError, match="cannot cross back"):                 # refused as the reply is packed
        through(None, (layer,), lambda args: setattr(args[0], "x", print))


def test_a_task_that_returns_its_result_may_change_nothing_it_was_given():
    mine = np.ones(3)

    def change(args):
        args[0][...] = 0                                    # zero the operand, so that a later check would expect zeros
        return np.zeros(3)
    arrays, sent = through(None, (mine,), change)
    with pytest.raises(ValueError, match="changed what it was given"):
        replies.unpack_reply(arrays, sent, updates=False)
    assert mine.tolist() == [1.0] * 3
    assert replies.unpack_reply(arrays, sent).tolist() == [0.0] * 3 and not mine.any()   # where changes are the task
    rng = np.random.default_rng(5)                          # drawing from a generator it is handed is no change
    arrays, sent = through(None, (rng,), lambda args: args[0].integers(10))
    replies.unpack_reply(arrays, sent, updates=False)
    assert rng.integers(1 << 30) == np.random.default_rng(5).integers(1 << 30, size=2)[1]


@pytest.mark.parametrize("update, why", [
    (["array", "N", ["array", "v0"]], r"came back as float32\[3\], was float64\[3\]"),
    (["array", "N", ["atom", "x"]], "came back as str"),
    (["array", 99, ["array", "v0"]], "did not send"),
    (["list", "N", ["list", []]], "an update of kind 'list' for a ndarray"),
])
def test_an_array_comes_back_only_as_an_array_of_its_shape_and_dtype(update, why):
    mine = np.zeros(3)
    arrays, sent = values.pack_call({"args": (mine,)})
    update = [next(n for n, thing in sent.items() if thing is mine) if part == "N" else part for part in update]
    with pytest.raises(ValueError, match=why):
        replies.unpack_reply(reply(["atom", None], [update], v0=np.ones(3, dtype=np.float32)), sent)
    assert not mine.any()


def test_an_objects_fields_keep_their_kind_and_no_field_is_added_removed_or_made_a_function():
    tensor = Tensor(np.zeros(3))
    tensor.note, tensor.count, tensor.children = "kept", 2, [Tensor(np.ones(1))]
    summing = functools.partial(fill, 0)
    arrays, sent = values.pack_call({"args": (tensor, summing)})
    number = next(n for n, thing in sent.items() if thing is tensor)
    partial = next(n for n, thing in sent.items() if thing is summing)
    for fields, deleted, why in [
        ([["count", ["atom", "two"]]], [], "was a int, came back as a str"),
        ([["note", ["list", []]]], [], "was a str, came back as a list"),
        ([["backward", ["int", "1"]]], [], "that the call did not send"),
        ([["__class__", ["int", "1"]]], [], "that the call did not send"),
        ([], ["note"], "deleted its field 'note'"),
        ([["_backward", ["sent", partial]]], [], "nothing that runs crosses back"),
        ([["data", ["array", "v0"]]], [], r"was a ndarray, came back as a ndarray"),
    ]:
        crafted = reply(["atom", None], [["fields", number, [["count", ["int", "3"]], *fields], deleted]],
                        v0=np.zeros(4))
        with pytest.raises(ValueError, match=why):
            replies.unpack_reply(crafted, sent, tensor_class=Tensor)      # as the grader calls it
        assert tensor.count == 2 and tensor.note == "kept" and tensor._backward is None, "nothing written"
    replies.unpack_reply(reply(["atom", None], [["fields", number, [["count", ["int", "3"]],
                                                                    ["data", ["array", "v0"]]], []]],
                               v0=np.full(3, 5.0)), sent)
    assert tensor.count == 3 and tensor.data.tolist() == [5.0] * 3


def test_a_callable_objects_counter_comes_back_and_a_class_default_is_a_field_of_its_kind():
    from tests.handed import Summing  # calls = 0 on the class; each call counts on the object
    summing = Summing()

    def change(args):
        args[0](np.ones(2))
        args[0](np.ones(2))
    arrays, sent = through(None, (summing,), change)
    replies.unpack_reply(arrays, sent)
    assert summing.calls == 2
    number = next(n for n, thing in sent.items() if thing is summing)
    for value, why in ((["atom", "two"], "was a int, came back as a str"),
                       (["list", []], "was a int, came back as a list")):
        with pytest.raises(ValueError, match=why):
            replies.unpack_reply(reply(["atom", None], [["fields", number, [["calls", value]], []]]), sent)
    with pytest.raises(ValueError, match="that the call did not send"):        # a method's name is no field
        replies.unpack_reply(reply(["atom", None], [["fields", number, [["__call__", ["int", "1"]]], []]]), sent)
    assert summing.calls == 2


def test_a_tensor_comes_back_rebuilt_here_and_its_backward_is_a_handle_for_the_sandbox():
    x = Tensor(fill(0, 3, "float64"), requires_grad=True)
    arrays, sent = values.pack_call({"args": (x,)})
    number = next(n for n, thing in sent.items() if thing is x)
    spec = ["tensor", 0, ["array", "v0"], ["atom", None], True, "copy_to_parallel", [["sent", number]], 7]
    asked = []
    out = replies.unpack_reply(reply(spec, v0=np.full(3, 2.0)), sent, tensor_class=Tensor,
                               remote=lambda handle, grad: asked.append((handle, grad.tolist())) or (grad * 3,))
    assert type(out) is Tensor and out.data.tolist() == [2.0] * 3 and out._parents == (x,)
    assert isinstance(out._backward, replies.Remote) and out.op == "copy_to_parallel"
    out.backward(np.ones(3))
    assert asked == [(7, [1.0, 1.0, 1.0])] and x.grad.tolist() == [3.0] * 3, \
        "the grader's autograd, the sandbox's closure"
    with pytest.raises(ValueError, match="kind 'tensor'"):                 # only where the grader rebuilds Tensors
        replies.unpack_reply(reply(spec, v0=np.full(3, 2.0)), sent)
    for bad, why in [(["tensor", 0, ["array", "v1"], ["atom", None], True, "", [], None], "not a floating-point"),
                     (["tensor", 0, ["array", "v0"], ["atom", None], True, "", [["int", "1"]], None],
                      "a parent that is not a Tensor"),
                     (["tensor", 0, ["array", "v0"], ["atom", None], True, "", [], "exec"], "malformed")]:
        with pytest.raises(ValueError, match=why):
            replies.unpack_reply(reply(bad, v0=np.full(3, 2.0), v1=np.arange(3)), sent, tensor_class=Tensor,
                                 remote=print)


def test_a_tensor_the_call_made_crosses_back_with_its_graph_and_its_backward_kept_there():
    x = Tensor(np.arange(3.0), requires_grad=True)

    def change(args):
        return (args[0] * 2.0).relu()                       # two nodes the call made, on the caller's x
    kept = []                                               # the sandbox's side: the closures it keeps
    arrays, sent = values.pack_call({"args": (x,)})
    message, seen = values.unpack_call(arrays, importing=True)
    reply_arrays = replies.pack_reply(change(message["args"]), seen, replies.snapshot(seen),
                                      keep=lambda closure: kept.append(closure) or len(kept) - 1)
    out = replies.unpack_reply(reply_arrays, sent, tensor_class=Tensor,
                               remote=lambda handle, grad: kept[handle](grad))
    assert out.data.tolist() == [0.0, 2.0, 4.0] and out.grad is None and len(kept) == 2
    (middle,) = out._parents
    assert middle._parents[0] is x and middle is not x, "the graph runs back into the caller's own x"
    out.backward(np.ones(3))
    assert x.grad.tolist() == [0.0, 2.0, 2.0]


def test_a_field_that_held_nothing_may_come_back_as_a_tensor_the_call_made():
    from minidl.nn import Linear
    layer = Linear(2, 2, rng=np.random.default_rng(0))
    layer.probe = None                                      # as sufficient factors' wrapper keeps its zero probe

    def change(args):
        args[0].probe = Tensor(np.zeros(2), requires_grad=True)
    arrays, sent = through(None, (layer,), change)
    replies.unpack_reply(arrays, sent, tensor_class=Tensor, remote=print)
    assert type(layer.probe) is Tensor and layer.probe.data.tolist() == [0.0, 0.0] and layer.probe.requires_grad
    arrays, sent = through(None, (layer,), lambda args: setattr(args[0], "weight", Tensor(np.zeros(2))))
    with pytest.raises(ValueError, match="was a Parameter, came back as a Tensor"):      # not in place of another
        replies.unpack_reply(arrays, sent, tensor_class=Tensor, remote=print)


def test_the_sandbox_side_refuses_to_pack_anything_but_data():
    class Outsider:
        pass
    for value in (print, Outsider(), np.array([object()]), functools.partial(print), Tensor(np.zeros(2)).backward):
        with pytest.raises(TypeError, match="cannot cross back"):
            replies.pack_reply(value, {}, {})
    tensor = Tensor(np.zeros(2), requires_grad=True) * 2.0
    with pytest.raises(TypeError, match="with a backward cannot cross back here"):
        replies.pack_reply(tensor, {}, {})                   # a whole run's job keeps no backward
