"""The merge loop shared by SentencePiece (best score first) and BPE (lowest rank first).

Both follow llama.cpp's ``llm_tokenizer_spm_session`` and ``llm_tokenizer_bpe_session``:
start from one symbol per code point, keep a priority queue of adjacent pairs, and merge the
best pair until none is left; equal priorities go to the leftmost pair. Symbols stay
contiguous, so symbol ``i`` always starts at character ``i`` and only its length and
neighbours change; a queued pair is stale once either side's length changed.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush

# priority(left, right) of merging two adjacent pieces: lower merges first, None never
Priority = Callable[[str, str], "float | None"]


def merge_pieces(text: str, priority: Priority) -> list[str]:
    """Split ``text`` into the pieces left when no adjacent pair can merge any more."""
    n = len(text)
    if n < 2:
        return [text] if n else []
    length = [1] * n  # (n,) chars in symbol i; 0 once merged into its left neighbour
    prev = list(range(-1, n - 1))  # (n,) index of the live symbol to the left, or -1
    nxt = list(range(1, n + 1))  # (n,) index of the live symbol to the right, or -1
    nxt[-1] = -1
    queue: list[tuple[float, int, int]] = []  # (priority, left, size of the merged piece)

    def push(left: int, right: int) -> None:
        size = length[left] + length[right]
        p = priority(text[left:right], text[right : left + size])
        if p is not None:
            heappush(queue, (p, left, size))

    for i in range(1, n):
        push(i - 1, i)
    while queue:
        _, left, size = heappop(queue)
        right = left + length[left]
        if length[left] == 0 or right >= n or length[left] + length[right] != size:
            continue
        length[left] = size
        length[right] = 0
        after = nxt[left] = nxt[right]
        if after >= 0:
            prev[after] = left
            push(left, after)
        if prev[left] >= 0:
            push(prev[left], left)

    pieces = []
    i = 0
    while i != -1:
        pieces.append(text[i : i + length[i]])
        i = nxt[i]
    return pieces
