"""Store names, which may be templates over request variables: `user_{var.user_id}` with user_id 42 is
`user_42`. The name after substitution must be an identifier (lowercase letters, digits and _, starting
with a letter, at most 63), so a variable can never smuggle anything else into it."""

from __future__ import annotations

import re
from collections.abc import Mapping

from agentdb.errors import InvalidParamValue

STORE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
# {var.name} or {{var.name}}
_PLACEHOLDER = re.compile(
    r"\{\{\s*var\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}|\{\s*var\.([A-Za-z_][A-Za-z0-9_]*)\s*\}"
)


def resolve_store_name(
    template: str, variables: Mapping[str, object] | None = None, *, path: str = "store"
) -> str:
    """The store name `template` names once its `{var.NAME}` placeholders are replaced by `variables`;
    3007 at `vars.NAME` for a missing or unusable variable, and at `path` when the result is not a valid
    store name."""
    variables = variables or {}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            raise InvalidParamValue(
                f"the store name {template!r} needs the variable {name!r}", path=f"vars.{name}"
            )
        raw = variables[name]
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise InvalidParamValue(f"variable {name!r} must be a string or an integer", path=f"vars.{name}")
        return str(raw)

    if not isinstance(template, str):
        raise InvalidParamValue("the store name must be a string", path=path)
    name = _PLACEHOLDER.sub(value, template)
    if not STORE_NAME.match(name):
        raise InvalidParamValue(
            f"invalid memory store name {name!r}"
            + (f" (from {template!r})" if name != template else "")
            + ": use lowercase letters, digits and _, starting with a letter (max 63)",
            path=path,
        )
    return name


def template_variables(template: str) -> set[str]:
    """The variable names a store name template uses (`user_{var.user_id}`: {"user_id"})."""
    return {a or b for a, b in _PLACEHOLDER.findall(template)}


__all__ = ["STORE_NAME", "resolve_store_name", "template_variables"]
