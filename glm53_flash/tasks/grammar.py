"""A small typed grammar of Python functions: the operations of the compositions suite.

A behaviour is a chain of one to three operations applied to the argument (`x: int`, `text: str` or
`values: list[int]`), or a conditional `A if P else B` over an int; each operation may carry constants.
From one chain come three things that always agree: the reference body (rendered with Python's
precedence rules, only the names the verifier's policy allows, no attribute access), the value it
computes (`apply`, plain Python, used to compute every expected output) and two English descriptions
(imperative steps, and one noun phrase). tests/test_compositions.py checks the rendered code against
`apply` on every strong input of every behaviour.

Lists flow through comprehensions: maps and filters in a row become one `[... for v in ... if ...]`,
and a reducer over a pending comprehension takes the generator form (`sum(v * 2 for v in values)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

INT, BOOL, STR, LIST = "int", "bool", "str", "list"
ARGUMENT_NAMES = {INT: "x", STR: "text", LIST: "values"}
INPUT_TYPES = (INT, STR, LIST)
# The builtins a reference body may call: a subset of the verifier's eight (a test checks that).
REFERENCE_BUILTINS = ("abs", "len", "max", "min", "str", "sum")

# Python's precedence levels, low to high, as far as the grammar needs them.
CONDITIONAL, COMPARISON, ADDITIVE, MULTIPLICATIVE, UNARY, POWER, ATOM = range(7)


@dataclass(frozen=True)
class Expr:
    """Source text and the precedence of its outermost operator."""

    text: str
    level: int = ATOM


def _wrap(expr: Expr, below: int) -> str:
    """The expression's text, in parentheses when its operator binds less tightly than `below`."""
    return f"({expr.text})" if expr.level < below else expr.text


def binary(left: Expr, operator: str, right: Expr, level: int) -> Expr:
    # left-associative: a right operand at the same level needs parentheses (x - (y - 1))
    return Expr(f"{_wrap(left, level)} {operator} {_wrap(right, level + 1)}", level)


def power(base: Expr, exponent: int) -> Expr:
    # right-associative, and a unary minus on the base must stay inside: (-x) ** 2
    return Expr(f"{_wrap(base, POWER + 1)} ** {exponent}", POWER)


def compare(left: Expr, operator: str, right: Expr) -> Expr:
    # comparisons chain in Python (a < b == c), so an operand that is itself one gets parentheses
    return Expr(f"{_wrap(left, COMPARISON + 1)} {operator} {_wrap(right, COMPARISON + 1)}", COMPARISON)


def negate(operand: Expr) -> Expr:
    # -(x ** 2) rather than -x ** 2, which means the same but reads as (-x) ** 2
    return Expr(f"-{_wrap(operand, ATOM)}", UNARY)


def call(name: str, *arguments: str) -> Expr:
    return Expr(f"{name}({', '.join(arguments)})")


def subscript(value: Expr, index: str) -> Expr:
    return Expr(f"{_wrap(value, ATOM)}[{index}]")


def number(value: int) -> Expr:
    return Expr(str(value), ATOM if value >= 0 else UNARY)


def string(value: str) -> Expr:
    if '"' in value or "\\" in value:
        raise ValueError(f"string constants are plain text, got {value!r}")
    return Expr(f'"{value}"')


# --------------------------------------------------------------------------- lists


@dataclass(frozen=True)
class ListPipe:
    """A list being built: `source` (an expression of the list), then maps (`element`, written over the
    loop variable `v`) and filters (`conditions`) not yet written out as a comprehension."""

    source: Expr
    element: Expr | None = None
    conditions: tuple[Expr, ...] = ()

    @property
    def pending(self) -> bool:
        return self.element is not None or bool(self.conditions)

    def current(self) -> Expr:
        return self.element if self.element is not None else Expr("v")

    def comprehension(self, element: Expr | None = None, brackets: bool = True) -> str:
        element = self.current() if element is None else element
        text = f"{element.text} for v in {_wrap(self.source, ATOM)}"
        if self.conditions:
            text += " if " + " and ".join(_wrap(c, COMPARISON) for c in self.conditions)
        return f"[{text}]" if brackets else text

    def expression(self) -> Expr:
        return Expr(self.comprehension()) if self.pending else self.source


LOOP = Expr("v")


# --------------------------------------------------------------------------- operations


