#!/usr/bin/env python3
"""Runs a toml-test decoder over the toml-test suite's TOML 1.0.0 file list.

Valid files must decode to JSON equal to the suite's .json file; invalid
files must be refused (not by a signal) with a message. The files go to
the decoder in batches (its "ok JSON" / "refused MESSAGE" lines); a batch
that does not end cleanly runs again a file at a time on stdin (exit 0
and JSON on stdout, or non-zero and a message on stderr), so that every
failure is named. Prints one line per failure, then
"toml-test: N passed, N failed"; exits 1 if anything failed.
"""

import argparse
import concurrent.futures
import json
import math
import os
import re
import subprocess
import sys

TIMEOUT_S = 5
BATCH = 64
LIST_NAME = "files-toml-1.0.0"
DATETIME_TYPES = ("datetime", "datetime-local", "date-local", "time-local")
# A decoder built with sanitizers may report and still exit with a status
# that looks like an ordinary refusal.
SANITIZER_RE = re.compile(rb"^==\d+==ERROR: |^\S+:\d+:\d+: runtime error: ", re.MULTILINE)
FRACTION_RE = re.compile(r"\.(\d+)")
# Python's int() and float() also take "1_000", "infinity" and spaces.
INTEGER_RE = re.compile(r"[+-]?\d+")
FLOAT_RE = re.compile(r"[+-]?(?:inf|nan|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)")


class Mismatch(Exception):
    pass


def is_tagged(node):
    return (isinstance(node, dict) and set(node) == {"type", "value"}
            and isinstance(node["type"], str) and isinstance(node["value"], str))


def parse_integer(text, where):
    if not INTEGER_RE.fullmatch(text):
        raise Mismatch(f"{where}: not an integer: {text!r}")
    return int(text)


def parse_float(text, where):
    if not FLOAT_RE.fullmatch(text):
        raise Mismatch(f"{where}: not a float: {text!r}")
    return float(text)


