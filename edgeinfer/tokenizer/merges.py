"""The two merge loops: SentencePiece's score-driven bigrams and BPE's ranked merges.

Both follow llama.cpp's ``llm_tokenizer_spm_session`` and ``llm_tokenizer_bpe_session``:
start from one symbol per code point, keep a priority queue of adjacent pairs, and merge the
best pair until none is left. Ties go to the leftmost pair, as in llama.cpp's comparators.
Symbols stay contiguous, so symbol ``i`` always starts at character ``i`` and only its
length and neighbours change; a queued pair is stale once either side's length changed.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush


def spm_pieces(text: str, score_of: Callable[[str], float | None]) -> list[str]:
    """Merge ``text`` into the pieces SentencePiece's bigram algorithm picks.

    ``score_of(piece)`` is the vocabulary score of ``piece``, or None if it is not a token.
    Pairs with the highest score merge first.
    """
    n = len(text)
    if n < 2:
        return [text] if n else []
    length = [1] * n  # (n,) chars in symbol i; 0 once merged into its left neighbour
    prev = list(range(-1, n - 1))  # (n,)
    nxt = list(range(1, n + 1))  # (n,)
    nxt[-1] = -1
    queue: list[tuple[float, int, int]] = []  # (-score, left, size)

    def push(left: int, right: int) -> None:
        size = length[left] + length[right]
        score = score_of(text[left : left + size])
        if score is not None:
            heappush(queue, (-score, left, size))

    for i in range(1, n):
        push(i - 1, i)
    while queue:
        _, left, size = heappop(queue)
        right = left + length[left]
        if right >= n or length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
            continue
        length[left] = size
        length[right] = 0
        after = nxt[left] = nxt[right]
        if after >= 0:
            prev[after] = left
        if prev[left] >= 0:
            push(prev[left], left)
        if after >= 0:
            push(left, after)

    pieces = []
    i = 0
    while i != -1:
        pieces.append(text[i : i + length[i]])
        i = nxt[i]
    return pieces


def bpe_pieces(word: str, rank_of: Callable[[str, str], int | None]) -> list[str]:
    """Merge ``word`` by BPE ranks: the pair with the lowest merge rank goes first.

    ``rank_of(left, right)`` is the rank of the merge ``left right``, or None.
    """
    n = len(word)
    if n < 2:
        return [word] if n else []
    length = [1] * n  # (n,)
    prev = list(range(-1, n - 1))  # (n,)
    nxt = list(range(1, n + 1))  # (n,)
    nxt[-1] = -1
    queue: list[tuple[int, int, int]] = []  # (rank, left, size)

    def push(left: int, right: int) -> None:
        rank = rank_of(word[left:right], word[right : right + length[right]])
        if rank is not None:
            heappush(queue, (rank, left, length[left] + length[right]))

    for i in range(1, n):
        push(i - 1, i)
    while queue:
        _, left, size = heappop(queue)
        right = left + length[left]
        if right >= n or length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
            continue
        length[left] = size
        length[right] = 0
        after = nxt[left] = nxt[right]
        if after >= 0:
            prev[after] = left
        if prev[left] >= 0:
            push(prev[left], left)
        if after >= 0:
            push(left, after)

    pieces = []
    i = 0
    while i != -1:
        pieces.append(word[i : i + length[i]])
        i = nxt[i]
    return pieces