@dataclass(frozen=True)
class Op:
    """One operation. `code(inner, constants)` renders it over the inner expression (an Expr, or a
    ListPipe for list inputs); `apply(value, constants)` computes it; `step` is an imperative phrase
    over `{it}` (the argument's name in the first step, "it" or "them" later), `noun` a noun phrase
    over `{e}` (a compound inner phrase is put in parentheses); `stem` starts the entry point's name."""

    name: str
    takes: str
    gives: str
    constants: tuple[tuple, ...]
    code: Callable[..., Any]
    apply: Callable[..., Any]
    step: str
    noun: str
    stem: str

    def phrase(self, template: str, constants: tuple) -> str:
        return template.format(**_constant_words(self.name, constants), it="{it}", e="{e}")


def _constant_words(name: str, constants: tuple) -> dict:
    words = {}
    if constants:
        words["c"] = constants[0]
        words["s"] = constants[0]
        if len(constants) > 1:
            words["m"], words["r"] = constants
        if isinstance(constants[0], int):
            n = constants[0]
            words["nth"] = {2: "second", 3: "third"}.get(n, f"{n}th")
            words["chars"] = f"{n} character" + ("" if n == 1 else "s")
            words["vals"] = f"{n} value" + ("" if n == 1 else "s")
    return words


def _one(values) -> tuple[tuple, ...]:
    return tuple((v,) for v in values)


def _int_ops() -> list[Op]:
    def op(name, code, apply, step, noun, stem, constants=(), gives=INT):
        return Op(name, INT, gives, constants, code, apply, step, noun, stem)

    return [
        op("add", lambda e, c: binary(e, "+", number(c[0]), ADDITIVE), lambda x, c: x + c[0],
           "add {c} to {it}", "{e} plus {c}", "add", _one(range(1, 10))),
        op("sub", lambda e, c: binary(e, "-", number(c[0]), ADDITIVE), lambda x, c: x - c[0],
           "subtract {c} from {it}", "{e} minus {c}", "sub", _one(range(1, 10))),
        op("mul", lambda e, c: binary(e, "*", number(c[0]), MULTIPLICATIVE), lambda x, c: x * c[0],
           "multiply {it} by {c}", "{e} times {c}", "scale", _one(range(2, 10))),
        op("floordiv", lambda e, c: binary(e, "//", number(c[0]), MULTIPLICATIVE), lambda x, c: x // c[0],
           "floor-divide {it} by {c}", "{e} floor-divided by {c}", "split", _one(range(2, 10))),
        op("mod", lambda e, c: binary(e, "%", number(c[0]), MULTIPLICATIVE), lambda x, c: x % c[0],
           "take {it} mod {c}", "{e} mod {c}", "wrap", _one(range(2, 10))),
        op("neg", lambda e, c: negate(e), lambda x, c: -x, "negate {it}", "minus {e}", "negate"),
        op("square", lambda e, c: power(e, 2), lambda x, c: x * x, "square {it}", "{e} squared", "square"),
        op("abs", lambda e, c: call("abs", e.text), lambda x, c: abs(x), "take the absolute value of {it}",
           "the absolute value of {e}", "magnitude"),
        op("atleast", lambda e, c: call("max", e.text, number(c[0]).text), lambda x, c: max(x, c[0]),
           "raise {it} to at least {c}", "the larger of {e} and {c}", "floor", _one(range(-3, 6))),
        op("atmost", lambda e, c: call("min", e.text, number(c[0]).text), lambda x, c: min(x, c[0]),
           "cap {it} at {c}", "the smaller of {e} and {c}", "cap", _one(range(-3, 6))),
        op("gt", lambda e, c: compare(e, ">", number(c[0])), lambda x, c: x > c[0],
           "check whether {it} is greater than {c}", "whether {e} is greater than {c}", "above",
           _one(range(-3, 10)), gives=BOOL),
        op("lt", lambda e, c: compare(e, "<", number(c[0])), lambda x, c: x < c[0],
           "check whether {it} is less than {c}", "whether {e} is less than {c}", "below",
           _one(range(-3, 10)), gives=BOOL),
        op("eq", lambda e, c: compare(e, "==", number(c[0])), lambda x, c: x == c[0],
           "check whether {it} equals {c}", "whether {e} equals {c}", "equals", _one(range(-3, 10)), gives=BOOL),
        op("divisible", lambda e, c: compare(binary(e, "%", number(c[0]), MULTIPLICATIVE), "==", number(0)),
           lambda x, c: x % c[0] == 0, "check whether {it} is divisible by {c}",
           "whether {e} is divisible by {c}", "divides", _one(range(2, 10)), gives=BOOL),
        op("remainder", lambda e, c: compare(binary(e, "%", number(c[0]), MULTIPLICATIVE), "==", number(c[1])),
           lambda x, c: x % c[0] == c[1], "check whether {it} mod {m} is {r}", "whether {e} mod {m} is {r}",
           "leaves", tuple((m, r) for m in range(3, 7) for r in range(1, m)), gives=BOOL),
        op("indivisible", lambda e, c: compare(binary(e, "%", number(c[0]), MULTIPLICATIVE), "!=", number(0)),
           lambda x, c: x % c[0] != 0, "check whether {it} is not divisible by {c}",
           "whether {e} is not divisible by {c}", "odd", _one(range(2, 10)), gives=BOOL),
        op("digits", lambda e, c: call("str", e.text), lambda x, c: str(x), "write {it} as a string",
           "{e} as a string", "text", gives=STR),
    ]


