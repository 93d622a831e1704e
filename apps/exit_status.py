"""How the commands end on a typed error: one line on stderr and the exit status.

2 for a usage error (an impossible option, as argparse's own errors), 1 for a runtime one
(a bad file, a prompt that does not fit, memory that runs out).
"""

from __future__ import annotations

import sys

from edgeinfer import errors


def report(e: errors.EdgeInferError) -> int:
    """Prints ``e`` as one line on stderr; returns the exit status for it."""
    print(f"edgeinfer: error: {one_line(e)}", file=sys.stderr)
    return 2 if isinstance(e, errors.InvalidOptionError) else 1


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
