#!/usr/bin/env python3
"""Check deploy/grafana/tidemark.json.

    python3 deploy/grafana/check.py              # the dashboard's structure only
    python3 deploy/grafana/check.py scrape.txt   # and every metric it uses is in a scrape

Structure: valid JSON; uid "tidemark", schemaVersion 39; a `datasource` variable of type
prometheus and an `instance` variable; every panel (rows excepted) has a description and
targets, each target an expr on the `${datasource}` variable, and every metric selector in an
expr filters by instance=~"$instance".

With a Prometheus text scrape (the body of GET /metrics) as argv[1]: every tidemark_* and
process_* metric named in a target expr (a histogram's _bucket/_sum/_count series counted as
its family) must be in the scrape, as a `# TYPE` line or a sample of that family. The missing
ones are printed and the exit status is 1.
"""

import json
import re
import sys
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent / "tidemark.json"

# A metric name starting tidemark_ or process_, followed by a selector, a range, whitespace,
# a closing parenthesis or the end of the expression.
METRIC = re.compile(r"(?<![A-Za-z0-9_:])((?:tidemark|process)_[A-Za-z0-9_:]*)(?=[{\[\s)]|$)")
SUFFIXES = ("_bucket", "_sum", "_count")
INSTANCE = 'instance=~"$instance"'
DS_UID = "${datasource}"


def panels_of(dash):
    """Every panel, the ones inside collapsed rows included."""
    for p in dash.get("panels", []):
        yield p
        for inner in p.get("panels", []) or []:
            yield inner


def family(name):
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def structure(dash):
    """The problems with the dashboard's structure (empty when there are none)."""
    errors = []
    if dash.get("uid") != "tidemark":
        errors.append(f"uid is {dash.get('uid')!r}, not 'tidemark'")
    if dash.get("title") != "tidemark":
        errors.append(f"title is {dash.get('title')!r}, not 'tidemark'")
    if dash.get("schemaVersion") != 39:
        errors.append(f"schemaVersion is {dash.get('schemaVersion')!r}, not 39")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append("no `datasource` variable of type datasource, query prometheus")
    inst = variables.get("instance")
    if not inst:
        errors.append("no `instance` variable")
    else:
        q = inst.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if q != "label_values(tidemark_build_info, instance)":
            errors.append(f"the instance variable's query is {q!r}")
    ids = set()
    count = 0
    for p in panels_of(dash):
        title = p.get("title") or f"panel {p.get('id')}"
        if p.get("id") in ids:
            errors.append(f"{title}: id {p.get('id')} is used twice")
        ids.add(p.get("id"))
        if p.get("type") == "row":
            continue
        count += 1
        if not (p.get("description") or "").strip():
            errors.append(f"{title}: no description")
        if (p.get("datasource") or {}).get("uid") != DS_UID:
            errors.append(f"{title}: the panel's datasource is not {DS_UID}")
        targets = p.get("targets") or []
        if not targets:
            errors.append(f"{title}: no targets")
        for t in targets:
            ref = f"{title} [{t.get('refId')}]"
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                errors.append(f"{ref}: no expr")
                continue
            if (t.get("datasource") or {}).get("uid") != DS_UID:
                errors.append(f"{ref}: the target's datasource is not {DS_UID}")
            names = METRIC.findall(expr)
            if not names:
                errors.append(f"{ref}: no tidemark_ or process_ metric in {expr!r}")
            for m in re.finditer(METRIC, expr):
                rest = expr[m.end():]
                sel = re.match(r"\{([^}]*)\}", rest)
                if not sel or INSTANCE not in sel.group(1):
                    errors.append(f"{ref}: {m.group(1)} is not filtered by {INSTANCE}")
    if count == 0:
        errors.append("no panels")
    return errors


def used_metrics(dash):
    """The metric families the targets' exprs name, in order of first use."""
    seen = {}
    for p in panels_of(dash):
        for t in p.get("targets") or []:
            for name in METRIC.findall(t.get("expr") or ""):
                seen.setdefault(family(name), None)
    return list(seen)


def scraped(text):
    """The metric families and sample names in a Prometheus text scrape."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            w = line.split()
            if len(w) >= 3 and w[1] == "TYPE":
                names.add(w[2])
            continue
        m = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line)
        if m:
            names.add(m.group(0))
            names.add(family(m.group(0)))
    return names


def main(argv):
    try:
        dash = json.loads(DASHBOARD.read_text())
    except (OSError, ValueError) as e:
        print(f"{DASHBOARD}: {e}")
        return 1
    errors = structure(dash)
    for e in errors:
        print(f"structure: {e}")
    used = used_metrics(dash)
    if len(argv) < 2:
        if not errors:
            print(f"{DASHBOARD.name}: ok, {len(used)} metrics")
        return 1 if errors else 0
    try:
        text = Path(argv[1]).read_text()
    except OSError as e:
        print(f"{argv[1]}: {e}")
        return 1
    have = scraped(text)
    missing = [m for m in used if m not in have]
    for m in missing:
        print(f"missing from {argv[1]}: {m}")
    if not errors and not missing:
        print(f"{DASHBOARD.name}: ok, all {len(used)} metrics in {argv[1]}")
    return 1 if errors or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
