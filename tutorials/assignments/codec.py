"""One half of tutorials/assignments/values.py: ``Packer``, a call's value -> one JSON spec and its
arrays. Read values.py's docstring first.

Spec nodes (JSON lists): ``[kind, ...]``. Mutable things carry a number ``n`` (unique in one
message; ``["ref", n]`` is the same thing again, so shared references and cycles survive), by
which the sandbox's reply names the things it changed (tutorials/assignments/replies.py). This
direction carries the project's objects, functions and closures by name, because the sandbox
rebuilds them from the student's tree and nothing it builds runs on the grader's side; the
reply direction carries data only. This file imports nothing of the project: the sandbox loads
it from beside its driver.
"""
import collections
import dataclasses
import functools
import inspect
import json
import sys
import types

import numpy as np

GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")
PACKAGES = ("minidl.", "collectives.", "algorithms.")
HELPERS = ("tests.handed", "tests.helpers")   # what tests hand to graded functions (in every student tree)
MODULES = ("numpy",)                  # modules outside PACKAGES that may cross (by name)


def ours(module):
    """Whether ``module`` (a name) is of the project's packages, or the tests' helpers."""
    return isinstance(module, str) and (module.startswith(PACKAGES) or module in HELPERS)
MAX_DEPTH, MAX_TEXT = 250, 1 << 24
DICTS = {"dict": dict, "counter": collections.Counter, "ordereddict": collections.OrderedDict}
def resolve(module, qualname, importing=False):
    """The class or function ``module:qualname`` of the project's packages in this side's tree, or None.

    Only a module of ``PACKAGES`` or ``HELPERS`` (imported already, unless ``importing``), only a name that the
    module defines itself (its ``__module__`` and ``__qualname__`` say so)."""
    if not (isinstance(module, str) and ours(module) and isinstance(qualname, str)):
        return None
    owner = sys.modules.get(module)
    if owner is None and importing:
        try:
            owner = __import__("importlib").import_module(module)
        except ImportError:
            return None
    found = owner
    for part in qualname.split("."):
        if found is None or not part.isidentifier():
            return None
        found = vars(found).get(part) if isinstance(found, (type, types.ModuleType)) else None
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    if isinstance(found, (type, types.FunctionType)) and found.__module__ == module and found.__qualname__ == qualname:
        return found
    return None


def code_of(module, qualname, index, importing=False):
    """The ``index``-th code object named ``qualname`` (a nested function: ``f.<locals>.g``) inside
    its outermost function in this side's tree, or None."""
    outer = resolve(module, qualname.split(".<locals>.")[0], importing) if isinstance(qualname, str) else None
    found = []

    def walk(code):
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                if const.co_qualname == qualname:
                    found.append(const)
                walk(const)
    if isinstance(outer, types.FunctionType):
        walk(outer.__code__)
    return found[index] if isinstance(index, int) and 0 <= index < len(found) else None


def closure_index(function):
    """Where ``function``'s code is among the codes of its name in its module (None: not findable)."""
    module, qualname = function.__module__, function.__qualname__
    for index in range(64):
        code = code_of(module, qualname, index)
        if code is None:
            return None
        if code is function.__code__:
            return index
    return None


@functools.lru_cache(maxsize=4096)
def plain_class(cls):
    """Whether instances of ``cls`` may cross as objects: a class of the project's own packages
    (every class it derives from too, but ``object``), found again by its name, without slots."""
    return (isinstance(cls, type) and resolve(cls.__module__, cls.__qualname__) is cls
            and all(base is object or (ours(base.__module__) and "__slots__" not in vars(base))
                    for base in cls.__mro__))


@functools.lru_cache(maxsize=65536)
def field_allowed(cls, name):
    """A field may not shadow a method, property or any other callable or descriptor of its class."""
    if not (isinstance(name, str) and 0 < len(name) < 200) or name.startswith("__"):   # Sequential's "0", "1"
        return False
    attribute = inspect.getattr_static(cls, name, None)
    return not (callable(attribute) or hasattr(type(attribute), "__get__"))



class Closure:
    """A closure of the task's code to call in the sandbox: its code's name and the cells to give it
    (the grader does not run the student's code, so it sends the name and the enclosing variables)."""

    def __init__(self, module, qualname, index, cells):
        self.spec = (module, qualname, index, cells, None, None)


