"""The verifier's static policy: the original evaluator's AST rules, unchanged in what they accept.

Same 2048-byte limit on the whole program, same top-level rule, same denied node types, no attribute
access, no dunder names, calls only to the same eight builtins. `validate_source` raises like the
original; `check_policy` and `completion_is_parseable` never raise (the sampler's stop rule calls the
latter once per generated token, so it stays a parse plus one AST walk).
"""

from __future__ import annotations

import ast
import warnings

MAX_SOURCE_BYTES = 2048
SAFE_CALL_NAMES = frozenset({"sum", "len", "abs", "min", "max", "bool", "int", "str"})
DENIED_NODE_NAMES = (
    "AsyncFunctionDef", "ClassDef", "Import", "ImportFrom", "With", "AsyncWith", "Lambda", "Global",
    "Nonlocal", "While", "For", "AsyncFor", "Try", "Raise", "Delete",
)
# Only the exact classes named above: TryStar (3.11+) is a separate class and stays allowed, as in
# the original, so a `try: ... except* E:` block is not denied.
DENIED_NODES = tuple(getattr(ast, name) for name in DENIED_NODE_NAMES)
_DENIED_SET = frozenset(DENIED_NODES)


def validate_source(source: str, entry_point: str) -> ast.Module:
    """Parse and check `source` (prompt + completion) against the policy; return the tree.

    Raises ValueError or SyntaxError for a rejected program, exactly where the original did (a
    non-UTF-8 string fails the size check with UnicodeEncodeError, a ValueError). Deeply nested
    input can also raise RecursionError or MemoryError from the parser; `check_policy` maps those
    to a verdict instead.
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
    """Apply the node rules to every node. Same verdicts as the original's `ast.walk` loop;
    an explicit stack and exact-type tests (the parser only builds exact node classes) make it
    about twice as fast, which matters for the per-token stop rule."""
    denied, name_type, attribute_type, call_type = _DENIED_SET, ast.Name, ast.Attribute, ast.Call
    ast_type, list_type = ast.AST, list
    stack = [tree]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind in denied:
            raise ValueError(f"disallowed syntax: {kind.__name__}")
        if kind is name_type:
            if node.id.startswith("__"):
                raise ValueError(f"disallowed name: {node.id}")
        elif kind is attribute_type:
            raise ValueError("attribute access is not allowed")
        elif kind is call_type:
            if type(node.func) is not name_type or node.func.id not in SAFE_CALL_NAMES:
                raise ValueError(f"unsafe call: {_call_name(node)}")
        for field in kind._fields:
            value = getattr(node, field, None)
            if type(value) is list_type:
                stack.extend(item for item in value if isinstance(item, ast_type))
            elif isinstance(value, ast_type):
                stack.append(value)


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
