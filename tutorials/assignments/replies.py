"""What crosses back from the sandbox: data, and changes to what the call sent. Nothing else.

    # in the sandbox, after the call (``seen``: what values.unpack_call built, by number)
    before = snapshot(seen)                        # taken before the call
    arrays = pack_reply(result, seen, before)      # {"__reply__": JSON text, "v0": array, ...}
    # in the grader
    value = unpack_reply(arrays, sent)             # the return value; ``sent``'s things updated

The grader calls nothing a reply names, because a reply cannot name anything that runs. Its
vocabulary is data: None, bools, ints, floats, strings, NumPy arrays and scalars (no object
dtype), dtypes, ranges, and tuples, lists, dicts and sets of those; ``["sent", n]``, the caller's
own thing number n of the call; and one schema of the project's, ``["tensor", ...]``: a minidl
Tensor the call made, rebuilt here by minidl's own ``Tensor`` from its array, with its parents
(the caller's Tensors or other rebuilt ones) and, for its backward, a handle: a number that the
grader's own stand-in (``Remote``) sends back to the sandbox, where the closure stayed.

What the call changed in place comes as updates of things it sent, each checked against the
caller's own before any is written: an array takes new values of the same shape and dtype
(written into it: views stay views); a list, dict or set new items; a generator a new state;
an object new values for fields it had, each of the kind the field held (an array field is
written in place, a number stays a number, a field that held one of the caller's objects may
hold another of the same class or a rebuilt Tensor). A new field, a deleted one, or a field of
another kind is refused, and so is any reply that is not of this form: ``ValueError``.
This file imports nothing of the project: the sandbox loads it from beside its driver.
"""
import dataclasses
import functools
import inspect
import json
import numbers
import types

import numpy as np

MAX_DEPTH, MAX_NODES, MAX_TEXT = 200, 2_000_000, 1 << 25
TENSOR = ("minidl.tensor", ("Tensor", "Parameter"))


# ---- the sandbox's side ------------------------------------------------------------------------------

def _is_record(v):
    """A namedtuple or dataclass instance of the project's: its fields cross as data, by name."""
    module = type(v).__module__
    return module.startswith(("minidl.", "collectives.", "algorithms.")) and (
        (isinstance(v, tuple) and hasattr(type(v), "_fields"))
        or (dataclasses.is_dataclass(v) and not isinstance(v, type)))


def _is_tensor(v):
    return type(v).__module__ == TENSOR[0] and type(v).__name__ in TENSOR[1]


def snapshot(seen):
    """{number: state} of every mutable thing the call sent, as it arrived (to find what changed)."""
    states = {}
    for number, thing, copy in seen.values():
        if isinstance(thing, np.ndarray):
            states[number] = copy if copy is not None else thing.copy()
        elif isinstance(thing, np.random.Generator):
            states[number] = json.dumps(thing.bit_generator.state, default=lambda a: np.asarray(a).tolist())
        elif isinstance(thing, list):
            states[number] = list(thing)
        elif isinstance(thing, dict):
            states[number] = list(thing.items())
        elif isinstance(thing, set):
            states[number] = set(thing)
        elif hasattr(thing, "__dict__") and not isinstance(thing, CALLABLES):   # objects, callable ones too
            states[number] = dict(vars(thing))
    return states


def _same(a, b):
    """Whether a field or item holds what it held: the same object, or an equal plain value."""
    if a is b:
        return True
    plain = (type(None), bool, int, float, str, bytes)
    return type(a) is type(b) and isinstance(a, plain) and (a == b or (a != a and b != b))


