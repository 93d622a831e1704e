"""A long English text that ships with Python: the help topics of pydoc (pydoc_data), about
190,000 Gemma tokens, so that no test downloads anything."""

from __future__ import annotations

import functools


@functools.cache
def python_help_text() -> str:
    from pydoc_data import topics

    return "\n\n".join(topics.topics[name] for name in sorted(topics.topics))
