"""The verifier's static policy: an allow-list of node types and fields over the original's rules.

Same 2048-byte limit on the whole program, same top-level rule, no attribute access, no dunder names,
calls only to the same eight builtins. On top, by construction rather than by special case: only the
node types and fields in ALLOWED_FIELDS exist (no class-pattern keywords, which read attributes by
name; no decorators; no `try`/`except*`), and the eight builtin names are read-only everywhere, so a
call to an allowed name always calls the real builtin. Without attribute syntax no program reaches a
bound method (`str.format` and its field syntax included), a frame or a module. docs/VERIFIER.md lists
the programs whose verdict therefore differs from the original's. `validate_source` raises;
`check_policy` and `completion_is_parseable` never raise (the sampler's stop rule calls the latter
once per generated token, so it stays a parse plus one AST walk).
"""

from __future__ import annotations

import ast
import encodings
import encodings.aliases
import warnings

MAX_SOURCE_BYTES = 2048
SAFE_CALL_NAMES = frozenset({"sum", "len", "abs", "min", "max", "bool", "int", "str"})
# The original's deny-list, kept for its messages: these node types are outside the allow-list below.
DENIED_NODE_NAMES = (
    "AsyncFunctionDef", "ClassDef", "Import", "ImportFrom", "With", "AsyncWith", "Lambda", "Global",
    "Nonlocal", "While", "For", "AsyncFor", "Try", "Raise", "Delete",
)
DENIED_NODES = tuple(getattr(ast, name) for name in DENIED_NODE_NAMES)

# The allow-list: node type -> the fields that may hold something. Any other node type is invalid,
# and any other field must be empty (None or []), so a field a future Python adds is refused until
# it is listed here. Fields that only hold plain strings (names, the conversion code) are listed
# too; `_check_nodes` applies the name rules to them.
_EXPRESSION_FIELDS = {
    "BoolOp": ("op", "values"), "NamedExpr": ("target", "value"), "BinOp": ("left", "op", "right"),
    "UnaryOp": ("op", "operand"), "IfExp": ("test", "body", "orelse"), "Dict": ("keys", "values"),
    "Set": ("elts",), "ListComp": ("elt", "generators"), "SetComp": ("elt", "generators"),
    "DictComp": ("key", "value", "generators"), "GeneratorExp": ("elt", "generators"),
    "Await": ("value",), "Yield": ("value",), "YieldFrom": ("value",),
    "Compare": ("left", "ops", "comparators"), "Call": ("func", "args", "keywords"),
    "FormattedValue": ("value", "conversion", "format_spec"), "JoinedStr": ("values",),
    "Constant": ("value", "kind"), "Subscript": ("value", "slice", "ctx"), "Starred": ("value", "ctx"),
    "Name": ("id", "ctx"), "List": ("elts", "ctx"), "Tuple": ("elts", "ctx"),
    "Slice": ("lower", "upper", "step"),
}
_STATEMENT_FIELDS = {
    "Module": ("body", "type_ignores"),
    # no decorators (an implicit call) and no type parameters (they bind names)
    "FunctionDef": ("name", "args", "body", "returns", "type_comment"),
    "Return": ("value",), "Assign": ("targets", "value", "type_comment"),
    "AugAssign": ("target", "op", "value"), "AnnAssign": ("target", "annotation", "value", "simple"),
    "If": ("test", "body", "orelse"), "Match": ("subject", "cases"), "Assert": ("test", "msg"),
    "Expr": ("value",), "Pass": (), "Break": (), "Continue": (),
}
_OTHER_FIELDS = {
    "comprehension": ("target", "iter", "ifs", "is_async"),
    "arguments": ("posonlyargs", "args", "vararg", "kwonlyargs", "kw_defaults", "kwarg", "defaults"),
    "arg": ("arg", "annotation", "type_comment"), "keyword": ("arg", "value"),
    "match_case": ("pattern", "guard", "body"),
    "MatchValue": ("value",), "MatchSingleton": ("value",), "MatchSequence": ("patterns",),
    "MatchMapping": ("keys", "patterns", "rest"),
    # class patterns: positional sub-patterns only; keyword sub-patterns read attributes by name
    "MatchClass": ("cls", "patterns"),
    "MatchStar": ("name",), "MatchAs": ("pattern", "name"), "MatchOr": ("patterns",),
    "TypeIgnore": ("lineno", "tag"),
}
_OPERATORS = (
    "Load", "Store", "And", "Or", "Add", "Sub", "Mult", "MatMult", "Div", "Mod", "Pow", "LShift", "RShift",
    "BitOr", "BitXor", "BitAnd", "FloorDiv", "Invert", "Not", "UAdd", "USub", "Eq", "NotEq", "Lt", "LtE",
    "Gt", "GtE", "Is", "IsNot", "In", "NotIn",
)
ALLOWED_FIELDS: dict[type, frozenset] = {
    getattr(ast, name): frozenset(fields)
    for table in (_EXPRESSION_FIELDS, _STATEMENT_FIELDS, _OTHER_FIELDS, {op: () for op in _OPERATORS})
    for name, fields in table.items() if hasattr(ast, name)
}
# The codecs the sandbox worker imports before it forks (a child cannot import one): `str(data,
# encoding)` must name one of them literally, so every accepted program decodes as in the original.
PRELOADED_CODECS = frozenset({"ascii", "latin_1", "utf_16", "utf_32", "utf_8"})
# Field values that count as empty for a field outside the allow-list.
_EMPTY = (None, [], ())
_STORE = ast.Store


