"""The part of YAML that configuration dumps use, read without PyYAML (not a kvsim dependency).

Read: block mappings and sequences by indentation (a sequence may sit at its key's indentation; `- key:
value` opens a mapping in a sequence item), `#` comments, `---` and `...` document markers, and scalars
resolved as PyYAML's safe loader (YAML 1.1) resolves them: null (`~`, `null`, empty), booleans (`true`,
`false`, `yes`, `no`, `on`, `off` in lower, Title or UPPER case), decimal integers, floats with a point
(`1.5`, `1.0e-05`, `.inf`, `.nan`), single- and double-quoted strings, `[]`, `{}` and flow lists of
plain scalars (`[1, 2]`); any other text is a string. Not read, each one line naming the file and line:
anchors, aliases, tags, block scalars (`|`, `>`), flow mappings, nested or quoted flow lists, plain
scalars continued on the next line, tabs in indentation, duplicate keys.
"""

from __future__ import annotations

import json
import re

_INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"[-+]?([0-9][0-9_]*)?\.[0-9_]*([eE][-+][0-9]+)?$")
_SPECIAL = {".inf": float("inf"), "+.inf": float("inf"), "-.inf": float("-inf"), ".nan": float("nan")}
_BOOLS = {w: v for v, words in ((True, ("true", "yes", "on")), (False, ("false", "no", "off")))
          for word in words for w in (word, word.title(), word.upper())}


def _strip_comment(line: str) -> str:
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"" and (k == 0 or line[k - 1] in " :-[,"):
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k]
    return line


def _scalar(text: str, where: str):
    if not text or text in ("~", "null", "Null", "NULL"):
        return None
    if text[0] in "&*!|>{" and text != "{}":
        raise ValueError(f"{where}: {text[:20]!r}: anchors, aliases, tags, block scalars and flow mappings "
                         "are not read (kvsim reads block-style YAML)")
    if text[0] == '"':
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: bad double-quoted string {text[:30]!r}") from None
    if text[0] == "'":
        if len(text) < 2 or text[-1] != "'":
            raise ValueError(f"{where}: unterminated single-quoted string {text[:30]!r}")
        return text[1:-1].replace("''", "'")
    if text == "{}":
        return {}
    if text[0] == "[":
        inner = text[1:-1].strip() if text.endswith("]") else None
        if inner is None or any(c in inner for c in "[]{}'\""):
            raise ValueError(f"{where}: only flow lists of plain scalars are read, got {text[:30]!r}")
        return [_scalar(item.strip(), where) for item in inner.split(",")] if inner else []
    if text in _BOOLS:
        return _BOOLS[text]
    if _INT.match(text):
        return int(text.replace("_", ""))
    if text.lower() in _SPECIAL:
        return _SPECIAL[text.lower()]
    if _FLOAT.match(text) and any(c.isdigit() for c in text):
        return float(text.replace("_", ""))
    return text


def _key(text: str, where: str) -> tuple[str, str] | None:
    """(key, rest) when `text` is `key: rest` or `key:`, else None."""
    if text[0] in "'\"":
        end = text.find(text[0], 1)
        if end > 0 and text[end + 1:end + 2] == ":" and text[end + 2:end + 3] in ("", " "):
            return str(_scalar(text[:end + 1], where)), text[end + 2:].strip()
        return None
    m = re.match(r"([^#]*?):( |$)", text)
    return (m.group(1).strip(), text[m.end():].strip()) if m else None


class _Lines:
    def __init__(self, text: str, source: str):
        self.source, self.items = source, []
        for n, raw in enumerate(text.splitlines(), start=1):
            body = _strip_comment(raw).rstrip()
            if not body.strip() or body.strip() in ("---", "..."):
                continue
            lead = body[:len(body) - len(body.lstrip())]
            if "\t" in lead:
                raise ValueError(f"{source}:{n}: a tab in the indentation")
            self.items.append([len(lead), body.strip(), n])

    def where(self, i: int) -> str:
        return f"{self.source}:{self.items[i][2]}"

    def is_item(self, i: int, indent: int) -> bool:
        ind, text, _ = self.items[i]
        return ind == indent and (text == "-" or text.startswith("- "))

    def block(self, i: int, indent: int):
        return self.sequence(i, indent) if self.is_item(i, indent) else self.mapping(i, indent)

    def mapping(self, i: int, indent: int):
        out: dict = {}
        while i < len(self.items) and self.items[i][0] == indent and not self.is_item(i, indent):
            split = _key(self.items[i][1], self.where(i))
            if split is None:
                raise ValueError(f"{self.where(i)}: expected 'key: value', got {self.items[i][1][:40]!r} "
                                 "(a plain scalar continued on this line is not read)")
            key, rest = split
            if key in out:
                raise ValueError(f"{self.where(i)}: duplicate key {key!r}")
            i += 1
            nested = i < len(self.items) and (self.items[i][0] > indent or self.is_item(i, indent))
            if rest:
                out[key] = _scalar(rest, self.where(i - 1))
            elif nested:
                out[key], i = self.block(i, self.items[i][0])
            else:
                out[key] = None
        return out, i

    def sequence(self, i: int, indent: int):
        out = []
        while i < len(self.items) and self.is_item(i, indent):
            text = self.items[i][1]
            rest = text[1:].lstrip()
            if not rest:
                i += 1
                if i < len(self.items) and self.items[i][0] > indent:
                    value, i = self.block(i, self.items[i][0])
                else:
                    value = None
            elif _key(rest, self.where(i)) is not None:     # `- key: value` opens a mapping
                self.items[i][:2] = [indent + len(text) - len(rest), rest]
                value, i = self.mapping(i, self.items[i][0])
            else:
                value, i = _scalar(rest, self.where(i)), i + 1
            out.append(value)
        return out, i


def loads(text: str, source: str = "<yaml>"):
    """The document in `text` (module docstring); `source` names the file in errors."""
    lines = _Lines(text, source)
    if not lines.items:
        return None
    value, i = lines.block(0, lines.items[0][0])
    if i < len(lines.items):
        raise ValueError(f"{lines.where(i)}: unexpected indentation (a plain scalar continued on this line "
                         "is not read)")
    return value
