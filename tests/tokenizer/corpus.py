"""Strings that stress tokenizers: every one is compared with llama.cpp, none has expected ids.

``parity_corpus()`` returns the hand-written cases followed by seeded random mixes of them,
so the list is the same on every run.
"""

from __future__ import annotations

import random

WHITESPACE = [
    "",
    " ",
    "  ",
    "   ",
    "    ",
    " " * 17,
    " " * 40,
    "\t",
    "\t\t",
    "\t" * 35,
    "\n",
    "\n\n",
    "\n" * 3,
    "\n" * 40,
    "\r\n",
    "\r\n\r\n",
    "\r",
    "\v",
    "\f",
    " \n \t \r\n ",
    "a b",
    "a  b",
    "a   b",
    " a",
    "  a",
    "a ",
    "a  ",
    "\ta\tb\t",
    "a\nb",
    "a\n\nb",
    "a\n \nb",
    " \n",
    "\n ",
    "x\r\ny\rz",
    "word\u00a0word",
    "word\u2003word",
    "\u3000全角スペース\u3000",
    "nel\u0085line",
    "line\u2028sep\u2029para",
    "ogham\u1680space",
    "narrow\u202fnbsp",
    "math\u205fspace",
    "\x1c\x1d\x1e\x1f",
    "a\x1cb",
    "\u00a0\u00a0lead",
    "trail\u3000\u3000",
    "mixed \u00a0\t\u2003\n end",
    "  \n  \n",
    "\t \t \t",
    "end with newline\n",
]

CJK = [
    "你好，世界！",
    "我能吞下玻璃而不伤身体。",
    "中华人民共和国成立于一九四九年十月一日。",
    "こんにちは、世界！",
    "東京都は日本の首都です。",
    "カタカナとひらがなと漢字",
    "안녕하세요, 세계!",
    "다람쥐 헌 쳇바퀴에 타고파",
    "日本語English混合text中文",
    "「引用」『二重』【括弧】〈山括弧〉",
    "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ　１２３",
    "半角ｶﾀｶﾅ",
    "𠀀𠀁𪚥 rare ideographs",
    "漢字 かな カナ 한글 ㄱㄴㄷ",
    "中文 數字 123 和 ４５６",
]

ACCENTS = [
    "café naïve résumé",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "El veloz murciélago hindú comía feliz cardillo y kiwi.",
    "Ærøskøbing Å ø",
    "Tiếng Việt có dấu: Hà Nội, Thành phố Hồ Chí Minh",
    "Příliš žluťoučký kůň úpěl ďábelské ódy",
    "Pchnąć w tę łódź jeża lub ośm skrzyń fig",
    "İstanbul ığdır ŞEVKÂR",
    "e\u0301 (decomposed)",
    "é (precomposed)",
    "a\u0300\u0301\u0302\u0303 stacked",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319 zalgo",
    "ﬁ ﬂ ligatures",
    "Съешь же ещё этих мягких французских булок",
    "Τάχιστη αλώπηξ βαφής ψημένη γη",
]

EMOJI = [
    "😀",
    "😀😀😀",
    "I ❤️ Python 🐍",
    "🎉🎊 party",
    "👍🏽 thumbs",
    "👨‍👩‍👧‍👦 family",
    "🏳️‍🌈 flag",
    "🇺🇸🇯🇵🇩🇪",
    "1️⃣ 2️⃣ #️⃣",
    "☕ coffee ☕☕",
    "🤖: beep",
    "emoji🎉inside",
    "🧑‍💻 coding",
    "✅ done ⚠️ warn ❌ no",
    "🫠 melting",
    "💩",
    "🥰🥰 ",
    " 🚀",
]

RTL = [
    "مرحبا بالعالم",
    "نص حكيم له سر قاطع",
    "العربية 123 numbers ٠١٢٣٤٥٦٧٨٩",
    "שלום עולם",
    "דג סקרן שט בים",
    "עברית with English mixed",
    "\u200fRLM mark\u200e",
    "\u202eoverride\u202c",
    "فارسی: سلام دنیا",
    "اردو: ہیلو",
]

