"""A benchmark point's name read through the suite's own field table (`attnbench list fields
--format json`), the way PointId::from_name reads it, so that no script splits names by hand.

A name is NAME:value segments joined by '/', in the table's order: the mechanism (attn:NAME), one
segment per mechanism parameter, then the fields a point has (a field out of its scope or unset is
left out). A value may hold '/' (a data directory): it runs to the next '/' followed by a NAME:
segment.

    table = point_names.field_table()          # or field_table("build/attnbench")
    p = point_names.parse(name, table)
    p.mechanism, p.params, p.fields["N"], p.segments   # fields by segment, values as text
"""
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def attnbench_path(given=None):
    """The executable: as given, else $ATTNBENCH, else the checkout's build/attnbench."""
    return given or os.environ.get("ATTNBENCH") or os.path.join(ROOT, "build", "attnbench")


_tables = {}


def field_table(attnbench=None):
    """The point fields in their name order, as `attnbench list fields --format json` exports them."""
    exe = attnbench_path(attnbench)
    if exe not in _tables:
        try:
            out = subprocess.run([exe, "list", "fields", "--format", "json"], check=True, capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            sys.exit(f"error: cannot read the point fields from {exe} (build it, or give --attnbench / $ATTNBENCH): {e}")
        _tables[exe] = json.loads(out)["fields"]
    return _tables[exe]


@dataclass
class Point:
    mechanism: str = ""
    params: dict = field(default_factory=dict)  # parameter -> value text, in the name's order
    fields: dict = field(default_factory=dict)  # segment -> value text, in the name's order
    segments: list = field(default_factory=list)  # (segment, value text), every one, in order


def pieces(name):
    """The name's NAME:value pieces, a value holding '/' kept whole."""
    out = []
    for piece in name.split("/"):
        if ":" in piece or not out:
            out.append(piece)
        else:
            out[-1] += "/" + piece
    return [tuple(p.split(":", 1)) if ":" in p else (p, "") for p in out]


def parse(name, table):
    """The point a name names. ValueError naming the segment when a segment is not a field or is
    out of the table's order."""
    order = [f["segment"] for f in table if f["type"] != "params"]
    p = Point()
    it = pieces(name)
    if not it or it[0][0] != order[0]:
        raise ValueError(f"point name '{name}' does not begin with {order[0]}:NAME")
    p.mechanism = it[0][1]
    p.segments.append(it[0])
    at = 1
    rest = it[1:]
    i = 0
    # The mechanism's parameters: the segments before the first field of the table's.
    while i < len(rest) and rest[i][0] not in order:
        p.params[rest[i][0]] = rest[i][1]
        p.segments.append(rest[i])
        i += 1
    for seg, value in rest[i:]:
        if seg not in order[at:]:
            raise ValueError(f"point name '{name}': segment '{seg}:{value}' is not a field, or out of order")
        at = order.index(seg, at) + 1
        p.fields[seg] = value
        p.segments.append((seg, value))
    return p