class ReplyPacker:
    """Data, and the caller's own things by number; a Tensor as its schema, its backward kept here."""

    def __init__(self, seen, keep=None):
        self.numbers = {id(thing): number for number, thing, _ in seen.values()}
        self.things = {id(thing): thing for _, thing, _ in seen.values()}
        self.keep, self.blobs, self.nodes, self.tensors = keep, {}, 0, {}

    def _blob(self, array):
        key = f"v{len(self.blobs)}"
        array = np.asarray(array)
        self.blobs[key] = array if array.flags.c_contiguous else array.copy(order="C")
        return key

    def value(self, v, depth=0):
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise TypeError("a reply too deep or too large to cross back")
        down = depth + 1
        if id(v) in self.numbers and self.things[id(v)] is v:
            return ["sent", self.numbers[id(v)]]
        if v is None or isinstance(v, (bool, str)):
            return ["atom", v]
        if isinstance(v, (np.ndarray, np.generic)):
            if v.dtype.hasobject or v.dtype.fields is not None:
                raise TypeError(f"an array of dtype {v.dtype} cannot cross back")
            return ["scalar" if isinstance(v, np.generic) else "array", self._blob(v)]
        if isinstance(v, int):
            return ["int", str(int(v))]
        if isinstance(v, float):
            return ["float", repr(float(v))]
        if isinstance(v, np.dtype) and not v.hasobject and v.fields is None:
            return ["dtype", v.str]
        if isinstance(v, range):
            return ["range", [v.start, v.stop, v.step]]
        if _is_record(v):
            fields = v._fields if isinstance(v, tuple) else [field.name for field in dataclasses.fields(v)]
            return ["record", f"{type(v).__module__}:{type(v).__qualname__}",
                    [[name, self.value(getattr(v, name), down)] for name in fields]]
        if type(v) is tuple:
            return ["tuple", [self.value(x, down) for x in v]]
        if isinstance(v, list):
            return ["list", [self.value(x, down) for x in v]]
        if isinstance(v, dict):
            return ["dict", [[self.value(k, down), self.value(x, down)] for k, x in v.items()]]
        if isinstance(v, (set, frozenset)):
            return ["set", [self.value(x, down) for x in v]]
        if _is_tensor(v):
            return self._tensor(v, down)
        raise TypeError(f"a {type(v).__module__}.{type(v).__qualname__} cannot cross back from the sandbox: "
                        "only data (numbers, strings, arrays and containers of them), the call's own "
                        "arguments, and Tensors")

    def _tensor(self, t, down):
        """["tensor", key, data, grad, requires_grad, op, [parents], handle]: a Tensor the call made."""
        if id(t) in self.tensors:
            return ["tensorref", self.tensors[id(t)]]
        key = self.tensors[id(t)] = len(self.tensors)
        handle = None
        if t._backward is not None:
            if self.keep is None:
                raise TypeError("a Tensor with a backward cannot cross back here")
            handle = self.keep(t._backward)
        parents = [self.value(parent, down) for parent in t._parents]
        return ["tensor", key, self.value(np.asarray(t.data), down),
                ["atom", None] if t.grad is None else self.value(np.asarray(t.grad), down),
                bool(t.requires_grad), str(t.op)[:200], parents, handle]

    def updates(self, seen, before):
        """[update] for every sent thing that is not as it arrived."""
        out = []
        for number, thing, _ in seen.values():
            if number not in before:
                continue
            old = before[number]
            if isinstance(thing, np.ndarray):
                if thing.shape != old.shape or thing.dtype != old.dtype or thing.tobytes() != old.tobytes():
                    out.append(["array", number, self.value(thing.copy())])
            elif isinstance(thing, np.random.Generator):
                state = json.dumps(thing.bit_generator.state, default=lambda a: np.asarray(a).tolist())
                if state != old:
                    out.append(["generator", number, state])
            elif isinstance(thing, list):
                if len(thing) != len(old) or not all(map(_same, thing, old)):
                    out.append(["list", number, self.value(list(thing))])
            elif isinstance(thing, dict):
                items = list(thing.items())
                if len(items) != len(old) or not all(k1 is k2 or k1 == k2 for (k1, _), (k2, _) in zip(items, old)) \
                        or not all(_same(v1, v2) for (_, v1), (_, v2) in zip(items, old)):
                    out.append(["dict", number, self.value(dict(thing))])
            elif isinstance(thing, set):
                if thing != old:
                    out.append(["set", number, self.value(set(thing))])
            else:
                now = vars(thing)
                changed = [[name, self.value(now[name])] for name in now
                           if name not in old or not _same(now[name], old[name])]
                deleted = [name for name in old if name not in now]
                if changed or deleted:
                    out.append(["fields", number, changed, deleted])
        return out


