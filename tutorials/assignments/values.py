"""Python values as arrays plus one JSON text: how a graded call's arguments and reply cross the sandbox.

    arrays = pack(value)          # {"__values__": JSON text, "v0": array, "v1": array, ...}
    value = unpack(arrays)        # the same value back; raises ValueError on anything malformed

What crosses: None, bool, int, float, str, NumPy arrays and scalars (kept as arrays: dtype and
shape exact; a view stays a view of its base), dtypes, lists, tuples, dicts, a dict's values
view, ranges, NumPy random generators (the bit generator's name and state), the ``comm`` of the
call (the receiver's own), the ``numpy`` module, and, of the project's own packages (minidl,
collectives, algorithms: ``PACKAGES``; and tests/handed.py and tests/helpers.py, whose sums, stand-ins and model
builders tests hand to the function: nothing else): namedtuples, dataclasses, **objects** (the
class's qualified name and the instance's fields, rebuilt with ``object.__new__`` from the class of
*the receiving side's* tree), module-level **functions** and classes by qualified name, **closures**
(the qualified name of their code, found again in the receiving side's tree, and their cells'
values), bound methods and ``functools.partial``. Never pickle, never code: the receiving side
builds each value from the JSON's small vocabulary and its own modules, and ``unpack`` checks every
piece (a reply is written by student code). Shared references and cycles keep their shape.

Identity across a call: ``pack_call`` numbers what it sends; the sandbox's
``unpack_call`` remembers those numbers and ``pack_reply`` tags each sent thing that comes back
with its number; the grader's ``unpack_reply`` then writes the reply's state into the caller's
*own* objects, arrays, lists, dicts and generators (in place: views stay views) instead of
making new ones, and only once every piece of the reply has been checked.
"""
import dataclasses
import functools
import inspect
import json
import sys
import types

import numpy as np

if __name__ == "tutorials.assignments.values":
    from tutorials.assignments import codec
else:                                 # in the sandbox: beside this file, never the student tree's copy
    import importlib.util
    import os
    _spec = importlib.util.spec_from_file_location("sandbox_codec", os.path.join(os.path.dirname(__file__), "codec.py"))
    codec = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(codec)
Packer, Remote, world_ranks, subcommunicators = codec.Packer, codec.Remote, codec.world_ranks, codec.subcommunicators
_same_array, _write, _hashable, _state = codec.same_array, codec.write, codec.hashable, codec.state
GENERATORS, PACKAGES, MAX_DEPTH, MAX_TEXT = codec.GENERATORS, codec.PACKAGES, codec.MAX_DEPTH, codec.MAX_TEXT


def pack(value, *, comm=()):
    """{"__values__": the JSON spec, "v<i>": each array}: only arrays and one string, for the sandbox's npz."""
    return Packer(comm=comm).arrays(value)


def unpack(arrays, *, comm=None):
    """The value ``pack`` made, from {"__values__": ..., "v<i>": ...}; ValueError if it is not one."""
    return Builder(comm=comm).value(arrays)


def pack_call(value, *, comm=(), subcomm=None):
    """(arrays, sent): ``pack`` that also returns {number: object} of every mutable thing sent.
    ``subcomm(c)``: the world ranks of another communicator ``c`` (it crosses as them)."""
    packer = Packer(comm=comm, subcomm=subcomm)
    return packer.arrays(value), packer.sent


def unpack_call(arrays, *, comm=None, importing=True, subcomm=None):
    """(value, seen): in the sandbox, the value and {id(thing): (number, thing, an array's copy)} for ``pack_reply``."""
    builder = Builder(comm=comm, importing=importing, keep=True, subcomm=subcomm)
    return builder.value(arrays), builder.seen


def pack_reply(value, seen, *, comm=(), subcomm=None):
    """``pack``, tagging each thing that arrived in the call with the number it came with."""
    return Packer(comm=comm, known=seen, subcomm=subcomm).arrays(value)


def unpack_reply(arrays, sent, *, comm=None, remote=None):
    """The reply's value; the sent things it names are the caller's own, updated to the reply's state.

    ``remote``: (module, qualified name of the task's function): a closure of the task's own code
    (which this side does not run) becomes a ``Remote``, a stand-in that calls it in the sandbox."""
    return Builder(comm=comm, originals=sent, remote=remote).value(arrays)


