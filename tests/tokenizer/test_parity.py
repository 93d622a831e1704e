"""Byte-exact parity with llama.cpp on the Gemma 3 file and the trained BPE vocabularies."""

from __future__ import annotations

import itertools

import pytest

from tests.tokenizer.corpus import parity_corpus, random_texts

CORPUS = parity_corpus()
FLAGS = list(itertools.product((True, False), (True, False)))  # (add_special, parse_special)


def _report(mismatches: list[str], compared: int) -> str:
    shown = "\n".join(mismatches[:15])
    return f"{len(mismatches)} of {compared} comparisons differ from llama.cpp:\n{shown}"


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 300
    assert "" in CORPUS
    assert max(len(s) for s in CORPUS) > 3000


def test_tokenize_matches_llama_cpp(pair) -> None:
    ours, ref = pair
    mismatches = []
    for text, (add_special, parse_special) in itertools.product(CORPUS, FLAGS):
        want = ref.tokenize(text, add_special, parse_special)
        got = ours.tokenize(text, add_special=add_special, parse_special=parse_special)
        if got != want:
            mismatches.append(
                f"{text[:60]!r} add={add_special} parse={parse_special}: "
                f"ours {got[:12]} llama.cpp {want[:12]}"
            )
    assert not mismatches, _report(mismatches, len(CORPUS) * len(FLAGS))


def test_detokenize_matches_llama_cpp(pair) -> None:
    ours, ref = pair
    mismatches = []
    compared = 0
    for text in CORPUS:
        ids = ref.tokenize(text, True, True)
        for remove_special, unparse_special in FLAGS:
            compared += 1
            want = ref.detokenize(ids, remove_special, unparse_special)
            got = ours.detokenize_bytes(
                ids, remove_special=remove_special, unparse_special=unparse_special
            )
            if got != want:
                mismatches.append(
                    f"{text[:60]!r} remove={remove_special} "
                    f"unparse={unparse_special}: ours {got[:40]!r} "
                    f"llama.cpp {want[:40]!r}"
                )
    assert not mismatches, _report(mismatches, compared)


def test_round_trip_matches_llama_cpp(pair) -> None:
    """Our ids back through our detokenizer give llama.cpp's text for llama.cpp's ids."""
    ours, ref = pair
    mismatches = []
    for text in CORPUS:
        got = ours.detokenize_bytes(ours.tokenize(text, add_special=False))
        want = ref.detokenize(ref.tokenize(text, False, False), False, False)
        if got != want:
            mismatches.append(f"{text[:60]!r}: ours {got[:40]!r} llama.cpp {want[:40]!r}")
    assert not mismatches, _report(mismatches, len(CORPUS))


def test_gemma_round_trip_is_lossless(tokenizers) -> None:
    tok = tokenizers["gemma"]
    for text in CORPUS:
        if "\u2581" in text:
            continue  # SentencePiece's space marker itself comes back as a space
        assert tok.detokenize(tok.tokenize(text, add_special=False)) == text


@pytest.mark.parametrize("special", [False, True])
def test_every_token_piece_matches_llama_cpp(pair, special: bool) -> None:
    ours, ref = pair
    assert ours.n_vocab == ref.n_vocab()
    bad = [
        i
        for i in range(ours.n_vocab)
        if ours.token_to_piece(i, special=special) != ref.token_to_piece(i, special)
    ]
    assert not bad, f"{len(bad)} pieces differ, first ids {bad[:10]}"


def test_end_of_generation_set_matches_llama_cpp(pair) -> None:
    ours, ref = pair
    want = {i for i in range(ref.n_vocab()) if ref.is_eog(i)}
    assert set(ours.eog_ids) == want
    assert all(ours.is_eog(i) for i in want)


def test_special_ids_match_llama_cpp(pair) -> None:
    ours, ref = pair
    assert ours.bos_id == ref.llama.token_bos()
    assert ours.eos_id == ref.llama.token_eos()


def test_random_text_matches_llama_cpp(pair) -> None:
    ours, ref = pair
    texts = random_texts(300)
    mismatches = []
    for text, (add_special, parse_special) in itertools.product(texts, FLAGS):
        want = ref.tokenize(text, add_special, parse_special)
        if ours.tokenize(text, add_special, parse_special) != want:
            mismatches.append(f"{text[:60]!r} add={add_special} parse={parse_special}")
    assert not mismatches, _report(mismatches, len(texts) * len(FLAGS))