def pack_reply(result, seen, before, keep=None):
    """The arrays of a reply: {"__reply__": {"return": spec, "updates": [...]}, "v<i>": arrays}.
    ``keep(closure)``: the handle under which a returned Tensor's backward stays here (None: refused)."""
    packer = ReplyPacker(seen, keep)
    spec = {"return": packer.value(result), "updates": packer.updates(seen, before)}
    return {"__reply__": np.array(json.dumps(spec)), **packer.blobs}


def pack_data(**named):
    """Data only (no Tensor, nothing sent): {"__data__": JSON {name: spec}, "v<i>": arrays}."""
    packer = ReplyPacker({})
    spec = {name: packer.value(value) for name, value in named.items()}
    return {"__data__": np.array(json.dumps(spec)), **packer.blobs}


def unpack_data(arrays):
    """{name: value} of ``pack_data``'s arrays, each node checked; ValueError if malformed."""
    builder = ReplyBuilder(arrays, {})
    try:
        spec = json.loads(str(arrays["__data__"]))
        if not isinstance(spec, dict) or len(spec) > 64:
            raise ValueError("not a dict of named data")
        return {str(name): builder.build(node) for name, node in spec.items()}
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError, OverflowError,
            json.JSONDecodeError) as error:
        raise ValueError(f"not data ({type(error).__name__}: {str(error)[:200]})") from None


# ---- the grader's side -------------------------------------------------------------------------------

CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial, type,
             types.ModuleType)


class Remote:
    """A rebuilt Tensor's backward: the grader's own callable that asks the sandbox to run the closure
    it kept under ``handle`` (``call(handle, grad)``, set by the grader). It holds nothing of the reply."""

    def __init__(self, call, handle):
        self.call, self.handle = call, handle

    def __call__(self, grad):
        return self.call(self.handle, grad)


def _kind(value):
    """The kind a field keeps across a call: real numbers are one kind, and so are arrays of one shape and dtype."""
    if isinstance(value, (np.bool_, np.str_, np.bytes_, np.complexfloating, complex)):
        return type(value)
    if value is None or isinstance(value, (bool, str, tuple, list, dict, set, range, np.dtype)):
        return type(value)
    if isinstance(value, np.ndarray):
        return (np.ndarray, value.shape, value.dtype.str)
    if isinstance(value, (numbers.Number, np.generic)):
        return numbers.Number
    return type(value)                            # one of the caller's objects: the same class