_CHARACTERS = ("a", "e", "o", "b", " ", "x")
_AFFIXES = ("!", "?", "ab", "xy", "-", " ")


def _str_ops() -> list[Op]:
    def op(name, code, apply, step, noun, stem, constants=(), gives=STR):
        return Op(name, STR, gives, constants, code, apply, step, noun, stem)

    return [
        op("reverse", lambda e, c: subscript(e, "::-1"), lambda t, c: t[::-1], "reverse {it}", "{e} reversed",
           "reverse"),
        op("head", lambda e, c: subscript(e, f":{c[0]}"), lambda t, c: t[:c[0]],
           "keep the first {chars} of {it}", "the first {chars} of {e}", "head", _one(range(1, 6))),
        op("behead", lambda e, c: subscript(e, f"{c[0]}:"), lambda t, c: t[c[0]:],
           "drop the first {chars} of {it}", "{e} without its first {chars}", "behead",
           _one(range(1, 6))),
        op("tail", lambda e, c: subscript(e, f"-{c[0]}:"), lambda t, c: t[-c[0]:],
           "keep the last {chars} of {it}", "the last {chars} of {e}", "tail", _one(range(1, 6))),
        op("curtail", lambda e, c: subscript(e, f":-{c[0]}"), lambda t, c: t[:-c[0]],
           "drop the last {chars} of {it}", "{e} without its last {chars}", "curtail",
           _one(range(1, 6))),
        op("stride", lambda e, c: subscript(e, f"::{c[0]}"), lambda t, c: t[::c[0]],
           "keep every {nth} character of {it}", "every {nth} character of {e}", "stride", _one((2, 3))),
        op("append", lambda e, c: binary(e, "+", string(c[0]), ADDITIVE), lambda t, c: t + c[0],
           'append "{s}" to {it}', '{e} followed by "{s}"', "suffix", _one(_AFFIXES)),
        op("prepend", lambda e, c: binary(string(c[0]), "+", e, ADDITIVE), lambda t, c: c[0] + t,
           'put "{s}" before {it}', '"{s}" followed by {e}', "prefix", _one(_AFFIXES)),
        op("repeat", lambda e, c: binary(e, "*", number(c[0]), MULTIPLICATIVE), lambda t, c: t * c[0],
           "repeat {it} {c} times", "{e} repeated {c} times", "repeat", _one((2, 3))),
        op("length", lambda e, c: call("len", e.text), lambda t, c: len(t), "count the characters of {it}",
           "the length of {e}", "length", gives=INT),
        op("count", lambda e, c: Expr(f"sum(ch == {string(c[0]).text} for ch in {_wrap(e, ATOM)})"),
           lambda t, c: sum(ch == c[0] for ch in t), 'count the "{s}" characters in {it}',
           'the number of "{s}" in {e}', "count", _one(_CHARACTERS), gives=INT),
        op("contains", lambda e, c: compare(string(c[0]), "in", e), lambda t, c: c[0] in t,
           'check whether {it} contains "{s}"', 'whether {e} contains "{s}"', "has", _one(_CHARACTERS),
           gives=BOOL),
        op("palindrome", lambda e, c: compare(e, "==", subscript(e, "::-1")), lambda t, c: t == t[::-1],
           "check whether {it} reads the same reversed", "whether {e} is a palindrome", "mirrors", gives=BOOL),
        op("starts", lambda e, c: compare(subscript(e, ":1"), "==", string(c[0])), lambda t, c: t[:1] == c[0],
           'check whether {it} starts with "{s}"', 'whether {e} starts with "{s}"', "starts", _one(_CHARACTERS),
           gives=BOOL),
        op("ends", lambda e, c: compare(subscript(e, "-1:"), "==", string(c[0])), lambda t, c: t[-1:] == c[0],
           'check whether {it} ends with "{s}"', 'whether {e} ends with "{s}"', "ends", _one(_CHARACTERS),
           gives=BOOL),
    ]


