"""Regenerate every example output in README.md and docs/ from the real commands, so the docs stay true.

An example is a fenced block after a marker comment that names what to run (the comment is invisible on
GitHub and on the site):

    <!-- regenerate
    $ attnscope explain "time flies like an arrow" --layer 2 --head 7 --token 2
    keep: 1; /^8\\. /../^9\\. /; -2..
    -->
    ```text
    (replaced by "$ attnscope explain ..." and the command's output)
    ```

Each `$ ` line is a command, shown as written and run with the venv's `attnscope` (or `python`) in a scratch
directory, offline (HF_HUB_OFFLINE=1), stdout and stderr together, COLUMNS=110 unless `width:` says otherwise.
`$ echo $?` shows the exit code of the command before it. Option lines after a command:

    keep: PIECE; PIECE; ...   show only these parts, "..." between parts that are not adjacent. A PIECE is
                              N (line N, 1-based; -N from the end), A..B (A or B may be left out), /RE/ (the
                              first line matching RE after the previous piece), /RE/../RE2/ (from RE's line
                              up to, not including, the next line matching RE2), /RE/.. (to the end),
                              /RE/..+N (RE's line and the N after it)
    width: N                  the terminal width the command sees
    vary: RE                  text that differs from run to run (a time, a size): masked when comparing,
                              so a block whose other text is unchanged is left as it is

`<!-- regenerate: python -->` before a ```python block runs its `>>> ` lines in one fresh interpreter and
writes what each prints or evaluates to under it, as doctest shows it.

The scratch directory holds the files the examples name: the random-weight models tiny-t5, tiny-marian,
tiny-starcoder2 and tiny-bloom (saved with the bundled MiniLM tokenizer, built as the tests build them),
long.txt (one sentence repeated), and tests/data (the repository's own).

    .venv/bin/python docs/regenerate.py                   # every page, every example
    .venv/bin/python docs/regenerate.py docs/learn.md     # only these pages
    .venv/bin/python docs/regenerate.py -k smollm2        # only examples whose commands contain this
    .venv/bin/python docs/regenerate.py --check           # exit 1 and show a diff if any example is stale
    .venv/bin/python docs/regenerate.py --list            # the examples, without running them
    .venv/bin/python docs/regenerate.py --exact -k stats  # rewrite `vary:` text too (a time measured when quiet)
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MARKER = re.compile(r"^<!-- regenerate(?P<inline>:[^\n]*?)?(?P<body>\n.*?)?-->\n(?P<fence>```[^\n]*)\n", re.S | re.M)
GAP = "..."


@dataclass
class Command:
    shown: str
    keep: str = ""
    width: int = 110
    vary: list[str] = field(default_factory=list)


@dataclass
class Example:
    page: Path
    start: int  # offset of the block's first line, after the fence
    end: int  # offset of the closing fence
    kind: str  # "shell" or "python"
    commands: list[Command]
    text: str  # the block as it is in the page

    @property
    def title(self) -> str:
        first = self.commands[0].shown if self.commands else "python"
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}: {first.splitlines()[0][:90]}"


# ---- reading the pages


def parse_commands(body: str) -> list[Command]:
    """The marker's `$ ` commands (a line ending in a backslash continues) and each one's option lines."""
    commands: list[Command] = []
    lines = body.strip("\n").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            shown = line[2:]
            while shown.endswith("\\") and i + 1 < len(lines):
                i += 1
                shown += "\n" + lines[i]
            commands.append(Command(shown))
        elif ":" in line and commands:
            key, value = (s.strip() for s in line.split(":", 1))
            if key == "keep":
                commands[-1].keep = value
            elif key == "width":
                commands[-1].width = int(value)
            elif key == "vary":
                commands[-1].vary.append(value)
            else:
                raise SystemExit(f"unknown option {key!r} in a regenerate marker: {line}")
        elif line.strip():
            raise SystemExit(f"a regenerate marker's line is neither `$ command` nor `option: value`: {line}")
        i += 1
    return commands


def fenced(text: str) -> list[tuple[int, int]]:
    """The spans of fenced code blocks: a marker shown inside one (as in these docs' own help) is not run."""
    spans, opened, fence = [], -1, ""
    for m in re.finditer(r"^(`{3,})[^\n]*$", text, re.M):
        if opened < 0:
            opened, fence = m.start(), m.group(1)
        elif m.group(1) == fence and m.group(0).strip() == fence:
            spans.append((opened, m.end()))
            opened = -1
    return spans


def find_examples(page: Path) -> list[Example]:
    text = page.read_text()
    examples = []
    inside = fenced(text)
    for m in MARKER.finditer(text):
        if any(a <= m.start() < b for a, b in inside):
            continue
        inline = (m.group("inline") or "")[1:].strip()
        start = m.end()
        end = text.index("\n```", start - 1) + 1
        if inline == "python":
            kind, commands = "python", []
        else:
            kind, commands = "shell", parse_commands(("$ " + inline if inline else "") + (m.group("body") or ""))
        examples.append(Example(page, start, end, kind, commands, text[start:end]))
    return examples


# ---- choosing lines


def _piece_range(piece: str, lines: list[str], after: int) -> tuple[int, int]:
    """One `keep:` piece, START[..END], as a half-open range of line indexes; regexes search from `after`."""
    m = re.fullmatch(r"(?P<start>/.+?/|-?\d+)?(?P<dots>\.\.)?(?P<end>/.+/|\+\d+|-?\d+)?", piece)
    if not m or not (m["start"] or m["dots"]):
        raise ValueError(f"cannot read the keep: piece {piece!r}")
    first = _line(m["start"], lines, after) if m["start"] else 0
    if not m["dots"]:
        return first, first + 1
    end = m["end"]
    if not end:
        return first, len(lines)
    if end.startswith("+"):
        return first, min(len(lines), first + 1 + int(end[1:]))
    if end.startswith("/"):
        return first, _line(end, lines, first + 1)
    return first, _line(end, lines, after) + 1


def _line(spec: str, lines: list[str], after: int) -> int:
    """A line's index from N (1-based; -N counts from the end) or /RE/ (the first match at or after `after`)."""
    if not spec.startswith("/"):
        n = int(spec)
        return n - 1 if n > 0 else len(lines) + n
    return _search(spec[1:-1], lines, after)


def _search(pattern: str, lines: list[str], after: int) -> int:
    for i in range(after, len(lines)):
        if re.search(pattern, lines[i]):
            return i
    raise LookupError(f"no line matches /{pattern}/ after line {after + 1}")


def select(output: str, keep: str) -> str:
    """The lines `keep` names, in order, with "..." wherever lines were left out."""
    lines = output.rstrip("\n").splitlines()
    if not keep:
        return "\n".join(lines)
    shown: list[str] = []
    trimmed: list[str] = []  # the previous piece's trailing blank lines, shown if the next piece follows on
    at = 0
    for piece in (p.strip() for p in keep.split(";")):
        first, last = _piece_range(piece, lines, at)
        first = max(first, at)
        shown.extend(trimmed if first == at else [GAP])
        end = last
        while end > first + 1 and not lines[end - 1].strip():
            end -= 1
        shown.extend(lines[first:end])
        trimmed, at = lines[end:last], last
    if any(line.strip() for line in lines[at:]):
        shown.append(GAP)
    return "\n".join(shown)


# ---- running


def run_shell(example: Example, scratch: Path) -> str:
    parts: list[str] = []
    code = 0
    for command in example.commands:
        parts.append(f"$ {command.shown}")
        if command.shown.strip() == "echo $?":
            parts.append(str(code))
            continue
        code, output = run_one(command, scratch)
        if output.strip():
            parts.append(select(output, command.keep))
    return "\n".join(parts) + "\n"


def run_one(command: Command, scratch: Path) -> tuple[int, str]:
    argv = shlex.split(command.shown.replace("\\\n", " "))
    fixtures.make(argv, scratch)
    if argv[0] in ("attnscope", "python"):
        argv[0] = str(BIN / argv[0])
    env = {**os.environ, "COLUMNS": str(command.width), "HF_HUB_OFFLINE": "1", "TERM": "dumb",
           "NO_COLOR": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run(argv, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=1800)
    if "Traceback (most recent call last):" in done.stdout:
        raise RuntimeError(f"`{command.shown}` crashed:\n{done.stdout[-2000:]}")
    return done.returncode, "\n".join(line.rstrip() for line in done.stdout.splitlines())


PYTHON_RUNNER = r"""
import code, contextlib, io, sys
source = sys.stdin.read()
chunks, current = [], None
for line in source.splitlines():
    if line.startswith(">>> "):
        current = [line[4:]]
        chunks.append(current)
    elif line.startswith("... ") or line == "...":
        current.append(line[4:])
namespace = {"__name__": "__main__"}
for chunk in chunks:
    print(">>> " + chunk[0])
    for more in chunk[1:]:
        print("... " + more)
    compiled = compile("\n".join(chunk) + "\n", "<docs>", "single")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compiled, namespace)
    sys.stdout.write(out.getvalue())
"""


def run_python(example: Example, scratch: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([str(BIN / "python"), "-c", PYTHON_RUNNER], input=example.text, cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{example.title}: the Python example failed:\n{done.stderr}")
    return done.stdout


class Fixtures:
    """Files the examples name, made in the scratch directory the first time a command names them."""

    def __init__(self) -> None:
        self.makers: dict[str, Callable[[Path], None]] = {
            "tiny-t5": lambda d: _save_tiny(d, "t5"), "tiny-marian": lambda d: _save_tiny(d, "marian"),
            "tiny-starcoder2": lambda d: _save_tiny(d, "starcoder2"), "tiny-bloom": lambda d: _save_tiny(d, "bloom"),
            "long.txt": _long_text, "tests": _test_data,
        }

    def make(self, argv: list[str], scratch: Path) -> None:
        for arg in argv:
            name = arg.split("/")[0]
            if name in self.makers and not (scratch / name).exists():
                self.makers[name](scratch)


def _long_text(scratch: Path) -> None:
    """long.txt: one sentence repeated, well over 512 tokens."""
    (scratch / "long.txt").write_text("The quick brown fox jumps over the lazy dog. " * 60)


def _test_data(scratch: Path) -> None:
    """tests/data: the repository's own (the UD English EWT slice), as a reader of a clone has it."""
    (scratch / "tests").mkdir()
    (scratch / "tests" / "data").symlink_to(ROOT / "tests" / "data")


fixtures = Fixtures()

TINY_MAKER = r"""
import sys, torch, transformers as T, attnscope
family, where = sys.argv[1], sys.argv[2]
ids = dict(vocab_size=30522, pad_token_id=0, bos_token_id=101, eos_token_id=102)
bart = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=512, **ids)
small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
torch.manual_seed(0)
model = {
    "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=0, **ids)),
    "marian": lambda: T.MarianMTModel(T.MarianConfig(**bart, decoder_start_token_id=0)),
    "starcoder2": lambda: T.Starcoder2Model(T.Starcoder2Config(**small, num_key_value_heads=2, vocab_size=30522)),
    "bloom": lambda: T.BloomModel(T.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=30522)),
}[family]().eval()
model.save_pretrained(where)
attnscope.load_model().tokenizer.save_pretrained(where)
"""


def _save_tiny(scratch: Path, family: str) -> None:
    """A random-weight model (seed 0, the tests' sizes) saved with the bundled tokenizer as tiny-FAMILY."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    subprocess.run([str(BIN / "python"), "-c", TINY_MAKER, family, str(scratch / f"tiny-{family}")],
                   check=True, capture_output=True, env=env)


# ---- comparing and writing


def masked(text: str, example: Example) -> str:
    for pattern in (p for c in example.commands for p in c.vary):
        text = re.sub(pattern, "<varies>", text)
    return text


def regenerate(examples: list[Example], scratch: Path, check: bool, exact: bool = False,
               ) -> tuple[list[Example], list[Example]]:
    """Run each example; write the new blocks (unless check); return the stale ones and those that failed."""
    stale: list[tuple[Example, str]] = []
    failed: list[Example] = []
    for example in examples:
        began = time.monotonic()
        try:
            new = run_python(example, scratch) if example.kind == "python" else run_shell(example, scratch)
        except (LookupError, ValueError, RuntimeError, subprocess.SubprocessError) as error:
            print(f"ERROR {time.monotonic() - began:6.1f} s  {example.title}\n      {error}", flush=True)
            failed.append(example)
            continue
        same = new == example.text if exact else masked(new, example) == masked(example.text, example)
        print(f"{'ok   ' if same else 'STALE'} {time.monotonic() - began:6.1f} s  {example.title}", flush=True)
        if not same:
            stale.append((example, new))
            if check:
                sys.stdout.writelines(difflib.unified_diff(
                    example.text.splitlines(True), new.splitlines(True), "in the page", "from the command"))
    if not check:
        write(stale)
    return [example for example, _ in stale], failed


def write(stale: list[tuple[Example, str]]) -> None:
    by_page: dict[Path, list[tuple[Example, str]]] = {}
    for example, new in stale:
        by_page.setdefault(example.page, []).append((example, new))
    for page, items in by_page.items():
        text = page.read_text()
        for example, new in sorted(items, key=lambda item: -item[0].start):  # from the end: offsets stay put
            assert text[example.start:example.end] == example.text, f"{page} changed while regenerating"
            text = text[:example.start] + new + text[example.end:]
        page.write_text(text)


def pages(chosen: list[str]) -> list[Path]:
    if chosen:
        return [Path(p).resolve() for p in chosen]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="Markdown files (default: README.md and every page in docs/)")
    parser.add_argument("-k", dest="contains", help="only examples whose commands contain this text")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if an example is stale")
    parser.add_argument("--list", action="store_true", help="list the examples without running them")
    parser.add_argument("--exact", action="store_true",
                        help="compare `vary:` text too, so a new time or size is written (on a quiet machine)")
    args = parser.parse_args(argv)
    examples = [e for p in pages(args.pages) for e in find_examples(p)]
    if args.contains:
        examples = [e for e in examples if any(args.contains in c.shown for c in e.commands)
                    or (e.kind == "python" and args.contains in e.text)]
    if args.list:
        print("\n".join(e.title for e in examples))
        return 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnscope-docs-") as scratch:
        stale, failed = regenerate(examples, Path(scratch), args.check, args.exact)
    verb = "stale" if args.check else "rewritten"
    print(f"{len(examples)} examples: {len(stale)} {verb}, {len(failed)} failed, in {time.monotonic() - began:.0f} s")
    return 1 if failed or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