class Unreachable:
    """In the sandbox, an MPI object of the grader's that the call cannot use (a pending request, a
    window, a communicator of a whole run's other ranks): held, and any use raises."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f".{name}: this MPI object is the grader's; the graded call runs in the sandbox "
                           "and cannot use it")


class Packer:
    """A call's value -> one JSON spec and its arrays (the grader's side: it may hold anything of the project's)."""

    def __init__(self, comms=None):
        self.comms = comms                # an MPI thing -> its spec (["comm", handle, rank, size] or ["mpi"])
        self.sent, self.numbers, self.blobs = {}, {}, {}

    def arrays(self, value):
        text = json.dumps(self.spec(value, 0))
        return {"__values__": np.array(text), **self.blobs}

    def _number(self, v):
        n = len(self.sent)
        self.sent[n], self.numbers[id(v)] = v, n
        return [n]

    def _blob(self, array):
        key = f"v{len(self.blobs)}"
        self.blobs[key] = np.asarray(array)
        return key

    def spec(self, v, depth):
        if depth > MAX_DEPTH:
            raise TypeError(f"a value nested more than {MAX_DEPTH} deep cannot cross the sandbox")
        if id(v) in self.numbers and self.sent[self.numbers[id(v)]] is v:
            return ["ref", self.numbers[id(v)]]
        mpi = self.comms(v) if self.comms is not None else None
        if mpi is not None:
            return mpi
        if type(v).__module__ == "mpi4py.MPI":
            raise TypeError(f"an MPI {type(v).__name__} cannot cross the sandbox here")
        down = depth + 1
        if isinstance(v, (np.ndarray, np.generic)):     # first: numpy's float64 is also a float
            if v.dtype.hasobject:
                raise TypeError("an object array cannot cross the sandbox (it would need pickle)")
            if isinstance(v, np.generic):
                return ["scalar", self._blob(v)]
            base = v
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base is v or not base.flags.c_contiguous or base.dtype.hasobject:
                return ["array", self._blob(v), *self._number(v)]
            number = self._number(v)
            return ["view", *number, self.spec(base, down), v.__array_interface__["data"][0]
                    - base.__array_interface__["data"][0], list(v.shape), list(v.strides), v.dtype.str]
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
            state = json.dumps(v.bit_generator.state, default=lambda a: np.asarray(a).tolist())
            return ["generator", state, *self._number(v)]
        if isinstance(v, tuple) and hasattr(type(v), "_fields"):
            return ["namedtuple", f"{type(v).__module__}:{type(v).__qualname__}", [self.spec(x, down) for x in v]]
        if dataclasses.is_dataclass(v) and not isinstance(v, type) and (
                type(v).__dataclass_params__.frozen or not hasattr(v, "__dict__")):
            return ["dataclass", f"{type(v).__module__}:{type(v).__qualname__}",
                    [[field.name, self.spec(getattr(v, field.name), down)] for field in dataclasses.fields(v)]]
        if isinstance(v, tuple):
            return ["tuple", [self.spec(x, down) for x in v]]
        if isinstance(v, list):
            number = self._number(v)
            return ["list", [self.spec(x, down) for x in v], *number]
        if isinstance(v, (set, frozenset)):
            number = self._number(v) if type(v) is set else []
            return [type(v).__name__, [self.spec(x, down) for x in v], *number]
        if isinstance(v, type({}.values())):
            return ["values", [self.spec(x, down) for x in v]]
        if isinstance(v, dict) and type(v) in DICTS.values():
            number = self._number(v)
            kind = next(name for name, cls in DICTS.items() if cls is type(v))
            return [kind, [[self.spec(k, down), self.spec(x, down)] for k, x in v.items()], *number]
        if isinstance(v, range):
            return ["range", [v.start, v.stop, v.step]]
        if isinstance(v, types.ModuleType) and (v.__name__ in MODULES or ours(v.__name__)):
            return ["module", v.__name__]
        if isinstance(v, Closure):
            return self._closure(v, *v.spec, down)
        if isinstance(v, (types.FunctionType, type)) and resolve(v.__module__, v.__qualname__) is v:
            return ["function", v.__module__, v.__qualname__]
        if isinstance(v, types.FunctionType) and "<locals>" in v.__qualname__ and ours(v.__module__):
            index = closure_index(v)
            if index is None:
                raise TypeError(f"the closure {v.__qualname__} is not found again by its name: it cannot cross")
            cells = {name: cell.cell_contents for name, cell in zip(v.__code__.co_freevars, v.__closure__ or ())
                     if _full(cell)}
            return self._closure(v, v.__module__, v.__qualname__, index, cells, v.__defaults__, v.__kwdefaults__, down)
        if isinstance(v, types.MethodType) and inspect.getattr_static(type(v.__self__), v.__name__, None) is v.__func__:
            return ["method", self.spec(v.__self__, down), v.__name__]
        if isinstance(v, functools.partial):
            number = self._number(v)
            return ["partial", *number, self.spec(v.func, down), self.spec(v.args, down), self.spec(v.keywords, down)]
        if hasattr(v, "__dict__") and plain_class(type(v)):
            number, cls = self._number(v), type(v)
            for name in vars(v):
                if not field_allowed(cls, name):
                    raise TypeError(f"{cls.__qualname__}.{name}: a field that shadows its class's {name} cannot cross")
            return ["object", *number, f"{cls.__module__}:{cls.__qualname__}",
                    [[name, self.spec(x, down)] for name, x in vars(v).items()]]
        what = getattr(v, "__qualname__", type(v).__qualname__)
        raise TypeError(f"a {type(v).__module__}.{type(v).__qualname__} ({getattr(v, '__module__', '?')}.{what}) "
                        "cannot cross the sandbox (not a plain "
                        "value, nor an object, function or closure of minidl, collectives or algorithms)")

    def _closure(self, v, module, qualname, index, cells, defaults, kwdefaults, down):
        number = self._number(v)
        return ["closure", *number, module, qualname, index,
                [[name, self.spec(cell, down)] for name, cell in cells.items()],
                self.spec(defaults, down), self.spec(kwdefaults, down)]


def _full(cell):
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def hashable(key):
    hash(key)                                     # TypeError (a list as a key): caught by unpack
    return key


def state(state):
    """A bit generator's state as numpy wants it back (MT19937 keeps its key as a uint32 array)."""
    inner = state.get("state")
    if state["bit_generator"] == "MT19937" and isinstance(inner, dict):
        state = {**state, "state": {**inner, "key": np.asarray(inner.get("key"), dtype=np.uint32)}}
    return state