DIGITS = [
    "0",
    "7",
    "12",
    "123",
    "1234",
    "12345",
    "1234567890",
    "12345678901234567890123",
    "3.14159",
    "1,234,567.89",
    "-42",
    "+1 (555) 123-4567",
    "2024-01-31T12:34:56Z",
    "0x1F600",
    "1e-10",
    "١٢٣٤٥",
    "１２３",
    "²³¹",
    "½ ¾ ⅓",
    "Ⅻ ⅻ",
    "①②③",
    "v1.2.3",
    "a1b2c3",
    "100%",
    "$1,000,000",
    "€12,50",
    "ISBN 978-3-16-148410-0",
    "9" * 100,
]

CODE = [
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    'print("Hello, world!")  # comment',
    "const x = () => { return {a: 1, 'b': [2, 3]}; };",
    '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    '#!/bin/bash\nfor f in *.txt; do echo "$f"; done',
    '<html><body><div class="x">Hi &amp; bye</div></body></html>',
    "<table><tr><td>1</td></tr></table>",
    "<b>bold</b> and <i>italic</i>",
    "if (a && b || !c) { x->y = z::w; }",
    "    indented\n        more\n    back",
    "\tdef g():\n\t\tpass\n",
    "x = [i for i in range(10) if i % 2 == 0]",
    "regex = r'^\\d{3}-\\d{4}$'",
    "a += 1; b -= 2; c *= 3; d /= 4; e %= 5;",
    "`code` ~~strike~~ **bold** __under__ ^sup^",
    "@decorator\nclass A(B, metaclass=M): ...",
    "#include <stdio.h>\nint main(void) { return 0; }",
]

URLS = [
    "https://www.example.com/path/to/page?query=1&other=two#frag",
    "http://localhost:8080/api/v1/users/42",
    "mailto:someone@example.org",
    "user.name+tag@sub.domain.co.uk",
    "ftp://files.example.net/pub/file.tar.gz",
    "C:\\Users\\Name\\Documents\\file.txt",
    "/usr/local/bin/python3.11",
    "https://例え.jp/パス",
    "www.google.com",
    "git@github.com:owner/repo.git",
]

CONTRACTIONS = [
    "don't",
    "I'M HERE",
    "it's",
    "they're",
    "we've",
    "you'll",
    "she'd",
    "'s",
    "''",
    "'",
    "can't won't shouldn't",
    "O'Neil's",
    "rock 'n' roll",
    "'ll've",
    "L'ÉTÉ",
    "It'S ODD",
    "' s",
    "don ' t",
    "a 's b",
    "x ' y",
    "Hello , world ! How are you ?",
]

SPECIAL_LOOKING = [
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text",
    "text<eos>",
    "</s>",
    "<s>",
    "<unk>",
    "<pad>",
    "<mask>",
    "<unused0>",
    "<unused99> and <unused100>",
    "[multimodal]",
    "<start_of_image>",
    "<|begin_of_text|>hi",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|reserved_special_token_5|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n",
    "<|endoftext|>",
    '<tool_call>{"a": 1}</tool_call>',
    "<|fim_prefix|>x<|fim_suffix|>y",
    "<|fim_middle|>",
    "<|fim_pad|>",
    "<|file_sep|>",
    "<|repo_name|>",
    "<start_of_tu",
    "<<|im_end|>>",
    "<|im_end|><|im_end|>",
    " <|im_start|> ",
    "<end_of_turn><end_of_turn>",
    "<|eot_id|> trailing",
    "leading <|eot_id|>",
    "<b></b><i></i>",
    "<td>\n</td>",
    "<|endoftext|><|endoftext|>text",
    "<|im_start|>",
    "<|im_start",
    "im_start|>",
]