def validate_source(source: str, entry_point: str) -> ast.Module:
    """Parse and check `source` (prompt + completion) against the policy; return the tree.

    Raises ValueError or SyntaxError for a rejected program (a non-UTF-8 string fails the size
    check with UnicodeEncodeError, a ValueError). Deeply nested input can also raise RecursionError
    or MemoryError from the parser; `check_policy` maps those to a verdict instead.
    """
    if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
        raise ValueError("source too large")
    tree = ast.parse(source)
    functions = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring-like string at module level
        if isinstance(node, ast.FunctionDef):
            functions.append(node)
            continue
        raise ValueError(f"only function definitions and strings are allowed at top level, "
                         f"found {type(node).__name__}")
    if len(functions) != 1 or functions[0].name != entry_point:
        raise ValueError(f"the program must define exactly one function, named {entry_point}")
    _check_nodes(tree)
    return tree


def _check_nodes(tree: ast.AST) -> None:
    """Walk every node: its type must be in ALLOWED_FIELDS, every field outside its entry empty.

    Name rules on the way: no name starting with `__`; the eight builtins are read-only (never a
    target, parameter, function name or pattern capture); every call is a bare call of one of them.
    An explicit stack and exact-type tests (the parser only builds exact node classes) keep this
    fast enough for the per-token stop rule.
    """
    allowed, ast_type, list_type = ALLOWED_FIELDS, ast.AST, list
    name_type, call_type, arg_type, function_type = ast.Name, ast.Call, ast.arg, ast.FunctionDef
    capture_types = _CAPTURE_FIELDS
    safe = SAFE_CALL_NAMES
    stack = [tree]
    while stack:
        node = stack.pop()
        kind = type(node)
        fields = allowed.get(kind)
        if fields is None:
            raise ValueError(_refusal(kind))
        if kind is name_type:
            if node.id.startswith("__"):
                raise ValueError(f"disallowed name: {node.id}")
            if node.id in safe and type(node.ctx) is _STORE:
                raise ValueError(f"the builtin {node.id} is read-only: it cannot be assigned")
            continue
        if kind is call_type:
            if type(node.func) is not name_type or node.func.id not in safe:
                raise ValueError(f"unsafe call: {_call_name(node)}")
            if node.func.id == "str" and (len(node.args) > 1 or node.keywords):
                _check_decoding(node)
        elif kind is arg_type or kind is function_type:
            name = node.arg if kind is arg_type else node.name
            if name in safe:
                raise ValueError(f"the builtin {name} is read-only: it cannot name a "
                                 f"{'parameter' if kind is arg_type else 'function'}")
        elif kind in capture_types:
            name = getattr(node, capture_types[kind])
            if name in safe:
                raise ValueError(f"the builtin {name} is read-only: a pattern cannot capture into it")
        for field in kind._fields:
            value = getattr(node, field, None)
            if field not in fields:
                if value not in _EMPTY:
                    raise ValueError(_field_refusal(kind, field))
                continue
            if type(value) is list_type:
                stack.extend(item for item in value if isinstance(item, ast_type))
            elif isinstance(value, ast_type):
                stack.append(value)