def _map(name, int_op: Op, step, noun, stem, constants=()) -> Op:
    """A list operation that applies an int operation to each value."""
    def code(pipe: ListPipe, c):
        return ListPipe(pipe.source, int_op.code(pipe.current(), c), pipe.conditions)

    return Op(name, LIST, LIST, constants, code, lambda xs, c: [int_op.apply(v, c) for v in xs], step, noun,
              stem)


def _keep(name, predicate: Op, step, noun, stem, constants) -> Op:
    """A list operation that keeps the values an int predicate holds for."""
    def code(pipe: ListPipe, c):
        condition = predicate.code(pipe.current(), c)
        return ListPipe(pipe.source, pipe.element, pipe.conditions + (condition,))

    def apply(xs, c):
        return [v for v in xs if predicate.apply(v, c)]

    return Op(name, LIST, LIST, constants, code, apply, step, noun, stem)


def _slice(name, index: Callable[[tuple], str], apply, step, noun, stem, constants=()) -> Op:
    """A list operation written as a subscript: of the source while no comprehension is pending."""
    def code(pipe: ListPipe, c):
        if pipe.pending:
            return ListPipe(subscript(pipe.expression(), index(c)))
        return ListPipe(subscript(pipe.source, index(c)))

    return Op(name, LIST, LIST, constants, code, apply, step, noun, stem)


def _reduce(name, write, apply, step, noun, stem, gives=INT, constants=()) -> Op:
    return Op(name, LIST, gives, constants, write, apply, step, noun, stem)


def _generator_call(function: str, pipe: ListPipe, *extra: str) -> Expr:
    if pipe.pending:
        generator = pipe.comprehension(brackets=False)
        argument = f"({generator})" if extra else generator
        return call(function, argument, *extra)
    return call(function, pipe.source.text, *extra)


def _list_ops(int_ops: dict[str, Op]) -> list[Op]:
    return [
        _map("each_add", int_ops["add"], "add {c} to each value", "{e} with {c} added to each", "shift",
             _one(range(1, 10))),
        _map("each_mul", int_ops["mul"], "multiply each value by {c}", "{e} with each times {c}", "scale",
             _one(range(2, 6))),
        _map("each_mod", int_ops["mod"], "take each value mod {c}", "{e} with each taken mod {c}", "wrap",
             _one(range(2, 6))),
        _map("each_square", int_ops["square"], "square each value", "the squares of {e}", "squares"),
        _map("each_abs", int_ops["abs"], "take the absolute value of each value", "the absolute values of {e}",
             "magnitudes"),
        _map("each_neg", int_ops["neg"], "negate each value", "{e} negated", "negate"),
        _keep("keep_above", int_ops["gt"], "keep the values above {c}", "the values of {e} above {c}",
              "above", _one(range(-3, 6))),
        _keep("keep_below", int_ops["lt"], "keep the values below {c}", "the values of {e} below {c}",
              "below", _one(range(-3, 6))),
        _keep("keep_multiples", int_ops["divisible"], "keep the values divisible by {c}",
              "the values of {e} divisible by {c}", "multiples", _one(range(2, 6))),
        _keep("drop_multiples", int_ops["indivisible"], "drop the values divisible by {c}",
              "the values of {e} not divisible by {c}", "sift", _one(range(2, 6))),
        _slice("reverse_list", lambda c: "::-1", lambda xs, c: xs[::-1], "reverse {it}", "{e} reversed", "reverse"),
        _slice("first", lambda c: f":{c[0]}", lambda xs, c: xs[:c[0]], "keep the first {vals} of {it}",
               "the first {vals} of {e}", "first", _one(range(1, 5))),
        _slice("skip", lambda c: f"{c[0]}:", lambda xs, c: xs[c[0]:], "drop the first {vals} of {it}",
               "{e} without its first {vals}", "skip", _one(range(1, 5))),
        _slice("alternate", lambda c: "::2", lambda xs, c: xs[::2], "keep every second of {it}",
               "every second value of {e}", "alternate"),
        _reduce("total", lambda p, c: _generator_call("sum", p), lambda xs, c: sum(xs), "sum {it}",
                "the sum of {e}", "total"),
        _reduce("size", lambda p, c: call("len", ListPipe(p.source, None, p.conditions).expression().text),
                lambda xs, c: len(xs), "count {it}", "the number of values in {e}", "size"),
        _reduce("largest", lambda p, c: _generator_call("max", p, "default=0"), lambda xs, c: max(xs, default=0),
                "take the largest of {it} (0 if none)", "the largest of {e} (0 if none)", "largest"),
        _reduce("smallest", lambda p, c: _generator_call("min", p, "default=0"), lambda xs, c: min(xs, default=0),
                "take the smallest of {it} (0 if none)", "the smallest of {e} (0 if none)", "smallest"),
        _reduce("member", lambda p, c: compare(number(c[0]), "in", p.expression()), lambda xs, c: c[0] in xs,
                "check whether {c} is in {it}", "whether {c} is in {e}", "has", gives=BOOL,
                constants=_one(range(0, 6))),
    ]


