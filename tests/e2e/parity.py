"""Comparing two engines' logits the way the issue's bars are stated."""

from __future__ import annotations

import numpy as np

# Prompts of at least 128 tokens each: prose, code, and mixed languages.
PROMPTS = [
    (
        "The history of the lighthouse is a history of people who refused to let the sea decide "
        "who came home. Long before electric lamps, keepers climbed narrow stairs every evening "
        "to trim wicks, polish lenses and wind the clockwork that turned the light. A single "
        "careless night could cost a ship, so the logbooks record everything: the weather at "
        "each hour, the oil burned, the names of vessels that passed close to the rocks. When "
        "the Fresnel lens arrived, with its rings of glass prisms bending scattered light into "
        "one bright beam, a lamp no stronger than a few candles could be seen twenty miles out. "
        "Today most lights run themselves, yet the towers remain, white and patient on the "
        "headlands, and visitors still climb the stairs to look out over the water."
    ),
    (
        "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n"
        '    """Merge two sorted lists into one sorted list in linear time."""\n'
        "    out, i, j = [], 0, 0\n"
        "    while i < len(a) and j < len(b):\n"
        "        if a[i] <= b[j]:\n"
        "            out.append(a[i]); i += 1\n"
        "        else:\n"
        "            out.append(b[j]); j += 1\n"
        "    out.extend(a[i:]); out.extend(b[j:])\n"
        "    return out\n\n\n"
        "class LRUCache:\n"
        "    def __init__(self, capacity: int) -> None:\n"
        "        self.capacity = capacity\n"
        "        self.items: dict[str, object] = {}\n\n"
        "    def get(self, key: str) -> object | None:\n"
        "        if key not in self.items:\n"
        "            return None\n"
        "        value = self.items.pop(key)\n"
        "        self.items[key] = value\n"
        "        return value\n"
    ),
    (
        "Voici une recette simple : faites fondre 50 g de beurre, ajoutez deux oeufs battus et "
        "une pincée de sel. In Deutschland nennt man das Rührei, und in Spanien sagt man huevos "
        "revueltos. 日本では卵焼きが人気で、朝ごはんによく食べられます。 Το πρωινό στην Ελλάδα "
        "είναι συνήθως ελαφρύ. Numbers: 3.14159, 2,718, 1e-9, 0x1F, 42%. Prices rose from $19.99 "
        "to €24.50 between 2019 and 2024. Email: someone@example.org; URL: https://example.com/"
        "path?q=edge&lang=fr#top. Emoji: 🙂🚀🔥 and a family 👨‍👩‍👧. Finally, a line of "
        "Russian: Москва — столица России, а Киев — столица Украины."
    ),
]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(reference: np.ndarray, ours: np.ndarray) -> tuple[float, float, float]:
    """(mean KL(reference || ours), top-1 agreement, max KL) over positions."""
    assert reference.shape == ours.shape, (reference.shape, ours.shape)
    lp, lq = log_softmax(reference), log_softmax(ours)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    top1 = float(np.mean(reference.argmax(-1) == ours.argmax(-1)))
    return float(kl.mean()), top1, float(kl.max())


def llama_cpp_logits(llm, tokens: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)