# Pattern nodes whose field binds a name (the rest of a mapping pattern, a star, an `as` capture).
_CAPTURE_FIELDS = {ast.MatchAs: "name", ast.MatchStar: "name", ast.MatchMapping: "rest"} \
    if hasattr(ast, "MatchAs") else {}


def _check_decoding(node: ast.Call) -> None:
    """`str(data, encoding, errors)` decodes through a codec, which a sandbox child cannot import:
    the encoding must be a literal naming a codec the worker preloaded."""
    if any(type(arg) is ast.Starred for arg in node.args) or any(k.arg is None for k in node.keywords):
        raise ValueError("str() with unpacked arguments could name any codec")
    encoding = node.args[1] if len(node.args) > 1 else next(
        (k.value for k in node.keywords if k.arg == "encoding"), None)
    if encoding is None:
        return  # errors= alone: the default codec (UTF-8)
    if type(encoding) is not ast.Constant or type(encoding.value) is not str:
        raise ValueError("str() decoding needs a literal codec name")
    if codec_module(encoding.value) not in PRELOADED_CODECS:
        raise ValueError(f"codec {encoding.value[:40]!r} is not available in the sandbox "
                         f"(available: {', '.join(sorted(PRELOADED_CODECS))})")


def codec_module(name: str) -> str:
    """The module of `encodings` that Python's codec search would import for `name` (no import)."""
    normal = encodings.normalize_encoding(name.lower())
    aliases = encodings.aliases.aliases
    return aliases.get(normal) or aliases.get(normal.replace(".", "_")) or normal


def _refusal(kind: type) -> str:
    if kind is ast.Attribute:
        return "attribute access is not allowed"
    if kind in DENIED_NODES:
        return f"disallowed syntax: {kind.__name__}"
    return f"syntax outside the allowed subset: {kind.__name__}"


def _field_refusal(kind: type, field: str) -> str:
    reasons = {
        (ast.FunctionDef, "decorator_list"): "decorators are not allowed (a decorator is a call)",
        (ast.FunctionDef, "type_params"): "type parameters are not allowed",
    }
    if hasattr(ast, "MatchClass"):
        reasons[(ast.MatchClass, "kwd_attrs")] = ("keyword patterns are not allowed in a class pattern "
                                                  "(they read attributes)")
        reasons[(ast.MatchClass, "kwd_patterns")] = reasons[(ast.MatchClass, "kwd_attrs")]
    return reasons.get((kind, field), f"{kind.__name__}.{field} is not allowed")


def _call_name(node: ast.Call) -> str:
    return node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__


def check_policy(source, entry_point: str) -> str | None:
    """None if the program passes the static policy, else a one-line reason. Never raises."""
    if not isinstance(source, str):
        return f"source must be text, got {type(source).__name__}"
    try:
        # Model output is full of odd literals ("1x"); the parser's SyntaxWarnings would flood
        # the caller's log without changing any verdict.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            validate_source(source, entry_point)
    except UnicodeEncodeError:
        return "source is not valid UTF-8 text"
    except SyntaxError as exc:
        return f"SyntaxError: {exc}"
    except ValueError as exc:
        return str(exc)
    except RecursionError:
        return "source is nested too deeply to parse"
    except MemoryError:
        return "source is too large to parse"
    except Exception as exc:  # any other parser failure is still a verdict, not a crash
        return f"{type(exc).__name__}: {exc}"
    return None


def completion_is_parseable(task, completion: str) -> bool:
    """The original stop rule: prompt + completion passes parse + policy and ends with a newline.

    No compile and no execution. Never raises: anything that is not a clean pass is False.
    """
    if not isinstance(completion, str) or not completion.endswith("\n"):
        return False
    return check_policy(task.prompt + completion, task.entry_point) is None
