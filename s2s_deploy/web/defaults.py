"""search.js's built-in decoding defaults and older manifest keys, generated from the option table
(format/decoding.py), so the browser page and the Node example never hold a hand copy that drifts.

search.js is loaded as it is (a ``<script>`` in the page, ``require`` in Node: it loads no files), so
the generated block lives in the file between two marker lines. After adding or changing a row of
the table, rerun ``python -m s2s_deploy.web.defaults``; tests/test_web.py fails while the block is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from s2s_deploy.format.decoding import OPTIONS

SEARCH_JS = Path(__file__).with_name("search.js")
BEGIN = "  // BEGIN generated from s2s_deploy/format/decoding.py by `python -m s2s_deploy.web.defaults`: do not edit\n"
END = "  // END generated\n"


def block() -> str:
    """``BUILT_IN`` (every option's default) and ``ALIASES`` (its older manifest keys) as JavaScript."""
    defaults = "".join(f"    {o.name}: {json.dumps(list(o.default) if isinstance(o.default, tuple) else o.default)},\n"
                       for o in OPTIONS)
    aliases = "".join(f"    {o.name}: {json.dumps(list(o.aliases))},\n" for o in OPTIONS if o.aliases)
    return f"{BEGIN}  const BUILT_IN = {{\n{defaults}  }};\n  const ALIASES = {{\n{aliases}  }};\n{END}"


def rendered(source: str) -> str:
    """``source`` (search.js's text) with its generated block replaced by the table's."""
    start, stop = source.index(BEGIN), source.index(END) + len(END)
    return source[:start] + block() + source[stop:]


if __name__ == "__main__":
    SEARCH_JS.write_text(rendered(SEARCH_JS.read_text(encoding="utf-8")), encoding="utf-8")
    sys.stdout.write(f"wrote {SEARCH_JS}\n")