class ReplyBuilder:
    """Builds a reply's value from its spec, checking every node; writes the updates once all check out."""

    def __init__(self, arrays, sent, tensor_class=None, remote=None, records=None):
        self.arrays, self.sent = arrays, sent
        self.tensor_class, self.remote = tensor_class, remote
        self.records = records or {}              # "module:qualname" -> the grader's own class (the task's schema)
        self.nodes, self.tensors, self.writes = 0, {}, []

    def build(self, node, depth=0):
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES or not isinstance(node, list) or not node \
                or not isinstance(node[0], str):
            raise ValueError("a malformed, too deep or too large reply")
        kind, rest, down = node[0], node[1:], depth + 1
        if kind == "sent" and len(rest) == 1 and type(rest[0]) is int and rest[0] in self.sent:
            thing = self.sent[rest[0]]
            if isinstance(thing, CALLABLES):
                raise ValueError(f"a reply names the call's {type(thing).__name__} {rest[0]}: nothing that runs "
                                 "crosses back, not even the caller's own")
            return thing
        if kind == "atom" and len(rest) == 1 and (rest[0] is None or isinstance(rest[0], (bool, str))):
            return rest[0]
        if kind == "int" and len(rest) == 1 and isinstance(rest[0], str) and len(rest[0]) < 5000:
            return int(rest[0])
        if kind == "float" and len(rest) == 1 and isinstance(rest[0], str) and len(rest[0]) < 64:
            return float(rest[0])
        if kind in ("array", "scalar") and len(rest) == 1 and isinstance(rest[0], str) and rest[0].startswith("v"):
            array = self.arrays.get(rest[0])
            if not isinstance(array, np.ndarray) or array.dtype.hasobject or array.dtype.fields is not None:
                raise ValueError(f"{rest[0]!r} is not an array of the reply")
            return array[()] if kind == "scalar" else array
        if kind == "dtype" and len(rest) == 1 and isinstance(rest[0], str) and len(rest[0]) < 32:
            dtype = np.dtype(rest[0])
            if dtype.hasobject or dtype.fields is not None:
                raise ValueError(f"the dtype {dtype}")
            return dtype
        if kind == "range" and len(rest) == 1 and isinstance(rest[0], list) and len(rest[0]) == 3 \
                and all(type(i) is int for i in rest[0]):
            return range(*rest[0])
        if kind in ("tuple", "list", "set") and len(rest) == 1 and isinstance(rest[0], list):
            items = [self.build(child, down) for child in rest[0]]
            return tuple(items) if kind == "tuple" else items if kind == "list" else set(map(_hashable, items))
        if kind == "dict" and len(rest) == 1 and isinstance(rest[0], list):
            if not all(isinstance(pair, list) and len(pair) == 2 for pair in rest[0]):
                raise ValueError("dict: not a list of pairs")
            return {_hashable(self.build(k, down)): self.build(v, down) for k, v in rest[0]}
        if kind == "record" and len(rest) == 2 and rest[0] in self.records and isinstance(rest[1], list):
            cls = self.records[rest[0]]
            names = [field.name for field in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else cls._fields
            if [pair[0] if isinstance(pair, list) and len(pair) == 2 else None for pair in rest[1]] != list(names):
                raise ValueError(f"a {rest[0]} with other fields than its class")
            built = {name: self.build(pair[1], down) for name, pair in zip(names, rest[1])}
            return cls(**built)
        if kind == "record" and len(rest) == 2:
            raise ValueError(f"a reply node of kind 'record' ({str(rest[0])[:80]}), which this task's tests do not "
                             "take back (tasks.toml's returns): only data and the call's own things cross back")
        if kind == "tensorref" and len(rest) == 1 and rest[0] in self.tensors:
            return self.tensors[rest[0]]
        if kind == "tensor" and len(rest) == 7 and self.tensor_class is not None:
            return self._tensor(rest, down)
        raise ValueError(f"a reply node of kind {kind!r} (only data and the call's own things cross back)")

    def _tensor(self, rest, down):
        key, data, grad, requires_grad, op, parents, handle = rest
        if type(key) is not int or key in self.tensors or not isinstance(requires_grad, bool) \
                or not isinstance(op, str) or not isinstance(parents, list) \
                or not (handle is None or (type(handle) is int and handle >= 0)):
            raise ValueError("tensor: a malformed schema")
        data = self.build(data, down)
        if not isinstance(data, np.ndarray) or data.dtype.kind not in "fc":
            raise ValueError("tensor: its data is not a floating-point array")
        tensor = self.tensor_class(data, requires_grad=requires_grad)
        self.tensors[key] = tensor
        grad = self.build(grad, down)
        if grad is not None and not (isinstance(grad, np.ndarray) and grad.shape == data.shape):
            raise ValueError("tensor: a gradient that is not an array of its shape")
        built = tuple(self.build(parent, down) for parent in parents)
        if not all(isinstance(parent, self.tensor_class) for parent in built):
            raise ValueError("tensor: a parent that is not a Tensor")
        tensor.grad, tensor.op, tensor._parents = grad, op, built
        tensor._backward = None if handle is None else Remote(self.remote, handle)
        return tensor

    def update(self, node):
        """Check one update and queue its write."""
        if not (isinstance(node, list) and len(node) >= 3 and type(node[1]) is int and node[1] in self.sent):
            raise ValueError("an update of a thing the call did not send")
        kind, original = node[0], self.sent[node[1]]
        if kind == "array" and isinstance(original, np.ndarray) and len(node) == 3:
            new = self.build(node[2])
            if not (isinstance(new, np.ndarray) and new.shape == original.shape and new.dtype == original.dtype):
                raise ValueError(f"an array came back as {getattr(new, 'dtype', type(new).__name__)}"
                                 f"{list(getattr(new, 'shape', ()))}, was {original.dtype}{list(original.shape)}")
            self.writes.append(lambda: np.copyto(original, new))
        elif kind == "generator" and isinstance(original, np.random.Generator) and isinstance(node[2], str):
            state = json.loads(node[2])
            probe = np.random.Generator(type(original.bit_generator)())
            probe.bit_generator.state = _state(state)     # numpy checks it; a malformed state raises
            self.writes.append(lambda: setattr(original.bit_generator, "state", probe.bit_generator.state))
        elif kind in ("list", "dict", "set") and type(original) is {"list": list, "dict": dict, "set": set}[kind]:
            new = self.build(node[2])
            if type(new) is not type(original):
                raise ValueError(f"a {kind} came back as a {type(new).__name__}")
            self.writes.append(lambda: (original.clear(), original.update(new)) if kind != "list"
                               else original.__setitem__(slice(None), new))
        elif kind == "fields" and len(node) == 4 and hasattr(original, "__dict__"):
            self._fields(original, node[2], node[3])
        else:
            raise ValueError(f"an update of kind {kind!r} for a {type(original).__name__}")

    def _fields(self, original, changed, deleted):
        fields = vars(original)
        if deleted:
            raise ValueError(f"{type(original).__name__}: the call deleted its field {str(deleted[0])[:60]!r}")
        if not isinstance(changed, list):
            raise ValueError("fields: not a list")
        for pair in changed:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                    and (pair[0] in fields or _class_default(type(original), pair[0]) is not _NONE)):
                raise ValueError(f"{type(original).__name__}: a field {str(pair)[:60]} that the call did not send")
            name, new = pair[0], self.build(pair[1])
            old = fields[name] if name in fields else _class_default(type(original), name)
            if isinstance(old, np.ndarray) and isinstance(new, np.ndarray) and _kind(old) == _kind(new) \
                    and new is not old and not any(new is thing for thing in self.sent.values()):
                if old.flags.writeable:
                    self.writes.append(lambda old=old, new=new: np.copyto(old, new))     # in place: views stay views
                elif old.tobytes() != new.tobytes():    # a read-only stand-in (minidl.flat.absent: a weight let go)
                    self.writes.append(lambda name=name, new=new: fields.__setitem__(name, new))   # is replaced
                continue
            if isinstance(old, np.ndarray) and isinstance(new, np.ndarray) and new is not old \
                    and not any(new is thing for thing in self.sent.values()) \
                    and not (self.tensor_class is not None and isinstance(original, self.tensor_class)):
                # an array field of another shape or dtype, not a Tensor's (a layer's kept input: this batch's,
                # not the last one's): the field is given the new array, data rebuilt here, the old one unwritten
                self.writes.append(lambda name=name, new=new: fields.__setitem__(name, new))
                continue
            tensors = self.tensor_class is not None and isinstance(new, self.tensor_class) and (
                old is None or type(old) is type(new))                     # a Tensor the call made, rebuilt here
            if _kind(old) != _kind(new) and not tensors and not (old is None and _kind(new) in (numbers.Number,)) \
                    and not (old is None and isinstance(new, np.ndarray)):
                raise ValueError(f"{type(original).__name__}.{name}: was a {type(old).__name__}, came back as a "
                                 f"{type(new).__name__} (a field keeps its kind)")
            self.writes.append(lambda name=name, new=new: fields.__setitem__(name, new))


