"""The desktop chat window: pick a model (a file, a recent one, or the default), chat with it,
stop a reply, start a new chat; the conversation and the options are saved and come back at
the next start.

Every model call runs on a worker thread; it hands its results to the window through a
queue that the Tk event loop reads every few milliseconds (Tk may only be touched from the
thread that runs it), so the window stays responsive while a reply streams.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
import tkinter as tk
from collections.abc import Callable
from pathlib import Path
from tkinter import filedialog, ttk
from typing import Any

import psutil

import edgeinfer
from edgeinfer import errors
from edgeinfer.apps.desktop.store import Store
from edgeinfer.atomic_file import atomic_file
from edgeinfer.conversation import Conversation
from edgeinfer.kv_cache import CACHE_TYPES

POLL_MS = 25
POLICIES = ("error", "shift", "streaming", "h2o")
DEFAULT_OPTIONS = {"temperature": 0.8, "n_ctx": 4096, "kv_type": "f16", "context_policy": "error"}


class ChatWindow:
    def __init__(self, root: tk.Tk, store: Store, state_file: Path | None = None) -> None:
        self.root, self.store, self.state_file = root, store, state_file
        saved = store.load()
        self.options = {**DEFAULT_OPTIONS, **saved.get("options", {})}
        self.model: Any = None
        self.conversation: Conversation | None = None
        self.stream: Any = None
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.busy = False
        root.title("edgeinfer chat")
        root.geometry("900x640")
        self._build()
        self.system.insert(0, saved.get("system", ""))
        self._show_error(store.error)
        root.protocol("WM_DELETE_WINDOW", self.quit)
        root.bind("<Control-q>", lambda _e: self.quit())
        root.after(POLL_MS, self._poll)

    # --- layout -------------------------------------------------------------------------

    def _build(self) -> None:
        top = ttk.Frame(self.root, padding=4)
        top.pack(fill="x")
        ttk.Button(top, text="Open model…", command=self.choose_file).pack(side="left")
        self.recent = ttk.Menubutton(top, text="Recent")
        self.recent_menu = tk.Menu(self.recent, tearoff=False)
        self.recent["menu"] = self.recent_menu
        self.recent.pack(side="left", padx=4)
        ttk.Button(top, text="Default model", command=self.open_default).pack(side="left")
        self.model_label = ttk.Label(top, text="no model loaded")
        self.model_label.pack(side="left", padx=8)
        self.progress = ttk.Progressbar(top, length=120, maximum=1.0)
        self.progress.pack(side="right")

        row = ttk.Frame(self.root, padding=4)
        row.pack(fill="x")
        ttk.Label(row, text="System prompt").pack(side="left")
        self.system = ttk.Entry(row)
        self.system.pack(side="left", fill="x", expand=True, padx=4)
        opts = ttk.Frame(self.root, padding=4)
        opts.pack(fill="x")
        self.temperature = self._spinbox(opts, "Temperature", 0.0, 2.0, 0.1, "temperature")
        self.n_ctx = self._spinbox(opts, "Context", 256, 131072, 256, "n_ctx")
        self.kv_type = self._combo(opts, "KV cache", list(CACHE_TYPES), "kv_type")
        self.policy = self._combo(opts, "At the context's end", list(POLICIES), "context_policy")
        ttk.Button(opts, text="Reload", command=self.reload).pack(side="left", padx=4)
        self._refresh_recent()

        self.notice = ttk.Label(self.root, foreground="#8a5a00", wraplength=880, padding=4)
        self.notice.pack(fill="x")
        self.transcript = tk.Text(self.root, wrap="word", state="disabled", height=20)
        self.transcript.pack(fill="both", expand=True, padx=4)
        self.transcript.tag_configure("user", foreground="#1f4e9c")

        bottom = ttk.Frame(self.root, padding=4)
        bottom.pack(fill="x")
        self.entry = ttk.Entry(bottom)
        self.entry.pack(side="left", fill="x", expand=True)
        self.entry.bind("<Return>", lambda _e: self.send())
        ttk.Button(bottom, text="Send", command=self.send).pack(side="left", padx=2)
        ttk.Button(bottom, text="Stop", command=self.stop).pack(side="left", padx=2)
        ttk.Button(bottom, text="New chat", command=self.new_chat).pack(side="left", padx=2)
        self.stats = ttk.Label(self.root, text="", padding=4)
        self.stats.pack(fill="x")
        self.error = ttk.Label(self.root, text="", foreground="#b00020", wraplength=880, padding=4)
        self.error.pack(fill="x")
        self.entry.focus_set()

    def _spinbox(self, parent: Any, label: str, lo: float, hi: float, step: float, key: str):
        ttk.Label(parent, text=label).pack(side="left", padx=(8, 2))
        box = ttk.Spinbox(parent, from_=lo, to=hi, increment=step, width=7)
        box.set(self.options[key])
        box.pack(side="left")
        return box

    def _combo(self, parent: Any, label: str, values: list[str], key: str) -> ttk.Combobox:
        ttk.Label(parent, text=label).pack(side="left", padx=(8, 2))
        box = ttk.Combobox(parent, values=values, width=9, state="readonly")
        box.set(self.options[key])
        box.pack(side="left")
        return box

    # --- models -------------------------------------------------------------------------

    def choose_file(self) -> None:
        path = filedialog.askopenfilename(
            title="Open a model", filetypes=[("GGUF models", "*.gguf"), ("All files", "*")]
        )
        if path:
            self.open_model(path)

    def open_default(self) -> None:
        options = self._options_or_error()
        if options is None:
            return

        def job() -> None:
            from edgeinfer.default_model import default_model_path

            path = default_model_path(progress=lambda d, t: self.events.put(("progress", d / t)))
            self._load(str(path), options)

        self._run(job)

    def open_model(self, path: str) -> None:
        options = self._options_or_error()
        if options is not None:
            self._run(lambda: self._load(path, options))

    def reload(self) -> None:
        if self.model is not None:
            self.open_model(self.model.path)

    def _options_or_error(self) -> dict[str, Any] | None:
        """The window's options, read on the Tk thread (a worker must not touch Tk, least of all
        before the event loop runs), or None with the error shown."""
        try:
            return self._read_options()
        except errors.InvalidOptionError as e:
            self._show_error(f"{type(e).__name__}: {e}")
            return None

    def _load(self, path: str, options: dict[str, Any]) -> None:
        """On the worker: loads ``path`` with the options read from the window (the old model
        closes)."""
        old, self.model = self.model, None
        if old is not None:
            old.close()
        model = edgeinfer.load(
            path, n_ctx=int(options["n_ctx"]), kv_type=options["kv_type"],
            context_policy=options["context_policy"],
            progress=lambda f: self.events.put(("progress", f)),
        )  # fmt: skip
        self.events.put(("loaded", model))

    def _read_options(self) -> dict[str, Any]:
        try:
            options = {
                "temperature": float(self.temperature.get()), "n_ctx": int(self.n_ctx.get()),
                "kv_type": self.kv_type.get(), "context_policy": self.policy.get(),
            }  # fmt: skip
        except ValueError as e:
            raise errors.InvalidOptionError(f"an option is not a number: {e}") from None
        self.options.update(options)
        return options

    # --- chatting -----------------------------------------------------------------------

    def send(self) -> None:
        text = self.entry.get().strip()
        if not text or self.busy:
            return
        if self.conversation is None:
            self._show_error("open a model first")
            return
        self.entry.delete(0, "end")
        self.conversation.system = self.system.get().strip() or None
        self._append(f"You: {text}\n", "user")
        self._append("Model: ")
        temperature = self._read_options()["temperature"]
        conversation = self.conversation

        def job() -> None:
            started = time.perf_counter()
            stream = conversation.send(text, temperature=temperature)
            self.stream = stream
            try:
                started_text = False
                for piece in stream:
                    if not started_text:  # the transcript's reply begins after "Assistant:"
                        piece = piece.lstrip()
                        started_text = bool(piece)
                    self.events.put(("piece", piece))
            finally:
                conversation.finish(stream)
                self.events.put(("reply", (stream.stats, time.perf_counter() - started)))

        self._run(job)

    def stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def new_chat(self) -> None:
        self.stop()
        if self.conversation is not None and not self.busy:
            self.conversation.messages.clear()
            self._run(self.conversation.reset)
        self._set_transcript("")
        self._save()

    # --- the worker and the event loop --------------------------------------------------

    def _run(self, job: Any) -> None:
        """Runs ``job`` on a worker thread; its end, or its error, comes back as an event."""
        if self.busy:
            return
        self.busy = True
        self._show_error("")

        def work() -> None:
            try:
                job()
            except errors.EdgeInferError as e:
                self.events.put(("error", f"{type(e).__name__}: {e}"))
            except Exception as e:
                self.events.put(("error", f"unexpected {type(e).__name__}: {e}"))
            finally:
                self.events.put(("idle", None))

        threading.Thread(target=work, name="edgeinfer-desktop-worker", daemon=True).start()

    def _poll(self) -> None:
        try:
            while True:
                kind, payload = self.events.get_nowait()
                self._handle(kind, payload)
        except queue.Empty:
            pass
        self.root.after(POLL_MS, self._poll)

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "progress":
            self.progress["value"] = payload
        elif kind == "piece":
            self._append(payload)
        elif kind == "loaded":
            self._loaded(payload)
        elif kind == "reply":
            self._replied(*payload)
        elif kind == "error":
            self._show_error(payload)
        elif kind == "idle":
            self.busy, self.stream = False, None
        self._report()

    def _loaded(self, model: Any) -> None:
        self.model = model
        # the first model takes the saved conversation; a reload (other options, another
        # model) goes on with the one in the window
        if self.conversation is None:
            messages = self.store.state.get("messages", [])
        else:
            messages = self.conversation.messages
        self.conversation = Conversation(model, messages=messages)
        name = model.metadata.get("general.name", Path(model.path).name)
        self.model_label["text"] = f"{name} ({model.engine} engine, context {model.n_ctx})"
        self.notice["text"] = self.conversation.defaults.notice(name) or ""
        self.store.remember_model(model.path)
        self._refresh_recent()
        self._set_transcript("")
        for m in self.conversation.messages:
            who = "You" if m["role"] == "user" else "Model"
            self._append(f"{who}: {m['content']}\n", "user" if who == "You" else "")
        self._save()

    def _replied(self, stats: Any, seconds: float) -> None:
        if self.transcript.get("end-2c", "end-1c") != "\n":  # the reply's own may end it
            self._append("\n")
        rss = psutil.Process().memory_info().rss / 2**20
        self.stats["text"] = (
            f"{stats.gen_tok_s:.1f} tok/s | first token {stats.ttft_s * 1000:.0f} ms | "
            f"{stats.generated_tokens} tokens in {seconds:.1f} s ({stats.finish_reason}) | "
            f"memory {rss:.0f} MiB"
        )
        self._save()

    # --- widgets and saving -------------------------------------------------------------

    def _append(self, text: str, tag: str = "") -> None:
        self.transcript.configure(state="normal")
        self.transcript.insert("end", text, tag)
        self.transcript.configure(state="disabled")
        self.transcript.see("end")

    def _set_transcript(self, text: str) -> None:
        self.transcript.configure(state="normal")
        self.transcript.delete("1.0", "end")
        self.transcript.insert("end", text)
        self.transcript.configure(state="disabled")

    def _show_error(self, text: str) -> None:
        self.error["text"] = text

    def _refresh_recent(self) -> None:
        self.recent_menu.delete(0, "end")
        for path in self.store.state.get("recent", []):
            self.recent_menu.add_command(label=path, command=self._opener(path))

    def _opener(self, path: str) -> Callable[[], None]:
        return lambda: self.open_model(path)

    def _save(self) -> None:
        state = self.store.state
        if self.conversation is not None:
            state["messages"] = self.conversation.to_dict()["messages"]
        state["system"] = self.system.get()
        state["options"] = dict(self.options)
        try:
            self.store.save()
        except OSError as e:
            self._show_error(f"the conversation could not be saved: {e}")

    def _report(self) -> None:
        """The test hook (--state-file): the widgets' state, written atomically."""
        if self.state_file is None:
            return
        state = {
            "transcript": self.transcript.get("1.0", "end-1c"), "error": self.error["text"],
            "stats": self.stats["text"], "model": self.model_label["text"],
            "notice": self.notice["text"], "busy": self.busy,
            "engine": self.model.engine if self.model is not None else None,
        }  # fmt: skip
        with atomic_file(self.state_file) as out:
            out.write(json.dumps(state).encode("utf-8"))

    def quit(self) -> None:
        self.stop()
        self._save()
        if self.model is not None:
            self.model.close()
        self.root.destroy()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="edgeinfer desktop", description="The desktop chat app.")
    p.add_argument("model", nargs="?", help="GGUF file to open (default: the last one used)")
    p.add_argument("--state-file", type=Path, default=None,
                   help="write the window's state here after each event (for tests)")  # fmt: skip
    args = p.parse_args(argv)
    root = tk.Tk()
    window = ChatWindow(root, Store(), args.state_file)
    recent = window.store.state.get("recent", [])
    start = args.model or (recent[0] if recent else None)
    if start:
        window.open_model(start)
    window._report()
    root.mainloop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
