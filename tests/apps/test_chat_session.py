"""`edgeinfer chat` driven through a pseudo-terminal, as a person would type into it."""

from __future__ import annotations

import os
import re
import signal
import threading

import pexpect
import pytest

from edgeinfer.conversation import Conversation
from tests.api.conftest import load
from tests.apps.conftest import EDGEINFER, cli, engine_args

PROMPT = "> "
STATS = (
    r"\[prompt (\d+) tok(?: \((\d+) cached\))? \| [\d.]+ tok/s \| "
    r"generated (\d+) tok, [\d.]+ tok/s \| first token \d+ ms \| stop: (\w+)\]"
)


def spawn(*args: str, timeout: float = 60) -> pexpect.spawn:
    child = pexpect.spawn(EDGEINFER, ["chat", *map(str, args), *engine_args()], encoding="utf-8",
                          timeout=timeout, dimensions=(50, 400))  # fmt: skip
    child.expect(r"ready \(")
    child.expect_exact(PROMPT)
    return child


def say(child: pexpect.spawn, text: str) -> re.Match:
    """Sends a line; returns the match of the stats line that follows the reply."""
    child.sendline(text)
    child.expect(STATS)
    match = child.match
    child.expect_exact(PROMPT)
    return match


def _clean(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", text).replace("\r", "")


def test_multi_turn_session_with_commands(fixture_models):
    path = fixture_models["gemma3"]
    child = spawn(path, "--temp", "0", "-n", "12")
    first = say(child, "Hello there")
    assert int(first[3]) == 12 and first[4] == "length" and first[2] is None
    reply_text = _clean(child.before)
    second = say(child, "And again")
    assert int(second[2]) > 0  # the first turn came from the cache
    # /stats repeats the last reply's stats
    child.sendline("/stats")
    child.expect(STATS)
    assert child.match.group(0) == second.group(0)
    child.expect_exact(PROMPT)
    # /reset forgets: the same first line is answered as at the start, nothing cached
    child.sendline("/reset")
    child.expect_exact("(conversation cleared)")
    child.expect_exact(PROMPT)
    again = say(child, "Hello there")
    assert again[2] is None and again[1] == first[1]
    assert reply_text  # (the reply went to the terminal)
    # unknown commands show the help, /exit leaves
    child.sendline("/what")
    child.expect_exact("commands:")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_replies_equal_the_api(fixture_models):
    path = fixture_models["qwen2"]
    child = spawn(path, "--temp", "0", "-n", "10", "-s", "Be brief.")
    child.sendline("Hi")
    child.expect(STATS)
    shown = _clean(child.before)
    with load(path) as model:
        # a model without a chat template talks through a plain transcript, which ends at
        # the user's next turn, with the repetition guard on
        transcript = "Be brief.\n\nUser: Hi\nAssistant:"
        expected = model.generate(
            transcript, max_tokens=10, temperature=0, stop="\nUser:", repetition_guard=True
        ).text
    assert expected.strip() and expected.strip() in shown
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_interrupts_the_reply_and_returns_to_the_prompt(fixture_models):
    path = fixture_models["qwen3"]
    child = spawn(path, "--temp", "0", "-n", "5000", "-c", "2048")
    child.sendline("Tell me everything")
    child.expect_exact("Tell me everything\r\n")  # the terminal's echo
    child.expect(r"(?s).{20}")  # the reply is streaming
    child.sendintr()
    child.expect_exact("[interrupted]")
    child.expect(STATS)
    assert child.match[4] == "cancelled" and int(child.match[3]) < 5000
    child.expect_exact(PROMPT)
    # the session goes on: the next reply comes in full
    child.sendline("/reset")
    child.expect_exact(PROMPT)
    child.sendline("Short one")
    child.expect(STATS, timeout=300)
    child.expect_exact(PROMPT)
    # Ctrl-D at the prompt: a clean exit
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and child.signalstatus is None


class _PressesCtrlC:
    """A reply stream: after its third piece Ctrl-C (SIGINT) comes from another thread,
    most likely while the reading thread is inside the library waiting for a step."""

    def __init__(self, stream):
        self.stream, self.pieces, self.raised_inside = stream, 0, False

    def __iter__(self):
        return self

    def __next__(self):
        try:
            piece = next(self.stream)
        except KeyboardInterrupt:
            self.raised_inside = True
            raise
        self.pieces += 1
        if self.pieces == 3:
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
        return piece

    def __getattr__(self, name):
        return getattr(self.stream, name)


def test_ctrl_c_cancels_the_reply_without_raising_inside_the_library(fixture_models, capsys):
    """Ctrl-C during a reply cancels its stream (a KeyboardInterrupt raised inside the
    library could land while the model's turn is half given back, and the next call would
    wait for ever: seen once as /reset hanging after Ctrl-C on a loaded machine)."""
    from edgeinfer.apps.cli import _ChatSession

    with load(fixture_models["qwen3"], n_ctx=2048) as model:
        conversation = Conversation(model, max_tokens=5000, temperature=0, repetition_guard=False)
        send, streams = conversation.send, []
        conversation.send = lambda text: streams.append(_PressesCtrlC(send(text))) or streams[-1]  # type: ignore[method-assign]
        session = _ChatSession(conversation)
        session.reply("Tell me everything")
        assert not streams[0].raised_inside
        assert session.last.finish_reason == "cancelled"
        assert 3 <= session.last.generated_tokens < 5000
        assert capsys.readouterr().out.endswith(" [interrupted]\n")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
        done = threading.Event()
        threading.Thread(target=lambda: (model.reset(), done.set()), daemon=True).start()
        assert done.wait(60), "the model's next call waits for the interrupted reply's turn"
        following = Conversation(model, max_tokens=4, temperature=0)
        assert "".join(following.send("Hi")), "the next reply comes"


def test_ctrl_c_at_the_prompt_exits_cleanly(fixture_models):
    child = spawn(fixture_models["llama"], "--temp", "0", "-n", "4")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in child.before


def test_context_overflow_in_a_session(fixture_models):
    child = spawn(fixture_models["llama"], "--temp", "0", "-n", "8", "-c", "48")
    for i in range(8):
        child.sendline(f"turn number {i} with a few words")
        index = child.expect([STATS, r"no longer fits the context"])
        child.expect_exact(PROMPT)
        if index == 1:
            break
    else:
        pytest.fail("the conversation never outgrew a 48-token context")
    child.sendline("/reset")
    child.expect_exact(PROMPT)
    say(child, "fresh start")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_piped_chat_prints_only_replies(fixture_models):
    path = fixture_models["gemma3"]
    proc = cli("chat", path, "--temp", "0", "-n", "6", *engine_args(), input="Hello\n/stats\nBye\n")
    assert proc.returncode == 0, proc.stderr
    with load(path) as model:  # the chat is a Conversation of the API
        conversation = Conversation(model, max_tokens=6, temperature=0)
        replies = []
        for line in ("Hello", "Bye"):
            stream = conversation.send(line)
            replies.append("".join(stream))
            conversation.finish(stream)
        first, second = replies
    assert proc.stdout == f"{first}\n{second}\n"
    assert len(re.findall(STATS, proc.stderr)) == 3  # two replies and /stats
    # a model without a chat template: the chat says so, and /stats shows its defaults
    assert "is a base model" in proc.stderr and "repetition guard on" in proc.stderr