ODD_UNICODE = [
    "\u200d",
    "a\u200db",
    "\u200c",
    "zero\u200bwidth",
    "\ufeffBOM",
    "soft\u00adhyphen",
    "variation\ufe0f\ufe0e",
    "private\ue000\uf8ff",
    "unassigned\u0378\u0379",
    "\ufffe\uffff",
    "astral\U0010fffd",
    "tags\U000e0041\U000e0042",
    "𝐀𝐁𝐂 𝔸𝔹ℂ",
    "mongolian\u180evowel",
    "isolate\u2066x\u2069",
    "\u0300 leading combining",
    "combining at end\u0301",
    "\u0000null",
    "bell\x07",
    "del\x7f",
    "c1\x80\x9f",
    "replacement\ufffd",
    "\U0001fae9new",
    "\u2028",
    "ℌ𝔢𝔩𝔩𝔬",
    "Ⓐⓑⓒ",
    "ǅ titlecase",
    "ʰʲ modifier",
    "ß ẞ",
    "µ micro",
    "tamil \u0b95\u0bcd\u0bb7",
    "devanagari \u0915\u094d\u0937",
    "thai เป็นมนุษย์",
]

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "Hello, World!",
    "HELLO WORLD",
    "hello\nworld",
    "Once upon a time...",
    "It was the best of times, it was the worst of times.",
    "To be, or not to be: that is the question.",
    "Q: What's 2+2? A: 4.",
    "Dr. Smith et al. (2020) found p < 0.05.",
    "Wait—what?! No…really?",
    "«guillemets» „quotes“ ‚single‘ “curly” ‘apos’",
    "e.g., i.e., etc.",
]


# Runs of one character or pair: equal-score merges, where only the tie-break decides.
REPEATS = [
    "aaa",
    "aaaaa",
    "aaaaaaa",
    "ooo",
    "eee",
    "...",
    ".....",
    "-----",
    "=====",
    "*****",
    "!!!",
    "???",
    "~~~",
    "___",
    "###",
    "hahaha",
    "lolololol",
    "ababa",
    "abcabcabc",
    "ææææ",
    "呵呵呵",
    "ーーー",
    "＿＿＿",
    "zzzzzzzzz",
    "mmmmm hmm",
    "wow!!! really???",
]


def hand_written() -> list[str]:
    return (
        WHITESPACE
        + CJK
        + ACCENTS
        + EMOJI
        + RTL
        + DIGITS
        + CODE
        + URLS
        + CONTRACTIONS
        + SPECIAL_LOOKING
        + ODD_UNICODE
        + PROSE
        + REPEATS
    )


def long_text() -> str:
    """A few thousand characters of mixed prose, code and scripts."""
    parts = PROSE + CODE + CJK + ACCENTS + EMOJI + RTL + DIGITS
    return "\n".join(parts) * 2


def random_mixes(count: int, seed: int = 1234) -> list[str]:
    """Concatenations of 2-5 hand-written pieces with random joiners."""
    rng = random.Random(seed)
    pool = [s for s in hand_written() if s]
    joiners = ["", " ", "  ", "\n", "\t", "\u00a0", " \n", "'", ".", "1"]
    out = []
    for _ in range(count):
        pieces = rng.sample(pool, rng.randint(2, 5))
        out.append("".join(p + rng.choice(joiners) for p in pieces))
    return out


def parity_corpus() -> list[str]:
    return hand_written() + [long_text()] + random_mixes(150)


SPECIAL_PIECES = [
    "<start_of_turn>",
    "<end_of_turn>",
    "</s>",
    "<s>",
    "<b>",
    "  ",
    "\n\n",
    "\t\t",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "<|fim_pad|>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "[multimodal]",
    "<unused3>",
]


def _random_codepoint(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        return chr(rng.randint(0x20, 0x7E))
    if r < 0.5:
        return chr(
            rng.choice(
                [9, 10, 11, 12, 13, 0x1C, 0x85, 0xA0, 0x2003, 0x3000, 0x200B, 0x200D, 0x2028]
            )
        )
    if r < 0.8:
        return chr(rng.randint(0xA0, 0x3000))
    if r < 0.9:
        return chr(rng.randint(0x3000, 0xD7FF))
    return chr(rng.randint(0xE000, 0x10FFFF))


def random_texts(count: int, seed: int = 99) -> list[str]:
    """Random code points from every plane, mixed with corpus pieces and special tokens."""
    rng = random.Random(seed)
    pool = [s for s in hand_written() if s]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(pool))
            elif r < 0.5:
                parts.append(rng.choice(SPECIAL_PIECES))
            else:
                parts.append("".join(_random_codepoint(rng) for _ in range(rng.randint(1, 12))))
        out.append("".join(parts))
    return out
