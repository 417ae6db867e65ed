"""Griffe extension: the docstrings' Sphinx roles (``:func:`~collectives.allgather```) become links.

The docstrings keep the roles ``help()`` and editors read; as the reference loads them,
each role's target is resolved in the scope of the object whose docstring holds it (as
Sphinx would: the name as written, else from the object, its class, its module) and
becomes an autorefs link, optional so that a target the reference does not show (a
private helper, a module left out of the site) is shown as code rather than failing the
strict build. ``~`` shows the last part of the name only, as in Sphinx.
"""

import re
from html import escape
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|data|mod|exc|obj|const):`(?P<target>[^`]+)`")


def _resolved(obj: Object, name: str) -> str | None:
    """The full path of ``name`` as seen from ``obj``'s docstring; ``None`` where it cannot be found."""
    if name.startswith("collectives."):
        return name
    head, _, rest = name.partition(".")
    scope: Object | None = obj
    while scope is not None:
        try:
            found: str = scope.resolve(head)
        except Exception:  # griffe raises NameResolutionError (or a KeyError of a member): go up a scope
            scope = scope.parent
            continue
        return f"{found}.{rest}" if rest else found
    return None


def _link(obj: Object, match: "re.Match[str]") -> str:
    target = match["target"].strip()
    short = target.startswith("~")
    name = target.lstrip("~").lstrip(".").removesuffix("()")
    shown = name.rpartition(".")[2] if short else name
    shown += "()" if match[0].startswith((":func:", ":meth:")) and not shown.endswith(")") else ""
    path = _resolved(obj, name)
    if path is None:
        return f"`{shown}`"
    return f'<autoref identifier="{escape(path)}" optional><code>{escape(shown)}</code></autoref>'


class SphinxRolesToLinks(Extension):
    """Rewrite each docstring's roles as links once the object tree is whole (names then resolve)."""

    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = ROLE.sub(lambda match: _link(obj, match), obj.docstring.value)