def copy_back(original, after):
    """What the call changed in place, made here too: each array of ``original`` takes the values of
    its counterpart in ``after`` (same place in the same structure; shape and dtype must agree), each
    generator the state of its counterpart. Anything else is left as it is."""
    if isinstance(original, np.ndarray) and not isinstance(after, np.ndarray):
        raise ValueError(f"an array came back as a {type(after).__name__}")
    if isinstance(original, np.ndarray):
        if original.shape != after.shape or original.dtype != after.dtype:
            raise ValueError(f"an array came back as {after.dtype}{list(after.shape)}, "
                             f"was {original.dtype}{list(original.shape)}")
        if original.tobytes() != after.tobytes():
            original[...] = after
    elif isinstance(original, np.random.Generator) and isinstance(after, np.random.Generator):
        original.bit_generator.state = after.bit_generator.state
    elif isinstance(original, (list, tuple)) and isinstance(after, (list, tuple)) and len(original) == len(after):
        for mine, theirs in zip(original, after):
            copy_back(mine, theirs)
    elif isinstance(original, dict) and isinstance(after, dict) and original.keys() == after.keys():
        for key in original:
            copy_back(original[key], after[key])


class Builder:
    """Builds the value of one message; with ``originals`` (a reply), a thing tagged ``was`` is the
    caller's own, and the state the reply gives it is written into it once the whole reply checks out."""

    def __init__(self, comm=None, originals=None, importing=False, remote=None, keep=False, subcomm=None):
        self.comm, self.originals, self.importing, self.remote = comm, originals, importing, remote
        self.subcomm = subcomm             # the sandbox: world ranks -> the communicator of them
        self.keep = keep                   # the sandbox: each array as it came (a reply sends it back only if changed)
        self.memo, self.seen, self.updates = {}, {}, []

    def value(self, arrays):
        try:
            text = str(arrays["__values__"])
            if len(text) > MAX_TEXT:
                raise ValueError(f"a spec of {len(text)} characters")
            out = self.build(json.loads(text), arrays, 0)
            for update in self.updates:          # nothing of the caller's changes before this
                update()
            return out
        except (KeyError, TypeError, IndexError, AttributeError, RecursionError, json.JSONDecodeError) as error:
            raise ValueError(f"not a packed value ({type(error).__name__}: {str(error)[:200]})") from None

    def _register(self, node, made, kind):
        """Number a new thing (``node``'s n); a tagged one is the caller's own (of the same kind)."""
        n, was = (node + [None, None])[:2]
        if n is not None and (type(n) is not int or n in self.memo):
            raise ValueError(f"{kind}: a number {n!r} used twice or not a number")
        if was is not None:
            original = self.originals.get(was) if self.originals is not None and type(was) is int else None
            if original is None or not kind(original):
                raise ValueError(f"a reply names thing {was!r} of the call, which is not one of its or not that kind")
            made = original
        self.memo[n] = made
        self.seen[id(made)] = (n, made, made.copy() if self.keep and isinstance(made, np.ndarray) else None)
        return made, was is not None

    def build(self, node, arrays, depth):
        if depth > MAX_DEPTH or not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError("a malformed or too deep spec")
        kind, rest, down = node[0], node[1:], depth + 1

        def items(children):
            if not isinstance(children, list):
                raise ValueError(f"{kind}: items are not a list")
            return [self.build(child, arrays, down) for child in children]

        def later(action):
            self.updates.append(action)

        if kind == "atom" and rest and (rest[0] is None or isinstance(rest[0], (bool, str))):
            return rest[0]
        if kind == "int" and isinstance(rest[0], str) and len(rest[0]) < 5000:
            return int(rest[0])
        if kind == "float" and isinstance(rest[0], str):
            return float(rest[0])
        if kind == "ref" and type(rest[0]) is int and rest[0] in self.memo:
            return self.memo[rest[0]]
        if kind == "same" and len(rest) == 2 and rest[1] is not None:        # a reply: an array the call did not change
            return self._register(rest, None, lambda o: isinstance(o, np.ndarray))[0]
        if kind == "subcomm" and len(rest) == 3:
            if rest[1] is None and self.subcomm is None:
                raise ValueError("a communicator that this side does not have")
            made = None if rest[1] is not None else codec.Unreachable() if rest[2] is None else self.subcomm(rest[2])
            return self._register(rest[:2], made, lambda o: type(o).__module__ == "mpi4py.MPI")[0]
        if kind == "comm" and self.comm is not None:
            return self.comm
        if kind in ("array", "scalar"):
            array = arrays[rest[0]]
            if not isinstance(array, np.ndarray) or array.dtype.hasobject or not rest[0].startswith("v"):
                raise ValueError(f"{rest[0]!r} is not an array of the reply")
            if kind == "scalar":
                return array[()]
            made, tagged = self._register(rest[1:], array, lambda o: isinstance(o, np.ndarray))
            if tagged:
                _same_array(made, array)
                later(lambda: _write(made, array))
            return made
        if kind == "view":
            base = self.build(rest[2], arrays, down)
            offset, shape, strides, dtype = rest[3:7]
            if not (isinstance(base, np.ndarray) and base.flags.c_contiguous and type(offset) is int and offset >= 0
                    and all(type(i) is int for i in [*shape, *strides]) and len(shape) == len(strides)):
                raise ValueError("view: not a view of an array of the message")
            dtype = np.dtype(dtype)
            if dtype.hasobject:
                raise ValueError(f"view: the dtype {dtype}")
            view = np.ndarray(tuple(shape), dtype, buffer=base, offset=offset, strides=tuple(strides))
            made, tagged = self._register(rest[:2], view, lambda o: isinstance(o, np.ndarray))
            if tagged:
                _same_array(made, view)
                later(lambda: _write(made, view))
            return made
        if kind == "dtype" and isinstance(rest[0], str):
            dtype = np.dtype(rest[0])
            if dtype.hasobject or dtype.fields is not None:
                raise ValueError(f"the dtype {dtype}")
            return dtype
        if kind == "generator":
            state = json.loads(rest[0])
            if not isinstance(state, dict) or state.get("bit_generator") not in GENERATORS:
                raise ValueError("a generator that is not one of numpy's")
            generator = np.random.Generator(getattr(np.random, state["bit_generator"])())
            generator.bit_generator.state = _state(state)
            made, tagged = self._register(rest[1:], generator, lambda o: isinstance(o, np.random.Generator))
            if tagged:
                later(lambda: setattr(made.bit_generator, "state", generator.bit_generator.state))
            return made
        if kind in ("namedtuple", "dataclass"):
            module, _, name = rest[0].partition(":")
            cls = codec.resolve(module, name, self.importing)
            if kind == "namedtuple" and isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
                return cls(*items(rest[1]))
            if kind == "dataclass" and isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(rest[1], list):
                names = [pair[0] for pair in rest[1] if isinstance(pair, list) and len(pair) == 2]
                if names != [field.name for field in dataclasses.fields(cls)]:
                    raise ValueError(f"{rest[0]!r}: fields {names[:20]}")
                return cls(**{pair[0]: self.build(pair[1], arrays, down) for pair in rest[1]})
            raise ValueError(f"{rest[0]!r} is not a {kind} of the project's packages")
        if kind == "tuple":
            return tuple(items(rest[0]))
        if kind == "list":
            made, tagged = self._register(rest[1:], [], lambda o: type(o) is list)
            built = items(rest[0])
            later(lambda: made.__setitem__(slice(None), built)) if tagged else made.extend(built)
            return made
        if kind == "set":
            made, tagged = self._register(rest[1:], set(), lambda o: type(o) is set)
            built = {_hashable(item) for item in items(rest[0])}
            later(lambda: (made.clear(), made.update(built))) if tagged else made.update(built)
            return made
        if kind == "frozenset":
            return frozenset(_hashable(item) for item in items(rest[0]))
        if kind == "values":
            return dict(enumerate(items(rest[0]))).values()
        if kind in codec.DICTS:
            if not isinstance(rest[0], list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in rest[0]):
                raise ValueError("dict: not a list of pairs")
            cls = codec.DICTS[kind]
            made, tagged = self._register(rest[1:], cls(), lambda o: type(o) is cls)
            built = {_hashable(self.build(k, arrays, down)): self.build(v, arrays, down) for k, v in rest[0]}
            later(lambda: (made.clear(), made.update(built))) if tagged else made.update(built)
            return made
        if kind == "range" and isinstance(rest[0], list) and len(rest[0]) == 3 and all(type(i) is int for i in rest[0]):
            return range(*rest[0])
        if kind == "module" and isinstance(rest[0], str) and (rest[0] in codec.MODULES or codec.ours(rest[0])):
            module = sys.modules.get(rest[0])
            if module is None and self.importing:
                module = __import__("importlib").import_module(rest[0])
            if module is not None:
                return module
        if kind == "function" and len(rest) == 2:
            found = codec.resolve(rest[0], rest[1], self.importing)
            if found is not None and found.__name__ != "main":
                return found
            raise ValueError(f"{rest[0]}:{rest[1]} is not a function or class of the project's packages")
        if kind == "object" and len(rest) == 4 and isinstance(rest[2], str) and isinstance(rest[3], list):
            module, _, name = rest[2].partition(":")
            cls = codec.resolve(module, name, self.importing)
            if not codec.plain_class(cls):
                raise ValueError(f"{rest[2]!r} is not a class of the project's packages that an object may be of")
            made, tagged = self._register(rest[:2], object.__new__(cls), lambda o: type(o) is cls)
            fields = {}
            for pair in rest[3]:
                if not (isinstance(pair, list) and len(pair) == 2 and codec.field_allowed(cls, pair[0])):
                    raise ValueError(f"{rest[2]}: a field {str(pair)[:60]} that is not a plain name of its class")
                fields[pair[0]] = self.build(pair[1], arrays, down)
            later(lambda: (vars(made).clear(), vars(made).update(fields))) if tagged else vars(made).update(fields)
            return made
        if kind == "closure" and len(rest) == 8:
            return self._closure(rest, arrays, down)
        if kind == "method" and len(rest) == 2:
            owner = self.build(rest[0], arrays, down)
            function = inspect.getattr_static(type(owner), rest[1], None) if isinstance(rest[1], str) else None
            if isinstance(function, types.FunctionType) and codec.resolve(function.__module__, function.__qualname__) \
                    is function and codec.plain_class(type(owner)):
                return types.MethodType(function, owner)
            raise ValueError(f"a method {str(rest[1])[:60]} that its object's class does not define")
        if kind == "partial" and len(rest) == 5 and (self.originals is None or rest[1] is not None):
            made, tagged = self._register(rest[:2], None, lambda o: isinstance(o, functools.partial))
            function, args, keywords = (self.build(part, arrays, down) for part in rest[2:])
            if tagged:                                   # a reply: only the caller's own partial, as it was
                return made
            if callable(function) and isinstance(args, tuple) and isinstance(keywords, dict):
                made = self.memo[rest[0]] = functools.partial(function, *args, **keywords)
                self.seen[id(made)] = (rest[0], made, None)
                return made
        raise ValueError(f"a spec of kind {kind!r}")

    def _closure(self, rest, arrays, down):
        """A closure: its code found again on this side by name, its cells filled by name (a free
        variable that the message does not give stays empty: reading it is a NameError)."""
        module, qualname, index, cells, defaults, kwdefaults = rest[2:]
        if not (isinstance(cells, list) and all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                                                for pair in cells)):
            raise ValueError("closure: cells are not a list of [name, value]")
        code = None
        if not (self.remote is not None and module == self.remote[0] and isinstance(qualname, str)
                and qualname.startswith(self.remote[1] + ".<locals>.")):   # else the task's own code: a Remote
            code = codec.code_of(module, qualname, index, self.importing)
            if code is None:
                raise ValueError(f"a closure {str(qualname)[:80]} that this side's code does not have")
        boxes = {name: types.CellType() for name in (code.co_freevars if code is not None else ())}
        if code is None:
            made = Remote(module, qualname, index, {}, None, None)
        else:
            made = types.FunctionType(code, sys.modules[module].__dict__, code.co_name, None, tuple(boxes.values()))
        made, tagged = self._register(rest[:2], made, lambda o: isinstance(o, (types.FunctionType, Remote)))
        filled = {name: self.build(cell, arrays, down) for name, cell in cells}
        defaults, kwdefaults = self.build(defaults, arrays, down), self.build(kwdefaults, arrays, down)
        if not (defaults is None or isinstance(defaults, tuple)) or \
                not (kwdefaults is None or isinstance(kwdefaults, dict)):
            raise ValueError("closure: defaults that are not a tuple or a dict")
        if tagged:
            return made
        if code is None:
            made.spec = (module, qualname, index, filled, defaults, kwdefaults)
            return made
        for name, box in boxes.items():
            if name in filled:
                box.cell_contents = filled[name]
        made.__defaults__, made.__kwdefaults__ = defaults, kwdefaults
        return made