_NONE = object()


def _class_default(cls, name):
    """The data a class gives ``name`` (``calls = 0``: an instance's first ``calls += 1`` makes the field), or _NONE."""
    if not (isinstance(name, str) and name.isidentifier() and not name.startswith("__")):
        return _NONE
    value = inspect.getattr_static(cls, name, _NONE)
    if value is _NONE or callable(value) or hasattr(type(value), "__get__") or _kind(value) not in (
            type(None), bool, str, numbers.Number, tuple):
        return _NONE
    return value


def _hashable(key):
    hash(key)                                      # TypeError (a list as a key): refused below
    return key


def _state(state):
    """A bit generator's state as numpy wants it back (MT19937 keeps its key as a uint32 array)."""
    if not isinstance(state, dict):
        raise ValueError("a generator state that is not a dict")
    inner = state.get("state")
    if state.get("bit_generator") == "MT19937" and isinstance(inner, dict):
        state = {**state, "state": {**inner, "key": np.asarray(inner.get("key"), dtype=np.uint32)}}
    return state


def unpack_reply(arrays, sent, tensor_class=None, remote=None, records=None, updates=True):
    """The return value of a reply; every update of ``sent`` (number -> the caller's thing) checked,
    then written. ``tensor_class``: minidl's Tensor, to rebuild the Tensors a call made (else they
    are refused); ``remote(handle, grad)``: what their backward calls; ``records``: {"module:qualname":
    class} of the namedtuples and dataclasses the task may return, rebuilt from their fields by the
    grader's own class; ``updates``: False for a task whose function may change nothing it was given
    but the random generators it draws from (a reply that changes anything else is refused).
    ValueError if malformed."""
    builder = ReplyBuilder(arrays, sent, tensor_class, remote, records)
    try:
        text = str(arrays["__reply__"])
        if len(text) > MAX_TEXT:
            raise ValueError(f"a reply of {len(text)} characters")
        spec = json.loads(text)
        if not (isinstance(spec, dict) and spec.keys() == {"return", "updates"} and isinstance(spec["updates"], list)):
            raise ValueError("not a reply: a dict of 'return' and 'updates'")
        value = builder.build(spec["return"])
        if not updates and any(not (isinstance(node, list) and node and node[0] == "generator")
                               for node in spec["updates"]):
            raise ValueError("the call changed what it was given, which this task's function may not (it returns "
                             "its result; it may only draw from a random generator it is handed)")
        for node in spec["updates"]:
            builder.update(node)
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError, OverflowError,
            json.JSONDecodeError) as error:
        raise ValueError(f"not a reply ({type(error).__name__}: {str(error)[:200]})") from None
    for write in builder.writes:                  # nothing of the caller's changes before this
        write()
    return value


