"""Python values as arrays plus one JSON text: how a graded call's arguments cross into the sandbox.

    arrays, sent = pack_call(value, comms=...)   # the grader: {"__values__": JSON text, "v0": array, ...}
    value, seen = unpack_call(arrays, comms=...) # the sandbox: the same value, built from its own tree

What crosses in: None, bool, int, float, str, NumPy arrays and scalars (kept as arrays: dtype and
shape exact; a view stays a view of its base), dtypes, lists, tuples, dicts, a dict's values
view, ranges, NumPy random generators (the bit generator's name and state), communicators (as
the grader's handles: ``comms``), the ``numpy`` module, and, of the project's own packages
(minidl, collectives, algorithms: ``PACKAGES``; and tests/handed.py and tests/helpers.py, whose
sums, stand-ins and model builders tests hand to the function: nothing else): namedtuples,
dataclasses, **objects** (the class's qualified name and the instance's fields, rebuilt with
``object.__new__`` from the class of *the sandbox's* tree), module-level **functions** and classes
by qualified name, **closures** (the qualified name of their code, found again in the sandbox's
tree, and their cells' values), bound methods and ``functools.partial``. Never pickle, never
code: the sandbox builds each value from the JSON's small vocabulary and its own modules. Shared
references and cycles keep their shape.

This direction may carry the project's objects because the sandbox is where they are built and
run. The way back is data only (tutorials/assignments/replies.py): the numbers ``pack_call``
gives what it sends are how a reply names the caller's things it changed, and ``unpack_call``
hands the sandbox's driver the same numbers (``seen``).
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
Packer, Unreachable = codec.Packer, codec.Unreachable
_hashable, _state = codec.hashable, codec.state
GENERATORS, PACKAGES, MAX_DEPTH, MAX_TEXT = codec.GENERATORS, codec.PACKAGES, codec.MAX_DEPTH, codec.MAX_TEXT


def pack(value):
    """{"__values__": the JSON spec, "v<i>": each array}: only arrays and one string, for a frame."""
    return Packer().arrays(value)


def unpack(arrays, *, importing=False):
    """The value ``pack`` made, from {"__values__": ..., "v<i>": ...}; ValueError if it is not one."""
    return Builder(importing=importing).value(arrays)


def pack_call(value, *, comms=None):
    """(arrays, sent): ``pack`` that also returns {number: thing} of every mutable thing sent (a reply
    names them so). ``comms(thing)``: the spec of an MPI thing (``["comm", handle, rank, size]``, or
    ``["mpi"]`` for one the call cannot use), or None for anything else."""
    packer = Packer(comms=comms)
    return packer.arrays(value), packer.sent


def unpack_call(arrays, *, comms=None, importing=True):
    """(value, seen): in the sandbox, the value and {id(thing): (number, thing, an array's copy)}.
    ``comms(handle, rank, size)``: the communicator to give the call for one of the grader's."""
    builder = Builder(comms=comms, importing=importing, keep=True)
    return builder.value(arrays), builder.seen


class Builder:
    """Builds the value of one message (in the sandbox: a call), numbering every mutable thing."""

    def __init__(self, comms=None, importing=False, keep=False):
        self.comms, self.importing = comms, importing
        self.keep = keep                   # the sandbox: each array as it came (to see what the call changed)
        self.memo, self.seen, self.proxies = {}, {}, {}

    def value(self, arrays):
        try:
            text = str(arrays["__values__"])
            if len(text) > MAX_TEXT:
                raise ValueError(f"a spec of {len(text)} characters")
            return self.build(json.loads(text), arrays, 0)
        except (KeyError, TypeError, IndexError, AttributeError, RecursionError, json.JSONDecodeError) as error:
            raise ValueError(f"not a packed value ({type(error).__name__}: {str(error)[:200]})") from None

    def _register(self, node, made):
        """Number a new thing (``node``'s n)."""
        n = node[0] if node else None
        if n is not None and (type(n) is not int or n in self.memo):
            raise ValueError(f"a number {n!r} used twice or not a number")
        self.memo[n] = made
        self.seen[id(made)] = (n, made, made.copy() if self.keep and isinstance(made, np.ndarray) else None)
        return made

    def build(self, node, arrays, depth):
        if depth > MAX_DEPTH or not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError("a malformed or too deep spec")
        kind, rest, down = node[0], node[1:], depth + 1

        def items(children):
            if not isinstance(children, list):
                raise ValueError(f"{kind}: items are not a list")
            return [self.build(child, arrays, down) for child in children]

        if kind == "atom" and rest and (rest[0] is None or isinstance(rest[0], (bool, str))):
            return rest[0]
        if kind == "int" and isinstance(rest[0], str) and len(rest[0]) < 5000:
            return int(rest[0])
        if kind == "float" and isinstance(rest[0], str):
            return float(rest[0])
        if kind == "ref" and type(rest[0]) is int and rest[0] in self.memo:
            return self.memo[rest[0]]
        if kind == "comm" and len(rest) == 3 and all(type(i) is int for i in rest) and self.comms is not None:
            if rest[0] not in self.proxies:            # one stand-in per communicator of the grader's
                self.proxies[rest[0]] = self.comms(*rest)
            return self.proxies[rest[0]]
        if kind == "mpi" and not rest:
            return codec.Unreachable()
        if kind in ("array", "scalar"):
            array = arrays[rest[0]]
            if not isinstance(array, np.ndarray) or array.dtype.hasobject or not rest[0].startswith("v"):
                raise ValueError(f"{rest[0]!r} is not an array of the message")
            if kind == "scalar":
                return array[()]
            return self._register(rest[1:], array)
        if kind == "view":
            base = self.build(rest[1], arrays, down)
            offset, shape, strides, dtype = rest[2:6]
            if not (isinstance(base, np.ndarray) and base.flags.c_contiguous and type(offset) is int and offset >= 0
                    and all(type(i) is int for i in [*shape, *strides]) and len(shape) == len(strides)):
                raise ValueError("view: not a view of an array of the message")
            dtype = np.dtype(dtype)
            if dtype.hasobject:
                raise ValueError(f"view: the dtype {dtype}")
            view = np.ndarray(tuple(shape), dtype, buffer=base, offset=offset, strides=tuple(strides))
            return self._register(rest[:1], view)
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
            return self._register(rest[1:], generator)
        if kind in ("namedtuple", "dataclass"):
            module, _, name = rest[0].partition(":")
            cls = codec.resolve(module, name, self.importing)
            if kind == "namedtuple" and isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
                return cls(*items(rest[1]))
            if kind == "dataclass" and isinstance(cls, type) and dataclasses.is_dataclass(cls) \
                    and isinstance(rest[1], list):
                names = [pair[0] for pair in rest[1] if isinstance(pair, list) and len(pair) == 2]
                if names != [field.name for field in dataclasses.fields(cls)]:
                    raise ValueError(f"{rest[0]!r}: fields {names[:20]}")
                return cls(**{pair[0]: self.build(pair[1], arrays, down) for pair in rest[1]})
            raise ValueError(f"{rest[0]!r} is not a {kind} of the project's packages")
        if kind == "tuple":
            return tuple(items(rest[0]))
        if kind == "list":
            made = self._register(rest[1:], [])
            made.extend(items(rest[0]))
            return made
        if kind == "set":
            made = self._register(rest[1:], set())
            made.update(_hashable(item) for item in items(rest[0]))
            return made
        if kind == "frozenset":
            return frozenset(_hashable(item) for item in items(rest[0]))
        if kind == "values":
            return dict(enumerate(items(rest[0]))).values()
        if kind in codec.DICTS:
            if not isinstance(rest[0], list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in rest[0]):
                raise ValueError("dict: not a list of pairs")
            made = self._register(rest[1:], codec.DICTS[kind]())
            made.update({_hashable(self.build(k, arrays, down)): self.build(v, arrays, down) for k, v in rest[0]})
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
        if kind == "object" and len(rest) == 3 and isinstance(rest[1], str) and isinstance(rest[2], list):
            module, _, name = rest[1].partition(":")
            cls = codec.resolve(module, name, self.importing)
            if not codec.plain_class(cls):
                raise ValueError(f"{rest[1]!r} is not a class of the project's packages that an object may be of")
            made = self._register(rest[:1], object.__new__(cls))
            fields = {}
            for pair in rest[2]:
                if not (isinstance(pair, list) and len(pair) == 2 and codec.field_allowed(cls, pair[0])):
                    raise ValueError(f"{rest[1]}: a field {str(pair)[:60]} that is not a plain name of its class")
                fields[pair[0]] = self.build(pair[1], arrays, down)
            vars(made).update(fields)
            return made
        if kind == "closure" and len(rest) == 7:
            return self._closure(rest, arrays, down)
        if kind == "method" and len(rest) == 2:
            owner = self.build(rest[0], arrays, down)
            function = inspect.getattr_static(type(owner), rest[1], None) if isinstance(rest[1], str) else None
            if isinstance(function, types.FunctionType) and codec.resolve(function.__module__, function.__qualname__) \
                    is function and codec.plain_class(type(owner)):
                return types.MethodType(function, owner)
            raise ValueError(f"a method {str(rest[1])[:60]} that its object's class does not define")
        if kind == "partial" and len(rest) == 4:
            function, args, keywords = (self.build(part, arrays, down) for part in rest[1:])
            if callable(function) and isinstance(args, tuple) and isinstance(keywords, dict):
                return self._register(rest[:1], functools.partial(function, *args, **keywords))
        raise ValueError(f"a spec of kind {kind!r}")

    def _closure(self, rest, arrays, down):
        """A closure: its code found again on this side by name, its cells filled by name (a free
        variable that the message does not give stays empty: reading it is a NameError)."""
        module, qualname, index, cells, defaults, kwdefaults = rest[1:]
        if not (isinstance(cells, list) and all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                                                for pair in cells)):
            raise ValueError("closure: cells are not a list of [name, value]")
        code = codec.code_of(module, qualname, index, self.importing)
        if code is None:
            raise ValueError(f"a closure {str(qualname)[:80]} that this side's code does not have")
        boxes = {name: types.CellType() for name in code.co_freevars}
        made = types.FunctionType(code, sys.modules[module].__dict__, code.co_name, None, tuple(boxes.values()))
        self._register(rest[:1], made)
        filled = {name: self.build(cell, arrays, down) for name, cell in cells}
        defaults, kwdefaults = self.build(defaults, arrays, down), self.build(kwdefaults, arrays, down)
        if not (defaults is None or isinstance(defaults, tuple)) or \
                not (kwdefaults is None or isinstance(kwdefaults, dict)):
            raise ValueError("closure: defaults that are not a tuple or a dict")
        for name, box in boxes.items():
            if name in filled:
                box.cell_contents = filled[name]
        made.__defaults__, made.__kwdefaults__ = defaults, kwdefaults
        return made