def _build_ops() -> dict[str, Op]:
    ints = _int_ops()
    by_name = {op.name: op for op in ints}
    ops = ints + _str_ops() + _list_ops(by_name)
    table = {op.name: op for op in ops}
    if len(table) != len(ops):
        raise AssertionError("operation names must be unique")
    return table


OPS: dict[str, Op] = _build_ops()
# Operations by the type they take, in table order (the enumeration order of structures).
OPS_TAKING: dict[str, tuple[Op, ...]] = {t: tuple(op for op in OPS.values() if op.takes == t)
                                         for t in (INT, STR, LIST, BOOL)}

# The branches of a conditional `A if P else B` over an int: the argument itself, a constant, or one
# int operation; the predicates: the int comparisons.
BRANCHES: tuple[str, ...] = ("same", "constant", "add", "sub", "mul", "neg", "square")
BRANCH_CONSTANTS = {"same": ((),), "constant": _one((-1, 0, 1, 2, 5, 10))}
PREDICATES: tuple[str, ...] = ("gt", "lt", "eq", "divisible")


# --------------------------------------------------------------------------- structures and behaviours


@dataclass(frozen=True)
class Structure:
    """The shape of a behaviour: its input type and operation names (a chain), or a conditional's
    predicate and two branches. `key` names it ("int:add>mul", "int:if(gt;same;constant)")."""

    takes: str
    ops: tuple[str, ...] = ()
    conditional: tuple[str, str, str] | None = None

    @property
    def key(self) -> str:
        if self.conditional is not None:
            return f"{self.takes}:if({';'.join(self.conditional)})"
        return f"{self.takes}:{'>'.join(self.ops)}"

    @property
    def size(self) -> int:
        """The number of operations (a conditional counts its predicate and both branches)."""
        return 3 if self.conditional is not None else len(self.ops)

    @property
    def operations(self) -> tuple[str, ...]:
        """Every operation it uses (a conditional: its predicate and the operations of its branches)."""
        if self.conditional is None:
            return self.ops
        predicate, *branches = self.conditional
        return (predicate, *(b for b in branches if b in OPS))

    def gives(self) -> str:
        if self.conditional is not None:
            return INT
        kind = self.takes
        for name in self.ops:
            op = OPS[name]
            if op.takes != kind:
                raise ValueError(f"{self.key}: {name} takes {op.takes}, gets {kind}")
            kind = op.gives
        return kind

    def constant_choices(self) -> list[tuple[tuple, ...]]:
        """The constants each slot may take (one slot per operation or branch)."""
        if self.conditional is None:
            return [OPS[name].constants or ((),) for name in self.ops]
        predicate, *branches = self.conditional
        return [OPS[predicate].constants] + [
            BRANCH_CONSTANTS.get(branch) or OPS[branch].constants or ((),) for branch in branches]