# ---- MPI ops between a sandboxed process and the grader (proxy.py, tests/grade_proxy.py) --------------------
# Compact, since a ring sends one per step: a JSON header of plain numbers and the buffers as arrays; only a
# pickling call's object goes through the data vocabulary above.

def pack_op(name, handle, arrays, fields):
    """An "op" frame: MPI call ``name`` on the grader's ``handle`` with buffers ``arrays`` (None where absent)."""
    plain = {key: value for key, value in fields.items() if key != "obj"}
    frame = {"kind": np.array("op"), "op": np.array(json.dumps([name, handle, [a is not None for a in arrays], plain]))}
    frame.update({f"a{i}": array for i, array in enumerate(arrays) if array is not None})
    if "obj" in fields:
        frame.update(pack_data(obj=fields["obj"]))
    return frame


def unpack_op(frame):
    """(name, handle, arrays, fields) of an "op" frame; ValueError unless every piece is of its kind."""
    try:
        name, handle, present, fields = json.loads(str(frame["op"]))
        plain = isinstance(fields, dict) and all(isinstance(key, str) and (value is None or type(value) in (int, str))
                                                 for key, value in fields.items())
        if not (isinstance(name, str) and type(handle) is int and isinstance(present, list) and len(present) <= 4
                and plain):
            raise ValueError("a malformed op")
        arrays = [frame[f"a{i}"] if there is True else None for i, there in enumerate(present)]
        if "__data__" in frame:
            fields["obj"] = unpack_data(frame)["obj"]
        return name, handle, arrays, fields
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"a malformed op ({type(error).__name__})") from None


def pack_result(first, second):
    """A "result" frame: ``first`` (None, a bool, an int, an array, or data) and ``second`` (None or ints)."""
    if first is None or isinstance(first, (bool, int)) and not isinstance(first, np.generic):
        head, frame = ["plain", first], {}
    elif isinstance(first, np.ndarray):
        head, frame = ["array", None], {"b0": first}
    else:
        head, frame = ["data", None], pack_data(obj=first)
    frame["r"] = np.array(json.dumps([*head, None if second is None else [int(n) for n in second]]))
    return frame


def unpack_result(frame):
    """(first, second) of a "result" frame (the grader's: this side reads it)."""
    kind, plain, second = json.loads(str(frame["r"]))
    first = plain if kind == "plain" else frame["b0"] if kind == "array" else unpack_data(frame)["obj"]
    return first, None if second is None else tuple(second)
