"""What a file given as a model file is, when it is not one: named for the loader's messages.

A TorchScript archive (what ``pair_style mace`` reads), a pickle that names Python code, a
text file, an empty file, or bytes of no known kind. Everything here reads bytes and never
unpickles: the globals a pickle names are read from its opcodes (:mod:`pickletools`),
statically, as torch's own ``get_unsafe_globals_in_checkpoint`` does.
"""

from __future__ import annotations

import codecs
import io
import pickletools
import zipfile
from pathlib import Path

#: How much of a file is read to tell what it is.
HEAD_BYTES = 4096
#: The longest first line of a text file quoted in a message.
QUOTED_CHARS = 60
#: Where a model file comes from, for the messages about other files.
EXPORT = "write a model file with nvalchemi-lammps export CONFIG.toml -o FILE.pt"
#: Opcodes that push one string a later STACK_GLOBAL may take as module or name.
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
               "BINSTRING", "SHORT_BINSTRING"}  # fmt: skip
#: Opcodes that store the top of the stack in the memo under an explicit index.
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT"}
#: Opcodes that push a memo entry.
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}


def head(path: Path) -> bytes:
    """The first :data:`HEAD_BYTES` of ``path``."""
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES)


def is_torchscript(path: Path) -> bool:
    """``path`` is a TorchScript archive (``torch.jit.save``): a zip with ``constants.pkl``
    next to ``data.pkl``, as torch itself tells them apart."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return any(name.rpartition("/")[2] == "constants.pkl" for name in names)


def pickled_globals(path: Path) -> list[tuple[str, str]] | None:
    """``(module, name)`` of every global the pickle in ``path`` names, in order, each once;
    read without unpickling. In a torch archive that is its ``data.pkl``, read up to any
    damage; any other file is read as one or more whole pickles (a legacy torch file is
    several in a row), and is ``None`` when it is not (a text file may begin like one)."""
    try:
        archive = zipfile.is_zipfile(path)
        if archive:
            with zipfile.ZipFile(path) as opened:
                member = next(n for n in opened.namelist() if n.endswith("data.pkl"))
                data = opened.read(member)
        else:
            data = path.read_bytes()
    except (StopIteration, zipfile.BadZipFile, OSError, ValueError, EOFError):
        return [] if archive else None
    found: list[tuple[str, str]] = []
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        start = stream.tell()
        try:
            _scan(stream, found)
        except Exception:  # noqa: BLE001  (damaged, or no pickle at all)
            if not archive:
                return None
            break
        if stream.tell() == start:
            break
    return list(dict.fromkeys(found))


def _scan(stream: io.BytesIO, found: list[tuple[str, str]]) -> None:
    """One pickle's globals into ``found``. ``STACK_GLOBAL`` takes its module and name from
    the two pushes before it, which may come from the memo."""
    pushed: list[object] = []  # what each opcode pushed: a string, or None for anything else
    memo: dict[int, object] = {}
    for opcode, arg, _ in pickletools.genops(stream):
        name = opcode.name
        if name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            found.append((module, attribute))
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            module, attribute = pushed[-2:] if len(pushed) >= 2 else (None, None)
            if isinstance(module, str) and isinstance(attribute, str):
                found.append((module, attribute))
            pushed[-2:] = [None]
        elif name in _STRING_OPS:
            pushed.append(arg)
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in _PUT_OPS:
            memo[int(arg)] = pushed[-1] if pushed else None
        elif name in _GET_OPS:
            pushed.append(memo.get(int(arg)))
        elif opcode.stack_after:
            pushed.append(None)


def text_line(data: bytes) -> str | None:
    """The first non-empty line of ``data`` (quoted, shortened) if ``data`` reads as text:
    UTF-8 without NUL bytes; ``None`` for binary data."""
    if b"\0" in data:
        return None
    try:  # an incremental decoder accepts a character cut at the end of the head
        text = codecs.getincrementaldecoder("utf-8")().decode(data)
    except UnicodeDecodeError:
        return None
    if any(not (c.isprintable() or c in "\t\r\n\f") for c in text):
        return None
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= QUOTED_CHARS else line[: QUOTED_CHARS - 3] + "..."