@dataclass(frozen=True)
class Behaviour:
    """A structure with its constants (one tuple per slot)."""

    structure: Structure
    constants: tuple[tuple, ...]

    @property
    def key(self) -> str:
        s = self.structure
        if s.conditional is not None:
            parts = [_slot_text(name, c) for name, c in zip(s.conditional, self.constants)]
            return f"{s.takes}:if({';'.join(parts)})"
        return f"{s.takes}:{'>'.join(_slot_text(name, c) for name, c in zip(s.ops, self.constants))}"

    @property
    def argument(self) -> str:
        return ARGUMENT_NAMES[self.structure.takes]

    def apply(self, value):
        s = self.structure
        if s.conditional is not None:
            predicate, yes, no = s.conditional
            test, a, b = self.constants
            return _branch(yes, a, value) if OPS[predicate].apply(value, test) else _branch(no, b, value)
        for name, c in zip(s.ops, self.constants):
            value = OPS[name].apply(value, c)
        return value

    def expression(self) -> str:
        s = self.structure
        argument = Expr(self.argument)
        if s.conditional is not None:
            predicate, yes, no = s.conditional
            test, a, b = self.constants
            condition = OPS[predicate].code(argument, test)
            left, right = _branch_code(yes, a, argument), _branch_code(no, b, argument)
            return (f"{_wrap(left, CONDITIONAL + 1)} if {_wrap(condition, CONDITIONAL + 1)} "
                    f"else {_wrap(right, CONDITIONAL)}")
        value: Expr | ListPipe = ListPipe(argument) if s.takes == LIST else argument
        for name, c in zip(s.ops, self.constants):
            value = OPS[name].code(value, c)
        return value.expression().text if isinstance(value, ListPipe) else value.text

    def body(self) -> str:
        return f"return {self.expression()}"

    def stem(self) -> str:
        s = self.structure
        return "choose" if s.conditional is not None else OPS[s.ops[-1]].stem

    def descriptions(self) -> tuple[str, str]:
        """Two English descriptions: imperative steps, then one noun phrase ("Return ...")."""
        s = self.structure
        if s.conditional is not None:
            return self._conditional_descriptions()
        steps, it = [], self.argument
        for i, (name, c) in enumerate(zip(s.ops, self.constants)):
            op = OPS[name]
            steps.append(op.phrase(op.step, c).replace("{it}", it))
            it = "them" if op.gives == LIST else "it"
        first = (steps[0] if len(steps) == 1 else
                 ", ".join(steps[:-1]) + ", then " + steps[-1])
        phrase, compound = self.argument, False
        for name, c in zip(s.ops, self.constants):
            op = OPS[name]
            inner = f"({phrase})" if compound else phrase
            phrase, compound = op.phrase(op.noun, c).replace("{e}", inner), True
        return _sentence(first), _sentence(f"return {phrase}")

    def _conditional_descriptions(self) -> tuple[str, str]:
        predicate, yes, no = self.structure.conditional
        test, a, b = self.constants
        clause = OPS[predicate].phrase(OPS[predicate].noun, test).replace("{e}", self.argument)
        clause = clause.removeprefix("whether ")
        left, right = _branch_phrase(yes, a, self.argument), _branch_phrase(no, b, self.argument)
        return (_sentence(f"if {clause}, return {left}; otherwise return {right}"),
                _sentence(f"return {left} when {clause}, else {right}"))


def _slot_text(name: str, constants: tuple) -> str:
    return f"{name}({','.join(repr(c) for c in constants)})" if constants else name


def _branch(name: str, constants: tuple, value: int):
    if name == "same":
        return value
    if name == "constant":
        return constants[0]
    return OPS[name].apply(value, constants)


def _branch_code(name: str, constants: tuple, argument: Expr) -> Expr:
    if name == "same":
        return argument
    if name == "constant":
        return number(constants[0])
    return OPS[name].code(argument, constants)


def _branch_phrase(name: str, constants: tuple, argument: str) -> str:
    if name == "same":
        return argument
    if name == "constant":
        return str(constants[0])
    op = OPS[name]
    return op.phrase(op.noun, constants).replace("{e}", argument)


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


__all__ = [
    "ARGUMENT_NAMES", "BOOL", "BRANCHES", "BRANCH_CONSTANTS", "Behaviour", "INPUT_TYPES", "INT", "LIST", "OPS",
    "OPS_TAKING", "Op", "PREDICATES", "REFERENCE_BUILTINS", "STR", "Structure",
]
