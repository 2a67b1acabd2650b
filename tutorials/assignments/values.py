"""Python values as arrays plus one JSON text: how a graded call's arguments and reply cross the sandbox.

    arrays = pack(value)          # {"__values__": JSON text, "v0": array, "v1": array, ...}
    value = unpack(arrays)        # the same value back; raises ValueError on anything malformed

What crosses: None, bool, int, float, str, NumPy arrays and scalars (kept as arrays: dtype and
shape exact), dtypes, lists, tuples, dicts, a dict's values view, ranges, namedtuples and
dataclasses of the project's own packages, and NumPy random generators (the bit generator's name and state, so a
generator advanced in the sandbox can be advanced the same way here: ``copy_back``). Never a
class the reply names freely, never a function, never pickle: the receiving side builds each
value from the JSON's small vocabulary, and ``unpack`` checks every piece (a reply is written by
student code). A namedtuple or dataclass is rebuilt only from a class of minidl, collectives or
algorithms that this process has already imported, with exactly that class's fields.
"""
import dataclasses
import json
import sys

import numpy as np

GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")
PACKAGES = ("minidl.", "collectives.", "algorithms.")
MAX_DEPTH, MAX_TEXT = 64, 1 << 22


def pack(value):
    """{"__values__": the JSON spec, "v<i>": each array}: only arrays and one string, for the sandbox's npz."""
    arrays = {}

    def spec(v, depth):
        if depth > MAX_DEPTH:
            raise TypeError("a value nested more than 64 deep cannot cross the sandbox")
        if isinstance(v, (np.ndarray, np.generic)):     # first: numpy's float64 is also a float
            if v.dtype.hasobject:
                raise TypeError("an object array cannot cross the sandbox (it would need pickle)")
            key = f"v{len(arrays)}"
            arrays[key] = np.asarray(v)
            return ["array" if isinstance(v, np.ndarray) else "scalar", key]
        if v is None or isinstance(v, (bool, str)):
            return ["atom", v]
        if isinstance(v, int):
            return ["int", str(v)]                    # exact, whatever its size
        if isinstance(v, float):
            return ["float", repr(v)]                 # nan and inf too
        if isinstance(v, np.dtype):
            if v.hasobject or v.fields is not None:
                raise TypeError(f"the dtype {v} cannot cross the sandbox")
            return ["dtype", v.str]
        if isinstance(v, np.random.Generator):
            return ["generator", json.dumps(v.bit_generator.state, default=lambda a: np.asarray(a).tolist())]
        if isinstance(v, tuple) and hasattr(type(v), "_fields"):
            return ["namedtuple", f"{type(v).__module__}:{type(v).__qualname__}", [spec(x, depth + 1) for x in v]]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return ["dataclass", f"{type(v).__module__}:{type(v).__qualname__}",
                    [[field.name, spec(getattr(v, field.name), depth + 1)] for field in dataclasses.fields(v)]]
        if isinstance(v, (tuple, list)):
            return [type(v).__name__, [spec(x, depth + 1) for x in v]]
        if isinstance(v, type({}.values())):
            return ["values", [spec(x, depth + 1) for x in v]]
        if isinstance(v, dict):
            return ["dict", [[spec(k, depth + 1), spec(x, depth + 1)] for k, x in v.items()]]
        if isinstance(v, range):
            return ["range", [v.start, v.stop, v.step]]
        raise TypeError(f"a {type(v).__name__} cannot cross the sandbox")

    text = json.dumps(spec(value, 0))
    return {"__values__": np.array(text), **arrays}


def unpack(arrays):
    """The value ``pack`` made, from {"__values__": ..., "v<i>": ...}; ValueError if it is not one."""
    try:
        text = str(arrays["__values__"])
        if len(text) > MAX_TEXT:
            raise ValueError(f"a spec of {len(text)} characters")
        return _build(json.loads(text), arrays, 0)
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError, json.JSONDecodeError) as error:
        raise ValueError(f"not a packed value ({type(error).__name__}: {str(error)[:200]})") from None


def _build(node, arrays, depth):
    if depth > MAX_DEPTH or not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise ValueError("a malformed or too deep spec")
    kind, rest = node[0], node[1:]

    def items(children):
        if not isinstance(children, list):
            raise ValueError(f"{kind}: items are not a list")
        return [_build(child, arrays, depth + 1) for child in children]

    if kind == "atom" and rest and (rest[0] is None or isinstance(rest[0], (bool, str))):
        return rest[0]
    if kind == "int" and isinstance(rest[0], str) and len(rest[0]) < 5000:
        return int(rest[0])
    if kind == "float" and isinstance(rest[0], str):
        return float(rest[0])
    if kind in ("array", "scalar"):
        array = arrays[rest[0]]
        if not isinstance(array, np.ndarray) or array.dtype.hasobject or not rest[0].startswith("v"):
            raise ValueError(f"{rest[0]!r} is not an array of the reply")
        return array if kind == "array" else array[()]
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
        return generator
    if kind in ("namedtuple", "dataclass"):
        module, _, name = rest[0].partition(":")
        owner = sys.modules.get(module) if module.startswith(PACKAGES) else None
        cls = getattr(owner, name, None) if owner is not None and name.isidentifier() else None
        if kind == "namedtuple" and isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return cls(*items(rest[1]))
        if kind == "dataclass" and isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(rest[1], list):
            names = [pair[0] for pair in rest[1] if isinstance(pair, list) and len(pair) == 2]
            if names != [field.name for field in dataclasses.fields(cls)]:
                raise ValueError(f"{rest[0]!r}: fields {names[:20]}")
            return cls(**{pair[0]: _build(pair[1], arrays, depth + 1) for pair in rest[1]})
        raise ValueError(f"{rest[0]!r} is not a {kind} of the project's packages")
    if kind in ("tuple", "list"):
        return (tuple if kind == "tuple" else list)(items(rest[0]))
    if kind == "values":
        return dict(enumerate(items(rest[0]))).values()
    if kind == "dict":
        if not isinstance(rest[0], list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in rest[0]):
            raise ValueError("dict: not a list of pairs")
        return {_hashable(_build(k, arrays, depth + 1)): _build(v, arrays, depth + 1) for k, v in rest[0]}
    if kind == "range" and isinstance(rest[0], list) and len(rest[0]) == 3 and all(type(i) is int for i in rest[0]):
        return range(*rest[0])
    raise ValueError(f"a spec of kind {kind!r}")


def _hashable(key):
    hash(key)                                     # TypeError (a list as a key): caught by unpack
    return key


def _state(state):
    """A bit generator's state as numpy wants it back (MT19937 keeps its key as a uint32 array)."""
    inner = state.get("state")
    if state["bit_generator"] == "MT19937" and isinstance(inner, dict):
        state = {**state, "state": {**inner, "key": np.asarray(inner.get("key"), dtype=np.uint32)}}
    return state


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