def same_float(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    # == alone would equate 0.0 and -0.0.
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def normalise_datetime(text):
    """RFC 3339 spellings of the same value made equal: case, the date/time
    separator, trailing zeros of the fraction, and +00:00 / -00:00 for Z
    (TOML gives -00:00 no meaning of its own)."""
    s = text.upper()
    if len(s) > 10 and s[10] == " ":
        s = s[:10] + "T" + s[11:]
    if s.endswith("+00:00") or s.endswith("-00:00"):
        s = s[:-6] + "Z"

    def trim(m):
        digits = m.group(1).rstrip("0")
        return "." + digits if digits else ""

    return FRACTION_RE.sub(trim, s, count=1)


def compare_scalar(want, got, where):
    wtype, gtype = want["type"], got["type"]
    if wtype != gtype:
        raise Mismatch(f"{where}: type {gtype!r}, expected {wtype!r}")
    wval, gval = want["value"], got["value"]
    if wtype == "integer":
        equal = parse_integer(wval, where) == parse_integer(gval, where)
    elif wtype == "float":
        equal = same_float(parse_float(wval, where), parse_float(gval, where))
    elif wtype in DATETIME_TYPES:
        equal = normalise_datetime(wval) == normalise_datetime(gval)
    elif wtype in ("string", "bool"):
        equal = wval == gval
    else:
        raise Mismatch(f"{where}: unknown type {wtype!r}")
    if not equal:
        raise Mismatch(f"{where}: value {gval!r}, expected {wval!r}")


def compare(want, got, where="root"):
    if is_tagged(want):
        if not is_tagged(got):
            raise Mismatch(f"{where}: got {type(got).__name__}, expected a {want['type']}")
        compare_scalar(want, got, where)
    elif isinstance(want, dict):
        if not isinstance(got, dict) or is_tagged(got):
            raise Mismatch(f"{where}: expected a table")
        if set(want) != set(got):
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            raise Mismatch(f"{where}: keys differ, missing {missing}, unexpected {extra}")
        for key in want:
            compare(want[key], got[key], f"{where}.{key}")
    elif isinstance(want, list):
        if not isinstance(got, list):
            raise Mismatch(f"{where}: expected an array")
        if len(want) != len(got):
            raise Mismatch(f"{where}: array has {len(got)} elements, expected {len(want)}")
        for i, (w, g) in enumerate(zip(want, got)):
            compare(w, g, f"{where}[{i}]")
    else:
        raise Mismatch(f"{where}: unexpected node in expected JSON: {want!r}")


def run_decoder(decoder, data):
    return subprocess.run([decoder], input=data, capture_output=True, timeout=TIMEOUT_S)


def first_line(data):
    text = data.decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else ""


def judge(suite, rel, accepted, output, message, status):
    """The verdict on one file the decoder ran to its end: None on success,
    or the reason for the failure. `output` is its JSON when it accepted the
    file; `message` what it said when it refused it, with exit `status`."""
    if rel.startswith("invalid/"):
        if accepted:
            return "accepted invalid TOML"
        if not message.strip():
            return f"refused ({status}) without a message"
        return None
    if not accepted:
        return f"refused valid TOML ({status}): {first_line(message)}"
    with open(os.path.join(suite, os.path.splitext(rel)[0] + ".json"), "rb") as f:
        want = json.load(f)
    try:
        got = json.loads(output)
    except ValueError as e:
        return f"decoder printed invalid JSON: {e}"
    try:
        compare(want, got)
    except Mismatch as e:
        return str(e)
    return None


def check(decoder, suite, rel):
    """One file on the decoder's stdin: None on success, or the reason for
    the failure."""
    with open(os.path.join(suite, rel), "rb") as f:
        data = f.read()
    try:
        proc = run_decoder(decoder, data)
    except subprocess.TimeoutExpired:
        return f"timed out after {TIMEOUT_S} s"
    if proc.returncode < 0:
        return f"killed by signal {-proc.returncode}"
    if SANITIZER_RE.search(proc.stderr):
        return f"sanitizer report: {first_line(SANITIZER_RE.split(proc.stderr, 1)[1])}"
    return judge(suite, rel, proc.returncode == 0, proc.stdout, proc.stderr, f"exit {proc.returncode}")


def check_batch(decoder, suite, rels):
    """Files given to one decoder process, a line of output each; the
    verdicts in order. Where that run did not end cleanly (a signal, a
    sanitizer report, an exit status, a missing line, a hang), every file
    of the batch runs again alone, so that each failure is named."""
    try:
        proc = subprocess.run([decoder] + [os.path.join(suite, rel) for rel in rels], capture_output=True,
                              timeout=TIMEOUT_S * len(rels))
        lines = proc.stdout.split(b"\n")
        clean = (proc.returncode == 0 and not SANITIZER_RE.search(proc.stderr) and len(lines) == len(rels) + 1
                 and not lines[-1])
    except subprocess.TimeoutExpired:
        clean = False
    if not clean:
        return [check(decoder, suite, rel) for rel in rels]
    verdicts = []
    for rel, line in zip(rels, lines):
        kind, _, rest = line.partition(b" ")
        if kind not in (b"ok", b"refused"):
            verdicts.append(f"decoder printed an unknown line: {first_line(line)}")
        else:
            verdicts.append(judge(suite, rel, kind == b"ok", rest, rest, "batch"))
    return verdicts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decoder", required=True, help="decoder executable")
    ap.add_argument("--suite", required=True, help="toml-test checkout")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    decoder = os.path.abspath(args.decoder)
    with open(os.path.join(args.suite, LIST_NAME), encoding="utf-8") as f:
        files = [line.strip() for line in f if line.strip().endswith(".toml")]
    if not files:
        print(f"no .toml entries in {LIST_NAME}", file=sys.stderr)
        return 1

    # Batches of BATCH files, one decoder process each: a process per file
    # costs more than the parsing under a sanitizer.
    batches = [files[i:i + BATCH] for i in range(0, len(files), BATCH)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = [v for verdicts in pool.map(lambda b: check_batch(decoder, args.suite, b), batches)
                   for v in verdicts]

    failed = 0
    for rel, reason in zip(files, results):
        if reason is not None:
            failed += 1
            print(f"FAIL {rel}: {reason}")
    print(f"toml-test: {len(files) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
