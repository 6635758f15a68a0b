#!/usr/bin/env python3
"""A strict reader of the Prometheus text exposition format 0.0.4.

  prom_text.py check FILE   every line well-formed, or exit 1 naming each problem
  prom_text.py table FILE   check (problems on stderr), then every sample as SERIES<tab>VALUE,
                            e.g. 'gradgate_raw_bytes_total{peer="site-b",direction="sent"}<tab>42',
                            labels in the page's order: one reading for many look-ups

check wants what Prometheus itself parses and a little more: HELP and TYPE
once per family and before its samples, a family's samples together, every
sample of a declared family (counters, gauges and histograms with their
_bucket, _sum and _count), no series twice, label values properly quoted
and escaped, values that parse as floats, histogram buckets cumulative with
a +Inf bucket equal to _count, counters not negative, and a final newline.
"""
import math
import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse_value(text):
    if text in ("NaN", "+Inf", "-Inf", "Inf"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise ValueError(f"value {text!r} is not a number")
    return float(text)


def parse_labels(text, pos):
    """Labels from text[pos] == '{' to the closing '}': (dict, position after it)."""
    labels = {}
    pos += 1
    while True:
        if text[pos:pos + 1] == "}":
            return labels, pos + 1
        m = LABEL.match(text, pos)
        if not m:
            raise ValueError(f"bad label name at column {pos + 1}")
        name = m.group(0)
        pos = m.end()
        if text[pos:pos + 2] != '="':
            raise ValueError(f"label {name} is not followed by =\"")
        pos += 2
        value = []
        while True:
            if pos >= len(text):
                raise ValueError(f"label {name}: unterminated value")
            c = text[pos]
            if c == "\\":
                nxt = text[pos + 1:pos + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ValueError(f"label {name}: bad escape \\{nxt}")
                value.append("\n" if nxt == "n" else nxt)
                pos += 2
            elif c == '"':
                pos += 1
                break
            elif c == "\n":
                raise ValueError(f"label {name}: newline in value")
            else:
                value.append(c)
                pos += 1
        if name in labels:
            raise ValueError(f"label {name} twice")
        labels[name] = "".join(value)
        if text[pos:pos + 1] == ",":
            pos += 1
        elif text[pos:pos + 1] != "}":
            raise ValueError(f"expected , or }} after label {name}")


def parse_sample(line):
    m = NAME.match(line)
    if not m:
        raise ValueError("a sample must start with a metric name")
    name, pos = m.group(0), m.end()
    labels = {}
    if line[pos:pos + 1] == "{":
        labels, pos = parse_labels(line, pos)
    rest = line[pos:]
    if not rest.startswith(" "):
        raise ValueError("no space before the value")
    parts = rest.split()
    if len(parts) not in (1, 2):
        raise ValueError("expected a value and at most a timestamp")
    value = parse_value(parts[0])
    if len(parts) == 2 and not re.fullmatch(r"-?\d+", parts[1]):
        raise ValueError("the timestamp must be an integer")
    return name, labels, value


def family_of(name, types):
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)] if name.endswith(suffix) else None
        if base and types.get(base) in ("histogram", "summary"):
            return base
    return None


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.decode("utf-8")


def check(text):
    problems = []
    helps, types, samples, seen = {}, {}, {}, set()
    finished, current = set(), None
    if not text.endswith("\n"):
        problems.append("the page does not end with a newline")
    for n, line in enumerate(text.split("\n")[:-1], 1):
        try:
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    name = parts[2]
                    if not NAME.fullmatch(name):
                        raise ValueError(f"bad metric name {name!r}")
                    if name != current:
                        if name in finished or name in types or name in helps:
                            raise ValueError(f"family {name} declared again, apart from its first lines")
                        if current:
                            finished.add(current)
                        current = name
                    table = helps if parts[1] == "HELP" else types
                    if name in table:
                        raise ValueError(f"{parts[1]} of {name} twice")
                    if parts[1] == "TYPE":
                        if len(parts) != 4 or parts[3] not in TYPES:
                            raise ValueError(f"bad TYPE line for {name}")
                        if name in samples:
                            raise ValueError(f"TYPE of {name} after its samples")
                    elif len(parts) != 4 or not parts[3].strip():
                        raise ValueError(f"HELP of {name} without text")
                    table[name] = parts[3] if len(parts) == 4 else ""
                continue
            if not line.strip():
                raise ValueError("empty line")
            name, labels, value = parse_sample(line)
            fam = family_of(name, types)
            if fam is None:
                raise ValueError(f"sample {name} of no declared family")
            if fam != current:
                raise ValueError(f"sample {name} apart from its family {fam}'s other lines")
            key = (name, tuple(sorted(labels.items())))
            if key in seen:
                raise ValueError(f"series {line.split(' ')[0]} twice")
            seen.add(key)
            kind = types[fam]
            if kind == "counter" and (value < 0 or math.isnan(value)):
                raise ValueError(f"counter {name} is {value}")
            if kind == "histogram" and name == fam:
                raise ValueError(f"histogram {fam} has a bare sample")
            if name.endswith("_bucket") and kind == "histogram" and "le" not in labels:
                raise ValueError(f"bucket of {fam} without le")
            samples.setdefault(fam, []).append((name, labels, value))
        except ValueError as e:
            problems.append(f"line {n}: {e}: {line[:120]}")
    for fam, kind in types.items():
        if kind != "histogram":
            continue
        groups = {}
        for name, labels, value in samples.get(fam, []):
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            groups.setdefault(rest, {"buckets": [], "count": None, "sum": None})
            g = groups[rest]
            if name == fam + "_bucket":
                g["buckets"].append((parse_value(labels["le"]), value))
            elif name == fam + "_count":
                g["count"] = value
            elif name == fam + "_sum":
                g["sum"] = value
        for rest, g in groups.items():
            b = g["buckets"]
            if [le for le, _ in b] != sorted(le for le, _ in b):
                problems.append(f"histogram {fam}: buckets out of order")
            if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
                problems.append(f"histogram {fam}: buckets not cumulative")
            if not b or not math.isinf(b[-1][0]):
                problems.append(f"histogram {fam}: no +Inf bucket")
            elif g["count"] is None or g["sum"] is None or b[-1][1] != g["count"]:
                problems.append(f"histogram {fam}: _count and _sum missing, or the +Inf bucket is not _count")
    for fam in types:
        if fam not in helps:
            problems.append(f"family {fam} has no HELP")
    return problems, types, samples


def number(v):
    return int(v) if math.isfinite(v) and v == int(v) and abs(v) < 2**63 else repr(v)


def series(name, labels):
    """A sample's series as the exposition format spells it."""
    if not labels:
        return name
    esc = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
    return name + "{" + ",".join(f'{k}="{"".join(esc.get(c, c) for c in v)}"' for k, v in labels.items()) + "}"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "table"):
        print(__doc__, file=sys.stderr)
        return 2
    table = sys.argv[1] == "table"
    problems, _, samples = check(read(sys.argv[2]))
    for p in problems:
        print(f"{sys.argv[2]}: {p}", file=sys.stderr if table else sys.stdout)
    if problems or not table:
        return 1 if problems else 0
    for fam in samples.values():
        for name, labels, value in fam:
            print(f"{series(name, labels)}\t{number(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
